package compute_test

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/flavors"

	"nimbus/internal/cloud"
	"nimbus/internal/testenv"
)

// rsEnv is a running cloud with raw HTTPS access for the resource tests.
type rsEnv struct {
	t           *testing.T
	c           *cloud.Cloud
	client      *http.Client
	admin, demo string // tokens
}

func rsStart(t *testing.T, dbURL string) *rsEnv {
	t.Helper()
	c := testenv.StartCloud(t, dbURL)
	return &rsEnv{t: t, c: c, client: testenv.HTTPClient(t, c),
		admin: testenv.Token(t, c, cloud.AdminUser), demo: testenv.Token(t, c, cloud.DemoUser)}
}

// call sends a compute request at microversion mv ("" for none) to path
// (relative to /v2.1) and decodes a JSON object answer.
func (e *rsEnv) call(method, path, token, mv, body string) (int, map[string]any, string) {
	e.t.Helper()
	var hdr []string
	if mv != "" {
		hdr = []string{"OpenStack-API-Version", "compute " + mv}
	}
	resp, raw := testenv.Do(e.t, e.client, method, e.c.ComputeURL+path, token, body, hdr...)
	var m map[string]any
	if strings.TrimSpace(raw) != "" {
		if err := json.Unmarshal([]byte(raw), &m); err != nil {
			e.t.Fatalf("%s %s: answer is not a JSON object: %q", method, path, raw)
		}
	}
	if resp.StatusCode >= 500 {
		e.t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, raw)
	}
	return resp.StatusCode, m, raw
}

// must is call that fails the test on any other status.
func (e *rsEnv) must(want int, method, path, token, mv, body string) map[string]any {
	e.t.Helper()
	st, m, raw := e.call(method, path, token, mv, body)
	if st != want {
		e.t.Fatalf("%s %s (mv %q): status %d, want %d: %s", method, path, mv, st, want, raw)
	}
	return m
}

// fault checks a Nova error answer: status, fault name and message part.
func (e *rsEnv) fault(want int, msgPart, method, path, token, mv, body string) {
	e.t.Helper()
	st, m, raw := e.call(method, path, token, mv, body)
	if st != want {
		e.t.Fatalf("%s %s (mv %q): status %d, want %d: %s", method, path, mv, st, want, raw)
	}
	if len(m) != 1 {
		e.t.Fatalf("%s %s: not a Nova fault: %s", method, path, raw)
	}
	for _, v := range m {
		f, _ := v.(map[string]any)
		if f == nil || f["code"] != float64(want) || !strings.Contains(f["message"].(string), msgPart) {
			e.t.Fatalf("%s %s: fault %s, want message containing %q", method, path, raw, msgPart)
		}
	}
}

