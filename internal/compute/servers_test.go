package compute_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"

	"nimbus/internal/cloud"
	"nimbus/internal/testenv"
)

// env is one running cloud with raw HTTP access for both users.
type env struct {
	t        *testing.T
	c        *cloud.Cloud
	client   *http.Client
	admin    string
	demo     string
	imageID  string
	flavorID string
}

func newEnv(t *testing.T, dbURL string, opts ...testenv.Options) *env {
	t.Helper()
	c := testenv.StartCloud(t, dbURL, opts...)
	e := &env{t: t, c: c, client: testenv.HTTPClient(t, c), flavorID: "2"}
	e.admin = testenv.Token(t, c, cloud.AdminUser)
	e.demo = testenv.Token(t, c, cloud.DemoUser)
	if err := c.DB.QueryRow(context.Background(), "SELECT id FROM images WHERE name = ?", "Debian 12").Scan(&e.imageID); err != nil {
		t.Fatalf("no Debian 12 image: %v", err)
	}
	return e
}

// do sends a request at microversion mv and decodes a JSON answer.
func (e *env) do(method, path, tok, mv, body string) (int, map[string]any, http.Header) {
	e.t.Helper()
	hdr := []string{}
	if mv != "" {
		hdr = append(hdr, "OpenStack-API-Version", "compute "+mv)
	}
	resp, raw := testenv.Do(e.t, e.client, method, e.c.ComputeURL+path, tok, body, hdr...)
	var m map[string]any
	if strings.TrimSpace(raw) != "" {
		if err := json.Unmarshal([]byte(raw), &m); err != nil {
			e.t.Fatalf("%s %s: non-JSON body %q", method, path, raw)
		}
	}
	if resp.StatusCode >= 500 {
		e.t.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, raw)
	}
	return resp.StatusCode, m, resp.Header
}

func (e *env) must(want int, method, path, tok, mv, body string) map[string]any {
	e.t.Helper()
	st, m, _ := e.do(method, path, tok, mv, body)
	if st != want {
		e.t.Fatalf("%s %s %s: status %d, want %d: %v", method, path, body, st, want, m)
	}
	return m
}

func (e *env) server(id, tok, mv string) map[string]any {
	e.t.Helper()
	return e.must(200, "GET", "/servers/"+id, tok, mv, "")["server"].(map[string]any)
}

// wait polls a server until its status is want; ERROR fails the test
// unless it is wanted.
func (e *env) wait(id, tok, want string) map[string]any {
	e.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	var last map[string]any
	for time.Now().Before(deadline) {
		last = e.server(id, tok, "2.96")
		st := last["status"].(string)
		if st == want && last["OS-EXT-STS:task_state"] == nil {
			return last
		}
		if st == "ERROR" && want != "ERROR" {
			e.t.Fatalf("server %s went to ERROR: %v", id, last["fault"])
		}
		time.Sleep(15 * time.Millisecond)
	}
	e.t.Fatalf("server %s: status %v task %v, want %s", id, last["status"], last["OS-EXT-STS:task_state"], want)
	return nil
}

func (e *env) create(tok, mv, extra string) string {
	e.t.Helper()
	nets := ""
	if mv != "" && mv != "2.1" {
		nets = `,"networks":"auto"`
	}
	body := fmt.Sprintf(`{"server":{"name":"s1","imageRef":%q,"flavorRef":%q%s%s}}`, e.imageID, e.flavorID, nets, extra)
	m := e.must(202, "POST", "/servers", tok, mv, body)
	return m["server"].(map[string]any)["id"].(string)
}

func (e *env) action(id, tok, mv, body string, want int) map[string]any {
	e.t.Helper()
	return e.must(want, "POST", "/servers/"+id+"/action", tok, mv, body)
}

// TestServerLife walks a customer's server through every action, at 2.1
// and at the highest microversion.
func TestServerLife(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		for _, mv := range []string{"2.1", "2.96"} {
			t.Run(mv, func(t *testing.T) {
				e.t = t
				defer func() { e.t = t }()
				serverLife(t, e, mv)
			})
		}
	})
}

