package testenv

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kdomanski/iso9660"
	"golang.org/x/crypto/ssh"
)

// The guest tests boot the real test guest under QEMU TCG, one VM at a
// time (TCG is CPU-bound: parallel VMs only slow each other down).

const bootTimeout = 120 * time.Second

// TestGuestNoCloudDirectBoot: direct kernel boot with a NoCloud seed on a
// virtio-scsi CD-ROM (written with kdomanski/iso9660, as the driver does)
// and custom slirp addressing; clean power-off by the ACPI button; a
// second boot from the same overlay keeps the files and does not rerun
// the user-data script.
func TestGuestNoCloudDirectBoot(t *testing.T) {
	g := TestGuest(t)
	key, pub := NewSSHKey(t)
	dir := t.TempDir()
	seed := isoSeed(t, filepath.Join(dir, "seed.iso"), "cidata", map[string]string{
		"meta-data": "instance-id: iid-nimbus-a\nlocal-hostname: guest-a\npublic-keys:\n  - " + pub + "\n",
		"user-data": "#!/bin/sh\necho ran >>/root/user-data-ran\n",
	})
	overlay := newOverlay(t, g, dir)
	cfg := vmConfig{
		guest: g, overlay: overlay, direct: true, seed: seed,
		netOpts: "net=10.0.0.0/24,host=10.0.0.1,dhcpstart=10.0.0.57,dns=10.0.0.3",
	}

	v := startVM(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	v.sshUp(ctx, key)
	for cmd, want := range map[string]string{
		"hostname":                                 "guest-a",
		"nproc":                                    "1",
		"cat /var/lib/nimbus-instance-id":          "iid-nimbus-a",
		"cat /root/.ssh/authorized_keys":           pub,
		"stat -c %a /root/.ssh/authorized_keys":    "600",
		"ip -4 route show default | sed 's/ *$//'": "default via 10.0.0.1 dev eth0",
		"grep nameserver /etc/resolv.conf":         "nameserver 10.0.0.3",
	} {
		if got := v.run(ctx, key, cmd); got != want {
			t.Errorf("%s: %q, want %q", cmd, got, want)
		}
	}
	if got := v.run(ctx, key, "ip -4 addr show dev eth0 | awk '$1 == \"inet\" { print $2 }'"); got != "10.0.0.57/24" {
		t.Errorf("eth0 addresses %q, want only 10.0.0.57/24", got)
	}
	if mb, err := strconv.Atoi(v.run(ctx, key, "free -m | awk '$1 == \"Mem:\" { print $2 }'")); err != nil || mb < 180 || mb > 256 {
		t.Errorf("free -m total %d MiB (%v) for -m 256", mb, err)
	}
	v.waitSerial(ctx, "nimbus-guest: user-data exit 0")
	if got := v.run(ctx, key, "cat /root/user-data-ran"); got != "ran" {
		t.Errorf("user-data script output %q", got)
	}
	for _, m := range []string{"nimbus-guest: network up 10.0.0.57", "nimbus-guest: seed nocloud iid-nimbus-a", "nimbus-guest: ready"} {
		if !strings.Contains(v.serialLog(), m) {
			t.Errorf("no %q on the console:\n%s", m, v.serialLog())
		}
	}

	// Power button: a clean shutdown keeps a synced and an unsynced file.
	v.run(ctx, key, "echo synced >/root/synced && sync && echo unsynced >/root/unsynced")
	start := time.Now()
	if err := qmpCommand(v.qmp, "system_powerdown"); err != nil {
		t.Fatalf("system_powerdown: %v", err)
	}
	if err := v.waitExit(30 * time.Second); err != nil {
		t.Fatalf("after system_powerdown: %v\nconsole:\n%s", err, v.serialLog())
	}
	t.Logf("system_powerdown → QEMU exited: %v", time.Since(start).Round(10*time.Millisecond))

	v = startVM(t, cfg)
	ctx, cancel = context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	v.sshUp(ctx, key)
	if got := v.run(ctx, key, "cat /root/synced /root/unsynced"); got != "synced\nunsynced" {
		t.Errorf("files after a power-button shutdown: %q", got)
	}
	// The seed reader decided before dropbear started: nothing pending.
	if got := v.run(ctx, key, "cat /root/user-data-ran; if test -e /run/nimbus/user-data-pending; then echo pending; fi"); got != "ran" {
		t.Errorf("user-data ran again on the second boot: %q", got)
	}
	start = time.Now()
	v.run(ctx, key, "poweroff")
	if err := v.waitExit(30 * time.Second); err != nil {
		t.Fatalf("after poweroff: %v", err)
	}
	t.Logf("poweroff → QEMU exited: %v", time.Since(start).Round(10*time.Millisecond))
}

// TestGuestConfigDriveDiskBoot: SeaBIOS + syslinux boot from the disk with
// an OpenStack config drive (JSON from encoding/json) on a read-only
// virtio disk.
func TestGuestConfigDriveDiskBoot(t *testing.T) {
	g := TestGuest(t)
	key, pub := NewSSHKey(t)
	key2, pub2 := NewSSHKey(t)
	// A key comment that encoding/json escapes (\u003c, \u0026).
	pub = strings.TrimSuffix(pub, "nimbus-test") + "nimbus<test>&co"
	dir := t.TempDir()
	uuid := "6d0f5c9a-7f1e-4f43-9c55-2b8f3c1d9e01"
	random := make([]byte, 512)
	rand.Read(random)
	md := map[string]any{
		"uuid": uuid, "hostname": "guest-b.novalocal", "name": "guest b",
		"public_keys":       map[string]string{"k1": pub},
		"keys":              []map[string]string{{"name": "k1", "type": "ssh", "data": pub}},
		"launch_index":      0,
		"availability_zone": "nova",
		"meta":              map[string]string{"role": "<test> & \"quotes\""},
		"random_seed":       base64.StdEncoding.EncodeToString(random),
		"project_id":        "p",
		"devices":           []any{},
	}
	mdJSON, err := json.Marshal(md)
	if err != nil {
		t.Fatal(err)
	}
	seed := isoSeed(t, filepath.Join(dir, "config.iso"), "config-2", map[string]string{
		"openstack/2012-08-10/meta_data.json": `{"uuid": "old", "hostname": "old-version"}`,
		"openstack/latest/meta_data.json":     string(mdJSON),
		"openstack/latest/user_data":          "#cloud-config\nssh_authorized_keys:\n  - " + pub2 + "\n",
		"openstack/latest/vendor_data.json":   "{}",
		"ec2/latest/meta-data.json":           `{"hostname": "ec2"}`,
	})
	v := startVM(t, vmConfig{guest: g, overlay: newOverlay(t, g, dir), seed: seed, seedDisk: true})
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	v.sshUp(ctx, key)
	if got := v.run(ctx, key, "hostname"); got != "guest-b" {
		t.Errorf("hostname %q, want guest-b (from guest-b.novalocal)", got)
	}
	if got := v.run(ctx, key, "cat /var/lib/nimbus-instance-id"); got != uuid {
		t.Errorf("instance id %q", got)
	}
	if got := v.run(ctx, key, "cat /root/.ssh/authorized_keys"); got != pub+"\n"+pub2 {
		t.Errorf("authorized_keys %q, want %q and %q", got, pub, pub2)
	}
	if got := v.run(ctx, key, "grep guest-b /etc/hosts"); got != "127.0.1.1\tguest-b.novalocal guest-b" {
		t.Errorf("/etc/hosts line %q", got)
	}
	if _, err := SSH(ctx, v.addr, "root", key2, "true"); err != nil {
		t.Errorf("ssh with the user_data key: %v", err)
	}
	if !strings.Contains(v.serialLog(), "nimbus-guest: seed config-2 "+uuid) {
		t.Errorf("no seed marker on the console:\n%s", v.serialLog())
	}
	start := time.Now()
	if err := qmpCommand(v.qmp, "system_powerdown"); err != nil {
		t.Fatalf("system_powerdown: %v", err)
	}
	if err := v.waitExit(30 * time.Second); err != nil {
		t.Fatalf("after system_powerdown: %v", err)
	}
	t.Logf("system_powerdown → QEMU exited: %v", time.Since(start).Round(10*time.Millisecond))
}

// TestGuestNoCloudGenisoimage: a Rock Ridge + Joliet NoCloud seed made by
// genisoimage whose #cloud-config user-data carries the hostname and the
// key.
func TestGuestNoCloudGenisoimage(t *testing.T) {
	g := TestGuest(t)
	if _, err := exec.LookPath("genisoimage"); err != nil {
		t.Skip("skipping: genisoimage not found")
	}
	key, pub := NewSSHKey(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "seed")
	os.Mkdir(src, 0o755)
	os.WriteFile(filepath.Join(src, "meta-data"), []byte("instance-id: iid-nimbus-c\n"), 0o644)
	os.WriteFile(filepath.Join(src, "user-data"), []byte("#cloud-config\nhostname: guest-c\nssh_authorized_keys:\n  - \""+pub+"\"\n"), 0o644)
	seed := filepath.Join(dir, "seed.iso")
	if out, err := exec.Command("genisoimage", "-quiet", "-output", seed, "-volid", "cidata", "-joliet", "-rock", src).CombinedOutput(); err != nil {
		t.Fatalf("genisoimage: %v\n%s", err, out)
	}
	v := startVM(t, vmConfig{guest: g, overlay: newOverlay(t, g, dir), direct: true, seed: seed})
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	v.sshUp(ctx, key)
	if got := v.run(ctx, key, "hostname; cat /etc/hostname /var/lib/nimbus-instance-id"); got != "guest-c\nguest-c\niid-nimbus-c" {
		t.Errorf("hostname, /etc/hostname, instance id: %q", got)
	}
	v.run(ctx, key, "poweroff")
	if err := v.waitExit(30 * time.Second); err != nil {
		t.Fatalf("after poweroff: %v", err)
	}
}

func TestNewSSHKey(t *testing.T) {
	signer, line := NewSSHKey(t)
	pk, comment, _, _, err := ssh.ParseAuthorizedKey([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	if comment != "nimbus-test" || !bytes.Equal(pk.Marshal(), signer.PublicKey().Marshal()) || pk.Type() != ssh.KeyAlgoED25519 {
		t.Errorf("authorized_keys line %q does not match the signer", line)
	}
}

func TestSSHGivesUpWithContext(t *testing.T) {
	key, _ := NewSSHKey(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	// Accepts and says nothing, as slirp does before the guest listens.
	go func() {
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	start := time.Now()
	if _, err := SSH(ctx, l.Addr().String(), "root", key, "true"); err == nil {
		t.Fatal("SSH to a silent server succeeded")
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("SSH took %v to give up after a 1 s context", d)
	}
}

// ---------------------------------------------------------------- helpers

// isoSeed writes a plain ISO 9660 seed with github.com/kdomanski/iso9660,
// padded to 1 MiB (busybox findfs misses smaller ISOs), and returns path.
func isoSeed(t *testing.T, path, volume string, files map[string]string) string {
	t.Helper()
	w, err := iso9660.NewWriter()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Cleanup()
	for name, data := range files {
		if err := w.AddFile(strings.NewReader(data), name); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := w.WriteTo(f, volume); err != nil {
		t.Fatal(err)
	}
	if st, err := f.Stat(); err == nil && st.Size() < 1<<20 {
		if err := f.Truncate(1 << 20); err != nil {
			t.Fatal(err)
		}
	}
	return path
}

// newOverlay makes a 1 GiB qcow2 overlay on the guest's disk in dir.
func newOverlay(t *testing.T, g Guest, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "overlay.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", "-b", g.Disk, "-F", "qcow2", p, "1G").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img create: %v\n%s", err, out)
	}
	return p
}

type vmConfig struct {
	guest    Guest
	overlay  string
	direct   bool   // direct kernel boot; else SeaBIOS + syslinux from the disk
	seed     string // seed image
	seedDisk bool   // attach the seed as a read-only virtio disk, else as a virtio-scsi CD-ROM
	netOpts  string // more -netdev user options
}

// vm is a running QEMU.
type vm struct {
	t      *testing.T
	start  time.Time
	done   chan struct{}
	err    error // cmd.Wait's, once done is closed
	stderr *bytes.Buffer
	serial string // serial console log
	qmp    string // QMP socket
	addr   string // forwarded SSH address

	mu      sync.Mutex
	markers map[string]time.Duration // when console markers appeared, since start
}

// consoleMarkers are the marker lines whose times sshUp logs.
var consoleMarkers = []string{"nimbus-guest: initramfs", "nimbus-guest: rcS start", "nimbus-guest: ready"}

// startVM starts QEMU (TCG) as FINDINGS §3 does; it is killed, and always
// waited for, when the test ends.
func startVM(t *testing.T, c vmConfig) *vm {
	t.Helper()
	dir, err := os.MkdirTemp("", "nimbus-vm")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	v := &vm{
		t: t, done: make(chan struct{}), stderr: new(bytes.Buffer),
		serial: filepath.Join(dir, "serial.log"), qmp: filepath.Join(dir, "qmp.sock"),
		addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(freePort(t))),
	}
	_, port, _ := net.SplitHostPort(v.addr)
	args := []string{
		"-machine", "q35", "-accel", "tcg", "-m", "256", "-smp", "1", "-nodefaults", "-display", "none",
		"-serial", "file:" + v.serial, "-qmp", "unix:" + v.qmp + ",server,nowait",
		"-drive", "file=" + c.overlay + ",if=none,id=disk0,format=qcow2,cache=none,aio=threads",
		"-device", "virtio-blk-pci,drive=disk0,id=disk0-dev,bootindex=1",
	}
	if c.seedDisk {
		args = append(args,
			"-drive", "file="+c.seed+",if=none,id=seed,format=raw,readonly=on",
			"-device", "virtio-blk-pci,drive=seed,id=seed-dev")
	} else {
		args = append(args,
			"-drive", "file="+c.seed+",if=none,id=seed,format=raw,readonly=on,media=cdrom",
			"-device", "virtio-scsi-pci,id=scsi0", "-device", "scsi-cd,drive=seed,bus=scsi0.0")
	}
	netdev := "user,id=net0,hostfwd=tcp:127.0.0.1:" + port + "-:22"
	if c.netOpts != "" {
		netdev += "," + c.netOpts
	}
	args = append(args, "-netdev", netdev, "-device", "virtio-net-pci,netdev=net0")
	if c.direct {
		args = append(args, "-kernel", c.guest.Kernel, "-initrd", c.guest.Initrd, "-append", c.guest.Cmdline)
	}
	cmd := exec.Command("qemu-system-x86_64", args...)
	cmd.Stdout, cmd.Stderr = v.stderr, v.stderr
	v.start = time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatalf("qemu: %v", err)
	}
	go func() {
		v.err = cmd.Wait()
		close(v.done)
	}()
	v.markers = map[string]time.Duration{}
	go func() { // note when the markers appear
		for {
			select {
			case <-v.done:
				return
			case <-time.After(50 * time.Millisecond):
			}
			log := v.serialLog()
			v.mu.Lock()
			for _, m := range consoleMarkers {
				if _, ok := v.markers[m]; !ok && strings.Contains(log, m) {
					v.markers[m] = time.Since(v.start)
				}
			}
			v.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		select {
		case <-v.done:
		default:
			cmd.Process.Kill()
			<-v.done
		}
	})
	return v
}

// sshUp waits for SSH with key and logs how long the boot took.
func (v *vm) sshUp(ctx context.Context, key ssh.Signer) {
	v.t.Helper()
	if _, err := SSH(ctx, v.addr, "root", key, "true"); err != nil {
		v.t.Fatalf("no SSH: %v\nqemu: %s\nconsole:\n%s", err, v.stderr, v.serialLog())
	}
	took := time.Since(v.start)
	v.mu.Lock()
	var seen []string
	for _, m := range consoleMarkers {
		if d, ok := v.markers[m]; ok {
			seen = append(seen, fmt.Sprintf("%s %v", strings.TrimPrefix(m, "nimbus-guest: "), d.Round(10*time.Millisecond)))
		}
	}
	v.mu.Unlock()
	v.t.Logf("QEMU start → SSH: %v (console: %s)", took.Round(10*time.Millisecond), strings.Join(seen, ", "))
}

// run runs cmd over SSH and returns its output without the final newline.
func (v *vm) run(ctx context.Context, key ssh.Signer, cmd string) string {
	v.t.Helper()
	out, err := SSH(ctx, v.addr, "root", key, cmd)
	if err != nil {
		v.t.Fatalf("%v\nconsole:\n%s", err, v.serialLog())
	}
	return strings.TrimRight(out, "\n")
}

func (v *vm) serialLog() string {
	b, _ := os.ReadFile(v.serial)
	return string(b)
}

// waitSerial waits for s on the console.
func (v *vm) waitSerial(ctx context.Context, s string) {
	v.t.Helper()
	for !strings.Contains(v.serialLog(), s) {
		select {
		case <-ctx.Done():
			v.t.Fatalf("no %q on the console:\n%s", s, v.serialLog())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// waitExit waits for QEMU to exit by itself.
func (v *vm) waitExit(d time.Duration) error {
	select {
	case <-v.done:
		return nil
	case <-time.After(d):
		return fmt.Errorf("QEMU still running after %v", d)
	}
}

// qmpCommand runs one QMP command without arguments.
func qmpCommand(sock, command string) error {
	conn, err := net.DialTimeout("unix", sock, 5*time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(conn)
	if _, err := r.ReadBytes('\n'); err != nil { // greeting
		return err
	}
	for _, c := range []string{"qmp_capabilities", command} {
		if _, err := fmt.Fprintf(conn, "{\"execute\":%q}\n", c); err != nil {
			return err
		}
		for {
			line, err := r.ReadBytes('\n')
			if err != nil {
				return err
			}
			var reply struct {
				Return json.RawMessage `json:"return"`
				Error  *struct{ Class, Desc string }
			}
			if err := json.Unmarshal(line, &reply); err != nil {
				return err
			}
			if reply.Error != nil {
				return fmt.Errorf("%s: %s: %s", c, reply.Error.Class, reply.Error.Desc)
			}
			if reply.Return != nil {
				break
			}
		}
	}
	return nil
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
