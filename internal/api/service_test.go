package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

type tokenAuth map[string]*api.Caller

func (a tokenAuth) Validate(_ context.Context, tok string) (*api.Caller, error) {
	if c, ok := a[tok]; ok {
		return c, nil
	}
	return nil, api.Unauthorized()
}

func newServer(t *testing.T) *httptest.Server {
	auth := tokenAuth{
		"member": {UserID: "u1", ProjectID: "p1", Roles: []string{"member"}},
		"admin":  {UserID: "u2", ProjectID: "p2", Roles: []string{"admin", "member"}},
	}
	s := api.NewService("compute", api.RenderNova, auth)
	s.AuthURL = "https://id.example"
	s.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	type body struct {
		Name  string `json:"name"`
		Count int    `json:"count"`
	}
	s.Handle(
		api.Route{Pattern: "GET /{$}", Public: true, Handler: func(r *http.Request) (*api.Response, error) {
			return api.JSON(200, map[string]string{"ok": "yes"}), nil
		}},
		api.Route{Pattern: "GET /things/{id}", Handler: func(r *http.Request) (*api.Response, error) {
			switch r.PathValue("id") {
			case "missing":
				return nil, store.ErrNotFound
			case "boom":
				return nil, errors.New("boom") // an internal error
			case "dbdown":
				return nil, fmt.Errorf("listing: %w", store.ErrUnavailable)
			case "panic":
				panic("handler bug")
			}
			return api.JSON(200, map[string]string{"caller": api.CallerFrom(r.Context()).UserID}), nil
		}},
		api.Route{Pattern: "POST /things", MaxBody: 64, Handler: func(r *http.Request) (*api.Response, error) {
			var b body
			if err := api.DecodeJSON(r, &b); err != nil {
				return nil, err
			}
			return api.JSON(202, b), nil
		}},
		api.Route{Pattern: "DELETE /things/{id}", AdminOnly: true, Policy: "os_compute_api:things:delete",
			Handler: func(r *http.Request) (*api.Response, error) { return api.Empty(204), nil }},
	)
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return srv
}

func TestService(t *testing.T) {
	srv := newServer(t)
	tests := []struct {
		name, method, path, token, body string
		status                          int
		// wantBody is a substring the body must hold.
		wantBody string
	}{
		{"public route needs no token", "GET", "/", "", "", 200, `"ok":"yes"`},
		{"no token", "GET", "/things/a", "", "", 401, `"error":{"code":401`},
		{"bad token", "GET", "/things/a", "nope", "", 401, `requires authentication`},
		{"caller reaches handler", "GET", "/things/a", "member", "", 200, `"caller":"u1"`},
		{"store not found is 404", "GET", "/things/missing", "member", "", 404, `"itemNotFound":{"code":404`},
		{"internal error is 500 without details", "GET", "/things/boom", "member", "", 500, `"computeFault"`},
		{"panic is 500", "GET", "/things/panic", "member", "", 500, `"computeFault"`},
		{"database away is 503", "GET", "/things/dbdown", "member", "", 503, `"serviceUnavailable":{"code":503`},
		{"unknown path", "GET", "/nothing", "member", "", 404, `"itemNotFound"`},
		{"wrong method", "PUT", "/things/a", "member", "", 405, `"badMethod"`},
		{"malformed json", "POST", "/things", "member", `{"name":`, 400, `Malformed request body`},
		{"empty body", "POST", "/things", "member", ``, 400, `Malformed request body`},
		{"wrong type", "POST", "/things", "member", `{"count":"x"}`, 400, `count`},
		{"too large", "POST", "/things", "member", `{"name":"` + strings.Repeat("x", 100) + `"}`, 413, `"overLimit"`},
		{"good body", "POST", "/things", "member", `{"name":"a","count":2}`, 202, `"count":2`},
		{"admin only refuses member", "DELETE", "/things/a", "member", "", 403, `os_compute_api:things:delete`},
		{"admin only lets admin", "DELETE", "/things/a", "admin", "", 204, ``},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest(tt.method, srv.URL+tt.path, strings.NewReader(tt.body))
			if tt.token != "" {
				req.Header.Set("X-Auth-Token", tt.token)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tt.status {
				t.Fatalf("status %d, want %d; body %s", resp.StatusCode, tt.status, b)
			}
			if !strings.Contains(string(b), tt.wantBody) {
				t.Errorf("body %s lacks %s", b, tt.wantBody)
			}
			if len(b) > 0 && !json.Valid(b) {
				t.Errorf("body is not JSON: %s", b)
			}
			if !strings.HasPrefix(resp.Header.Get("X-Openstack-Request-Id"), "req-") {
				t.Errorf("no request id header")
			}
			if ra := resp.Header.Get("Retry-After"); (tt.status == 503) != (ra != "") {
				t.Errorf("status %d with Retry-After %q", tt.status, ra)
			}
			if tt.status == 401 && resp.Header.Get("WWW-Authenticate") != `Keystone uri="https://id.example"` {
				t.Errorf("WWW-Authenticate = %q", resp.Header.Get("WWW-Authenticate"))
			}
		})
	}
}

