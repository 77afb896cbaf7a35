package qemu_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"

	"nimbus/internal/blockexport"
	"nimbus/internal/driver"
	"nimbus/internal/driver/qemu"
	"nimbus/internal/testenv"
)

// guestVolume makes a raw volume file in dir from the test guest's disk
// (its boot loader, kernel and root file system), with marker in the
// unused sector before its first partition.
func guestVolume(t *testing.T, dir, marker string) string {
	t.Helper()
	guest := testenv.TestGuest(t)
	path := filepath.Join(dir, "root.raw")
	if out, err := exec.Command("qemu-img", "convert", "-O", "raw", guest.Disk, path).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img convert: %v: %s", err, out)
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte(marker), markerSector*512); err != nil {
		t.Fatal(err)
	}
	return path
}

// markerSector is the last sector before the guest disk's first
// partition (at 1 MiB), which nothing uses.
const markerSector = 2047

// TestBootFromVolume boots the test guest from a raw volume file (the
// file connection, throttled) with no image and no local disk: the guest
// reads the marker written into the file before the boot, its root file
// system is the volume's (a file it writes is in the volume's file on the
// host after power-off), the volume cannot be detached; after a stop, a
// new driver on the same data directory (an agent restart: state.json)
// starts it again from the volume with the file there, as do a hard
// reboot and a resize (to two vCPUs) of the running server; destroy (as
// shelve-offload does) leaves the volume's data, and a spawn on another
// host (unshelve) boots the same volume over NBD with TLS-PSK from its
// export (internal/blockexport).
func TestBootFromVolume(t *testing.T) {
	qemu.NeedQEMU(t)
	ctx := context.Background()
	guest := testenv.TestGuest(t)
	signer, authorized := testenv.NewSSHKey(t)
	marker := "nimbus-boot-volume-" + uuid.NewString()[:8]
	volFile := guestVolume(t, t.TempDir(), marker)
	dataDir, other := t.TempDir(), t.TempDir() // this host, another one
	d, _ := qemu.NewGuestDriver(t, dataDir, guest.Disk, guest.Kernel, guest.Initrd, guest.Cmdline)
	defer func() { d.Close() }()

	id := uuid.NewString()
	root := driver.Volume{ID: uuid.NewString(), Boot: true, Device: "/dev/vda",
		Conn:     driver.VolumeConn{Driver: driver.VolumeFile, Path: volFile},
		Throttle: driver.Throttle{ReadIOPS: 5000, WriteIOPS: 5000}}
	spec := driver.Spec{
		ServerID: id, Name: "bfv", Hostname: "bfv", ProjectID: "p", VCPUs: 1, MemoryMB: 256,
		OSType: "linux", KeyName: "k", PublicKey: authorized, Volumes: []driver.Volume{root},
		Ports: []driver.Port{{ID: "port-1", MAC: "52:54:00:12:34:58", IP: "10.0.0.6", CIDR: "10.0.0.0/24", Gateway: "10.0.0.1"}},
	}
	defer d.Destroy(ctx, id)
	g := &volumeGuest{d: d, id: id, dir: filepath.Join(dataDir, "instances", id), signer: signer}
	defer func() {
		if g.client != nil {
			g.client.Close()
		}
	}()
	step := func(name string, f func(t *testing.T)) {
		if !t.Run(name, f) {
			t.FailNow()
		}
	}
	// newDriver is an agent (re)started on a host's data directory, for
	// the whole test (a subtest's driver kills its QEMUs when it ends).
	newDriver := func(dir string) *qemu.Driver {
		d, _ := qemu.NewGuestDriver(t, dir, guest.Disk, guest.Kernel, guest.Initrd, guest.Cmdline)
		return d
	}
	written := "written-in-the-guest-" + uuid.NewString()[:8]

	step("spawn from the volume", func(t *testing.T) {
		start := time.Now()
		if err := d.Spawn(ctx, spec); err != nil {
			t.Fatalf("Spawn: %v", err)
		}
		g.connect(t)
		t.Logf("spawn → SSH: %v", time.Since(start))
		if _, err := os.Stat(filepath.Join(g.dir, "disk.qcow2")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the server has a local disk: %v", err)
		}
		dev := g.disk(t, root.ID)
		if dev == "" {
			t.Fatalf("no disk with the volume's serial; disks: %s", g.run(t, "ls /sys/block"))
		}
		if got := g.run(t, fmt.Sprintf("dd if=/dev/%s bs=512 skip=%d count=1 2>/dev/null | head -c %d", dev, markerSector, len(marker))); got != marker {
			t.Errorf("sector %d of %s: %q, want %q", markerSector, dev, got, marker)
		}
		// The root file system is on the volume's disk.
		var major, minor int
		part := g.run(t, fmt.Sprintf("cat /sys/block/%s/%s2/dev", dev, dev))
		if _, err := fmt.Sscanf(part, "%d:%d", &major, &minor); err != nil {
			t.Fatalf("%s2: dev %q: %v", dev, part, err)
		}
		if got, want := g.run(t, "stat -c %d /"), strconv.Itoa(major<<8|minor); got != want {
			t.Errorf("/ is on device %s, not on %s2 (%s)", got, dev, want)
		}
		g.run(t, "echo "+written+" > /root/bfv && sync")
	})
	step("the boot volume cannot be detached", func(t *testing.T) {
		if err := d.DetachVolume(ctx, id, root.ID); !errors.Is(err, qemu.ErrBootVolume) {
			t.Errorf("DetachVolume: %v", err)
		}
		if dev := g.disk(t, root.ID); dev == "" {
			t.Error("the disk is gone")
		}
	})
	step("stop", func(t *testing.T) {
		if err := d.PowerOff(ctx, id, true); err != nil {
			t.Fatalf("PowerOff: %v", err)
		}
		b, err := os.ReadFile(volFile)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(b, []byte(written)) {
			t.Error("the file the guest wrote is not in the volume's file")
		}
	})
	step("start after an agent restart", func(t *testing.T) {
		d.Close()
		d = newDriver(dataDir)
		g.d = d
		start := time.Now()
		if err := d.PowerOn(ctx, id); err != nil {
			t.Fatalf("PowerOn: %v", err)
		}
		g.connect(t)
		t.Logf("power on → SSH: %v", time.Since(start))
		if got := g.run(t, "cat /root/bfv"); got != written {
			t.Errorf("/root/bfv = %q, want %q", got, written)
		}
	})
	step("hard reboot boots the volume again", func(t *testing.T) {
		before := g.run(t, "cat /proc/sys/kernel/random/boot_id")
		if err := d.Reboot(ctx, id, true); err != nil {
			t.Fatalf("Reboot: %v", err)
		}
		g.connect(t)
		if after := g.run(t, "cat /proc/sys/kernel/random/boot_id"); after == before {
			t.Error("the guest did not reboot")
		}
		if got := g.run(t, "cat /root/bfv"); got != written {
			t.Errorf("/root/bfv = %q, want %q", got, written)
		}
	})
	step("resize keeps the boot volume", func(t *testing.T) {
		resized := spec
		resized.VCPUs, resized.DiskGB = 2, 40
		if err := d.Resize(ctx, resized); err != nil {
			t.Fatalf("Resize: %v", err)
		}
		g.connect(t)
		if got := g.run(t, "nproc"); got != "2" {
			t.Errorf("nproc %s after the resize", got)
		}
		if got := g.run(t, "cat /root/bfv"); got != written {
			t.Errorf("/root/bfv = %q, want %q", got, written)
		}
		if err := d.ConfirmResize(ctx, id); err != nil {
			t.Fatalf("ConfirmResize: %v", err)
		}
	})
	step("destroy (shelve-offload) leaves the volume", func(t *testing.T) {
		if err := d.Destroy(ctx, id); err != nil {
			t.Fatalf("Destroy: %v", err)
		}
		b, err := os.ReadFile(volFile)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Contains(b, []byte(marker)) || !bytes.Contains(b, []byte(written)) {
			t.Error("the volume's data changed")
		}
	})
	step("unshelve on another host over NBD", func(t *testing.T) {
		if _, err := exec.LookPath("qemu-storage-daemon"); err != nil {
			t.Skip("qemu-storage-daemon is not installed")
		}
		d.Close()
		d = newDriver(other)
		g.d, g.dir = d, filepath.Join(other, "instances", id)
		exp, err := blockexport.New(blockexport.Config{Dir: t.TempDir(), Addr: "127.0.0.1", Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		defer exp.Close()
		conn, err := exp.Export(ctx, "root", volFile, false)
		if err != nil {
			t.Fatalf("Export: %v", err)
		}
		spec.Volumes = []driver.Volume{{ID: root.ID, Boot: true, Throttle: root.Throttle, Conn: conn}}
		start := time.Now()
		if err := d.Spawn(ctx, spec); err != nil {
			t.Fatalf("Spawn: %v", err)
		}
		g.connect(t)
		t.Logf("spawn over NBD → SSH: %v", time.Since(start))
		if got := g.run(t, "cat /root/bfv"); got != written {
			t.Errorf("/root/bfv = %q, want %q", got, written)
		}
		if err := d.Destroy(ctx, id); err != nil {
			t.Fatalf("Destroy: %v", err)
		}
	})
}

// BenchmarkBootVolumeShelve measures what a 20 GiB network-disk server's
// shelve-offload and unshelve cost on the hosts: Destroy of the running
// server (offload-ms: nothing of its disk is copied or uploaded) and a
// Spawn on another host with a new connection until SSH answers
// (unshelve-ms, a boot included). Neither depends on the volume's size.
// Skipped without QEMU.
func BenchmarkBootVolumeShelve(b *testing.B) {
	for _, tool := range []string{"qemu-system-x86_64", "qemu-img"} {
		if _, err := exec.LookPath(tool); err != nil {
			b.Skipf("%s is not installed", tool)
		}
	}
	ctx := context.Background()
	guest := testenv.TestGuest(b)
	signer, authorized := testenv.NewSSHKey(b)
	path := filepath.Join(b.TempDir(), "root.raw")
	if out, err := exec.Command("qemu-img", "convert", "-O", "raw", guest.Disk, path).CombinedOutput(); err != nil {
		b.Fatalf("qemu-img convert: %v: %s", err, out)
	}
	if err := os.Truncate(path, 20<<30); err != nil { // sparse
		b.Fatal(err)
	}
	hosts := []string{b.TempDir(), b.TempDir()}
	drivers := make([]*qemu.Driver, len(hosts))
	for i, dir := range hosts {
		drivers[i], _ = qemu.NewGuestDriver(b, dir, guest.Disk, guest.Kernel, guest.Initrd, guest.Cmdline)
		defer drivers[i].Close()
	}
	id := uuid.NewString()
	spec := driver.Spec{
		ServerID: id, Name: "shelve", Hostname: "shelve", ProjectID: "p", VCPUs: 1, MemoryMB: 256, DiskGB: 20,
		OSType: "linux", KeyName: "k", PublicKey: authorized,
		Volumes: []driver.Volume{{ID: uuid.NewString(), Boot: true, Conn: driver.VolumeConn{Driver: driver.VolumeFile, Path: path, SizeBytes: 20 << 30}}},
	}
	boot := func(d *qemu.Driver, dir string) {
		if err := d.Spawn(ctx, spec); err != nil {
			b.Fatalf("Spawn: %v", err)
		}
		g := &volumeGuest{d: d, id: id, dir: filepath.Join(dir, "instances", id), signer: signer}
		g.connect(b)
		g.client.Close()
	}
	boot(drivers[0], hosts[0])
	on := 0
	var offload, unshelve time.Duration
	b.ResetTimer()
	for range b.N {
		t0 := time.Now()
		if err := drivers[on].Destroy(ctx, id); err != nil {
			b.Fatalf("Destroy: %v", err)
		}
		offload += time.Since(t0)
		on = 1 - on
		t0 = time.Now()
		boot(drivers[on], hosts[on])
		unshelve += time.Since(t0)
	}
	b.StopTimer()
	drivers[on].Destroy(ctx, id)
	b.ReportMetric(float64(offload.Milliseconds())/float64(b.N), "offload-ms")
	b.ReportMetric(float64(unshelve.Milliseconds())/float64(b.N), "unshelve-ms")
}
