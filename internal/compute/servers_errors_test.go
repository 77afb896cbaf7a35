package compute_test

import (
	"context"
	"fmt"
	"nimbus/internal/store"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"nimbus/internal/cloud"
	"nimbus/internal/driver"
	"nimbus/internal/testenv"
)

// TestServerStateConflicts checks every action the state table forbids in
// ACTIVE and in SHUTOFF answers Nova's 409.
func TestServerStateConflicts(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		id := e.create(e.demo, "2.96", "")
		e.wait(id, e.demo, "ACTIVE")
		cases := []struct {
			state, body, action string
		}{
			{"active", `{"os-start":null}`, "start"},
			{"active", `{"unpause":null}`, "unpause"},
			{"active", `{"resume":null}`, "resume"},
			{"active", `{"confirmResize":null}`, "confirmResize"},
			{"active", `{"revertResize":null}`, "revertResize"},
			{"active", `{"shelveOffload":null}`, "shelveOffload"},
			{"active", `{"unshelve":null}`, "unshelve"},
			{"stopped", `{"os-stop":null}`, "stop"},
			{"stopped", `{"pause":null}`, "pause"},
			{"stopped", `{"suspend":null}`, "suspend"},
			{"stopped", `{"reboot":{"type":"SOFT"}}`, "reboot"},
			{"stopped", `{"os-start":null}`, ""}, // allowed: moves on to the next state
		}
		for _, tc := range cases {
			if tc.state == "stopped" && tc.action == "stop" {
				e.action(id, e.demo, "2.96", `{"os-stop":null}`, 202)
				e.wait(id, e.demo, "SHUTOFF")
			}
			if tc.action == "" {
				e.action(id, e.demo, "2.96", tc.body, 202)
				continue
			}
			st, m, _ := e.do("POST", "/servers/"+id+"/action", e.demo, "2.96", tc.body)
			want := fmt.Sprintf("Cannot '%s' instance %s while it is in vm_state %s", tc.action, id, tc.state)
			cr, _ := m["conflictingRequest"].(map[string]any)
			if st != 409 || cr == nil || cr["message"] != want || cr["code"].(float64) != 409 {
				t.Errorf("%s in %s: %d %v, want 409 %q", tc.body, tc.state, st, m, want)
			}
		}
		e.wait(id, e.demo, "ACTIVE")
		// A task in progress blocks other actions with task_state.
		e.action(id, e.demo, "2.96", `{"os-stop":null}`, 202)
		st, m, _ := e.do("POST", "/servers/"+id+"/action", e.demo, "2.96", `{"pause":null}`)
		if st != 409 && !(st == 409 || e.server(id, e.demo, "2.96")["status"] == "SHUTOFF") {
			t.Errorf("pause while powering-off: %d %v", st, m)
		}
		e.wait(id, e.demo, "SHUTOFF")
		// Metadata rules: update allowed in SHUTOFF.
		e.must(200, "POST", "/servers/"+id+"/metadata", e.demo, "2.96", `{"metadata":{"k":"v"}}`)
		// Unknown action and malformed action bodies.
		st, m, _ = e.do("POST", "/servers/"+id+"/action", e.demo, "2.96", `{"fly":null}`)
		if st != 400 || !strings.Contains(fmt.Sprint(m), "There is no such action: fly") {
			t.Errorf("unknown action: %d %v", st, m)
		}
		for _, b := range []string{`{`, `[]`, `{}`, `{"reboot":{}}`, `{"reboot":{"type":"MEDIUM"}}`, `{"resize":{}}`,
			`{"resize":{"flavorRef":"nope"}}`, `{"rebuild":{"imageRef":"x"}}`, `{"createImage":{}}`, `{"lock":{"bad":1}}`,
			`{"os-getConsoleOutput":{"length":"x"}}`} {
			st, m, _ := e.do("POST", "/servers/"+id+"/action", e.demo, "2.96", b)
			if st != 400 {
				t.Errorf("action %s: %d %v, want 400", b, st, m)
			}
		}
	})
}

