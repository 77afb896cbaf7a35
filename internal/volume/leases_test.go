package volume_test

import (
	"context"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/snapshots"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/volumes"

	"nimbus/internal/store"
	"nimbus/internal/testenv"
)

// TestWorkTakenFromTheDead: volume and snapshot work whose lease another
// live controller holds is left to it; once that controller stops
// renewing (it died), this controller's scan finds the work from the
// items' statuses, does it and gives the leases back.
func TestWorkTakenFromTheDead(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		ctx := context.Background()
		v, err := volumes.Create(ctx, e.demo, volumes.CreateOpts{Size: 1}, nil).Extract()
		if err != nil {
			t.Fatal(err)
		}
		waitStatus(t, e.demo, v.ID, "available")
		sn, err := snapshots.Create(ctx, e.demo, snapshots.CreateOpts{VolumeID: v.ID}).Extract()
		if err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 30*time.Second, "snapshot available", func() bool {
			s, err := snapshots.Get(ctx, e.demo, sn.ID).Extract()
			return err == nil && s.Status == "available"
		})
		exec := func(q string, args ...any) {
			t.Helper()
			if _, err := e.c.DB.Exec(ctx, q, args...); err != nil {
				t.Fatal(err)
			}
		}
		// Another controller took both a minute ago, and renews.
		old, later := store.FormatTime(time.Now().Add(-time.Minute)), store.FormatTime(time.Now().Add(time.Hour))
		exec("UPDATE volumes SET status = 'extending', new_size = 2, updated_at = ? WHERE id = ?", old, v.ID)
		exec("UPDATE volume_snapshots SET status = 'deleting', updated_at = ? WHERE id = ?", old, sn.ID)
		for _, name := range []string{"volume/" + v.ID, "volume/snapshot:" + sn.ID} {
			exec("INSERT INTO leases (name, holder, expires_at, acquired_at) VALUES (?, 'ctl-other', ?, ?)", name, later, old)
		}
		time.Sleep(6 * time.Second) // more than a scan's period
		if got, err := volumes.Get(ctx, e.demo, v.ID).Extract(); err != nil || got.Status != "extending" {
			t.Fatalf("volume whose work another holds: %v %v, want it left extending", got, err)
		}
		// It died: its leases lapse.
		exec("UPDATE leases SET expires_at = ? WHERE holder = 'ctl-other'", old)
		testenv.Eventually(t, 15*time.Second, "the volume's extend taken over", func() bool {
			got, err := volumes.Get(ctx, e.demo, v.ID).Extract()
			return err == nil && got.Status == "available" && got.Size == 2
		})
		testenv.Eventually(t, 15*time.Second, "the snapshot's delete taken over", func() bool {
			_, err := snapshots.Get(ctx, e.demo, sn.ID).Extract()
			return err != nil
		})
		testenv.Eventually(t, 5*time.Second, "leases given back", func() bool {
			var n int
			return e.c.DB.QueryRow(ctx, "SELECT COUNT(*) FROM leases WHERE name LIKE 'volume/%'").Scan(&n) == nil && n == 0
		})
	})
}
