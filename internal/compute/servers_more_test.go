package compute_test

import (
	"strings"
	"testing"
	"time"

	"nimbus/internal/testenv"
)

// TestServerIPs covers GET /servers/{id}/ips[/{network}].
func TestServerIPs(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		id := e.create(e.demo, "2.1", `,"accessIPv6":"0000:0000:0000:0000:0000:babe:220.12.22.2"`)
		e.wait(id, e.demo, "ACTIVE")

		ips := e.must(200, "GET", "/servers/"+id+"/ips", e.demo, "", "")["addresses"].(map[string]any)
		priv, ok := ips["private"].([]any)
		if !ok || len(priv) != 1 {
			t.Fatalf("ips: %v", ips)
		}
		if a := priv[0].(map[string]any); a["version"] != 4.0 || a["addr"] == "" || a["OS-EXT-IPS:type"] != nil {
			t.Errorf("ips entry %v", a)
		}
		e.must(200, "GET", "/servers/"+id+"/ips/private", e.demo, "", "")
		e.must(404, "GET", "/servers/"+id+"/ips/nowhere", e.demo, "", "")
	})
}

// TestServerViewsAndActions covers calls Tempest makes that the life tests
// do not: empty pages, canonical IPv6 access addresses, the reduced update
// view before 2.75, restore and forceDelete, and console output tails.
func TestServerViewsAndActions(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		id := e.create(e.demo, "2.1", `,"accessIPv6":"0000:0000:0000:0000:0000:babe:220.12.22.2"`)
		e.wait(id, e.demo, "ACTIVE")

		if got := e.server(id, e.demo, "")["accessIPv6"]; got != "::babe:dc0c:1602" {
			t.Errorf("accessIPv6 = %v, want Nova's compact form", got)
		}
		if l := e.must(200, "GET", "/servers?limit=0", e.demo, "", "")["servers"].([]any); len(l) != 0 {
			t.Errorf("limit=0 gave %d servers", len(l))
		}

		// Before 2.75 PUT answers Nova's reduced view; from 2.75 the full one.
		for _, tt := range []struct {
			mv   string
			full bool
		}{{"2.1", false}, {"2.74", false}, {"2.75", true}} {
			s := e.must(200, "PUT", "/servers/"+id, e.demo, tt.mv, `{"server":{"name":"renamed"}}`)["server"].(map[string]any)
			_, hasStatus := s["OS-EXT-STS:vm_state"]
			_, hasKey := s["key_name"]
			if hasStatus != tt.full || hasKey != tt.full || s["name"] != "renamed" {
				t.Errorf("%s: update view has vm_state %v key_name %v, want %v", tt.mv, hasStatus, hasKey, tt.full)
			}
		}

		// Rebuild shows key_name from 2.54 and user_data from 2.57.
		for _, tt := range []struct {
			mv            string
			key, userData bool
		}{{"2.1", false, false}, {"2.54", true, false}, {"2.57", true, true}} {
			s := e.action(id, e.demo, tt.mv, `{"rebuild":{"imageRef":"`+e.imageID+`"}}`, 202)["server"].(map[string]any)
			_, hasKey := s["key_name"]
			_, hasUD := s["user_data"]
			if hasKey != tt.key || hasUD != tt.userData || s["adminPass"] == nil {
				t.Errorf("%s: rebuild view has key_name %v user_data %v adminPass %v", tt.mv, hasKey, hasUD, s["adminPass"] != nil)
			}
			e.wait(id, e.demo, "ACTIVE")
		}

		e.action(id, e.demo, "", `{"restore":null}`, 409)
		out := e.action(id, e.demo, "", `{"os-getConsoleOutput":{"length":3}}`, 200)["output"].(string)
		if n := len(strings.Split(out, "\n")); n != 3 {
			t.Errorf("console length 3 gave %d lines: %q", n, out)
		}
		e.action(id, e.demo, "", `{"forceDelete":null}`, 202)
		waitGone(t, e, id)
		e.action(id, e.demo, "", `{"restore":null}`, 404)
	})
}

func TestLegacyVersionDocument(t *testing.T) {
	e := newEnv(t, "")
	resp, body := testenv.Do(t, e.client, "GET", strings.TrimSuffix(e.c.ComputeURL, "/v2.1")+"/v2/", "", "")
	testenv.MustStatus(t, resp, body, 200)
	if !strings.Contains(body, `"id":"v2.0"`) {
		t.Errorf("v2 document: %s", body)
	}
}

func waitGone(t *testing.T, e *env, id string) {
	t.Helper()
	for range 400 {
		if st, _, _ := e.do("GET", "/servers/"+id, e.demo, "", ""); st == 404 {
			return
		}
		time.Sleep(15 * time.Millisecond)
	}
	t.Fatalf("server %s still there", id)
}

// TestImageProxy covers Nova's image proxy: served up to 2.35 only,
// snapshots carry their server, and only the owner deletes.
func TestImageProxy(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		imgs := e.must(200, "GET", "/images/detail", e.demo, "", "")["images"].([]any)
		if len(imgs) < 8 {
			t.Fatalf("proxy lists %d images", len(imgs))
		}
		e.must(404, "GET", "/images/detail", e.demo, "2.36", "")
		img := e.must(200, "GET", "/images/"+e.imageID, e.demo, "2.35", "")["image"].(map[string]any)
		if img["status"] != "ACTIVE" || img["progress"] != 100.0 || img["minDisk"] == nil {
			t.Errorf("image view %v", img)
		}
		e.must(403, "DELETE", "/images/"+e.imageID, e.demo, "", "")

		id := e.create(e.demo, "2.1", "")
		e.wait(id, e.demo, "ACTIVE")
		st, _, hdr := e.do("POST", "/servers/"+id+"/action", e.demo, "", `{"createImage":{"name":"snap"}}`)
		if st != 202 || hdr.Get("Location") == "" {
			t.Fatalf("createImage: %d %v", st, hdr)
		}
		snapID := hdr.Get("Location")[strings.LastIndex(hdr.Get("Location"), "/")+1:]
		var snap map[string]any
		for range 400 {
			snap = e.must(200, "GET", "/images/"+snapID, e.demo, "", "")["image"].(map[string]any)
			if snap["status"] == "ACTIVE" {
				break
			}
			time.Sleep(15 * time.Millisecond)
		}
		if srv, _ := snap["server"].(map[string]any); snap["status"] != "ACTIVE" || srv["id"] != id {
			t.Fatalf("snapshot view %v", snap)
		}
		e.must(404, "GET", "/images/"+snapID, e.demo, "2.36", "")
		e.must(204, "DELETE", "/images/"+snapID, e.demo, "", "")
		e.must(404, "GET", "/images/"+snapID, e.demo, "", "")
	})
}
