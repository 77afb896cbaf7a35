package volume_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/limits"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/quotasets"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/snapshots"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/volumes"

	"nimbus/internal/billing"
	"nimbus/internal/store"
	"nimbus/internal/testenv"
	"nimbus/internal/volume"
)

// TestSnapshots runs snapshots over real HTTP on both engines: their life
// and metadata, lists, errors, quotas, volumes made from them and clones
// holding the source's bytes, delete with and without cascade, and their
// usage periods.
func TestSnapshots(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		t.Run("DataAndClones", e.testSnapData)
		t.Run("API", e.testSnapAPI)
		t.Run("Errors", e.testSnapErrors)
		t.Run("Quotas", e.testSnapQuotas)
		t.Run("DeleteVolume", e.testSnapVolumeDelete)
	})
}

func waitSnap(t *testing.T, sc *gophercloud.ServiceClient, id, status string) *snapshots.Snapshot {
	t.Helper()
	for i := 0; i < 1500; i++ {
		sn, err := snapshots.Get(context.Background(), sc, id).Extract()
		if status == "" && gophercloud.ResponseCodeIs(err, http.StatusNotFound) {
			return nil
		}
		if err == nil && sn.Status == status {
			return sn
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("snapshot %s never reached %q", id, status)
	return nil
}

// snapVolume makes an available volume of size GB.
func (e *env) snapVolume(t *testing.T, size int, name string) string {
	t.Helper()
	v, err := volumes.Create(context.Background(), e.demo, volumes.CreateOpts{Size: size, Name: name}, nil).Extract()
	if err != nil {
		t.Fatal(err)
	}
	waitStatus(t, e.demo, v.ID, "available")
	return v.ID
}

func (e *env) snapPath(id string) string {
	return filepath.Join(filepath.Dir(e.c.Volumes.DataPath(id)), "snapshots", id)
}

// pattern writes b at two offsets of a file, one past the first GiB's
// middle, so that a copy must carry data after a hole.
func writePattern(t *testing.T, path string, b []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, off := range []int64{0, 600 << 20} {
		if _, err := f.WriteAt(b, off); err != nil {
			t.Fatal(err)
		}
	}
}

func checkPattern(t *testing.T, path string, b []byte, size int64) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got := make([]byte, len(b)+8)
	for _, off := range []int64{0, 600 << 20} {
		if _, err := f.ReadAt(got, off); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got[:len(b)], b) || !bytes.Equal(got[len(b):], make([]byte, 8)) {
			t.Errorf("%s at %d: %.40q…, want %.40q…", path, off, got, b)
		}
	}
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != size {
		t.Errorf("%s is %d bytes, want %d", path, fi.Size(), size)
	}
	// Sparse: only the written blocks are allocated.
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Blocks*512 > 16<<20 {
		t.Errorf("%s has %d bytes allocated: not sparse", path, st.Blocks*512)
	}
}