func serverLife(t *testing.T, e *env, mv string) {
	// Create two with min/max count through gophercloud and wait ACTIVE.
	pc := testenv.Provider(t, e.c, cloud.DemoUser)
	sc := testenv.Compute(t, pc, mv)
	base := "life" + strings.ReplaceAll(mv, ".", "")
	opts := servers.CreateOpts{Name: base, ImageRef: e.imageID, FlavorRef: e.flavorID, Min: 2, Max: 2}
	if mv != "2.1" {
		opts.Networks = "auto"
	}
	srv, err := servers.Create(context.Background(), sc, opts, nil).Extract()
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if len(srv.AdminPass) != 12 {
		t.Errorf("adminPass %q", srv.AdminPass)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := servers.WaitForStatus(ctx, sc, srv.ID, "ACTIVE"); err != nil {
		t.Fatalf("wait ACTIVE: %v", err)
	}
	got, err := servers.Get(context.Background(), sc, srv.ID).Extract()
	if err != nil {
		t.Fatalf("get: %v", err)
	}
	if got.Name != base+"-1" && got.Name != base+"-2" {
		t.Errorf("name %q, want %s-1 or -2", got.Name, base)
	}
	list := e.must(200, "GET", "/servers/detail?name=^"+base+"-", e.demo, mv, "")["servers"].([]any)
	if len(list) != 2 {
		t.Fatalf("list %s-: %d servers", base, len(list))
	}
	rid := ""
	for _, x := range list {
		s := x.(map[string]any)
		if rid == "" {
			e.wait(s["id"].(string), e.demo, "ACTIVE")
		}
		_ = rid
	}
	id := srv.ID
	s := e.server(id, e.demo, mv)
	if s["OS-SRV-USG:launched_at"] == nil || s["OS-EXT-STS:power_state"].(float64) != 1 {
		t.Fatalf("active server: %v", s)
	}
	if _, ok := s["OS-EXT-SRV-ATTR:host"]; ok {
		t.Errorf("non-admin sees OS-EXT-SRV-ATTR:host")
	}
	// Admin sees the host.
	if a := e.server(id, e.admin, mv); a["OS-EXT-SRV-ATTR:host"] == nil || a["hostId"] == "" {
		t.Errorf("admin view lacks host: %v", a["OS-EXT-SRV-ATTR:host"])
	}

	e.action(id, e.demo, mv, `{"os-stop":null}`, 202)
	if s := e.wait(id, e.demo, "SHUTOFF"); s["OS-EXT-STS:power_state"].(float64) != 4 {
		t.Errorf("power after stop: %v", s["OS-EXT-STS:power_state"])
	}
	e.action(id, e.demo, mv, `{"os-start":null}`, 202)
	e.wait(id, e.demo, "ACTIVE")
	e.action(id, e.demo, mv, `{"reboot":{"type":"SOFT"}}`, 202)
	e.wait(id, e.demo, "ACTIVE")
	e.action(id, e.demo, mv, `{"reboot":{"type":"HARD"}}`, 202)
	e.wait(id, e.demo, "ACTIVE")
	e.action(id, e.demo, mv, `{"pause":null}`, 202)
	if s := e.wait(id, e.demo, "PAUSED"); s["OS-EXT-STS:power_state"].(float64) != 3 {
		t.Errorf("power after pause: %v", s["OS-EXT-STS:power_state"])
	}
	e.action(id, e.demo, mv, `{"unpause":null}`, 202)
	e.wait(id, e.demo, "ACTIVE")
	e.action(id, e.demo, mv, `{"suspend":null}`, 202)
	if s := e.wait(id, e.demo, "SUSPENDED"); s["OS-EXT-STS:power_state"].(float64) != 7 {
		t.Errorf("power after suspend: %v", s["OS-EXT-STS:power_state"])
	}
	e.action(id, e.demo, mv, `{"resume":null}`, 202)
	e.wait(id, e.demo, "ACTIVE")

	// Lock: the admin locks, the owner cannot act.
	lockBody := `{"lock":null}`
	if mv == "2.96" {
		lockBody = `{"lock":{"locked_reason":"maintenance"}}`
	}
	e.action(id, e.admin, mv, lockBody, 202)
	st, m, _ := e.do("POST", "/servers/"+id+"/action", e.demo, mv, `{"os-stop":null}`)
	if st != 409 || !strings.Contains(fmt.Sprint(m), "is locked") {
		t.Errorf("stop locked: %d %v", st, m)
	}
	if mv == "2.96" {
		if s := e.server(id, e.demo, mv); s["locked"] != true || s["locked_reason"] != "maintenance" {
			t.Errorf("locked view: %v %v", s["locked"], s["locked_reason"])
		}
	}
	e.action(id, e.admin, mv, `{"unlock":null}`, 202)

	// Shelve and unshelve.
	e.action(id, e.demo, mv, `{"shelve":null}`, 202)
	e.wait(id, e.demo, "SHELVED_OFFLOADED")
	if a := e.server(id, e.admin, mv); a["OS-EXT-SRV-ATTR:host"] != nil {
		t.Errorf("offloaded server keeps host %v", a["OS-EXT-SRV-ATTR:host"])
	}
	e.action(id, e.demo, mv, `{"unshelve":null}`, 202)
	e.wait(id, e.demo, "ACTIVE")

	// Resize and confirm, resize and revert.
	e.action(id, e.demo, mv, `{"resize":{"flavorRef":"3"}}`, 202)
	e.wait(id, e.demo, "VERIFY_RESIZE")
	e.action(id, e.demo, mv, `{"confirmResize":null}`, 204)
	e.wait(id, e.demo, "ACTIVE")
	s = e.server(id, e.demo, mv)
	if mv == "2.1" && s["flavor"].(map[string]any)["id"] != "3" {
		t.Errorf("flavor after confirm: %v", s["flavor"])
	}
	if mv == "2.96" && s["flavor"].(map[string]any)["vcpus"].(float64) != 2 {
		t.Errorf("flavor after confirm: %v", s["flavor"])
	}
	e.action(id, e.demo, mv, `{"resize":{"flavorRef":"d2.4g.local"}}`, 202)
	e.wait(id, e.demo, "VERIFY_RESIZE")
	e.action(id, e.demo, mv, `{"revertResize":null}`, 202)
	e.wait(id, e.demo, "ACTIVE")
	s = e.server(id, e.demo, mv)
	if mv == "2.1" && s["flavor"].(map[string]any)["id"] != "3" {
		t.Errorf("flavor after revert: %v", s["flavor"])
	}

	// Rebuild answers the full server.
	rb := e.action(id, e.demo, mv, fmt.Sprintf(`{"rebuild":{"imageRef":%q,"name":"rebuilt"}}`, e.imageID), 202)
	if rs := rb["server"].(map[string]any); rs["name"] != "rebuilt" || rs["adminPass"] == nil {
		t.Errorf("rebuild body: %v", rs)
	}
	e.wait(id, e.demo, "ACTIVE")

	// createImage: Location before 2.45, body after.
	st, m, hdr := e.do("POST", "/servers/"+id+"/action", e.demo, mv, `{"createImage":{"name":"snap"}}`)
	if st != 202 {
		t.Fatalf("createImage: %d %v", st, m)
	}
	if mv == "2.1" && !strings.Contains(hdr.Get("Location"), "/images/") {
		t.Errorf("createImage Location %q", hdr.Get("Location"))
	}
	if mv == "2.96" && m["image_id"] == nil {
		t.Errorf("createImage body %v", m)
	}
	e.wait(id, e.demo, "ACTIVE")

	// Console output.
	out := e.action(id, e.demo, mv, `{"os-getConsoleOutput":{"length":5}}`, 200)
	if _, ok := out["output"].(string); !ok {
		t.Errorf("console: %v", out)
	}

	// Metadata.
	e.must(200, "POST", "/servers/"+id+"/metadata", e.demo, mv, `{"metadata":{"a":"1","b":"2"}}`)
	e.must(200, "PUT", "/servers/"+id+"/metadata/c", e.demo, mv, `{"meta":{"c":"3"}}`)
	e.must(204, "DELETE", "/servers/"+id+"/metadata/a", e.demo, mv, "")
	md := e.must(200, "GET", "/servers/"+id+"/metadata", e.demo, mv, "")["metadata"].(map[string]any)
	if len(md) != 2 || md["b"] != "2" || md["c"] != "3" {
		t.Errorf("metadata %v", md)
	}
	e.must(404, "GET", "/servers/"+id+"/metadata/a", e.demo, mv, "")

	// Tags from 2.26.
	if mv == "2.96" {
		e.must(201, "PUT", "/servers/"+id+"/tags/blue", e.demo, mv, "")
		e.must(204, "PUT", "/servers/"+id+"/tags/blue", e.demo, mv, "")
		e.must(200, "PUT", "/servers/"+id+"/tags", e.demo, mv, `{"tags":["red","blue"]}`)
		e.must(204, "GET", "/servers/"+id+"/tags/red", e.demo, mv, "")
		l := e.must(200, "GET", "/servers/detail?tags=red", e.demo, mv, "")["servers"].([]any)
		if len(l) != 1 {
			t.Errorf("tags filter: %d", len(l))
		}
		e.must(204, "DELETE", "/servers/"+id+"/tags/red", e.demo, mv, "")
	} else {
		e.must(404, "GET", "/servers/"+id+"/tags", e.demo, mv, "")
	}

	// Update.
	up := `{"server":{"name":"renamed"}}`
	if mv == "2.96" {
		up = `{"server":{"name":"renamed","description":"d","hostname":"renamed-host"}}`
	}
	us := e.must(200, "PUT", "/servers/"+id, e.demo, mv, up)["server"].(map[string]any)
	if us["name"] != "renamed" || (mv == "2.96" && (us["description"] != "d" || us["OS-EXT-SRV-ATTR:hostname"] != "renamed-host")) {
		t.Errorf("update: %v", us)
	}

	// Instance actions record it all.
	acts := e.must(200, "GET", "/servers/"+id+"/os-instance-actions", e.demo, mv, "")["instanceActions"].([]any)
	if len(acts) < 15 {
		t.Errorf("instance actions: %d", len(acts))
	}
	first := acts[len(acts)-1].(map[string]any)
	if first["action"] != "create" {
		t.Errorf("oldest action %v", first["action"])
	}
	act := e.must(200, "GET", "/servers/"+id+"/os-instance-actions/"+first["request_id"].(string), e.demo, mv, "")["instanceAction"].(map[string]any)
	if mv == "2.96" {
		if evs, _ := act["events"].([]any); len(evs) == 0 {
			t.Errorf("create action has no events: %v", act)
		}
	}

	// Demo's server is invisible to another project's non-admin: admin
	// project's server is invisible to demo.
	// Delete both: 204, then 404.
	for _, x := range list {
		sid := x.(map[string]any)["id"].(string)
		e.must(204, "DELETE", "/servers/"+sid, e.demo, mv, "")
	}
	for _, x := range list {
		sid := x.(map[string]any)["id"].(string)
		deadline := time.Now().Add(10 * time.Second)
		for {
			st, _, _ := e.do("GET", "/servers/"+sid, e.demo, mv, "")
			if st == 404 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("server %s not gone after delete", sid)
			}
			time.Sleep(15 * time.Millisecond)
		}
	}
	_ = gophercloud.ErrResourceNotFound{}
}
