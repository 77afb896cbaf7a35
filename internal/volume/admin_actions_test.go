package volume_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	img "nimbus/internal/image"
	"nimbus/internal/testenv"
)

// TestVolumeActionsMore covers the actions Tempest's wider volume tests
// use, on both engines: image metadata, force delete, snapshot status
// updates, and the volume type views of create and update.
func TestVolumeActionsMore(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		t.Run("ImageMetadata", e.testImageMetadata)
		t.Run("ForceDelete", e.testForceDelete)
		t.Run("SnapshotStatus", e.testSnapshotStatus)
		t.Run("TypeWriteViews", e.testTypeWriteViews)
		t.Run("Services", e.testServices)
	})
}

func (e *env) volumeFrom(t *testing.T, tok, body string) string {
	t.Helper()
	id := e.want(t, 202, "POST", "/v3/volumes", tok, body)["volume"].(map[string]any)["id"].(string)
	waitStatus(t, e.demo, id, "available")
	return id
}

func (e *env) testImageMetadata(t *testing.T) {
	vol := e.volumeFrom(t, e.demoTok, `{"volume":{"size":1}}`)
	path := "/v3/volumes/" + vol + "/action"
	for _, tc := range []struct {
		name, tok, body string
		status          int
		want            map[string]string // the image metadata after, when status is 200
	}{
		{"set merges", e.demoTok, `{"os-set_image_metadata":{"metadata":{"a":"1","b":"2"}}}`, 200, map[string]string{"a": "1", "b": "2"}},
		{"set again", e.demoTok, `{"os-set_image_metadata":{"metadata":{"b":"3","image_id":"x"}}}`, 200, map[string]string{"a": "1", "b": "3", "image_id": "x"}},
		{"unset", e.demoTok, `{"os-unset_image_metadata":{"key":"a"}}`, 200, map[string]string{"b": "3", "image_id": "x"}},
		{"unset missing", e.demoTok, `{"os-unset_image_metadata":{"key":"a"}}`, 404, nil},
		{"set not an object", e.demoTok, `{"os-set_image_metadata":{"metadata":"a"}}`, 400, nil},
		{"set unknown field", e.demoTok, `{"os-set_image_metadata":{"metadata":{},"x":1}}`, 400, nil},
		{"unset no key", e.demoTok, `{"os-unset_image_metadata":{}}`, 400, nil},
		{"set a value too long", e.demoTok, `{"os-set_image_metadata":{"metadata":{"k":"` + longString(256) + `"}}}`, 400, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, m := e.do(t, "POST", path, tc.tok, tc.body)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %v", resp.StatusCode, tc.status, m)
			}
			if tc.want == nil {
				return
			}
			got := e.want(t, 200, "POST", path, e.demoTok, `{"os-show_image_metadata":{}}`)["metadata"]
			if b, w := mustJSON(t, got), mustJSON(t, tc.want); b != w {
				t.Errorf("image metadata %s, want %s", b, w)
			}
			shown := e.want(t, 200, "GET", "/v3/volumes/"+vol, e.demoTok, "")["volume"].(map[string]any)["volume_image_metadata"]
			if b, w := mustJSON(t, shown), mustJSON(t, tc.want); b != w {
				t.Errorf("volume_image_metadata %s, want %s", b, w)
			}
		})
	}
}