// TestServerBadInput checks that malformed creates are 400s, never 500s.
func TestServerBadInput(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		img, fl := e.imageID, e.flavorID
		srv := func(fields string) string {
			return `{"server":{` + fields + `}}`
		}
		ok := fmt.Sprintf(`"imageRef":%q,"flavorRef":%q,"networks":"auto"`, img, fl)
		cases := []struct {
			name, mv, body string
			status         int
			msg            string
		}{
			{"bad json", "2.96", `{"server":`, 400, "Malformed request body"},
			{"not object", "2.96", `[1]`, 400, ""},
			{"unknown top field", "2.96", `{"server":{"name":"a",` + ok + `},"x":1}`, 400, "Additional properties"},
			{"unknown field", "2.96", srv(`"name":"a","bogus":1,` + ok), 400, "Additional properties are not allowed ('bogus' was unexpected)"},
			{"no name", "2.96", srv(ok), 400, "'name' is a required property"},
			{"empty name", "2.96", srv(`"name":"",` + ok), 400, ""},
			{"blank name", "2.96", srv(`"name":"   ",` + ok), 400, ""},
			{"long name", "2.96", srv(`"name":"` + strings.Repeat("a", 256) + `",` + ok), 400, ""},
			{"no flavor", "2.96", srv(fmt.Sprintf(`"name":"a","imageRef":%q,"networks":"auto"`, img)), 400, "'flavorRef' is a required property"},
			{"no networks at 2.37", "2.37", srv(fmt.Sprintf(`"name":"a","imageRef":%q,"flavorRef":%q`, img, fl)), 400, "'networks' is a required property"},
			{"unknown flavor", "2.96", srv(fmt.Sprintf(`"name":"a","imageRef":%q,"flavorRef":"nope","networks":"auto"`, img)), 400, "Flavor nope could not be found."},
			{"unknown image", "2.96", srv(fmt.Sprintf(`"name":"a","imageRef":"11111111-2222-3333-4444-555555555555","flavorRef":%q,"networks":"auto"`, fl)), 400, "Can not find requested image"},
			{"bad image uuid", "2.96", srv(fmt.Sprintf(`"name":"a","imageRef":"zzz","flavorRef":%q,"networks":"auto"`, fl)), 400, ""},
			{"bad network uuid", "2.96", srv(fmt.Sprintf(`"name":"a","imageRef":%q,"flavorRef":%q,"networks":[{"uuid":"nope"}]`, img, fl)), 400, "Invalid input for field/attribute uuid"},
			{"unknown network", "2.96", srv(fmt.Sprintf(`"name":"a","imageRef":%q,"flavorRef":%q,"networks":[{"uuid":"11111111-2222-3333-4444-555555555555"}]`, img, fl)), 400, "could not be found"},
			{"bad networks string", "2.96", srv(fmt.Sprintf(`"name":"a","imageRef":%q,"flavorRef":%q,"networks":"some"`, img, fl)), 400, ""},
			{"unknown key", "2.96", srv(`"name":"a","key_name":"nokey",` + ok), 400, "Invalid key_name provided."},
			{"bad user_data", "2.96", srv(`"name":"a","user_data":"@@@",` + ok), 400, "User data needs to be valid base 64."},
			{"min > max", "2.96", srv(`"name":"a","min_count":3,"max_count":2,` + ok), 400, "min_count must be <= max_count"},
			{"zero count", "2.96", srv(`"name":"a","min_count":0,` + ok), 400, ""},
			{"bad count", "2.96", srv(`"name":"a","min_count":"x",` + ok), 400, ""},
			{"unknown az", "2.96", srv(`"name":"a","availability_zone":"mars",` + ok), 400, "availability zone"},
			{"volume bdm", "2.96", srv(fmt.Sprintf(`"name":"a","flavorRef":%q,"networks":"auto","block_device_mapping_v2":[{"source_type":"volume","uuid":%q,"destination_type":"volume","boot_index":0}]`, fl, img)), 400, "Block Device Mapping is Invalid: failed to get volume " + img + "."},
			{"description before 2.19", "2.18", srv(`"name":"a","description":"x",` + fmt.Sprintf(`"imageRef":%q,"flavorRef":%q`, img, fl)), 400, "Additional properties"},
			{"hostname with max_count", "2.96", srv(`"name":"a","hostname":"h","max_count":2,` + ok), 400, ""},
			{"bad hostname", "2.96", srv(`"name":"a","hostname":"-bad-",` + ok), 400, ""},
			{"bad tag", "2.96", srv(`"name":"a","tags":["a/b"],` + ok), 400, ""},
			{"metadata not strings", "2.96", srv(`"name":"a","metadata":{"a":1},` + ok), 400, ""},
			{"bad access ip", "2.96", srv(`"name":"a","accessIPv4":"1.2.3",` + ok), 400, ""},
			{"bad disk config", "2.96", srv(`"name":"a","OS-DCF:diskConfig":"WHAT",` + ok), 400, ""},
			{"oversized", "2.96", `{"server":{"name":"` + strings.Repeat("a", 200000) + `"}}`, 413, ""},
		}
		for _, tc := range cases {
			st, m, _ := e.do("POST", "/servers", e.demo, tc.mv, tc.body)
			if st != tc.status || (tc.msg != "" && !strings.Contains(fmt.Sprint(m), tc.msg)) {
				t.Errorf("%s: %d %v, want %d %q", tc.name, st, m, tc.status, tc.msg)
			}
		}
		// Microversions.
		if st, _, _ := e.do("GET", "/servers", e.demo, "2.999", ""); st != 406 {
			t.Errorf("2.999: %d", st)
		}
		if st, _, _ := e.do("GET", "/servers", e.demo, "x.y", ""); st != 400 {
			t.Errorf("x.y: %d", st)
		}
		// Lists: bad params.
		for _, q := range []string{"limit=-1", "limit=x", "marker=nope", "sort_key=bogus", "sort_dir=up", "status=WHAT", "bogus=1", "changes-since=yesterday"} {
			if st, m, _ := e.do("GET", "/servers/detail?"+q, e.demo, "2.96", ""); st != 400 {
				t.Errorf("list ?%s: %d %v", q, st, m)
			}
		}
		// Before 2.75 unknown parameters are ignored; before 2.38 a bad status is an empty list.
		if m := e.must(200, "GET", "/servers/detail?bogus=1&status=WHAT", e.demo, "2.1", ""); len(m["servers"].([]any)) != 0 {
			t.Errorf("2.1 bad status: %v", m)
		}
		// Unknown and non-UUID servers are 404.
		for _, id := range []string{"11111111-2222-3333-4444-555555555555", "not-a-uuid"} {
			st, m, _ := e.do("GET", "/servers/"+id, e.demo, "2.96", "")
			if st != 404 || !strings.Contains(fmt.Sprint(m), "Instance "+id+" could not be found.") {
				t.Errorf("GET %s: %d %v", id, st, m)
			}
		}
		if st, _, _ := e.do("GET", "/servers?all_tenants=1", e.demo, "2.96", ""); st != 403 {
			t.Errorf("all_tenants as member: %d", st)
		}
	})
}

