package metering_test

import (
	"context"
	"fmt"
	"sort"
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

// TestTouching: the groups a project's hour touches, read from the counts
// every writer keeps (0078), equal those counted from the periods
// themselves after each kind of write: an open, a change of spec, a
// change of project, an end, a drop of a failed build's periods, and a
// bulk open; another project's periods never count.
func TestTouching(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		db, err := store.Open(ctx, dbURL)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		hour := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
		small, big := &metering.Spec{VCPUs: 1, Name: "x"}, &metering.Spec{VCPUs: 2}
		set := func(resource, project string, spec *metering.Spec, at time.Time) {
			t.Helper()
			if err := metering.Set(ctx, db, metering.KindServer, resource, project, spec, at); err != nil {
				t.Fatal(err)
			}
		}
		before := hour.Add(-2 * time.Hour)
		for _, step := range []struct {
			name  string
			write func()
			want  string // kind/vcpus=count, sorted; a spec both open and ended comes twice
		}{
			{"opened", func() {
				set("a", "p", small, before)
				set("b", "p", small, before)
				set("c", "p", big, before)
				set("z", "q", big, before)
			}, "server/1=2 server/2=1"},
			{"renamed", func() { set("a", "p", &metering.Spec{VCPUs: 1, Name: "y"}, hour.Add(time.Minute)) },
				"server/1=2 server/2=1"},
			{"resized", func() { set("a", "p", big, hour.Add(2*time.Minute)) },
				"server/1=1 server/1=1 server/2=2"},
			{"given away", func() { set("b", "q", small, hour.Add(3*time.Minute)) },
				"server/1=2 server/2=2"},
			{"ended before the hour", func() { set("c", "p", nil, before.Add(time.Minute)) },
				"server/1=2 server/2=1"},
			{"dropped", func() {
				if err := metering.Drop(ctx, db, "a", hour.Add(2*time.Minute)); err != nil {
					t.Fatal(err)
				}
			}, "server/1=2"},
			{"opened in bulk", func() {
				var o []metering.Opening
				for i := range 3 {
					o = append(o, metering.Opening{Kind: metering.KindVolume, Resource: fmt.Sprint("v", i), Project: "p",
						Spec: metering.Spec{SizeGB: 10}, At: hour})
				}
				if err := metering.OpenMany(ctx, db, o); err != nil {
					t.Fatal(err)
				}
			}, "server/1=2 volume/0=3"},
		} {
			step.write()
			groups, err := metering.Touching(ctx, db, "p", hour)
			if err != nil {
				t.Fatal(err)
			}
			if got := describeGroups(groups); got != step.want {
				t.Errorf("%s: touching %q, want %q", step.name, got, step.want)
			}
			if got, want := openCounts(t, db, "p"), countedOpen(t, db, "p"); got != want {
				t.Errorf("%s: open counts %q, the periods count %q", step.name, got, want)
			}
		}
	})
}

// describeGroups writes groups as "kind/vcpus=n …", sorted.
func describeGroups(groups []metering.Group) string {
	var out []string
	for _, g := range groups {
		out = append(out, fmt.Sprintf("%s/%d=%d", g.Kind, g.Spec.VCPUs, g.Count))
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}

// openCounts is project's row of metering_open_counts as "kind/vcpus=n …".
func openCounts(t *testing.T, db *store.DB, project string) string {
	return groupRows(t, db, "SELECT kind, spec, open_count FROM metering_open_counts WHERE project_id = ? AND open_count <> 0", project)
}

// countedOpen is project's open periods counted from the periods.
func countedOpen(t *testing.T, db *store.DB, project string) string {
	return groupRows(t, db, "SELECT kind, spec, COUNT(*) FROM metering_periods WHERE project_id = ? AND ended_at = '' GROUP BY kind, spec", project)
}

func groupRows(t *testing.T, db *store.DB, query, project string) string {
	t.Helper()
	rows, err := db.Query(context.Background(), query, project)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var kind, raw string
		var n int64
		if err := rows.Scan(&kind, &raw, &n); err != nil {
			t.Fatal(err)
		}
		var sp metering.Spec
		if err := store.FromJSON(raw, &sp); err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%s/%d=%d", kind, sp.VCPUs, n))
	}
	sort.Strings(out)
	return strings.Join(out, " ")
}
