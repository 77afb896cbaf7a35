package api

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ProxyHeaderTimeout bounds how long a trusted load balancer may take to
// send its PROXY header after connecting; HAProxy sends it at once.
const ProxyHeaderTimeout = 5 * time.Second

// ProxyListener serves behind a load balancer that passes TLS through
// (HAProxy in TCP mode): a connection from one of the trusted addresses
// must begin with a PROXY protocol header, version 1 or 2 (HAProxy's
// send-proxy, send-proxy-v2), and the client it names becomes the
// connection's remote address, so that per-client limits and logs see
// the customer, not the balancer. A connection from any other address is
// taken as it is: nobody else can name a client. The header is read off
// the accept loop, so that one slow connection holds up no other.
func ProxyListener(ln net.Listener, trusted []netip.Prefix) net.Listener {
	if len(trusted) == 0 {
		return ln
	}
	pl := &proxyListener{Listener: ln, trusted: trusted, conns: make(chan net.Conn), done: make(chan struct{})}
	go pl.acceptLoop()
	return pl
}

type proxyListener struct {
	net.Listener
	trusted []netip.Prefix
	conns   chan net.Conn
	done    chan struct{}
	once    sync.Once
	err     error // the listener's error, once done is closed
}

func (pl *proxyListener) acceptLoop() {
	for {
		c, err := pl.Listener.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(5 * time.Millisecond)
				continue
			}
			pl.err = err
			pl.once.Do(func() { close(pl.done) })
			return
		}
		if !pl.isTrusted(c.RemoteAddr()) {
			pl.deliver(c)
			continue
		}
		go func() {
			pc, err := readProxyHeader(c, ProxyHeaderTimeout)
			if err != nil {
				proxyRefused.Inc()
				c.Close()
				return
			}
			pl.deliver(pc)
		}()
	}
}

func (pl *proxyListener) deliver(c net.Conn) {
	select {
	case pl.conns <- c:
	case <-pl.done:
		c.Close()
	}
}

func (pl *proxyListener) isTrusted(a net.Addr) bool {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return false
	}
	ip, ok := netip.AddrFromSlice(ta.IP)
	if !ok {
		return false
	}
	ip = ip.Unmap()
	for _, p := range pl.trusted {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

func (pl *proxyListener) Accept() (net.Conn, error) {
	select {
	case c := <-pl.conns:
		return c, nil
	case <-pl.done:
		return nil, pl.err
	}
}

func (pl *proxyListener) Close() error {
	err := pl.Listener.Close()
	pl.once.Do(func() { pl.err = net.ErrClosed; close(pl.done) })
	return err
}

// proxiedConn is a connection whose client a PROXY header named.
type proxiedConn struct {
	net.Conn
	r      io.Reader // what the header read ahead, then the connection
	remote net.Addr
}

func (c *proxiedConn) Read(p []byte) (int, error) { return c.r.Read(p) }
func (c *proxiedConn) RemoteAddr() net.Addr       { return c.remote }

// The v2 header's fixed signature (the PROXY protocol, section 2.2).
var proxyV2Sig = []byte("\r\n\r\n\x00\r\nQUIT\n")

// readProxyHeader reads a PROXY header from c within timeout. A LOCAL
// (v2) or UNKNOWN (v1) header, such as a balancer's health check sends,
// keeps the connection's own addresses.
func readProxyHeader(c net.Conn, timeout time.Duration) (net.Conn, error) {
	c.SetReadDeadline(time.Now().Add(timeout))
	defer c.SetReadDeadline(time.Time{})
	br := bufio.NewReaderSize(c, 256)
	sig, err := br.Peek(12)
	if err != nil {
		return nil, err
	}
	var remote net.Addr
	if bytes.Equal(sig, proxyV2Sig) {
		remote, err = readProxyV2(br)
	} else {
		remote, err = readProxyV1(br)
	}
	if err != nil {
		return nil, err
	}
	if remote == nil {
		remote = c.RemoteAddr()
	}
	return &proxiedConn{Conn: c, r: io.MultiReader(io.LimitReader(br, int64(br.Buffered())), c), remote: remote}, nil
}

// readProxyV1 reads "PROXY TCP4|TCP6 src dst sport dport\r\n" or
// "PROXY UNKNOWN…\r\n", at most 107 bytes.
func readProxyV1(br *bufio.Reader) (net.Addr, error) {
	var line []byte
	for len(line) < 107 {
		b, err := br.ReadByte()
		if err != nil {
			return nil, err
		}
		line = append(line, b)
		if b == '\n' {
			break
		}
	}
	s, ok := strings.CutSuffix(string(line), "\r\n")
	if !ok || !strings.HasPrefix(s, "PROXY ") {
		return nil, errors.New("proxy: no PROXY header")
	}
	f := strings.Split(s, " ")
	if f[1] == "UNKNOWN" {
		return nil, nil
	}
	if len(f) != 6 || (f[1] != "TCP4" && f[1] != "TCP6") {
		return nil, fmt.Errorf("proxy: bad v1 header %q", s)
	}
	ip, err := netip.ParseAddr(f[2])
	port, perr := strconv.ParseUint(f[4], 10, 16)
	if err != nil || perr != nil || ip.Is4() != (f[1] == "TCP4") {
		return nil, fmt.Errorf("proxy: bad v1 header %q", s)
	}
	return net.TCPAddrFromAddrPort(netip.AddrPortFrom(ip, uint16(port))), nil
}

// readProxyV2 reads the binary header: signature, version and command,
// family, length, addresses, then TLVs, which are skipped.
func readProxyV2(br *bufio.Reader) (net.Addr, error) {
	var hdr [16]byte
	if _, err := io.ReadFull(br, hdr[:]); err != nil {
		return nil, err
	}
	verCmd, fam, n := hdr[12], hdr[13], int(binary.BigEndian.Uint16(hdr[14:]))
	if verCmd>>4 != 2 || verCmd&0xf > 1 {
		return nil, fmt.Errorf("proxy: bad v2 version/command %#x", verCmd)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(br, body); err != nil {
		return nil, err
	}
	if verCmd&0xf == 0 { // LOCAL: the balancer itself, e.g. a health check
		return nil, nil
	}
	switch fam {
	case 0x11: // TCP over IPv4
		if n < 12 {
			return nil, errors.New("proxy: short v2 IPv4 addresses")
		}
		ip := netip.AddrFrom4([4]byte(body[0:4]))
		return net.TCPAddrFromAddrPort(netip.AddrPortFrom(ip, binary.BigEndian.Uint16(body[8:10]))), nil
	case 0x21: // TCP over IPv6
		if n < 36 {
			return nil, errors.New("proxy: short v2 IPv6 addresses")
		}
		ip := netip.AddrFrom16([16]byte(body[0:16]))
		return net.TCPAddrFromAddrPort(netip.AddrPortFrom(ip, binary.BigEndian.Uint16(body[32:34]))), nil
	}
	return nil, nil // UNSPEC or a family not TCP: keep the connection's own
}

var proxyRefused = prometheus.NewCounter(prometheus.CounterOpts{
	Namespace: "nimbus", Name: "http_proxy_headers_refused_total",
	Help: "Connections from a trusted load balancer closed because they began with no valid PROXY header.",
})

func init() { prometheus.MustRegister(proxyRefused) }
