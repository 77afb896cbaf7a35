package identity_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
	ac "github.com/gophercloud/gophercloud/v2/openstack/identity/v3/applicationcredentials"

	"nimbus/internal/cloud"
	"nimbus/internal/testenv"
)

// identityV3 is gophercloud's identity client for pc.
func identityV3(t testing.TB, pc *gophercloud.ProviderClient) *gophercloud.ServiceClient {
	t.Helper()
	sc, err := openstack.NewIdentityV3(pc, gophercloud.EndpointOpts{Region: "RegionOne"})
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

// appCredProvider authenticates with gophercloud by application credential.
func appCredProvider(t testing.TB, c *cloud.Cloud, opts gophercloud.AuthOptions) (*gophercloud.ProviderClient, error) {
	t.Helper()
	pc, err := openstack.NewClient(c.IdentityURL)
	if err != nil {
		t.Fatal(err)
	}
	pc.HTTPClient = *testenv.HTTPClient(t, c)
	opts.IdentityEndpoint = c.IdentityURL
	return pc, openstack.Authenticate(context.Background(), pc, opts)
}

func appCredAuth(id, secret string) string {
	return `{"auth":{"identity":{"methods":["application_credential"],"application_credential":{"id":"` + id +
		`","secret":"` + secret + `"}}}}`
}

func httpStatus(err error) int {
	var e gophercloud.ErrUnexpectedResponseCode
	if errors.As(err, &e) {
		return e.Actual
	}
	return 0
}

func userID(t testing.TB, e *env, name string) string {
	t.Helper()
	u, err := e.c.Identity.UserByName(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	return u.ID
}

// TestApplicationCredentials covers Keystone's application credentials
// through gophercloud: create (secret shown once, stored hashed), list,
// get, authenticate by id and by name, the token body, and delete revoking
// the credential's tokens.
func TestApplicationCredentials(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		ctx := context.Background()
		demo := userID(t, e, "demo")
		sc := identityV3(t, testenv.Provider(t, e.c, cloud.DemoUser))

		cred, err := ac.Create(ctx, sc, demo, ac.CreateOpts{Name: "ci", Description: "for CI"}).Extract()
		if err != nil {
			t.Fatal(err)
		}
		demoProject, _ := e.c.Identity.ProjectByName(ctx, "demo")
		if len(cred.Secret) < 64 || cred.ProjectID != demoProject.ID || cred.Unrestricted || cred.Description != "for CI" ||
			len(cred.Roles) != 1 || cred.Roles[0].Name != "member" || !cred.ExpiresAt.IsZero() {
			t.Errorf("created %+v", cred)
		}
		var hash string
		if err := e.c.DB.QueryRow(ctx, "SELECT secret_hash FROM application_credentials WHERE id = ?", cred.ID).Scan(&hash); err != nil ||
			!strings.HasPrefix(hash, "$argon2id$") || strings.Contains(hash, cred.Secret) {
			t.Errorf("stored secret %q, %v: want an argon2id hash", hash, err)
		}

		pages, err := ac.List(sc, demo, ac.ListOpts{Name: "ci"}).AllPages(ctx)
		if err != nil {
			t.Fatal(err)
		}
		list, _ := ac.ExtractApplicationCredentials(pages)
		if len(list) != 1 || list[0].ID != cred.ID || list[0].Secret != "" {
			t.Errorf("list = %+v, want the one credential without its secret", list)
		}
		got, err := ac.Get(ctx, sc, demo, cred.ID).Extract()
		if err != nil || got.Name != "ci" || got.Secret != "" {
			t.Errorf("get = %+v, %v", got, err)
		}
		if _, err := ac.Create(ctx, sc, demo, ac.CreateOpts{Name: "ci"}).Extract(); httpStatus(err) != 409 {
			t.Errorf("a second credential named ci = %v, want 409", err)
		}

		// gophercloud authenticates by id, and by name with the user.
		for _, opts := range []gophercloud.AuthOptions{
			{ApplicationCredentialID: cred.ID, ApplicationCredentialSecret: cred.Secret},
			{ApplicationCredentialName: "ci", UserID: demo, ApplicationCredentialSecret: cred.Secret},
			{ApplicationCredentialName: "ci", Username: "demo", DomainName: "Default", ApplicationCredentialSecret: cred.Secret},
		} {
			pc, err := appCredProvider(t, e.c, opts)
			if err != nil {
				t.Fatalf("authenticate with %+v: %v", opts, err)
			}
			if _, err := ac.Get(ctx, identityV3(t, pc), demo, cred.ID).Extract(); err != nil {
				t.Errorf("get with the credential's token: %v", err)
			}
		}

		tok, m := e.issue(t, appCredAuth(cred.ID, cred.Secret))
		want := map[string]any{"id": cred.ID, "name": "ci", "restricted": true}
		for k, v := range want {
			if got := get(m, "token", "application_credential", k); got != v {
				t.Errorf("token application_credential.%s = %v, want %v", k, got, v)
			}
		}
		if ms := get(m, "token", "methods").([]any); len(ms) != 1 || ms[0] != "application_credential" {
			t.Errorf("token methods = %v", ms)
		}
		if str(m, "token", "project", "id") != demoProject.ID {
			t.Errorf("token project = %v", get(m, "token", "project"))
		}

		// Deleting the credential revokes its tokens and its secret.
		if err := ac.Delete(ctx, sc, demo, cred.ID).ExtractErr(); err != nil {
			t.Fatal(err)
		}
		e.must(t, http.StatusUnauthorized, "GET", "/auth/catalog", tok, "")
		e.must(t, http.StatusUnauthorized, "POST", "/auth/tokens", "", appCredAuth(cred.ID, cred.Secret))
		if _, err := ac.Get(ctx, sc, demo, cred.ID).Extract(); httpStatus(err) != 404 {
			t.Errorf("get of a deleted credential = %v, want 404", err)
		}
	})
}

