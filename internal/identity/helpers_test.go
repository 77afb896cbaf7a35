package identity_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"nimbus/internal/cloud"
	"nimbus/internal/testenv"
)

// env is one running cloud with an HTTPS client and the two bootstrap
// tokens.
type env struct {
	c      *cloud.Cloud
	client *http.Client
	admin  string // admin token, project admin
	demo   string // demo token, project demo
	url    string // identity URL ending /v3
}

func newEnv(t testing.TB, dbURL string, opts ...testenv.Options) *env {
	t.Helper()
	c := testenv.StartCloud(t, dbURL, opts...)
	return &env{
		c: c, client: testenv.HTTPClient(t, c), url: c.IdentityURL,
		admin: testenv.Token(t, c, cloud.AdminUser), demo: testenv.Token(t, c, cloud.DemoUser),
	}
}

// do sends a request to path (relative to /v3) and decodes a JSON answer
// into a generic map.
func (e *env) do(t testing.TB, method, path, token, body string, hdr ...string) (*http.Response, map[string]any, string) {
	t.Helper()
	resp, raw := testenv.Do(t, e.client, method, e.url+path, token, body, hdr...)
	var m map[string]any
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") && raw != "" {
		if err := json.Unmarshal([]byte(raw), &m); err != nil {
			t.Fatalf("%s %s: bad JSON %q: %v", method, path, raw, err)
		}
	}
	return resp, m, raw
}

// must is do plus a status check.
func (e *env) must(t testing.TB, want int, method, path, token, body string, hdr ...string) map[string]any {
	t.Helper()
	resp, m, raw := e.do(t, method, path, token, body, hdr...)
	testenv.MustStatus(t, resp, raw, want)
	return m
}

// issue authenticates with a raw POST /v3/auth/tokens body and returns the
// token id and body.
func (e *env) issue(t testing.TB, body string) (string, map[string]any) {
	t.Helper()
	resp, m, raw := e.do(t, "POST", "/auth/tokens", "", body)
	testenv.MustStatus(t, resp, raw, http.StatusCreated)
	tok := resp.Header.Get("X-Subject-Token")
	if tok == "" {
		t.Fatalf("no X-Subject-Token in %v", resp.Header)
	}
	return tok, m
}

func passwordAuth(user, password, projectID string) string {
	scope := ""
	if projectID != "" {
		scope = `,"scope":{"project":{"id":"` + projectID + `"}}`
	}
	return `{"auth":{"identity":{"methods":["password"],"password":{"user":{"name":"` + user +
		`","domain":{"id":"default"},"password":"` + password + `"}}}` + scope + `}}`
}

// get walks a decoded JSON document: get(m, "token", "project", "id").
func get(v any, path ...string) any {
	for _, p := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[p]
	}
	return v
}

func str(v any, path ...string) string {
	s, _ := get(v, path...).(string)
	return s
}

// keystoneError checks a Keystone error body.
func keystoneError(t testing.TB, m map[string]any, code int, message string) {
	t.Helper()
	if c, _ := get(m, "error", "code").(float64); int(c) != code {
		t.Errorf("error.code = %v, want %d (body %v)", get(m, "error", "code"), code, m)
	}
	if str(m, "error", "title") != http.StatusText(code) {
		t.Errorf("error.title = %q, want %q", str(m, "error", "title"), http.StatusText(code))
	}
	if message != "" && str(m, "error", "message") != message {
		t.Errorf("error.message = %q, want %q", str(m, "error", "message"), message)
	}
}
