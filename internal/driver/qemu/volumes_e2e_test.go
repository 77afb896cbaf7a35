package qemu_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"golang.org/x/crypto/ssh"

	"nimbus/internal/driver"
	"nimbus/internal/driver/qemu"
	"nimbus/internal/testenv"
)

// volumeGuest is the test guest booted under user-mode networking, with
// an SSH client on it.
type volumeGuest struct {
	d       *qemu.Driver
	id, dir string
	signer  ssh.Signer
	client  *ssh.Client
}

func bootVolumeGuest(tb testing.TB) *volumeGuest {
	tb.Helper()
	guest := testenv.TestGuest(tb)
	signer, authorized := testenv.NewSSHKey(tb)
	ctx := context.Background()
	dataDir := tb.TempDir()
	d, image := qemu.NewGuestDriver(tb, dataDir, guest.Disk, guest.Kernel, guest.Initrd, guest.Cmdline)
	tb.Cleanup(func() { d.Close() })
	id := uuid.NewString()
	spec := driver.Spec{
		ServerID: id, Name: "volumes", Hostname: "volumes", ProjectID: "p", VCPUs: 1, MemoryMB: 256, DiskGB: 1,
		OSType: "linux", KeyName: "k", PublicKey: authorized, Image: image,
		Ports: []driver.Port{{ID: "port-1", MAC: "52:54:00:12:34:57", IP: "10.0.0.5", CIDR: "10.0.0.0/24", Gateway: "10.0.0.1"}},
	}
	tb.Cleanup(func() { d.Destroy(ctx, id) })
	if err := d.Spawn(ctx, spec); err != nil {
		tb.Fatal(err)
	}
	g := &volumeGuest{d: d, id: id, dir: filepath.Join(dataDir, "instances", id), signer: signer}
	g.connect(tb)
	tb.Cleanup(func() { g.client.Close() })
	return g
}

// connect (again: the client of an earlier QEMU is closed) to the guest.
func (g *volumeGuest) connect(tb testing.TB) {
	tb.Helper()
	if g.client != nil {
		g.client.Close()
	}
	acc, err := g.d.Access(context.Background(), g.id)
	if err != nil || len(acc) == 0 {
		tb.Fatalf("Access: %+v, %v", acc, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	g.client, err = testenv.SSHClient(ctx, nil, net.JoinHostPort(acc[0].Host, strconv.Itoa(acc[0].Port)), "root", g.signer)
	if err != nil {
		console, _ := g.d.ConsoleOutput(context.Background(), g.id, 30)
		tb.Fatalf("%v\nconsole:\n%s", err, console)
	}
}

// run runs cmd in the guest.
func (g *volumeGuest) run(tb testing.TB, cmd string) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := testenv.RunSSH(ctx, g.client, cmd)
	if err != nil {
		tb.Fatalf("ssh %q: %v (%s)", cmd, err, out)
	}
	return strings.TrimSpace(out)
}

// disk is the guest's disk (vdX) with a volume's serial, "" when none.
func (g *volumeGuest) disk(tb testing.TB, volID string) string {
	return g.run(tb, fmt.Sprintf(`for d in /sys/block/vd*; do [ "$(cat $d/serial 2>/dev/null)" = %q ] && basename $d; done; true`, serial(volID)))
}

// waitDisk waits until the guest has the volume's disk (or, with gone,
// no longer has it), and returns its name.
func (g *volumeGuest) waitDisk(tb testing.TB, volID string, gone bool) string {
	tb.Helper()
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		if dev := g.disk(tb, volID); (dev == "") == gone {
			return dev
		}
	}
	tb.Fatalf("volume %s: disk still there %v after 30 s", volID, gone)
	return ""
}

// serial is what Linux shows of a volume id: virtio-blk's 20 bytes.
func serial(volID string) string { return volID[:min(20, len(volID))] }

func rawFile(t *testing.T, dir string, size int64) string {
	t.Helper()
	f, err := os.CreateTemp(dir, "volume-*.raw")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	return f.Name()
}

