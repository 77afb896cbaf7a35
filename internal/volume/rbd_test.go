package volume_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/backups"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/snapshots"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/volumes"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/imagedata"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/images"

	"nimbus/internal/cloud"
	"nimbus/internal/rbd"
	"nimbus/internal/testenv"
)

// TestMain shares one Ceph cluster among the package's rbd tests and
// tears it down at the end.
func TestMain(m *testing.M) { os.Exit(testenv.CephMain(m)) }

// rbdCluster is the shared test cluster and stores on its two pools, as
// the cloud's rbd backend reaches them.
type rbdCluster struct {
	ceph          *testenv.Ceph
	vols, backups *rbd.Store
}

func newRBDCluster(t *testing.T) *rbdCluster {
	t.Helper()
	c := testenv.SharedCeph(t)
	vols, err := rbd.New(rbd.Config{Conf: c.Conf, Keyring: c.Keyring, User: c.Client, Pool: testenv.VolumesPool})
	if err != nil {
		t.Fatal(err)
	}
	bk, err := vols.InPool(testenv.BackupsPool)
	if err != nil {
		t.Fatal(err)
	}
	return &rbdCluster{ceph: c, vols: vols, backups: bk}
}

// options makes a cloud's volumes RBD images in the cluster.
func (c *rbdCluster) options(cfg *cloud.Config) {
	cfg.Volumes = cloud.VolumeOptions{Backend: cloud.VolumeBackendRBD, RBD: cloud.RBDOptions{
		Conf: c.ceph.Conf, Keyring: c.ceph.Keyring, User: c.ceph.Client, Pool: testenv.VolumesPool, BackupPool: testenv.BackupsPool}}
}

// images lists a pool's images (rbd ls).
func (c *rbdCluster) images(t *testing.T, pool string) []string {
	t.Helper()
	out, err := exec.Command("rbd", "--conf", c.ceph.Conf, "--keyring", c.ceph.Keyring, "--id", c.ceph.Client, "ls", pool).Output()
	if err != nil {
		t.Fatalf("rbd ls %s: %v", pool, err)
	}
	return strings.Fields(string(out))
}

// parent is the pool/image@snap an image was cloned from, "" for none.
func (c *rbdCluster) parent(t *testing.T, image string) string {
	t.Helper()
	out, err := exec.Command("rbd", "--conf", c.ceph.Conf, "--keyring", c.ceph.Keyring, "--id", c.ceph.Client,
		"info", "--format", "json", testenv.VolumesPool+"/"+image).Output()
	if err != nil {
		t.Fatalf("rbd info %s: %v", image, err)
	}
	var info struct {
		Parent *struct{ Pool, Image, Snapshot string } `json:"parent"`
	}
	if err := json.Unmarshal(out, &info); err != nil {
		t.Fatal(err)
	}
	if info.Parent == nil {
		return ""
	}
	return info.Parent.Pool + "/" + info.Parent.Image + "@" + info.Parent.Snapshot
}

