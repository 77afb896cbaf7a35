package compute_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servergroups"

	"nimbus/internal/cloud"
	"nimbus/internal/store"
	"nimbus/internal/testenv"
)

// sgCreate creates a server group over HTTP and returns its view.
func sgCreate(e *rsEnv, tok, mv, body string) map[string]any {
	e.t.Helper()
	return rsObj(e.must(200, "POST", "/os-server-groups", tok, mv, body), "server_group")
}

func sgIDs(l []any) []string {
	var out []string
	for _, g := range l {
		out = append(out, g.(map[string]any)["id"].(string))
	}
	return out
}

func TestServerGroupViews(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := rsStart(t, dbURL)
		// 2.1: policies and an empty metadata, no owner.
		g := sgCreate(e, e.demo, "", `{"server_group":{"name":"web","policies":["anti-affinity"]}}`)
		rsWantKeys(t, "group at 2.1", g, "id", "name", "policies", "members", "metadata")
		if g["name"] != "web" || len(rsList(g, "policies")) != 1 || rsList(g, "policies")[0] != "anti-affinity" ||
			len(rsObj(g, "metadata")) != 0 || g["members"] == nil || len(rsList(g, "members")) != 0 {
			t.Errorf("group at 2.1: %v", g)
		}
		id := g["id"].(string)
		// The create answer is what show answers (Tempest compares them).
		show := rsObj(e.must(200, "GET", "/os-server-groups/"+id, e.demo, "", ""), "server_group")
		if !rsEqualJSON(g, show) {
			t.Errorf("show %v differs from create %v", show, g)
		}
		// 2.13 adds the owner; 2.64 swaps policies and metadata for policy and rules.
		g13 := rsObj(e.must(200, "GET", "/os-server-groups/"+id, e.demo, "2.13", ""), "server_group")
		rsWantKeys(t, "group at 2.13", g13, "id", "name", "policies", "members", "metadata", "project_id", "user_id")
		if g13["project_id"] == "" || g13["user_id"] == "" {
			t.Errorf("owner at 2.13: %v", g13)
		}
		g64 := rsObj(e.must(200, "GET", "/os-server-groups/"+id, e.demo, "2.64", ""), "server_group")
		rsWantKeys(t, "group at 2.64", g64, "id", "name", "policy", "rules", "members", "project_id", "user_id")
		if g64["policy"] != "anti-affinity" || len(rsObj(g64, "rules")) != 0 {
			t.Errorf("group at 2.64: %v", g64)
		}
		// Soft policies from 2.15; rules from 2.64, anti-affinity only.
		soft := sgCreate(e, e.demo, "2.15", `{"server_group":{"name":"soft","policies":["soft-anti-affinity"]}}`)
		if rsList(soft, "policies")[0] != "soft-anti-affinity" {
			t.Errorf("soft group %v", soft)
		}
		ruled := sgCreate(e, e.demo, "2.64", `{"server_group":{"name":"ruled","policy":"anti-affinity","rules":{"max_server_per_host":"3"}}}`)
		if ruled["policy"] != "anti-affinity" || rsObj(ruled, "rules")["max_server_per_host"] != float64(3) {
			t.Errorf("group with rules %v", ruled)
		}
		// The same group read before 2.64 shows its policy as a list.
		old := rsObj(e.must(200, "GET", "/os-server-groups/"+ruled["id"].(string), e.demo, "2.63", ""), "server_group")
		if rsList(old, "policies")[0] != "anti-affinity" {
			t.Errorf("2.64 group at 2.63: %v", old)
		}
		aff := sgCreate(e, e.demo, "2.64", `{"server_group":{"name":"aff","policy":"affinity","rules":{}}}`)
		if len(rsObj(aff, "rules")) != 0 {
			t.Errorf("affinity with empty rules: %v", aff)
		}
	})
}

