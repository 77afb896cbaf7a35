package volume_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/backups"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/snapshots"

	"nimbus/internal/testenv"
)

// TestSnapshotBackup: a backup of a snapshot (snapshot_id) has the
// snapshot's bytes, not the volume's changed since, whatever the volume's
// status (in-use needs no force); it shows its snapshot and the
// snapshot's created_at as data_timestamp; an incremental one builds on
// the latest backup older than the snapshot; and the bad requests get
// Cinder's answers.
func TestSnapshotBackup(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		e.demo.Microversion, e.admin.Microversion = "3.60", "3.60"
		t.Run("Data", e.testSnapBackupData)
		t.Run("Errors", e.testSnapBackupErrors)
	})
}

// snapOf takes an available snapshot of vol.
func (e *env) snapOf(t *testing.T, vol string) string {
	t.Helper()
	sn, err := snapshots.Create(context.Background(), e.demo, snapshots.CreateOpts{VolumeID: vol, Force: true}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	waitSnap(t, e.demo, sn.ID, "available")
	return sn.ID
}

// backupOf backs up vol (its snapshot sn unless "", without force) and
// waits for it.
func (e *env) backupOf(t *testing.T, vol, sn string, incremental bool) *backups.Backup {
	t.Helper()
	b, err := backups.Create(context.Background(), e.demo, backups.CreateOpts{VolumeID: vol, SnapshotID: sn, Incremental: incremental,
		Force: sn == ""}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	return waitBackup(t, e.demo, b.ID, "available")
}

// restoreNew restores backup id to a new volume and answers its file.
func (e *env) restoreNew(t *testing.T, id string) string {
	t.Helper()
	rs, err := backups.RestoreFromBackup(context.Background(), e.demo, id, backups.RestoreOpts{}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	waitStatus(t, e.demo, rs.VolumeID, "available")
	return e.c.Volumes.DataPath(rs.VolumeID)
}

func (e *env) testSnapBackupData(t *testing.T) {
	src := e.newVolume(t, 1)
	path := e.c.Volumes.DataPath(src)
	// In use (Cinder's legacy attach): a snapshot's backup needs no force
	// and leaves the volume as it is.
	e.want(t, 202, "POST", "/v3/volumes/"+src+"/action", e.demoTok, `{"os-reserve":{}}`)
	e.want(t, 202, "POST", "/v3/volumes/"+src+"/action", e.demoTok,
		`{"os-attach":{"instance_uuid":"`+uuid.NewString()+`","mountpoint":"/dev/vdb"}}`)

	// (image does not overlap writes: a change rewrites a whole write.)
	at1 := image{}
	at1.write(t, path, 0, pattern(1, 5*mib))
	at1.write(t, path, 200*mib, pattern(2, mib))
	s1 := e.snapOf(t, src)
	now := at1.clone()
	now.write(t, path, 0, pattern(3, 5*mib))
	now.write(t, path, 300*mib, pattern(4, mib))

	a := e.backupOf(t, src, s1, false)
	if a.SnapshotID != s1 || a.IsIncremental {
		t.Errorf("backup of snapshot: snapshot_id %q, incremental %v; want %q, full", a.SnapshotID, a.IsIncremental, s1)
	}
	snap := e.want(t, 200, "GET", "/v3/snapshots/"+s1, e.demoTok, "")["snapshot"].(map[string]any)
	bk := e.want(t, 200, "GET", "/v3/backups/"+a.ID, e.demoTok, "")["backup"].(map[string]any)
	if bk["data_timestamp"] != snap["created_at"] || bk["data_timestamp"] == bk["created_at"] {
		t.Errorf("data_timestamp %v, want the snapshot's created_at %v (not the backup's %v)", bk["data_timestamp"], snap["created_at"], bk["created_at"])
	}
	if snap["status"] != "available" {
		t.Errorf("snapshot %v after its backup, want available", snap["status"])
	}
	waitStatus(t, e.demo, src, "in-use")
	at1.check(t, e.restoreNew(t, a.ID), 1<<30)

	// A volume backup after it builds on it: the latest by data_timestamp.
	v := e.backupOf(t, src, "", true)
	if !v.IsIncremental || v.SnapshotID != "" {
		t.Errorf("incremental backup of the volume: %+v", v)
	}
	now.check(t, e.restoreNew(t, v.ID), 1<<30)

	// A snapshot, a change and a backup after it: the snapshot's
	// incremental backup builds on v, older than the snapshot, not on w.
	at2 := now.clone()
	s2 := e.snapOf(t, src)
	now.write(t, path, 200*mib, pattern(5, mib))
	time.Sleep(2 * time.Millisecond) // data_timestamps apart
	w := e.backupOf(t, src, "", true)
	i := e.backupOf(t, src, s2, true)
	if !i.IsIncremental || i.SnapshotID != s2 {
		t.Errorf("incremental backup of a snapshot: %+v", i)
	}
	if got := waitBackup(t, e.demo, w.ID, "available"); got.HasDependentBackups {
		t.Error("the snapshot's incremental backup built on a backup newer than the snapshot")
	}
	if got := waitBackup(t, e.demo, v.ID, "available"); !got.HasDependentBackups {
		t.Error("the volume's backup older than the snapshot has no dependent backups")
	}
	at2.check(t, e.restoreNew(t, i.ID), 1<<30)
	now.check(t, e.restoreNew(t, w.ID), 1<<30)
	waitStatus(t, e.demo, src, "in-use")
	waitSnap(t, e.demo, s2, "available")
}

func (e *env) testSnapBackupErrors(t *testing.T) {
	vol := e.newVolume(t, 1)
	other := e.newVolume(t, 1)
	sn := e.snapOf(t, vol)
	otherSnap := e.snapOf(t, other)
	failed := e.snapOf(t, vol)
	e.want(t, 202, "POST", "/v3/snapshots/"+failed+"/action", e.adTok, `{"os-reset_status":{"status":"error"}}`)
	missing := "00000000-0000-0000-0000-000000000000"
	body := func(vol, snap string) string {
		return `{"backup":{"volume_id":"` + vol + `","snapshot_id":"` + snap + `"}}`
	}
	for _, c := range []struct {
		name, body string
		status     int
		message    string
	}{
		{"another volume's snapshot", body(vol, otherSnap), 400,
			"Invalid volume: Volume " + vol + " does not match with snapshot.volume_id " + other + "."},
		{"unknown snapshot", body(vol, missing), 404, "Snapshot " + missing + " could not be found."},
		{"unknown volume", body(missing, sn), 404, "Volume " + missing + " could not be found."},
		{"snapshot not available", body(vol, failed), 400,
			`Invalid snapshot: Snapshot to be backed up must be available, but the current status is "error".`},
		{"not a string", `{"backup":{"volume_id":"` + vol + `","snapshot_id":7}}`, 400, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			resp, m := e.do(t, "POST", "/v3/backups", e.demoTok, c.body)
			if resp.StatusCode != c.status {
				t.Fatalf("status %d, want %d: %v", resp.StatusCode, c.status, m)
			}
			for _, v := range m {
				if msg, _ := v.(map[string]any)["message"].(string); c.message != "" && msg != c.message {
					t.Errorf("message %q, want %q", msg, c.message)
				}
			}
		})
	}
	// Another project's snapshot is not found, as its volume is not.
	adminVol := e.want(t, 202, "POST", "/v3/volumes", e.adTok, `{"volume":{"size":1}}`)["volume"].(map[string]any)["id"].(string)
	waitStatus(t, e.admin, adminVol, "available")
	e.want(t, 404, "POST", "/v3/backups", e.demoTok, body(vol, e.snapOfAdmin(t, adminVol)))
	// A null snapshot_id is a backup of the volume.
	id := e.want(t, 202, "POST", "/v3/backups", e.demoTok, `{"backup":{"volume_id":"`+vol+`","snapshot_id":null}}`)["backup"].(map[string]any)["id"].(string)
	if b := waitBackup(t, e.demo, id, "available"); b.SnapshotID != "" {
		t.Errorf("backup with a null snapshot_id shows snapshot %q", b.SnapshotID)
	}
}

// snapOfAdmin takes an available snapshot of the admin's volume vol.
func (e *env) snapOfAdmin(t *testing.T, vol string) string {
	t.Helper()
	id := e.want(t, 202, "POST", "/v3/snapshots", e.adTok, `{"snapshot":{"volume_id":"`+vol+`"}}`)["snapshot"].(map[string]any)["id"].(string)
	waitSnap(t, e.admin, id, "available")
	return id
}

// TestSnapshotBackupBusy: while a snapshot's backup copies (held here on
// a snapshot file that is a FIFO) the snapshot is backing-up and the
// volume keeps its status; the snapshot is neither deleted, backed up
// again nor deleted with its volume; once the copy ends it is available.
// A controller stopped during the copy makes the backup at its next start
// and gives the snapshot back.
func TestSnapshotBackupBusy(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		cfg, db, root := serviceConfig(t, dbURL)
		o := startService(t, cfg)
		vol := idIn(o.call("POST", "/v3/volumes", `{"volume":{"size":1}}`, 202), "id")
		o.waitFor("/v3/volumes/"+vol, "available")
		im := image{}
		im.write(t, filepath.Join(root, "volumes", vol), 3*mib, pattern(6, mib))
		sn := idIn(o.call("POST", "/v3/snapshots", `{"snapshot":{"volume_id":"`+vol+`"}}`, 202), "id")
		o.waitFor("/v3/snapshots/"+sn, "available")
		snapPath := filepath.Join(root, "volumes", "snapshots", sn)
		kept, err := os.ReadFile(snapPath)
		if err != nil {
			t.Fatal(err)
		}

		if err := os.Remove(snapPath); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mkfifo(snapPath, 0o600); err != nil {
			t.Fatal(err)
		}
		release := func(wait time.Duration) {
			for end := time.Now().Add(wait); ; time.Sleep(20 * time.Millisecond) {
				if f, err := os.OpenFile(snapPath, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
					f.Close()
					return
				}
				if time.Now().After(end) {
					return
				}
			}
		}
		t.Cleanup(func() { release(0) })
		backup := `{"backup":{"volume_id":"` + vol + `","snapshot_id":"` + sn + `"}}`
		bk := idIn(o.call("POST", "/v3/backups", backup, 202), "id")
		if raw := o.call("GET", "/v3/backups/"+bk, "", 200); !strings.Contains(raw, `"snapshot_id":"`+sn+`"`) {
			t.Errorf("backup view without its snapshot: %s", raw)
		}
		o.waitFor("/v3/snapshots/"+sn, "backing-up")
		o.waitFor("/v3/backups/"+bk, "creating")
		o.waitFor("/v3/volumes/"+vol, "available")
		if raw := o.call("DELETE", "/v3/snapshots/"+sn, "", 400); !strings.Contains(raw,
			"Invalid snapshot: Snapshot status must be available or error and must not be part of a group.") {
			t.Errorf("deleting a backing-up snapshot: %s", raw)
		}
		o.call("POST", "/v3/backups", backup, 400)
		o.call("DELETE", "/v3/volumes/"+vol+"?cascade=true", "", 400)
		release(10 * time.Second)
		o.waitFor("/v3/backups/"+bk, "available")
		o.waitFor("/v3/snapshots/"+sn, "available")

		// The snapshot's data back, for the next backup to read.
		if err := os.Remove(snapPath); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(snapPath, kept, 0o600); err != nil {
			t.Fatal(err)
		}
		bk2 := idIn(o.call("POST", "/v3/backups", backup, 202), "id")
		o.waitFor("/v3/backups/"+bk2, "available")
		o.stop()
		// As if the controller had stopped before the commit point.
		if err := os.Remove(filepath.Join(root, "backups", "manifests", bk2+".json")); err != nil {
			t.Fatal(err)
		}
		for _, q := range []string{"UPDATE volume_backups SET status = 'creating' WHERE id = ?",
			"UPDATE volume_snapshots SET status = 'backing-up' WHERE id = ?"} {
			id := bk2
			if strings.Contains(q, "snapshots") {
				id = sn
			}
			if _, err := db.Exec(ctx, q, id); err != nil {
				t.Fatal(err)
			}
		}
		o = startService(t, cfg)
		o.waitFor("/v3/backups/"+bk2, "available")
		o.waitFor("/v3/snapshots/"+sn, "available")
		o.waitFor("/v3/volumes/"+vol, "available")
		restored := idIn(o.call("POST", "/v3/backups/"+bk2+"/restore", `{"restore":null}`, 202), "volume_id")
		o.waitFor("/v3/volumes/"+restored, "available")
		im.check(t, filepath.Join(root, "volumes", restored), 1<<30)
	})
}
