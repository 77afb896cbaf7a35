package identity_test

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/endpoints"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/projects"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/roles"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/services"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/tokens"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/users"

	"nimbus/internal/cloud"
	"nimbus/internal/testenv"
)

func identityClient(t *testing.T, c *cloud.Cloud, user string) *gophercloud.ServiceClient {
	t.Helper()
	sc, err := openstack.NewIdentityV3(testenv.Provider(t, c, user), gophercloud.EndpointOpts{Region: "RegionOne"})
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

func wantStatus(t *testing.T, err error, status int) {
	t.Helper()
	if !gophercloud.ResponseCodeIs(err, status) {
		t.Fatalf("got error %v, want HTTP %d", err, status)
	}
}

// TestAdminCRUD drives projects, users, roles and assignments through
// gophercloud, as an operator's tooling would.
func TestAdminCRUD(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		ctx := context.Background()
		sc := identityClient(t, e.c, cloud.AdminUser)

		// Projects.
		enabled := true
		p, err := projects.Create(ctx, sc, projects.CreateOpts{Name: "acme", DomainID: "default",
			Description: "Acme Corp", Enabled: &enabled, Tags: []string{"gold"}}).Extract()
		if err != nil {
			t.Fatal(err)
		}
		if p.Name != "acme" || p.DomainID != "default" || !p.Enabled || p.Description != "Acme Corp" || !slices.Equal(p.Tags, []string{"gold"}) {
			t.Errorf("created project = %+v", p)
		}
		_, err = projects.Create(ctx, sc, projects.CreateOpts{Name: "acme"}).Extract()
		wantStatus(t, err, http.StatusConflict)
		got, err := projects.Get(ctx, sc, p.ID).Extract()
		if err != nil || got.ID != p.ID || got.ParentID != "default" {
			t.Fatalf("get project: %+v, %v", got, err)
		}
		pages, err := projects.List(sc, projects.ListOpts{Name: "acme"}).AllPages(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ps, _ := projects.ExtractProjects(pages)
		if len(ps) != 1 || ps[0].ID != p.ID {
			t.Errorf("list ?name=acme = %+v", ps)
		}
		pages, _ = projects.List(sc, projects.ListOpts{DomainID: "default"}).AllPages(ctx)
		if ps, _ = projects.ExtractProjects(pages); len(ps) != 3 {
			t.Errorf("list ?domain_id=default gave %d projects, want 3", len(ps))
		}
		desc := "Acme Corporation"
		upd, err := projects.Update(ctx, sc, p.ID, projects.UpdateOpts{Description: &desc}).Extract()
		if err != nil || upd.Description != desc || upd.Name != "acme" {
			t.Fatalf("update project: %+v, %v", upd, err)
		}

		// Users.
		u, err := users.Create(ctx, sc, users.CreateOpts{Name: "alice", DomainID: "default", Password: "alice-pw",
			Description: "Alice", Extra: map[string]any{"email": "alice@example.com"}}).Extract()
		if err != nil {
			t.Fatal(err)
		}
		if u.Name != "alice" || !u.Enabled || u.Description != "Alice" || u.Extra["email"] != "alice@example.com" {
			t.Errorf("created user = %+v", u)
		}
		_, err = users.Create(ctx, sc, users.CreateOpts{Name: "alice", DomainID: "default"}).Extract()
		wantStatus(t, err, http.StatusConflict)
		pages, err = users.List(sc, users.ListOpts{Name: "alice"}).AllPages(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if us, _ := users.ExtractUsers(pages); len(us) != 1 || us[0].ID != u.ID {
			t.Errorf("list ?name=alice = %+v", us)
		}
		pages, _ = users.List(sc, users.ListOpts{Enabled: new(false)}).AllPages(ctx)
		if us, _ := users.ExtractUsers(pages); len(us) != 0 {
			t.Errorf("list ?enabled=false = %+v", us)
		}

		// Roles.
		role, err := roles.Create(ctx, sc, roles.CreateOpts{Name: "auditor"}).Extract()
		if err != nil {
			t.Fatal(err)
		}
		_, err = roles.Create(ctx, sc, roles.CreateOpts{Name: "auditor"}).Extract()
		wantStatus(t, err, http.StatusConflict)
		pages, _ = roles.List(sc, roles.ListOpts{}).AllPages(ctx)
		rs, _ := roles.ExtractRoles(pages)
		var names []string
		for _, r := range rs {
			names = append(names, r.Name)
		}
		for _, want := range []string{"admin", "auditor", "member", "reader"} {
			if !slices.Contains(names, want) {
				t.Errorf("roles %v lack %q", names, want)
			}
		}
		member := ""
		for _, r := range rs {
			if r.Name == "member" {
				member = r.ID
			}
		}
		upr, err := roles.Update(ctx, sc, role.ID, roles.UpdateOpts{Name: "auditors"}).Extract()
		if err != nil || upr.Name != "auditors" {
			t.Fatalf("update role: %+v, %v", upr, err)
		}

		// Assignments.
		for _, id := range []string{member, role.ID} {
			if err := roles.Assign(ctx, sc, id, roles.AssignOpts{UserID: u.ID, ProjectID: p.ID}).ExtractErr(); err != nil {
				t.Fatalf("assign: %v", err)
			}
		}
		// Assigning twice is fine, as in Keystone.
		if err := roles.Assign(ctx, sc, member, roles.AssignOpts{UserID: u.ID, ProjectID: p.ID}).ExtractErr(); err != nil {
			t.Fatalf("assign again: %v", err)
		}
		if err := roles.Validate(ctx, sc, member, roles.ValidateOpts{UserID: u.ID, ProjectID: p.ID}).ExtractErr(); err != nil {
			t.Errorf("validate assignment: %v", err)
		}
		err = roles.Assign(ctx, sc, "no-such-role", roles.AssignOpts{UserID: u.ID, ProjectID: p.ID}).ExtractErr()
		wantStatus(t, err, http.StatusNotFound)

		include := true
		pages, err = roles.ListAssignments(sc, roles.ListAssignmentsOpts{UserID: u.ID, IncludeNames: &include}).AllPages(ctx)
		if err != nil {
			t.Fatal(err)
		}
		as, _ := roles.ExtractRoleAssignments(pages)
		if len(as) != 2 {
			t.Fatalf("assignments of alice = %+v", as)
		}
		for _, a := range as {
			if a.User.ID != u.ID || a.User.Name != "alice" || a.User.Domain.ID != "default" ||
				a.Scope.Project.ID != p.ID || a.Scope.Project.Name != "acme" || a.Role.Name == "" {
				t.Errorf("assignment with names = %+v", a)
			}
		}
		pages, _ = roles.ListAssignments(sc, roles.ListAssignmentsOpts{ScopeProjectID: p.ID, RoleID: member}).AllPages(ctx)
		if as, _ = roles.ExtractRoleAssignments(pages); len(as) != 1 || as[0].Role.ID != member || as[0].Role.Name != "" {
			t.Errorf("assignments on acme with member = %+v", as)
		}
		pages, _ = roles.ListAssignmentsOnResource(sc, roles.ListAssignmentsOnResourceOpts{UserID: u.ID, ProjectID: p.ID}).AllPages(ctx)
		if rs, _ = roles.ExtractRoles(pages); len(rs) != 2 {
			t.Errorf("roles of alice on acme = %+v", rs)
		}
		pages, _ = users.ListProjects(sc, u.ID).AllPages(ctx)
		if ps, _ = projects.ExtractProjects(pages); len(ps) != 1 || ps[0].ID != p.ID {
			t.Errorf("projects of alice = %+v", ps)
		}

		// Alice can log in to acme and sees herself, but nothing admin.
		asc := identityClientAs(t, e.c, "alice", "alice-pw", "acme")
		if me, err := users.Get(ctx, asc, u.ID).Extract(); err != nil || me.Name != "alice" {
			t.Errorf("alice reads herself: %+v, %v", me, err)
		}
		if pr, err := projects.Get(ctx, asc, p.ID).Extract(); err != nil || pr.ID != p.ID {
			t.Errorf("alice reads acme: %+v, %v", pr, err)
		}
		_, err = projects.List(asc, nil).AllPages(ctx)
		wantStatus(t, err, http.StatusForbidden)

		// Unassign; unassigning again is a 404.
		if err := roles.Unassign(ctx, sc, role.ID, roles.UnassignOpts{UserID: u.ID, ProjectID: p.ID}).ExtractErr(); err != nil {
			t.Fatalf("unassign: %v", err)
		}
		err = roles.Unassign(ctx, sc, role.ID, roles.UnassignOpts{UserID: u.ID, ProjectID: p.ID}).ExtractErr()
		wantStatus(t, err, http.StatusNotFound)
		err = roles.Validate(ctx, sc, role.ID, roles.ValidateOpts{UserID: u.ID, ProjectID: p.ID}).ExtractErr()
		wantStatus(t, err, http.StatusNotFound)

		// Password change by the user itself.
		if err := users.ChangePassword(ctx, asc, u.ID, users.ChangePasswordOpts{OriginalPassword: "wrong", Password: "x"}).ExtractErr(); !gophercloud.ResponseCodeIs(err, http.StatusUnauthorized) {
			t.Errorf("change password with a wrong original: %v", err)
		}
		if err := users.ChangePassword(ctx, asc, u.ID, users.ChangePasswordOpts{OriginalPassword: "alice-pw", Password: "alice-pw2"}).ExtractErr(); err != nil {
			t.Fatalf("change password: %v", err)
		}
		resp, _, raw := e.do(t, "POST", "/auth/tokens", "", passwordAuth("alice", "alice-pw", p.ID))
		testenv.MustStatus(t, resp, raw, http.StatusUnauthorized)
		e.issue(t, passwordAuth("alice", "alice-pw2", p.ID))
		// No token is needed, as in Keystone; an unknown user is a plain 401.
		e.must(t, 204, "POST", "/users/"+u.ID+"/password", "", `{"user":{"original_password":"alice-pw2","password":"alice-pw3"}}`)
		e.must(t, 401, "POST", "/users/nobody/password", "", `{"user":{"original_password":"a","password":"b"}}`)
		e.must(t, 400, "POST", "/users/"+u.ID+"/password", "", `{"user":{"password":"b"}}`)

		// Deletes, then 404s with Keystone's messages.
		if err := roles.Delete(ctx, sc, role.ID).ExtractErr(); err != nil {
			t.Fatal(err)
		}
		if err := users.Delete(ctx, sc, u.ID).ExtractErr(); err != nil {
			t.Fatal(err)
		}
		if err := projects.Delete(ctx, sc, p.ID).ExtractErr(); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct{ path, msg string }{
			{"/projects/" + p.ID, "Could not find project: " + p.ID + "."},
			{"/users/" + u.ID, "Could not find user: " + u.ID + "."},
			{"/roles/" + role.ID, "Could not find role: " + role.ID + "."},
			{"/domains/nope", "Could not find domain: nope."},
			{"/services/nope", "Could not find service: nope."},
			{"/endpoints/nope", "Could not find endpoint: nope."},
			{"/regions/nope", "Could not find region: nope."},
		} {
			resp, m, raw := e.do(t, "GET", c.path, e.admin, "")
			testenv.MustStatus(t, resp, raw, http.StatusNotFound)
			keystoneError(t, m, 404, c.msg)
		}
		for _, path := range []string{"/projects/" + p.ID, "/users/" + u.ID, "/roles/" + role.ID} {
			resp, _, raw := e.do(t, "DELETE", path, e.admin, "")
			testenv.MustStatus(t, resp, raw, http.StatusNotFound)
		}
		pages, _ = roles.ListAssignments(sc, roles.ListAssignmentsOpts{UserID: u.ID}).AllPages(ctx)
		if as, _ = roles.ExtractRoleAssignments(pages); len(as) != 0 {
			t.Errorf("assignments of a deleted user: %+v", as)
		}
	})
}

func identityClientAs(t *testing.T, c *cloud.Cloud, user, pw, project string) *gophercloud.ServiceClient {
	t.Helper()
	sc, err := openstack.NewIdentityV3(testenv.ProviderAs(t, c, user, pw, project), gophercloud.EndpointOpts{Region: "RegionOne"})
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

// TestAdminWire checks raw bodies: wrappers, links, error messages and the
// 403s non-admins get.
func TestAdminWire(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		demoUserID := str(e.must(t, 200, "GET", "/auth/tokens", e.demo, "", "X-Subject-Token", e.demo), "token", "user", "id")
		demoProjectID := str(e.must(t, 200, "GET", "/auth/tokens", e.demo, "", "X-Subject-Token", e.demo), "token", "project", "id")
		adminProjectID := str(e.must(t, 200, "GET", "/auth/tokens", e.admin, "", "X-Subject-Token", e.admin), "token", "project", "id")

		t.Run("collections", func(t *testing.T) {
			for _, c := range []struct{ path, key string }{
				{"/projects?name=demo", "projects"}, {"/users?domain_id=default", "users"}, {"/roles", "roles"},
				{"/domains", "domains"}, {"/role_assignments?scope.project.id=" + demoProjectID, "role_assignments"},
				{"/services", "services"}, {"/endpoints", "endpoints"}, {"/regions", "regions"},
			} {
				m := e.must(t, 200, "GET", c.path, e.admin, "")
				if _, ok := m[c.key].([]any); !ok {
					t.Errorf("%s: no %q list in %v", c.path, c.key, m)
				}
				links, _ := m["links"].(map[string]any)
				if links == nil || links["self"] != e.url+c.path || links["next"] != nil || links["previous"] != nil {
					t.Errorf("%s: links = %v", c.path, links)
				}
				if _, has := links["next"]; !has {
					t.Errorf("%s: links lack next", c.path)
				}
			}
			m := e.must(t, 200, "GET", "/projects?name=demo", e.admin, "")
			if ps := m["projects"].([]any); len(ps) != 1 || str(ps[0], "links", "self") != e.url+"/projects/"+demoProjectID {
				t.Errorf("projects?name=demo = %v", ps)
			}
			m = e.must(t, 200, "GET", "/role_assignments?scope.project.id="+demoProjectID+"&include_names", e.admin, "")
			ras := m["role_assignments"].([]any)
			if len(ras) != 1 || str(ras[0], "user", "name") != "demo" || str(ras[0], "role", "name") != "member" ||
				str(ras[0], "scope", "project", "domain", "name") != "Default" ||
				!strings.HasPrefix(str(ras[0], "links", "assignment"), e.url+"/projects/"+demoProjectID+"/users/"+demoUserID+"/roles/") {
				t.Errorf("role_assignments = %v", ras)
			}
			m = e.must(t, 200, "GET", "/users?enabled=true&name=demo", e.admin, "")
			if us := m["users"].([]any); len(us) != 1 || str(us[0], "id") != demoUserID || get(us[0], "password_expires_at") != nil {
				t.Errorf("users = %v", us)
			}
		})

		t.Run("extra user attributes are kept", func(t *testing.T) {
			m := e.must(t, 201, "POST", "/users", e.admin, `{"user":{"name":"extra-user","project_id":"`+demoProjectID+`","team":"blue"}}`)
			id := str(m, "user", "id")
			if str(m, "user", "project_id") != demoProjectID || str(m, "user", "team") != "blue" {
				t.Errorf("create echoes %v", m)
			}
			e.must(t, 200, "PATCH", "/users/"+id, e.admin, `{"user":{"team":"red","email":"x@example.net"}}`)
			m = e.must(t, 200, "GET", "/users/"+id, e.admin, "")
			if str(m, "user", "team") != "red" || str(m, "user", "project_id") != demoProjectID || str(m, "user", "email") != "x@example.net" {
				t.Errorf("after update %v", m)
			}
		})

		t.Run("non-admin is forbidden", func(t *testing.T) {
			for _, c := range []struct{ method, path, body, action string }{
				{"GET", "/projects", "", "identity:list_projects"},
				{"POST", "/projects", `{"project":{"name":"x"}}`, "identity:create_project"},
				{"PATCH", "/projects/" + demoProjectID, `{"project":{"name":"x"}}`, "identity:update_project"},
				{"DELETE", "/projects/" + demoProjectID, "", "identity:delete_project"},
				{"GET", "/projects/" + adminProjectID, "", "identity:get_project"},
				{"GET", "/users", "", "identity:list_users"},
				{"POST", "/users", `{"user":{"name":"x"}}`, "identity:create_user"},
				{"GET", "/users/nobody", "", "identity:get_user"},
				{"PATCH", "/users/" + demoUserID, `{"user":{"enabled":true}}`, "identity:update_user"},
				{"DELETE", "/users/" + demoUserID, "", "identity:delete_user"},
				{"GET", "/roles", "", "identity:list_roles"},
				{"POST", "/roles", `{"role":{"name":"x"}}`, "identity:create_role"},
				{"GET", "/role_assignments", "", "identity:list_role_assignments"},
				{"PUT", "/projects/" + demoProjectID + "/users/" + demoUserID + "/roles/x", "", "identity:create_grant"},
				{"GET", "/domains", "", "identity:list_domains"},
				{"GET", "/services", "", "identity:list_services"},
				{"GET", "/endpoints", "", "identity:list_endpoints"},
			} {
				resp, m, raw := e.do(t, c.method, c.path, e.demo, c.body)
				testenv.MustStatus(t, resp, raw, http.StatusForbidden)
				keystoneError(t, m, 403, "You are not authorized to perform the requested action: "+c.action+".")
			}
			// What a member may read about itself.
			e.must(t, 200, "GET", "/users/"+demoUserID, e.demo, "")
			e.must(t, 200, "GET", "/projects/"+demoProjectID, e.demo, "")
			e.must(t, 200, "GET", "/domains/default", e.demo, "")
			e.must(t, 200, "GET", "/regions", e.demo, "")
			m := e.must(t, 200, "GET", "/users/"+demoUserID+"/projects", e.demo, "")
			if ps := m["projects"].([]any); len(ps) != 1 || str(ps[0], "id") != demoProjectID {
				t.Errorf("demo's projects = %v", ps)
			}
		})

		t.Run("bad bodies", func(t *testing.T) {
			for _, c := range []struct{ method, path, body string }{
				{"POST", "/projects", `{`},
				{"POST", "/projects", `{}`},
				{"POST", "/projects", `{"project":"acme"}`},
				{"POST", "/projects", `{"project":{}}`},
				{"POST", "/projects", `{"project":{"name":""}}`},
				{"POST", "/projects", `{"project":{"name":"a","enabled":"yes"}}`},
				{"POST", "/projects", `{"project":{"name":"a","tags":["a/b"]}}`},
				{"POST", "/users", `{"user":{"name":5}}`},
				{"POST", "/roles", `{"role":{"name":"` + strings.Repeat("r", 300) + `"}}`},
				{"PATCH", "/projects/" + demoProjectID, `{"project":{"domain_id":"other"}}`},
				{"POST", "/domains", `{"domain":{}}`},
			} {
				resp, m, raw := e.do(t, c.method, c.path, e.admin, c.body)
				testenv.MustStatus(t, resp, raw, http.StatusBadRequest)
				keystoneError(t, m, 400, "")
			}
			resp, m, raw := e.do(t, "POST", "/projects", e.admin, `{"project":{"name":"demo"}}`)
			testenv.MustStatus(t, resp, raw, http.StatusConflict)
			keystoneError(t, m, 409, "Conflict occurred attempting to store project - Duplicate entry found with name demo at domain ID default.")
			// keystone/api/projects.py answers 400 for an unknown domain,
			// users.py 404.
			resp, m, raw = e.do(t, "POST", "/projects", e.admin, `{"project":{"name":"x","domain_id":"nope"}}`)
			testenv.MustStatus(t, resp, raw, http.StatusBadRequest)
			keystoneError(t, m, 400, "Could not find domain: nope.")
			resp, m, raw = e.do(t, "POST", "/users", e.admin, `{"user":{"name":"x","domain_id":"DEFaUlT"}}`)
			testenv.MustStatus(t, resp, raw, http.StatusNotFound)
			keystoneError(t, m, 404, "Could not find domain: DEFaUlT.")
		})

		t.Run("domains", func(t *testing.T) {
			m := e.must(t, 201, "POST", "/domains", e.admin, `{"domain":{"name":"acme","description":"Acme"}}`)
			id := str(m, "domain", "id")
			if get(m, "domain", "enabled") != true || str(m, "domain", "links", "self") != e.url+"/domains/"+id {
				t.Errorf("created domain = %v", m)
			}
			resp, body, raw := e.do(t, "POST", "/domains", e.admin, `{"domain":{"name":"acme"}}`)
			testenv.MustStatus(t, resp, raw, http.StatusConflict)
			keystoneError(t, body, 409, "")
			m = e.must(t, 200, "GET", "/domains?name=acme", e.admin, "")
			if ds := m["domains"].([]any); len(ds) != 1 || str(ds[0], "id") != id {
				t.Errorf("domains?name=acme = %v", ds)
			}
			// A project and a user in the new domain go with it.
			pid := str(e.must(t, 201, "POST", "/projects", e.admin, `{"project":{"name":"p1","domain_id":"`+id+`"}}`), "project", "id")
			uid := str(e.must(t, 201, "POST", "/users", e.admin, `{"user":{"name":"u1","domain_id":"`+id+`","password":"pw"}}`), "user", "id")
			member := str(e.must(t, 200, "GET", "/roles?name=member", e.admin, "")["roles"].([]any)[0], "id")
			e.must(t, 204, "PUT", "/projects/"+pid+"/users/"+uid+"/roles/"+member, e.admin, "")
			// Domain grants are accepted but not stored.
			e.must(t, 204, "PUT", "/domains/"+id+"/users/"+uid+"/roles/"+member, e.admin, "")
			e.must(t, 404, "GET", "/domains/"+id+"/users/"+uid+"/roles/"+member, e.admin, "")
			tok, _ := e.issue(t, `{"auth":{"identity":{"methods":["password"],"password":{"user":{"name":"u1","domain":{"name":"acme"},"password":"pw"}}},"scope":{"project":{"name":"p1","domain":{"name":"acme"}}}}}`)

			resp, body, raw = e.do(t, "DELETE", "/domains/"+id, e.admin, "")
			testenv.MustStatus(t, resp, raw, http.StatusForbidden)
			keystoneError(t, body, 403, "Cannot delete a domain that is enabled, please disable it first.")
			e.must(t, 200, "PATCH", "/domains/"+id, e.admin, `{"domain":{"enabled":false}}`)
			// Disabling the domain stops its users' tokens at once.
			e.must(t, 401, "GET", "/auth/catalog", tok, "")
			e.must(t, 204, "DELETE", "/domains/"+id, e.admin, "")
			e.must(t, 404, "GET", "/domains/"+id, e.admin, "")
			e.must(t, 404, "GET", "/projects/"+pid, e.admin, "")
			e.must(t, 404, "GET", "/users/"+uid, e.admin, "")
			e.must(t, 403, "PATCH", "/domains/default", e.admin, `{"domain":{"enabled":false}}`)
		})

		t.Run("catalog resources match the token catalog", func(t *testing.T) {
			ctx := context.Background()
			sc := identityClient(t, e.c, cloud.AdminUser)
			pages, err := services.List(sc, nil).AllPages(ctx)
			if err != nil {
				t.Fatal(err)
			}
			svcs, _ := services.ExtractServices(pages)
			pages, err = endpoints.List(sc, nil).AllPages(ctx)
			if err != nil {
				t.Fatal(err)
			}
			eps, _ := endpoints.ExtractEndpoints(pages)
			cat, err := tokens.Get(ctx, sc, e.admin).ExtractServiceCatalog()
			if err != nil {
				t.Fatal(err)
			}
			if len(svcs) != len(cat.Entries) || len(eps) != 3*len(cat.Entries) {
				t.Fatalf("%d services, %d endpoints for %d catalog entries", len(svcs), len(eps), len(cat.Entries))
			}
			for _, entry := range cat.Entries {
				svc, err := services.Get(ctx, sc, entry.ID).Extract()
				if err != nil || svc.Type != entry.Type {
					t.Errorf("service %s: %+v, %v", entry.ID, svc, err)
				}
				for _, ce := range entry.Endpoints {
					ep, err := endpoints.Get(ctx, sc, ce.ID).Extract()
					if err != nil || ep.URL != ce.URL || ep.ServiceID != entry.ID || string(ep.Availability) != ce.Interface || ep.Region != "RegionOne" {
						t.Errorf("endpoint %s: %+v, %v", ce.ID, ep, err)
					}
				}
			}
			pages, _ = endpoints.List(sc, endpoints.ListOpts{Availability: gophercloud.AvailabilityPublic}).AllPages(ctx)
			if pub, _ := endpoints.ExtractEndpoints(pages); len(pub) != len(cat.Entries) {
				t.Errorf("%d public endpoints, want %d", len(pub), len(cat.Entries))
			}
		})
	})
}

