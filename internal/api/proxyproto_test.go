package api_test

import (
	"encoding/binary"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"nimbus/internal/api"
)

func proxyV2(cmd, fam byte, addrs []byte) []byte {
	h := append([]byte("\r\n\r\n\x00\r\nQUIT\n"), 0x20|cmd, fam, 0, 0)
	binary.BigEndian.PutUint16(h[14:], uint16(len(addrs)))
	return append(h, addrs...)
}

// TestProxyListener: a trusted balancer's connection names its client in
// a PROXY header, v1 or v2, and the listener's connection has that
// client's address and the bytes after the header; a bad header closes
// the connection; an untrusted connection is taken as it is, header or
// not.
func TestProxyListener(t *testing.T) {
	v4 := []byte{203, 0, 113, 7, 192, 0, 2, 1, 0x30, 0x39, 0x01, 0xbb} // 203.0.113.7:12345 -> 192.0.2.1:443
	v6 := append(append(netip.MustParseAddr("2001:db8::7").AsSlice(), netip.MustParseAddr("2001:db8::1").AsSlice()...), 0x30, 0x39, 0x01, 0xbb)
	tests := []struct {
		name    string
		trusted string
		send    []byte
		remote  string // "" the connection's own; "closed" no connection
	}{
		{"v1 tcp4", "127.0.0.0/8", []byte("PROXY TCP4 203.0.113.7 192.0.2.1 12345 443\r\n"), "203.0.113.7:12345"},
		{"v1 tcp6", "127.0.0.0/8", []byte("PROXY TCP6 2001:db8::7 2001:db8::1 12345 443\r\n"), "[2001:db8::7]:12345"},
		{"v1 unknown keeps own", "127.0.0.0/8", []byte("PROXY UNKNOWN\r\n"), ""},
		{"v2 tcp4", "127.0.0.0/8", proxyV2(1, 0x11, v4), "203.0.113.7:12345"},
		{"v2 tcp6 with a TLV after", "127.0.0.0/8", proxyV2(1, 0x21, append(v6, 0x04, 0x00, 0x01, 0xff)), "[2001:db8::7]:12345"},
		{"v2 local (a health check) keeps own", "127.0.0.0/8", proxyV2(0, 0x00, nil), ""},
		{"no header from a trusted address", "127.0.0.0/8", []byte("GET / HTTP/1.1\r\n\r\n"), "closed"},
		{"v1 family mismatch", "127.0.0.0/8", []byte("PROXY TCP4 2001:db8::7 192.0.2.1 1 2\r\n"), "closed"},
		{"v2 bad version", "127.0.0.0/8", append(proxyV2(1, 0x11, v4)[:12], 0x31, 0x11, 0, 12), "closed"},
		{"untrusted: a header is only data", "10.0.0.0/8", []byte("PROXY TCP4 203.0.113.7 192.0.2.1 12345 443\r\n"), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			raw, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			ln := api.ProxyListener(raw, []netip.Prefix{netip.MustParsePrefix(tt.trusted)})
			defer ln.Close()
			c, err := net.Dial("tcp", raw.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			c.Write(append(append([]byte{}, tt.send...), "after"...))
			got := make(chan net.Conn, 1)
			go func() {
				if sc, err := ln.Accept(); err == nil {
					got <- sc
				}
			}()
			select {
			case sc := <-got:
				defer sc.Close()
				if tt.remote == "closed" {
					t.Fatalf("accepted a connection from %s", sc.RemoteAddr())
				}
				want := tt.remote
				if want == "" {
					want = c.LocalAddr().String()
				}
				if sc.RemoteAddr().String() != want {
					t.Errorf("remote %s, want %s", sc.RemoteAddr(), want)
				}
				sc.SetReadDeadline(time.Now().Add(2 * time.Second))
				rest := make([]byte, 5)
				if tt.trusted == "10.0.0.0/8" {
					rest = make([]byte, len(tt.send)+5)
				}
				if _, err := io.ReadFull(sc, rest); err != nil || string(rest[len(rest)-5:]) != "after" {
					t.Errorf("after the header: %q, %v", rest, err)
				}
			case <-time.After(500 * time.Millisecond):
				if tt.remote != "closed" {
					t.Fatal("no connection accepted")
				}
				c.SetReadDeadline(time.Now().Add(2 * time.Second))
				if _, err := c.Read(make([]byte, 1)); err == nil {
					t.Error("the refused connection is still open")
				}
			}
		})
	}
}
