package identity_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/cloud"
	"nimbus/internal/identity"
	"nimbus/internal/store"
	"nimbus/internal/testenv"
)

// apiStatus is the HTTP status an in-process call's error would answer.
func apiStatus(err error) int {
	if err == nil {
		return http.StatusOK
	}
	return api.AsError(err).Status
}

func mustHash(t testing.TB, pw string) string {
	t.Helper()
	h, err := identity.HashPassword(pw)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// count runs a COUNT(*) query on the cloud's database.
func count(t testing.TB, c *cloud.Cloud, q string, args ...any) int {
	t.Helper()
	var n int
	if err := c.DB.QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

// leftovers counts what a registration of email with project p would have
// made: the user, the project, role assignments, the billing account and
// the private network.
func leftovers(t testing.TB, c *cloud.Cloud, email, projectName string) int {
	t.Helper()
	return count(t, c, "SELECT COUNT(*) FROM users WHERE name = ?", email) +
		count(t, c, "SELECT COUNT(*) FROM projects WHERE name = ?", projectName) +
		count(t, c, `SELECT COUNT(*) FROM role_assignments WHERE user_id NOT IN (SELECT id FROM users)
			OR project_id NOT IN (SELECT id FROM projects)`) +
		count(t, c, "SELECT COUNT(*) FROM billing_accounts WHERE project_id NOT IN (SELECT id FROM projects)") +
		count(t, c, "SELECT COUNT(*) FROM networks WHERE project_id NOT IN (SELECT id FROM projects) AND project_id <> ''")
}

type failingHook struct{}

func (failingHook) ProjectCreated(context.Context, *store.Tx, string) error {
	return errors.New("hook failed")
}

// TestRegister: one call makes the project, the user (named by the
// lower-cased e-mail), the member role, the private network and the
// billing account; a taken e-mail or project name is a 409; a failing hook
// leaves nothing behind.
func TestRegister(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		ctx := context.Background()
		hash := mustHash(t, "s3cret-pass")

		reg, err := e.c.Identity.Register(ctx, identity.Registration{Email: " Ann.Lee+x@Example.COM", PasswordHash: hash})
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(reg.ProjectName, "ann.leex-") || len(reg.ProjectName) != len("ann.leex-")+6 {
			t.Errorf("derived project name %q, want ann.leex-<6 hex>", reg.ProjectName)
		}
		u := e.must(t, http.StatusOK, "GET", "/users/"+reg.UserID, e.admin, "")
		for k, want := range map[string]any{"name": "ann.lee+x@example.com", "email": "ann.lee+x@example.com",
			"default_project_id": reg.ProjectID, "enabled": true} {
			if got := get(u, "user", k); got != want {
				t.Errorf("user %s = %v, want %v", k, got, want)
			}
		}
		roles := e.must(t, http.StatusOK, "GET", "/projects/"+reg.ProjectID+"/users/"+reg.UserID+"/roles", e.admin, "")
		if rs := get(roles, "roles").([]any); len(rs) != 1 || str(rs[0], "name") != "member" {
			t.Errorf("roles on the new project = %v, want member", rs)
		}
		if n := count(t, e.c, "SELECT COUNT(*) FROM billing_accounts WHERE project_id = ? AND credit_limit = ?",
			reg.ProjectID, int64(1<<40)); n != 1 {
			t.Errorf("billing accounts with the default limit = %d, want 1", n)
		}
		if n := count(t, e.c, "SELECT COUNT(*) FROM networks WHERE project_id = ? AND name = 'private'", reg.ProjectID); n != 1 {
			t.Errorf("private networks = %d, want 1", n)
		}

		for _, tc := range []struct {
			name string
			reg  identity.Registration
			want int
		}{
			{"same e-mail in other case", identity.Registration{Email: "ANN.LEE+x@example.com", PasswordHash: hash}, 409},
			{"taken project name", identity.Registration{Email: "bob@example.com", PasswordHash: hash, ProjectName: "demo"}, 409},
			{"no e-mail", identity.Registration{Email: "", PasswordHash: hash}, 400},
			{"not an e-mail", identity.Registration{Email: "bob.example.com", PasswordHash: hash}, 400},
			{"a NUL in the e-mail", identity.Registration{Email: "bob\x00@example.com", PasswordHash: hash}, 400},
			{"a comment in the e-mail", identity.Registration{Email: "(x)bob@example.com", PasswordHash: hash}, 400},
			{"a password, not a hash", identity.Registration{Email: "bob@example.com", PasswordHash: "s3cret-pass"}, 400},
			{"project name too long", identity.Registration{Email: "bob@example.com", PasswordHash: hash,
				ProjectName: strings.Repeat("p", 65)}, 400},
		} {
			t.Run(tc.name, func(t *testing.T) {
				_, err := e.c.Identity.Register(ctx, tc.reg)
				if apiStatus(err) != tc.want {
					t.Fatalf("Register = %v, want %d", err, tc.want)
				}
			})
		}

		// A named project that is free is used as given.
		reg2, err := e.c.Identity.Register(ctx, identity.Registration{Email: "carol@example.com", PasswordHash: hash, ProjectName: "carol-co"})
		if err != nil || reg2.ProjectName != "carol-co" {
			t.Fatalf("Register with a project name = %+v, %v", reg2, err)
		}

		t.Run("a failing hook leaves nothing", func(t *testing.T) {
			before := leftovers(t, e.c, "dave@example.com", "dave-co")
			e.c.Identity.AddProjectHook(failingHook{})
			_, err := e.c.Identity.Register(ctx, identity.Registration{Email: "dave@example.com", PasswordHash: hash, ProjectName: "dave-co"})
			if err == nil || !strings.Contains(err.Error(), "hook failed") {
				t.Fatalf("Register with a failing hook = %v", err)
			}
			if after := leftovers(t, e.c, "dave@example.com", "dave-co"); after != before || after != 0 {
				t.Errorf("rows left by a failed registration: %d (before %d)", after, before)
			}
			if _, err := e.c.Identity.UserByName(ctx, "dave@example.com"); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("UserByName after a failed registration = %v, want not found", err)
			}
		})
	})
}