func TestServerGroupErrors(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := rsStart(t, dbURL)
		tests := []struct {
			name, mv, body, msg string
		}{
			{"no body key", "", `{"group":{}}`, "'server_group' is a required property"},
			{"no policies", "", `{"server_group":{"name":"x"}}`, "'policies' is a required property"},
			{"no name", "", `{"server_group":{"policies":["affinity"]}}`, "'name' is a required property"},
			{"empty name", "", `{"server_group":{"name":"","policies":["affinity"]}}`, "'' is too short"},
			{"spaced name", "", `{"server_group":{"name":" x","policies":["affinity"]}}`, "field/attribute name"},
			{"name type", "", `{"server_group":{"name":1,"policies":["affinity"]}}`, "1 is not of type 'string'"},
			{"policies string", "", `{"server_group":{"name":"x","policies":"affinity"}}`, "'affinity' is not of type 'array'"},
			{"no policy", "", `{"server_group":{"name":"x","policies":[]}}`, "[] is too short"},
			{"two policies", "", `{"server_group":{"name":"x","policies":["affinity","anti-affinity"]}}`, "['affinity', 'anti-affinity'] is too long"},
			{"repeated policy", "", `{"server_group":{"name":"x","policies":["affinity","affinity"]}}`, "has non-unique elements"},
			{"unknown policy", "", `{"server_group":{"name":"x","policies":["spread"]}}`,
				"Invalid input for field/attribute 0. Value: spread. 'spread' is not one of ['anti-affinity', 'affinity']"},
			{"soft before 2.15", "2.14", `{"server_group":{"name":"x","policies":["soft-affinity"]}}`, "'soft-affinity' is not one of ['anti-affinity', 'affinity']"},
			{"policy item type", "", `{"server_group":{"name":"x","policies":[1]}}`, "1 is not of type 'string'"},
			{"extra key", "", `{"server_group":{"name":"x","policies":["affinity"],"metadata":{}}}`, "Additional properties are not allowed ('metadata' was unexpected)"},
			{"policy before 2.64", "2.63", `{"server_group":{"name":"x","policy":"affinity"}}`, "'policies' is a required property"},
			{"policies at 2.64", "2.64", `{"server_group":{"name":"x","policies":["affinity"]}}`, "'policy' is a required property"},
			{"unknown policy at 2.64", "2.64", `{"server_group":{"name":"x","policy":"spread"}}`,
				"'spread' is not one of ['anti-affinity', 'affinity', 'soft-anti-affinity', 'soft-affinity']"},
			{"rules for affinity", "2.64", `{"server_group":{"name":"x","policy":"affinity","rules":{"max_server_per_host":2}}}`, "Only anti-affinity policy supports rules."},
			{"unknown rule", "2.64", `{"server_group":{"name":"x","policy":"anti-affinity","rules":{"unknown_key":"3"}}}`, "Additional properties are not allowed ('unknown_key' was unexpected)"},
			{"zero rule", "2.64", `{"server_group":{"name":"x","policy":"anti-affinity","rules":{"max_server_per_host":0}}}`, "0 is less than the minimum of 1"},
			{"word rule", "2.64", `{"server_group":{"name":"x","policy":"anti-affinity","rules":{"max_server_per_host":"foo"}}}`, "Invalid input for field/attribute max_server_per_host"},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				e.t = t
				e.fault(400, tc.msg, "POST", "/os-server-groups", e.demo, tc.mv, tc.body)
			})
		}
		e.t = t
		// Nothing was created by the refused requests.
		if l := rsList(e.must(200, "GET", "/os-server-groups", e.demo, "", ""), "server_groups"); len(l) != 0 {
			t.Errorf("groups after refusals: %v", l)
		}
		e.fault(404, "Instance group 00000000-0000-4000-8000-000000000000 could not be found.",
			"GET", "/os-server-groups/00000000-0000-4000-8000-000000000000", e.demo, "", "")
		e.fault(404, "could not be found", "DELETE", "/os-server-groups/not-a-uuid", e.demo, "", "")
		// Unknown query parameters: ignored before 2.75, refused from it.
		e.must(200, "GET", "/os-server-groups?foo=1", e.demo, "2.74", "")
		e.fault(400, "Additional properties are not allowed ('foo' was unexpected)", "GET", "/os-server-groups?foo=1", e.demo, "2.75", "")
		e.fault(400, "'x' does not match '^[0-9]*$'", "GET", "/os-server-groups?limit=x", e.demo, "", "")
		e.fault(400, "Invalid input for query parameters offset", "GET", "/os-server-groups?offset=-1", e.demo, "", "")
	})
}

