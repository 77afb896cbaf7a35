package qemu

import (
	"context"
	"crypto/md5"
	"crypto/sha512"
	"encoding/hex"
	"io"
	"log/slog"
	"os"
	"testing"
	"time"

	"nimbus/internal/driver"
)

// What the live copy's test (package qemu_test) needs of the driver.

// NewGuestDriverAs is NewGuestDriver with QEMU running as user runAs.
func NewGuestDriverAs(tb testing.TB, dataDir, disk, kernel, initrd, cmdline, runAs string) (*Driver, driver.ImageRef) {
	tb.Helper()
	store := &memStore{dir: tb.TempDir(), files: map[string]string{}, opens: map[string]int{}, uploads: map[string]string{}}
	store.add("guest-disk", disk)
	store.add("guest-kernel", kernel)
	store.add("guest-initrd", initrd)
	b, err := os.ReadFile(disk)
	if err != nil {
		tb.Fatal(err)
	}
	m, sh := md5.Sum(b), sha512.Sum512(b)
	img := driver.ImageRef{ID: "guest-disk", DiskFormat: "qcow2", Size: int64(len(b)), Checksum: hex.EncodeToString(m[:]),
		HashValue: hex.EncodeToString(sh[:]),
		KernelID:  "guest-kernel", RamdiskID: "guest-initrd", CommandLine: cmdline}
	d, err := New(Config{DataDir: dataDir, Host: testHost(), Sandbox: true, ShutdownTimeout: 30 * time.Second, RunAs: runAs,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), PortRange: [2]int{43000, 43999}})
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	d.SetImageStore(store)
	tb.Cleanup(func() { killLeftovers(dataDir) })
	return d, img
}

// BackupLeftovers lists what a live copy may leave in a server's QEMU:
// block nodes not of a volume or the boot disk's ("bk-…"), block jobs,
// and descriptor sets.
func (d *Driver) BackupLeftovers(ctx context.Context, id string) ([]string, error) {
	mon := d.lookup(id).current().mon
	var nodes []struct {
		NodeName string `json:"node-name"`
	}
	if err := mon.Execute(ctx, "query-named-block-nodes", map[string]bool{"flat": true}, &nodes); err != nil {
		return nil, err
	}
	var out []string
	for _, n := range nodes {
		if len(n.NodeName) > 3 && n.NodeName[:3] == "bk-" {
			out = append(out, "node "+n.NodeName)
		}
	}
	var jobs, fdsets []any
	if err := mon.Execute(ctx, "query-block-jobs", nil, &jobs); err != nil {
		return nil, err
	}
	if err := mon.Execute(ctx, "query-fdsets", nil, &fdsets); err != nil {
		return nil, err
	}
	if len(jobs) > 0 {
		out = append(out, "jobs")
	}
	if len(fdsets) > 0 {
		out = append(out, "fdsets")
	}
	return out, nil
}