// TestLicenceIgnoresImageMetadata: the owner may rewrite a volume's image
// metadata, but an image uploaded from it (or from a clone or a snapshot
// of it) keeps the licence of the image its data came from.
func TestLicenceIgnoresImageMetadata(t *testing.T) {
	e := newEnv(t, "")
	ctx := context.Background()
	mkImage := func(name, osType string) string {
		resp, raw := testenv.Do(t, e.http, "POST", e.c.ImageURL+"/v2/images", e.adTok,
			`{"name":"`+name+`","disk_format":"raw","container_format":"bare","visibility":"public","os_type":"`+osType+`"}`)
		testenv.MustStatus(t, resp, raw, 201)
		var im struct{ ID string }
		if err := json.Unmarshal([]byte(raw), &im); err != nil {
			t.Fatal(err)
		}
		resp, raw = testenv.Do(t, e.http, "PUT", e.c.ImageURL+"/v2/images/"+im.ID+"/file", e.adTok,
			string(make([]byte, 1<<20)), "Content-Type", "application/octet-stream")
		testenv.MustStatus(t, resp, raw, 204)
		return im.ID
	}
	win, linux := mkImage("win", "windows"), mkImage("linux", "linux")
	vol := e.volumeFrom(t, e.demoTok, `{"volume":{"size":1,"imageRef":"`+win+`"}}`)
	e.want(t, 200, "POST", "/v3/volumes/"+vol+"/action", e.demoTok,
		`{"os-set_image_metadata":{"metadata":{"image_id":"`+linux+`","os_type":"linux"}}}`)
	clone := e.volumeFrom(t, e.demoTok, `{"volume":{"size":1,"source_volid":"`+vol+`"}}`)
	snap := e.want(t, 202, "POST", "/v3/snapshots", e.demoTok, `{"snapshot":{"volume_id":"`+vol+`"}}`)["snapshot"].(map[string]any)["id"].(string)
	waitSnap(t, e.demo, snap, "available")
	fromSnap := e.volumeFrom(t, e.demoTok, `{"volume":{"size":1,"snapshot_id":"`+snap+`"}}`)
	// A backup restored to a new volume, and onto a blank one, brings the
	// source image (and the volume's metadata) with its data.
	e.want(t, 200, "POST", "/v3/volumes/"+vol+"/metadata", e.demoTok, `{"metadata":{"role":"db"}}`)
	bk := e.want(t, 202, "POST", "/v3/backups", e.demoTok, `{"backup":{"volume_id":"`+vol+`"}}`)["backup"].(map[string]any)["id"].(string)
	waitBackup(t, e.demo, bk, "available")
	restored := e.want(t, 202, "POST", "/v3/backups/"+bk+"/restore", e.demoTok, `{"restore":{}}`)["restore"].(map[string]any)["volume_id"].(string)
	waitStatus(t, e.demo, restored, "available")
	blank := e.volumeFrom(t, e.demoTok, `{"volume":{"size":1}}`)
	e.want(t, 202, "POST", "/v3/backups/"+bk+"/restore", e.demoTok, `{"restore":{"volume_id":"`+blank+`"}}`)
	waitStatus(t, e.demo, blank, "available")
	for _, v := range []string{restored, blank} {
		m := e.want(t, 200, "GET", "/v3/volumes/"+v, e.demoTok, "")["volume"].(map[string]any)
		if md := m["metadata"].(map[string]any); md["role"] != "db" || m["bootable"] != "true" {
			t.Errorf("restored volume %s: metadata %v bootable %v", v, md, m["bootable"])
		}
	}
	for _, v := range []string{vol, clone, fromSnap, restored, blank} {
		e.want(t, 200, "POST", "/v3/volumes/"+v+"/action", e.demoTok, `{"os-unset_image_metadata":{"key":"image_id"}}`)
		up := e.want(t, 202, "POST", "/v3/volumes/"+v+"/action", e.demoTok,
			`{"os-volume_upload_image":{"image_name":"mine"}}`)["os-volume_upload_image"].(map[string]any)
		id := up["image_id"].(string)
		var got *img.Image
		testenv.Eventually(t, 30*time.Second, "image "+id+" active", func() bool {
			var err error
			got, err = e.c.Images.Get(ctx, e.demoProj, false, id)
			return err == nil && got.Status == img.StatusActive
		})
		if got.Licence != img.LicenceWindows {
			t.Errorf("volume %s: uploaded image's licence %q, want %q", v, got.Licence, img.LicenceWindows)
		}
		// The volumes hold the same bytes, and an image takes the licence
		// of another with its data: each upload must stand on its own.
		resp, raw := testenv.Do(t, e.http, "DELETE", e.c.ImageURL+"/v2/images/"+id, e.demoTok, "")
		testenv.MustStatus(t, resp, raw, 204)
		waitStatus(t, e.demo, v, "available")
	}
}

