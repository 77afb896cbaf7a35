package compute_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"nimbus/internal/testenv"
)

// osVolumeKeys are the keys of Nova's volume view, which Tempest's
// schema (api_schema/response/compute/v2_1/volumes.py) allows and no more.
var osVolumeKeys = []string{"attachments", "availabilityZone", "createdAt", "displayDescription", "displayName",
	"id", "metadata", "size", "snapshotId", "status", "volumeType"}

var osSnapshotKeys = []string{"createdAt", "displayDescription", "displayName", "id", "size", "status", "volumeId"}

func keysOf(m map[string]any) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// osVolumeStatus waits for the status of a volume or snapshot (path is
// os-volumes or os-snapshots), as tok sees it;
// "deleted" waits for its 404.
func (e *volEnv) osVolumeStatus(tok, path, id, want string) map[string]any {
	e.t.Helper()
	var last map[string]any
	testenv.Eventually(e.t, 20*time.Second, path+" "+id+" "+want, func() bool {
		st, m, _ := e.do("GET", path+"/"+id, tok, "2.1", "")
		if want == "deleted" {
			return st == 404
		}
		last = m
		for _, v := range m {
			if o, ok := v.(map[string]any); ok && o["status"] == want {
				return true
			}
		}
		return false
	})
	return last
}

func ids(list []any) []string {
	var out []string
	for _, x := range list {
		out = append(out, x.(map[string]any)["id"].(string))
	}
	return out
}

// TestOSVolumes creates, shows, lists, attaches and deletes a volume
// through Nova's os-volumes at 2.1, and checks that the proxy is the
// caller's: another project's volume is 404.
func TestOSVolumes(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newVolEnv(t, dbURL)
		st, m, hdr := e.do("POST", "/os-volumes", e.demo, "2.1",
			`{"volume":{"size":"1","display_name":"data","display_description":"d","metadata":{"k":"v"},"availability_zone":"nova"}}`)
		if st != 200 {
			t.Fatalf("create: %d %v", st, m)
		}
		v := m["volume"].(map[string]any)
		id := v["id"].(string)
		if got := keysOf(v); !slices.Equal(got, osVolumeKeys) {
			t.Errorf("create view keys %v, want %v", got, osVolumeKeys)
		}
		if v["size"] != 1.0 || v["displayName"] != "data" || v["displayDescription"] != "d" || v["availabilityZone"] != "nova" ||
			v["volumeType"] == nil || v["snapshotId"] != nil || mustJSONText(v["metadata"]) != `{"k":"v"}` ||
			mustJSONText(v["attachments"]) != `[{}]` {
			t.Errorf("create view %v", v)
		}
		if !strings.HasSuffix(hdr.Get("Location"), "/os-volumes/"+id) {
			t.Errorf("Location %q", hdr.Get("Location"))
		}
		if _, err := time.Parse("2006-01-02T15:04:05.000000", v["createdAt"].(string)); err != nil {
			t.Errorf("createdAt: %v", err)
		}
		e.osVolumeStatus(e.demo, "/os-volumes", id, "available")
		second := e.must(200, "POST", "/os-volumes", e.demo, "2.1", `{"volume":{"size":1}}`)["volume"].(map[string]any)["id"].(string)
		other := e.must(200, "POST", "/os-volumes", e.admin, "2.1", `{"volume":{"size":1}}`)["volume"].(map[string]any)["id"].(string)

		for _, path := range []string{"/os-volumes", "/os-volumes/detail"} {
			got := ids(e.must(200, "GET", path, e.demo, "2.1", "")["volumes"].([]any))
			if !slices.Contains(got, id) || !slices.Contains(got, second) || slices.Contains(got, other) {
				t.Errorf("%s: %v, want %s and %s but not %s", path, got, id, second, other)
			}
			if got := ids(e.must(200, "GET", path+"?limit=1", e.demo, "2.1", "")["volumes"].([]any)); len(got) != 1 {
				t.Errorf("%s?limit=1: %v", path, got)
			}
			if got := ids(e.must(200, "GET", path+"?offset=1", e.demo, "2.1", "")["volumes"].([]any)); len(got) != 1 {
				t.Errorf("%s?offset=1: %v", path, got)
			}
		}

		// Attached, it shows its server and device.
		dev := e.attach(e.server, "2.1", `{"volumeAttachment":{"volumeId":"`+id+`"}}`)["device"]
		e.volumeStatus(id, "in-use")
		att := e.must(200, "GET", "/os-volumes/"+id, e.demo, "2.1", "")["volume"].(map[string]any)["attachments"].([]any)
		want := map[string]any{"id": id, "volumeId": id, "serverId": e.server, "device": dev}
		if len(att) != 1 || mustJSONText(att[0]) != mustJSONText(want) {
			t.Errorf("attachments %v, want [%v]", att, want)
		}
		if st, m, _ := e.do("DELETE", "/os-volumes/"+id, e.demo, "2.1", ""); st != 400 {
			t.Errorf("delete in use: %d %v", st, m)
		}
		e.must(202, "DELETE", "/servers/"+e.server+"/os-volume_attachments/"+id, e.demo, "2.1", "")
		e.volumeStatus(id, "available")

		runVolumeCases(t, e, []volCase{
			{"another project's volume", e.demo, "GET", "/os-volumes/" + other, "2.1", "", 404, "Volume " + other + " could not be found."},
			{"delete another project's volume", e.demo, "DELETE", "/os-volumes/" + other, "2.1", "", 404, "Volume " + other + " could not be found."},
			{"unknown volume", e.demo, "GET", "/os-volumes/nope", "2.1", "", 404, "Volume nope could not be found."},
			{"show at 2.36", e.demo, "GET", "/os-volumes/" + id, "2.36", "", 404, "The resource could not be found."},
			{"list at 2.36", e.demo, "GET", "/os-volumes", "2.36", "", 404, ""},
			{"detail at 2.36", e.demo, "GET", "/os-volumes/detail", "2.36", "", 404, ""},
			{"create at 2.36", e.demo, "POST", "/os-volumes", "2.36", `{"volume":{"size":1}}`, 404, ""},
			{"delete at 2.36", e.demo, "DELETE", "/os-volumes/" + id, "2.36", "", 404, ""},
			{"show at 2.35", e.demo, "GET", "/os-volumes/" + id, "2.35", "", 200, id},
		})
		e.must(202, "DELETE", "/os-volumes/"+id, e.demo, "2.1", "")
		e.osVolumeStatus(e.demo, "/os-volumes", id, "deleted")
		e.osVolumeStatus(e.admin, "/os-volumes", other, "available") // the admin's is untouched
	})
}