// TestServerIsolation: demo cannot see or touch the admin project's server.
func TestServerIsolation(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		id := e.create(e.admin, "2.96", "")
		e.wait(id, e.admin, "ACTIVE")
		for _, c := range []struct{ method, path, body string }{
			{"GET", "/servers/" + id, ""},
			{"PUT", "/servers/" + id, `{"server":{"name":"x"}}`},
			{"DELETE", "/servers/" + id, ""},
			{"POST", "/servers/" + id + "/action", `{"os-stop":null}`},
			{"GET", "/servers/" + id + "/metadata", ""},
			{"GET", "/servers/" + id + "/os-instance-actions", ""},
			{"GET", "/servers/" + id + "/tags", ""},
		} {
			if st, m, _ := e.do(c.method, c.path, e.demo, "2.96", c.body); st != 404 {
				t.Errorf("demo %s %s: %d %v", c.method, c.path, st, m)
			}
		}
		l := e.must(200, "GET", "/servers/detail", e.demo, "2.96", "")["servers"].([]any)
		if len(l) != 0 {
			t.Errorf("demo sees %d servers", len(l))
		}
		l = e.must(200, "GET", "/servers/detail?all_tenants=1", e.admin, "2.96", "")["servers"].([]any)
		if len(l) != 1 {
			t.Errorf("admin all_tenants sees %d servers", len(l))
		}
		if st, _, _ := e.do("GET", "/os-simple-tenant-usage", e.demo, "2.96", ""); st != 403 {
			t.Errorf("usage list as member: %d", st)
		}
		start := time.Now().UTC().Add(-time.Hour).Format("2006-01-02T15:04:05")
		u := e.must(200, "GET", "/os-simple-tenant-usage?detailed=1&start="+start, e.admin, "2.96", "")["tenant_usages"].([]any)
		if len(u) != 1 || len(u[0].(map[string]any)["server_usages"].([]any)) != 1 {
			t.Errorf("usage: %v", u)
		}
		su := u[0].(map[string]any)["server_usages"].([]any)[0].(map[string]any)
		if su["instance_id"] != id || su["state"] != "active" || su["flavor"] != "m1.small" || su["hours"].(float64) <= 0 {
			t.Errorf("server usage: %v", su)
		}
		// 2.40 pages by server: a full page carries a next link.
		pg := e.must(200, "GET", "/os-simple-tenant-usage?limit=1&start="+start, e.admin, "2.40", "")
		if pg["tenant_usages_links"] == nil {
			t.Errorf("usage page without links: %v", pg)
		}
		var demoProject string
		e.c.DB.QueryRow(context.Background(), "SELECT id FROM projects WHERE name = 'demo'").Scan(&demoProject)
		if m := e.must(200, "GET", "/os-simple-tenant-usage/"+demoProject+"?start="+start, e.demo, "2.96", ""); len(m["tenant_usage"].(map[string]any)) != 0 {
			t.Errorf("demo usage: %v", m)
		}
	})
}