// TestProjectHooksOnAPI: a project made through Keystone's API gets its
// billing account and network in the same transaction.
func TestProjectHooksOnAPI(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		m := e.must(t, http.StatusCreated, "POST", "/projects", e.admin, `{"project":{"name":"acme"}}`)
		id := str(m, "project", "id")
		if n := count(t, e.c, "SELECT COUNT(*) FROM billing_accounts WHERE project_id = ?", id); n != 1 {
			t.Errorf("billing accounts for a new project = %d, want 1", n)
		}
		if n := count(t, e.c, "SELECT COUNT(*) FROM networks WHERE project_id = ?", id); n != 1 {
			t.Errorf("networks for a new project = %d, want 1", n)
		}
	})
}

// TestLogin: the panel's login scopes to the default project, counts
// failures per address like the API and issues a token the APIs accept.
func TestLogin(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL, withLimits(identity.Limits{LoginFailuresPerAddress: 3, LoginFailureWindow: time.Minute}))
		ctx := context.Background()
		reg, err := e.c.Identity.Register(ctx, identity.Registration{Email: "erin@example.com", PasswordHash: mustHash(t, "erin-pass")})
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			user, pw, project string
			admin             bool
		}{
			{"Erin@Example.com", "erin-pass", reg.ProjectName, false},
			{"admin", "admin-secret", "admin", true},
			{"demo", "demo-secret", "demo", false},
		} {
			s, err := e.c.Identity.Login(ctx, "192.0.2.1", tc.user, tc.pw)
			if err != nil {
				t.Fatalf("Login %s: %v", tc.user, err)
			}
			if s.ProjectName != tc.project || s.Admin != tc.admin || s.Token == "" || !s.Expires.After(time.Now()) {
				t.Errorf("Login %s = %+v, want project %s admin %v", tc.user, s, tc.project, tc.admin)
			}
			m := e.must(t, http.StatusOK, "GET", "/auth/tokens", s.Token, "", "X-Subject-Token", s.Token)
			if str(m, "token", "project", "id") != s.ProjectID || str(m, "token", "user", "id") != s.UserID {
				t.Errorf("token of %s scoped to %v", tc.user, get(m, "token", "project"))
			}
		}
		s, _ := e.c.Identity.Login(ctx, "192.0.2.1", "erin@example.com", "erin-pass")
		if len(s.Roles) != 1 || s.Roles[0] != "member" || s.UserName != "erin@example.com" {
			t.Errorf("session %+v, want member erin@example.com", s)
		}

		// Failures from one address: 401 each, then 429 even for the right
		// password; another address is not affected.
		for _, tc := range []struct{ user, pw string }{{"erin@example.com", "wrong"}, {"nobody@example.com", "x"}, {"demo", "wrong"}} {
			if _, err := e.c.Identity.Login(ctx, "198.51.100.9", tc.user, tc.pw); apiStatus(err) != 401 {
				t.Fatalf("Login %s with a wrong password = %v, want 401", tc.user, err)
			}
		}
		if _, err := e.c.Identity.Login(ctx, "198.51.100.9", "erin@example.com", "erin-pass"); apiStatus(err) != 429 {
			t.Fatalf("Login after 3 failures = %v, want 429", err)
		}
		if _, err := e.c.Identity.Login(ctx, "192.0.2.1", "erin@example.com", "erin-pass"); err != nil {
			t.Fatalf("Login from another address = %v", err)
		}
	})
}

