package api_test

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"nimbus/internal/cloud"
	"nimbus/internal/testenv"
)

// dialTLS opens a raw TLS connection to a service of c.
func dialTLS(t *testing.T, c *cloud.Cloud, serviceURL string) (*tls.Conn, string) {
	t.Helper()
	u, err := url.Parse(serviceURL)
	if err != nil {
		t.Fatal(err)
	}
	pem, err := os.ReadFile(c.CACertFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", u.Host,
		&tls.Config{RootCAs: pool, ServerName: u.Hostname(), NextProtos: []string{"http/1.1"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn, u.Host
}

// TestOversizeBodyGets413 sends 10 MB bodies to nine endpoints from a client
// that keeps sending steadily until it has sent all, then reads: it must
// get the 413 in the service's JSON shape, not a reset connection, whether
// the body declares its length or comes in chunks.
func TestOversizeBodyGets413(t *testing.T) {
	c := testenv.StartCloud(t, "")
	admin := testenv.Token(t, c, cloud.AdminUser)
	const id = "00000000-0000-0000-0000-000000000000"
	endpoints := []struct {
		name, method, base, path string
	}{
		{"token issue", "POST", c.IdentityURL, "/auth/tokens"},
		{"server create", "POST", c.ComputeURL, "/servers"},
		{"server action", "POST", c.ComputeURL, "/servers/" + id + "/action"},
		{"server update", "PUT", c.ComputeURL, "/servers/" + id},
		{"key pair", "POST", c.ComputeURL, "/os-keypairs"},
		{"flavor", "POST", c.ComputeURL, "/flavors"},
		{"image patch", "PATCH", c.ImageURL, "/v2/images/" + id},
		{"network", "POST", c.NetworkURL, "/v2.0/networks"},
		{"port", "POST", c.NetworkURL, "/v2.0/ports"},
	}
	const size = 10 << 20
	chunk := []byte(`{"x":"` + strings.Repeat("a", 64<<10-8) + `"}`)
	for _, ep := range endpoints {
		for _, chunked := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/chunked=%v", ep.name, chunked), func(t *testing.T) {
				conn, host := dialTLS(t, c, ep.base)
				u, _ := url.Parse(ep.base + ep.path)
				head := fmt.Sprintf("%s %s HTTP/1.1\r\nHost: %s\r\nX-Auth-Token: %s\r\nContent-Type: application/json\r\n",
					ep.method, u.Path, host, admin)
				if chunked {
					head += "Transfer-Encoding: chunked\r\n\r\n"
				} else {
					head += fmt.Sprintf("Content-Length: %d\r\n\r\n", size)
				}
				conn.SetDeadline(time.Now().Add(30 * time.Second))
				if _, err := io.WriteString(conn, head); err != nil {
					t.Fatal(err)
				}
				for sent := 0; sent < size; sent += len(chunk) {
					part := chunk[:min(len(chunk), size-sent)]
					var err error
					if chunked {
						_, err = fmt.Fprintf(conn, "%x\r\n%s\r\n", len(part), part)
					} else {
						_, err = conn.Write(part)
					}
					if err != nil {
						t.Fatalf("after %d bytes: %v", sent, err)
					}
					time.Sleep(200 * time.Microsecond)
				}
				if chunked {
					if _, err := io.WriteString(conn, "0\r\n\r\n"); err != nil {
						t.Fatal(err)
					}
				}
				resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
				if err != nil {
					t.Fatalf("read response: %v", err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusRequestEntityTooLarge || !json.Valid(body) ||
					!strings.Contains(string(body), "Request is too large.") {
					t.Fatalf("got %d %s, want 413 with a JSON error", resp.StatusCode, body)
				}
			})
		}
	}
}

// TestSlowBodyIsCut: a body that stalls is cut off after the body timeout,
// while one that arrives slowly but at the minimum rate is served in full.
func TestSlowBodyIsCut(t *testing.T) {
	c := testenv.StartCloud(t, "", func(cfg *cloud.Config) {
		cfg.HTTP = cloud.HTTPLimits{BodyGrace: time.Second, MinBodyRate: 1000}
	})
	t.Run("stalled", func(t *testing.T) {
		conn, host := dialTLS(t, c, c.IdentityURL)
		fmt.Fprintf(conn, "POST /v3/auth/tokens HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{", host)
		start := time.Now()
		conn.SetReadDeadline(start.Add(10 * time.Second))
		_, err := io.Copy(io.Discard, conn) // an answer, if any, then the close
		if took := time.Since(start); err != nil || took > 3*time.Second {
			t.Fatalf("connection still open or failed after %s (%v); want closed within the 1 s timeout and a margin", took, err)
		}
	})
	t.Run("slow but steady", func(t *testing.T) {
		conn, host := dialTLS(t, c, c.IdentityURL)
		body := `{"auth":{"identity":{"methods":["password"],"password":{"user":{"name":"demo","domain":{"id":"default"},"password":"demo-secret"}}}}}`
		body += strings.Repeat(" ", 3000-len(body))
		fmt.Fprintf(conn, "POST /v3/auth/tokens HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", host, len(body))
		// 3000 bytes in 2 s: twice the grace, above the minimum rate.
		for i := 0; i < len(body); i += 300 {
			if _, err := io.WriteString(conn, body[i:i+300]); err != nil {
				t.Fatal(err)
			}
			time.Sleep(200 * time.Millisecond)
		}
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("status %d, want 201", resp.StatusCode)
		}
	})
}

// TestConnLimitPerIP: connections from one address beyond the limit are
// closed at once; one that closes frees its slot.
func TestConnLimitPerIP(t *testing.T) {
	c := testenv.StartCloud(t, "", func(cfg *cloud.Config) {
		cfg.NoLocalAgent = true // its connections would count too
		cfg.HTTP = cloud.HTTPLimits{MaxConnsPerIP: 4}
	})
	u, _ := url.Parse(c.IdentityURL)
	pem, err := os.ReadFile(c.CACertFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	var held []net.Conn
	for range 4 {
		conn, err := net.DialTimeout("tcp", u.Host, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		// A connection takes its slot on its first use: the handshake
		// makes sure the server has counted it before the fifth comes.
		tc := tls.Client(conn, &tls.Config{RootCAs: pool, ServerName: u.Hostname()})
		tc.SetDeadline(time.Now().Add(5 * time.Second))
		if err := tc.Handshake(); err != nil {
			t.Fatalf("connection %d: %v", len(held)+1, err)
		}
		held = append(held, tc)
	}
	// The other listeners share the limit.
	cu, _ := url.Parse(c.ComputeURL)
	extra, err := net.DialTimeout("tcp", cu.Host, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	extra.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := extra.Read(make([]byte, 1)); err != io.EOF && !isReset(err) {
		t.Fatalf("fifth connection: read gave %v, want it closed by the server", err)
	}
	held[0].Close()
	client := testenv.HTTPClient(t, c)
	var resp *http.Response
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if resp, err = client.Get(c.IdentityURL); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a connection closed, a new one still fails: %v", err)
		}
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v3: %d", resp.StatusCode)
	}
}

func isReset(err error) bool {
	return err != nil && strings.Contains(err.Error(), "connection reset")
}