// TestServerQuotaAndNoHost: quota 403, batch fitting, and NoValidHost.
func TestServerQuotaAndNoHost(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		small := func(cfg *cloud.Config) {
			cfg.Fleet = []driver.Host{{Name: "tiny-1", VCPUs: 2, MemoryMB: 8192, DiskGB: 100, Zone: "nova", Up: true, Hypervisor: "fake"}}
		}
		e := newEnv(t, dbURL, small)
		// m1.small is 1 vCPU: two fit on the host. Beyond min_count, as many
		// as fit are made; then one more has no host.
		body := fmt.Sprintf(`{"server":{"name":"q","imageRef":%q,"flavorRef":"2","networks":"none","min_count":1,"max_count":3}}`, e.imageID)
		e.must(202, "POST", "/servers", e.demo, "2.96", body)
		l := e.must(200, "GET", "/servers/detail?name=^q-", e.demo, "2.96", "")["servers"].([]any)
		if len(l) != 2 {
			t.Fatalf("batch of %d, want the 2 that fit", len(l))
		}
		body = fmt.Sprintf(`{"server":{"name":"r","imageRef":%q,"flavorRef":"2","networks":"none"}}`, e.imageID)
		id := e.must(202, "POST", "/servers", e.demo, "2.96", body)["server"].(map[string]any)["id"].(string)
		var errored map[string]any
		deadline := time.Now().Add(10 * time.Second)
		for {
			s := e.server(id, e.demo, "2.96")
			if s["status"] == "ERROR" {
				errored = s
				break
			}
			if s["status"] == "ACTIVE" || time.Now().After(deadline) {
				break
			}
			time.Sleep(15 * time.Millisecond)
		}
		if errored == nil {
			t.Fatalf("no server went to ERROR")
		}
		f, _ := errored["fault"].(map[string]any)
		if f == nil || f["code"].(float64) != 500 || f["message"] != "No valid host was found. There are not enough hosts available." || f["created"] == nil {
			t.Errorf("fault: %v", errored["fault"])
		}
		// Quota: default 10 instances; 3 used. min_count 8 cannot fit.
		body = fmt.Sprintf(`{"server":{"name":"big","imageRef":%q,"flavorRef":"2","networks":"none","min_count":8}}`, e.imageID)
		st, m, _ := e.do("POST", "/servers", e.demo, "2.96", body)
		if st != 403 || !strings.Contains(fmt.Sprint(m), "Quota exceeded for instances: Requested 8, but already used 3 of 10 instances") {
			t.Errorf("quota: %d %v", st, m)
		}
	})
}

