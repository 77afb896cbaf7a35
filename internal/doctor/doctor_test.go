package doctor_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"nimbus/internal/cloud"
	"nimbus/internal/doctor"
	"nimbus/internal/scheduler"
	"nimbus/internal/store"
	"nimbus/internal/testenv"
)

// fixture is a cloud with billed history: servers A, B, C pinned on
// fake-host-1, a GPU server G, a server E in VERIFY_RESIZE (two claims),
// a deleted server D, an unbound port, a floating IP and an available
// volume, and six hours of charges.
type fixture struct {
	c          *cloud.Cloud
	hc         *http.Client
	tok        string
	project    string // the admin project, which owns everything made here
	a, b, cc   string // servers on fake-host-1
	g, d, e    string // the GPU server; the deleted server; the resized one
	port, fip  string
	vol        string
	hourStart  time.Time // the current hour when billing was run
	chargedFor time.Time // the last hour billing completed
}

func (f *fixture) do(t *testing.T, method, url, body string, want int, hdr ...string) map[string]any {
	t.Helper()
	resp, raw := testenv.Do(t, f.hc, method, url, f.tok, body, hdr...)
	testenv.MustStatus(t, resp, raw, want)
	var out map[string]any
	if raw != "" {
		if err := json.Unmarshal([]byte(raw), &out); err != nil {
			t.Fatalf("%s %s: %v in %s", method, url, err, raw)
		}
	}
	return out
}

func (f *fixture) server(t *testing.T, name, flavor, host string) string {
	t.Helper()
	var image string
	if err := f.c.DB.QueryRow(context.Background(), "SELECT id FROM images WHERE name = 'Debian 12'").Scan(&image); err != nil {
		t.Fatal(err)
	}
	body := fmt.Sprintf(`{"server":{"name":%q,"imageRef":%q,"flavorRef":%q,"networks":"auto","host":%q}}`, name, image, flavor, host)
	id := f.do(t, "POST", f.c.ComputeURL+"/servers", body, 202, "OpenStack-API-Version", "compute 2.74")["server"].(map[string]any)["id"].(string)
	testenv.Eventually(t, 20*time.Second, name+" ACTIVE", func() bool {
		return f.do(t, "GET", f.c.ComputeURL+"/servers/"+id, "", 200)["server"].(map[string]any)["status"] == "ACTIVE"
	})
	return id
}

func (f *fixture) exec(t *testing.T, q string, args ...any) {
	t.Helper()
	if _, err := f.c.DB.Exec(context.Background(), q, args...); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
}

func (f *fixture) claim(t *testing.T, key string) scheduler.Claim {
	t.Helper()
	var c scheduler.Claim
	var cells, gpus string
	if err := f.c.DB.QueryRow(context.Background(), "SELECT host, cells, gpus, disk_gb FROM compute_claims WHERE server_id = ?", key).
		Scan(&c.Host, &cells, &gpus, &c.DiskGB); err != nil {
		t.Fatalf("claim of %s: %v", key, err)
	}
	if err := store.FromJSON(cells, &c.Cells); err != nil {
		t.Fatal(err)
	}
	if err := store.FromJSON(gpus, &c.GPUs); err != nil {
		t.Fatal(err)
	}
	return c
}