func (e *env) testForceDelete(t *testing.T) {
	admin := func(id, body string) { e.want(t, 202, "POST", "/v3/volumes/"+id+"/action", e.adTok, body) }
	for _, status := range []string{"creating", "error", "maintenance", "attaching"} {
		t.Run(status, func(t *testing.T) {
			vol := e.volumeFrom(t, e.demoTok, `{"volume":{"size":1}}`)
			if status == "attaching" {
				e.want(t, 202, "POST", "/v3/volumes/"+vol+"/action", e.demoTok, `{"os-reserve":{}}`)
			} else {
				admin(vol, `{"os-reset_status":{"status":"`+status+`"}}`)
			}
			// A member may not force; the volume stays.
			e.want(t, 403, "POST", "/v3/volumes/"+vol+"/action", e.demoTok, `{"os-force_delete":{}}`)
			admin(vol, `{"os-force_delete":{}}`)
			waitGone(t, e.demo, vol)
		})
	}
	t.Run("reset to deleting", func(t *testing.T) {
		vol := e.volumeFrom(t, e.demoTok, `{"volume":{"size":1}}`)
		admin(vol, `{"os-reset_status":{"status":"deleting"}}`)
		admin(vol, `{"os-force_delete":{}}`)
		waitGone(t, e.demo, vol)
	})
	t.Run("with a snapshot", func(t *testing.T) {
		vol := e.volumeFrom(t, e.demoTok, `{"volume":{"size":1}}`)
		snap := e.want(t, 202, "POST", "/v3/snapshots", e.demoTok, `{"snapshot":{"volume_id":"`+vol+`"}}`)["snapshot"].(map[string]any)["id"].(string)
		waitSnap(t, e.demo, snap, "available")
		e.want(t, 400, "POST", "/v3/volumes/"+vol+"/action", e.adTok, `{"os-force_delete":{}}`)
		waitStatus(t, e.demo, vol, "available")
	})
}

func (e *env) testSnapshotStatus(t *testing.T) {
	vol := e.volumeFrom(t, e.demoTok, `{"volume":{"size":1}}`)
	snap := e.want(t, 202, "POST", "/v3/snapshots", e.demoTok, `{"snapshot":{"volume_id":"`+vol+`"}}`)["snapshot"].(map[string]any)["id"].(string)
	waitSnap(t, e.demo, snap, "available")
	path := "/v3/snapshots/" + snap + "/action"
	// From available, nothing may be reported.
	e.want(t, 400, "POST", path, e.demoTok, `{"os-update_snapshot_status":{"status":"error"}}`)
	e.want(t, 202, "POST", path, e.adTok, `{"os-reset_status":{"status":"creating"}}`)
	for _, tc := range []struct {
		name, body string
		status     int
	}{
		{"no status", `{"os-update_snapshot_status":{"progress":"10%"}}`, 400},
		{"not a move", `{"os-update_snapshot_status":{"status":"deleting"}}`, 400},
		{"progress not a percentage", `{"os-update_snapshot_status":{"status":"error","progress":"80"}}`, 400},
		{"progress over 100", `{"os-update_snapshot_status":{"status":"error","progress":"101%"}}`, 400},
		{"error at 80%", `{"os-update_snapshot_status":{"status":"error","progress":"80%"}}`, 202},
	} {
		resp, m := e.do(t, "POST", path, e.demoTok, tc.body)
		if resp.StatusCode != tc.status {
			t.Errorf("%s: status %d, want %d: %v", tc.name, resp.StatusCode, tc.status, m)
		}
	}
	sn := e.want(t, 200, "GET", "/v3/snapshots/"+snap, e.adTok, "")["snapshot"].(map[string]any)
	if sn["status"] != "error" || sn["os-extended-snapshot-attributes:progress"] != "80%" {
		t.Errorf("snapshot status %v progress %v, want error and 80%%", sn["status"], sn["os-extended-snapshot-attributes:progress"])
	}
	// An admin's reset to deleting and a force delete remove it.
	e.want(t, 202, "POST", path, e.adTok, `{"os-reset_status":{"status":"deleting"}}`)
	e.want(t, 202, "POST", path, e.adTok, `{"os-force_delete":{}}`)
	waitSnap(t, e.demo, snap, "")
}