// TestApplicationCredentialAuthRefusals: what Keystone refuses at
// POST /v3/auth/tokens with an application credential.
func TestApplicationCredentialAuthRefusals(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		demo := userID(t, e, "demo")
		m := e.must(t, http.StatusCreated, "POST", "/users/"+demo+"/application_credentials", e.demo,
			`{"application_credential":{"name":"a","secret":"known-secret"}}`)
		id := str(m, "application_credential", "id")
		if s := str(m, "application_credential", "secret"); s != "known-secret" {
			t.Errorf("secret = %q, want the one given", s)
		}
		for _, tc := range []struct {
			name, body string
			status     int
			message    string
		}{
			{"wrong secret", appCredAuth(id, "wrong"), 401, unauthorized},
			{"unknown id", appCredAuth("nope", "known-secret"), 401, unauthorized},
			{"a scope", `{"auth":{"identity":{"methods":["application_credential"],"application_credential":{"id":"` + id +
				`","secret":"known-secret"}},"scope":{"project":{"name":"demo","domain":{"id":"default"}}}}}`, 401,
				"Error authenticating with application credential: Application credentials cannot request a scope."},
			{"name without user", `{"auth":{"identity":{"methods":["application_credential"],"application_credential":{"name":"a","secret":"known-secret"}}}}`,
				400, ""},
			{"name of another user's", `{"auth":{"identity":{"methods":["application_credential"],"application_credential":{"name":"a",
				"user":{"name":"admin","domain":{"id":"default"}},"secret":"known-secret"}}}}`, 401, unauthorized},
			{"no secret", `{"auth":{"identity":{"methods":["application_credential"],"application_credential":{"id":"` + id + `"}}}}`, 400, ""},
		} {
			t.Run(tc.name, func(t *testing.T) {
				resp, m, raw := e.do(t, "POST", "/auth/tokens", "", tc.body)
				testenv.MustStatus(t, resp, raw, tc.status)
				keystoneError(t, m, tc.status, tc.message)
			})
		}

		// A token of the credential cannot be re-scoped to another project.
		tok, _ := e.issue(t, appCredAuth(id, "known-secret"))
		e.must(t, http.StatusUnauthorized, "POST", "/auth/tokens", "", `{"auth":{"identity":{"methods":["token"],"token":{"id":"`+
			tok+`"}},"scope":{"project":{"name":"admin","domain":{"id":"default"}}}}}`)
		_, m = e.issue(t, `{"auth":{"identity":{"methods":["token"],"token":{"id":"`+tok+`"}}}}`)
		if str(m, "token", "application_credential", "id") != id {
			t.Errorf("re-issued token lost its credential: %v", get(m, "token"))
		}
	})
}

