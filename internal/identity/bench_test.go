package identity_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"nimbus/internal/cloud"
	"nimbus/internal/identity"
	"nimbus/internal/testenv"
)

// benchRequest sends one request and fails the benchmark on an unexpected
// status. The body is drained so that the connection is kept alive.
func benchRequest(b *testing.B, client *http.Client, req *http.Request, want int) {
	resp, err := client.Do(req)
	if err != nil {
		b.Error(err)
		return
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != want {
		b.Errorf("%s %s: status %d, want %d", req.Method, req.URL, resp.StatusCode, want)
	}
}

// BenchmarkTokenValidateHTTPS measures token validation over HTTPS with
// keep-alive, from parallel clients, on each engine:
//
//   - subject: GET /v3/auth/tokens?nocatalog, which checks the caller's
//     token (cached) and loads the subject token from the database, as
//     keystonemiddleware's validation call does;
//   - cached: GET /v3/auth/catalog, an authenticated request whose token is
//     found in the 15 s cache, the cost every API call pays.
func BenchmarkTokenValidateHTTPS(b *testing.B) {
	for _, eng := range testenv.Engines(b) {
		c := testenv.StartCloud(b, eng.URL)
		client := testenv.HTTPClient(b, c)
		client.Transport.(*http.Transport).MaxIdleConnsPerHost = 64
		tok := testenv.Token(b, c, cloud.DemoUser)
		for _, mode := range []struct {
			name, path string
		}{
			{"subject", "/auth/tokens?nocatalog"},
			{"cached", "/auth/catalog"},
		} {
			b.Run(eng.Name+"/"+mode.name, func(b *testing.B) {
				b.SetParallelism(4)
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						req, _ := http.NewRequest("GET", c.IdentityURL+mode.path, nil)
						req.Header.Set("X-Auth-Token", tok)
						req.Header.Set("X-Subject-Token", tok)
						benchRequest(b, client, req, http.StatusOK)
					}
				})
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "validations/s")
			})
		}
	}
}

// BenchmarkTokenIssue measures POST /v3/auth/tokens with a password and a
// project scope over HTTPS; the argon2id check dominates. "capped" keeps at
// most 10 live tokens per user, so that past the first ten every issue also
// revokes the oldest.
func BenchmarkTokenIssue(b *testing.B) {
	for _, eng := range testenv.Engines(b) {
		for _, mode := range []struct {
			name   string
			limits identity.Limits
		}{
			{"uncapped", identity.Limits{}},
			{"capped", identity.Limits{MaxTokensPerUser: 10}},
		} {
			benchTokenIssue(b, eng.Name+"/"+mode.name, eng.URL, mode.limits)
		}
	}
}

func benchTokenIssue(b *testing.B, name, dbURL string, limits identity.Limits) {
	c := testenv.StartCloud(b, dbURL, withLimits(limits))
	client := testenv.HTTPClient(b, c)
	body := `{"auth":{"identity":{"methods":["password"],"password":{"user":{"name":"demo","domain":{"id":"default"},"password":"` +
		c.Secrets.DemoPassword + `"}}},"scope":{"project":{"name":"demo","domain":{"id":"default"}}}}}`
	b.Run(name, func(b *testing.B) {
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				req, _ := http.NewRequest("POST", c.IdentityURL+"/auth/tokens", strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				benchRequest(b, client, req, http.StatusCreated)
			}
		})
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "issues/s")
	})
}