func TestServerGroupsProjectsAndQuota(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := rsStart(t, dbURL)
		var demoIDs []string
		for _, n := range []string{"a", "b", "c"} {
			demoIDs = append(demoIDs, sgCreate(e, e.demo, "", `{"server_group":{"name":"`+n+`","policies":["affinity"]}}`)["id"].(string))
		}
		adminID := sgCreate(e, e.admin, "", `{"server_group":{"name":"ops","policies":["anti-affinity"]}}`)["id"].(string)

		list := func(tok, query string) []string {
			t.Helper()
			return sgIDs(rsList(e.must(200, "GET", "/os-server-groups"+query, tok, "", ""), "server_groups"))
		}
		tests := []struct {
			name, tok, query string
			want             []string
		}{
			{"demo", e.demo, "", demoIDs},
			{"demo asking all projects", e.demo, "?all_projects=True", demoIDs},
			{"admin", e.admin, "", []string{adminID}},
			{"admin all projects", e.admin, "?all_projects=True", append(slices.Clone(demoIDs), adminID)},
			// Nova looks only for the key.
			{"admin all projects false", e.admin, "?all_projects=False", append(slices.Clone(demoIDs), adminID)},
			{"limit", e.demo, "?limit=2", demoIDs[:2]},
			{"offset", e.demo, "?limit=1&offset=1", demoIDs[1:2]},
			{"offset past the end", e.demo, "?offset=5", nil},
			{"limit 0 is the maximum", e.demo, "?limit=0", demoIDs},
		}
		for _, tc := range tests {
			if got := list(tc.tok, tc.query); !slices.Equal(got, tc.want) {
				t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
			}
		}
		// Another project's group is not found; an admin finds it.
		e.fault(404, "Instance group "+adminID+" could not be found.", "GET", "/os-server-groups/"+adminID, e.demo, "", "")
		e.fault(404, "could not be found", "DELETE", "/os-server-groups/"+adminID, e.demo, "", "")
		e.must(200, "GET", "/os-server-groups/"+demoIDs[0], e.admin, "", "")

		// Quota: server_groups per project.
		project := rsObj(e.must(200, "GET", "/os-server-groups/"+demoIDs[0], e.demo, "2.13", ""), "server_group")["project_id"].(string)
		e.must(200, "PUT", "/os-quota-sets/"+project, e.admin, "", `{"quota_set":{"server_groups":3}}`)
		e.fault(403, "Quota exceeded, too many server groups.", "POST", "/os-server-groups", e.demo, "",
			`{"server_group":{"name":"d","policies":["affinity"]}}`)
		// The quota is checked before "Only anti-affinity policy supports rules."
		e.fault(403, "Quota exceeded, too many server groups.", "POST", "/os-server-groups", e.demo, "2.64",
			`{"server_group":{"name":"d","policy":"affinity","rules":{"max_server_per_host":2}}}`)
		// Deleting one makes room; the admin's groups do not count.
		e.must(204, "DELETE", "/os-server-groups/"+demoIDs[2], e.demo, "", "")
		e.fault(404, "could not be found", "GET", "/os-server-groups/"+demoIDs[2], e.demo, "", "")
		e.fault(404, "could not be found", "DELETE", "/os-server-groups/"+demoIDs[2], e.demo, "", "")
		sgCreate(e, e.demo, "", `{"server_group":{"name":"d","policies":["affinity"]}}`)
		e.must(200, "PUT", "/os-quota-sets/"+project, e.admin, "", `{"quota_set":{"server_groups":-1}}`)
		sgCreate(e, e.demo, "", `{"server_group":{"name":"e","policies":["affinity"]}}`)
		// An admin may delete another project's group.
		e.must(204, "DELETE", "/os-server-groups/"+demoIDs[1], e.admin, "", "")
	})
}

