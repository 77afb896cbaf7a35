package volume_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http/httptest"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/transfers"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/projects"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/roles"
	idusers "github.com/gophercloud/gophercloud/v2/openstack/identity/v3/users"

	"nimbus/internal/api"
	"nimbus/internal/billing"
	"nimbus/internal/cloud"
	"nimbus/internal/store"
	"nimbus/internal/testenv"
	"nimbus/internal/volume"
)

// transferEnv is env with a second customer project, alt, that accepts
// what demo offers.
type transferEnv struct {
	*env
	alt                      *gophercloud.ServiceClient
	altTok, altProj, altUser string
}

func newTransferEnv(t *testing.T, dbURL string) *transferEnv {
	ctx := context.Background()
	e := &transferEnv{env: newEnv(t, dbURL)}
	id, err := openstack.NewIdentityV3(testenv.Provider(t, e.c, cloud.AdminUser), gophercloud.EndpointOpts{Region: "RegionOne"})
	if err != nil {
		t.Fatal(err)
	}
	p, err := projects.Create(ctx, id, projects.CreateOpts{Name: "alt", DomainID: "default"}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	u, err := idusers.Create(ctx, id, idusers.CreateOpts{Name: "alt", DomainID: "default", Password: "alt-pw",
		DefaultProjectID: p.ID}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	pages, err := roles.List(id, roles.ListOpts{Name: "member"}).AllPages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := roles.ExtractRoles(pages)
	if err != nil || len(rs) != 1 {
		t.Fatalf("member role: %v %v", rs, err)
	}
	if err := roles.Assign(ctx, id, rs[0].ID, roles.AssignOpts{UserID: u.ID, ProjectID: p.ID}).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	altPC := testenv.ProviderAs(t, e.c, "alt", "alt-pw", "alt")
	if e.alt, err = openstack.NewBlockStorageV3(altPC, gophercloud.EndpointOpts{Region: "RegionOne"}); err != nil {
		t.Fatal(err)
	}
	e.altTok, e.altProj, e.altUser = altPC.Token(), p.ID, u.ID
	t.Cleanup(func() { e.alt.ProviderClient.HTTPClient.CloseIdleConnections() })
	return e
}

// TestTransfers runs volume transfers over real HTTP on both engines:
// offer, list and show by the giver only, accept by another project with
// the key (the volume, its snapshots, the quota usage and the usage
// periods move), no_snapshots (3.55) and the 3.57 fields, over-quota
// accepts that change nothing, cancelling, and what an offered volume
// refuses.
func TestTransfers(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newTransferEnv(t, dbURL)
		t.Run("Accept", e.testTransferAccept)
		t.Run("NoSnapshots", e.testTransferNoSnapshots)
		t.Run("OverQuota", e.testTransferOverQuota)
		t.Run("Refusals", e.testTransferRefusals)
	})
}

// usageOf is a project's quota usage as an admin reads it: in_use per
// resource.
func (e *transferEnv) usageOf(t *testing.T, project string) map[string]int64 {
	t.Helper()
	m := e.want(t, 200, "GET", "/v3/os-quota-sets/"+project+"?usage=true", e.adTok, "")
	out := map[string]int64{}
	for _, k := range []string{"volumes", "gigabytes", "snapshots"} {
		out[k] = int64(m["quota_set"].(map[string]any)[k].(map[string]any)["in_use"].(float64))
	}
	return out
}

// snapshotOf takes an available snapshot of volume id as demo.
func (e *transferEnv) snapshotOf(t *testing.T, id string) string {
	t.Helper()
	sn := e.want(t, 202, "POST", "/v3/snapshots", e.demoTok, `{"snapshot":{"volume_id":"`+id+`","name":"s"}}`)["snapshot"].(map[string]any)
	waitSnap(t, e.demo, sn["id"].(string), "available")
	return sn["id"].(string)
}

// periods are a resource's usage periods, oldest first, as
// "project:open|closed".
func (e *transferEnv) periods(t *testing.T, id string) []string {
	t.Helper()
	rows, err := e.c.DB.Query(context.Background(), "SELECT project_id, ended_at FROM metering_periods WHERE resource_id = ? ORDER BY started_at, id", id)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var p, end string
		if err := rows.Scan(&p, &end); err != nil {
			t.Fatal(err)
		}
		state := "closed"
		if end == "" {
			state = "open"
		}
		name := map[string]string{e.demoProj: "demo", e.altProj: "alt"}[p]
		out = append(out, name+":"+state)
	}
	return out
}

