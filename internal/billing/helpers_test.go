package billing

import (
	"context"
	"strings"
	"testing"
	"time"

	"nimbus/internal/metering"
	"nimbus/internal/store"
)

// clock is an injected, settable clock.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }
func (c *clock) set(s string)   { c.t = at(s) }
func at(s string) time.Time {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t
}

func openDB(t testing.TB, url string) *store.DB {
	t.Helper()
	db, err := store.Open(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// testServer is a server as compute meters it.
type testServer struct {
	id, project, vmState, flavorID string
	vcpus, memMB, diskGB           int
	specs                          map[string]string
	osType                         string
	created                        time.Time
}

func (sv testServer) spec() metering.Spec {
	return metering.ServerSpec(sv.flavorID, int64(sv.vcpus), int64(sv.memMB), int64(sv.diskGB), sv.specs, sv.osType)
}

func billable(vmState string) bool { return vmState != "shelved" && vmState != "shelved_offloaded" }

// insertServers opens the usage periods compute would have opened for
// servers created at sv.created, many per statement.
func insertServers(t testing.TB, db *store.DB, svs []testServer) {
	t.Helper()
	var periods []metering.Opening
	for _, sv := range svs {
		if billable(sv.vmState) {
			periods = append(periods, metering.Opening{Kind: metering.KindServer, Resource: sv.id, Project: sv.project,
				Spec: sv.spec(), At: sv.created})
		}
	}
	if err := metering.OpenMany(context.Background(), db, periods); err != nil {
		t.Fatal(err)
	}
}

// meter records, as compute does, that server id is now spec (nil: not
// billable).
func meter(t testing.TB, db *store.DB, id string, spec *metering.Spec, when time.Time) {
	t.Helper()
	ctx := context.Background()
	var project, raw string
	if err := db.QueryRow(ctx, `SELECT project_id, spec FROM metering_periods WHERE resource_id = ?
 ORDER BY started_at DESC LIMIT 1`, id).Scan(&project, &raw); err != nil {
		t.Fatalf("server %s has no usage period: %v", id, err)
	}
	if err := db.Tx(ctx, func(tx *store.Tx) error {
		return metering.Set(ctx, tx, metering.KindServer, id, project, spec, when)
	}); err != nil {
		t.Fatal(err)
	}
}

// lastSpec is the spec of a server's latest period.
func lastSpec(t testing.TB, db *store.DB, id string) metering.Spec {
	t.Helper()
	var raw string
	if err := db.QueryRow(context.Background(), `SELECT spec FROM metering_periods WHERE resource_id = ?
 ORDER BY started_at DESC LIMIT 1`, id).Scan(&raw); err != nil {
		t.Fatal(err)
	}
	var sp metering.Spec
	if err := store.FromJSON(raw, &sp); err != nil {
		t.Fatal(err)
	}
	return sp
}

// setState moves a server to vmState as compute would meter it: shelved
// states close its period, others keep or reopen it.
func setState(t testing.TB, db *store.DB, id, vmState string, when time.Time) {
	t.Helper()
	if !billable(vmState) {
		meter(t, db, id, nil, when)
		return
	}
	sp := lastSpec(t, db, id)
	meter(t, db, id, &sp, when)
}

func deleteServer(t testing.TB, db *store.DB, id string, when time.Time) {
	t.Helper()
	meter(t, db, id, nil, when)
}

// chargesOf is how many charge rows a resource has and their sum.
func chargesOf(t testing.TB, db *store.DB, id string) (int, int64) {
	t.Helper()
	var n int
	var sum int64
	if err := db.QueryRow(context.Background(), `SELECT COUNT(*), COALESCE(SUM(amount), 0) FROM billing_ledger
 WHERE kind = 'charge' AND resource_id = ?`, id).Scan(&n, &sum); err != nil {
		t.Fatal(err)
	}
	return n, sum
}

func chargedHours(t testing.TB, db *store.DB, id string) []string {
	t.Helper()
	rows, err := db.Query(context.Background(), `SELECT period_start FROM billing_ledger WHERE kind = 'charge'
 AND resource_id = ? ORDER BY period_start`, id)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		out = append(out, strings.TrimSuffix(s, ":00:00.000000Z")[11:])
	}
	return out
}

var stdSpecs = map[string]string{"nimbus:disk_type": "network", "nimbus:public_ipv4": "true"}

func stdServer(id, project string, created time.Time) testServer {
	return testServer{id: id, project: project, vmState: "active", flavorID: "d2.4g.network.ipv4", vcpus: 2,
		memMB: 4096, diskGB: 40, specs: stdSpecs, created: created}
}

func mustCharge(t testing.TB, b *Service, now time.Time) Result {
	t.Helper()
	r, err := b.ChargeUntil(context.Background(), now)
	if err != nil {
		t.Fatal(err)
	}
	return r
}
