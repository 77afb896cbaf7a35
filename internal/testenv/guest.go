package testenv

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
)

// Guest is a built test guest: a tiny Linux made from Debian packages by
// test/guest/build.sh (a Debian cloud kernel, busybox and dropbear) and
// cached outside the tree. It boots in about 10 s under TCG with direct
// kernel boot, or from its disk through SeaBIOS and syslinux.
//
// What it does at boot: DHCP on eth0 (address, netmask, default route,
// /etc/resolv.conf); it reads a NoCloud seed (volume "cidata": meta-data
// instance-id, local-hostname, public-keys; user-data #cloud-config
// hostname and ssh_authorized_keys) or an OpenStack config drive (volume
// "config-2": openstack/latest/meta_data.json uuid, hostname, public_keys,
// keys; user_data) from a CD-ROM (virtio-scsi) or a read-only virtio disk,
// sets the hostname, writes /root/.ssh/authorized_keys and
// /var/lib/nimbus-instance-id, runs a "#!" user-data script once per
// instance id, and starts dropbear on port 22 for root by key. The ACPI
// power button (QMP system_powerdown) powers it off cleanly in about 2 s.
// It prints marker lines on the serial console (ttyS0), among them
// "nimbus-guest: network up <ip>", "nimbus-guest: seed <nocloud|config-2|none>
// <instance-id>" and "nimbus-guest: ready" once SSH is up.
type Guest struct {
	Dir     string // the build's directory
	Disk    string // guest.qcow2: MBR with syslinux; p1 FAT "BOOT", p2 ext4 "root"
	Kernel  string // vmlinuz, for direct kernel boot (-kernel)
	Initrd  string // initrd.img (-initrd)
	Cmdline string // kernel command line for direct kernel boot (-append)
}

// guestBuild is the process's one build of the guest.
var guestBuild struct {
	sync.Mutex
	done    bool
	guest   Guest
	missing string // a host tool the build lacks (build.sh exit status 3)
	err     error
}

// requireQEMU reports whether NIMBUS_REQUIRE_QEMU=1 (as CI sets): then a
// missing QEMU or a failed guest build fails the test instead of skipping.
func requireQEMU() bool { return os.Getenv("NIMBUS_REQUIRE_QEMU") == "1" }

// TestGuest builds the test guest (once per process, through
// test/guest/build.sh, which is quick when its cache is current) or reuses
// the cached one. It skips the test with a message when QEMU
// (qemu-system-x86_64, qemu-img) is missing or the build lacks host tools
// it cannot install, unless NIMBUS_REQUIRE_QEMU=1, which makes those
// failures. A failed build always fails the test.
func TestGuest(t testing.TB) Guest {
	t.Helper()
	for _, tool := range []string{"qemu-system-x86_64", "qemu-img"} {
		if _, err := exec.LookPath(tool); err != nil {
			if requireQEMU() {
				t.Fatalf("%s not found, and NIMBUS_REQUIRE_QEMU=1 requires QEMU (apt-get install qemu-system-x86 qemu-utils)", tool)
			}
			t.Skipf("skipping: %s not found (apt-get install qemu-system-x86 qemu-utils; NIMBUS_REQUIRE_QEMU=1 makes this a failure)", tool)
		}
	}
	b := &guestBuild
	b.Lock()
	defer b.Unlock()
	if !b.done {
		start := time.Now()
		b.guest, b.missing, b.err = buildGuest()
		b.done = true
		if b.err == nil && b.missing == "" {
			t.Logf("test guest in %s (%v)", b.guest.Dir, time.Since(start).Round(time.Millisecond))
		}
	}
	switch {
	case b.err != nil:
		t.Fatalf("building the test guest: %v", b.err)
	case b.missing != "" && requireQEMU():
		t.Fatalf("building the test guest needs host tools, and NIMBUS_REQUIRE_QEMU=1: %s", b.missing)
	case b.missing != "":
		t.Skipf("skipping: building the test guest needs host tools (NIMBUS_REQUIRE_QEMU=1 makes this a failure): %s", b.missing)
	}
	return b.guest
}