// TestOSVolumesBadRequests checks Nova's 400s for bodies its schemas
// refuse, and Cinder's for what they let through.
func TestOSVolumesBadRequests(t *testing.T) {
	e := newVolEnv(t, "")
	body := func(inner string) string { return `{"volume":{` + inner + `}}` }
	snap := func(inner string) string { return `{"snapshot":{` + inner + `}}` }
	runVolumeCases(t, e, []volCase{
		{"size not digits", e.demo, "POST", "/os-volumes", "2.1", body(`"size":"#$%"`), 400, `'#$%' does not match '^[0-9]+$'`},
		{"size zero", e.demo, "POST", "/os-volumes", "2.1", body(`"size":0`), 400, "0 is less than the minimum of 1"},
		{"size negative", e.demo, "POST", "/os-volumes", "2.1", body(`"size":-1`), 400, "-1 is less than the minimum of 1"},
		{"size a fraction", e.demo, "POST", "/os-volumes", "2.1", body(`"size":1.5`), 400, "is not of type 'integer', 'string'"},
		{"size a string zero", e.demo, "POST", "/os-volumes", "2.1", body(`"size":"0"`), 400, "minimum of 1"},
		{"size too big", e.demo, "POST", "/os-volumes", "2.1", body(`"size":99999999999999999999`), 400, "greater than the maximum"},
		{"size null", e.demo, "POST", "/os-volumes", "2.1", body(`"size":null`), 400, "is not of type 'integer', 'string'"},
		{"no size", e.demo, "POST", "/os-volumes", "2.1", body(`"display_name":"x"`), 400, "'size' is a required property"},
		{"no volume", e.demo, "POST", "/os-volumes", "2.1", `{}`, 400, "'volume' is a required property"},
		{"volume not an object", e.demo, "POST", "/os-volumes", "2.1", `{"volume":[]}`, 400, "is not of type 'object'"},
		{"null body", e.demo, "POST", "/os-volumes", "2.1", `null`, 400, "None is not of type 'object'"},
		{"unknown field", e.demo, "POST", "/os-volumes", "2.1", body(`"size":1,"name":"x"`), 400, "Additional properties are not allowed"},
		{"name not a string", e.demo, "POST", "/os-volumes", "2.1", body(`"size":1,"display_name":1`), 400, "is not of type 'string'"},
		{"metadata not an object", e.demo, "POST", "/os-volumes", "2.1", body(`"size":1,"metadata":"x"`), 400, "is not of type 'object'"},
		{"metadata value not a string", e.demo, "POST", "/os-volumes", "2.1", body(`"size":1,"metadata":{"a":1}`), 400, "is not of type 'string'"},
		{"unknown zone", e.demo, "POST", "/os-volumes", "2.1", body(`"size":1,"availability_zone":"mars"`), 400, "Availability zone 'mars' is invalid."},
		{"unknown type", e.demo, "POST", "/os-volumes", "2.1", body(`"size":1,"volume_type":"nope"`), 404, "nope"},
		{"unknown snapshot", e.demo, "POST", "/os-volumes", "2.1", body(`"size":1,"snapshot_id":"nope"`), 404, "Snapshot nope could not be found."},
		{"over quota", e.demo, "POST", "/os-volumes", "2.1", body(`"size":100000`), 403, "exceeds allowed gigabytes quota"},
		{"list bad limit", e.demo, "GET", "/os-volumes?limit=x", "2.1", "", 400, "limit param must be an integer"},
		{"list negative offset", e.demo, "GET", "/os-volumes/detail?offset=-1", "2.1", "", 400, "offset param must be positive"},
		{"snapshot without volume_id", e.demo, "POST", "/os-snapshots", "2.1", snap(`"force":true`), 400, "'volume_id' is a required property"},
		{"snapshot bad force", e.demo, "POST", "/os-snapshots", "2.1", snap(`"volume_id":"x","force":"maybe"`), 400, "is not one of"},
		{"snapshot unknown field", e.demo, "POST", "/os-snapshots", "2.1", snap(`"volume_id":"x","name":"n"`), 400, "Additional properties are not allowed"},
		{"snapshot of an unknown volume", e.demo, "POST", "/os-snapshots", "2.1", snap(`"volume_id":"nope"`), 404, "Volume nope could not be found."},
		{"snapshot list bad limit", e.demo, "GET", "/os-snapshots?limit=-2", "2.1", "", 400, "limit param must be positive"},
	})
}