// qemuIO runs a qemu-io command on volume id's image as QEMU opens it.
func (c *rbdCluster) qemuIO(t *testing.T, id, command string) {
	t.Helper()
	conn, err := c.vols.Conn(context.Background(), rbd.VolumeName(id))
	if err != nil {
		t.Fatal(err)
	}
	key := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(key, []byte(conn.Key), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("qemu-io", "--object", rbd.SecretObject("k", key), "--image-opts", rbd.ImageOpts(conn, "k"), "-c", command).CombinedOutput()
	if err != nil || strings.Contains(string(out), "Pattern verification failed") {
		t.Fatalf("qemu-io %s on %s: %v\n%s", command, id, err, out)
	}
}

// write fills n bytes at off of volume id with pattern; check reads them.
func (c *rbdCluster) write(t *testing.T, id string, off, n int64, pattern byte) {
	t.Helper()
	c.qemuIO(t, id, "write -P "+strconv.Itoa(int(pattern))+" "+strconv.FormatInt(off, 10)+" "+strconv.FormatInt(n, 10))
}

func (c *rbdCluster) check(t *testing.T, id string, off, n int64, pattern byte) {
	t.Helper()
	c.qemuIO(t, id, "read -P "+strconv.Itoa(int(pattern))+" "+strconv.FormatInt(off, 10)+" "+strconv.FormatInt(n, 10))
}

func (c *rbdCluster) size(t *testing.T, id string) int64 {
	t.Helper()
	n, err := c.vols.Size(context.Background(), rbd.VolumeName(id))
	if err != nil {
		t.Fatalf("volume %s's image: %v", id, err)
	}
	return n
}

// TestRBDBackend runs a volume's life on the rbd backend through the
// cloud's HTTP API on both engines, against the shared one-node Ceph:
// blank and from an image, extend, an RBD snapshot, a volume from it and
// a clone (RBD clones), backups in the backup pool (full, incremental,
// restored to a new and onto an existing volume; of a snapshot, and the
// volume's incremental after it), upload to an image, an
// attachment's rbd connection, and deletes that leave no image behind.
func TestRBDBackend(t *testing.T) {
	cl := newRBDCluster(t)
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL, cl.options)
		ctx := context.Background()
		const mib = 1 << 20

		// From an image: 2 MiB of 0x61 then 1 MiB of 0x62, raw.
		ic, err := openstack.NewImageV2(e.demoPC, gophercloud.EndpointOpts{Region: "RegionOne"})
		if err != nil {
			t.Fatal(err)
		}
		im, err := images.Create(ctx, ic, images.CreateOpts{Name: "disk", DiskFormat: "raw", ContainerFormat: "bare"}).Extract()
		if err != nil {
			t.Fatal(err)
		}
		payload := append(bytes.Repeat([]byte{0x61}, 2*mib), bytes.Repeat([]byte{0x62}, mib)...)
		if err := imagedata.Upload(ctx, ic, im.ID, bytes.NewReader(payload)).ExtractErr(); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		v, err := volumes.Create(ctx, e.demo, volumes.CreateOpts{Size: 1, Name: "from-image", ImageID: im.ID}, nil).Extract()
		if err != nil {
			t.Fatal(err)
		}
		waitStatus(t, e.demo, v.ID, "available")
		t.Logf("volume from a 3 MiB raw image available in %v", time.Since(start).Round(time.Millisecond))
		src := v.ID
		if got := cl.size(t, src); got != 1<<30 {
			t.Errorf("volume from image: image of %d bytes, want 1 GiB", got)
		}
		cl.check(t, src, 0, 2*mib, 0x61)
		cl.check(t, src, 2*mib, mib, 0x62)

		// Blank, extended.
		blank := e.newVolume(t, 1)
		if got := cl.size(t, blank); got != 1<<30 {
			t.Errorf("blank volume: image of %d bytes", got)
		}
		if err := volumes.ExtendSize(ctx, e.demo, blank, volumes.ExtendSizeOpts{NewSize: 2}).ExtractErr(); err != nil {
			t.Fatal(err)
		}
		waitStatus(t, e.demo, blank, "available")
		if got := cl.size(t, blank); got != 2<<30 {
			t.Errorf("extended volume: image of %d bytes, want 2 GiB", got)
		}

		// A snapshot, then a change; a volume from the snapshot has the
		// bytes before the change, a clone those after; both are RBD clones.
		sn, err := snapshots.Create(ctx, e.demo, snapshots.CreateOpts{VolumeID: src, Name: "snap"}).Extract()
		if err != nil {
			t.Fatal(err)
		}
		waitSnap(t, e.demo, sn.ID, "available")
		if ok, err := cl.vols.HasSnapshot(ctx, rbd.VolumeName(src), rbd.SnapshotName(sn.ID)); err != nil || !ok {
			t.Fatalf("the volume's image has no RBD snapshot %s: %v", rbd.SnapshotName(sn.ID), err)
		}
		cl.write(t, src, 0, mib, 0x63)
		start = time.Now()
		fromSnap, err := volumes.Create(ctx, e.demo, volumes.CreateOpts{Size: 2, SnapshotID: sn.ID}, nil).Extract()
		if err != nil {
			t.Fatal(err)
		}
		clone, err := volumes.Create(ctx, e.demo, volumes.CreateOpts{Size: 1, SourceVolID: src}, nil).Extract()
		if err != nil {
			t.Fatal(err)
		}
		waitStatus(t, e.demo, fromSnap.ID, "available")
		waitStatus(t, e.demo, clone.ID, "available")
		t.Logf("a volume from a snapshot and a clone available in %v", time.Since(start).Round(time.Millisecond))
		cl.check(t, fromSnap.ID, 0, 2*mib, 0x61)
		cl.check(t, clone.ID, 0, mib, 0x63)
		cl.check(t, clone.ID, mib, mib, 0x61)
		if got := cl.size(t, fromSnap.ID); got != 2<<30 {
			t.Errorf("volume from snapshot: %d bytes, want 2 GiB", got)
		}
		if p, want := cl.parent(t, rbd.VolumeName(fromSnap.ID)), testenv.VolumesPool+"/"+rbd.VolumeName(src)+"@"+rbd.SnapshotName(sn.ID); p != want {
			t.Errorf("volume from snapshot: parent %q, want %q", p, want)
		}
		if p := cl.parent(t, rbd.VolumeName(clone.ID)); !strings.HasPrefix(p, testenv.VolumesPool+"/"+rbd.VolumeName(src)+"@") {
			t.Errorf("clone: parent %q, want a snapshot of the source", p)
		}
		// The snapshot a volume depends on stays, available (Cinder's
		// SnapshotIsBusy).
		if err := snapshots.Delete(ctx, e.demo, sn.ID).ExtractErr(); err != nil {
			t.Fatal(err)
		}
		if got := waitSnap(t, e.demo, sn.ID, "available"); got == nil {
			t.Fatal("busy snapshot gone")
		}

		// Backups in the backup pool: full, a change, incremental.
		full, err := backups.Create(ctx, e.demo, backups.CreateOpts{VolumeID: src, Name: "full"}).Extract()
		if err != nil {
			t.Fatal(err)
		}
		waitBackup(t, e.demo, full.ID, "available")
		waitStatus(t, e.demo, src, "available")
		if ok, _ := cl.backups.Exists(ctx, rbd.VolumeName(src)+".backup."+full.ID); !ok {
			t.Errorf("no image for the full backup in the backup pool: %q", cl.images(t, testenv.BackupsPool))
		}
		cl.write(t, src, 4*mib, mib, 0x64)
		start = time.Now()
		incr, err := backups.Create(ctx, e.demo, backups.CreateOpts{VolumeID: src, Name: "incr", Incremental: true}).Extract()
		if err != nil {
			t.Fatal(err)
		}
		got := waitBackup(t, e.demo, incr.ID, "available")
		t.Logf("incremental backup of 1 MiB changed available in %v", time.Since(start).Round(time.Millisecond))
		if !got.IsIncremental || got.ObjectCount > 1 {
			t.Errorf("incremental backup %+v: want incremental, one 4 MiB object", got)
		}
		// Restore the incremental to a new volume, the full one onto the
		// blank volume, over bytes that must go.
		rs, err := backups.RestoreFromBackup(ctx, e.demo, incr.ID, backups.RestoreOpts{}).Extract()
		if err != nil {
			t.Fatal(err)
		}
		waitStatus(t, e.demo, rs.VolumeID, "available")
		cl.check(t, rs.VolumeID, 0, mib, 0x63)
		cl.check(t, rs.VolumeID, mib, mib, 0x61)
		cl.check(t, rs.VolumeID, 4*mib, mib, 0x64)
		cl.write(t, blank, 4*mib, mib, 0x77)
		if _, err := backups.RestoreFromBackup(ctx, e.demo, full.ID, backups.RestoreOpts{VolumeID: blank}).Extract(); err != nil {
			t.Fatal(err)
		}
		waitBackup(t, e.demo, full.ID, "available")
		waitStatus(t, e.demo, blank, "available")
		cl.check(t, blank, 0, mib, 0x63)
		cl.check(t, blank, 4*mib, mib, 0)

		// A snapshot's backup, incremental from the volume's latest backup
		// older than the snapshot: the diff ends at the snapshot. The
		// volume's next incremental starts at that snapshot.
		s2, err := snapshots.Create(ctx, e.demo, snapshots.CreateOpts{VolumeID: src, Name: "s2"}).Extract()
		if err != nil {
			t.Fatal(err)
		}
		waitSnap(t, e.demo, s2.ID, "available")
		cl.write(t, src, 0, mib, 0x65)
		fromS2, err := backups.Create(ctx, e.demo, backups.CreateOpts{VolumeID: src, SnapshotID: s2.ID, Incremental: true}).Extract()
		if err != nil {
			t.Fatal(err)
		}
		if got := waitBackup(t, e.demo, fromS2.ID, "available"); !got.IsIncremental || got.SnapshotID != s2.ID || got.ObjectCount > 1 {
			t.Errorf("snapshot's incremental backup %+v: want incremental, of %s, nothing changed", got, s2.ID)
		}
		waitSnap(t, e.demo, s2.ID, "available")
		rs2, err := backups.RestoreFromBackup(ctx, e.demo, fromS2.ID, backups.RestoreOpts{}).Extract()
		if err != nil {
			t.Fatal(err)
		}
		waitStatus(t, e.demo, rs2.VolumeID, "available")
		cl.check(t, rs2.VolumeID, 0, mib, 0x63)
		cl.check(t, rs2.VolumeID, 4*mib, mib, 0x64)
		after, err := backups.Create(ctx, e.demo, backups.CreateOpts{VolumeID: src, Incremental: true}).Extract()
		if err != nil {
			t.Fatal(err)
		}
		if got := waitBackup(t, e.demo, after.ID, "available"); !got.IsIncremental || got.ObjectCount > 1 {
			t.Errorf("incremental backup after the snapshot's %+v: want incremental, one 4 MiB object", got)
		}
		rs3, err := backups.RestoreFromBackup(ctx, e.demo, after.ID, backups.RestoreOpts{}).Extract()
		if err != nil {
			t.Fatal(err)
		}
		waitStatus(t, e.demo, rs3.VolumeID, "available")
		cl.check(t, rs3.VolumeID, 0, mib, 0x65)
		cl.check(t, rs3.VolumeID, 4*mib, mib, 0x64)

		// Upload to an image: the volume's bytes.
		up := e.want(t, 202, "POST", "/v3/volumes/"+src+"/action", e.demoTok, `{"os-volume_upload_image":{"image_name":"up"}}`)
		upID := up["os-volume_upload_image"].(map[string]any)["image_id"].(string)
		waitStatus(t, e.demo, src, "available")
		testenv.Eventually(t, 30*time.Second, "uploaded image active", func() bool {
			got, err := e.c.Images.Get(ctx, e.demoProj, false, upID)
			return err == nil && got.Status == "active"
		})
		if got, size := readAt(t, e.c.Images.DataPath(upID), 4*mib, 8); size != 1<<30 || !bytes.Equal(got, bytes.Repeat([]byte{0x64}, 8)) {
			t.Errorf("uploaded image: %d bytes, %x at 4 MiB", size, got)
		}

		// An attachment's connection is rbd on any host.
		att := e.want(t, 200, "POST", "/v3/attachments", e.adTok,
			`{"attachment":{"volume_uuid":"`+blank+`","instance_uuid":"`+uuid.NewString()+`","connector":{"host":"any-host"}}}`,
			"OpenStack-API-Version", "volume 3.54")["attachment"].(map[string]any)
		ci, _ := att["connection_info"].(map[string]any)
		data, _ := ci["data"].(map[string]any)
		if ci["driver_volume_type"] != "rbd" || data["pool"] != testenv.VolumesPool || data["image"] != rbd.VolumeName(blank) ||
			data["user"] != cl.ceph.Client || data["key"] != cl.ceph.Key || data["monitors"] == nil {
			t.Errorf("connection_info %v", ci)
		}
		e.want(t, 200, "DELETE", "/v3/attachments/"+att["id"].(string), e.adTok, "", "OpenStack-API-Version", "volume 3.54")
		waitStatus(t, e.demo, blank, "available")

		// Deletes leave nothing behind in either pool.
		for _, id := range []string{after.ID, fromS2.ID, incr.ID, full.ID} {
			if err := backups.Delete(ctx, e.demo, id).ExtractErr(); err != nil {
				t.Fatal(err)
			}
			waitBackup(t, e.demo, id, "")
		}
		if ok, err := cl.vols.HasSnapshot(ctx, rbd.VolumeName(src), rbd.SnapshotName(s2.ID)); err != nil || !ok {
			t.Errorf("deleting the snapshot's backup took the volume's RBD snapshot (%v)", err)
		}
		vols := []string{src, blank, fromSnap.ID, clone.ID, rs.VolumeID, rs2.VolumeID, rs3.VolumeID}
		for _, id := range []string{fromSnap.ID, clone.ID, rs.VolumeID, rs2.VolumeID, rs3.VolumeID, blank} {
			if err := volumes.Delete(ctx, e.demo, id, volumes.DeleteOpts{}).ExtractErr(); err != nil {
				t.Fatal(err)
			}
			waitGone(t, e.demo, id)
		}
		for _, id := range []string{sn.ID, s2.ID} {
			if err := snapshots.Delete(ctx, e.demo, id).ExtractErr(); err != nil {
				t.Fatal(err)
			}
			waitSnap(t, e.demo, id, "")
		}
		if err := volumes.Delete(ctx, e.demo, src, volumes.DeleteOpts{}).ExtractErr(); err != nil {
			t.Fatal(err)
		}
		waitGone(t, e.demo, src)
		for _, pool := range []string{testenv.VolumesPool, testenv.BackupsPool} {
			for _, img := range cl.images(t, pool) {
				for _, id := range vols {
					if strings.Contains(img, id) {
						t.Errorf("image %s/%s left behind", pool, img)
					}
				}
			}
		}
	})
}