// buildGuest runs build.sh and returns the guest it built, or the reason
// it lacks host tools, or an error.
func buildGuest() (Guest, string, error) {
	script, err := guestScript()
	if err != nil {
		return Guest{}, "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "bash", script)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) && ee.ExitCode() == 3 {
		return Guest{}, lastLines(stderr.String(), 5), nil
	}
	if err != nil {
		return Guest{}, "", fmt.Errorf("%s: %v\n%s", script, err, lastLines(stderr.String(), 40))
	}
	dir := strings.TrimSpace(lastLines(stdout.String(), 1))
	g := Guest{
		Dir:    dir,
		Disk:   filepath.Join(dir, "guest.qcow2"),
		Kernel: filepath.Join(dir, "vmlinuz"),
		Initrd: filepath.Join(dir, "initrd.img"),
	}
	cl, err := os.ReadFile(filepath.Join(dir, "cmdline"))
	if err != nil {
		return Guest{}, "", fmt.Errorf("%s printed %q: %v", script, dir, err)
	}
	g.Cmdline = strings.TrimSpace(string(cl))
	for _, f := range []string{g.Disk, g.Kernel, g.Initrd} {
		if _, err := os.Stat(f); err != nil {
			return Guest{}, "", fmt.Errorf("%s: %v", script, err)
		}
	}
	return g, "", nil
}

// guestScript finds test/guest/build.sh above the working directory (a
// test runs in its package's directory) or, failing that, above this
// source file.
func guestScript() (string, error) {
	const rel = "test/guest/build.sh"
	var starts []string
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	if _, file, _, ok := runtime.Caller(0); ok {
		starts = append(starts, filepath.Dir(file))
	}
	for _, dir := range starts {
		for {
			p := filepath.Join(dir, rel)
			if _, err := os.Stat(p); err == nil {
				return p, nil
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				break
			}
			dir = parent
		}
	}
	return "", fmt.Errorf("%s not found above %v", rel, starts)
}

// lastLines returns the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// How SSH connects. slirp accepts a forwarded connection at once, before
// the guest has an address or listens, and may then leave it silent for
// seconds: an attempt gives up when the server's banner does not come
// within sshBanner (the handshake after it, slow under TCG, gets
// sshHandshake), and while attempts hang a new one starts every
// sshRetry, up to sshParallel at a time, so that a guest that has just
// come up is reached at once.
const (
	sshBanner    = 4 * time.Second
	sshHandshake = 30 * time.Second
	sshRetry     = 500 * time.Millisecond
	sshParallel  = 4
)

// SSH runs command on the SSH server at addr (host:port) as user with key
// and returns its standard output. It keeps trying to connect until ctx
// ends, since the guest may still be booting; once connected it runs the
// command once. A command that fails returns its output so far and an
// error with its standard error. The host key is not checked (test guests
// only).
func SSH(ctx context.Context, addr, user string, key ssh.Signer, command string) (string, error) {
	return SSHVia(ctx, nil, addr, user, key, command)
}

// Dial makes a connection, as net.Dialer.DialContext does.
type Dial func(ctx context.Context, network, addr string) (net.Conn, error)

// SSHVia is SSH with connections made by dial (nil: net.Dialer's): from
// inside a network namespace, say, or through another SSH connection as
// a jump host.
func SSHVia(ctx context.Context, dial Dial, addr, user string, key ssh.Signer, command string) (string, error) {
	client, err := SSHClient(ctx, dial, addr, user, key)
	if err != nil {
		return "", err
	}
	defer client.Close()
	return runSSH(ctx, client, command)
}

