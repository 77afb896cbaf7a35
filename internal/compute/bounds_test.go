package compute_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"nimbus/internal/cloud"
	"nimbus/internal/store"
	"nimbus/internal/testenv"
)

// TestComputeBounds: the customer-controlled lists and counts of the
// compute API are bounded, whatever the quotas say.
func TestComputeBounds(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		ctx := context.Background()
		demoProject, err := e.c.Identity.ProjectByName(ctx, cloud.DemoProject)
		if err != nil {
			t.Fatal(err)
		}
		// An unlimited metadata_items quota still has the hard cap.
		e.must(200, "PUT", "/os-quota-sets/"+demoProject.ID, e.admin, "", `{"quota_set":{"metadata_items":-1}}`)
		id := e.create(e.demo, "2.96", "")
		e.wait(id, e.demo, "ACTIVE")

		uuids := func(n int) string {
			return testenv.JSONList(n, func(int) string { return `"` + id + `"` })
		}
		_, pub := testenv.NewSSHKey(t)
		serverBody := func(extra string) string {
			return fmt.Sprintf(`{"server":{"name":"b","imageRef":%q,"flavorRef":%q,"networks":"auto"%s}}`, e.imageID, e.flavorID, extra)
		}
		hintsBody := func(hint string, n int) string {
			return fmt.Sprintf(`{"server":{"name":"b","imageRef":%q,"flavorRef":%q,"networks":"auto"},"os:scheduler_hints":{%q:%s}}`,
				e.imageID, e.flavorID, hint, uuids(n))
		}
		for _, tc := range []struct {
			name, method, path, body string
			code                     int
			msg                      string
		}{
			{"same_host over limit", "POST", "/servers", hintsBody("same_host", 51),
				400, "Invalid input for field/attribute same_host. The list has 51 items, more than the 50 allowed."},
			{"different_host over limit", "POST", "/servers", hintsBody("different_host", 51),
				400, "Invalid input for field/attribute different_host. The list has 51 items, more than the 50 allowed."},
			{"security_groups over limit, repeated", "POST", "/servers",
				serverBody(`,"security_groups":` + testenv.JSONList(51, func(int) string { return `{"name":"default"}` })),
				400, "Invalid input for field/attribute security_groups. The list has 51 items, more than the 50 allowed."},
			{"public key over limit", "POST", "/os-keypairs", fmt.Sprintf(`{"keypair":{"name":"big","public_key":%q}}`,
				strings.TrimSpace(pub)+" "+strings.Repeat("c", 16<<10)), 400, "Keypair data is invalid: public_key is too long"},
			{"create metadata over cap", "POST", "/servers", serverBody(`,"metadata":` + testenv.JSONObject("k", 1025)),
				403, "Maximum number of metadata items exceeds 1024"},
			{"metadata replace over cap", "PUT", "/servers/" + id + "/metadata", `{"metadata":` + testenv.JSONObject("k", 1025) + `}`,
				403, "Maximum number of metadata items exceeds 1024"},
			{"rebuild metadata over cap", "POST", "/servers/" + id + "/action",
				fmt.Sprintf(`{"rebuild":{"imageRef":%q,"metadata":%s}}`, e.imageID, testenv.JSONObject("k", 1025)),
				403, "Maximum number of metadata items exceeds 1024"},
			{"metadata at cap", "PUT", "/servers/" + id + "/metadata", `{"metadata":` + testenv.JSONObject("k", 1024) + `}`, 200, ""},
			{"metadata item over cap", "PUT", "/servers/" + id + "/metadata/one-more", `{"meta":{"one-more":"v"}}`,
				403, "Maximum number of metadata items exceeds 1024"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				e.t = t
				defer func() { e.t = t }()
				st, m, _ := e.do(tc.method, tc.path, e.demo, "2.96", tc.body)
				var msg string
				for _, f := range m {
					if f, ok := f.(map[string]any); ok {
						msg, _ = f["message"].(string)
					}
				}
				if st != tc.code || msg != tc.msg && tc.msg != "" {
					t.Fatalf("%d %q, want %d %q", st, msg, tc.code, tc.msg)
				}
			})
		}
		e.t = t

		t.Run("instance actions kept", func(t *testing.T) {
			e.t = t
			defer func() { e.t = t }()
			// 1100 old actions, as a server locked and unlocked for years.
			old := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
			err := e.c.DB.Tx(ctx, func(tx *store.Tx) error {
				for i := range 1100 {
					at := store.FormatTime(old.Add(time.Duration(i) * time.Minute))
					if _, err := tx.Exec(ctx, `INSERT INTO compute_instance_actions (server_id, request_id, action, project_id,
 user_id, start_time, updated_at, events) VALUES (?,?,?,?,?,?,?,?)`, id, fmt.Sprintf("req-old-%04d", i), "lock",
						demoProject.ID, "u", at, at, "[]"); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			e.action(id, e.demo, "2.96", `{"lock":null}`, 202)
			all := e.must(200, "GET", "/servers/"+id+"/os-instance-actions", e.demo, "2.21", "")["instanceActions"].([]any)
			if len(all) != 1000 || all[0].(map[string]any)["action"] != "lock" {
				t.Fatalf("%d actions kept, newest %v; want 1000, lock", len(all), all[0])
			}
			// The oldest went: beside lock and create, the newest 998 old
			// ones stay.
			if last := all[999].(map[string]any)["request_id"]; last != "req-old-0102" {
				t.Fatalf("oldest kept %v, want req-old-0102", last)
			}
			// Pages from 2.58 walk the same list in SQL-limited steps.
			var paged []any
			next := "/servers/" + id + "/os-instance-actions?limit=300"
			for next != "" {
				page := e.must(200, "GET", next, e.demo, "2.58", "")
				paged = append(paged, page["instanceActions"].([]any)...)
				next = ""
				if links, ok := page["links"].([]any); ok {
					href := links[0].(map[string]any)["href"].(string)
					next = href[strings.Index(href, "/servers/"):]
				}
			}
			if len(paged) != len(all) {
				t.Fatalf("paged %d actions, want %d", len(paged), len(all))
			}
			for i := range all {
				if paged[i].(map[string]any)["request_id"] != all[i].(map[string]any)["request_id"] {
					t.Fatalf("page item %d: %v, want %v", i, paged[i], all[i])
				}
			}
			if st, _, _ := e.do("GET", "/servers/"+id+"/os-instance-actions?marker=req-old-0000", e.demo, "2.58", ""); st != 400 {
				t.Fatalf("marker of a dropped action: %d, want 400", st)
			}
		})
	})
}