// TestVolumeHotplug boots the test guest once and takes volumes through
// it: a throttled raw file plugged (twice: the second is a no-op), seen by
// its serial, written with dd, read by the guest's iobench, grown with ExtendVolume, unplugged, its
// data on the host; the same data read back over NBD with TLS-PSK from a
// qemu-storage-daemon (after an attempt with a wrong key that leaves
// nothing behind); a read-only volume that refuses writes and that,
// recorded, comes back from the command line of a new QEMU and unplugs
// from there.
func TestVolumeHotplug(t *testing.T) {
	qemu.NeedQEMU(t)
	if _, err := exec.LookPath("qemu-storage-daemon"); err != nil {
		t.Skip("qemu-storage-daemon is not installed")
	}
	ctx := context.Background()
	start := time.Now()
	g := bootVolumeGuest(t)
	t.Logf("booted in %v", time.Since(start))
	d, id := g.d, g.id
	volDir := t.TempDir()
	const pattern = "nimbus-volume-pattern-0123456789"

	recorded := func(t *testing.T) []driver.Volume {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(g.dir, "state.json"))
		if err != nil {
			t.Fatal(err)
		}
		var st struct{ Spec driver.Spec }
		if err := json.Unmarshal(b, &st); err != nil {
			t.Fatal(err)
		}
		return st.Spec.Volumes
	}
	clean := func(t *testing.T) {
		t.Helper()
		if left, err := d.VolumeLeftovers(ctx, id); err != nil || len(left) > 0 {
			t.Errorf("left in QEMU: %v %v", left, err)
		}
		if v := recorded(t); len(v) > 0 {
			t.Errorf("record still has %+v", v)
		}
		if keys, _ := filepath.Glob(filepath.Join(g.dir, "vol*")); len(keys) > 0 {
			t.Errorf("key files left: %v", keys)
		}
	}
	step := func(name string, f func(t *testing.T)) {
		if !t.Run(name, f) {
			t.FailNow()
		}
	}

	fileVol := driver.Volume{ID: uuid.NewString(), Device: "/dev/vdb",
		Conn:     driver.VolumeConn{Driver: driver.VolumeFile, Path: rawFile(t, volDir, 64<<20)},
		Throttle: driver.Throttle{TotalIOPS: 5000, TotalBytes: 200 << 20}}
	var dev string
	step("attach file", func(t *testing.T) {
		for range 2 {
			if err := d.AttachVolume(ctx, id, fileVol); err != nil {
				t.Fatalf("AttachVolume: %v", err)
			}
		}
		dev = g.waitDisk(t, fileVol.ID, false)
		if got := g.run(t, "cat /sys/block/"+dev+"/size"); got != strconv.Itoa(64<<20/512) {
			t.Errorf("%s has %s sectors", dev, got)
		}
		if v := recorded(t); len(v) != 1 || v[0].ID != fileVol.ID {
			t.Errorf("record has %+v", v)
		}
	})
	step("write", func(t *testing.T) {
		g.run(t, fmt.Sprintf("printf %%s %s > /tmp/p && dd if=/tmp/p of=/dev/%s bs=512 conv=sync,fsync 2>&1 && sync", pattern, dev))
	})
	step("iobench", func(t *testing.T) {
		// The benchmarks' tool works in the guest (reads only: the
		// pattern stays).
		if r := g.iobench(t, dev, "randread", 2, time.Second); r.ops == 0 {
			t.Errorf("iobench did nothing: %s", r.line)
		}
	})
	step("extend", func(t *testing.T) {
		if err := os.Truncate(fileVol.Conn.Path, 128<<20); err != nil {
			t.Fatal(err)
		}
		if err := d.ExtendVolume(ctx, id, fileVol.ID, 128<<20); err != nil {
			t.Fatalf("ExtendVolume: %v", err)
		}
		want := strconv.Itoa(128 << 20 / 512)
		var got string
		for end := time.Now().Add(10 * time.Second); time.Now().Before(end) && got != want; time.Sleep(200 * time.Millisecond) {
			got = g.run(t, "cat /sys/block/"+dev+"/size")
		}
		if got != want {
			t.Errorf("%s has %s sectors after extend, want %s", dev, got, want)
		}
	})
	// A swap onto a larger volume while the guest writes: the disk
	// keeps its device, its data and what was written during the
	// mirror; writes after the switch go to the new file only; the old
	// volume's nodes and objects are gone, and the record has the new
	// volume in the old one's place.
	diskSerial := fileVol.ID // the device's, through the swap
	swapVol := driver.Volume{ID: uuid.NewString(),
		Conn: driver.VolumeConn{Driver: driver.VolumeFile, Path: rawFile(t, volDir, 192<<20)}}
	step("swap while the guest writes", func(t *testing.T) {
		// The guest writes a counter for 4 s, the swap in the middle.
		type result struct {
			out string
			err error
		}
		wrote := make(chan result, 1)
		go func() {
			wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
			defer cancel()
			out, err := testenv.RunSSH(wctx, g.client, fmt.Sprintf(`i=0; end=$(($(date +%%s) + 4)); while [ $(date +%%s) -lt $end ]; do printf "%%08d" $i | dd of=/dev/%s bs=512 seek=2048 count=1 conv=sync,fsync 2>/dev/null || exit 1; i=$((i+1)); done; echo $i`, dev))
			wrote <- result{out, err}
		}()
		time.Sleep(time.Second)
		if err := d.SwapVolume(ctx, id, fileVol.ID, swapVol); err != nil {
			t.Fatalf("SwapVolume: %v", err)
		}
		r := <-wrote
		if r.err != nil {
			t.Fatalf("the guest's writes: %v (%s)", r.err, r.out)
		}
		t.Logf("the guest wrote %s times through the swap", strings.TrimSpace(r.out))
		if err := d.SwapVolume(ctx, id, fileVol.ID, swapVol); err != nil { // asked again: done
			t.Fatalf("SwapVolume again: %v", err)
		}
		if got := g.disk(t, fileVol.ID); got != dev {
			t.Errorf("the disk with the old serial is %q, want %s (the same device)", got, dev)
		}
		g.run(t, fmt.Sprintf("printf after-swap | dd of=/dev/%s bs=512 seek=4096 count=1 conv=sync,fsync 2>&1", dev))
		seen := g.run(t, fmt.Sprintf("dd if=/dev/%s bs=512 skip=2048 count=1 2>/dev/null | head -c 8", dev))
		read := func(path string, off int64, n int) string {
			f, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			b := make([]byte, n)
			f.ReadAt(b, off)
			return string(b)
		}
		if got := read(swapVol.Conn.Path, 0, len(pattern)); got != pattern {
			t.Errorf("the new volume starts with %q, want %q", got, pattern)
		}
		if got := read(swapVol.Conn.Path, 2048*512, 8); got != seen {
			t.Errorf("the new volume has %q where the guest last wrote %q", got, seen)
		}
		if got := read(swapVol.Conn.Path, 4096*512, 9); got != "after-swap"[:9] {
			t.Errorf("the new volume has %q where the guest wrote after the switch", got)
		}
		if got := read(fileVol.Conn.Path, 4096*512, 9); got == "after-swap"[:9] {
			t.Error("a write after the switch reached the old volume")
		}
		// The guest sees the old size until its next start.
		if got := g.run(t, "cat /sys/block/"+dev+"/size"); got != strconv.Itoa(128<<20/512) {
			t.Errorf("%s has %s sectors after the swap", dev, got)
		}
		if v := recorded(t); len(v) != 1 || v[0].ID != swapVol.ID || v[0].Device != fileVol.Device {
			t.Errorf("record has %+v", v)
		}
		left, err := d.VolumeLeftovers(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range left {
			if strings.Contains(l, qemu.VolumeNamesBase(fileVol.ID)) {
				t.Errorf("the old volume's %s is left in QEMU", l)
			}
		}
		if len(left) == 0 {
			t.Error("no nodes of the new volume in QEMU")
		}
		fileVol = swapVol
	})
	step("detach file", func(t *testing.T) {
		for range 2 { // the second is a no-op
			if err := d.DetachVolume(ctx, id, fileVol.ID); err != nil {
				t.Fatalf("DetachVolume: %v", err)
			}
		}
		g.waitDisk(t, diskSerial, true)
		clean(t)
		b, err := os.ReadFile(fileVol.Conn.Path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasPrefix(b, []byte(pattern)) {
			t.Errorf("the file starts with %q, want %q", b[:len(pattern)], pattern)
		}
	})

	identity, key := "nimbus-test", "5fb7c2a1d03e44f19a8b6c7d2e0f1a3b"
	port := serveNBD(t, fileVol.Conn.Path, identity, key)
	nbdVol := driver.Volume{ID: uuid.NewString(), Conn: driver.VolumeConn{Driver: driver.VolumeNBD,
		Host: "127.0.0.1", Port: port, Export: "vol", PSKIdentity: identity, PSKKey: "00" + key[2:]}}
	step("nbd with a wrong key fails clean", func(t *testing.T) {
		err := d.AttachVolume(ctx, id, nbdVol)
		if err == nil {
			t.Fatal("AttachVolume with a wrong PSK succeeded")
		}
		t.Logf("wrong PSK: %v", err)
		clean(t)
	})
	step("nbd over TLS-PSK", func(t *testing.T) {
		nbdVol.Conn.PSKKey = key
		if err := d.AttachVolume(ctx, id, nbdVol); err != nil {
			t.Fatalf("AttachVolume: %v", err)
		}
		b, _ := os.ReadFile(filepath.Join(g.dir, "state.json"))
		if strings.Contains(string(b), key) {
			t.Error("the PSK is in state.json")
		}
		dev := g.waitDisk(t, nbdVol.ID, false)
		if got := g.run(t, fmt.Sprintf("dd if=/dev/%s bs=512 count=1 2>/dev/null | head -c %d", dev, len(pattern))); got != pattern {
			t.Errorf("read %q over NBD, want %q", got, pattern)
		}
		if err := d.DetachVolume(ctx, id, nbdVol.ID); err != nil {
			t.Fatalf("DetachVolume: %v", err)
		}
		g.waitDisk(t, nbdVol.ID, true)
		clean(t)
	})

	roVol := driver.Volume{ID: uuid.NewString(), ReadOnly: true,
		Conn: driver.VolumeConn{Driver: driver.VolumeFile, Path: rawFile(t, volDir, 16<<20)}}
	step("read-only", func(t *testing.T) {
		if err := d.AttachVolume(ctx, id, roVol); err != nil {
			t.Fatalf("AttachVolume: %v", err)
		}
		dev := g.waitDisk(t, roVol.ID, false)
		if got := g.run(t, "cat /sys/block/"+dev+"/ro"); got != "1" {
			t.Errorf("%s/ro = %s", dev, got)
		}
		out := g.run(t, "dd if=/dev/urandom of=/dev/"+dev+" bs=512 count=1 conv=fsync 2>&1; echo rc=$?")
		if strings.HasSuffix(out, "rc=0") {
			t.Errorf("the guest wrote to a read-only volume: %s", out)
		}
		t.Logf("write to the read-only volume: %s", out)
		if b, _ := os.ReadFile(roVol.Conn.Path); bytes.ContainsFunc(b, func(r rune) bool { return r != 0 }) {
			t.Error("the read-only volume's file changed")
		}
	})
	step("recorded volume is on a new QEMU's command line", func(t *testing.T) {
		if err := d.PowerOff(ctx, id, false); err != nil {
			t.Fatalf("PowerOff: %v", err)
		}
		if err := d.PowerOn(ctx, id); err != nil {
			t.Fatalf("PowerOn: %v", err)
		}
		g.connect(t)
		dev := g.waitDisk(t, roVol.ID, false)
		if got := g.run(t, "cat /sys/block/"+dev+"/ro"); got != "1" {
			t.Errorf("%s/ro = %s", dev, got)
		}
	})
	step("detach a volume of the command line", func(t *testing.T) {
		if err := d.DetachVolume(ctx, id, roVol.ID); err != nil {
			t.Fatalf("DetachVolume: %v", err)
		}
		g.waitDisk(t, roVol.ID, true)
		clean(t)
		// Its port takes the next volume.
		next := driver.Volume{ID: uuid.NewString(), Conn: driver.VolumeConn{Driver: driver.VolumeFile, Path: rawFile(t, volDir, 1<<20)}}
		if err := d.AttachVolume(ctx, id, next); err != nil {
			t.Fatalf("AttachVolume: %v", err)
		}
		g.waitDisk(t, next.ID, false)
	})
	t.Logf("VM time: %v", time.Since(start))
}

// BenchmarkVolumeAttach measures, on one booted test guest, the time from
// AttachVolume (a raw file) until the guest has the disk with its serial
// (a loop in the guest polling every 5 ms; attach-ns/op is AttachVolume's
// call alone). Skipped without QEMU.
func BenchmarkVolumeAttach(b *testing.B) {
	for _, tool := range []string{"qemu-system-x86_64", "qemu-img"} {
		if _, err := exec.LookPath(tool); err != nil {
			b.Skipf("%s is not installed", tool)
		}
	}
	ctx := context.Background()
	g := bootVolumeGuest(b)
	dir := b.TempDir()
	var attach time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		vol := driver.Volume{ID: uuid.NewString(), Conn: driver.VolumeConn{Driver: driver.VolumeFile, Path: filepath.Join(dir, strconv.Itoa(i))}}
		if err := os.WriteFile(vol.Conn.Path, make([]byte, 1<<20), 0o600); err != nil {
			b.Fatal(err)
		}
		seen := make(chan error, 1)
		go func() {
			_, err := testenv.RunSSH(ctx, g.client, fmt.Sprintf("while ! grep -qsx %s /sys/block/vd*/serial; do usleep 5000; done", serial(vol.ID)))
			seen <- err
		}()
		time.Sleep(time.Second) // the guest's loop runs
		b.StartTimer()
		t0 := time.Now()
		if err := g.d.AttachVolume(ctx, g.id, vol); err != nil {
			b.Fatal(err)
		}
		attach += time.Since(t0)
		if err := <-seen; err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := g.d.DetachVolume(ctx, g.id, vol.ID); err != nil {
			b.Fatal(err)
		}
		os.Remove(vol.Conn.Path)
	}
	b.ReportMetric(float64(attach.Nanoseconds())/float64(b.N), "attach-ns/op")
}

// serveNBD serves file as NBD export "vol" over TLS with a pre-shared key
// from a qemu-storage-daemon on a free port of 127.0.0.1.
func serveNBD(t *testing.T, file, identity, key string) int {
	t.Helper()
	pskDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(pskDir, "keys.psk"), []byte(identity+":"+key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	var out bytes.Buffer
	cmd := exec.Command("qemu-storage-daemon",
		"--object", "tls-creds-psk,id=tls0,endpoint=server,dir="+pskDir,
		"--blockdev", "driver=file,node-name=file0,filename="+file,
		"--nbd-server", fmt.Sprintf("addr.type=inet,addr.host=127.0.0.1,addr.port=%d,tls-creds=tls0", port),
		"--export", "type=nbd,id=exp0,node-name=file0,name=vol,writable=on")
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
	})
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if c, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port))); err == nil {
			c.Close()
			return port
		}
		select {
		case <-done:
			t.Fatalf("qemu-storage-daemon exited: %s", out.String())
		default:
		}
		if time.Now().After(end) {
			t.Fatalf("qemu-storage-daemon does not listen: %s", out.String())
		}
	}
}
