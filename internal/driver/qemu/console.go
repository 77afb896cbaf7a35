package qemu

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"nimbus/internal/driver"
)

// The VNC console relay. Each server's QEMU serves VNC on DIR/vnc.sock, a
// unix socket in its private directory that only the agent reaches. The
// controller's console proxy (internal/console) reaches it through the
// relay: one TCP listener per driver, on the host's address (Config.
// ConsoleListen), started on the first Console call. A connection first
// sends its server's secret and a newline; the relay finds whose secret it
// is, opens that server's vnc.sock and pipes the bytes both ways, so that
// what follows is QEMU's RFB. A wrong secret, or none within
// consoleHandshake, closes the connection before any byte of RFB.
//
// Each Console call makes a random secret that opens one connection, to
// that server, within consoleSecretTTL: compute keeps it with the console
// token it makes for the call, and the proxy sends it once, when it spends
// the token. Only secrets' SHA-256 hashes are kept, in memory: after an
// agent restart (a new relay, on a new port unless ConsoleListen fixes it)
// the tokens made before lead nowhere and the next Console call works.
// The secret stands between the relay port and anyone else who reaches it
// (other hosts, and guests, which reach the host's addresses through their
// user-mode network); one seen on the hosts' network, where the proxy
// sends it in the clear, or in a token's row opens nothing more.

const (
	// consoleHandshake bounds how long a connection may take to send its
	// secret line.
	consoleHandshake = 10 * time.Second
	// maxSecretLine bounds the secret line (a secret is 64 hex digits).
	maxSecretLine = 128
	// maxConsoleHandshakes bounds the connections that have not yet sent
	// their secret; more are closed at once.
	maxConsoleHandshakes = 64
	// consoleSecretTTL is how long a secret waits for its connection:
	// longer than a console token waits to be opened (compute's
	// ConsoleTokenTTL, 2 min), with room for the hosts' clocks.
	consoleSecretTTL = 10 * time.Minute
	// maxConsoleSecrets bounds the unused secrets of one server (each
	// console URL asked for makes one); the oldest go first.
	maxConsoleSecrets = 32
)

// errBadSecret is a secret line that is no server's secret.
var errBadSecret = errors.New("qemu: console: wrong secret")

// consoleRelay is a driver's console listener and its servers' secrets.
type consoleRelay struct {
	d    *Driver
	log  *slog.Logger
	ln   net.Listener
	host string // what the controller dials
	port int

	slots chan struct{} // one per connection still in its handshake

	mu      sync.Mutex
	secrets map[[32]byte]relaySecret // by the SHA-256 of the secret
	conns   map[net.Conn]struct{}
	closed  bool
}

// relaySecret is what an unused secret opens, and until when.
type relaySecret struct {
	id      string
	expires time.Time
}

// relays are the drivers' relays, made on first use (so that the relay
// needs nothing of the Driver struct) and dropped when the driver closes.
var relays struct {
	sync.Mutex
	m map[*Driver]*consoleRelay
}

// Console says where the controller's console proxy reaches a running
// server's VNC console: the relay's address and the server's secret. An
// unknown server is driver.ErrNotFound; a server whose QEMU does not run
// (stopped, suspended, not yet started) is an error.
func (d *Driver) Console(ctx context.Context, id string) (driver.ConsoleEndpoint, error) {
	v := d.lookup(id)
	if v == nil {
		return driver.ConsoleEndpoint{}, driver.ErrNotFound
	}
	v.mu.Lock()
	ok := v.ready && !v.gone
	v.mu.Unlock()
	if !ok {
		return driver.ConsoleEndpoint{}, driver.ErrNotFound
	}
	if v.current() == nil {
		return driver.ConsoleEndpoint{}, fmt.Errorf("qemu: console of %s: the server is not running", id)
	}
	r, err := d.consoleRelay()
	if err != nil {
		return driver.ConsoleEndpoint{}, err
	}
	secret, err := r.secretFor(id)
	if err != nil {
		return driver.ConsoleEndpoint{}, err
	}
	return driver.ConsoleEndpoint{Host: r.host, Port: r.port, Secret: secret}, nil
}

// consoleRelay returns the driver's relay, starting it on first use.
func (d *Driver) consoleRelay() (*consoleRelay, error) {
	relays.Lock()
	defer relays.Unlock()
	if r := relays.m[d]; r != nil {
		return r, nil
	}
	select {
	case <-d.closing:
		return nil, errors.New("qemu: console: the driver is closed")
	default:
	}
	ln, host, err := listenConsole(d.cfg.ConsoleListen, d.host.IP, d.log)
	if err != nil {
		return nil, err
	}
	r := &consoleRelay{d: d, log: d.log, ln: ln, host: host, port: ln.Addr().(*net.TCPAddr).Port,
		slots:   make(chan struct{}, maxConsoleHandshakes),
		secrets: map[[32]byte]relaySecret{}, conns: map[net.Conn]struct{}{}}
	if relays.m == nil {
		relays.m = map[*Driver]*consoleRelay{}
	}
	relays.m[d] = r
	go r.serve()
	go func() {
		<-d.closing
		relays.Lock()
		delete(relays.m, d)
		relays.Unlock()
		r.close()
	}()
	d.log.Info("qemu: console relay listening", "addr", ln.Addr().String(), "host", host)
	return r, nil
}

