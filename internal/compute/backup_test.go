package compute_test

import (
	"context"
	"strings"
	"testing"

	"nimbus/internal/testenv"
)

// TestCreateBackup: createBackup makes backup images, keeps the newest
// `rotation` of a type, and each kept backup is metered for billing.
func TestCreateBackup(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, url string) {
		e := newEnv(t, url)
		id := e.create(e.demo, "2.96", "")
		e.wait(id, e.demo, "ACTIVE")
		for _, bad := range []string{
			`{"createBackup": {"name": "b", "backup_type": "daily"}}`,
			`{"createBackup": {"name": "b", "backup_type": "daily", "rotation": -1}}`,
			`{"createBackup": {"name": "b", "backup_type": "daily", "rotation": "two"}}`,
			`{"createBackup": {"name": "b", "backup_type": "daily", "rotation": 1.5}}`,
			`{"createBackup": {"name": "b", "backup_type": "daily", "rotation": 1, "colour": "red"}}`,
			`{"createBackup": {"backup_type": "daily", "rotation": 1}}`,
			`{"createBackup": []}`,
		} {
			e.action(id, e.demo, "2.96", bad, 400)
		}
		var made []string
		for i, mv := range []string{"2.1", "2.45", "2.96"} {
			st, m, hdr := e.do("POST", "/servers/"+id+"/action", e.demo, mv,
				`{"createBackup": {"name": "nightly", "backup_type": "daily", "rotation": 2}}`)
			if st != 202 {
				t.Fatalf("createBackup %d at %s: %d %v", i, mv, st, m)
			}
			img := ""
			if mv == "2.1" {
				loc := hdr.Get("Location")
				img = loc[strings.LastIndex(loc, "/")+1:]
			} else {
				img, _ = m["image_id"].(string)
			}
			if img == "" {
				t.Fatalf("createBackup at %s named no image: %v %v", mv, m, hdr)
			}
			made = append(made, img)
			e.wait(id, e.demo, "ACTIVE")
		}
		// A weekly one is rotated separately.
		e.action(id, e.demo, "2.96", `{"createBackup": {"name": "weekly", "backup_type": "weekly", "rotation": 1}}`, 202)
		e.wait(id, e.demo, "ACTIVE")
		ctx := context.Background()
		exists := func(img string) bool {
			var n int
			if err := e.c.DB.QueryRow(ctx, "SELECT COUNT(*) FROM images WHERE id = ?", img).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n == 1
		}
		if exists(made[0]) || !exists(made[1]) || !exists(made[2]) {
			t.Fatalf("rotation 2 kept %v %v %v of the three daily backups, want the newest two",
				exists(made[0]), exists(made[1]), exists(made[2]))
		}
		var open, closed int
		if err := e.c.DB.QueryRow(ctx, `SELECT COALESCE(SUM(CASE WHEN ended_at = '' THEN 1 ELSE 0 END), 0),
 COALESCE(SUM(CASE WHEN ended_at <> '' THEN 1 ELSE 0 END), 0) FROM metering_periods WHERE kind = 'backup'`).Scan(&open, &closed); err != nil {
			t.Fatal(err)
		}
		if open != 3 || closed != 1 {
			t.Fatalf("backup usage periods: %d open, %d closed; want 3 kept and 1 rotated out", open, closed)
		}
		actions := e.must(200, "GET", "/servers/"+id+"/os-instance-actions", e.demo, "2.96", "")["instanceActions"].([]any)
		if actions[0].(map[string]any)["action"] != "createBackup" {
			t.Fatalf("latest action %v", actions[0])
		}
	})
}
