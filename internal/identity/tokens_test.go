package identity_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"nimbus/internal/cloud"
	"nimbus/internal/testenv"
)

const unauthorized = "The request you have made requires authentication."

// TestTokenIssue covers POST /v3/auth/tokens: the ways to name a user and
// a project, unscoped tokens, ?nocatalog and the failures.
func TestTokenIssue(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		ctx := t.Context()
		dp, err := e.c.Identity.ProjectByName(ctx, cloud.DemoProject)
		if err != nil {
			t.Fatal(err)
		}
		demoProject := dp.ID
		// The demo user's id, from a token body.
		_, m := e.issue(t, passwordAuth("demo", "demo-secret", ""))
		demoUserID := str(m, "token", "user", "id")
		if demoUserID == "" {
			t.Fatalf("no user id in %v", m)
		}

		pw := func(user string) string {
			return `"methods":["password"],"password":{"user":{` + user + `}}`
		}
		tests := []struct {
			name    string
			query   string
			body    string
			status  int
			project string // expected project id ("" for unscoped)
			catalog bool
			message string
		}{
			{name: "user name and domain name, project name and domain name",
				body:   `{"auth":{"identity":{` + pw(`"name":"demo","domain":{"name":"Default"},"password":"demo-secret"`) + `},"scope":{"project":{"name":"demo","domain":{"name":"Default"}}}}}`,
				status: 201, project: demoProject, catalog: true},
			{name: "user id, project id",
				body:   `{"auth":{"identity":{` + pw(`"id":"`+demoUserID+`","password":"demo-secret"`) + `},"scope":{"project":{"id":"` + demoProject + `"}}}}`,
				status: 201, project: demoProject, catalog: true},
			{name: "project name with domain id", query: "?nocatalog",
				body:   `{"auth":{"identity":{` + pw(`"name":"demo","domain":{"id":"default"},"password":"demo-secret"`) + `},"scope":{"project":{"name":"demo","domain":{"id":"default"}}}}}`,
				status: 201, project: demoProject, catalog: false},
			{name: "no scope falls back to the default project",
				body:   `{"auth":{"identity":{` + pw(`"name":"demo","domain":{"id":"default"},"password":"demo-secret"`) + `}}}`,
				status: 201, project: demoProject, catalog: true},
			{name: "bad password",
				body:   `{"auth":{"identity":{` + pw(`"name":"demo","domain":{"id":"default"},"password":"wrong"`) + `}}}`,
				status: 401, message: unauthorized},
			{name: "unknown user",
				body:   `{"auth":{"identity":{` + pw(`"name":"nobody","domain":{"id":"default"},"password":"x"`) + `}}}`,
				status: 401, message: unauthorized},
			{name: "unknown domain",
				body:   `{"auth":{"identity":{` + pw(`"name":"demo","domain":{"name":"Nope"},"password":"demo-secret"`) + `}}}`,
				status: 401, message: unauthorized},
			{name: "project without a role",
				body:   `{"auth":{"identity":{` + pw(`"name":"demo","domain":{"id":"default"},"password":"demo-secret"`) + `},"scope":{"project":{"name":"admin","domain":{"id":"default"}}}}}`,
				status: 401, message: unauthorized},
			{name: "unknown project",
				body:   `{"auth":{"identity":{` + pw(`"name":"demo","domain":{"id":"default"},"password":"demo-secret"`) + `},"scope":{"project":{"id":"nope"}}}}`,
				status: 401, message: unauthorized},
			{name: "no methods", body: `{"auth":{"identity":{}}}`, status: 400},
			{name: "malformed JSON", body: `{"auth":`, status: 400},
			{name: "user without name or id", body: `{"auth":{"identity":{` + pw(`"password":"x"`) + `}}}`, status: 400},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				resp, m, raw := e.do(t, "POST", "/auth/tokens"+tc.query, "", tc.body)
				testenv.MustStatus(t, resp, raw, tc.status)
				if tc.status != 201 {
					keystoneError(t, m, tc.status, tc.message)
					if tc.status == 401 {
						want := `Keystone uri="` + e.url + `"`
						if got := resp.Header.Get("WWW-Authenticate"); got != want {
							t.Errorf("WWW-Authenticate = %q, want %q", got, want)
						}
					}
					return
				}
				if resp.Header.Get("X-Subject-Token") == "" {
					t.Error("no X-Subject-Token")
				}
				if got := str(m, "token", "project", "id"); got != tc.project {
					t.Errorf("project = %q, want %q", got, tc.project)
				}
				if _, has := get(m, "token").(map[string]any)["catalog"]; has != tc.catalog {
					t.Errorf("catalog present = %v, want %v", has, tc.catalog)
				}
				if roles, _ := get(m, "token", "roles").([]any); len(roles) == 0 {
					t.Error("project-scoped token without roles")
				}
				for _, f := range []string{"expires_at", "issued_at"} {
					if v := str(m, "token", f); !strings.HasSuffix(v, ".000000Z") {
						t.Errorf("%s = %q, want Keystone's .000000Z form", f, v)
					}
				}
			})
		}

		t.Run("unscoped", func(t *testing.T) {
			// A user without a default project gets an unscoped token when
			// it asks for no scope: no project, roles or catalog.
			e.must(t, 201, "POST", "/users", e.admin, `{"user":{"name":"loner","password":"loner-pw"}}`)
			tok, m := e.issue(t, passwordAuth("loner", "loner-pw", ""))
			tk := get(m, "token").(map[string]any)
			for _, f := range []string{"project", "roles", "catalog"} {
				if _, has := tk[f]; has {
					t.Errorf("unscoped token has %q: %v", f, tk)
				}
			}
			if str(m, "token", "user", "name") != "loner" || str(m, "token", "user", "domain", "id") != "default" {
				t.Errorf("user = %v", get(m, "token", "user"))
			}
			// Without a role it cannot be re-scoped to a project.
			resp, body, raw := e.do(t, "POST", "/auth/tokens", "", `{"auth":{"identity":{"methods":["token"],"token":{"id":"`+tok+`"}},"scope":{"project":{"id":"`+demoProject+`"}}}}`)
			testenv.MustStatus(t, resp, raw, 401)
			keystoneError(t, body, 401, unauthorized)
		})

		t.Run("rescope keeps audit id and expiry", func(t *testing.T) {
			tok, m := e.issue(t, passwordAuth("admin", "admin-secret", ""))
			p, _ := e.c.Identity.ProjectByName(ctx, cloud.AdminProject)
			_, m2 := e.issue(t, `{"auth":{"identity":{"methods":["token"],"token":{"id":"`+tok+`"}},"scope":{"project":{"id":"`+p.ID+`"}}}}`)
			a1, _ := get(m, "token", "audit_ids").([]any)
			a2, _ := get(m2, "token", "audit_ids").([]any)
			if len(a1) == 0 || len(a2) == 0 || a1[0] != a2[0] {
				t.Errorf("audit ids %v then %v, want the same", a1, a2)
			}
			if str(m, "token", "expires_at") != str(m2, "token", "expires_at") {
				t.Errorf("expiry %s then %s, want the same", str(m, "token", "expires_at"), str(m2, "token", "expires_at"))
			}
			// Keystone adds the new method to the original token's.
			if methods, _ := get(m2, "token", "methods").([]any); len(methods) != 2 || methods[0] != "token" || methods[1] != "password" {
				t.Errorf("methods = %v, want [token password]", methods)
			}
			// A bogus token cannot be re-scoped.
			resp, body, raw := e.do(t, "POST", "/auth/tokens", "", `{"auth":{"identity":{"methods":["token"],"token":{"id":"bogus"}}}}`)
			testenv.MustStatus(t, resp, raw, 401)
			keystoneError(t, body, 401, unauthorized)
		})
	})
}

