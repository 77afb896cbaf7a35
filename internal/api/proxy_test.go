package api

import (
	"bufio"
	"encoding/binary"
	"io"
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"
)

// serveClientAddress serves, over a real socket with the listeners and
// handler as a cloud stacks them, a handler that answers ClientAddress.
func serveClientAddress(t *testing.T, trusted []string, maxConns int) string {
	t.Helper()
	p, err := ParseProxies(trusted)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	h := p.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, ClientAddress(r))
	}))
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(NewConnLimiter(maxConns, p).Wrap(p.Listener(ln)))
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// ask sends prefix, then a GET with the given X-Forwarded-For (if any),
// on a new connection, and answers the body (or the status when not 200,
// "closed" when the connection ends without an answer).
func ask(t *testing.T, addr string, prefix []byte, xff ...string) string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	req := "GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
	for _, h := range xff {
		req += "X-Forwarded-For: " + h + "\r\n"
	}
	c.Write(append(prefix, req+"\r\n"...))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return "closed"
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return resp.Status
	}
	return string(body)
}

func proxyV2(cmd byte, src netip.AddrPort) []byte {
	b := append([]byte{}, proxyV2Sig...)
	var addrs []byte
	fam := byte(0x11)
	if src.Addr().Is6() {
		fam = 0x21
		addrs = append(addrs, src.Addr().AsSlice()...)
		addrs = append(addrs, netip.IPv6Loopback().AsSlice()...)
	} else {
		addrs = append(addrs, src.Addr().AsSlice()...)
		addrs = append(addrs, 127, 0, 0, 1)
	}
	addrs = binary.BigEndian.AppendUint16(addrs, src.Port())
	addrs = binary.BigEndian.AppendUint16(addrs, 443)
	addrs = append(addrs, 0x04, 0, 1, 0) // a TLV (PP2_TYPE_NOOP), skipped
	b = append(b, 0x20|cmd, fam)
	b = binary.BigEndian.AppendUint16(b, uint16(len(addrs)))
	return append(b, addrs...)
}