// TestServerResumesAfterRestart: a build interrupted by a restart finishes.
func TestServerResumesAfterRestart(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		dir := t.TempDir()
		slow := func(cfg *cloud.Config) { cfg.DataDir = dir; cfg.FakeDelay = 300 * time.Millisecond }
		e := newEnv(t, dbURL, slow)
		id := e.create(e.demo, "2.96", "")
		time.Sleep(50 * time.Millisecond)
		e.c.Close()
		// The build was cut short: the store still has it building.
		db, err := store.Open(context.Background(), dbURLOrFile(dbURL, dir))
		if err != nil {
			t.Fatal(err)
		}
		var vm string
		db.QueryRow(context.Background(), "SELECT vm_state FROM compute_servers WHERE id = ?", id).Scan(&vm)
		db.Close()
		if vm != "building" {
			t.Fatalf("vm_state %q at restart; the test needs an unfinished build", vm)
		}
		e2 := newEnv(t, dbURL, func(cfg *cloud.Config) { cfg.DataDir = dir; cfg.FakeDelay = 20 * time.Millisecond })
		e2.wait(id, e2.demo, "ACTIVE")
	})
}

// TestServerAdminPlacement: 2.74 create on a named host, 2.91 unshelve to a
// named host, deleted servers for admins, instance-action paging (2.58).
func TestServerAdminPlacement(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		img := e.imageID
		body := fmt.Sprintf(`{"server":{"name":"pinned","imageRef":%q,"flavorRef":"2","networks":"none","host":"fake-host-3"}}`, img)
		if st, m, _ := e.do("POST", "/servers", e.demo, "2.74", body); st != 403 {
			t.Errorf("member with host: %d %v", st, m)
		}
		if st, m, _ := e.do("POST", "/servers", e.admin, "2.73", body); st != 400 {
			t.Errorf("host before 2.74: %d %v", st, m)
		}
		bad := strings.Replace(body, "fake-host-3", "nowhere", 1)
		if st, m, _ := e.do("POST", "/servers", e.admin, "2.74", bad); st != 400 {
			t.Errorf("unknown host: %d %v", st, m)
		}
		id := e.must(202, "POST", "/servers", e.admin, "2.74", body)["server"].(map[string]any)["id"].(string)
		if s := e.wait(id, e.admin, "ACTIVE"); s["OS-EXT-SRV-ATTR:host"] != "fake-host-3" {
			t.Errorf("host %v, want fake-host-3", s["OS-EXT-SRV-ATTR:host"])
		}
		e.action(id, e.admin, "2.96", `{"shelve":null}`, 202)
		e.wait(id, e.admin, "SHELVED_OFFLOADED")
		e.action(id, e.admin, "2.96", `{"unshelve":{"host":"fake-host-1"}}`, 202)
		if s := e.wait(id, e.admin, "ACTIVE"); s["OS-EXT-SRV-ATTR:host"] != "fake-host-1" {
			t.Errorf("unshelved on %v, want fake-host-1", s["OS-EXT-SRV-ATTR:host"])
		}
		// Paging of instance actions from 2.58.
		page := e.must(200, "GET", "/servers/"+id+"/os-instance-actions?limit=2", e.admin, "2.58", "")
		if acts := page["instanceActions"].([]any); len(acts) != 2 || page["links"] == nil {
			t.Errorf("actions page: %v", page)
		}
		// Deleted servers: 404 on show, listed for admins with deleted=true.
		e.must(204, "DELETE", "/servers/"+id, e.admin, "2.96", "")
		deadline := time.Now().Add(10 * time.Second)
		for {
			if st, _, _ := e.do("GET", "/servers/"+id, e.admin, "2.96", ""); st == 404 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("not deleted")
			}
			time.Sleep(15 * time.Millisecond)
		}
		l := e.must(200, "GET", "/servers/detail?deleted=true", e.admin, "2.96", "")["servers"].([]any)
		if len(l) != 1 || l[0].(map[string]any)["status"] != "DELETED" || l[0].(map[string]any)["OS-SRV-USG:terminated_at"] == nil {
			t.Errorf("deleted list: %v", l)
		}
		// The actions of a deleted server stay readable (2.21).
		e.must(200, "GET", "/servers/"+id+"/os-instance-actions", e.admin, "2.21", "")
	})
}

// dbURLOrFile is the database a cloud in dir uses for dbURL ("" = SQLite in dir).
func dbURLOrFile(dbURL, dir string) string {
	if dbURL == "" {
		return filepath.Join(dir, "nimbus.db")
	}
	return dbURL
}
