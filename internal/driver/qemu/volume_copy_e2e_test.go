package qemu_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"nimbus/internal/blockexport"
	"nimbus/internal/driver"
	"nimbus/internal/driver/qemu"
	"nimbus/internal/testenv"
)

// TestCopyVolumeLive boots the test guest with QEMU running as nobody
// and copies a throttled file volume out of it while the guest writes:
// generation g goes to the disk's first block, then to a block 60 MiB
// on, each synced, without pause. The copy, into a file QEMU could not
// open (a root-only directory: it gets the descriptor), is the disk at
// one instant: the first block's generation is the other's or one more.
// The same for a volume the guest writes over NBD (TLS-PSK), copied by
// blockexport's Backup in the export's qemu-storage-daemon.
// Once the guest stopped, a copy is the disk byte for byte. Nothing is
// left in QEMU (no bk- node, job or descriptor set); an unknown volume is
// ErrNotFound, a relative target refused, and a stopped server
// ErrNotRunning.
func TestCopyVolumeLive(t *testing.T) {
	qemu.NeedQEMU(t)
	if os.Geteuid() != 0 {
		t.Skip("QEMU runs as another user only when the driver runs as root")
	}
	ctx := context.Background()
	guest := testenv.TestGuest(t)
	signer, authorized := testenv.NewSSHKey(t)
	dataDir := t.TempDir()
	d, image := qemu.NewGuestDriverAs(t, dataDir, guest.Disk, guest.Kernel, guest.Initrd, guest.Cmdline, "nobody")
	t.Cleanup(func() { d.Close() })
	id := uuid.NewString()
	spec := driver.Spec{
		ServerID: id, Name: "copy", Hostname: "copy", ProjectID: "p", VCPUs: 1, MemoryMB: 256, DiskGB: 1,
		OSType: "linux", KeyName: "k", PublicKey: authorized, Image: image,
		Ports: []driver.Port{{ID: "port-1", MAC: "52:54:00:12:34:58", IP: "10.0.0.5", CIDR: "10.0.0.0/24", Gateway: "10.0.0.1"}},
	}
	t.Cleanup(func() { d.Destroy(ctx, id) })
	if err := d.Spawn(ctx, spec); err != nil {
		t.Fatal(err)
	}
	g := &volumeGuest{d: d, id: id, dir: filepath.Join(dataDir, "instances", id), signer: signer}
	acc, err := d.Access(ctx, id)
	if err != nil || len(acc) == 0 {
		t.Fatalf("Access: %+v, %v", acc, err)
	}
	cctx, cancel := context.WithTimeout(ctx, 120*time.Second)
	defer cancel()
	if g.client, err = testenv.SSHClient(cctx, nil, net.JoinHostPort(acc[0].Host, strconv.Itoa(acc[0].Port)), "root", signer); err != nil {
		t.Fatal(err)
	}
	defer g.client.Close()

	// The volume is QEMU's (it opened it as root at attach: the file is
	// nobody's so a hot-plug by path works); targets are root's only.
	volDir, private := t.TempDir(), t.TempDir()
	os.Chmod(volDir, 0o755)
	vol := driver.Volume{ID: uuid.NewString(), Conn: driver.VolumeConn{Driver: driver.VolumeFile, Path: rawFile(t, volDir, 64<<20)},
		Throttle: driver.Throttle{TotalIOPS: 5000}}
	os.Chown(vol.Conn.Path, 65534, 65534)
	if err := d.AttachVolume(ctx, id, vol); err != nil {
		t.Fatalf("AttachVolume: %v", err)
	}
	dev := g.waitDisk(t, vol.ID, false)
	target := func(name string) string {
		p := filepath.Join(private, name)
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(p, 64<<20); err != nil {
			t.Fatal(err)
		}
		return p
	}
	startWriter(t, g, dev, "w", vol.Conn.Path)
	checkLiveCopies(t, "CopyVolume", target, func(p string) error { return d.CopyVolume(ctx, id, vol.ID, p) })

	// A volume the guest writes over NBD: the export's daemon copies it.
	x, err := blockexport.New(blockexport.Config{Dir: t.TempDir(), Addr: "127.0.0.1",
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	nbdPath := rawFile(t, volDir, 64<<20)
	conn, err := x.Export(ctx, "live-nbd", nbdPath, false)
	if err != nil {
		t.Fatal(err)
	}
	nbdVol := driver.Volume{ID: uuid.NewString(), Conn: conn}
	if err := d.AttachVolume(ctx, id, nbdVol); err != nil {
		t.Fatalf("AttachVolume (NBD): %v", err)
	}
	startWriter(t, g, g.waitDisk(t, nbdVol.ID, false), "n", nbdPath)
	checkLiveCopies(t, "export Backup", target, func(p string) error { return x.Backup(ctx, "live-nbd", p) })
	g.run(t, "kill $(cat /tmp/n.pid); sync")
	if err := d.DetachVolume(ctx, id, nbdVol.ID); err != nil {
		t.Fatal(err)
	}

	g.run(t, "kill $(cat /tmp/w.pid); sync")
	time.Sleep(500 * time.Millisecond)
	p := target("still")
	if err := d.CopyVolume(ctx, id, vol.ID, p); err != nil {
		t.Fatalf("CopyVolume: %v", err)
	}
	got, _ := os.ReadFile(p)
	want, _ := os.ReadFile(vol.Conn.Path)
	if !bytes.Equal(got, want) {
		t.Error("the copy of the idle disk differs from its file")
	}
	if left, err := d.BackupLeftovers(ctx, id); err != nil || len(left) > 0 {
		t.Errorf("left in QEMU: %v %v", left, err)
	}

	if err := d.CopyVolume(ctx, id, uuid.NewString(), p); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("CopyVolume of an unknown volume: %v", err)
	}
	if err := d.CopyVolume(ctx, id, vol.ID, "relative"); err == nil {
		t.Error("CopyVolume to a relative path succeeded")
	}
	if err := d.PowerOff(ctx, id, false); err != nil {
		t.Fatal(err)
	}
	if err := d.CopyVolume(ctx, id, vol.ID, p); !errors.Is(err, driver.ErrNotRunning) {
		t.Errorf("CopyVolume of a stopped server: %v", err)
	}
}

// startWriter starts, in the guest, the writer of generations on disk
// dev (first block, then the block 60 MiB on, each synced, for ever),
// named name, and waits until the volume's file (path) has generation 5.
func startWriter(t *testing.T, g *volumeGuest, dev, name, path string) {
	t.Helper()
	g.run(t, fmt.Sprintf(`cat > /tmp/%[2]s.sh <<'EOF'
g=0; while :; do g=$((g+1))
printf 'gen %%08d\n' $g | dd of=/dev/%[1]s bs=4096 count=1 conv=sync,fsync 2>/dev/null
printf 'gen %%08d\n' $g | dd of=/dev/%[1]s bs=4096 count=1 seek=15360 conv=sync,fsync 2>/dev/null
done
EOF
setsid sh /tmp/%[2]s.sh </dev/null >/dev/null 2>&1 & echo $! > /tmp/%[2]s.pid`, dev, name))
	for end := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if b, _ := os.ReadFile(path); len(b) > 12 && bytes.HasPrefix(b, []byte("gen ")) && genAt(t, b, 0) >= 5 {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("the guest does not write to %s", dev)
		}
	}
}

// genAt is the generation in the block at off of a disk's bytes.
func genAt(t *testing.T, b []byte, off int) int {
	t.Helper()
	n, err := strconv.Atoi(strings.TrimPrefix(string(b[off:off+12]), "gen "))
	if err != nil {
		t.Fatalf("block at %d: %q", off, b[off:off+12])
	}
	return n
}

// checkLiveCopies copies a disk the guest writes three times with copy,
// into files target makes, and checks each is one instant: the first
// block's generation is the other's or one more.
func checkLiveCopies(t *testing.T, what string, target func(string) string, copy func(string) error) {
	t.Helper()
	for i := range 3 {
		p := target(fmt.Sprintf("%s-%d", strings.ReplaceAll(what, " ", "-"), i))
		start := time.Now()
		if err := copy(p); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		b, _ := os.ReadFile(p)
		a, z := genAt(t, b, 0), genAt(t, b, 60<<20)
		t.Logf("%s %d: %v, first block at generation %d, the other at %d", what, i, time.Since(start).Round(time.Millisecond), a, z)
		if a != z && a != z+1 {
			t.Errorf("%s %d is not one instant: generations %d and %d", what, i, a, z)
		}
	}
}
