package netplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"nimbus/internal/fleet/wire"
)

// testMetadata answers with what it was asked, and keeps the requests.
type testMetadata struct {
	mu   sync.Mutex
	reqs []wire.MetadataRequest
	fail bool
}

func (m *testMetadata) Metadata(_ context.Context, req wire.MetadataRequest) (wire.MetadataResponse, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reqs = append(m.reqs, req)
	if m.fail {
		return wire.MetadataResponse{}, errors.New("controller unreachable")
	}
	if req.Path == "/missing" {
		return wire.MetadataResponse{Status: http.StatusNotFound, ContentType: "text/plain", Body: []byte("no such thing")}, nil
	}
	body := fmt.Sprintf("%s %s %s %s %s", req.Host, req.NetworkID, req.SourceIP, req.Method, req.Path)
	if len(req.Body) > 0 {
		body += " " + string(req.Body)
	}
	return wire.MetadataResponse{Status: http.StatusOK, ContentType: "application/json", Body: []byte(body)}, nil
}

func (m *testMetadata) last() wire.MetadataRequest {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.reqs[len(m.reqs)-1]
}

// metadataGet is a guest's GET to 169.254.169.254 from address from,
// its socket made in the guest's namespace.
func metadataGet(t *testing.T, guestPath, from, path string) string {
	t.Helper()
	tr := &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		var c net.Conn
		err := inNS(guestPath, func() error {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 5 * time.Second}
			var err error
			c, err = d.DialContext(ctx, "tcp4", addr)
			return err
		})
		return c, err
	}}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get("http://169.254.169.254" + path)
	if err != nil {
		t.Fatalf("metadata from %s: %v", from, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("metadata from %s: %s: %s", from, resp.Status, b)
	}
	return string(b)
}

// TestMetadataHandler serves the proxy's handler on a loopback socket:
// what it relays, what it refuses.
func TestMetadataHandler(t *testing.T) {
	src := &testMetadata{}
	var data atomic.Pointer[dhcpData]
	data.Store(&dhcpData{host: "host-a"})
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: &metadataHandler{networkID: "net-1", data: &data, src: src, log: slog.New(slog.DiscardHandler)}}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	base := "http://" + ln.Addr().String()

	for _, c := range []struct {
		method, path, body string
		status             int
		ctype, want        string
	}{
		{"GET", "/openstack/latest/meta_data.json?a=b", "", 200, "application/json", "host-a net-1 127.0.0.1 GET /openstack/latest/meta_data.json?a=b"},
		{"POST", "/openstack/latest/password", "s3cret", 200, "application/json", "host-a net-1 127.0.0.1 POST /openstack/latest/password s3cret"},
		{"HEAD", "/latest/meta-data/", "", 200, "application/json", ""},
		{"GET", "/missing", "", 404, "text/plain", "no such thing"},
		{"PUT", "/openstack/latest/password", "x", 405, "", ""},
		{"DELETE", "/", "", 405, "", ""},
		{"POST", "/openstack/latest/password", strings.Repeat("x", maxMetadataBody+1), 413, "", ""},
	} {
		t.Run(c.method+" "+c.path, func(t *testing.T) {
			before := len(src.reqs)
			req, _ := http.NewRequest(c.method, base+c.path, strings.NewReader(c.body))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != c.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, c.status, b)
			}
			if c.status == 405 || c.status == 413 {
				if len(src.reqs) != before {
					t.Errorf("refused request reached the metadata service")
				}
				return
			}
			if ct := resp.Header.Get("Content-Type"); ct != c.ctype {
				t.Errorf("content type %q, want %q", ct, c.ctype)
			}
			if string(b) != c.want {
				t.Errorf("body %q, want %q", b, c.want)
			}
			if r := src.last(); r.Method != c.method || r.SourceIP != "127.0.0.1" || r.NetworkID != "net-1" || r.Host != "host-a" {
				t.Errorf("request %+v", r)
			}
		})
	}

	src.fail = true
	resp, err := http.Get(base + "/openstack")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway {
		t.Errorf("metadata service down: status %d, want 502", resp.StatusCode)
	}
}