// TestServerGroupMembers checks that a group shows its members whose
// servers are not deleted, and that the 2.71 server view names the group.
func TestServerGroupMembers(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		e := rsStart(t, dbURL)
		gid := sgCreate(e, e.demo, "", `{"server_group":{"name":"web","policies":["anti-affinity"]}}`)["id"].(string)
		var imageID string
		if err := e.c.DB.QueryRow(ctx, "SELECT id FROM images WHERE name = ?", "Debian 12").Scan(&imageID); err != nil {
			t.Fatal(err)
		}
		var sids []string
		for i := 0; i < 2; i++ {
			m := e.must(202, "POST", "/servers", e.demo, "2.96",
				`{"server":{"name":"m","imageRef":"`+imageID+`","flavorRef":"2","networks":"none"}}`)
			sid := rsObj(m, "server")["id"].(string)
			sids = append(sids, sid)
			// Placement adds members in the create transaction; here the row
			// is written as it would.
			if _, err := e.c.DB.Exec(ctx, "INSERT INTO compute_server_group_members (server_id, group_id, created_at) VALUES (?, ?, ?)",
				sid, gid, store.FormatTime(time.Now().Add(time.Duration(i)*time.Second))); err != nil {
				t.Fatal(err)
			}
		}
		g := rsObj(e.must(200, "GET", "/os-server-groups/"+gid, e.demo, "", ""), "server_group")
		if got := rsList(g, "members"); len(got) != 2 || got[0] != sids[0] || got[1] != sids[1] {
			t.Errorf("members %v, want %v", got, sids)
		}
		if l := rsList(e.must(200, "GET", "/os-server-groups", e.demo, "", ""), "server_groups"); len(rsList(l[0], "members")) != 2 {
			t.Errorf("listed members %v", l)
		}
		srv := rsObj(e.must(200, "GET", "/servers/"+sids[0], e.demo, "2.71", ""), "server")
		if got := rsList(srv, "server_groups"); len(got) != 1 || got[0] != gid {
			t.Errorf("server_groups at 2.71: %v", srv["server_groups"])
		}
		if _, ok := rsObj(e.must(200, "GET", "/servers/"+sids[0], e.demo, "2.70", ""), "server")["server_groups"]; ok {
			t.Error("server_groups shown before 2.71")
		}
		// A deleted server is no longer shown as a member.
		if _, err := e.c.DB.Exec(ctx, "UPDATE compute_servers SET deleted = 1 WHERE id = ?", sids[0]); err != nil {
			t.Fatal(err)
		}
		g = rsObj(e.must(200, "GET", "/os-server-groups/"+gid, e.demo, "", ""), "server_group")
		if got := rsList(g, "members"); len(got) != 1 || got[0] != sids[1] {
			t.Errorf("members after delete %v", got)
		}
		// Deleting a group with members is allowed; its servers are in none.
		e.must(204, "DELETE", "/os-server-groups/"+gid, e.demo, "", "")
		if got := rsList(rsObj(e.must(200, "GET", "/servers/"+sids[1], e.demo, "2.71", ""), "server"), "server_groups"); len(got) != 0 {
			t.Errorf("server_groups after the group's delete: %v", got)
		}
	})
}