func (e *env) testTypeWriteViews(t *testing.T) {
	created := e.want(t, 200, "POST", "/v3/types", e.adTok, `{"volume_type":{"name":"views-type"}}`)["volume_type"].(map[string]any)
	if _, ok := created["qos_specs_id"]; ok {
		t.Errorf("create answers qos_specs_id: %v", created)
	}
	if _, ok := created["os-volume-type-access:is_public"]; !ok {
		t.Errorf("create lacks os-volume-type-access:is_public: %v", created)
	}
	id := created["id"].(string)
	updated := e.want(t, 200, "PUT", "/v3/types/"+id, e.adTok, `{"volume_type":{"description":"d"}}`)["volume_type"].(map[string]any)
	for _, k := range []string{"qos_specs_id", "os-volume-type-access:is_public"} {
		if _, ok := updated[k]; ok {
			t.Errorf("update answers %s: %v", k, updated)
		}
	}
	// Extra specs of null are refused, not taken for none.
	e.want(t, 400, "POST", "/v3/types/"+id+"/extra_specs", e.adTok, `{"extra_specs":null}`)
	shown := e.want(t, 200, "GET", "/v3/types/"+id, e.adTok, "")["volume_type"].(map[string]any)
	if _, ok := shown["qos_specs_id"]; !ok {
		t.Errorf("an admin's show lacks qos_specs_id: %v", shown)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func longString(n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = 'x'
	}
	return string(b)
}

func (e *env) testServices(t *testing.T) {
	e.want(t, 403, "GET", "/v3/os-services", e.demoTok, "")
	for _, tc := range []struct {
		query string
		want  []string // binaries
	}{
		{"", []string{"cinder-scheduler", "cinder-volume", "cinder-backup"}},
		{"?binary=cinder-volume", []string{"cinder-volume"}},
		{"?host=nimbus", []string{"cinder-scheduler", "cinder-volume", "cinder-backup"}},
		{"?host=nimbus@network&binary=cinder-volume", []string{"cinder-volume"}},
		{"?host=elsewhere", nil},
	} {
		var got []string
		for _, sv := range e.want(t, 200, "GET", "/v3/os-services"+tc.query, e.adTok, "")["services"].([]any) {
			m := sv.(map[string]any)
			if m["state"] != "up" || m["status"] != "enabled" {
				t.Errorf("%s: %v", tc.query, m)
			}
			got = append(got, m["binary"].(string))
		}
		if mustJSON(t, got) != mustJSON(t, tc.want) {
			t.Errorf("services%s: %v, want %v", tc.query, got, tc.want)
		}
	}
	// The volume's host names the cinder-volume service.
	vol := e.volumeFrom(t, e.demoTok, `{"volume":{"size":1}}`)
	host := e.want(t, 200, "GET", "/v3/volumes/"+vol, e.adTok, "")["volume"].(map[string]any)["os-vol-host-attr:host"].(string)
	if host != "nimbus@network#network" {
		t.Errorf("volume host %q", host)
	}
	for _, tc := range []struct {
		action, body string
		status       int
	}{
		{"enable", `{"host":"invalid_host","binary":"cinder-volume"}`, 404},
		{"disable", `{"host":"nimbus@network","binary":"invalid_binary"}`, 404},
		{"disable", `{"host":"nimbus@network","binary":"cinder-volume"}`, 400},
		{"disable-log-reason", `{"host":"nimbus@network","binary":"cinder-volume","disabled_reason":null}`, 400},
		{"disable", `{"binary":"cinder-volume"}`, 400},
		{"freeze", `{"host":"invalid_host"}`, 400},
		{"thaw", `{"host":"invalid_host"}`, 400},
		{"freeze", `{"host":"nimbus@network"}`, 400},
		{"unknown", `{"host":"nimbus@network"}`, 404},
		{"enable", `[1]`, 400},
	} {
		resp, m := e.do(t, "PUT", "/v3/os-services/"+tc.action, e.adTok, tc.body)
		if resp.StatusCode != tc.status {
			t.Errorf("%s %s: status %d, want %d: %v", tc.action, tc.body, resp.StatusCode, tc.status, m)
		}
	}
	e.want(t, 403, "PUT", "/v3/os-services/enable", e.demoTok, `{"host":"nimbus","binary":"cinder-scheduler"}`)
}
