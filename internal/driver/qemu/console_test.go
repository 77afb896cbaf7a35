package qemu

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"nimbus/internal/driver"
)

// bareVNC starts a QEMU with nothing but a VGA card and its VNC server on
// DIR/vnc.sock, its CPU stopped, and returns the socket's path.
func bareVNC(t *testing.T) string {
	t.Helper()
	needQEMU(t, "qemu-system-x86_64")
	dir := t.TempDir()
	sock := filepath.Join(dir, VNCSocket)
	var logBuf bytes.Buffer
	cmd := exec.Command("qemu-system-x86_64", "-machine", "q35", "-accel", "tcg", "-nodefaults", "-display", "none",
		"-device", "VGA", "-vnc", "unix:"+sock, "-S")
	cmd.Stdout, cmd.Stderr = &logBuf, &logBuf
	if err := cmd.Start(); err != nil {
		t.Fatalf("start QEMU: %v", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			return sock
		}
		select {
		case <-exited:
			t.Fatalf("QEMU exited: %s", logBuf.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no VNC socket after 20 s: %s", logBuf.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// readGreeting reads RFB's 12-byte protocol version.
func readGreeting(t *testing.T, c net.Conn) string {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	b := make([]byte, 12)
	if _, err := io.ReadFull(c, b); err != nil {
		t.Fatalf("reading the RFB greeting: %v", err)
	}
	return string(b)
}

// wantClosed checks that c is closed without a byte.
func wantClosed(t *testing.T, c net.Conn) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	b := make([]byte, 64)
	n, err := c.Read(b)
	// A close with unread input is a reset.
	if n != 0 || !(errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)) {
		t.Fatalf("read %q, %v; want EOF and nothing", b[:n], err)
	}
}

func TestConsoleRelayConn(t *testing.T) {
	sock := bareVNC(t)
	const secret = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var timeout atomic.Int64 // the handshake timeout of the next connections
	timeout.Store(int64(consoleHandshake))
	results := make(chan error, 8)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			to := time.Duration(timeout.Load())
			go func() {
				results <- relayConn(c, to, func(s string) (string, error) {
					if s != secret {
						return "", errBadSecret
					}
					return sock, nil
				})
			}()
		}
	}()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}

	// The secret and the client's version in one write: nothing after the
	// newline may be lost.
	c := dial()
	if _, err := io.WriteString(c, secret+"\nRFB 003.008\n"); err != nil {
		t.Fatal(err)
	}
	if g := readGreeting(t, c); g != "RFB 003.008\n" {
		t.Fatalf("greeting %q", g)
	}
	// RFB 3.8: the server lists its security types; QEMU's -vnc without
	// options offers one, None (1).
	sec := make([]byte, 2)
	if _, err := io.ReadFull(c, sec); err != nil || sec[0] != 1 || sec[1] != 1 {
		t.Fatalf("security types %v, %v; want [1 1]", sec, err)
	}
	c.Close()
	if err := <-results; err != nil {
		t.Fatalf("relay: %v", err)
	}

	// A wrong secret: closed, no byte of RFB.
	c = dial()
	io.WriteString(c, strings.Repeat("f", 64)+"\n")
	wantClosed(t, c)
	if err := <-results; !errors.Is(err, errBadSecret) {
		t.Fatalf("relay: %v, want errBadSecret", err)
	}

	// A line too long, and a secret that never comes.
	c = dial()
	io.WriteString(c, strings.Repeat("a", 200))
	wantClosed(t, c)
	<-results
	timeout.Store(int64(200 * time.Millisecond))
	c = dial()
	start := time.Now()
	wantClosed(t, c)
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("closed after %v", d)
	}
	if err := <-results; err == nil {
		t.Fatal("relay: no error for a missing secret")
	}
}