var hexKey = regexp.MustCompile(`^[0-9a-f]{16}$`)

func (e *transferEnv) testTransferAccept(t *testing.T) {
	ctx := context.Background()
	vol := e.snapVolume(t, 1, "gift")
	snap := e.snapshotOf(t, vol)
	demoBefore, altBefore := e.usageOf(t, e.demoProj), e.usageOf(t, e.altProj)

	tr, err := transfers.Create(ctx, e.demo, transfers.CreateOpts{VolumeID: vol, Name: " present "}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	if !hexKey.MatchString(tr.AuthKey) || tr.VolumeID != vol || tr.Name != "present" || tr.CreatedAt.IsZero() || len(tr.Links) != 2 {
		t.Fatalf("created transfer %+v", tr)
	}
	waitStatus(t, e.demo, vol, "awaiting-transfer")
	// The key is shown once: never again by show or lists, and not stored.
	shown := e.want(t, 200, "GET", "/v3/os-volume-transfer/"+tr.ID, e.demoTok, "")["transfer"].(map[string]any)
	if _, ok := shown["auth_key"]; ok || shown["volume_id"] != vol || shown["created_at"] == nil || shown["name"] != "present" {
		t.Errorf("shown transfer: %v", shown)
	}
	var stored string
	if err := e.c.DB.QueryRow(ctx, "SELECT salt || crypt_hash FROM volume_transfers WHERE id = ?", tr.ID).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(stored, tr.AuthKey) {
		t.Errorf("the auth key is stored: %s", stored)
	}
	for _, path := range []string{"/v3/os-volume-transfer", "/v3/os-volume-transfer/detail", "/v3/volume-transfers/detail"} {
		m := e.want(t, 200, "GET", path, e.demoTok, "")
		ts := m["transfers"].([]any)
		if len(ts) != 1 || ts[0].(map[string]any)["id"] != tr.ID || ts[0].(map[string]any)["auth_key"] != nil {
			t.Errorf("demo's %s: %v", path, m)
		}
		if d := strings.HasSuffix(path, "detail"); d != (ts[0].(map[string]any)["created_at"] != nil) {
			t.Errorf("%s: created_at in the detail view only: %v", path, m)
		}
		if m := e.want(t, 200, "GET", path, e.altTok, ""); len(m["transfers"].([]any)) != 0 {
			t.Errorf("alt sees demo's transfer in %s: %v", path, m)
		}
	}
	pages, err := transfers.List(e.demo, nil).AllPages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ts, _ := transfers.ExtractTransfers(pages); len(ts) != 1 || ts[0].ID != tr.ID || ts[0].AuthKey != "" {
		t.Errorf("gophercloud list: %+v", ts)
	}
	if m := e.want(t, 200, "GET", "/v3/os-volume-transfer?all_tenants=1", e.adTok, ""); len(m["transfers"].([]any)) != 1 {
		t.Errorf("admin's all_tenants list: %v", m)
	}
	if m := e.want(t, 200, "GET", "/v3/os-volume-transfer", e.adTok, ""); len(m["transfers"].([]any)) != 0 {
		t.Errorf("admin's own list: %v", m)
	}
	e.want(t, 404, "GET", "/v3/os-volume-transfer/"+tr.ID, e.altTok, "")
	e.want(t, 404, "DELETE", "/v3/os-volume-transfer/"+tr.ID, e.altTok, "")

	// A wrong key is Cinder's 400 and changes nothing.
	m := e.want(t, 400, "POST", "/v3/os-volume-transfer/"+tr.ID+"/accept", e.altTok, `{"accept":{"auth_key":"0123456789abcdef"}}`)
	if msg := m["badRequest"].(map[string]any)["message"]; msg != "Invalid auth key: Attempt to transfer "+tr.ID+" with invalid auth key." {
		t.Errorf("wrong key: %v", m)
	}
	waitStatus(t, e.demo, vol, "awaiting-transfer")

	acc, err := transfers.Accept(ctx, e.alt, tr.ID, transfers.AcceptOpts{AuthKey: tr.AuthKey}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	if acc.ID != tr.ID || acc.VolumeID != vol || acc.Name != "present" || len(acc.Links) != 2 {
		t.Errorf("accepted: %+v", acc)
	}
	// The volume is alt's, as Tempest reads it as alt.
	v := e.want(t, 200, "GET", "/v3/volumes/"+vol, e.altTok, "")["volume"].(map[string]any)
	if v["status"] != "available" || v["user_id"] != e.altUser || v["os-vol-tenant-attr:tenant_id"] != e.altProj {
		t.Errorf("accepted volume: %v", v)
	}
	e.want(t, 404, "GET", "/v3/volumes/"+vol, e.demoTok, "")
	sn := e.want(t, 200, "GET", "/v3/snapshots/"+snap, e.altTok, "")["snapshot"].(map[string]any)
	if sn["os-extended-snapshot-attributes:project_id"] != e.altProj {
		t.Errorf("snapshot after accept: %v", sn)
	}
	e.want(t, 404, "GET", "/v3/snapshots/"+snap, e.demoTok, "")
	// Usage moved: volume, its gigabytes and the snapshot's.
	demoAfter, altAfter := e.usageOf(t, e.demoProj), e.usageOf(t, e.altProj)
	for k, d := range map[string]int64{"volumes": 1, "gigabytes": 2, "snapshots": 1} {
		if demoBefore[k]-demoAfter[k] != d || altAfter[k]-altBefore[k] != d {
			t.Errorf("%s usage: demo %d→%d, alt %d→%d, want ∓%d", k, demoBefore[k], demoAfter[k], altBefore[k], altAfter[k], d)
		}
	}
	// The usage periods: demo's ended at the accept, alt's runs.
	for _, id := range []string{vol, snap} {
		if got := e.periods(t, id); !slices.Equal(got, []string{"demo:closed", "alt:open"}) {
			t.Errorf("periods of %s: %v", id, got)
		}
	}
	// An accepted transfer is gone for everyone.
	e.want(t, 404, "GET", "/v3/os-volume-transfer/"+tr.ID, e.demoTok, "")
	e.want(t, 404, "DELETE", "/v3/os-volume-transfer/"+tr.ID, e.demoTok, "")
	e.want(t, 404, "POST", "/v3/os-volume-transfer/"+tr.ID+"/accept", e.adTok, `{"accept":{"auth_key":"`+tr.AuthKey+`"}}`)
	if m := e.want(t, 200, "GET", "/v3/os-volume-transfer/detail", e.demoTok, ""); len(m["transfers"].([]any)) != 0 {
		t.Errorf("accepted transfer still listed: %v", m)
	}
	// The new owner may use it: extend, then give it back.
	e.want(t, 202, "POST", "/v3/volumes/"+vol+"/action", e.altTok, `{"os-extend":{"new_size":2}}`)
	waitStatus(t, e.alt, vol, "available")
	e.want(t, 202, "DELETE", "/v3/snapshots/"+snap, e.altTok, "")
	waitSnap(t, e.alt, snap, "")
	e.want(t, 202, "DELETE", "/v3/volumes/"+vol, e.altTok, "")
	waitGone(t, e.alt, vol)
}

func (e *transferEnv) testTransferNoSnapshots(t *testing.T) {
	vol := e.snapVolume(t, 1, "bare")
	snap := e.snapshotOf(t, vol)
	mv := func(v string) []string { return []string{"OpenStack-API-Version", "volume " + v} }
	// no_snapshots is 3.55's: refused before.
	e.want(t, 400, "POST", "/v3/volume-transfers", e.demoTok, `{"transfer":{"volume_id":"`+vol+`","no_snapshots":true}}`, mv("3.54")...)
	tr := e.want(t, 202, "POST", "/v3/volume-transfers", e.demoTok, `{"transfer":{"volume_id":"`+vol+`","no_snapshots":true}}`,
		mv("3.57")...)["transfer"].(map[string]any)
	if tr["no_snapshots"] != true || tr["source_project_id"] != e.demoProj || tr["destination_project_id"] != nil ||
		tr["accepted"] != false || tr["name"] != nil || !hexKey.MatchString(tr["auth_key"].(string)) {
		t.Fatalf("created at 3.57: %v", tr)
	}
	id := tr["id"].(string)
	for _, c := range []struct {
		version string
		want    map[string]bool // field: present
	}{
		{"3.54", map[string]bool{"no_snapshots": false, "source_project_id": false, "accepted": false}},
		{"3.55", map[string]bool{"no_snapshots": true, "source_project_id": false, "accepted": false}},
		{"3.57", map[string]bool{"no_snapshots": true, "source_project_id": true, "destination_project_id": true, "accepted": true}},
	} {
		shown := e.want(t, 200, "GET", "/v3/volume-transfers/"+id, e.demoTok, "", mv(c.version)...)["transfer"].(map[string]any)
		for k, present := range c.want {
			if _, ok := shown[k]; ok != present {
				t.Errorf("at %s %s present %v, want %v: %v", c.version, k, ok, present, shown)
			}
		}
	}
	before := e.usageOf(t, e.demoProj)
	e.want(t, 202, "POST", "/v3/volume-transfers/"+id+"/accept", e.altTok, `{"accept":{"auth_key":"`+tr["auth_key"].(string)+`"}}`, mv("3.55")...)
	// The volume moves; its snapshot stays demo's, as Cinder's
	// transfer_accept leaves the snapshots when no_snapshots is set.
	waitStatus(t, e.alt, vol, "available")
	sn := e.want(t, 200, "GET", "/v3/snapshots/"+snap, e.demoTok, "")["snapshot"].(map[string]any)
	if sn["os-extended-snapshot-attributes:project_id"] != e.demoProj {
		t.Errorf("snapshot moved: %v", sn)
	}
	after := e.usageOf(t, e.demoProj)
	if before["volumes"]-after["volumes"] != 1 || before["gigabytes"]-after["gigabytes"] != 1 || after["snapshots"] != before["snapshots"] {
		t.Errorf("demo usage %v → %v", before, after)
	}
	if got := e.periods(t, snap); !slices.Equal(got, []string{"demo:open"}) {
		t.Errorf("snapshot periods: %v", got)
	}
	// The accepted transfer is kept, deleted, with its history.
	var dest string
	var accepted, deleted int
	if err := e.c.DB.QueryRow(context.Background(), "SELECT destination_project_id, accepted, deleted FROM volume_transfers WHERE id = ?", id).
		Scan(&dest, &accepted, &deleted); err != nil || dest != e.altProj || accepted != 1 || deleted != 1 {
		t.Errorf("transfer row: %s %d %d %v", dest, accepted, deleted, err)
	}
	e.want(t, 202, "DELETE", "/v3/snapshots/"+snap, e.demoTok, "")
	waitSnap(t, e.demo, snap, "")
	e.want(t, 202, "DELETE", "/v3/volumes/"+vol, e.altTok, "")
	waitGone(t, e.alt, vol)
}

func (e *transferEnv) testTransferOverQuota(t *testing.T) {
	vol := e.snapVolume(t, 2, "heavy")
	snap := e.snapshotOf(t, vol)
	tr := e.want(t, 202, "POST", "/v3/os-volume-transfer", e.demoTok, `{"transfer":{"volume_id":"`+vol+`"}}`)["transfer"].(map[string]any)
	accept := `{"accept":{"auth_key":"` + tr["auth_key"].(string) + `"}}`
	used := e.usageOf(t, e.altProj)
	t.Cleanup(func() { e.want(t, 200, "DELETE", "/v3/os-quota-sets/"+e.altProj, e.adTok, "") })
	for _, c := range []struct {
		name, quota, msg string
	}{
		{"volumes", `{"volumes":` + strconv.FormatInt(used["volumes"], 10) + `}`,
			"Maximum number of volumes allowed (" + strconv.FormatInt(used["volumes"], 10) + ") exceeded for quota 'volumes'."},
		{"gigabytes", `{"gigabytes":` + strconv.FormatInt(used["gigabytes"]+3, 10) + `}`,
			"Requested volume or snapshot exceeds allowed gigabytes quota. Requested 2G, quota is " +
				strconv.FormatInt(used["gigabytes"]+3, 10) + "G and " + strconv.FormatInt(used["gigabytes"]+2, 10) + "G has been consumed."},
		{"snapshots", `{"snapshots":` + strconv.FormatInt(used["snapshots"], 10) + `}`,
			"Maximum number of snapshots allowed (" + strconv.FormatInt(used["snapshots"], 10) + ") exceeded for quota 'snapshots'."},
		{"per_volume_gigabytes", `{"per_volume_gigabytes":1}`, "Requested volume size 2G is larger than maximum allowed limit 1G."},
	} {
		t.Run(c.name, func(t *testing.T) {
			e.want(t, 200, "DELETE", "/v3/os-quota-sets/"+e.altProj, e.adTok, "")
			e.want(t, 200, "PUT", "/v3/os-quota-sets/"+e.altProj, e.adTok, `{"quota_set":`+c.quota+`}`)
			m := e.want(t, 413, "POST", "/v3/os-volume-transfer/"+tr["id"].(string)+"/accept", e.altTok, accept)
			if msg := m["overLimit"].(map[string]any)["message"]; msg != c.msg {
				t.Errorf("message %q, want %q", msg, c.msg)
			}
			// Nothing changed.
			v := e.want(t, 200, "GET", "/v3/volumes/"+vol, e.demoTok, "")["volume"].(map[string]any)
			if v["status"] != "awaiting-transfer" || v["os-vol-tenant-attr:tenant_id"] != e.demoProj {
				t.Errorf("volume after a refused accept: %v", v)
			}
			if got := e.usageOf(t, e.altProj); got["volumes"] != used["volumes"] || got["gigabytes"] != used["gigabytes"] {
				t.Errorf("alt usage %v, was %v", got, used)
			}
			if got := e.periods(t, vol); !slices.Equal(got, []string{"demo:open"}) {
				t.Errorf("periods: %v", got)
			}
			e.want(t, 200, "GET", "/v3/os-volume-transfer/"+tr["id"].(string), e.demoTok, "")
		})
	}
	// With room, the same key is still good.
	e.want(t, 200, "DELETE", "/v3/os-quota-sets/"+e.altProj, e.adTok, "")
	e.want(t, 202, "POST", "/v3/os-volume-transfer/"+tr["id"].(string)+"/accept", e.altTok, accept)
	waitStatus(t, e.alt, vol, "available")
	e.want(t, 202, "DELETE", "/v3/snapshots/"+snap, e.altTok, "")
	waitSnap(t, e.alt, snap, "")
	e.want(t, 202, "DELETE", "/v3/volumes/"+vol, e.altTok, "")
	waitGone(t, e.alt, vol)
}

func (e *transferEnv) testTransferRefusals(t *testing.T) {
	ctx := context.Background()
	vol := e.snapVolume(t, 1, "kept")
	tr, err := transfers.Create(ctx, e.demo, transfers.CreateOpts{VolumeID: vol}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	other := e.snapVolume(t, 1, "other")
	creating := e.snapshotOf(t, other)
	// A snapshot still being made keeps a transfer with snapshots from
	// starting: one made, set back by hand.
	if _, err := e.c.DB.Exec(ctx, "UPDATE volume_snapshots SET status = 'creating' WHERE id = ?", creating); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name                   string
		method, path, tok, bod string
		status                 int
		msg                    string
	}{
		{"offered twice", "POST", "/v3/os-volume-transfer", e.demoTok, `{"transfer":{"volume_id":"` + vol + `"}}`, 400,
			"Invalid volume: status must be available"},
		{"snapshot not available", "POST", "/v3/os-volume-transfer", e.demoTok, `{"transfer":{"volume_id":"` + other + `"}}`, 400,
			"Invalid snapshot: snapshot: " + creating + " status must be available"},
		{"another project's volume", "POST", "/v3/os-volume-transfer", e.altTok, `{"transfer":{"volume_id":"` + other + `"}}`, 404,
			"Volume " + other + " could not be found."},
		{"no volume_id", "POST", "/v3/os-volume-transfer", e.demoTok, `{"transfer":{"name":"x"}}`, 400, ""},
		{"not a uuid", "POST", "/v3/os-volume-transfer", e.demoTok, `{"transfer":{"volume_id":"nope"}}`, 400, ""},
		{"unknown field", "POST", "/v3/os-volume-transfer", e.demoTok, `{"transfer":{"volume_id":"` + other + `","x":1}}`, 400, ""},
		{"no body", "POST", "/v3/os-volume-transfer", e.demoTok, `{}`, 400, "Missing required element 'transfer' in request body."},
		{"no such transfer", "GET", "/v3/os-volume-transfer/6f2b6f4e-0000-4000-8000-000000000000", e.demoTok, "", 404,
			"Transfer 6f2b6f4e-0000-4000-8000-000000000000 could not be found."},
		{"accept without key", "POST", "/v3/os-volume-transfer/" + tr.ID + "/accept", e.altTok, `{"accept":{}}`, 400, ""},
		{"accept unknown", "POST", "/v3/os-volume-transfer/6f2b6f4e-0000-4000-8000-000000000000/accept", e.altTok,
			`{"accept":{"auth_key":"x"}}`, 404, ""},
		// An offered volume is neither deleted, extended, snapshotted,
		// attached, backed up, retyped, uploaded nor cloned: its status
		// says why.
		{"delete", "DELETE", "/v3/volumes/" + vol, e.demoTok, "", 400, "~awaiting a transfer"},
		{"extend", "POST", "/v3/volumes/" + vol + "/action", e.demoTok, `{"os-extend":{"new_size":2}}`, 400, "~awaiting-transfer"},
		{"snapshot", "POST", "/v3/snapshots", e.demoTok, `{"snapshot":{"volume_id":"` + vol + `","force":true}}`, 400, "~awaiting-transfer"},
		{"reserve", "POST", "/v3/volumes/" + vol + "/action", e.demoTok, `{"os-reserve":{}}`, 400, "~awaiting-transfer"},
		{"attachment", "POST", "/v3/attachments", e.demoTok, `{"attachment":{"volume_uuid":"` + vol + `","instance_uuid":"6f2b6f4e-0000-4000-8000-000000000001"}}`, 400, "~status must be available"},
		{"backup", "POST", "/v3/backups", e.demoTok, `{"backup":{"volume_id":"` + vol + `"}}`, 400, "~awaiting-transfer"},
		{"retype", "POST", "/v3/volumes/" + vol + "/action", e.demoTok, `{"os-retype":{"new_type":"__DEFAULT__"}}`, 400, "~awaiting-transfer"},
		{"upload", "POST", "/v3/volumes/" + vol + "/action", e.demoTok, `{"os-volume_upload_image":{"image_name":"x"}}`, 400, "~awaiting-transfer"},
		{"clone", "POST", "/v3/volumes", e.demoTok, `{"volume":{"source_volid":"` + vol + `"}}`, 400, "~awaiting-transfer"},
	} {
		t.Run(c.name, func(t *testing.T) {
			resp, m := e.do(t, c.method, c.path, c.tok, c.bod, "OpenStack-API-Version", "volume 3.60")
			if resp.StatusCode != c.status {
				t.Fatalf("status %d, want %d: %v", resp.StatusCode, c.status, m)
			}
			if c.msg != "" {
				var msg any
				for _, f := range m {
					msg = f.(map[string]any)["message"]
				}
				if sub, ok := strings.CutPrefix(c.msg, "~"); ok {
					if m, _ := msg.(string); !strings.Contains(m, sub) {
						t.Errorf("message %q, want one about %q", msg, sub)
					}
				} else if msg != c.msg {
					t.Errorf("message %q, want %q", msg, c.msg)
				}
			}
		})
	}
	waitStatus(t, e.demo, vol, "awaiting-transfer")
	// Deleting the transfer cancels it: the volume is available again.
	if err := transfers.Delete(ctx, e.demo, tr.ID).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, e.demo, vol, "available")
	e.want(t, 404, "GET", "/v3/os-volume-transfer/"+tr.ID, e.demoTok, "")
	e.want(t, 404, "POST", "/v3/os-volume-transfer/"+tr.ID+"/accept", e.altTok, `{"accept":{"auth_key":"`+tr.AuthKey+`"}}`)
	// An admin's force delete takes the offer with the volume.
	tr2 := e.want(t, 202, "POST", "/v3/os-volume-transfer", e.demoTok, `{"transfer":{"volume_id":"`+vol+`"}}`)["transfer"].(map[string]any)
	e.want(t, 202, "POST", "/v3/volumes/"+vol+"/action", e.adTok, `{"os-force_delete":{}}`)
	waitGone(t, e.demo, vol)
	e.want(t, 404, "GET", "/v3/os-volume-transfer/"+tr2["id"].(string), e.demoTok, "")
	if _, err := e.c.DB.Exec(ctx, "UPDATE volume_snapshots SET status = 'available' WHERE id = ?", creating); err != nil {
		t.Fatal(err)
	}
	e.want(t, 202, "DELETE", "/v3/snapshots/"+creating, e.demoTok, "")
	waitSnap(t, e.demo, creating, "")
	e.want(t, 202, "DELETE", "/v3/volumes/"+other, e.demoTok, "")
	waitGone(t, e.demo, other)
}

// twoUsers is an authenticator of two customer projects.
type twoUsers struct{}

func (twoUsers) Validate(_ context.Context, tok string) (*api.Caller, error) {
	switch tok {
	case "tok1":
		return &api.Caller{UserID: "u1", ProjectID: "p1", Roles: []string{"member"}}, nil
	case "tok2":
		return &api.Caller{UserID: "u2", ProjectID: "p2", Roles: []string{"member"}}, nil
	}
	return nil, api.Unauthorized()
}

// TestTransferCharges runs billing's charging pass over a transfer with
// an injected clock: the giver pays every hour up to and including the
// accept's, the taker from the next, each hour charged once.
func TestTransferCharges(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		db, err := store.Open(ctx, dbURL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		clk := &clock{}
		clk.set("2026-03-01T09:50:00Z")
		quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
		b := billing.New(db, billing.Config{Now: clk.now, Log: quiet, DefaultCreditLimit: 1 << 40})
		if _, err := b.SetPrices(ctx, map[string]int64{"volume_gb": billing.RateScale}); err != nil {
			t.Fatal(err)
		}
		svc := volume.New(volume.Config{DB: db, DataDir: t.TempDir(), Now: clk.now, Log: quiet})
		t.Cleanup(svc.Close)
		if err := svc.Bootstrap(ctx); err != nil {
			t.Fatal(err)
		}
		a := svc.API(twoUsers{}, "")
		a.Log = quiet
		srv := httptest.NewServer(a)
		t.Cleanup(srv.Close)
		call := func(method, path, tok, body string, want int) map[string]any {
			t.Helper()
			resp, raw := testenv.Do(t, srv.Client(), method, srv.URL+path, tok, body)
			testenv.MustStatus(t, resp, raw, want)
			var m map[string]any
			if raw != "" {
				json.Unmarshal([]byte(raw), &m)
			}
			return m
		}
		waitFor := func(id, tok, status string) {
			t.Helper()
			for i := 0; i < 500; i++ {
				resp, raw := testenv.Do(t, srv.Client(), "GET", srv.URL+"/v3/volumes/"+id, tok, "")
				if resp.StatusCode == 200 && strings.Contains(raw, `"status":"`+status+`"`) {
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
			t.Fatalf("volume %s never reached %q", id, status)
		}
		charge := func(now string) {
			t.Helper()
			clk.set(now)
			if _, err := b.ChargeUntil(ctx, clk.now()); err != nil {
				t.Fatal(err)
			}
		}

		charge("2026-03-01T09:55:00Z")
		clk.set("2026-03-01T10:20:00Z")
		id := call("POST", "/v3/volumes", "tok1", `{"volume":{"size":2,"name":"billed"}}`, 202)["volume"].(map[string]any)["id"].(string)
		waitFor(id, "tok1", "available")
		charge("2026-03-01T10:30:00Z")
		clk.set("2026-03-01T11:10:00Z")
		tr := call("POST", "/v3/os-volume-transfer", "tok1", `{"transfer":{"volume_id":"`+id+`"}}`, 202)["transfer"].(map[string]any)
		clk.set("2026-03-01T11:30:00Z")
		call("POST", "/v3/os-volume-transfer/"+tr["id"].(string)+"/accept", "tok2", `{"accept":{"auth_key":"`+tr["auth_key"].(string)+`"}}`, 202)
		charge("2026-03-01T12:05:00Z")
		charge("2026-03-01T12:35:00Z") // again within the hour: nothing new
		charge("2026-03-01T13:05:00Z")

		rows, err := db.Query(ctx, `SELECT period_start, project_id, amount FROM billing_ledger WHERE kind = 'charge' AND resource_id = ?
			ORDER BY period_start, project_id`, id)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var got []string
		for rows.Next() {
			var start, project string
			var amount int64
			if err := rows.Scan(&start, &project, &amount); err != nil {
				t.Fatal(err)
			}
			got = append(got, store.ParseTime(start).UTC().Format("15")+":"+project+":"+strconv.FormatInt(amount, 10))
		}
		// p1 pays hours 10 and 11 (the accept's, 11:30), p2 from 12 on.
		if want := []string{"10:p1:-2", "11:p1:-2", "12:p2:-2", "13:p2:-2"}; !slices.Equal(got, want) {
			t.Fatalf("charges %v, want %v", got, want)
		}
	})
}