// TestApplicationCredentialPolicy: only the user manages their own
// credentials; a credential holds only roles its creator's token has, and a
// restricted one cannot make or delete credentials.
func TestApplicationCredentialPolicy(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		demo, admin := userID(t, e, "demo"), userID(t, e, "admin")
		m := e.must(t, http.StatusCreated, "POST", "/users/"+admin+"/application_credentials", e.admin,
			`{"application_credential":{"name":"ops","roles":[{"name":"reader"}]}}`)
		adminCred := str(m, "application_credential", "id")
		m = e.must(t, http.StatusCreated, "POST", "/users/"+demo+"/application_credentials", e.demo,
			`{"application_credential":{"name":"restricted"}}`)
		demoCred, demoSecret := str(m, "application_credential", "id"), str(m, "application_credential", "secret")
		m = e.must(t, http.StatusCreated, "POST", "/users/"+demo+"/application_credentials", e.demo,
			`{"application_credential":{"name":"free","unrestricted":true}}`)
		freeTok, _ := e.issue(t, appCredAuth(str(m, "application_credential", "id"), str(m, "application_credential", "secret")))
		restrictedTok, _ := e.issue(t, appCredAuth(demoCred, demoSecret))

		restricted := "You are not authorized to perform the requested action: Using method 'application_credential' is not allowed for managing additional application credentials."
		for _, tc := range []struct {
			name, method, path, token, body string
			status                          int
			message                         string
		}{
			{"list another user's", "GET", "/users/" + admin + "/application_credentials", e.demo, "", 403,
				"You are not authorized to perform the requested action: identity:list_application_credentials."},
			{"get another user's", "GET", "/users/" + admin + "/application_credentials/" + adminCred, e.demo, "", 403, ""},
			{"delete another user's", "DELETE", "/users/" + admin + "/application_credentials/" + adminCred, e.demo, "", 403, ""},
			{"another user's under one's own path", "GET", "/users/" + demo + "/application_credentials/" + adminCred, e.demo, "", 404,
				"Could not find Application Credential: " + adminCred + "."},
			{"create for another user, even as admin", "POST", "/users/" + demo + "/application_credentials", e.admin,
				`{"application_credential":{"name":"x"}}`, 403, "You are not authorized to perform the requested action: identity:create_application_credential."},
			{"a role the token lacks", "POST", "/users/" + demo + "/application_credentials", e.demo,
				`{"application_credential":{"name":"x","roles":[{"name":"admin"}]}}`, 400,
				"Invalid application credential: Cannot create an application credential with unassigned role"},
			{"an unknown role", "POST", "/users/" + demo + "/application_credentials", e.demo,
				`{"application_credential":{"name":"x","roles":[{"id":"nope"}]}}`, 404, "Could not find role: nope."},
			{"an unknown attribute", "POST", "/users/" + demo + "/application_credentials", e.demo,
				`{"application_credential":{"name":"x","colour":"red"}}`, 400, ""},
			{"an expiry in the past", "POST", "/users/" + demo + "/application_credentials", e.demo,
				`{"application_credential":{"name":"x","expires_at":"2020-01-01T00:00:00"}}`, 400, ""},
			{"no name", "POST", "/users/" + demo + "/application_credentials", e.demo, `{"application_credential":{}}`, 400, ""},
			{"create with a restricted credential", "POST", "/users/" + demo + "/application_credentials", restrictedTok,
				`{"application_credential":{"name":"x"}}`, 403, restricted},
			{"delete with a restricted credential", "DELETE", "/users/" + demo + "/application_credentials/" + demoCred, restrictedTok,
				"", 403, restricted},
			{"create with an unrestricted credential", "POST", "/users/" + demo + "/application_credentials", freeTok,
				`{"application_credential":{"name":"child"}}`, 201, ""},
			{"admin lists another user's, as Keystone's system reader may", "GET", "/users/" + demo + "/application_credentials",
				e.admin, "", 200, ""},
		} {
			t.Run(tc.name, func(t *testing.T) {
				resp, m, raw := e.do(t, tc.method, tc.path, tc.token, tc.body)
				testenv.MustStatus(t, resp, raw, tc.status)
				if tc.status >= 400 {
					keystoneError(t, m, tc.status, tc.message)
				}
			})
		}

		// The admin's reader-only credential is not an admin.
		m = e.must(t, http.StatusOK, "GET", "/users/"+admin+"/application_credentials/"+adminCred, e.admin, "")
		if rs := get(m, "application_credential", "roles").([]any); len(rs) != 1 || str(rs[0], "name") != "reader" {
			t.Errorf("roles = %v, want reader", rs)
		}
		m = e.must(t, http.StatusCreated, "POST", "/users/"+admin+"/application_credentials", e.admin,
			`{"application_credential":{"name":"ops2","secret":"s","roles":[{"name":"reader"}]}}`)
		readerTok, body := e.issue(t, appCredAuth(str(m, "application_credential", "id"), "s"))
		if rs := get(body, "token", "roles").([]any); len(rs) != 1 || str(rs[0], "name") != "reader" {
			t.Errorf("token roles = %v, want reader only", rs)
		}
		e.must(t, http.StatusForbidden, "GET", "/users", readerTok, "")
	})
}

