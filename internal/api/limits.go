package api

import (
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// AddressKey is the client a connection comes from, for per-client limits:
// its IP, or for IPv6 its /64, which one subscriber usually holds whole.
func AddressKey(hostport string) string {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		host = hostport
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return host
	}
	if ip.To4() == nil {
		return ip.Mask(net.CIDRMask(64, 128)).String() + "/64"
	}
	return ip.String()
}

// ClientAddress is AddressKey of the request's client, for limits and
// logs: its peer, or behind a trusted proxy the client the proxy names
// (Proxies: a PROXY header, or X-Forwarded-For), never what an untrusted
// client writes in a header.
func ClientAddress(r *http.Request) string { return AddressKey(r.RemoteAddr) }

// BodyTimeouts bound how slowly a client may send a request body: all of it
// within Grace plus its size at MinRate bytes per second, so that an image
// upload of any size may take as long as it needs at a steady pace while a
// body that stalls is cut off.
type BodyTimeouts struct {
	Grace   time.Duration
	MinRate int64
}

// GuardBodies enforces t on h's request bodies through the connection's read
// deadline, moved on as the body arrives (a fixed ReadTimeout would cut long
// uploads). A request without a body, or whose body has all arrived, has no
// read deadline while its handler runs, so that long downloads and long
// polls are not cut: net/http cancels a request's context when a read
// deadline passes under it.
func GuardBodies(h http.Handler, t BodyTimeouts) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
			rc.SetReadDeadline(time.Time{})
		} else {
			b := &rateBody{body: r.Body, rc: rc, start: time.Now(), t: t, size: r.ContentLength}
			if rc.SetReadDeadline(b.deadline()) == nil {
				r.Body = b
			}
		}
		h.ServeHTTP(w, r)
	})
}

// rateBody moves the read deadline as the body arrives.
type rateBody struct {
	body  io.ReadCloser
	rc    *http.ResponseController
	start time.Time
	t     BodyTimeouts
	size  int64     // as declared; -1 when unknown
	n     int64     // bytes read
	until time.Time // a hard end, when set (draining)
}

func (b *rateBody) deadline() time.Time {
	d := b.start.Add(b.t.Grace)
	if b.t.MinRate > 0 {
		d = d.Add(time.Duration(float64(b.n) / float64(b.t.MinRate) * float64(time.Second)))
	}
	if !b.until.IsZero() && b.until.Before(d) {
		d = b.until
	}
	return d
}

func (b *rateBody) Read(p []byte) (int, error) {
	n, err := b.body.Read(p)
	b.n += int64(n)
	switch {
	case err == io.EOF || (b.size >= 0 && b.n >= b.size && b.until.IsZero()):
		b.rc.SetReadDeadline(time.Time{}) // all here: the handler may take its time
	case n > 0:
		b.rc.SetReadDeadline(b.deadline())
	}
	return n, err
}

func (b *rateBody) Close() error { return b.body.Close() }

// What is left of an over-limit body is read and thrown away, up to
// drainMax within drainTime, before the 413 goes out: a server that closes
// a socket with unread data makes the kernel answer with a reset, which
// destroys the response before a client still sending reads it (nginx's
// lingering close does the same).
const (
	drainMax  = 16 << 20
	drainTime = 5 * time.Second
)

// drain discards the rest of body, which declared size bytes (-1: unknown).
func drain(w http.ResponseWriter, body io.Reader, size int64) {
	if size > drainMax {
		return // too much to read for an answer: the client gets a reset
	}
	until := time.Now().Add(drainTime)
	if b, ok := body.(*rateBody); ok {
		b.until = until
	}
	if http.NewResponseController(w).SetReadDeadline(until) != nil {
		return
	}
	io.CopyN(io.Discard, body, drainMax)
}

// overLimitBody records whether a body went over its limit.
type overLimitBody struct {
	io.ReadCloser
	hit bool
}

func (b *overLimitBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		b.hit = true
	}
	return n, err
}

var connsRefused = prometheus.NewCounter(prometheus.CounterOpts{
	Namespace: "nimbus", Name: "http_connections_refused_total",
	Help: "Connections closed at once because their client address had too many open.",
})

func init() { prometheus.MustRegister(connsRefused) }

// ConnLimiter bounds the connections open from one client address over the
// listeners it wraps, so that one client cannot take every file descriptor.
// A trusted proxy's own connections (those without a PROXY header) carry
// many clients and are not counted.
type ConnLimiter struct {
	max     int
	proxies Proxies
	mu      sync.Mutex
	open    map[string]int
}

// NewConnLimiter allows max connections per address (0: no limit).
func NewConnLimiter(max int, proxies Proxies) *ConnLimiter {
	return &ConnLimiter{max: max, proxies: proxies, open: map[string]int{}}
}

// Wrap returns ln with the limit applied: a connection over it is closed
// on its first use, which its server makes at once. The check waits for
// that use because the client's address may come in a PROXY header
// (Proxies.Listener, beneath this one), which Accept must not wait for.
func (l *ConnLimiter) Wrap(ln net.Listener) net.Listener {
	if l.max <= 0 {
		return ln
	}
	return &limitedListener{Listener: ln, l: l}
}

func (l *ConnLimiter) acquire(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[key] >= l.max {
		return false
	}
	l.open[key]++
	return true
}

func (l *ConnLimiter) release(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.open[key]--; l.open[key] <= 0 {
		delete(l.open, key)
	}
}

type limitedListener struct {
	net.Listener
	l *ConnLimiter
}

func (ll *limitedListener) Accept() (net.Conn, error) {
	c, err := ll.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &countedConn{Conn: c, l: ll.l}, nil
}

// errTooManyConns is what a refused connection's first use gets.
var errTooManyConns = errors.New("api: too many connections from this address")

// countedConn takes its address's slot on first use and gives it back
// once, on Close.
type countedConn struct {
	net.Conn
	l        *ConnLimiter
	admitted sync.Once
	ok       bool
	key      string // set when a slot is held
	closed   sync.Once
}

func (c *countedConn) admit() bool {
	c.admitted.Do(func() {
		addr := c.Conn.RemoteAddr()
		if c.l.proxies.trustsAddr(addr) {
			c.ok = true
			return
		}
		key := AddressKey(addr.String())
		if c.ok = c.l.acquire(key); c.ok {
			c.key = key
			return
		}
		connsRefused.Inc()
		c.Conn.Close()
	})
	return c.ok
}

func (c *countedConn) RemoteAddr() net.Addr {
	c.admit()
	return c.Conn.RemoteAddr()
}

func (c *countedConn) Read(b []byte) (int, error) {
	if !c.admit() {
		return 0, errTooManyConns
	}
	return c.Conn.Read(b)
}

func (c *countedConn) Write(b []byte) (int, error) {
	if !c.admit() {
		return 0, errTooManyConns
	}
	return c.Conn.Write(b)
}

// Close closes first, which ends a PROXY header read under way, then
// settles admission (a connection closed unused never takes a slot).
func (c *countedConn) Close() error {
	err := c.Conn.Close()
	c.closed.Do(func() {
		c.admitted.Do(func() {})
		if c.key != "" {
			c.l.release(c.key)
		}
	})
	return err
}