// TestServerGroupsGophercloud drives the API with gophercloud's servergroups
// package at 2.1, 2.15 and 2.64.
func TestServerGroupsGophercloud(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		c := testenv.StartCloud(t, dbURL)
		demo := testenv.Provider(t, c, cloud.DemoUser)
		admin := testenv.Provider(t, c, cloud.AdminUser)

		sc := testenv.Compute(t, demo, "")
		g, err := servergroups.Create(ctx, sc, servergroups.CreateOpts{Name: "g21", Policies: []string{"affinity"}}).Extract()
		if err != nil || g.Name != "g21" || !slices.Equal(g.Policies, []string{"affinity"}) || g.Members == nil || g.ProjectID != "" {
			t.Fatalf("create at 2.1: %+v %v", g, err)
		}
		sc215 := testenv.Compute(t, demo, "2.15")
		soft, err := servergroups.Create(ctx, sc215, servergroups.CreateOpts{Name: "soft", Policies: []string{"soft-affinity"}}).Extract()
		if err != nil || soft.ProjectID == "" || soft.UserID == "" {
			t.Fatalf("create at 2.15: %+v %v", soft, err)
		}
		sc264 := testenv.Compute(t, demo, "2.64")
		ruled, err := servergroups.Create(ctx, sc264, servergroups.CreateOpts{Name: "ruled", Policy: "anti-affinity",
			Rules: &servergroups.Rules{MaxServerPerHost: 2}}).Extract()
		if err != nil || ruled.Policy == nil || *ruled.Policy != "anti-affinity" || ruled.Rules == nil || ruled.Rules.MaxServerPerHost != 2 {
			t.Fatalf("create at 2.64: %+v %v", ruled, err)
		}
		got, err := servergroups.Get(ctx, sc264, g.ID).Extract()
		if err != nil || got.Policy == nil || *got.Policy != "affinity" || got.Rules == nil || got.Policies != nil {
			t.Fatalf("get at 2.64: %+v %v", got, err)
		}
		_, err = servergroups.Create(ctx, sc, servergroups.CreateOpts{Name: "bad", Policies: []string{"soft-affinity"}}).Extract()
		if !gophercloud.ResponseCodeIs(err, http.StatusBadRequest) {
			t.Errorf("soft policy at 2.1: %v", err)
		}

		pages, err := servergroups.List(sc, servergroups.ListOpts{}).AllPages(ctx)
		if err != nil {
			t.Fatal(err)
		}
		all, err := servergroups.ExtractServerGroups(pages)
		if err != nil || len(all) != 3 {
			t.Fatalf("list: %+v %v", all, err)
		}
		asc := testenv.Compute(t, admin, "2.64")
		if _, err := servergroups.Create(ctx, asc, servergroups.CreateOpts{Name: "ops", Policy: "affinity"}).Extract(); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			all  bool
			want int
		}{{false, 1}, {true, 4}} {
			pages, err := servergroups.List(asc, servergroups.ListOpts{AllProjects: tc.all}).AllPages(ctx)
			if err != nil {
				t.Fatal(err)
			}
			l, _ := servergroups.ExtractServerGroups(pages)
			if len(l) != tc.want {
				t.Errorf("admin list all_projects=%v: %d groups, want %d", tc.all, len(l), tc.want)
			}
		}

		if err := servergroups.Delete(ctx, sc, g.ID).ExtractErr(); err != nil {
			t.Fatal(err)
		}
		_, err = servergroups.Get(ctx, sc, g.ID).Extract()
		if !gophercloud.ResponseCodeIs(err, http.StatusNotFound) {
			t.Errorf("get after delete: %v", err)
		}
		var ec gophercloud.ErrUnexpectedResponseCode
		if err := servergroups.Delete(ctx, sc, g.ID).ExtractErr(); !errors.As(err, &ec) || ec.Actual != 404 {
			t.Errorf("second delete: %v", err)
		}
	})
}

// rsEqualJSON reports whether a and b encode to the same JSON.
func rsEqualJSON(a, b any) bool {
	x, err1 := json.Marshal(a)
	y, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && string(x) == string(y)
}

// TestServerGroupQuotaConcurrent creates groups at once against a quota of
// three: exactly three are created.
func TestServerGroupQuotaConcurrent(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := rsStart(t, dbURL)
		demo, err := e.c.Identity.ProjectByName(context.Background(), cloud.DemoProject)
		if err != nil {
			t.Fatal(err)
		}
		e.must(200, "PUT", "/os-quota-sets/"+demo.ID, e.admin, "", `{"quota_set":{"server_groups":3}}`)
		const n = 8
		var wg sync.WaitGroup
		status := make([]int, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, _ := testenv.Do(t, e.client, "POST", e.c.ComputeURL+"/os-server-groups", e.demo, `{"server_group":{"name":"g","policies":["affinity"]}}`)
				status[i] = resp.StatusCode
			}()
		}
		wg.Wait()
		ok := 0
		for _, st := range status {
			if st == 200 {
				ok++
			} else if st != 403 {
				t.Errorf("status %d", st)
			}
		}
		if l := rsList(e.must(200, "GET", "/os-server-groups", e.demo, "", ""), "server_groups"); ok != 3 || len(l) != 3 {
			t.Errorf("%d created (%v), %d listed", ok, status, len(l))
		}
	})
}