func (e *env) testSnapData(t *testing.T) {
	ctx := context.Background()
	src := e.snapVolume(t, 1, "src")
	before := bytes.Repeat([]byte("snapshot-me!"), 1000)
	writePattern(t, e.c.Volumes.DataPath(src), before)
	if err := volumes.SetBootable(ctx, e.demo, src, volumes.BootableOpts{Bootable: true}).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	sn, err := snapshots.Create(ctx, e.demo, snapshots.CreateOpts{VolumeID: src, Name: "s1"}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	waitSnap(t, e.demo, sn.ID, "available")
	checkPattern(t, e.snapPath(sn.ID), before, 1<<30)
	after := bytes.Repeat([]byte("changed-late"), 1000)
	writePattern(t, e.c.Volumes.DataPath(src), after)

	// A larger volume from the snapshot has the bytes of that moment.
	v, err := volumes.Create(ctx, e.demo, volumes.CreateOpts{Size: 2, SnapshotID: sn.ID}, nil).Extract()
	if err != nil {
		t.Fatal(err)
	}
	if v.SnapshotID != sn.ID || v.Bootable != "true" {
		t.Errorf("volume from snapshot: %+v", v)
	}
	got := waitStatus(t, e.demo, v.ID, "available")
	if got.Size != 2 || got.SnapshotID != sn.ID || got.SourceVolID != "" || got.Bootable != "true" {
		t.Errorf("volume from snapshot: %+v", got)
	}
	checkPattern(t, e.c.Volumes.DataPath(v.ID), before, 2<<30)

	// A clone has the source's bytes of now, and its size by default.
	c, err := volumes.Create(ctx, e.demo, volumes.CreateOpts{SourceVolID: src}, nil).Extract()
	if err != nil {
		t.Fatal(err)
	}
	got = waitStatus(t, e.demo, c.ID, "available")
	if got.Size != 1 || got.SourceVolID != src || got.SnapshotID != "" || got.Bootable != "true" {
		t.Errorf("clone: %+v", got)
	}
	checkPattern(t, e.c.Volumes.DataPath(c.ID), after, 1<<30)

	// Usage periods: open while the snapshot lives, closed at its delete.
	if n := e.openPeriods(t, sn.ID); n != 1 {
		t.Errorf("%d open periods for a live snapshot", n)
	}
	if err := snapshots.Delete(ctx, e.demo, sn.ID).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	waitSnap(t, e.demo, sn.ID, "")
	if n := e.openPeriods(t, sn.ID); n != 0 {
		t.Errorf("%d open periods after delete", n)
	}
	var kind string
	var size int
	if err := e.c.DB.QueryRow(ctx, "SELECT kind, COUNT(*) FROM metering_periods WHERE resource_id = ? GROUP BY kind", sn.ID).Scan(&kind, &size); err != nil || kind != "volume_snapshot" || size != 1 {
		t.Errorf("periods: kind %q, %d (%v)", kind, size, err)
	}
	if _, err := os.Stat(e.snapPath(sn.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("snapshot file left after delete: %v", err)
	}
	for _, id := range []string{v.ID, c.ID, src} {
		e.want(t, 202, "DELETE", "/v3/volumes/"+id, e.demoTok, "")
		waitGone(t, e.demo, id)
	}
}

func (e *env) openPeriods(t *testing.T, id string) int {
	t.Helper()
	var n int
	if err := e.c.DB.QueryRow(context.Background(), "SELECT COUNT(*) FROM metering_periods WHERE resource_id = ? AND ended_at = ''", id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (e *env) testSnapAPI(t *testing.T) {
	vol := e.snapVolume(t, 1, "api")
	m := e.want(t, 202, "POST", "/v3/"+e.demoProj+"/snapshots", e.demoTok,
		`{"snapshot":{"volume_id":"`+vol+`","name":"a","description":"first","metadata":{"k":"v"}}}`)
	s1 := m["snapshot"].(map[string]any)
	if s1["status"] != "creating" || s1["size"] != float64(1) || s1["volume_id"] != vol || s1["name"] != "a" {
		t.Errorf("created: %v", s1)
	}
	id1 := s1["id"].(string)
	m = e.want(t, 202, "POST", "/v3/snapshots", e.demoTok, `{"snapshot":{"volume_id":"`+vol+`","display_name":"b","force":"true"}}`)
	id2 := m["snapshot"].(map[string]any)["id"].(string)
	waitSnap(t, e.demo, id1, "available")
	waitSnap(t, e.demo, id2, "available")

	m = e.want(t, 200, "GET", "/v3/snapshots/"+id1, e.demoTok, "", "OpenStack-API-Version", "volume 3.41")
	if s := m["snapshot"].(map[string]any); s["os-extended-snapshot-attributes:progress"] != "100%" ||
		s["os-extended-snapshot-attributes:project_id"] != e.demoProj || s["user_id"] == nil || s["description"] != "first" {
		t.Errorf("show: %v", s)
	}
	// Create answers the detail view without the extended attributes,
	// lists' summary has neither, the detail list both.
	m = e.want(t, 202, "POST", "/v3/snapshots", e.demoTok, `{"snapshot":{"volume_id":"`+vol+`","name":"c"}}`, "OpenStack-API-Version", "volume 3.41")
	s3 := m["snapshot"].(map[string]any)
	if _, ok := s3["os-extended-snapshot-attributes:progress"]; ok || s3["user_id"] == nil || s3["group_snapshot_id"] != nil {
		t.Errorf("create view: %v", s3)
	}
	waitSnap(t, e.demo, s3["id"].(string), "available")
	e.want(t, 202, "DELETE", "/v3/snapshots/"+s3["id"].(string), e.demoTok, "")
	waitSnap(t, e.demo, s3["id"].(string), "")
	m = e.want(t, 200, "GET", "/v3/snapshots", e.demoTok, "", "OpenStack-API-Version", "volume 3.41")
	if l := m["snapshots"].([]any); len(l) != 2 || l[0].(map[string]any)["user_id"] != nil || l[0].(map[string]any)["os-extended-snapshot-attributes:project_id"] != nil {
		t.Errorf("summary list: %v", m)
	}
	m = e.want(t, 200, "GET", "/v3/snapshots/detail", e.demoTok, "", "OpenStack-API-Version", "volume 3.41")
	if l := m["snapshots"].([]any); len(l) != 2 || l[0].(map[string]any)["user_id"] == nil || l[0].(map[string]any)["os-extended-snapshot-attributes:project_id"] != e.demoProj {
		t.Errorf("detail list: %v", m)
	}
	m = e.want(t, 200, "PUT", "/v3/snapshots/"+id1, e.demoTok, `{"snapshot":{"name":"a2","description":null}}`)
	if s := m["snapshot"].(map[string]any); s["name"] != "a2" || s["description"] != nil {
		t.Errorf("update: %v", s)
	}

	// Metadata sub-resource.
	m = e.want(t, 200, "POST", "/v3/snapshots/"+id1+"/metadata", e.demoTok, `{"metadata":{"x":"1"}}`)
	if md := m["metadata"].(map[string]any); md["x"] != "1" || md["k"] != "v" {
		t.Errorf("merge: %v", m)
	}
	e.want(t, 200, "PUT", "/v3/snapshots/"+id1+"/metadata/x", e.demoTok, `{"meta":{"x":"2"}}`)
	if m = e.want(t, 200, "GET", "/v3/snapshots/"+id1+"/metadata/x", e.demoTok, ""); m["meta"].(map[string]any)["x"] != "2" {
		t.Errorf("item: %v", m)
	}
	e.want(t, 400, "PUT", "/v3/snapshots/"+id1+"/metadata/x", e.demoTok, `{"meta":{"y":"2"}}`)
	e.want(t, 200, "DELETE", "/v3/snapshots/"+id1+"/metadata/x", e.demoTok, "")
	e.want(t, 404, "GET", "/v3/snapshots/"+id1+"/metadata/x", e.demoTok, "")
	m = e.want(t, 200, "PUT", "/v3/snapshots/"+id1+"/metadata", e.demoTok, `{"metadata":{"only":"this"}}`)
	if md := m["metadata"].(map[string]any); len(md) != 1 || md["only"] != "this" {
		t.Errorf("replace: %v", m)
	}

	// Lists: filters, paging, count; other projects' are hidden.
	for _, tt := range []struct {
		query, mv string
		want      []string
	}{
		{"sort=name:asc", "3.0", []string{id1, id2}},
		{"name=b", "3.0", []string{id2}},
		{"volume_id=" + vol + "&sort=name:desc", "3.0", []string{id2, id1}},
		{"status=error", "3.0", nil},
		{"metadata={'only':'this'}", "3.22", []string{id1}},
		{"metadata={'only':'this'}&sort=name:desc", "3.21", []string{id2, id1}}, // ignored before 3.22
		{"all_tenants=1&sort=name:asc", "3.0", []string{id1, id2}},              // a member's all_tenants is its own
	} {
		m := e.want(t, 200, "GET", "/v3/snapshots/detail?"+tt.query, e.demoTok, "", "OpenStack-API-Version", "volume "+tt.mv)
		var got []string
		for _, s := range m["snapshots"].([]any) {
			got = append(got, s.(map[string]any)["id"].(string))
		}
		if len(got) != len(tt.want) || (len(got) > 0 && (got[0] != tt.want[0] || got[len(got)-1] != tt.want[len(tt.want)-1])) {
			t.Errorf("%s: %v, want %v", tt.query, got, tt.want)
		}
	}
	m = e.want(t, 200, "GET", "/v3/snapshots?limit=1&sort=name:asc&with_count=true", e.demoTok, "", "OpenStack-API-Version", "volume 3.45")
	if l := m["snapshots"].([]any); len(l) != 1 || m["count"] != float64(2) || m["snapshots_links"] == nil {
		t.Errorf("page: %v", m)
	}
	// gophercloud follows snapshots_links.
	all, err := snapshots.List(e.demo, snapshots.ListOpts{Limit: 1, Sort: "name:asc"}).AllPages(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if l, _ := snapshots.ExtractSnapshots(all); len(l) != 2 || l[0].ID != id1 || l[1].ID != id2 {
		t.Errorf("all pages: %+v", l)
	}
	if m = e.want(t, 200, "GET", "/v3/snapshots", e.adTok, ""); len(m["snapshots"].([]any)) != 0 {
		t.Errorf("admin's own list: %v", m)
	}
	if m = e.want(t, 200, "GET", "/v3/snapshots?all_tenants=1&project_id="+e.demoProj, e.adTok, ""); len(m["snapshots"].([]any)) != 2 {
		t.Errorf("admin's all_tenants list: %v", m)
	}

	// Admin actions.
	e.want(t, 403, "POST", "/v3/snapshots/"+id1+"/action", e.demoTok, `{"os-reset_status":{"status":"error"}}`)
	e.want(t, 202, "POST", "/v3/snapshots/"+id1+"/action", e.adTok, `{"os-reset_status":{"status":"error"}}`)
	if n := e.openPeriods(t, id1); n != 0 {
		t.Errorf("a snapshot reset to error is still charged")
	}
	e.want(t, 400, "POST", "/v3/snapshots/"+id1+"/action", e.adTok, `{"os-reset_status":{"status":"bogus"}}`)
	for _, id := range []string{id1, id2} {
		e.want(t, 202, "DELETE", "/v3/snapshots/"+id, e.demoTok, "")
		waitSnap(t, e.demo, id, "")
	}
	e.want(t, 202, "DELETE", "/v3/volumes/"+vol, e.demoTok, "")
	waitGone(t, e.demo, vol)
}

func (e *env) testSnapErrors(t *testing.T) {
	const unknown = "6a1b6a2a-3d3e-4b7e-9e43-5c4d4f8f0a11"
	vol := e.snapVolume(t, 1, "err")
	m := e.want(t, 202, "POST", "/v3/snapshots", e.demoTok, `{"snapshot":{"volume_id":"`+vol+`"}}`)
	snap := m["snapshot"].(map[string]any)["id"].(string)
	waitSnap(t, e.demo, snap, "available")
	for _, tt := range []struct {
		name, method, path, body string
		status                   int
		message                  string
	}{
		{"unknown volume", "POST", "/v3/snapshots", `{"snapshot":{"volume_id":"` + unknown + `"}}`, 404,
			"Volume " + unknown + " could not be found."},
		{"no volume_id", "POST", "/v3/snapshots", `{"snapshot":{"name":"x"}}`, 400,
			"Invalid input for field/attribute snapshot. 'volume_id' is a required property"},
		{"a null volume_id", "POST", "/v3/snapshots", `{"snapshot":{"volume_id":null}}`, 404, "Volume None could not be found."},
		{"no body", "POST", "/v3/snapshots", `{}`, 400, "Missing required element 'snapshot' in request body."},
		{"bad force", "POST", "/v3/snapshots", `{"snapshot":{"volume_id":"` + vol + `","force":"maybe"}}`, 400, ""},
		{"unknown field", "POST", "/v3/snapshots", `{"snapshot":{"volume_id":"` + vol + `","bogus":1}}`, 400, ""},
		{"bad metadata", "POST", "/v3/snapshots", `{"snapshot":{"volume_id":"` + vol + `","metadata":{"a":1}}}`, 400, ""},
		{"unknown snapshot", "GET", "/v3/snapshots/" + unknown, "", 404, "Snapshot " + unknown + " could not be found."},
		{"delete unknown", "DELETE", "/v3/snapshots/" + unknown, "", 404, "Snapshot " + unknown + " could not be found."},
		{"update unknown", "PUT", "/v3/snapshots/" + unknown, `{"snapshot":{"name":"x"}}`, 404, ""},
		{"volume from unknown snapshot", "POST", "/v3/volumes", `{"volume":{"snapshot_id":"` + unknown + `"}}`, 404,
			"Snapshot " + unknown + " could not be found."},
		{"clone of unknown volume", "POST", "/v3/volumes", `{"volume":{"source_volid":"` + unknown + `"}}`, 404,
			"Volume " + unknown + " could not be found."},
		{"two sources", "POST", "/v3/volumes", `{"volume":{"snapshot_id":"` + snap + `","source_volid":"` + vol + `"}}`, 400,
			"Invalid input received: May specify only one of snapshot, imageRef or source volume"},
		{"empty sources", "POST", "/v3/volumes", `{"volume":{"snapshot_id":"","source_volid":""}}`, 400,
			"Invalid input received: Volume size 'None' must be an integer and greater than 0"},
		{"unknown action", "POST", "/v3/snapshots/" + snap + "/action", `{"os-bogus":{}}`, 400, "There is no such action: os-bogus"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := e.want(t, tt.status, tt.method, tt.path, e.demoTok, tt.body)
			for _, f := range m {
				if got := f.(map[string]any)["message"]; tt.message != "" && got != tt.message {
					t.Errorf("message %q, want %q", got, tt.message)
				}
			}
		})
	}
	// A volume that is not available: no snapshot, no clone.
	e.want(t, 202, "POST", "/v3/volumes/"+vol+"/action", e.adTok, `{"os-reset_status":{"status":"error"}}`)
	m = e.want(t, 400, "POST", "/v3/snapshots", e.demoTok, `{"snapshot":{"volume_id":"`+vol+`"}}`)
	if got := m["badRequest"].(map[string]any)["message"]; got != "Invalid volume: Volume "+vol+" status must be available, but current status is: error." {
		t.Errorf("not available: %v", got)
	}
	e.want(t, 400, "POST", "/v3/volumes", e.demoTok, `{"volume":{"source_volid":"`+vol+`"}}`)
	// A snapshot that is not available makes no volume, and a volume
	// from a snapshot is at least its size.
	e.want(t, 202, "POST", "/v3/snapshots/"+snap+"/action", e.adTok, `{"os-reset_status":{"status":"creating"}}`)
	m = e.want(t, 400, "POST", "/v3/volumes", e.demoTok, `{"volume":{"snapshot_id":"`+snap+`"}}`)
	if got := m["badRequest"].(map[string]any)["message"]; got != "Invalid snapshot: Originating snapshot status must be one of 'available' values" {
		t.Errorf("snapshot not available: %v", got)
	}
	m = e.want(t, 400, "DELETE", "/v3/snapshots/"+snap, e.demoTok, "")
	if got := m["badRequest"].(map[string]any)["message"]; got != "Invalid snapshot: Snapshot status must be available or error and must not be part of a group." {
		t.Errorf("delete creating: %v", got)
	}
	e.want(t, 202, "POST", "/v3/snapshots/"+snap+"/action", e.adTok, `{"os-force_delete":{}}`)
	waitSnap(t, e.demo, snap, "")
	e.want(t, 202, "DELETE", "/v3/volumes/"+vol, e.demoTok, "")
	waitGone(t, e.demo, vol)
}

func (e *env) testSnapQuotas(t *testing.T) {
	ctx := context.Background()
	vol := e.snapVolume(t, 2, "quota")
	if _, err := quotasets.Update(ctx, e.admin, e.demoProj, quotasets.UpdateOpts{Snapshots: gophercloud.IntToPointer(1),
		Gigabytes: gophercloud.IntToPointer(5)}).Extract(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { quotasets.Delete(ctx, e.admin, e.demoProj) })
	m := e.want(t, 202, "POST", "/v3/snapshots", e.demoTok, `{"snapshot":{"volume_id":"`+vol+`"}}`)
	snap := m["snapshot"].(map[string]any)["id"].(string)
	m = e.want(t, 413, "POST", "/v3/snapshots", e.demoTok, `{"snapshot":{"volume_id":"`+vol+`"}}`)
	if got := m["overLimit"].(map[string]any)["message"]; got != "Maximum number of snapshots allowed (1) exceeded for quota 'snapshots'." {
		t.Errorf("snapshots over quota: %v", got)
	}
	// Snapshots count in gigabytes: 2 (volume) + 2 (snapshot) of 5.
	if _, err := quotasets.Update(ctx, e.admin, e.demoProj, quotasets.UpdateOpts{Snapshots: gophercloud.IntToPointer(5)}).Extract(); err != nil {
		t.Fatal(err)
	}
	m = e.want(t, 413, "POST", "/v3/snapshots", e.demoTok, `{"snapshot":{"volume_id":"`+vol+`"}}`)
	if got := m["overLimit"].(map[string]any)["message"]; got != "Requested volume or snapshot exceeds allowed gigabytes quota. Requested 2G, quota is 5G and 4G has been consumed." {
		t.Errorf("gigabytes over quota: %v", got)
	}
	// Per type: snapshots_network.
	if _, err := quotasets.Update(ctx, e.admin, e.demoProj, quotasets.UpdateOpts{Gigabytes: gophercloud.IntToPointer(100),
		Extra: map[string]any{"snapshots_network": 1}}).Extract(); err != nil {
		t.Fatal(err)
	}
	m = e.want(t, 413, "POST", "/v3/snapshots", e.demoTok, `{"snapshot":{"volume_id":"`+vol+`"}}`)
	if got := m["overLimit"].(map[string]any)["message"]; got != "Maximum number of snapshots allowed (1) exceeded for quota 'snapshots_network'." {
		t.Errorf("per-type over quota: %v", got)
	}
	l, err := limits.Get(ctx, e.demo).Extract()
	if err != nil || l.Absolute.TotalSnapshotsUsed != 1 || l.Absolute.MaxTotalSnapshots != 5 || l.Absolute.TotalGigabytesUsed != 4 {
		t.Errorf("limits: %+v %v", l.Absolute, err)
	}
	u, err := quotasets.GetUsage(ctx, e.demo, e.demoProj).Extract()
	if err != nil || u.Snapshots.InUse != 1 || u.Gigabytes.InUse != 4 {
		t.Errorf("usage: %+v %v", u, err)
	}
	// A limit below the snapshots in use is refused.
	if _, err := quotasets.Update(ctx, e.admin, e.demoProj, quotasets.UpdateOpts{Snapshots: gophercloud.IntToPointer(0)}).Extract(); !gophercloud.ResponseCodeIs(err, http.StatusBadRequest) {
		t.Errorf("limit below usage: %v", err)
	}
	waitSnap(t, e.demo, snap, "available")
	e.want(t, 202, "DELETE", "/v3/snapshots/"+snap, e.demoTok, "")
	waitSnap(t, e.demo, snap, "")
	e.want(t, 202, "DELETE", "/v3/volumes/"+vol, e.demoTok, "")
	waitGone(t, e.demo, vol)
}

func (e *env) testSnapVolumeDelete(t *testing.T) {
	vol := e.snapVolume(t, 1, "parent")
	var ids []string
	for i := 0; i < 2; i++ {
		m := e.want(t, 202, "POST", "/v3/snapshots", e.demoTok, `{"snapshot":{"volume_id":"`+vol+`"}}`)
		ids = append(ids, m["snapshot"].(map[string]any)["id"].(string))
	}
	for _, id := range ids {
		waitSnap(t, e.demo, id, "available")
	}
	m := e.want(t, 400, "DELETE", "/v3/volumes/"+vol, e.demoTok, "")
	if got := m["badRequest"].(map[string]any)["message"].(string); !bytes.Contains([]byte(got), []byte("have snapshots")) {
		t.Errorf("delete with snapshots: %v", got)
	}
	e.want(t, 202, "DELETE", "/v3/volumes/"+vol+"?cascade=true", e.demoTok, "")
	waitGone(t, e.demo, vol)
	for _, id := range ids {
		waitSnap(t, e.demo, id, "")
		if _, err := os.Stat(e.snapPath(id)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("snapshot file left after cascade: %v", err)
		}
		if n := e.openPeriods(t, id); n != 0 {
			t.Errorf("snapshot %s still charged after cascade", id)
		}
	}
}

// TestSnapshotCharges runs billing's charging pass over a snapshot's life
// with an injected clock: each started hour is charged once at
// snapshot_gb × its size, nothing after delete; snapshot_gb starts at
// volume_gb's rate.
func TestSnapshotCharges(t *testing.T) {
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
		p, err := b.Prices(ctx)
		if err != nil || p.SnapshotGB != p.VolumeGB || p.SnapshotGB == 0 {
			t.Fatalf("default snapshot_gb %d, volume_gb %d (%v)", p.SnapshotGB, p.VolumeGB, err)
		}
		if _, err := b.SetPrices(ctx, map[string]int64{"snapshot_gb": billing.RateScale}); err != nil {
			t.Fatal(err)
		}
		svc := volume.New(volume.Config{DB: db, DataDir: t.TempDir(), Now: clk.now, Log: quiet})
		t.Cleanup(svc.Close)
		if err := svc.Bootstrap(ctx); err != nil {
			t.Fatal(err)
		}
		a := svc.API(oneUser{}, "")
		a.Log = quiet
		srv := httptest.NewServer(a)
		t.Cleanup(srv.Close)
		call := func(method, path, body string, want int) map[string]any {
			t.Helper()
			resp, raw := testenv.Do(t, srv.Client(), method, srv.URL+path, "tok", body)
			testenv.MustStatus(t, resp, raw, want)
			var m map[string]any
			if raw != "" {
				json.Unmarshal([]byte(raw), &m)
			}
			return m
		}
		waitFor := func(path, status string) {
			t.Helper()
			for i := 0; i < 500; i++ {
				resp, raw := testenv.Do(t, srv.Client(), "GET", srv.URL+path, "tok", "")
				if (status == "" && resp.StatusCode == 404) || (resp.StatusCode == 200 && strings.Contains(raw, `"status":"`+status+`"`)) {
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
			t.Fatalf("%s never reached %q", path, status)
		}
		charge := func(now string) {
			t.Helper()
			clk.set(now)
			if _, err := b.ChargeUntil(ctx, clk.now()); err != nil {
				t.Fatal(err)
			}
		}
		charge("2026-03-01T09:55:00Z")
		clk.set("2026-03-01T10:05:00Z")
		vol := call("POST", "/v3/volumes", `{"volume":{"size":2}}`, 202)["volume"].(map[string]any)["id"].(string)
		waitFor("/v3/volumes/"+vol, "available")
		clk.set("2026-03-01T10:20:00Z")
		snap := call("POST", "/v3/snapshots", `{"snapshot":{"volume_id":"`+vol+`"}}`, 202)["snapshot"].(map[string]any)["id"].(string)
		waitFor("/v3/snapshots/"+snap, "available")
		charge("2026-03-01T10:40:00Z")
		charge("2026-03-01T11:05:00Z")
		clk.set("2026-03-01T11:30:00Z")
		call("DELETE", "/v3/snapshots/"+snap, "", 202)
		waitFor("/v3/snapshots/"+snap, "")
		charge("2026-03-01T13:05:00Z")

		rows, err := db.Query(ctx, `SELECT period_start, amount FROM billing_ledger WHERE kind = 'charge' AND resource_id = ?
			ORDER BY period_start`, snap)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var got []string
		for rows.Next() {
			var start string
			var amount int64
			if err := rows.Scan(&start, &amount); err != nil {
				t.Fatal(err)
			}
			got = append(got, store.ParseTime(start).UTC().Format("15")+":"+strconv.FormatInt(amount, 10))
		}
		if want := []string{"10:-2", "11:-2"}; !slices.Equal(got, want) {
			t.Fatalf("charges %v, want %v", got, want)
		}
	})
}
