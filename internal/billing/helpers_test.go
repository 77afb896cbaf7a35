package billing

import (
	"context"
	"strings"
	"testing"
	"time"

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

// testServer is a compute_servers row as internal/compute writes it.
type testServer struct {
	id, project, vmState, flavorID string
	vcpus, memMB, diskGB           int
	specs                          map[string]string
	osType                         string
	created                        time.Time
}

func (sv testServer) doc() string {
	return store.JSON(map[string]any{
		"flavor": map[string]any{"id": sv.flavorID, "name": sv.flavorID, "vcpus": sv.vcpus, "ram": sv.memMB,
			"disk": sv.diskGB, "ephemeral": 0, "swap": 0, "extra_specs": sv.specs},
		"metadata": map[string]string{}, "os_type": sv.osType, "instance_name": "instance-" + sv.id,
		"security_groups": []string{"default"}, "config_drive": false, "disk_config": "MANUAL"})
}

// insertServers writes rows straight into compute_servers, many per
// statement.
func insertServers(t testing.TB, db *store.DB, svs []testServer) {
	t.Helper()
	ctx := context.Background()
	const per = 500
	for i := 0; i < len(svs); i += per {
		part := svs[i:min(i+per, len(svs))]
		var b strings.Builder
		b.WriteString(`INSERT INTO compute_servers (id, project_id, user_id, name, vm_state, flavor_id, reservation_id,
 vcpus, memory_mb, disk_gb, created_at, updated_at, launched_at, doc) VALUES `)
		args := []any{}
		for j, sv := range part {
			if j > 0 {
				b.WriteString(", ")
			}
			b.WriteString("(?, ?, 'u', ?, ?, ?, 'r-1', ?, ?, ?, ?, ?, ?, ?)")
			c := store.FormatTime(sv.created)
			args = append(args, sv.id, sv.project, "vm-"+sv.id, sv.vmState, sv.flavorID, sv.vcpus, sv.memMB, sv.diskGB, c, c, c, sv.doc())
		}
		if _, err := db.Exec(ctx, b.String(), args...); err != nil {
			t.Fatal(err)
		}
	}
}

func setState(t testing.TB, db *store.DB, id, vmState string, when time.Time) {
	t.Helper()
	if _, err := db.Exec(context.Background(), "UPDATE compute_servers SET vm_state = ?, updated_at = ? WHERE id = ?",
		vmState, store.FormatTime(when), id); err != nil {
		t.Fatal(err)
	}
}

func deleteServer(t testing.TB, db *store.DB, id string, when time.Time) {
	t.Helper()
	w := store.FormatTime(when)
	if _, err := db.Exec(context.Background(), `UPDATE compute_servers SET vm_state = 'deleted', deleted = 1,
 terminated_at = ?, updated_at = ? WHERE id = ?`, w, w, id); err != nil {
		t.Fatal(err)
	}
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
