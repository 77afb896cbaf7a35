package compute_test

import (
	"context"
	"errors"
	"testing"

	"nimbus/internal/driver/fake"
	"nimbus/internal/store"
	"nimbus/internal/testenv"
)

// TestFailedBuildNotMetered: a server is billable from placement (so a
// term can be bought as it is ordered), but a build that fails before it
// ever booted leaves no usage period, so no charging pass bills it.
func TestFailedBuildNotMetered(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		ok := e.create(e.demo, "2.96", "")
		if n := periods(t, e.c.DB, ok, true); n != 1 {
			t.Errorf("a placed server has %d open usage periods, want 1 from placement", n)
		}
		e.wait(ok, e.demo, "ACTIVE")

		for range 3 { // the step tries a spawn three times
			e.c.Fake.FailNext(fake.OpSpawn, errors.New("the disk is on fire"))
		}
		bad := e.create(e.demo, "2.96", "")
		e.wait(bad, e.demo, "ERROR")
		if n := periods(t, e.c.DB, bad, false); n != 0 {
			t.Errorf("a build that never booted has %d usage periods, want none", n)
		}
		if n := periods(t, e.c.DB, ok, true); n != 1 {
			t.Errorf("the running server has %d open usage periods, want 1", n)
		}
	})
}

// periods counts a resource's usage periods (only open ones when open).
func periods(t *testing.T, db *store.DB, id string, open bool) int {
	t.Helper()
	q := "SELECT COUNT(*) FROM metering_periods WHERE resource_id = ?"
	if open {
		q += " AND ended_at = ''"
	}
	var n int
	if err := db.QueryRow(context.Background(), q, id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