// TestTokenValidateRevoke covers GET, HEAD and DELETE /v3/auth/tokens.
func TestTokenValidateRevoke(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		subject, _ := e.issue(t, passwordAuth("demo", "demo-secret", ""))

		m := e.must(t, 200, "GET", "/auth/tokens", e.demo, "", "X-Subject-Token", subject)
		if str(m, "token", "user", "name") != "demo" || get(m, "token", "catalog") == nil {
			t.Errorf("validate body = %v", m)
		}
		m = e.must(t, 200, "GET", "/auth/tokens?nocatalog", e.demo, "", "X-Subject-Token", subject)
		if _, has := get(m, "token").(map[string]any)["catalog"]; has {
			t.Error("nocatalog validation has a catalog")
		}
		resp, _, _ := e.do(t, "HEAD", "/auth/tokens", e.demo, "", "X-Subject-Token", subject)
		if resp.StatusCode != 200 || resp.Header.Get("X-Subject-Token") != subject {
			t.Errorf("HEAD: %d %v", resp.StatusCode, resp.Header)
		}
		// Another user's token needs admin to check.
		resp, m, raw := e.do(t, "GET", "/auth/tokens", e.demo, "", "X-Subject-Token", e.admin)
		testenv.MustStatus(t, resp, raw, 403)
		keystoneError(t, m, 403, "")
		e.must(t, 200, "GET", "/auth/tokens", e.admin, "", "X-Subject-Token", subject)

		// Unknown subject: 404 in Keystone's shape.
		resp, m, raw = e.do(t, "GET", "/auth/tokens", e.admin, "", "X-Subject-Token", "nonexistent-token")
		testenv.MustStatus(t, resp, raw, 404)
		keystoneError(t, m, 404, "Could not recognize Fernet token")

		// No token, or a bad one: 401 with WWW-Authenticate.
		for _, tok := range []string{"", "garbage"} {
			resp, m, raw = e.do(t, "GET", "/auth/tokens", tok, "", "X-Subject-Token", subject)
			testenv.MustStatus(t, resp, raw, 401)
			keystoneError(t, m, 401, unauthorized)
			if resp.Header.Get("WWW-Authenticate") != `Keystone uri="`+e.url+`"` {
				t.Errorf("WWW-Authenticate = %q", resp.Header.Get("WWW-Authenticate"))
			}
		}

		// Revoke, then the subject is gone and cannot authenticate.
		e.must(t, 204, "DELETE", "/auth/tokens", e.demo, "", "X-Subject-Token", subject)
		resp, m, raw = e.do(t, "GET", "/auth/tokens", e.demo, "", "X-Subject-Token", subject)
		testenv.MustStatus(t, resp, raw, 404)
		keystoneError(t, m, 404, "")
		resp, _, raw = e.do(t, "HEAD", "/auth/tokens", e.demo, "", "X-Subject-Token", subject)
		testenv.MustStatus(t, resp, raw, 404)
		resp, _, raw = e.do(t, "GET", "/auth/catalog", subject, "")
		testenv.MustStatus(t, resp, raw, 401)
		resp, _, raw = e.do(t, "DELETE", "/auth/tokens", e.demo, "", "X-Subject-Token", subject)
		testenv.MustStatus(t, resp, raw, 404)
	})
}

