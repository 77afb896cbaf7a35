package cloud_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/cloud"
	"nimbus/internal/identity"
	"nimbus/internal/testenv"
	"nimbus/internal/testenv/syncbuf"
)

// TestTrustedProxies: the per-address login limit and the request log see
// the client a trusted proxy names (X-Forwarded-For, or a PROXY header
// before TLS as HAProxy in TCP mode sends it), and a spoofed
// X-Forwarded-For from a client that is no trusted proxy changes nothing.
func TestTrustedProxies(t *testing.T) {
	for _, trusted := range []bool{false, true} {
		t.Run(fmt.Sprintf("trusted=%v", trusted), func(t *testing.T) {
			var log syncbuf.Buffer
			c := testenv.StartCloud(t, "", func(cfg *cloud.Config) {
				cfg.NoLocalAgent = true
				cfg.Identity = identity.Limits{LoginFailuresPerAddress: 2, LoginFailureWindow: time.Minute}
				cfg.Log = slog.New(slog.NewJSONHandler(&log, nil))
				if trusted {
					cfg.TrustedProxies, _ = api.ParseProxies([]string{"127.0.0.1/32"})
				}
			})
			pool := x509.NewCertPool()
			pool.AppendCertsFromPEM(mustRead(t, c.CACertFile))
			// login asks for a token, over conn when given (else a new
			// TLS connection), naming xff in X-Forwarded-For.
			login := func(conn func() (net.Conn, error), xff, password string) int {
				t.Helper()
				hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
					TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: true}}
				if conn != nil {
					hc.Transport.(*http.Transport).DialTLSContext = func(context.Context, string, string) (net.Conn, error) {
						raw, err := conn()
						if err != nil {
							return nil, err
						}
						tc := tls.Client(raw, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
						return tc, tc.Handshake()
					}
				}
				body := fmt.Sprintf(`{"auth":{"identity":{"methods":["password"],"password":{"user":{"name":%q,"domain":{"id":"default"},"password":%q}}}}}`,
					cloud.DemoUser, password)
				req, _ := http.NewRequest("POST", c.IdentityURL+"/auth/tokens", strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				if xff != "" {
					req.Header.Set("X-Forwarded-For", xff)
				}
				resp, err := hc.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				return resp.StatusCode
			}
			bad, good := "wrong-password", c.Secrets.DemoPassword
			for i := range 2 {
				if got := login(nil, "198.51.100.1", bad); got != http.StatusUnauthorized {
					t.Fatalf("bad login %d: %d", i, got)
				}
			}
			// Another client behind the proxy: its own count when the proxy
			// is trusted; the same address (the proxy's) when it is not.
			want := http.StatusTooManyRequests
			if trusted {
				want = http.StatusUnauthorized
			}
			if got := login(nil, "198.51.100.2", bad); got != want {
				t.Errorf("a bad login naming another client: %d, want %d", got, want)
			}
			if got := login(nil, "198.51.100.1", good); got != http.StatusTooManyRequests {
				t.Errorf("the limited client's next login: %d, want 429", got)
			}
			// A PROXY header before the TLS handshake, as HAProxy's
			// send-proxy writes it.
			u, _ := url.Parse(c.IdentityURL)
			viaProxy := func() (net.Conn, error) {
				raw, err := net.Dial("tcp", u.Host)
				if err == nil {
					_, err = raw.Write([]byte("PROXY TCP4 198.51.100.3 127.0.0.1 40000 5000\r\n"))
				}
				return raw, err
			}
			if trusted {
				if got := login(viaProxy, "", good); got != http.StatusCreated {
					t.Errorf("a login through the PROXY header: %d, want 201", got)
				}
			}
			clients := []string{"198.51.100.2"}
			if trusted {
				clients = append(clients, "198.51.100.3")
			}
			// A request's log line is written once its answer is sent: wait
			// for every login's line before reading.
			logins := 4
			if trusted {
				logins++
			}
			testenv.Eventually(t, 5*time.Second, "every login logged", func() bool {
				return strings.Count(log.String(), `"path":"/v3/auth/tokens"`) >= logins
			})
			logged := log.String()
			for _, client := range clients {
				if strings.Contains(logged, `"client":"`+client+`"`) != trusted {
					t.Errorf("the request log names %s: %v, want %v", client, !trusted, trusted)
				}
			}
		})
	}
}