// TestConsole runs the relay through the driver: a server of a blank disk
// (SeaBIOS finds nothing to boot, its VGA shows it) is reached through the
// endpoint Console gives.
func TestConsole(t *testing.T) {
	needQEMU(t)
	ctx := context.Background()
	dir := t.TempDir()
	blank := filepath.Join(t.TempDir(), "blank.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", blank, "64M").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v %s", err, out)
	}
	store := newMemStore(t)
	store.add("blank", blank)
	d := newTestDriver(t, dir, store, func(c *Config) { c.ShutdownTimeout = time.Second; c.PortRange = [2]int{43000, 43999} })
	defer func() { d.Close() }()

	if _, err := d.Console(ctx, uuid.NewString()); !errors.Is(err, driver.ErrNotFound) {
		t.Fatalf("Console of an unknown server: %v, want ErrNotFound", err)
	}
	id := uuid.NewString()
	spec := driver.Spec{ServerID: id, Name: "console", VCPUs: 1, MemoryMB: 64, Image: refOf(t, "blank", "qcow2", blank)}
	if err := d.Spawn(ctx, spec); err != nil {
		t.Fatalf("Spawn: %v", err)
	}
	ep, err := d.Console(ctx, id)
	if err != nil {
		t.Fatalf("Console: %v", err)
	}
	if ep.Host != "127.0.0.1" || ep.Port == 0 || len(ep.Secret) != 64 {
		t.Fatalf("endpoint %+v", ep)
	}
	// Each call is a secret of its own (each console token has one), on
	// the same relay.
	again, err := d.Console(ctx, id)
	if err != nil || again.Host != ep.Host || again.Port != ep.Port || again.Secret == ep.Secret || len(again.Secret) != 64 {
		t.Fatalf("Console again: %+v, %v; want the relay of %+v with another secret", again, err, ep)
	}
	addr := net.JoinHostPort(ep.Host, strconv.Itoa(ep.Port))
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, ep.Secret+"\n")
	if g := readGreeting(t, c); g != "RFB 003.008\n" {
		t.Fatalf("greeting %q", g)
	}
	// A secret opens one connection: the line seen once (on the hosts'
	// network, or in a token's row) opens nothing more.
	replay, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer replay.Close()
	io.WriteString(replay, ep.Secret+"\n")
	wantClosed(t, replay)
	// The other secret still opens its one.
	c1, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c1.Close()
	io.WriteString(c1, again.Secret+"\n")
	if g := readGreeting(t, c1); g != "RFB 003.008\n" {
		t.Fatalf("greeting with the second secret %q", g)
	}
	c1.Close()

	bad, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	io.WriteString(bad, strings.Repeat("0", 64)+"\n")
	wantClosed(t, bad)

	// A stopped server has no console; its open session ends with QEMU.
	spare, err := d.Console(ctx, id)
	if err != nil {
		t.Fatalf("Console: %v", err)
	}
	if err := d.PowerOff(ctx, id, false); err != nil {
		t.Fatalf("PowerOff: %v", err)
	}
	if _, err := d.Console(ctx, id); err == nil || errors.Is(err, driver.ErrNotFound) || errors.Is(err, driver.ErrNoConsole) {
		t.Fatalf("Console of a stopped server: %v, want a not-running error", err)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.Copy(io.Discard, c); err != nil {
		t.Fatalf("session after power off: %v, want EOF", err)
	}
	// An unused secret opens nothing while the server is off.
	c2, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	io.WriteString(c2, spare.Secret+"\n")
	wantClosed(t, c2)

	if err := d.Destroy(ctx, id); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	// Close ends the relay.
	d.Close()
	if c3, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c3.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, _ := c3.Read(make([]byte, 1))
		c3.Close()
		if n != 0 {
			t.Fatal("the relay still answers after Close")
		}
	}
}

// TestConsoleSecrets checks the relay's bookkeeping of secrets: a server
// keeps at most maxConsoleSecrets unused ones, the newest; an expired
// secret is refused, and forgotten when the next is made.
func TestConsoleSecrets(t *testing.T) {
	r := &consoleRelay{secrets: map[[32]byte]relaySecret{}}
	var made []string
	for i := 0; i < maxConsoleSecrets+8; i++ {
		s, err := r.secretFor("a")
		if err != nil {
			t.Fatal(err)
		}
		made = append(made, s)
	}
	if len(r.secrets) != maxConsoleSecrets {
		t.Fatalf("%d secrets kept, want %d", len(r.secrets), maxConsoleSecrets)
	}
	for i, s := range made {
		_, kept := r.secrets[sha256.Sum256([]byte(s))]
		if kept != (i >= 8) {
			t.Errorf("secret %d kept: %v", i, kept)
		}
	}
	h := sha256.Sum256([]byte(made[len(made)-1]))
	r.secrets[h] = relaySecret{id: "a", expires: time.Now().Add(-time.Second)}
	if _, err := r.resolve(made[len(made)-1]); !errors.Is(err, errBadSecret) {
		t.Errorf("an expired secret: %v, want errBadSecret", err)
	}
	if _, ok := r.secrets[h]; ok {
		t.Error("a refused secret is kept")
	}
	h = sha256.Sum256([]byte(made[len(made)-2]))
	r.secrets[h] = relaySecret{id: "a", expires: time.Now().Add(-time.Second)}
	r.secretFor("a")
	if _, ok := r.secrets[h]; ok {
		t.Error("an expired secret outlives the next one made")
	}
	if _, err := r.resolve(strings.Repeat("0", 64)); !errors.Is(err, errBadSecret) {
		t.Errorf("an unknown secret: %v, want errBadSecret", err)
	}
}