// TestTokenExpiry starts a cloud whose tokens live two seconds.
func TestTokenExpiry(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		const ttl = 2 * time.Second
		e := newEnv(t, dbURL, func(c *cloud.Config) { c.TokenTTL = ttl })
		tok, m := e.issue(t, passwordAuth("demo", "demo-secret", ""))
		issued, _ := time.Parse(time.RFC3339, str(m, "token", "issued_at"))
		expires, _ := time.Parse(time.RFC3339, str(m, "token", "expires_at"))
		if d := expires.Sub(issued); d < ttl-time.Second || d > ttl+time.Second {
			t.Errorf("token lives %v, want about %v", d, ttl)
		}
		// Valid now (and cached by the service), invalid once expired.
		e.must(t, 200, "GET", "/auth/catalog", tok, "")
		// expires_at shows whole seconds; the stored expiry may be up to a
		// second later.
		time.Sleep(time.Until(expires) + 1200*time.Millisecond)
		resp, m, raw := e.do(t, "GET", "/auth/catalog", tok, "")
		testenv.MustStatus(t, resp, raw, http.StatusUnauthorized)
		keystoneError(t, m, 401, unauthorized)
		fresh, _ := e.issue(t, passwordAuth("demo", "demo-secret", ""))
		resp, _, raw = e.do(t, "GET", "/auth/tokens", fresh, "", "X-Subject-Token", tok)
		testenv.MustStatus(t, resp, raw, http.StatusNotFound)
	})
}