func rsKeys(v any) []string {
	m, _ := v.(map[string]any)
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func rsWantKeys(t *testing.T, what string, v any, want ...string) {
	t.Helper()
	want = slices.Sorted(slices.Values(want))
	if got := rsKeys(v); !slices.Equal(got, want) {
		t.Errorf("%s: fields %v, want %v", what, got, want)
	}
}

func rsObj(v any, key string) map[string]any {
	m, _ := v.(map[string]any)
	r, _ := m[key].(map[string]any)
	return r
}

func rsList(v any, key string) []any {
	m, _ := v.(map[string]any)
	r, _ := m[key].([]any)
	return r
}

func TestFlavorViews(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := rsStart(t, dbURL)
		base := []string{"id", "name", "ram", "disk", "swap", "OS-FLV-EXT-DATA:ephemeral", "OS-FLV-DISABLED:disabled",
			"vcpus", "os-flavor-access:is_public", "rxtx_factor", "links"}
		f := rsObj(e.must(200, "GET", "/flavors/1", e.demo, "", ""), "flavor")
		rsWantKeys(t, "flavor at 2.1", f, base...)
		if f["swap"] != "" || f["name"] != "m1.tiny" || f["ram"] != float64(512) || f["vcpus"] != float64(1) || f["disk"] != float64(1) {
			t.Errorf("m1.tiny at 2.1: %v", f)
		}
		links := f["links"].([]any)
		self := links[0].(map[string]any)["href"]
		book := links[1].(map[string]any)["href"]
		if self != e.c.ComputeURL+"/flavors/1" || book != strings.TrimSuffix(e.c.ComputeURL, "/v2.1")+"/flavors/1" {
			t.Errorf("links %v", links)
		}
		f = rsObj(e.must(200, "GET", "/flavors/1", e.demo, "2.96", ""), "flavor")
		rsWantKeys(t, "flavor at 2.96", f, append(base, "description", "extra_specs")...)
		if f["swap"] != float64(0) {
			t.Errorf("swap at 2.96 = %v, want 0", f["swap"])
		}
		f = rsObj(e.must(200, "GET", "/flavors/1", e.demo, "2.60", ""), "flavor")
		rsWantKeys(t, "flavor at 2.60", f, append(base, "description")...)

		for mv, want := range map[string][]string{"": {"id", "name", "links"}, "2.55": {"id", "name", "links", "description"}} {
			l := rsList(e.must(200, "GET", "/flavors", e.demo, mv, ""), "flavors")
			if len(l) < 10 {
				t.Fatalf("only %d flavors", len(l))
			}
			rsWantKeys(t, "flavor list item at "+mv, l[0], want...)
		}

		// The configurator's catalogue: dedicated CPUs, disk type, IPv4, GPUs.
		specs := rsObj(e.must(200, "GET", "/flavors/d2.4g.network.ipv4/os-extra_specs", e.demo, "", ""), "extra_specs")
		if specs["hw:cpu_policy"] != "dedicated" || specs["nimbus:disk_type"] != "network" || specs["nimbus:public_ipv4"] != "true" {
			t.Errorf("d2.4g.network.ipv4 specs %v", specs)
		}
		g := rsObj(e.must(200, "GET", "/flavors/g.a100-80gb.x2", e.demo, "2.61", ""), "flavor")
		gs, _ := g["extra_specs"].(map[string]any)
		if gs["pci_passthrough:alias"] != "a100-80gb:2" || gs["nimbus:gpu_model"] != "A100 80GB" {
			t.Errorf("GPU flavor %v", g)
		}

		// Bootstrap again changes nothing, and a deleted default stays deleted.
		n := len(rsList(e.must(200, "GET", "/flavors", e.demo, "", ""), "flavors"))
		e.must(202, "DELETE", "/flavors/d1.2g.local", e.admin, "", "")
		if err := e.c.Compute.Bootstrap(context.Background()); err != nil {
			t.Fatal(err)
		}
		if m := len(rsList(e.must(200, "GET", "/flavors", e.demo, "", ""), "flavors")); m != n-1 {
			t.Errorf("after re-bootstrap %d flavors, want %d", m, n-1)
		}
	})
}

func TestFlavorListFilters(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := rsStart(t, dbURL)
		for _, f := range rsList(e.must(200, "GET", "/flavors/detail?minRam=8192&minDisk=100", e.demo, "", ""), "flavors") {
			m := f.(map[string]any)
			if m["ram"].(float64) < 8192 || m["disk"].(float64) < 100 {
				t.Errorf("filter let through %v", m["id"])
			}
		}
		page := e.must(200, "GET", "/flavors?limit=2&sort_key=memory_mb&sort_dir=desc", e.demo, "", "")
		items := rsList(page, "flavors")
		if len(items) != 2 {
			t.Fatalf("limit=2 gave %d", len(items))
		}
		next := rsList(page, "flavors_links")
		if len(next) != 1 || !strings.Contains(next[0].(map[string]any)["href"].(string), "marker="+items[1].(map[string]any)["id"].(string)) {
			t.Errorf("flavors_links %v", next)
		}
		bad := []struct{ path, msg string }{
			{"/flavors?minRam=abc", "Invalid minRam filter [abc]"},
			{"/flavors/detail?minDisk=-1", "Invalid minDisk filter"},
			{"/flavors?limit=x", "limit param must be an integer"},
			{"/flavors?limit=-1", "limit param must be positive"},
			{"/flavors?marker=nope", "marker [nope] not found"},
			{"/flavors?sort_key=bogus", "sort_key"},
			{"/flavors?sort_dir=up", "sort_dir"},
		}
		for _, b := range bad {
			e.fault(400, b.msg, "GET", b.path, e.demo, "", "")
		}
		e.fault(400, "Invalid is_public filter [maybe]", "GET", "/flavors?is_public=maybe", e.admin, "", "")
		e.fault(400, "Additional properties", "GET", "/flavors?foo=1", e.demo, "2.75", "")
		e.must(200, "GET", "/flavors?foo=1", e.demo, "2.74", "")

		// Gophercloud walks every page, at both ends of the range.
		want := len(rsList(e.must(200, "GET", "/flavors", e.demo, "", ""), "flavors"))
		for _, mv := range []string{"", "2.96"} {
			pc := testenv.Compute(t, testenv.Provider(t, e.c, cloud.DemoUser), mv)
			pages, err := flavors.ListDetail(pc, flavors.ListOpts{Limit: 3, MinRAM: 512}).AllPages(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			all, err := flavors.ExtractFlavors(pages)
			if err != nil || len(all) != want {
				t.Fatalf("mv %q: paged %d flavors of %d, %v", mv, len(all), want, err)
			}
			one, err := flavors.Get(context.Background(), pc, "1").Extract()
			if err != nil || one.Name != "m1.tiny" || one.Swap != 0 || !one.IsPublic {
				t.Fatalf("mv %q: get %+v %v", mv, one, err)
			}
		}
	})
}