// listenConsole binds the relay: on listen when set, else on the host's
// address (any free port), or on every interface when that address is not
// this machine's (a NAT address). host is what the controller is to dial.
func listenConsole(listen, hostIP string, log *slog.Logger) (ln net.Listener, host string, err error) {
	addr := listen
	if addr == "" {
		ip := hostIP
		if ip == "" {
			ip = "127.0.0.1"
		}
		addr = net.JoinHostPort(ip, "0")
	}
	ln, err = net.Listen("tcp", addr)
	if err != nil && listen == "" && hostIP != "" {
		log.Warn("qemu: console relay: cannot listen on the host's address; listening on every interface", "addr", addr, "error", err)
		ln, err = net.Listen("tcp", ":0")
	}
	if err != nil {
		return nil, "", fmt.Errorf("qemu: console relay: %w", err)
	}
	host = hostIP
	if ta, ok := ln.Addr().(*net.TCPAddr); ok && !ta.IP.IsUnspecified() {
		host = ta.IP.String()
	}
	if host == "" {
		host = "127.0.0.1"
	}
	return ln, host, nil
}

// secretFor makes a secret that opens one connection to server id's
// console. It also forgets the secrets that expired, or whose server the
// driver no longer has, and the oldest of id's beyond maxConsoleSecrets.
func (r *consoleRelay) secretFor(id string) (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("qemu: console secret: %w", err)
	}
	s := hex.EncodeToString(b)
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	var mine [][32]byte
	for h, rs := range r.secrets {
		switch {
		case !now.Before(rs.expires) || (rs.id != id && r.d.lookup(rs.id) == nil):
			delete(r.secrets, h)
		case rs.id == id:
			mine = append(mine, h)
		}
	}
	if over := len(mine) + 1 - maxConsoleSecrets; over > 0 {
		slices.SortFunc(mine, func(a, b [32]byte) int { return r.secrets[a].expires.Compare(r.secrets[b].expires) })
		for _, h := range mine[:over] {
			delete(r.secrets, h)
		}
	}
	r.secrets[sha256.Sum256([]byte(s))] = relaySecret{id: id, expires: now.Add(consoleSecretTTL)}
	return s, nil
}

// resolve spends a secret and finds the VNC socket of the running server
// it opens.
func (r *consoleRelay) resolve(secret string) (string, error) {
	// Secrets are found by their hash, which tells nothing of the secret
	// by the time a lookup takes, and a secret's hash matching is the
	// secret matching.
	h := sha256.Sum256([]byte(secret))
	r.mu.Lock()
	rs, ok := r.secrets[h]
	delete(r.secrets, h)
	r.mu.Unlock()
	if !ok || !time.Now().Before(rs.expires) {
		return "", errBadSecret
	}
	id := rs.id
	v := r.d.lookup(id)
	if v == nil {
		return "", fmt.Errorf("qemu: console of %s: no such server", id)
	}
	v.mu.Lock()
	ok = v.ready && !v.gone
	v.mu.Unlock()
	if !ok || v.current() == nil {
		return "", fmt.Errorf("qemu: console of %s: the server is not running", id)
	}
	return filepath.Join(v.dir, VNCSocket), nil
}

// serve accepts the relay's connections until it is closed.
func (r *consoleRelay) serve() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			r.log.Warn("qemu: console relay: accept", "error", err)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		select {
		case r.slots <- struct{}{}:
		default:
			r.log.Warn("qemu: console relay: too many connections waiting for their secret; closing one", "remote", c.RemoteAddr().String())
			c.Close()
			continue
		}
		if !r.track(c) {
			<-r.slots
			c.Close()
			return
		}
		go func() {
			defer r.untrack(c)
			var once sync.Once
			release := func() { once.Do(func() { <-r.slots }) }
			defer release()
			err := relayConn(c, consoleHandshake, func(secret string) (string, error) {
				release()
				return r.resolve(secret)
			})
			if err != nil {
				r.log.Warn("qemu: console relay: connection refused", "remote", c.RemoteAddr().String(), "error", err)
			}
		}()
	}
}

func (r *consoleRelay) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	r.conns[c] = struct{}{}
	return true
}

func (r *consoleRelay) untrack(c net.Conn) {
	r.mu.Lock()
	delete(r.conns, c)
	r.mu.Unlock()
}

// close stops the relay and ends its connections.
func (r *consoleRelay) close() {
	r.mu.Lock()
	r.closed = true
	conns := r.conns
	r.conns = map[net.Conn]struct{}{}
	r.mu.Unlock()
	r.ln.Close()
	for c := range conns {
		c.Close()
	}
}

// relayConn serves one relay connection: it reads the secret line (within
// timeout, one byte at a time so that nothing after the newline is read),
// asks resolve for the unix socket that secret opens, and pipes c to it
// until either side closes. A wrong secret gets c closed without a byte.
func relayConn(c net.Conn, timeout time.Duration, resolve func(secret string) (sock string, err error)) error {
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(timeout))
	secret, err := readLine(c, maxSecretLine)
	if err != nil {
		return fmt.Errorf("reading the secret: %w", err)
	}
	sock, err := resolve(secret)
	if err != nil {
		return err
	}
	vnc, err := net.DialTimeout("unix", sock, 5*time.Second)
	if err != nil {
		return fmt.Errorf("qemu: console: %w", err)
	}
	c.SetReadDeadline(time.Time{})
	pipe(c, vnc)
	return nil
}

// readLine reads up to and without a newline (and a carriage return
// before it), at most limit bytes.
func readLine(r io.Reader, limit int) (string, error) {
	var b [1]byte
	line := make([]byte, 0, 80)
	for {
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return "", err
		}
		if b[0] == '\n' {
			return strings.TrimSuffix(string(line), "\r"), nil
		}
		if len(line) >= limit {
			return "", errors.New("line too long")
		}
		line = append(line, b[0])
	}
}

// pipe copies a to b and b to a until either ends, then closes both.
func pipe(a, b net.Conn) {
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		io.Copy(dst, src)
		done <- struct{}{}
	}
	go cp(a, b)
	go cp(b, a)
	<-done
	a.Close()
	b.Close()
	<-done
}
