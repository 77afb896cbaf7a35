package qemu

import (
	"context"
	"crypto/md5"
	"crypto/sha512"
	"encoding/hex"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"nimbus/internal/driver"
)

// NewGuestDriver makes a driver on dataDir (as NewTestDriver) whose image
// service serves the test guest (disk, kernel, initrd), and the image to
// boot it with the kernel's command line; for tests and benchmarks alike.
func NewGuestDriver(tb testing.TB, dataDir, disk, kernel, initrd, cmdline string) (*Driver, driver.ImageRef) {
	tb.Helper()
	store := &memStore{dir: tb.TempDir(), files: map[string]string{}, opens: map[string]int{}, uploads: map[string]string{}}
	store.add("guest-disk", disk)
	store.add("guest-kernel", kernel)
	store.add("guest-initrd", initrd)
	b, err := os.ReadFile(disk)
	if err != nil {
		tb.Fatal(err)
	}
	m, s := md5.Sum(b), sha512.Sum512(b)
	img := driver.ImageRef{ID: "guest-disk", DiskFormat: "qcow2", Size: int64(len(b)),
		Checksum: hex.EncodeToString(m[:]), HashValue: hex.EncodeToString(s[:]),
		KernelID: "guest-kernel", RamdiskID: "guest-initrd", CommandLine: cmdline}
	cfg := Config{DataDir: dataDir, Host: testHost(), Sandbox: true, ShutdownTimeout: 30 * time.Second,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), PortRange: [2]int{42000, 42999}}
	d, err := New(cfg)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	d.SetImageStore(store)
	tb.Cleanup(func() { killLeftovers(dataDir) })
	return d, img
}

// What the volume e2e tests (package qemu_test) need of the driver's
// insides.

// VolumeLeftovers lists the block nodes and objects of a server's live
// QEMU that belong to a volume (their names start with "vol").
func (d *Driver) VolumeLeftovers(ctx context.Context, id string) ([]string, error) {
	mon := d.lookup(id).current().mon
	var nodes []struct {
		NodeName string `json:"node-name"`
	}
	if err := mon.Execute(ctx, "query-named-block-nodes", map[string]bool{"flat": true}, &nodes); err != nil {
		return nil, err
	}
	var objs []struct {
		Name string `json:"name"`
	}
	if err := mon.Execute(ctx, "qom-list", map[string]string{"path": "/objects"}, &objs); err != nil {
		return nil, err
	}
	var out []string
	for _, n := range nodes {
		if strings.HasPrefix(n.NodeName, "vol") {
			out = append(out, "node "+n.NodeName)
		}
	}
	for _, o := range objs {
		if strings.HasPrefix(o.Name, "vol") {
			out = append(out, "object "+o.Name)
		}
	}
	return out, nil
}

// VolumeNamesBase is the stem of a volume's QEMU names (its nodes and
// objects start with it).
func VolumeNamesBase(volID string) string { return volBase(volID) }