// TestClientAddressBehindProxies: X-Forwarded-For and PROXY headers are
// believed from the trusted proxies alone, and then only as far as the
// first address not a trusted proxy; a spoofed one from anyone else is
// ignored.
func TestClientAddressBehindProxies(t *testing.T) {
	untrusted := serveClientAddress(t, nil, 0)
	elsewhere := serveClientAddress(t, []string{"10.0.0.0/8"}, 0)
	trusted := serveClientAddress(t, []string{"127.0.0.1", "10.0.0.0/8"}, 0)
	v1 := func(s string) []byte { return []byte(s) }
	tests := []struct {
		name   string
		addr   string
		prefix []byte
		xff    []string
		want   string
	}{
		{"no proxies: a spoofed X-Forwarded-For is ignored", untrusted, nil, []string{"203.0.113.9"}, "127.0.0.1"},
		{"from an untrusted address: ignored", elsewhere, nil, []string{"203.0.113.9"}, "127.0.0.1"},
		{"from a trusted proxy: believed", trusted, nil, []string{"203.0.113.9"}, "203.0.113.9"},
		{"the client's own entry on the left is not", trusted, nil, []string{"198.51.100.1, 203.0.113.9"}, "203.0.113.9"},
		{"headers in order", trusted, nil, []string{"198.51.100.1", "203.0.113.9"}, "203.0.113.9"},
		{"through two trusted proxies", trusted, nil, []string{"203.0.113.9, 10.1.2.3"}, "203.0.113.9"},
		{"with a port", trusted, nil, []string{"203.0.113.9:4711"}, "203.0.113.9"},
		{"IPv6: its /64", trusted, nil, []string{"2001:db8::1"}, "2001:db8::/64"},
		{"not an address: the proxy", trusted, nil, []string{"unknown"}, "127.0.0.1"},
		{"no header: the proxy", trusted, nil, nil, "127.0.0.1"},
		{"PROXY v1 from a trusted proxy", trusted, v1("PROXY TCP4 203.0.113.7 127.0.0.1 5555 443\r\n"), nil, "203.0.113.7"},
		{"PROXY v1 TCP6", trusted, v1("PROXY TCP6 2001:db8::7 ::1 5555 443\r\n"), nil, "2001:db8::/64"},
		{"PROXY v1 UNKNOWN: the proxy", trusted, v1("PROXY UNKNOWN\r\n"), nil, "127.0.0.1"},
		{"PROXY names an untrusted client: its X-Forwarded-For is ignored", trusted,
			v1("PROXY TCP4 203.0.113.7 127.0.0.1 5555 443\r\n"), []string{"198.51.100.1"}, "203.0.113.7"},
		{"PROXY v2", trusted, proxyV2(1, netip.MustParseAddrPort("203.0.113.8:5555")), nil, "203.0.113.8"},
		{"PROXY v2 IPv6", trusted, proxyV2(1, netip.MustParseAddrPort("[2001:db8::8]:5555")), nil, "2001:db8::/64"},
		{"PROXY v2 LOCAL: the proxy", trusted, proxyV2(0, netip.MustParseAddrPort("203.0.113.8:5555")), nil, "127.0.0.1"},
		{"PROXY v1 from an untrusted address is not read", untrusted, v1("PROXY TCP4 203.0.113.7 127.0.0.1 5555 443\r\n"), nil, "400 Bad Request"},
		{"a malformed PROXY line closes the connection", trusted, v1("PROXY TCP4 nonsense\r\n"), nil, "closed"},
		{"a wrong address family too", trusted, v1("PROXY TCP4 2001:db8::7 ::1 5555 443\r\n"), nil, "closed"},
	}
	for _, tc := range tests {
		if got := ask(t, tc.addr, tc.prefix, tc.xff...); got != tc.want {
			t.Errorf("%s: client %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestParseProxies: CIDRs and addresses are read; a /0, which would
// believe every client, and what is not an address are refused.
func TestParseProxies(t *testing.T) {
	for _, tc := range []struct {
		in []string
		ok bool
	}{
		{[]string{"10.0.0.0/8", "192.0.2.7", "2001:db8::/48", " "}, true},
		{[]string{"0.0.0.0/0"}, false},
		{[]string{"::/0"}, false},
		{[]string{"proxy.example.net"}, false},
		{[]string{"10.0.0.0/33"}, false},
	} {
		if _, err := ParseProxies(tc.in); (err == nil) != tc.ok {
			t.Errorf("%q: %v, want ok=%v", tc.in, err, tc.ok)
		}
	}
}

// TestConnLimitBehindProxy: the per-address connection limit counts the
// client a PROXY header names, not the proxy, whose own connections (an
// X-Forwarded-For proxy's) it does not count at all.
func TestConnLimitBehindProxy(t *testing.T) {
	addr := serveClientAddress(t, []string{"127.0.0.1"}, 1)
	hold := func(prefix string) net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.Write([]byte(prefix + "GET / HTTP/1.1\r\nHost: x\r\n")) // unfinished: the connection stays
		time.Sleep(50 * time.Millisecond)
		return c
	}
	hold("PROXY TCP4 203.0.113.7 127.0.0.1 5555 443\r\n")
	hold("") // the proxy's own
	for _, tc := range []struct {
		prefix, want string
	}{
		{"PROXY TCP4 203.0.113.7 127.0.0.1 5556 443\r\n", "closed"},
		{"PROXY TCP4 203.0.113.8 127.0.0.1 5555 443\r\n", "203.0.113.8"},
		{"", "127.0.0.1"},
	} {
		if got := ask(t, addr, []byte(tc.prefix)); got != tc.want {
			t.Errorf("%q: %q, want %q", tc.prefix, got, tc.want)
		}
	}
	// Without trusted proxies, the proxy is one client like any other.
	plain := serveClientAddress(t, nil, 1)
	c, err := net.Dial("tcp", plain)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n"))
	time.Sleep(50 * time.Millisecond)
	if got := ask(t, plain, nil); got != "closed" {
		t.Errorf("a second connection from one address: %q, want it closed", got)
	}
}
