package quota_test

import (
	"context"
	"maps"
	"testing"

	"nimbus/internal/quota"
	"nimbus/internal/store"
	"nimbus/internal/store/storetest"
)

// TestLimitsSetLock: a project's limits are the defaults under what was
// set for it alone, a resource the defaults do not name is left out, a nil
// Set brings the default back, and each Lock bumps the project's serial.
func TestLimitsSetLock(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		db, err := store.Open(ctx, dbURL)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		defaults := map[string]int64{"volumes": 10, "gigabytes": 1000}
		n := func(v int64) *int64 { return &v }
		steps := []struct {
			name     string
			project  string
			resource string
			limit    *int64
			want     map[string]int64
		}{
			{"set one", "p1", "volumes", n(3), map[string]int64{"volumes": 3, "gigabytes": 1000}},
			{"set again", "p1", "volumes", n(-1), map[string]int64{"volumes": -1, "gigabytes": 1000}},
			{"unknown resource ignored", "p1", "snapshots", n(7), map[string]int64{"volumes": -1, "gigabytes": 1000}},
			{"other project apart", "p2", "gigabytes", n(5), map[string]int64{"volumes": -1, "gigabytes": 1000}},
			{"nil restores the default", "p1", "volumes", nil, defaults},
		}
		for _, st := range steps {
			err := db.Tx(ctx, func(tx *store.Tx) error {
				return quota.Set(ctx, tx, "volume_quotas", st.project, st.resource, st.limit)
			})
			if err != nil {
				t.Fatalf("%s: %v", st.name, err)
			}
			got, err := quota.Limits(ctx, db, "volume_quotas", "p1", defaults)
			if err != nil || !maps.Equal(got, st.want) {
				t.Errorf("%s: limits of p1 %v (%v), want %v", st.name, got, err, st.want)
			}
		}
		for want := int64(1); want <= 2; want++ {
			if err := db.Tx(ctx, func(tx *store.Tx) error { return quota.Lock(ctx, tx, "volume_quota_locks", "p1") }); err != nil {
				t.Fatal(err)
			}
			var serial int64
			if err := db.QueryRow(ctx, "SELECT serial FROM volume_quota_locks WHERE project_id = 'p1'").Scan(&serial); err != nil || serial != want {
				t.Errorf("serial after lock %d: %d (%v)", want, serial, err)
			}
		}
	})
}