// TestSetPassword: a reset stores the new password, revokes the user's
// tokens and lifts a lockout.
func TestSetPassword(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL, withLimits(identity.Limits{LockoutFailureAttempts: 2, LockoutDuration: time.Hour}))
		ctx := context.Background()
		u, err := e.c.Identity.UserByName(ctx, "demo")
		if err != nil {
			t.Fatal(err)
		}
		old, err := e.c.Identity.Login(ctx, "", "demo", "demo-secret")
		if err != nil {
			t.Fatal(err)
		}
		for range 2 {
			e.c.Identity.Login(ctx, "", "demo", "wrong")
		}
		if _, err := e.c.Identity.Login(ctx, "", "demo", "demo-secret"); apiStatus(err) != 401 {
			t.Fatalf("Login of a locked user = %v, want 401", err)
		}
		if err := e.c.Identity.SetPassword(ctx, u.ID, "new-demo-pass"); err != nil {
			t.Fatal(err)
		}
		e.must(t, http.StatusUnauthorized, "GET", "/auth/tokens", old.Token, "", "X-Subject-Token", old.Token)
		if _, err := e.c.Identity.Login(ctx, "", "demo", "demo-secret"); apiStatus(err) != 401 {
			t.Errorf("Login with the old password = %v, want 401", err)
		}
		if _, err := e.c.Identity.Login(ctx, "", "demo", "new-demo-pass"); err != nil {
			t.Errorf("Login with the new password after a lockout = %v", err)
		}
		if err := e.c.Identity.SetPassword(ctx, "no-such-user", "x"); apiStatus(err) != 404 {
			t.Errorf("SetPassword of an unknown user = %v, want 404", err)
		}
		if err := e.c.Identity.SetPassword(ctx, u.ID, strings.Repeat("x", 4097)); apiStatus(err) != 403 {
			t.Errorf("SetPassword too long = %v, want 403", err)
		}
	})
}

func TestHashPassword(t *testing.T) {
	h, err := identity.HashPassword("pw")
	if err != nil || !identity.CheckPassword(h, "pw") || identity.CheckPassword(h, "other") {
		t.Fatalf("HashPassword = %q, %v", h, err)
	}
	if _, err := identity.HashPassword(strings.Repeat("x", 4097)); err == nil {
		t.Fatal("HashPassword of a 4097-byte password succeeded")
	}
}