// TestRevocationTakesEffect checks that removing a role, disabling or
// deleting a user, or deleting a project stops its tokens on the very next
// request, although validated tokens are cached.
func TestRevocationTakesEffect(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		rolesBody := e.must(t, 200, "GET", "/roles", e.admin, "")
		roleID := map[string]string{}
		for _, r := range rolesBody["roles"].([]any) {
			roleID[str(r, "name")] = str(r, "id")
		}
		// setup makes a user with member and reader on a fresh project and
		// returns a token for it that has been used once (so it is cached).
		n := 0
		setup := func(t *testing.T) (uid, pid, tok string) {
			n++
			name := "rv" + string(rune('a'+n))
			pid = str(e.must(t, 201, "POST", "/projects", e.admin, `{"project":{"name":"`+name+`"}}`), "project", "id")
			uid = str(e.must(t, 201, "POST", "/users", e.admin, `{"user":{"name":"`+name+`","password":"pw"}}`), "user", "id")
			for _, r := range []string{"member", "reader"} {
				e.must(t, 204, "PUT", "/projects/"+pid+"/users/"+uid+"/roles/"+roleID[r], e.admin, "")
			}
			tok, _ = e.issue(t, passwordAuth(name, "pw", pid))
			e.must(t, 200, "GET", "/users/"+uid, tok, "")
			return uid, pid, tok
		}
		roleNames := func(t *testing.T, tok string) []string {
			m := e.must(t, 200, "GET", "/auth/tokens", e.admin, "", "X-Subject-Token", tok)
			var out []string
			for _, r := range get(m, "token", "roles").([]any) {
				out = append(out, str(r, "name"))
			}
			slices.Sort(out)
			return out
		}

		t.Run("removing roles", func(t *testing.T) {
			uid, pid, tok := setup(t)
			if got := roleNames(t, tok); !slices.Equal(got, []string{"member", "reader"}) {
				t.Fatalf("roles = %v", got)
			}
			e.must(t, 204, "DELETE", "/projects/"+pid+"/users/"+uid+"/roles/"+roleID["reader"], e.admin, "")
			if got := roleNames(t, tok); !slices.Equal(got, []string{"member"}) {
				t.Errorf("roles after revoking reader = %v", got)
			}
			e.must(t, 204, "DELETE", "/projects/"+pid+"/users/"+uid+"/roles/"+roleID["member"], e.admin, "")
			e.must(t, 401, "GET", "/users/"+uid, tok, "")
		})
		t.Run("disabling the user", func(t *testing.T) {
			uid, pid, tok := setup(t)
			e.must(t, 200, "PATCH", "/users/"+uid, e.admin, `{"user":{"enabled":false}}`)
			e.must(t, 401, "GET", "/users/"+uid, tok, "")
			resp, m, raw := e.do(t, "POST", "/auth/tokens", "", passwordAuth(str(e.must(t, 200, "GET", "/users/"+uid, e.admin, ""), "user", "name"), "pw", pid))
			testenv.MustStatus(t, resp, raw, 401)
			keystoneError(t, m, 401, unauthorized)
			// Re-enabling does not bring the revoked token back.
			e.must(t, 200, "PATCH", "/users/"+uid, e.admin, `{"user":{"enabled":true}}`)
			e.must(t, 401, "GET", "/users/"+uid, tok, "")
		})
		t.Run("deleting the user", func(t *testing.T) {
			uid, _, tok := setup(t)
			e.must(t, 204, "DELETE", "/users/"+uid, e.admin, "")
			e.must(t, 401, "GET", "/auth/catalog", tok, "")
		})
		t.Run("deleting the project", func(t *testing.T) {
			uid, pid, tok := setup(t)
			e.must(t, 204, "DELETE", "/projects/"+pid, e.admin, "")
			e.must(t, 401, "GET", "/auth/catalog", tok, "")
			m := e.must(t, 200, "GET", "/role_assignments?user.id="+uid, e.admin, "")
			if ras := m["role_assignments"].([]any); len(ras) != 0 {
				t.Errorf("assignments left after project delete: %v", ras)
			}
		})
		t.Run("deleting a role", func(t *testing.T) {
			rid := str(e.must(t, 201, "POST", "/roles", e.admin, `{"role":{"name":"temp"}}`), "role", "id")
			uid, pid, _ := setup(t)
			for _, r := range []string{"member", "reader"} {
				e.must(t, 204, "DELETE", "/projects/"+pid+"/users/"+uid+"/roles/"+roleID[r], e.admin, "")
			}
			e.must(t, 204, "PUT", "/projects/"+pid+"/users/"+uid+"/roles/"+rid, e.admin, "")
			name := str(e.must(t, 200, "GET", "/users/"+uid, e.admin, ""), "user", "name")
			tok, _ := e.issue(t, passwordAuth(name, "pw", pid))
			e.must(t, 200, "GET", "/auth/catalog", tok, "")
			e.must(t, 204, "DELETE", "/roles/"+rid, e.admin, "")
			e.must(t, 401, "GET", "/auth/catalog", tok, "")
		})
	})
}