func newFixture(t *testing.T, dbURL string) *fixture {
	ctx := context.Background()
	c := testenv.StartCloud(t, dbURL)
	f := &fixture{c: c, hc: testenv.HTTPClient(t, c), tok: testenv.Token(t, c, cloud.AdminUser)}
	p, err := c.Identity.ProjectByName(ctx, cloud.AdminProject)
	if err != nil {
		t.Fatal(err)
	}
	f.project = p.ID
	f.do(t, "PUT", c.ComputeURL+"/os-quota-sets/"+f.project, `{"quota_set":{"ram":-1,"cores":-1}}`, 200) // room for the GPU server
	f.a = f.server(t, "a", "d1.2g.local.ipv4", "fake-host-1")
	f.b = f.server(t, "b", "d1.2g.local", "fake-host-1")
	f.cc = f.server(t, "c", "d1.2g.local", "fake-host-1")
	f.g = f.server(t, "g", "g.l4.x1", "fake-gpu-host-1")
	f.d = f.server(t, "d", "d1.2g.local.ipv4", "fake-host-4")
	f.e = f.server(t, "e", "d1.2g.local", "fake-host-4")
	f.do(t, "POST", c.ComputeURL+"/servers/"+f.e+"/action", `{"resize":{"flavorRef":"d2.4g.local"}}`, 202)
	testenv.Eventually(t, 20*time.Second, "e VERIFY_RESIZE", func() bool {
		return f.do(t, "GET", c.ComputeURL+"/servers/"+f.e, "", 200)["server"].(map[string]any)["status"] == "VERIFY_RESIZE"
	})
	var claims int
	if err := c.DB.QueryRow(ctx, "SELECT COUNT(*) FROM compute_claims WHERE server_id IN (?, ?)", f.e, f.e+"/resize-source").Scan(&claims); err != nil || claims != 2 {
		t.Fatalf("a resizing server holds %d claims (%v), want its new and its old", claims, err)
	}
	f.do(t, "DELETE", c.ComputeURL+"/servers/"+f.d, "", 204)
	testenv.Eventually(t, 20*time.Second, "d deleted", func() bool {
		resp, _ := testenv.Do(t, f.hc, "GET", c.ComputeURL+"/servers/"+f.d, f.tok, "")
		return resp.StatusCode == 404
	})
	var network, external string
	if err := c.DB.QueryRow(ctx, "SELECT id FROM networks WHERE project_id = ? AND external = 0", f.project).Scan(&network); err != nil {
		t.Fatal(err)
	}
	if err := c.DB.QueryRow(ctx, "SELECT id FROM networks WHERE external = 1").Scan(&external); err != nil {
		t.Fatal(err)
	}
	f.port = f.do(t, "POST", c.NetworkURL+"/v2.0/ports", fmt.Sprintf(`{"port":{"network_id":%q}}`, network), 201)["port"].(map[string]any)["id"].(string)
	f.fip = f.do(t, "POST", c.NetworkURL+"/v2.0/floatingips", fmt.Sprintf(`{"floatingip":{"floating_network_id":%q}}`, external), 201)["floatingip"].(map[string]any)["id"].(string)
	f.vol = f.do(t, "POST", c.VolumeURL+"/volumes", `{"volume":{"size":1}}`, 202)["volume"].(map[string]any)["id"].(string)
	testenv.Eventually(t, 20*time.Second, "volume available", func() bool {
		return f.do(t, "GET", c.VolumeURL+"/volumes/"+f.vol, "", 200)["volume"].(map[string]any)["status"] == "available"
	})

	// Six hours of history: every usage period began six hours ago, and
	// billing charges from eight hours ago until caught up.
	now := time.Now().UTC()
	f.hourStart = now.Truncate(time.Hour)
	back := store.FormatTime(now.Add(-6 * time.Hour))
	f.exec(t, "UPDATE metering_periods SET started_at = ?, changed_at = CASE WHEN ended_at = '' THEN ? ELSE ended_at END", back, back)
	f.exec(t, "UPDATE billing_state SET value = ? WHERE name = 'charged_through'", store.FormatTime(f.hourStart.Add(-8*time.Hour)))
	f.exec(t, "DELETE FROM billing_state WHERE name = 'last_pass'")
	for {
		res, err := c.Billing.ChargeUntil(ctx, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if res.CaughtUp {
			break
		}
	}
	var through string
	if err := c.DB.QueryRow(ctx, "SELECT value FROM billing_state WHERE name = 'charged_through'").Scan(&through); err != nil {
		t.Fatal(err)
	}
	f.chargedFor = store.ParseTime(through)
	return f
}

// findings runs doctor on the cloud's database, read-only, keyed by check
// and subject.
func (f *fixture) findings(t *testing.T) map[string]doctor.Finding {
	t.Helper()
	ctx := context.Background()
	ro, err := store.OpenReadOnly(ctx, f.c.Config.DatabaseURL)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if err := ro.SchemaCurrent(ctx); err != nil {
		t.Fatal(err)
	}
	out := map[string]doctor.Finding{}
	// A small page makes every check page.
	rep, err := doctor.Run(ctx, ro, doctor.Config{PageSize: 2}, func(x doctor.Finding) { out[x.Check+" | "+x.Subject] = x })
	if err != nil {
		t.Fatal(err)
	}
	if rep.Total != len(out) {
		t.Errorf("report counts %d findings, %d distinct", rep.Total, len(out))
	}
	return out
}

func keys(m map[string]doctor.Finding) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestDoctor breaks each invariant in a real cloud's database, on both
// engines, and sees doctor name that one and nothing else; a cloud in
// good order has no finding.
func TestDoctor(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		f := newFixture(t, dbURL)
		if got := f.findings(t); len(got) != 0 {
			for _, k := range keys(got) {
				t.Errorf("clean cloud: %s: %s", k, got[k].Problem)
			}
			t.FailNow()
		}
		ghostServer, ghostVM := uuid.NewString(), uuid.NewString()
		var chargeB, chargeC string
		cases := []struct {
			name  string
			broke func(t *testing.T)
			want  []string // check | a part of the subject
		}{
			{"a claim without a server", func(t *testing.T) {
				c := scheduler.Claim{Host: "fake-host-2", Cells: []scheduler.Cell{{Node: 0, CPUs: []int{5}, MemoryMB: 1024}}, DiskGB: 10}
				f.exec(t, "INSERT INTO compute_claims (server_id, host, cells, gpus, disk_gb, created_at) VALUES (?, ?, ?, '[]', 10, ?)",
					ghostServer, c.Host, store.JSON(c.Cells), store.FormatTime(time.Now()))
				f.exec(t, "INSERT INTO compute_claim_items (host, item, server_id) VALUES ('fake-host-2', 'cpu:5', ?)", ghostServer)
				f.exec(t, "UPDATE compute_host_capacity SET used = used + 1024 WHERE host = 'fake-host-2' AND node = 0")
				f.exec(t, "UPDATE compute_host_capacity SET used = used + 10 WHERE host = 'fake-host-2' AND node = -1")
			}, []string{"claims-of-dead-servers | claim " + ghostServer}},
			{"a resize's old claim after the resize ended", func(t *testing.T) {
				f.exec(t, "UPDATE compute_servers SET vm_state = 'active' WHERE id = ?", f.e)
			}, []string{"claims-of-dead-servers | claim " + f.e + "/resize-source"}},
			{"a placed server without its claim", func(t *testing.T) {
				c := f.claim(t, f.b)
				f.exec(t, "DELETE FROM compute_claim_items WHERE server_id = ?", f.b)
				f.exec(t, "DELETE FROM compute_claims WHERE server_id = ?", f.b)
				for _, cell := range c.Cells {
					f.exec(t, "UPDATE compute_host_capacity SET used = used - ? WHERE host = ? AND node = ?", cell.MemoryMB, c.Host, cell.Node)
				}
				f.exec(t, "UPDATE compute_host_capacity SET used = used - ? WHERE host = ? AND node = -1", c.DiskGB, c.Host)
			}, []string{"servers-without-claims | server " + f.b}},
			{"a pCPU claimed twice", func(t *testing.T) {
				a, c := f.claim(t, f.a), f.claim(t, f.cc)
				a.Cells[0].CPUs = append(a.Cells[0].CPUs, c.CPUs()[0])
				f.exec(t, "UPDATE compute_claims SET cells = ? WHERE server_id = ?", store.JSON(a.Cells), f.a)
			}, []string{fmt.Sprintf("pcpus-claimed-twice | cpu:%d of host fake-host-1", f.claim(t, f.cc).CPUs()[0])}},
			{"a reserved GPU no claim lists", func(t *testing.T) {
				f.exec(t, "INSERT INTO compute_claim_items (host, item, server_id) VALUES ('fake-host-1', 'gpu:0000:ff:00.0', ?)", f.a)
			}, []string{"claim-items | gpu:0000:ff:00.0 of host fake-host-1"}},
			{"a claimed GPU not reserved", func(t *testing.T) {
				f.exec(t, "DELETE FROM compute_claim_items WHERE server_id = ? AND item LIKE 'gpu:%'", f.g)
			}, []string{"claim-items | claim " + f.g}},
			{"a host's memory counter off", func(t *testing.T) {
				f.exec(t, "UPDATE compute_host_capacity SET used = used + 512 WHERE host = 'fake-host-3' AND node = 1")
			}, []string{"host-capacity | host fake-host-3 NUMA node 1 memory"}},
			{"an hour not charged", func(t *testing.T) {
				f.exec(t, "DELETE FROM billing_ledger WHERE kind = 'charge' AND resource_id = ? AND period_start = ?",
					f.a, store.FormatTime(f.hourStart.Add(-4*time.Hour)))
			}, []string{"charges-missing | server " + f.a + " of project " + f.project + ", hour " + f.hourStart.Add(-4*time.Hour).Format(time.RFC3339)}},
			{"an hour charged without usage", func(t *testing.T) {
				chargeC = uuid.NewString()
				f.exec(t, `INSERT INTO billing_ledger (id, project_id, kind, amount, resource_id, period_start, created_at, reference)
 VALUES (?, ?, 'charge', -100, ?, ?, ?, 'hour:server')`, chargeC, f.project, f.cc, store.FormatTime(f.hourStart.Add(-7*time.Hour)), store.FormatTime(time.Now()))
			}, []string{"charges-without-usage | charge " + chargeC}},
			{"an hour charged twice", func(t *testing.T) {
				chargeB = uuid.NewString()
				f.exec(t, `INSERT INTO billing_ledger (id, project_id, kind, amount, resource_id, period_start, created_at, reference)
 VALUES (?, ?, 'charge', -100, ?, ?, ?, 'hour:server')`, chargeB, f.project, f.b, store.FormatTime(f.hourStart.Add(-3*time.Hour+30*time.Minute)), store.FormatTime(time.Now()))
			}, []string{"charges-twice | charge " + chargeB}},
			{"a project's count of open periods too low", func(t *testing.T) {
				f.exec(t, "UPDATE metering_open_counts SET open_count = open_count - 1 WHERE project_id = ? AND kind = 'server'", f.project)
			}, []string{"open-period-counts | project " + f.project}},
			{"a host whose agent went silent, and a VM there without a server", func(t *testing.T) {
				var inv string
				if err := f.c.DB.QueryRow(context.Background(), "SELECT inventory FROM fleet_hosts WHERE name = 'fake-host-4'").Scan(&inv); err != nil {
					t.Fatal(err)
				}
				old := store.FormatTime(time.Now().Add(-time.Hour))
				f.exec(t, `INSERT INTO fleet_hosts (name, agent_id, inventory, up, observed, registered_at, position, seen_at)
 VALUES ('ghost-host', 'ghost-agent', ?, 1, 1, ?, 99, ?)`, strings.Replace(inv, "fake-host-4", "ghost-host", 1), old, old)
				f.exec(t, "INSERT INTO fleet_instances (server_id, host, power, observed, gone, updated_at) VALUES (?, 'ghost-host', 1, 1, 0, ?)", ghostVM, old)
			}, []string{"hosts-silent | host ghost-host", "vms-without-servers | VM " + ghostVM}},
			{"a port bound to a deleted server", func(t *testing.T) {
				f.exec(t, "UPDATE ports SET bound_by = 'compute', bound_device = ?, device_id = ?, device_owner = 'compute:nova' WHERE id = ?", f.d, f.d, f.port)
			}, []string{"ports-of-deleted-servers | port " + f.port}},
			{"a floating IP of a deleted server", func(t *testing.T) {
				f.exec(t, "UPDATE floatingips SET server_id = ? WHERE id = ?", f.d, f.fip)
			}, []string{"addresses-of-deleted-servers | floating IP " + f.fip}},
			{"a volume attached to a deleted server", func(t *testing.T) {
				now := store.FormatTime(time.Now())
				f.exec(t, `INSERT INTO volume_attachments (id, volume_id, project_id, instance_uuid, attach_status, origin, created_at, updated_at)
 VALUES (?, ?, ?, ?, 'attached', 'compute', ?, ?)`, uuid.NewString(), f.vol, f.project, f.d, now, now)
				f.exec(t, "UPDATE volumes SET status = 'in-use' WHERE id = ?", f.vol)
			}, []string{"volumes-of-deleted-servers | volume " + f.vol}},
			// Last: it moves billing's window back.
			{"billing behind", func(t *testing.T) {
				f.exec(t, "UPDATE billing_state SET value = ? WHERE name = 'charged_through'", store.FormatTime(f.hourStart.Add(-10*time.Hour)))
			}, []string{"charging-behind | billing's charging pass"}},
			// After billing: the controllers stop, or they would take the
			// work at their next look.
			{"a server's work left by a dead controller, and one whose lease was never taken", func(t *testing.T) {
				f.c.Close()
				db, err := store.Open(context.Background(), f.c.Config.DatabaseURL)
				if err != nil {
					t.Fatal(err)
				}
				defer db.Close()
				old := store.FormatTime(time.Now().Add(-time.Hour))
				for _, q := range []struct {
					sql  string
					args []any
				}{
					{"UPDATE compute_servers SET work_due = 1, updated_at = ? WHERE id IN (?, ?)", []any{old, f.a, f.b}},
					{"INSERT INTO leases (name, holder, expires_at, acquired_at) VALUES (?, 'ctl-dead', ?, ?)", []any{"server/" + f.a, old, old}},
					// Lapsed only lately: another controller is about to take it.
					{"UPDATE compute_servers SET work_due = 1, updated_at = ? WHERE id = ?", []any{old, f.cc}},
					{"INSERT INTO leases (name, holder, expires_at, acquired_at) VALUES (?, 'ctl-dead', ?, ?)", []any{"server/" + f.cc, store.FormatTime(time.Now().Add(-time.Minute)), old}},
				} {
					if _, err := db.Exec(context.Background(), q.sql, q.args...); err != nil {
						t.Fatal(err)
					}
				}
			}, []string{"work-left-by-the-dead | server " + f.a, "work-left-by-the-dead | server " + f.b}},
		}
		before := f.findings(t)
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				tc.broke(t)
				after := f.findings(t)
				var fresh []string
				for k := range after {
					if _, ok := before[k]; !ok {
						fresh = append(fresh, k)
					}
				}
				sort.Strings(fresh)
				matched := 0
				for _, w := range tc.want {
					n := 0
					for _, k := range fresh {
						if strings.HasPrefix(k, w) {
							n++
							x := after[k]
							if x.Problem == "" || x.Repair == "" {
								t.Errorf("%s: no problem or repair: %+v", k, x)
							}
							t.Logf("%s\n  %s\n  mend: %s", k, x.Problem, x.Repair)
						}
					}
					if n != 1 {
						t.Errorf("want one new finding %q, got %d among %q", w, n, fresh)
					}
					matched += n
				}
				if matched != len(fresh) {
					t.Errorf("new findings %q, want only %q", fresh, tc.want)
				}
				before = after
			})
		}
	})
}
