package api

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"time"
)

// Proxies are the reverse proxies (--trusted-proxies) whose word on a
// client's address is believed, and only theirs: any client can write an
// X-Forwarded-For header or a PROXY line.
//
// Two words are understood. The PROXY protocol (v1 text or v2 binary, as
// HAProxy's send-proxy and send-proxy-v2 write) gives the address of the
// whole connection: it is what a proxy in TCP mode sends, which passes
// TLS through to Nimbus (its own certificate, ACME's TLS-ALPN-01
// challenge), and the per-address connection limit sees the client. A
// proxy that ends TLS itself and speaks HTTP to Nimbus writes
// X-Forwarded-For instead, which gives each request's address.
type Proxies []netip.Prefix

// ParseProxies reads CIDRs or single addresses. A prefix of length 0
// would believe every client, and is refused.
func ParseProxies(list []string) (Proxies, error) {
	var p Proxies
	for _, s := range list {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		pfx, err := netip.ParsePrefix(s)
		if err != nil {
			a, err2 := netip.ParseAddr(s)
			if err2 != nil {
				return nil, fmt.Errorf("%q is neither a CIDR nor an address", s)
			}
			pfx = netip.PrefixFrom(a, a.BitLen())
		}
		if pfx.Bits() == 0 {
			return nil, fmt.Errorf("%q would trust every client's word on its address", s)
		}
		p = append(p, pfx.Masked())
	}
	return p, nil
}

// Trusts reports whether a is one of the proxies.
func (p Proxies) Trusts(a netip.Addr) bool {
	a = a.Unmap()
	for _, pfx := range p {
		if pfx.Contains(a) {
			return true
		}
	}
	return false
}

func (p Proxies) trustsAddr(addr net.Addr) bool {
	if len(p) == 0 || addr == nil {
		return false
	}
	ap, err := netip.ParseAddrPort(addr.String())
	return err == nil && p.Trusts(ap.Addr())
}

// Handler gives h, for a request from a trusted proxy, the client's
// address from X-Forwarded-For as r.RemoteAddr (port 0), which
// ClientAddress, the limits and the logs read. The address is the
// rightmost one not itself a trusted proxy: each proxy appends the address
// it got the request from, so those to its left are the client's to write.
func (p Proxies) Handler(h http.Handler) http.Handler {
	if len(p) == 0 {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if peer, err := netip.ParseAddrPort(r.RemoteAddr); err == nil && p.Trusts(peer.Addr()) {
			if client := p.forwardedFor(peer.Addr(), r.Header.Values("X-Forwarded-For")); client != peer.Addr() {
				r.RemoteAddr = netip.AddrPortFrom(client, 0).String()
			}
		}
		h.ServeHTTP(w, r)
	})
}

func (p Proxies) forwardedFor(peer netip.Addr, headers []string) netip.Addr {
	var hops []string
	for _, h := range headers {
		hops = append(hops, strings.Split(h, ",")...)
	}
	client := peer
	for i := len(hops) - 1; i >= 0 && p.Trusts(client); i-- {
		a, err := parseHop(strings.TrimSpace(hops[i]))
		if err != nil {
			break // not an address: the hop to its right is all that is known
		}
		client = a
	}
	return client.Unmap()
}

// parseHop reads an address as proxies write them: bare, or with a port.
func parseHop(s string) (netip.Addr, error) {
	if a, err := netip.ParseAddr(s); err == nil {
		return a, nil
	}
	ap, err := netip.ParseAddrPort(s)
	return ap.Addr(), err
}

// proxyHeaderTimeout bounds how long a trusted proxy may take to send its
// PROXY header after connecting (HAProxy sends it at once).
const proxyHeaderTimeout = 10 * time.Second

// Listener wraps ln so that a connection from a trusted proxy that begins
// with a PROXY header has the client's address as its RemoteAddr. The
// header is read on the connection's first use (its server goroutine asks
// for RemoteAddr first), not in Accept, so that a slow proxy holds up only
// its own connection. One without a header is the proxy's own (a health
// check, or a proxy that writes X-Forwarded-For).
func (p Proxies) Listener(ln net.Listener) net.Listener {
	if len(p) == 0 {
		return ln
	}
	return &proxyListener{Listener: ln, p: p}
}

type proxyListener struct {
	net.Listener
	p Proxies
}

func (l *proxyListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil || !l.p.trustsAddr(c.RemoteAddr()) {
		return c, err
	}
	return &proxyConn{Conn: c, r: bufio.NewReaderSize(c, 256)}, nil
}

