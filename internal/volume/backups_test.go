package volume_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/backups"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/limits"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/quotasets"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/volumes"
	"github.com/gophercloud/gophercloud/v2/pagination"

	"nimbus/internal/billing"
	"nimbus/internal/store"
	"nimbus/internal/testenv"
	"nimbus/internal/volume"
)

func TestBackups(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		e.demo.Microversion, e.admin.Microversion = "3.60", "3.60"
		t.Run("Data", e.testBackupData)
		t.Run("Errors", e.testBackupErrors)
		t.Run("ListAndUpdate", e.testBackupList)
		t.Run("Quotas", e.testBackupQuotas)
	})
}

const mib = 1 << 20

// image is what a test expects a volume's bytes to be: data at some
// offsets, zeros everywhere else.
type image map[int64][]byte

func (im image) clone() image {
	out := image{}
	for k, v := range im {
		out[k] = v
	}
	return out
}

// write puts data at off in the volume's file and in im.
func (im image) write(t *testing.T, path string, off int64, data []byte) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(data, off); err != nil {
		t.Fatal(err)
	}
	im[off] = data
}

// check compares the file at path with im, byte for byte.
func (im image) check(t *testing.T, path string, size int64) {
	t.Helper()
	want := make([]byte, 4*mib)
	got := make([]byte, 4*mib)
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if fi, _ := f.Stat(); fi.Size() != size {
		t.Fatalf("%s is %d bytes, want %d", path, fi.Size(), size)
	}
	for off := int64(0); off < size; off += int64(len(want)) {
		clear(want)
		for at, data := range im {
			if at < off+int64(len(want)) && at+int64(len(data)) > off {
				copy(want[max(at-off, 0):], data[max(off-at, 0):])
			}
		}
		if _, err := io.ReadFull(io.NewSectionReader(f, off, int64(len(got))), got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s differs from what was backed up in the 4 MiB at %d", path, off)
		}
	}
}

func pattern(seed byte, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i%251)
	}
	return b
}