// TestApplicationCredentialLifetime: a credential's tokens end with it, and
// with its user.
func TestApplicationCredentialLifetime(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		demoProject, _ := e.c.Identity.ProjectByName(context.Background(), "demo")
		roles := e.must(t, http.StatusOK, "GET", "/roles?name=member", e.admin, "")
		memberID := str(get(roles, "roles").([]any)[0], "id")
		m := e.must(t, http.StatusCreated, "POST", "/users", e.admin, `{"user":{"name":"frank","password":"frank-pass"}}`)
		frank := str(m, "user", "id")
		e.must(t, http.StatusNoContent, "PUT", "/projects/"+demoProject.ID+"/users/"+frank+"/roles/"+memberID, e.admin, "")
		frankTok, _ := e.issue(t, passwordAuth("frank", "frank-pass", demoProject.ID))

		expires := time.Now().UTC().Add(2 * time.Second).Format("2006-01-02T15:04:05.000")
		m = e.must(t, http.StatusCreated, "POST", "/users/"+frank+"/application_credentials", frankTok,
			`{"application_credential":{"name":"short","secret":"s","expires_at":"`+expires+`"}}`)
		shortID := str(m, "application_credential", "id")
		m = e.must(t, http.StatusCreated, "POST", "/users/"+frank+"/application_credentials", frankTok,
			`{"application_credential":{"name":"long","secret":"s"}}`)
		longID := str(m, "application_credential", "id")
		shortTok, body := e.issue(t, appCredAuth(shortID, "s"))
		exp, _ := time.Parse("2006-01-02T15:04:05.000000Z", str(body, "token", "expires_at"))
		if exp.After(time.Now().Add(3 * time.Second)) {
			t.Errorf("token of a credential expiring in 2 s expires at %v", exp)
		}
		longTok, _ := e.issue(t, appCredAuth(longID, "s"))

		time.Sleep(2500 * time.Millisecond)
		e.must(t, http.StatusUnauthorized, "POST", "/auth/tokens", "", appCredAuth(shortID, "s"))
		e.must(t, http.StatusUnauthorized, "GET", "/auth/catalog", shortTok, "")

		e.must(t, http.StatusNoContent, "DELETE", "/users/"+frank, e.admin, "")
		e.must(t, http.StatusUnauthorized, "GET", "/auth/catalog", longTok, "")
		e.must(t, http.StatusUnauthorized, "POST", "/auth/tokens", "", appCredAuth(longID, "s"))
		var n int
		if err := e.c.DB.QueryRow(context.Background(), "SELECT COUNT(*) FROM application_credentials WHERE user_id = ?", frank).Scan(&n); err != nil || n != 0 {
			t.Errorf("credentials left of a deleted user: %d, %v", n, err)
		}
	})
}