// proxyConn reads a PROXY header, if any, before anything else.
type proxyConn struct {
	net.Conn
	r      *bufio.Reader
	once   sync.Once
	client net.Addr // nil: none given
	err    error
}

func (c *proxyConn) header() {
	c.once.Do(func() {
		c.Conn.SetReadDeadline(time.Now().Add(proxyHeaderTimeout))
		c.client, c.err = readProxyHeader(c.r)
		c.Conn.SetReadDeadline(time.Time{})
		if c.err != nil {
			c.err = fmt.Errorf("api: PROXY header from %s: %w", c.Conn.RemoteAddr(), c.err)
			c.Conn.Close()
		}
	})
}

func (c *proxyConn) Read(b []byte) (int, error) {
	if c.header(); c.err != nil {
		return 0, c.err
	}
	return c.r.Read(b)
}

func (c *proxyConn) RemoteAddr() net.Addr {
	if c.header(); c.client != nil {
		return c.client
	}
	return c.Conn.RemoteAddr()
}

var (
	proxyV1Prefix = []byte("PROXY ")
	proxyV2Sig    = []byte("\r\n\r\n\x00\r\nQUIT\n")
)

// readProxyHeader reads a PROXY protocol header (haproxy.org's
// proxy-protocol.txt) when the stream begins with one, and answers the
// client's address it gives (nil for v1 UNKNOWN and v2 LOCAL: the proxy's
// own connection). A stream that begins otherwise (a TLS ClientHello
// begins 0x16, an HTTP request with a method) is left unread.
func readProxyHeader(r *bufio.Reader) (net.Addr, error) {
	first, err := r.Peek(1)
	if err != nil {
		return nil, err
	}
	switch first[0] {
	case 'P':
		if b, err := r.Peek(len(proxyV1Prefix)); err != nil || !bytes.Equal(b, proxyV1Prefix) {
			return nil, nil // POST, PUT, PATCH
		}
		return readProxyV1(r)
	case '\r':
		if b, err := r.Peek(len(proxyV2Sig)); err == nil && bytes.Equal(b, proxyV2Sig) {
			return readProxyV2(r)
		}
	}
	return nil, nil
}

// proxyV1Max is the longest v1 line, CRLF included.
const proxyV1Max = 107

func readProxyV1(r *bufio.Reader) (net.Addr, error) {
	line, err := r.ReadSlice('\n')
	if err != nil || len(line) > proxyV1Max || !bytes.HasSuffix(line, []byte("\r\n")) {
		return nil, errors.New("v1 line not ended by CRLF within 107 bytes")
	}
	f := strings.Fields(string(line[:len(line)-2]))
	if len(f) >= 2 && f[1] == "UNKNOWN" {
		return nil, nil
	}
	if len(f) != 6 || (f[1] != "TCP4" && f[1] != "TCP6") {
		return nil, fmt.Errorf("malformed v1 line %q", line)
	}
	src, err := netip.ParseAddr(f[2])
	if err != nil || src.Is4() != (f[1] == "TCP4") {
		return nil, fmt.Errorf("v1 source address %q", f[2])
	}
	ap, err := netip.ParseAddrPort(net.JoinHostPort(f[2], f[4]))
	if err != nil {
		return nil, fmt.Errorf("v1 source port %q", f[4])
	}
	return net.TCPAddrFromAddrPort(ap), nil
}

func readProxyV2(r *bufio.Reader) (net.Addr, error) {
	var hdr [16]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	verCmd, fam, n := hdr[12], hdr[13], int(binary.BigEndian.Uint16(hdr[14:]))
	if verCmd>>4 != 2 {
		return nil, fmt.Errorf("v2 version %d", verCmd>>4)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return nil, err
	}
	switch verCmd & 0xf {
	case 0: // LOCAL: the proxy's own (health checks)
		return nil, nil
	case 1: // PROXY
	default:
		return nil, fmt.Errorf("v2 command %d", verCmd&0xf)
	}
	var ip []byte
	var port uint16
	switch fam >> 4 {
	case 1: // AF_INET: src, dst, sport, dport
		if n < 12 {
			return nil, errors.New("v2 IPv4 addresses cut short")
		}
		ip, port = body[0:4], binary.BigEndian.Uint16(body[8:10])
	case 2: // AF_INET6
		if n < 36 {
			return nil, errors.New("v2 IPv6 addresses cut short")
		}
		ip, port = body[0:16], binary.BigEndian.Uint16(body[32:34])
	default: // AF_UNSPEC, AF_UNIX: no address to give
		return nil, nil
	}
	a, _ := netip.AddrFromSlice(ip)
	return net.TCPAddrFromAddrPort(netip.AddrPortFrom(a.Unmap(), port)), nil
}