func TestFlavorManage(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := rsStart(t, dbURL)
		ctx := context.Background()
		admin := testenv.Compute(t, testenv.Provider(t, e.c, cloud.AdminUser), "")
		isPublic := false
		fl, err := flavors.Create(ctx, admin, flavors.CreateOpts{Name: "private.one", ID: "p1", RAM: 1024, VCPUs: 2, Disk: gophercloud.IntToPointer(10),
			IsPublic: &isPublic}).Extract()
		if err != nil || fl.ID != "p1" || fl.IsPublic {
			t.Fatalf("create: %+v %v", fl, err)
		}
		// Create answers 200 (flavor_manage.py keeps it for compatibility).
		m := e.must(200, "POST", "/flavors", e.admin, "2.55", `{"flavor":{"name":"gen","ram":"512","vcpus":1,"disk":0,"description":"d"}}`)
		gen := rsObj(m, "flavor")
		if len(gen["id"].(string)) != 36 || gen["description"] != "d" || gen["ram"] != float64(512) {
			t.Errorf("generated flavor %v", gen)
		}
		e.fault(409, "Flavor with name gen already exists.", "POST", "/flavors", e.admin, "", `{"flavor":{"name":"gen","ram":1,"vcpus":1,"disk":0}}`)
		e.fault(409, "Flavor with ID p1 already exists.", "POST", "/flavors", e.admin, "", `{"flavor":{"name":"x","id":"p1","ram":1,"vcpus":1,"disk":0}}`)
		e.fault(403, "os-flavor-manage:create", "POST", "/flavors", e.demo, "", `{"flavor":{"name":"x","ram":1,"vcpus":1,"disk":0}}`)
		for _, body := range []string{
			`{"flavor":{"name":"x","ram":0,"vcpus":1,"disk":0}}`,
			`{"flavor":{"name":"x","ram":1,"disk":0}}`,
			`{"flavor":{"name":" x","ram":1,"vcpus":1,"disk":0}}`,
			`{"flavor":{"name":"x","ram":1,"vcpus":1,"disk":0,"bogus":1}}`,
			`{"flavor":{"name":"x","ram":1,"vcpus":1,"disk":0,"id":"a/b"}}`,
			`{"flavor":{"name":"x","ram":1,"vcpus":1,"disk":0,"rxtx_factor":-1}}`,
			`{"flavor":{"name":"x","ram":1,"vcpus":1,"disk":0,"os-flavor-access:is_public":"perhaps"}}`,
			`{"flavor":{"name":"x","ram":1,"vcpus":1,"disk":0,"description":"only from 2.55"}}`,
			`{"flavor":[]}`, `{}`, `[]`, `nope`,
		} {
			if st, _, raw := e.call("POST", "/flavors", e.admin, "", body); st != 400 {
				t.Errorf("POST %s: %d %s", body, st, raw)
			}
		}

		// A private flavor is invisible to other projects until shared.
		e.fault(404, "Flavor p1 could not be found.", "GET", "/flavors/p1", e.demo, "", "")
		ids := func(tok string) []string {
			var out []string
			for _, f := range rsList(e.must(200, "GET", "/flavors", tok, "", ""), "flavors") {
				out = append(out, f.(map[string]any)["id"].(string))
			}
			return out
		}
		if slices.Contains(ids(e.demo), "p1") {
			t.Error("demo lists a private flavor")
		}
		all := rsList(e.must(200, "GET", "/flavors?is_public=None", e.admin, "", ""), "flavors")
		priv := rsList(e.must(200, "GET", "/flavors?is_public=false", e.admin, "", ""), "flavors")
		if len(priv) != 1 || len(all) != len(ids(e.admin))+1 {
			t.Errorf("is_public filters: all %d private %d public %d", len(all), len(priv), len(ids(e.admin)))
		}
		demoProject, _ := e.c.Identity.ProjectByName(ctx, cloud.DemoProject)
		acc, err := flavors.AddAccess(ctx, admin, "p1", flavors.AddAccessOpts{Tenant: demoProject.ID}).Extract()
		if err != nil || len(acc) != 1 || acc[0].TenantID != demoProject.ID {
			t.Fatalf("add access: %+v %v", acc, err)
		}
		if !slices.Contains(ids(e.demo), "p1") {
			t.Error("demo does not list a flavor shared with it")
		}
		e.must(200, "GET", "/flavors/p1", e.demo, "", "")
		e.fault(409, "Flavor access already exists for flavor p1 and project", "POST", "/flavors/p1/action", e.admin, "",
			`{"addTenantAccess":{"tenant":"`+demoProject.ID+`"}}`)
		e.fault(409, "Can not add access to a public flavor.", "POST", "/flavors/1/action", e.admin, "",
			`{"addTenantAccess":{"tenant":"`+demoProject.ID+`"}}`)
		e.fault(400, "is not a valid project", "POST", "/flavors/p1/action", e.admin, "", `{"addTenantAccess":{"tenant":"nope"}}`)
		e.fault(400, "There is no such action", "POST", "/flavors/p1/action", e.admin, "", `{"fly":{}}`)
		e.fault(404, "Flavor access not found for p1 / other combination.", "POST", "/flavors/p1/action", e.admin, "",
			`{"removeTenantAccess":{"tenant":"other"}}`)
		e.fault(404, "Access list not available for public flavors.", "GET", "/flavors/1/os-flavor-access", e.admin, "", "")
		e.fault(403, "os-flavor-access", "GET", "/flavors/p1/os-flavor-access", e.demo, "", "")
		e.fault(403, "os_compute_api:os-flavor-access:remove_tenant_access", "POST", "/flavors/p1/action", e.demo, "",
			`{"removeTenantAccess":{"tenant":"x"}}`)
		pages, err := flavors.ListAccesses(admin, "p1").AllPages(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := flavors.ExtractAccesses(pages); len(got) != 1 {
			t.Errorf("access list %+v", got)
		}
		if _, err := flavors.RemoveAccess(ctx, admin, "p1", flavors.RemoveAccessOpts{Tenant: demoProject.ID}).Extract(); err != nil {
			t.Fatal(err)
		}
		e.fault(404, "could not be found", "GET", "/flavors/p1", e.demo, "", "")

		// Extra specs.
		es, err := flavors.CreateExtraSpecs(ctx, admin, "p1", flavors.ExtraSpecsOpts{"hw:cpu_policy": "dedicated", "k": "v"}).Extract()
		if err != nil || es["k"] != "v" {
			t.Fatalf("create specs %v %v", es, err)
		}
		if v, err := flavors.GetExtraSpec(ctx, admin, "p1", "k").Extract(); err != nil || v["k"] != "v" {
			t.Fatalf("get spec %v %v", v, err)
		}
		if v, err := flavors.UpdateExtraSpec(ctx, admin, "p1", flavors.ExtraSpecsOpts{"k": "w"}).Extract(); err != nil || v["k"] != "w" {
			t.Fatalf("update spec %v %v", v, err)
		}
		e.fault(400, "Request body and URI mismatch", "PUT", "/flavors/p1/os-extra_specs/k", e.admin, "", `{"j":"v"}`)
		e.fault(400, "too many items", "PUT", "/flavors/p1/os-extra_specs/k", e.admin, "", `{"k":"v","j":"v"}`)
		e.fault(400, "Validation failed", "POST", "/flavors/p1/os-extra_specs", e.admin, "2.86", `{"extra_specs":{"hw:cpu_policy":"sometimes"}}`)
		e.fault(403, "os-flavor-extra-specs:create", "POST", "/flavors/p1/os-extra_specs", e.demo, "", `{"extra_specs":{"a":"b"}}`)
		if err := flavors.DeleteExtraSpec(ctx, admin, "p1", "k").ExtractErr(); err != nil {
			t.Fatal(err)
		}
		e.fault(404, "Flavor p1 has no extra specs with key k.", "GET", "/flavors/p1/os-extra_specs/k", e.admin, "", "")
		e.fault(404, "Flavor p1 has no extra specs with key k.", "DELETE", "/flavors/p1/os-extra_specs/k", e.admin, "", "")
		e.fault(404, "Flavor nope could not be found.", "GET", "/flavors/nope/os-extra_specs", e.demo, "", "")

		// Description updates from 2.55.
		e.fault(404, "could not be found", "PUT", "/flavors/p1", e.admin, "", `{"flavor":{"description":"x"}}`)
		up := rsObj(e.must(200, "PUT", "/flavors/p1", e.admin, "2.61", `{"flavor":{"description":"new"}}`), "flavor")
		if up["description"] != "new" || up["extra_specs"] == nil {
			t.Errorf("updated %v", up)
		}
		e.fault(400, "Additional properties", "PUT", "/flavors/p1", e.admin, "2.55", `{"flavor":{"name":"x"}}`)
		e.fault(400, "'description' is a required property", "PUT", "/flavors/p1", e.admin, "2.55", `{"flavor":{}}`)

		if err := flavors.Delete(ctx, admin, "p1").ExtractErr(); err != nil {
			t.Fatal(err)
		}
		e.fault(404, "Flavor p1 could not be found.", "GET", "/flavors/p1", e.admin, "", "")
		e.fault(404, "Flavor p1 could not be found.", "DELETE", "/flavors/p1", e.admin, "", "")
		e.fault(403, "os-flavor-manage:delete", "DELETE", "/flavors/1", e.demo, "", "")
	})
}

