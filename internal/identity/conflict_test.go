package identity_test

import (
	"net/http"
	"testing"

	"nimbus/internal/testenv"
)

// TestNameConflicts: creating or renaming a domain, project, user or role
// to a name already taken is Keystone's 409 naming the kind, the name and,
// for projects and users, the domain; the answer to a successful write is
// the entity.
func TestNameConflicts(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		const inDefault = " at domain ID default."
		tests := []struct {
			kind, path, taken, suffix string
		}{
			{"domain", "/domains", "Default", "."},
			{"project", "/projects", "demo", inDefault},
			{"user", "/users", "demo", inDefault},
			{"role", "/roles", "member", "."},
		}
		for _, tc := range tests {
			t.Run(tc.kind, func(t *testing.T) {
				want := "Conflict occurred attempting to store " + tc.kind + " - Duplicate entry found with name " + tc.taken + tc.suffix
				body := func(name string) string { return `{"` + tc.kind + `":{"name":"` + name + `"}}` }
				resp, m, raw := e.do(t, "POST", tc.path, e.admin, body(tc.taken))
				testenv.MustStatus(t, resp, raw, http.StatusConflict)
				keystoneError(t, m, 409, want)
				made := e.must(t, 201, "POST", tc.path, e.admin, body("fresh-"+tc.kind))
				if str(made, tc.kind, "name") != "fresh-"+tc.kind {
					t.Fatalf("create answered %v", made)
				}
				id := str(made, tc.kind, "id")
				resp, m, raw = e.do(t, "PATCH", tc.path+"/"+id, e.admin, body(tc.taken))
				testenv.MustStatus(t, resp, raw, http.StatusConflict)
				keystoneError(t, m, 409, want)
				renamed := e.must(t, 200, "PATCH", tc.path+"/"+id, e.admin, body("renamed-"+tc.kind))
				if str(renamed, tc.kind, "id") != id || str(renamed, tc.kind, "name") != "renamed-"+tc.kind {
					t.Errorf("update answered %v", renamed)
				}
			})
		}
	})
}