// TestOSSnapshots takes, shows, lists and deletes a snapshot through
// os-snapshots, and makes a volume of it whose size is the snapshot's.
func TestOSSnapshots(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newVolEnv(t, dbURL)
		vol := e.volume()
		m := e.must(200, "POST", "/os-snapshots", e.demo, "2.1",
			`{"snapshot":{"volume_id":"`+vol+`","display_name":"snap","display_description":"s","force":"false"}}`)
		sn := m["snapshot"].(map[string]any)
		id := sn["id"].(string)
		if got := keysOf(sn); !slices.Equal(got, osSnapshotKeys) {
			t.Errorf("snapshot view keys %v, want %v", got, osSnapshotKeys)
		}
		if sn["volumeId"] != vol || sn["size"] != 1.0 || sn["displayName"] != "snap" || sn["displayDescription"] != "s" {
			t.Errorf("snapshot view %v", sn)
		}
		e.osVolumeStatus(e.demo, "/os-snapshots", id, "available")
		for _, path := range []string{"/os-snapshots", "/os-snapshots/detail"} {
			if got := ids(e.must(200, "GET", path, e.demo, "2.1", "")["snapshots"].([]any)); !slices.Equal(got, []string{id}) {
				t.Errorf("%s: %v, want [%s]", path, got, id)
			}
			if got := e.must(200, "GET", path, e.admin, "2.1", "")["snapshots"].([]any); len(got) != 0 {
				t.Errorf("%s as admin (another project): %v, want none", path, got)
			}
		}
		// A volume made of it says so.
		nv := e.must(200, "POST", "/os-volumes", e.demo, "2.1", `{"volume":{"size":2,"snapshot_id":"`+id+`"}}`)["volume"].(map[string]any)
		if nv["snapshotId"] != id || nv["size"] != 2.0 {
			t.Errorf("volume from snapshot %v", nv)
		}
		e.osVolumeStatus(e.demo, "/os-volumes", nv["id"].(string), "available")

		adminVol := e.must(200, "POST", "/os-volumes", e.admin, "2.1", `{"volume":{"size":1}}`)["volume"].(map[string]any)["id"].(string)
		e.osVolumeStatus(e.admin, "/os-volumes", adminVol, "available")
		adminSnap := e.must(200, "POST", "/os-snapshots", e.admin, "2.1", `{"snapshot":{"volume_id":"`+adminVol+`"}}`)["snapshot"].(map[string]any)["id"].(string)

		runVolumeCases(t, e, []volCase{
			{"another project's snapshot", e.demo, "GET", "/os-snapshots/" + adminSnap, "2.1", "", 404, "Snapshot " + adminSnap + " could not be found."},
			{"delete another project's snapshot", e.demo, "DELETE", "/os-snapshots/" + adminSnap, "2.1", "", 404, "could not be found."},
			{"snapshot of another project's volume", e.demo, "POST", "/os-snapshots", "2.1", `{"snapshot":{"volume_id":"` + adminVol + `"}}`, 404, "Volume " + adminVol + " could not be found."},
			{"an admin sees any, as in Cinder", e.admin, "GET", "/os-snapshots/" + id, "2.1", "", 200, id},
			{"unknown snapshot", e.demo, "GET", "/os-snapshots/nope", "2.1", "", 404, "Snapshot nope could not be found."},
			{"delete unknown snapshot", e.demo, "DELETE", "/os-snapshots/nope", "2.1", "", 404, "Snapshot nope could not be found."},
			{"show at 2.36", e.demo, "GET", "/os-snapshots/" + id, "2.36", "", 404, "The resource could not be found."},
			{"list at 2.36", e.demo, "GET", "/os-snapshots/detail", "2.36", "", 404, ""},
			{"create at 2.36", e.demo, "POST", "/os-snapshots", "2.36", `{"snapshot":{"volume_id":"` + vol + `"}}`, 404, ""},
			{"delete at 2.36", e.demo, "DELETE", "/os-snapshots/" + id, "2.36", "", 404, ""},
		})
		e.must(202, "DELETE", "/os-snapshots/"+id, e.demo, "2.1", "")
		e.osVolumeStatus(e.demo, "/os-snapshots", id, "deleted")
	})
}