// TestResourceJunkInput sends malformed bodies and query strings to every
// resource endpoint that takes input: each must answer 4xx, never 500.
func TestResourceJunkInput(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := rsStart(t, dbURL)
		demoProject, _ := e.c.Identity.ProjectByName(context.Background(), cloud.DemoProject)
		q := "/os-quota-sets/" + demoProject.ID
		targets := []struct{ method, path string }{
			{"POST", "/flavors"}, {"PUT", "/flavors/1"}, {"POST", "/flavors/1/os-extra_specs"},
			{"PUT", "/flavors/1/os-extra_specs/k"}, {"POST", "/flavors/1/action"}, {"POST", "/os-keypairs"},
			{"PUT", q}, {"PUT", "/os-services/disable"}, {"PUT", "/os-services/force-down"},
			{"PUT", "/os-services/00000000-0000-0000-0000-000000000000"},
		}
		bodies := []string{`null`, `[]`, `"x"`, `1`, `{}`, `{"x":1}`, `nope`, `{"flavor":null}`, `{"keypair":[]}`,
			`{"quota_set":{"cores":null}}`, `{"extra_specs":{"":"x"}}`, `{"addTenantAccess":null}`, `{"status":5}`,
			`{"host":1,"binary":[]}`, `{"flavor":{"name":"n","ram":1,"vcpus":1,"disk":0,"description":"a\u0000"}}`,
			`{"keypair":{"name":"k","public_key":"ssh-ed25519 AAAA\u0000"}}`, `{"extra_specs":{"k":"\u0000"}}`, `{"flavor":{"name":"n","ram":1e99,"vcpus":1,"disk":0}}`}
		for _, mv := range []string{"", "2.96"} {
			for _, tg := range targets {
				for _, b := range bodies {
					st, _, raw := e.call(tg.method, tg.path, e.admin, mv, b)
					if st < 400 || st >= 500 {
						t.Errorf("%s %s %s (mv %q): %d %s", tg.method, tg.path, b, mv, st, raw)
					}
				}
			}
		}
		for _, path := range []string{
			"/flavors?limit=1e3", "/flavors/detail?marker=%00", "/flavors?minRam=99999999999999999999",
			"/os-keypairs?limit=abc", "/os-hypervisors?limit=-5", "/os-hypervisors/%20", "/os-hypervisors/1.5",
			"/os-hypervisors/99999999999999999999", "/limits?tenant_id=%00", "/flavors/%00", "/flavors/%ff/os-extra_specs",
			"/os-keypairs/a%00", "/os-quota-sets/%00", "/os-quota-sets/x/detail?user_id=%ff", "/os-hypervisors/%00/search",
		} {
			for _, mv := range []string{"", "2.35", "2.96"} {
				if st, _, raw := e.call("GET", path, e.admin, mv, ""); st >= 500 {
					t.Errorf("GET %s (mv %q): %d %s", path, mv, st, raw)
				}
			}
		}
	})
}
