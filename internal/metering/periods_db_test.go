package metering_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"nimbus/internal/metering"
	"nimbus/internal/store"
	"nimbus/internal/store/storetest"
)

// TestReadingPeriods: the readers other packages use instead of the
// metering table: a resource's open period, the periods of a window in
// (resource, id) pages, and the condition that finds resources without
// periods.
func TestReadingPeriods(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		db, err := store.Open(ctx, dbURL)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		t0 := time.Date(2026, 3, 1, 10, 20, 0, 0, time.UTC)
		small, big := &metering.Spec{VCPUs: 1}, &metering.Spec{VCPUs: 2}
		for _, c := range []struct {
			resource string
			spec     *metering.Spec
			at       time.Time
		}{
			{"a", small, t0},
			{"a", big, t0.Add(time.Hour)}, // a resize: a second period
			{"b", small, t0},
			{"b", nil, t0.Add(30 * time.Minute)}, // b ends
			{"c", small, t0.Add(5 * time.Hour)},  // after the window
		} {
			if err := metering.Set(ctx, db, metering.KindServer, c.resource, "p", c.spec, c.at); err != nil {
				t.Fatal(err)
			}
		}

		t.Run("current", func(t *testing.T) {
			for _, tc := range []struct {
				resource string
				vcpus    int64 // 0: none open
			}{{"a", 2}, {"b", 0}, {"nope", 0}} {
				p, err := metering.Current(ctx, db, tc.resource)
				switch {
				case tc.vcpus == 0 && !store.IsNoRows(err):
					t.Errorf("%s: got %+v, %v, want no rows", tc.resource, p, err)
				case tc.vcpus != 0 && (err != nil || p.Spec.VCPUs != tc.vcpus || !p.Open()):
					t.Errorf("%s: got %+v, %v, want the open period of %d vCPUs", tc.resource, p, err, tc.vcpus)
				}
			}
		})

		t.Run("pages", func(t *testing.T) {
			from, to := t0.Truncate(time.Hour), t0.Truncate(time.Hour).Add(2*time.Hour)
			var got []string
			res, id := "", ""
			for range 10 {
				page, err := metering.Page(ctx, db, res, id, from, to, 2, map[string]metering.Spec{})
				if err != nil {
					t.Fatal(err)
				}
				if len(page) == 0 {
					break
				}
				for _, p := range page {
					got = append(got, p.ResourceID)
				}
				last := page[len(page)-1]
				res, id = last.ResourceID, last.ID
			}
			if want := "a a b"; strings.Join(got, " ") != want {
				t.Errorf("periods of the window %q, want %q", strings.Join(got, " "), want)
			}
		})

		t.Run("open many", func(t *testing.T) {
			var openings []metering.Opening
			for i := range 501 { // over one statement's 500
				openings = append(openings, metering.Opening{Kind: metering.KindVolume, Resource: fmt.Sprint("v", i), Project: "q",
					Spec: metering.Spec{SizeGB: int64(i)}, At: t0})
			}
			if err := metering.OpenMany(ctx, db, openings); err != nil {
				t.Fatal(err)
			}
			for _, i := range []int{0, 499, 500} {
				p, err := metering.Current(ctx, db, fmt.Sprint("v", i))
				if err != nil || p.Kind != metering.KindVolume || p.ProjectID != "q" || p.Spec.SizeGB != int64(i) || !p.Start.Equal(t0) {
					t.Errorf("v%d: %+v, %v", i, p, err)
				}
			}
		})

		t.Run("unmetered", func(t *testing.T) {
			if _, err := db.Exec(ctx, "CREATE TABLE things (id TEXT PRIMARY KEY)"); err != nil {
				t.Fatal(err)
			}
			if _, err := db.Exec(ctx, "INSERT INTO things (id) VALUES ('a'), ('b'), ('z')"); err != nil {
				t.Fatal(err)
			}
			for _, tc := range []struct {
				openOnly bool
				want     string
			}{{false, "z"}, {true, "b z"}} {
				rows, err := db.Query(ctx, "SELECT id FROM things WHERE "+metering.Unmetered("things.id", tc.openOnly)+" ORDER BY id")
				if err != nil {
					t.Fatal(err)
				}
				var got []string
				for rows.Next() {
					var id string
					rows.Scan(&id)
					got = append(got, id)
				}
				rows.Close()
				if strings.Join(got, " ") != tc.want {
					t.Errorf("unmetered (open only %v): %q, want %q", tc.openOnly, strings.Join(got, " "), tc.want)
				}
			}
		})
	})
}