func waitBackup(t *testing.T, sc *gophercloud.ServiceClient, id, status string) *backups.Backup {
	t.Helper()
	for i := 0; i < 1500; i++ {
		b, err := backups.Get(context.Background(), sc, id).Extract()
		if status == "" && gophercloud.ResponseCodeIs(err, http.StatusNotFound) {
			return nil
		}
		if err == nil && b.Status == status {
			return b
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("backup %s never reached %q", id, status)
	return nil
}

func (e *env) backupDir(volID string) string {
	return filepath.Join(filepath.Dir(filepath.Dir(e.c.Volumes.DataPath(volID))), "backups")
}

func countFiles(t *testing.T, pattern string) int {
	t.Helper()
	m, err := filepath.Glob(pattern)
	if err != nil {
		t.Fatal(err)
	}
	return len(m)
}

func (e *env) newVolume(t *testing.T, size int) string {
	t.Helper()
	v, err := volumes.Create(context.Background(), e.demo, volumes.CreateOpts{Size: size}, nil).Extract()
	if err != nil {
		t.Fatal(err)
	}
	waitStatus(t, e.demo, v.ID, "available")
	return v.ID
}

// testBackupData: a full backup, changes, an incremental backup that
// stores only the changed chunks, each restored to a new volume and onto
// an existing one with the bytes the source had at its time, and deletes
// that free exactly the chunks no other backup uses.
func (e *env) testBackupData(t *testing.T) {
	ctx := context.Background()
	src := e.newVolume(t, 1)
	path := e.c.Volumes.DataPath(src)
	chunks := filepath.Join(e.backupDir(src), "chunks", "*", "*")
	before := countFiles(t, chunks)

	first := image{}
	first.write(t, path, 0, pattern(1, 5*mib))       // chunks 0 and 1
	first.write(t, path, 100*mib, pattern(2, 4*mib)) // chunk 25
	b1, err := backups.Create(ctx, e.demo, backups.CreateOpts{VolumeID: src, Name: "full", Container: "box"}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	full := waitBackup(t, e.demo, b1.ID, "available")
	if full.ObjectCount != 3 || full.IsIncremental || full.Size != 1 || full.Container != "box" || full.VolumeID != src {
		t.Fatalf("full backup: %+v", full)
	}
	waitStatus(t, e.demo, src, "available")
	if n := countFiles(t, chunks) - before; n != 3 {
		t.Fatalf("full backup stored %d chunks, want 3", n)
	}

	second := first.clone()
	second.write(t, path, 100*mib, pattern(3, 4*mib)) // chunk 25 changes
	second.write(t, path, 900*mib, pattern(4, mib))   // chunk 225 is new
	b2, err := backups.Create(ctx, e.demo, backups.CreateOpts{VolumeID: src, Incremental: true}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	incr := waitBackup(t, e.demo, b2.ID, "available")
	if incr.ObjectCount != 2 || !incr.IsIncremental {
		t.Fatalf("incremental backup: %+v", incr)
	}
	if n := countFiles(t, chunks) - before; n != 5 {
		t.Fatalf("after the incremental the store has %d new chunks, want 5", n)
	}
	if p := waitBackup(t, e.demo, b1.ID, "available"); !p.HasDependentBackups {
		t.Errorf("parent does not show its dependent: %+v", p)
	}

	// The source changes again: restores must give each backup's bytes.
	image{}.write(t, path, 0, pattern(9, 8*mib))

	r1, err := backups.RestoreFromBackup(ctx, e.demo, b1.ID, backups.RestoreOpts{}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	if r1.BackupID != b1.ID || r1.VolumeName != "restore_backup_"+b1.ID {
		t.Errorf("restore answer: %+v", r1)
	}
	waitStatus(t, e.demo, r1.VolumeID, "available")
	first.check(t, e.c.Volumes.DataPath(r1.VolumeID), 1<<30)

	r2, err := backups.RestoreFromBackup(ctx, e.demo, b2.ID, backups.RestoreOpts{Name: "second"}).Extract()
	if err != nil || r2.VolumeName != "second" {
		t.Fatalf("restore: %+v %v", r2, err)
	}
	v2 := waitStatus(t, e.demo, r2.VolumeID, "available")
	if v2.Size != 1 || v2.Name != "second" {
		t.Errorf("restored volume: %+v", v2)
	}
	second.check(t, e.c.Volumes.DataPath(r2.VolumeID), 1<<30)
	waitBackup(t, e.demo, b2.ID, "available")

	// Onto an existing, larger volume: the backup's bytes replace what
	// was there, holes included; the rest stays as it was.
	big := e.newVolume(t, 2)
	onto := image{}
	for off, data := range second {
		onto.write(t, e.c.Volumes.DataPath(big), off, data)
	}
	onto.write(t, e.c.Volumes.DataPath(big), 1200*mib, pattern(7, mib))
	r3, err := backups.RestoreFromBackup(ctx, e.demo, b1.ID, backups.RestoreOpts{VolumeID: big}).Extract()
	if err != nil || r3.VolumeID != big {
		t.Fatalf("restore onto a volume: %+v %v", r3, err)
	}
	waitStatus(t, e.demo, big, "available")
	want := first.clone()
	want[1200*mib] = onto[1200*mib]
	want.check(t, e.c.Volumes.DataPath(big), 2<<30)
	waitBackup(t, e.demo, b1.ID, "available")

	// A parent cannot go while its incremental exists.
	m := e.want(t, 400, "DELETE", "/v3/backups/"+b1.ID, e.demoTok, "")
	if m["badRequest"].(map[string]any)["message"] != "Invalid backup: Incremental backups exist for this backup." {
		t.Errorf("delete a parent: %v", m)
	}
	if err := backups.Delete(ctx, e.demo, b2.ID).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	waitBackup(t, e.demo, b2.ID, "")
	if n := countFiles(t, chunks) - before; n != 3 {
		t.Errorf("after deleting the incremental %d chunks remain, want the full backup's 3", n)
	}
	if err := backups.Delete(ctx, e.demo, b1.ID).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	waitBackup(t, e.demo, b1.ID, "")
	if n := countFiles(t, chunks) - before; n != 0 {
		t.Errorf("after deleting both %d chunks remain", n)
	}
	e.checkPeriods(t, []string{b1.ID, b2.ID})
}

// checkPeriods: each backup had one usage period of kind backup at its
// size, opened when it was created and closed at its delete.
func (e *env) checkPeriods(t *testing.T, ids []string) {
	for _, id := range ids {
		rows, err := e.c.DB.Query(context.Background(), "SELECT kind, spec, ended_at FROM metering_periods WHERE resource_id = ?", id)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for rows.Next() {
			var kind, spec, ended string
			if err := rows.Scan(&kind, &spec, &ended); err != nil {
				t.Fatal(err)
			}
			got = append(got, kind+" "+spec+" "+strconv.FormatBool(ended != ""))
		}
		rows.Close()
		if want := []string{`backup {"size_gb":1} true`}; !slices.Equal(got, want) {
			t.Errorf("periods of backup %s: %v, want %v", id, got, want)
		}
	}
}

func (e *env) testBackupErrors(t *testing.T) {
	ctx := context.Background()
	vol := e.newVolume(t, 1)
	small := e.newVolume(t, 1)
	busy := e.newVolume(t, 1)
	e.want(t, 202, "POST", "/v3/volumes/"+busy+"/action", e.adTok, `{"os-reset_status":{"status":"error"}}`)
	used := e.newVolume(t, 1)
	// Attached for real (Cinder's legacy actions, as Nova's older path):
	// a backup of it gives it back in-use because it still is.
	e.want(t, 202, "POST", "/v3/volumes/"+used+"/action", e.demoTok, `{"os-reserve":{}}`)
	e.want(t, 202, "POST", "/v3/volumes/"+used+"/action", e.demoTok,
		`{"os-attach":{"instance_uuid":"`+uuid.NewString()+`","mountpoint":"/dev/vdb"}}`)

	bigVol := e.newVolume(t, 2)
	big, err := backups.Create(ctx, e.demo, backups.CreateOpts{VolumeID: bigVol}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	waitBackup(t, e.demo, big.ID, "available")
	missing := "00000000-0000-0000-0000-000000000000"

	for _, c := range []struct {
		name, method, path, tok, body string
		status                        int
		message                       string
	}{
		{"unknown volume", "POST", "/v3/backups", e.demoTok, `{"backup":{"volume_id":"` + missing + `"}}`, 404,
			"Volume " + missing + " could not be found."},
		{"no volume", "POST", "/v3/backups", e.demoTok, `{"backup":{"name":"x"}}`, 400,
			"Invalid input for field/attribute backup. 'volume_id' is a required property"},
		{"unknown field", "POST", "/v3/backups", e.demoTok, `{"backup":{"volume_id":"` + vol + `","size":3}}`, 400, ""},
		{"metadata before 3.43", "POST", "/v3/backups", e.demoTok, `{"backup":{"volume_id":"` + vol + `","metadata":{}}}`, 400, ""},
		{"not a boolean", "POST", "/v3/backups", e.demoTok, `{"backup":{"volume_id":"` + vol + `","incremental":"maybe"}}`, 400, ""},
		{"volume not available", "POST", "/v3/backups", e.demoTok, `{"backup":{"volume_id":"` + busy + `"}}`, 400,
			`Invalid volume: Volume to be backed up must be available or in-use, but the current status is "error".`},
		{"in-use without force", "POST", "/v3/backups", e.demoTok, `{"backup":{"volume_id":"` + used + `"}}`, 400,
			"Invalid volume: Backing up an in-use volume must use the force flag."},
		{"incremental without a full", "POST", "/v3/backups", e.demoTok, `{"backup":{"volume_id":"` + vol + `","incremental":true}}`, 400,
			"Invalid backup: No backups available to do an incremental backup."},
		{"unknown backup", "GET", "/v3/backups/" + missing, e.demoTok, "", 404, "Backup " + missing + " could not be found."},
		{"another project's backup", "GET", "/v3/backups/" + big.ID, e.adTok, "", 200, ""},
		{"restore onto a smaller volume", "POST", "/v3/backups/" + big.ID + "/restore", e.demoTok, `{"restore":{"volume_id":"` + small + `"}}`, 400,
			"Invalid volume: volume size 1 is too small to restore backup of size 2."},
		{"restore onto a busy volume", "POST", "/v3/backups/" + big.ID + "/restore", e.demoTok, `{"restore":{"volume_id":"` + busy + `"}}`, 400,
			"Invalid volume: Volume to be restored to must be available"},
		{"restore onto an unknown volume", "POST", "/v3/backups/" + big.ID + "/restore", e.demoTok, `{"restore":{"volume_id":"` + missing + `"}}`, 404,
			"Volume " + missing + " could not be found."},
		{"restore without a body", "POST", "/v3/backups/" + big.ID + "/restore", e.demoTok, `{}`, 400, ""},
		{"update before 3.9", "PUT", "/v3/backups/" + big.ID, e.demoTok, `{"backup":{"name":"n"}}`, 404, ""},
		{"member resets status", "POST", "/v3/backups/" + big.ID + "/action", e.demoTok, `{"os-reset_status":{"status":"error"}}`, 403, ""},
		{"bad status", "POST", "/v3/backups/" + big.ID + "/action", e.adTok, `{"os-reset_status":{"status":"creating"}}`, 400,
			"Must specify a valid status"},
	} {
		t.Run(c.name, func(t *testing.T) {
			resp, m := e.do(t, c.method, c.path, c.tok, c.body)
			if resp.StatusCode != c.status {
				t.Fatalf("status %d, want %d: %v", resp.StatusCode, c.status, m)
			}
			if c.message == "" {
				return
			}
			for _, v := range m {
				if msg, _ := v.(map[string]any)["message"].(string); msg != c.message {
					t.Errorf("message %q, want %q", msg, c.message)
				}
			}
		})
	}

	// With force an in-use volume is backed up, and is in-use again after.
	forced, err := backups.Create(ctx, e.demo, backups.CreateOpts{VolumeID: used, Force: true}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	waitBackup(t, e.demo, forced.ID, "available")
	waitStatus(t, e.demo, used, "in-use")
	// A backup that is not available is neither restored nor deleted;
	// an admin's reset brings it back.
	e.want(t, 202, "POST", "/v3/backups/"+big.ID+"/action", e.adTok, `{"os-reset_status":{"status":"error"}}`)
	e.want(t, 400, "POST", "/v3/backups/"+big.ID+"/restore", e.demoTok, `{"restore":null}`)
	e.want(t, 202, "POST", "/v3/backups/"+big.ID+"/action", e.adTok, `{"os-reset_status":{"status":"available"}}`)
	for _, id := range []string{big.ID, forced.ID} {
		if err := backups.Delete(ctx, e.demo, id).ExtractErr(); err != nil {
			t.Fatal(err)
		}
		waitBackup(t, e.demo, id, "")
	}
}

func (e *env) testBackupList(t *testing.T) {
	ctx := context.Background()
	vol := e.newVolume(t, 1)
	var ids []string
	for i := 0; i < 3; i++ {
		b, err := backups.Create(ctx, e.demo, backups.CreateOpts{VolumeID: vol, Name: "list-" + strconv.Itoa(i),
			Metadata: map[string]string{"n": strconv.Itoa(i)}}).Extract()
		if err != nil {
			t.Fatal(err)
		}
		waitBackup(t, e.demo, b.ID, "available")
		ids = append(ids, b.ID)
	}
	// Newest first, two to a page, the next link followed by the pager.
	var seen []string
	err := backups.ListDetail(e.demo, backups.ListDetailOpts{Limit: 2}).EachPage(ctx, func(_ context.Context, p pagination.Page) (bool, error) {
		bs, err := backups.ExtractBackups(p)
		for _, b := range bs {
			if b.VolumeID == vol {
				seen = append(seen, b.ID)
			}
		}
		return true, err
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{ids[2], ids[1], ids[0]}; !slices.Equal(seen, want) {
		t.Errorf("paged list %v, want %v", seen, want)
	}
	m := e.want(t, 200, "GET", "/v3/backups?name=list-1", e.demoTok, "")
	if bs := m["backups"].([]any); len(bs) != 1 || bs[0].(map[string]any)["id"] != ids[1] {
		t.Errorf("name filter: %v", m)
	}
	m = e.want(t, 200, "GET", "/v3/backups/detail?volume_id="+vol+"&with_count=true&sort=name:asc", e.demoTok, "",
		"OpenStack-API-Version", "volume 3.45")
	if bs := m["backups"].([]any); m["count"] != float64(3) || len(bs) != 3 || bs[0].(map[string]any)["name"] != "list-0" {
		t.Errorf("detail with count: %v", m)
	}
	e.want(t, 400, "GET", "/v3/backups?sort=color", e.demoTok, "")
	e.want(t, 404, "GET", "/v3/backups?marker=nope", e.demoTok, "")

	// gophercloud's backups.Update leaves out the "backup" key Cinder's
	// schema requires, so the update is sent as Cinder expects it.
	m = e.want(t, 200, "PUT", "/v3/backups/"+ids[0], e.demoTok, `{"backup":{"name":" renamed ","description":"described","metadata":{"k":"v"}}}`,
		"OpenStack-API-Version", "volume 3.43")
	if u := m["backup"].(map[string]any); u["name"] != "renamed" || u["id"] != ids[0] {
		t.Fatalf("update: %v", m)
	}
	e.want(t, 400, "PUT", "/v3/backups/"+ids[0], e.demoTok, `{"backup":{"metadata":{"k":"v"}}}`, "OpenStack-API-Version", "volume 3.42")
	got, err := backups.Get(ctx, e.demo, ids[0]).Extract()
	if err != nil || got.Description != "described" || got.Metadata == nil || (*got.Metadata)["k"] != "v" || got.ProjectID != "" {
		t.Errorf("after update: %+v %v", got, err)
	}
	if got, err := backups.Get(ctx, e.admin, ids[0]).Extract(); err != nil || got.ProjectID != e.demoProj {
		t.Errorf("admin's view: %+v %v", got, err)
	}
	for _, id := range ids {
		if err := backups.Delete(ctx, e.demo, id).ExtractErr(); err != nil {
			t.Fatal(err)
		}
		waitBackup(t, e.demo, id, "")
	}
}

func (e *env) testBackupQuotas(t *testing.T) {
	ctx := context.Background()
	if _, err := quotasets.Update(ctx, e.admin, e.demoProj, quotasets.UpdateOpts{Backups: gophercloud.IntToPointer(1),
		BackupGigabytes: gophercloud.IntToPointer(3), Volumes: gophercloud.IntToPointer(100)}).Extract(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { quotasets.Delete(ctx, e.admin, e.demoProj) })
	vol := e.newVolume(t, 2)
	b, err := backups.Create(ctx, e.demo, backups.CreateOpts{VolumeID: vol}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	waitBackup(t, e.demo, b.ID, "available")
	m := e.want(t, 413, "POST", "/v3/backups", e.demoTok, `{"backup":{"volume_id":"`+vol+`"}}`)
	if msg := m["overLimit"].(map[string]any)["message"]; msg != "Maximum number of backups allowed (1) exceeded" {
		t.Errorf("backups over quota: %v", msg)
	}
	if _, err := quotasets.Update(ctx, e.admin, e.demoProj, quotasets.UpdateOpts{Backups: gophercloud.IntToPointer(5)}).Extract(); err != nil {
		t.Fatal(err)
	}
	m = e.want(t, 413, "POST", "/v3/backups", e.demoTok, `{"backup":{"volume_id":"`+vol+`"}}`)
	if msg := m["overLimit"].(map[string]any)["message"]; msg != "Requested backup exceeds allowed Backup gigabytes quota. Requested 2G, quota is 3G and 2G has been consumed." {
		t.Errorf("backup gigabytes over quota: %v", msg)
	}
	l, err := limits.Get(ctx, e.demo).Extract()
	if err != nil || l.Absolute.TotalBackupsUsed != 1 || l.Absolute.TotalBackupGigabytesUsed != 2 || l.Absolute.MaxTotalBackups != 5 {
		t.Errorf("limits: %+v %v", l.Absolute, err)
	}
	u, err := quotasets.GetUsage(ctx, e.demo, e.demoProj).Extract()
	if err != nil || u.Backups.InUse != 1 || u.BackupGigabytes.InUse != 2 {
		t.Errorf("quota usage: %+v %v", u, err)
	}
	m = e.want(t, 400, "PUT", "/v3/os-quota-sets/"+e.demoProj, e.adTok, `{"quota_set":{"backup_gigabytes":1}}`)
	if !strings.Contains(m["badRequest"].(map[string]any)["message"].(string), "Current usage is 2") {
		t.Errorf("quota below usage: %v", m)
	}
	// A restore to a new volume counts against the volume quotas.
	e.want(t, 200, "PUT", "/v3/os-quota-sets/"+e.demoProj, e.adTok, `{"quota_set":{"per_volume_gigabytes":1}}`)
	m = e.want(t, 413, "POST", "/v3/backups/"+b.ID+"/restore", e.demoTok, `{"restore":{}}`)
	if msg := m["overLimit"].(map[string]any)["message"]; msg != "Requested volume size 2G is larger than maximum allowed limit 1G." {
		t.Errorf("restore over quota: %v", msg)
	}
	if err := backups.Delete(ctx, e.demo, b.ID).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	waitBackup(t, e.demo, b.ID, "")
}

// TestBackupCharges runs billing's charging pass over a backup's life:
// each started hour from its create to its delete is charged once at
// backup_gb × its size, and the hours its volume is backing-up are still
// charged as the volume's.
func TestBackupCharges(t *testing.T) {
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
		if _, err := b.SetPrices(ctx, map[string]int64{"volume_gb": billing.RateScale, "backup_gb": 10 * billing.RateScale}); err != nil {
			t.Fatal(err)
		}
		svc := volume.New(volume.Config{DB: db, DataDir: filepath.Join(t.TempDir(), "volumes"), Now: clk.now, Log: quiet})
		t.Cleanup(svc.Close)
		if err := svc.Bootstrap(ctx); err != nil {
			t.Fatal(err)
		}
		a := svc.API(oneUser{}, "")
		a.Log = quiet
		srv := httptest.NewServer(a)
		t.Cleanup(srv.Close)
		call := func(method, path, body string, want int) string {
			t.Helper()
			resp, raw := testenv.Do(t, srv.Client(), method, srv.URL+path, "tok", body)
			testenv.MustStatus(t, resp, raw, want)
			return raw
		}
		waitFor := func(path, status string) {
			t.Helper()
			for i := 0; i < 500; i++ {
				resp, raw := testenv.Do(t, srv.Client(), "GET", srv.URL+path, "tok", "")
				if (status == "" && resp.StatusCode == 404) || strings.Contains(raw, `"status":"`+status+`"`) {
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
			t.Fatalf("%s never reached %q", path, status)
		}
		idOf := func(raw string) string {
			i := strings.Index(raw, `"id":"`)
			return raw[i+6 : i+6+36]
		}
		charge := func(now string) {
			t.Helper()
			clk.set(now)
			if _, err := b.ChargeUntil(ctx, clk.now()); err != nil {
				t.Fatal(err)
			}
		}

		charge("2026-03-01T09:55:00Z")
		vol := idOf(call("POST", "/v3/volumes", `{"volume":{"size":2}}`, 202))
		waitFor("/v3/volumes/"+vol, "available")
		clk.set("2026-03-01T10:20:00Z")
		bk := idOf(call("POST", "/v3/backups", `{"backup":{"volume_id":"`+vol+`"}}`, 202))
		waitFor("/v3/backups/"+bk, "available")
		charge("2026-03-01T11:05:00Z")
		charge("2026-03-01T11:30:00Z")
		clk.set("2026-03-01T12:40:00Z")
		call("DELETE", "/v3/backups/"+bk, "", 202)
		waitFor("/v3/backups/"+bk, "")
		charge("2026-03-01T14:05:00Z")

		rows, err := db.Query(ctx, `SELECT period_start, amount FROM billing_ledger WHERE kind = 'charge' AND resource_id = ?
			ORDER BY period_start`, bk)
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
		// 2 GB at 10 per GB-hour for hours 10, 11 and 12 (deleted at 12:40).
		if want := []string{"10:-20", "11:-20", "12:-20"}; !slices.Equal(got, want) {
			t.Fatalf("charges %v, want %v", got, want)
		}
	})
}