// TestRBDResume: work a stopped controller left half-done on the rbd
// backend is redone at the next start: a volume still creating whose
// image is half-made, one still deleting, a snapshot still creating and
// a backup still creating with nothing stored.
func TestRBDResume(t *testing.T) {
	cl := newRBDCluster(t)
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		cfg, db, _ := serviceConfig(t, dbURL)
		cfg.RBD, cfg.RBDBackups = cl.vols, cl.backups
		o := startService(t, cfg)
		newVol := func() string {
			id := idIn(o.call("POST", "/v3/volumes", `{"volume":{"size":1}}`, 202), "id")
			o.waitFor("/v3/volumes/"+id, "available")
			return id
		}
		creating, deleting, snapped := newVol(), newVol(), newVol()
		sn := idIn(o.call("POST", "/v3/snapshots", `{"snapshot":{"volume_id":"`+snapped+`"}}`, 202), "id")
		o.waitFor("/v3/snapshots/"+sn, "available")
		bk := idIn(o.call("POST", "/v3/backups", `{"backup":{"volume_id":"`+snapped+`"}}`, 202), "id")
		o.waitFor("/v3/backups/"+bk, "available")
		o.waitFor("/v3/volumes/"+snapped, "available")
		o.stop()

		// As if the controller had stopped in the middle of each.
		exec := func(q string, args ...any) {
			t.Helper()
			if _, err := db.Exec(ctx, q, args...); err != nil {
				t.Fatal(err)
			}
		}
		img := rbd.VolumeName(creating)
		if err := cl.vols.Delete(ctx, img); err != nil {
			t.Fatal(err)
		}
		if err := cl.vols.Create(ctx, img, 1<<20); err != nil {
			t.Fatal(err)
		}
		exec("UPDATE volumes SET status = 'creating' WHERE id = ?", creating)
		exec("UPDATE volumes SET status = 'deleting' WHERE id = ?", deleting)
		if err := cl.vols.DeleteSnapshot(ctx, rbd.VolumeName(snapped), rbd.SnapshotName(sn)); err != nil {
			t.Fatal(err)
		}
		exec("UPDATE volume_snapshots SET status = 'creating' WHERE id = ?", sn)
		bimg := rbd.VolumeName(snapped) + ".backup." + bk
		snaps, err := cl.backups.Snapshots(ctx, bimg)
		if err != nil || len(snaps) != 1 {
			t.Fatalf("backup image %s: snapshots %q, %v", bimg, snaps, err)
		}
		if err := cl.backups.DeleteSnapshot(ctx, bimg, snaps[0]); err != nil {
			t.Fatal(err)
		}
		if err := cl.backups.Delete(ctx, bimg); err != nil {
			t.Fatal(err)
		}
		exec("UPDATE volume_backups SET status = 'creating' WHERE id = ?", bk)
		exec("UPDATE volumes SET status = 'backing-up' WHERE id = ?", snapped)

		o = startService(t, cfg)
		o.waitFor("/v3/volumes/"+creating, "available")
		if got := cl.size(t, creating); got != 1<<30 {
			t.Errorf("resumed create: image of %d bytes, want 1 GiB", got)
		}
		testenv.Eventually(t, 30*time.Second, "deleting volume gone", func() bool {
			resp, _ := testenv.Do(t, o.srv.Client(), "GET", o.srv.URL+"/v3/volumes/"+deleting, "tok", "")
			return resp.StatusCode == 404
		})
		if ok, err := cl.vols.Exists(ctx, rbd.VolumeName(deleting)); ok || err != nil {
			t.Errorf("resumed delete left image %s (%v)", rbd.VolumeName(deleting), err)
		}
		o.waitFor("/v3/snapshots/"+sn, "available")
		if ok, err := cl.vols.HasSnapshot(ctx, rbd.VolumeName(snapped), rbd.SnapshotName(sn)); !ok || err != nil {
			t.Errorf("resumed snapshot: no RBD snapshot (%v)", err)
		}
		o.waitFor("/v3/backups/"+bk, "available")
		o.waitFor("/v3/volumes/"+snapped, "available")
		if snaps, err := cl.backups.Snapshots(ctx, bimg); err != nil || len(snaps) != 1 {
			t.Errorf("resumed backup: image %s has snapshots %q (%v)", bimg, snaps, err)
		}
	})
}
