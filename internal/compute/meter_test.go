package compute_test

import (
	"context"
	"testing"
	"time"

	"nimbus/internal/metering"
	"nimbus/internal/testenv"
)

// TestMeteredLife: compute records a server's usage periods as its life
// goes: open while placed (stopped too), a new one on resize, closed on
// shelve, reopened on unshelve, closed on delete.
func TestMeteredLife(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, url string) {
		e := newEnv(t, url)
		periods := func(id string) (open, closed int, flavors []string) {
			t.Helper()
			rows, err := e.c.DB.Query(context.Background(), "SELECT "+metering.Columns+" FROM metering_periods WHERE resource_id = ? ORDER BY started_at", id)
			if err != nil {
				t.Fatal(err)
			}
			defer rows.Close()
			for rows.Next() {
				var p metering.Period
				if err := metering.Scan(rows, &p); err != nil {
					t.Fatal(err)
				}
				if p.Open() {
					open++
				} else {
					closed++
				}
				flavors = append(flavors, p.Spec.Flavor)
			}
			return open, closed, flavors
		}
		expect := func(step, id string, open, closed int) []string {
			t.Helper()
			o, c, f := periods(id)
			if o != open || c != closed {
				t.Fatalf("after %s: %d open and %d closed periods, want %d and %d", step, o, c, open, closed)
			}
			return f
		}
		id := e.create(e.demo, "2.96", "")
		e.wait(id, e.demo, "ACTIVE")
		expect("create", id, 1, 0)
		e.action(id, e.demo, "2.96", `{"os-stop": null}`, 202)
		e.wait(id, e.demo, "SHUTOFF")
		expect("stop", id, 1, 0)
		e.action(id, e.demo, "2.96", `{"os-start": null}`, 202)
		e.wait(id, e.demo, "ACTIVE")
		e.action(id, e.demo, "2.96", `{"resize": {"flavorRef": "3"}}`, 202)
		e.wait(id, e.demo, "VERIFY_RESIZE")
		e.action(id, e.demo, "2.96", `{"confirmResize": null}`, 204)
		e.wait(id, e.demo, "ACTIVE")
		if f := expect("resize", id, 1, 1); f[0] == f[1] {
			t.Fatalf("resize kept the flavor: %v", f)
		}
		e.action(id, e.demo, "2.96", `{"shelve": null}`, 202)
		e.wait(id, e.demo, "SHELVED_OFFLOADED")
		expect("shelve", id, 0, 2)
		e.action(id, e.demo, "2.96", `{"unshelve": null}`, 202)
		e.wait(id, e.demo, "ACTIVE")
		expect("unshelve", id, 1, 2)
		e.must(204, "DELETE", "/servers/"+id, e.demo, "2.96", "")
		deadline := time.Now().Add(20 * time.Second)
		for o, _, _ := periods(id); o != 0 && time.Now().Before(deadline); o, _, _ = periods(id) {
			time.Sleep(20 * time.Millisecond)
		}
		expect("delete", id, 0, 3)
	})
}