// SSHClient connects as SSHVia does and returns the client, whose Dial
// reaches on from the server (a jump host).
func SSHClient(ctx context.Context, dial Dial, addr, user string, key ssh.Signer) (*ssh.Client, error) {
	if dial == nil {
		var d net.Dialer
		dial = d.DialContext
	}
	cfg := &ssh.ClientConfig{
		User:            user,
		Auth:            []ssh.AuthMethod{ssh.PublicKeys(key)},
		HostKeyCallback: ssh.InsecureIgnoreHostKey(), // test guests
	}
	client, err := connectSSH(ctx, dial, addr, cfg)
	if err != nil {
		return nil, fmt.Errorf("ssh %s@%s: %w", user, addr, err)
	}
	return client, nil
}

// RunSSH runs command on client as SSH does.
func RunSSH(ctx context.Context, client *ssh.Client, command string) (string, error) {
	return runSSH(ctx, client, command)
}

// connectSSH connects to addr, trying again (see sshRetry) until ctx ends.
func connectSSH(ctx context.Context, dial Dial, addr string, cfg *ssh.ClientConfig) (*ssh.Client, error) {
	actx, cancel := context.WithCancel(ctx)
	type result struct {
		c   *ssh.Client
		err error
	}
	results := make(chan result)
	running := 0
	attempt := func() {
		running++
		go func() {
			c, err := dialSSH(actx, dial, addr, cfg)
			results <- result{c, err}
		}()
	}
	// On return: stop the other attempts and close what they connect.
	defer func() {
		cancel()
		go func(n int) {
			for ; n > 0; n-- {
				if r := <-results; r.c != nil {
					r.c.Close()
				}
			}
		}(running)
	}()
	attempt()
	tick := time.NewTicker(sshRetry)
	defer tick.Stop()
	var last error
	for {
		select {
		case r := <-results:
			running--
			if r.err == nil {
				return r.c, nil
			}
			last = r.err
		case <-tick.C:
			if running < sshParallel {
				attempt()
			}
		case <-ctx.Done():
			return nil, fmt.Errorf("%w (last attempt: %v)", ctx.Err(), last)
		}
	}
}

func dialSSH(ctx context.Context, dial Dial, addr string, cfg *ssh.ClientConfig) (*ssh.Client, error) {
	actx, cancel := context.WithTimeout(ctx, sshBanner+sshHandshake)
	defer cancel()
	conn, err := dial(actx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(actx, func() { conn.Close() })
	fail := func(err error) (*ssh.Client, error) {
		stop()
		conn.Close()
		if actx.Err() != nil {
			err = fmt.Errorf("%w (%v)", actx.Err(), err)
		}
		return nil, err
	}
	conn.SetReadDeadline(time.Now().Add(sshBanner))
	br := bufio.NewReader(conn)
	if _, err := br.Peek(4); err != nil {
		return fail(fmt.Errorf("no SSH banner: %w", err))
	}
	conn.SetReadDeadline(time.Time{})
	c, chans, reqs, err := ssh.NewClientConn(&bufferedConn{conn, br}, addr, cfg)
	if err != nil {
		return fail(err)
	}
	if !stop() {
		c.Close()
		return nil, actx.Err()
	}
	return ssh.NewClient(c, chans, reqs), nil
}

// bufferedConn reads through a bufio.Reader that has already read from
// the connection.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

func runSSH(ctx context.Context, client *ssh.Client, command string) (string, error) {
	sess, err := client.NewSession()
	if err != nil {
		return "", err
	}
	defer sess.Close()
	var stdout, stderr bytes.Buffer
	sess.Stdout, sess.Stderr = &stdout, &stderr
	stop := context.AfterFunc(ctx, func() { client.Close() })
	defer stop()
	if err := sess.Run(command); err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%v)", ctx.Err(), err)
		}
		return stdout.String(), fmt.Errorf("ssh %q: %w; stderr: %s", command, err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// NewSSHKey makes an ed25519 key pair: the signer to log in with and the
// public key as an authorized_keys line ("ssh-ed25519 AAAA… nimbus-test").
func NewSSHKey(t testing.TB) (ssh.Signer, string) {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	line := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(signer.PublicKey())))
	return signer, line + " nimbus-test"
}