func TestUnknownFields(t *testing.T) {
	var obj map[string]json.RawMessage
	json.Unmarshal([]byte(`{"name":"a","bogus":1}`), &obj)
	err := api.UnknownFields(obj, "name")
	if err == nil || !strings.Contains(err.Error(), "'bogus' was unexpected") {
		t.Fatalf("UnknownFields = %v", err)
	}
	if err := api.UnknownFields(obj, "name", "bogus"); err != nil {
		t.Fatalf("allowed fields rejected: %v", err)
	}
}

func TestTextTheStoreCannotHold(t *testing.T) {
	srv := newServer(t)
	for _, tt := range []struct {
		name, method, path, body string
		status                   int
	}{
		{"NUL in path", "GET", "/things/a%00b", "", 404},
		{"NUL in query", "GET", "/things/a?x=%00", "", 400},
		{"invalid UTF-8 in query", "GET", "/things/a?x=%ff", "", 400},
		{"escaped NUL in body", "POST", "/things", `{"name":"a\u0000"}`, 400},
	} {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest(tt.method, srv.URL+tt.path, strings.NewReader(tt.body))
			req.Header.Set("X-Auth-Token", "member")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tt.status {
				t.Fatalf("status %d, want %d", resp.StatusCode, tt.status)
			}
		})
	}
}

// TestUnavailableShapes: a database that is away answers 503 with
// Retry-After in each service's own error body, whether the store
// classified the error or the driver's error came through as it was.
func TestUnavailableShapes(t *testing.T) {
	renderers := []struct {
		name   string
		render api.ErrorRenderer
		want   string
	}{
		{"nova and cinder", api.RenderNova, `{"serviceUnavailable":{"code":503,"message":`},
		{"keystone", api.RenderKeystone, `{"error":{"code":503,"message":`},
		{"neutron", api.RenderNeutron, `"type":"HTTPServiceUnavailable"`},
		{"glance", api.RenderGlance, `{"code":503,"message":`},
	}
	causes := []error{
		fmt.Errorf("compute: %w", store.ErrUnavailable),
		io.ErrUnexpectedEOF, // pgx's server gone mid-answer, through rows.Err
	}
	for _, r := range renderers {
		for _, cause := range causes {
			s := api.NewService(r.name, r.render, nil)
			s.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
			s.Handle(api.Route{Pattern: "GET /x", Public: true, Handler: func(*http.Request) (*api.Response, error) { return nil, cause }})
			w := httptest.NewRecorder()
			s.ServeHTTP(w, httptest.NewRequest("GET", "/x", nil))
			if w.Code != 503 || w.Header().Get("Retry-After") != "5" || !strings.Contains(w.Body.String(), r.want) {
				t.Errorf("%s, %v: %d Retry-After %q %s", r.name, cause, w.Code, w.Header().Get("Retry-After"), w.Body)
			}
			if strings.Contains(w.Body.String(), "EOF") {
				t.Errorf("%s: the cause leaks: %s", r.name, w.Body)
			}
		}
	}
}

// TestDeadline: a request whose handler waits on something that does not
// answer (a frozen database) answers 503 with Retry-After once the
// service's deadline passes, instead of holding on.
func TestDeadline(t *testing.T) {
	s := api.NewService("compute", api.RenderNova, nil)
	s.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	s.Deadline = 200 * time.Millisecond
	s.Handle(api.Route{Pattern: "GET /x", Public: true, Handler: func(r *http.Request) (*api.Response, error) {
		<-r.Context().Done()
		return nil, r.Context().Err()
	}})
	start := time.Now()
	w := httptest.NewRecorder()
	s.ServeHTTP(w, httptest.NewRequest("GET", "/x", nil))
	if took := time.Since(start); w.Code != 503 || w.Header().Get("Retry-After") == "" || took > 2*time.Second {
		t.Fatalf("after %s: %d %q %s", took, w.Code, w.Header().Get("Retry-After"), w.Body)
	}
}
