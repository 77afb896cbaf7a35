package compute_test

import (
	"context"
	"testing"
	"time"

	"nimbus/internal/cloud"
	"nimbus/internal/metering"
	"nimbus/internal/store"
	"nimbus/internal/testenv"
)

// TestBuildingNotMetered: a build is billed once it runs, never before;
// a server left building with an open usage period (as a version that
// billed from placement left it) has that period closed at start, so that
// deleting or failing the build charges nothing more.
func TestBuildingNotMetered(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		dir := t.TempDir()
		e := newEnv(t, dbURL, func(cfg *cloud.Config) { cfg.DataDir = dir; cfg.FakeDelay = time.Second })
		id := e.create(e.demo, "2.96", "")
		if n := openPeriods(t, e.c.DB, id); n != 0 {
			t.Errorf("a building server has %d open usage periods", n)
		}
		e.c.Close()

		// As the older version left it: building, its period open since
		// placement.
		db, err := store.Open(ctx, dbURLOrFile(dbURL, dir))
		if err != nil {
			t.Fatal(err)
		}
		var vm, project string
		if err := db.QueryRow(ctx, "SELECT vm_state, project_id FROM compute_servers WHERE id = ?", id).Scan(&vm, &project); err != nil || vm != "building" {
			t.Fatalf("vm_state %q (%v); the test needs an unfinished build", vm, err)
		}
		spec := metering.ServerSpec("m1.small", 1, 2048, 20, nil, "linux")
		if err := db.Tx(ctx, func(tx *store.Tx) error {
			return metering.Set(ctx, tx, metering.KindServer, id, project, &spec, time.Now().Add(-time.Minute))
		}); err != nil {
			t.Fatal(err)
		}
		db.Close()

		e2 := newEnv(t, dbURL, func(cfg *cloud.Config) { cfg.DataDir = dir; cfg.FakeDelay = 5 * time.Second })
		deadline := time.Now().Add(10 * time.Second)
		for openPeriods(t, e2.c.DB, id) != 0 {
			if time.Now().After(deadline) {
				t.Fatal("the building server's period is still open after the restart")
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
}

func openPeriods(t *testing.T, db *store.DB, id string) int {
	t.Helper()
	var n int
	if err := db.QueryRow(context.Background(), "SELECT COUNT(*) FROM metering_periods WHERE resource_id = ? AND ended_at = ''", id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
