package compute_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/volumes"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/volumeattach"

	"nimbus/internal/cloud"
	"nimbus/internal/driver/fake"
	"nimbus/internal/store"
	"nimbus/internal/testenv"
)

// volEnv is a cloud with one active server of demo's and demo's block
// storage client, for the os-volume_attachments tests.
type volEnv struct {
	*env
	server string
	bs     *gophercloud.ServiceClient
}

func newVolEnv(t *testing.T, dbURL string) *volEnv {
	e := &volEnv{env: newEnv(t, dbURL)}
	e.server = e.create(e.demo, "2.96", "")
	e.wait(e.server, e.demo, "ACTIVE")
	var err error
	if e.bs, err = openstack.NewBlockStorageV3(testenv.Provider(t, e.c, cloud.DemoUser), gophercloud.EndpointOpts{Region: "RegionOne"}); err != nil {
		t.Fatal(err)
	}
	return e
}

// volume makes an available 1 GiB volume of demo's.
func (e *volEnv) volume() string {
	e.t.Helper()
	v, err := volumes.Create(context.Background(), e.bs, volumes.CreateOpts{Size: 1}, nil).Extract()
	if err != nil {
		e.t.Fatal(err)
	}
	e.volumeStatus(v.ID, "available")
	return v.ID
}

// volumeStatus waits for a volume's status; "deleted" waits for it to go.
func (e *volEnv) volumeStatus(id, want string) {
	e.t.Helper()
	testenv.Eventually(e.t, 20*time.Second, "volume "+id+" "+want, func() bool {
		v, err := volumes.Get(context.Background(), e.bs, id).Extract()
		if want == "deleted" {
			return gophercloud.ResponseCodeIs(err, 404)
		}
		return err == nil && v.Status == want
	})
}

// disks are the volume ids the driver's VM of server has.
func (e *volEnv) disks(server string) []string {
	e.t.Helper()
	sp, ok := e.c.Fake.Spec(server)
	if !ok {
		e.t.Fatalf("the driver has no VM %s", server)
	}
	var ids []string
	for _, v := range sp.Volumes {
		ids = append(ids, v.ID)
	}
	return ids
}

func (e *volEnv) attach(server, mv, body string) map[string]any {
	e.t.Helper()
	return e.must(200, "POST", "/servers/"+server+"/os-volume_attachments", e.demo, mv, body)["volumeAttachment"].(map[string]any)
}

// lastAction is the newest instance action of server, with its events.
func (e *volEnv) lastAction(server string) map[string]any {
	e.t.Helper()
	acts := e.must(200, "GET", "/servers/"+server+"/os-instance-actions", e.demo, "2.96", "")["instanceActions"].([]any)
	rid := acts[0].(map[string]any)["request_id"].(string)
	return e.must(200, "GET", "/servers/"+server+"/os-instance-actions/"+rid, e.demo, "2.96", "")["instanceAction"].(map[string]any)
}

// waitAction waits for server's newest action to be action with one event
// of result.
func (e *volEnv) waitAction(server, action, event, result string) {
	e.t.Helper()
	testenv.Eventually(e.t, 20*time.Second, action+" "+result, func() bool {
		a := e.lastAction(server)
		evs, _ := a["events"].([]any)
		return a["action"] == action && len(evs) == 1 && evs[0].(map[string]any)["event"] == event &&
			evs[0].(map[string]any)["result"] == result
	})
}

// TestVolumeAttachDetach attaches a volume to an active server, checks
// the views at the microversions that change them, detaches it, attaches
// to a stopped and to a shelved-offloaded server (whose unshelve plugs
// it), and deletes a server whose volume said delete_on_termination.
func TestVolumeAttachDetach(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newVolEnv(t, dbURL)
		vol := e.volume()
		path := "/servers/" + e.server + "/os-volume_attachments"

		a := e.attach(e.server, "2.79", `{"volumeAttachment":{"volumeId":"`+vol+`","tag":"data","delete_on_termination":true}}`)
		if a["id"] != vol || a["volumeId"] != vol || a["serverId"] != e.server || a["tag"] != "data" ||
			a["delete_on_termination"] != true || !strings.HasPrefix(a["device"].(string), "/dev/vd") {
			t.Errorf("attach answer %v", a)
		}
		device := a["device"].(string)
		e.volumeStatus(vol, "in-use")
		testenv.Eventually(t, 10*time.Second, "disk plugged", func() bool { return slices.Equal(e.disks(e.server), []string{vol}) })
		e.waitAction(e.server, "attach_volume", "compute_attach_volume", "Success")

		// Views by microversion.
		cases := []struct {
			mv      string
			present []string
			absent  []string
		}{
			{"2.1", []string{"id", "volumeId", "serverId", "device"}, []string{"tag", "delete_on_termination", "attachment_id", "bdm_uuid"}},
			{"2.70", []string{"id", "tag"}, []string{"delete_on_termination", "attachment_id"}},
			{"2.79", []string{"id", "tag", "delete_on_termination"}, []string{"attachment_id", "bdm_uuid"}},
			{"2.89", []string{"attachment_id", "bdm_uuid", "tag", "delete_on_termination"}, []string{"id"}},
		}
		for _, c := range cases {
			list := e.must(200, "GET", path, e.demo, c.mv, "")["volumeAttachments"].([]any)
			show := e.must(200, "GET", path+"/"+vol, e.demo, c.mv, "")["volumeAttachment"].(map[string]any)
			if len(list) != 1 {
				t.Fatalf("%s: list %v", c.mv, list)
			}
			for _, m := range []map[string]any{list[0].(map[string]any), show} {
				for _, k := range c.present {
					if _, ok := m[k]; !ok {
						t.Errorf("%s: %s missing in %v", c.mv, k, m)
					}
				}
				for _, k := range c.absent {
					if _, ok := m[k]; ok {
						t.Errorf("%s: %s shown in %v", c.mv, k, m)
					}
				}
				if m["device"] != device || m["volumeId"] != vol {
					t.Errorf("%s: %v", c.mv, m)
				}
			}
		}
		if l := e.must(200, "GET", path+"?offset=1", e.demo, "2.96", "")["volumeAttachments"].([]any); len(l) != 0 {
			t.Errorf("offset=1: %v", l)
		}
		for mv, want := range map[string]string{"2.1": `[{"id":"` + vol + `"}]`, "2.3": `[{"id":"` + vol + `","delete_on_termination":true}]`} {
			got := e.env.server(e.server, e.demo, mv)["os-extended-volumes:volumes_attached"]
			if mustJSONText(got) != mustJSONText(jsonValue(t, want)) {
				t.Errorf("%s volumes_attached %v, want %s", mv, got, want)
			}
		}
		list := e.must(200, "GET", "/servers/detail", e.demo, "2.96", "")["servers"].([]any)
		for _, s := range list {
			if s := s.(map[string]any); s["id"] == e.server && len(s["os-extended-volumes:volumes_attached"].([]any)) != 1 {
				t.Errorf("list's volumes_attached %v", s["os-extended-volumes:volumes_attached"])
			}
		}

		// 2.85: delete_on_termination changes, the rest may be repeated.
		e.must(202, "PUT", path+"/"+vol, e.demo, "2.85", `{"volumeAttachment":{"volumeId":"`+vol+`","device":"`+device+`","delete_on_termination":false}}`)
		if show := e.must(200, "GET", path+"/"+vol, e.demo, "2.96", "")["volumeAttachment"].(map[string]any); show["delete_on_termination"] != false {
			t.Errorf("after update %v", show)
		}

		// Detach.
		e.must(202, "DELETE", path+"/"+vol, e.demo, "2.96", "")
		e.volumeStatus(vol, "available")
		testenv.Eventually(t, 10*time.Second, "disk unplugged", func() bool { return len(e.disks(e.server)) == 0 })
		e.waitAction(e.server, "detach_volume", "compute_detach_volume", "Success")
		if l := e.must(200, "GET", path, e.demo, "2.96", "")["volumeAttachments"].([]any); len(l) != 0 {
			t.Errorf("attachments after detach %v", l)
		}

		// A stopped server's VM takes it into its next start.
		e.action(e.server, e.demo, "2.96", `{"os-stop":null}`, 202)
		e.wait(e.server, e.demo, "SHUTOFF")
		e.attach(e.server, "2.96", `{"volumeAttachment":{"volumeId":"`+vol+`"}}`)
		e.volumeStatus(vol, "in-use")
		testenv.Eventually(t, 10*time.Second, "stopped server's disk", func() bool { return slices.Equal(e.disks(e.server), []string{vol}) })

		// Shelved offloaded: the attachment stays, unshelve's spawn has it.
		e.action(e.server, e.demo, "2.96", `{"shelve":null}`, 202)
		e.wait(e.server, e.demo, "SHELVED_OFFLOADED")
		vol2 := e.volume()
		e.attach(e.server, "2.96", `{"volumeAttachment":{"volumeId":"`+vol2+`","delete_on_termination":true}}`)
		e.volumeStatus(vol2, "in-use")
		e.action(e.server, e.demo, "2.96", `{"unshelve":null}`, 202)
		e.wait(e.server, e.demo, "ACTIVE")
		if got := e.disks(e.server); !slices.Equal(got, []string{vol, vol2}) {
			t.Errorf("unshelved server's disks %v, want %v", got, []string{vol, vol2})
		}

		// Delete: the volumes are detached, the one with
		// delete_on_termination deleted.
		e.must(204, "DELETE", "/servers/"+e.server, e.demo, "2.96", "")
		e.volumeStatus(vol, "available")
		e.volumeStatus(vol2, "deleted")
	})
}

// TestVolumeAttachDriverFailure: a hot-plug the driver refuses is undone
// (the volume available again, the action's event an Error); a detach the
// driver refuses leaves the volume attached.
func TestVolumeAttachDriverFailure(t *testing.T) {
	e := newVolEnv(t, "")
	vol := e.volume()
	for range 3 { // compute retries a driver call three times
		e.c.Fake.FailNext(fake.OpAttachVolume, errors.New("no free PCIe slot"))
	}
	e.attach(e.server, "2.96", `{"volumeAttachment":{"volumeId":"`+vol+`"}}`)
	e.waitAction(e.server, "attach_volume", "compute_attach_volume", "Error")
	e.volumeStatus(vol, "available")
	if d := e.disks(e.server); len(d) != 0 {
		t.Errorf("disks after a failed attach %v", d)
	}
	e.attach(e.server, "2.96", `{"volumeAttachment":{"volumeId":"`+vol+`"}}`)
	e.volumeStatus(vol, "in-use")
	for range 3 {
		e.c.Fake.FailNext(fake.OpDetachVolume, errors.New("the guest holds the disk"))
	}
	e.must(202, "DELETE", "/servers/"+e.server+"/os-volume_attachments/"+vol, e.demo, "2.96", "")
	e.waitAction(e.server, "detach_volume", "compute_detach_volume", "Error")
	e.volumeStatus(vol, "in-use")
	if d := e.disks(e.server); !slices.Equal(d, []string{vol}) {
		t.Errorf("disks after a failed detach %v", d)
	}
}

// TestVolumeAttachGophercloud drives the API with gophercloud's
// volumeattach, as Terraform's OpenStack provider does.
func TestVolumeAttachGophercloud(t *testing.T) {
	e := newVolEnv(t, "")
	ctx := context.Background()
	vol := e.volume()
	sc := testenv.Compute(t, testenv.Provider(t, e.c, cloud.DemoUser), "2.79")
	a, err := volumeattach.Create(ctx, sc, e.server, volumeattach.CreateOpts{VolumeID: vol, DeleteOnTermination: true}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	if a.VolumeID != vol || a.ServerID != e.server || a.Device == "" || a.DeleteOnTermination == nil || !*a.DeleteOnTermination {
		t.Errorf("created %+v", a)
	}
	e.volumeStatus(vol, "in-use")
	pages, err := volumeattach.List(sc, e.server).AllPages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	all, err := volumeattach.ExtractVolumeAttachments(pages)
	if err != nil || len(all) != 1 || all[0].VolumeID != vol {
		t.Errorf("list %+v %v", all, err)
	}
	if got, err := volumeattach.Get(ctx, sc, e.server, vol).Extract(); err != nil || got.Device != a.Device {
		t.Errorf("get %+v %v", got, err)
	}
	if err := volumeattach.Delete(ctx, sc, e.server, vol).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	e.volumeStatus(vol, "available")
}

// TestVolumeAttachBadRequests checks Nova's answers to requests refused
// before any attachment is looked at.
func TestVolumeAttachBadRequests(t *testing.T) {
	e := newVolEnv(t, "")
	vol := e.volume()
	shelved := e.create(e.demo, "2.96", "")
	e.wait(shelved, e.demo, "ACTIVE")
	e.action(shelved, e.demo, "2.96", `{"shelve":null}`, 202)
	e.wait(shelved, e.demo, "SHELVED_OFFLOADED")
	locked := e.create(e.demo, "2.96", "")
	e.wait(locked, e.demo, "ACTIVE")
	e.action(locked, e.demo, "2.96", `{"lock":null}`, 202)
	stopping := e.create(e.demo, "2.96", "")
	e.wait(stopping, e.demo, "ACTIVE")
	e.action(stopping, e.demo, "2.96", `{"suspend":null}`, 202)
	e.wait(stopping, e.demo, "SUSPENDED")
	const unknown = "8d3b7c9e-1111-4222-8333-944455556666"
	path := func(id string) string { return "/servers/" + id + "/os-volume_attachments" }
	body := func(inner string) string { return `{"volumeAttachment":{` + inner + `}}` }
	runVolumeCases(t, e, []volCase{
		{"no volumeId", e.demo, "POST", path(e.server), "2.96", body(`"device":"/dev/vdc"`), 400, "'volumeId' is a required property"},
		{"no volumeAttachment", e.demo, "POST", path(e.server), "2.96", `{}`, 400, "'volumeAttachment' is a required property"},
		{"volumeId not a uuid", e.demo, "POST", path(e.server), "2.96", body(`"volumeId":"x"`), 400, "'x' is not a 'uuid'"},
		{"bad device", e.demo, "POST", path(e.server), "2.96", body(`"volumeId":"` + vol + `","device":"vdb"`), 400, "does not match"},
		{"tag before 2.49", e.demo, "POST", path(e.server), "2.48", body(`"volumeId":"` + vol + `","tag":"t"`), 400, "Additional properties are not allowed"},
		{"bad tag", e.demo, "POST", path(e.server), "2.49", body(`"volumeId":"` + vol + `","tag":"a/b"`), 400, "does not match"},
		{"delete_on_termination before 2.79", e.demo, "POST", path(e.server), "2.78", body(`"volumeId":"` + vol + `","delete_on_termination":true`), 400, "Additional properties are not allowed"},
		{"bad delete_on_termination", e.demo, "POST", path(e.server), "2.79", body(`"volumeId":"` + vol + `","delete_on_termination":"maybe"`), 400, "is not one of"},
		{"unknown server", e.demo, "POST", path(unknown), "2.96", body(`"volumeId":"` + vol + `"`), 404, "Instance " + unknown + " could not be found."},
		{"another project's server", e.demo, "GET", path(e.create(e.admin, "2.96", "")), "2.96", "", 404, "could not be found."},
		{"device in use", e.demo, "POST", path(e.server), "2.96", body(`"volumeId":"` + vol + `","device":"/dev/vda"`), 409, "The supplied device path (/dev/vda) is in use."},
		{"shelved before 2.20", e.demo, "POST", path(shelved), "2.19", body(`"volumeId":"` + vol + `"`), 409, "Cannot 'attach_volume' instance " + shelved + " while it is in vm_state shelved_offloaded"},
		{"suspended", e.demo, "POST", path(stopping), "2.96", body(`"volumeId":"` + vol + `"`), 409, "Cannot 'attach_volume' instance " + stopping + " while it is in vm_state suspended"},
		{"locked", e.demo, "POST", path(locked), "2.96", body(`"volumeId":"` + vol + `"`), 409, "Instance " + locked + " is locked"},
		{"show not attached", e.demo, "GET", path(e.server) + "/" + vol, "2.96", "", 404, "Instance " + e.server + " is not attached to volume " + vol},
		{"detach not attached", e.demo, "DELETE", path(e.server) + "/" + vol, "2.96", "", 404, "is not attached to volume"},
		{"detach shelved before 2.20", e.demo, "DELETE", path(shelved) + "/" + vol, "2.19", "", 409, "Cannot 'detach_volume'"},
		{"list bad limit", e.demo, "GET", path(e.server) + "?limit=-1", "2.96", "", 400, "limit"},
		{"list unknown query", e.demo, "GET", path(e.server) + "?foo=1", "2.96", "", 400, "Additional properties are not allowed"},
		{"swap by a customer", e.demo, "PUT", path(e.server) + "/" + vol, "2.84", body(`"volumeId":"` + unknown + `"`), 403, "Policy doesn't allow os_compute_api:os-volumes-attachments:swap to be performed."},
		{"swap by a customer at 2.85", e.demo, "PUT", path(e.server) + "/" + vol, "2.96", body(`"volumeId":"` + unknown + `"`), 403, "os-volumes-attachments:swap"},
		{"update before 2.85 takes volumeId only", e.admin, "PUT", path(e.server) + "/" + vol, "2.84", body(`"volumeId":"` + vol + `","delete_on_termination":true`), 400, "Additional properties are not allowed"},
		{"update not attached", e.demo, "PUT", path(e.server) + "/" + vol, "2.96", body(`"volumeId":"` + vol + `"`), 404, "No volume Block Device Mapping with id " + vol + "."},
	})
}

// TestVolumeAttachErrors checks Nova's answers to what the volume's state
// refuses.
func TestVolumeAttachErrors(t *testing.T) {
	e := newVolEnv(t, "")
	vol := e.volume()
	attached := e.volume()
	e.attach(e.server, "2.96", `{"volumeAttachment":{"volumeId":"`+attached+`"}}`)
	e.volumeStatus(attached, "in-use")
	const unknown = "8d3b7c9e-1111-4222-8333-944455556666"
	path := func(id string) string { return "/servers/" + id + "/os-volume_attachments" }
	body := func(inner string) string { return `{"volumeAttachment":{` + inner + `}}` }
	runVolumeCases(t, e, []volCase{
		{"unknown volume", e.demo, "POST", path(e.server), "2.96", body(`"volumeId":"` + unknown + `"`), 404, "Volume " + unknown + " could not be found."},
		{"already attached", e.demo, "POST", path(e.server), "2.96", body(`"volumeId":"` + attached + `"`), 400, "Invalid volume"},
		{"update device", e.demo, "PUT", path(e.server) + "/" + attached, "2.96", body(`"volumeId":"` + attached + `","device":"/dev/vdz"`), 400, "The device property is not mutable"},
		{"update tag", e.demo, "PUT", path(e.server) + "/" + attached, "2.96", body(`"volumeId":"` + attached + `","tag":"x"`), 400, "The tag property is not mutable"},
		{"update serverId", e.demo, "PUT", path(e.server) + "/" + attached, "2.96", body(`"volumeId":"` + attached + `","serverId":"` + unknown + `"`), 400, "The serverId property is not mutable"},
		{"swap to an unknown volume", e.admin, "PUT", path(e.server) + "/" + attached, "2.96", body(`"volumeId":"` + unknown + `"`), 400, unknown},
		{"swap from an unknown volume", e.admin, "PUT", path(e.server) + "/" + unknown, "2.84", body(`"volumeId":"` + attached + `"`), 404, "Volume " + unknown + " could not be found."},
		{"swap from a volume not attached", e.admin, "PUT", path(e.server) + "/" + vol, "2.84", body(`"volumeId":"` + attached + `"`), 400, "Invalid volume: Old volume is attached to a different instance."},
	})
	e.volumeStatus(vol, "available")
	e.volumeStatus(attached, "in-use")
}

type volCase struct {
	name, tok, method, path, mv, body string
	status                            int
	msg                               string
}

func runVolumeCases(t *testing.T, e *volEnv, cases []volCase) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			st, m, _ := e.do(c.method, c.path, c.tok, c.mv, c.body)
			if st != c.status {
				t.Fatalf("status %d, want %d: %v", st, c.status, m)
			}
			if c.msg != "" && !strings.Contains(mustJSONText(m), c.msg) {
				t.Errorf("answer %v, want %q", m, c.msg)
			}
		})
	}
}

// mustJSONText is v as JSON text.
func mustJSONText(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// jsonValue decodes s.
func jsonValue(t *testing.T, s string) any {
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatal(err)
	}
	return v
}

// TestVolumeSwap: an admin's swap moves the server's disk onto the new
// volume (the driver copies the data, the new attachment takes the old
// one's device and delete_on_termination) and frees the old volume; a
// driver that fails rolls it back with the action's error; a smaller new
// volume is refused.
func TestVolumeSwap(t *testing.T) {
	e := newVolEnv(t, "")
	old, neu := e.volume(), e.volume()
	path := e.c.Volumes.DataPath
	att := e.attach(e.server, "2.96", `{"volumeAttachment":{"volumeId":"`+old+`","delete_on_termination":true}}`)
	e.volumeStatus(old, "in-use")
	if err := os.WriteFile(path(old), []byte("the old volume's data"), 0o600); err != nil {
		t.Fatal(err)
	}
	swap := func(from, to string) {
		t.Helper()
		e.must(202, "PUT", "/servers/"+e.server+"/os-volume_attachments/"+from, e.admin, "2.96", `{"volumeAttachment":{"volumeId":"`+to+`"}}`)
	}

	swap(old, neu)
	e.volumeStatus(old, "available")
	e.volumeStatus(neu, "in-use")
	e.waitAction(e.server, "swap_volume", "compute_swap_volume", "Success")
	atts := e.must(200, "GET", "/servers/"+e.server+"/os-volume_attachments", e.demo, "2.96", "")["volumeAttachments"].([]any)
	if len(atts) != 1 {
		t.Fatalf("attachments %v", atts)
	}
	a := atts[0].(map[string]any)
	if a["volumeId"] != neu || a["device"] != att["device"] || a["delete_on_termination"] != true {
		t.Errorf("after the swap: %v, want volume %s on %v with delete_on_termination", a, neu, att["device"])
	}
	if d := e.disks(e.server); len(d) != 1 || d[0] != neu {
		t.Errorf("the driver's disks %v, want [%s]", d, neu)
	}
	if b, err := os.ReadFile(path(neu)); err != nil || !bytes.HasPrefix(b, []byte("the old volume's data")) {
		t.Errorf("the new volume's data %.30q, %v", b, err)
	}

	for range 3 { // every try of the worker's
		e.c.Fake.FailNext(fake.OpSwapVolume, errors.New("mirror failed"))
	}
	swap(neu, old)
	e.waitAction(e.server, "swap_volume", "compute_swap_volume", "Error")
	e.volumeStatus(neu, "in-use")
	e.volumeStatus(old, "available")
	if d := e.disks(e.server); len(d) != 1 || d[0] != neu {
		t.Errorf("after a failed swap the driver's disks %v, want [%s]", d, neu)
	}

	big, err := volumes.Create(context.Background(), e.bs, volumes.CreateOpts{Size: 2}, nil).Extract()
	if err != nil {
		t.Fatal(err)
	}
	e.volumeStatus(big.ID, "available")
	swap(neu, big.ID)
	e.volumeStatus(big.ID, "in-use")
	e.volumeStatus(neu, "available")
	runVolumeCases(t, e, []volCase{
		{"swap to a smaller volume", e.admin, "PUT", "/servers/" + e.server + "/os-volume_attachments/" + big.ID, "2.96",
			`{"volumeAttachment":{"volumeId":"` + neu + `"}}`, 400, "New volume must be the same size or larger."},
		{"swap by a member", e.demo, "PUT", "/servers/" + e.server + "/os-volume_attachments/" + big.ID, "2.96",
			`{"volumeAttachment":{"volumeId":"` + old + `"}}`, 403, "os_compute_api:os-volumes-attachments:swap"},
	})
	e.volumeStatus(big.ID, "in-use")
	e.volumeStatus(neu, "available")
}

// TestVolumeExtended: the volume service's Extender call resizes the
// running server's disk and records extend_volume.
func TestVolumeExtended(t *testing.T) {
	e := newVolEnv(t, "")
	vol := e.volume()
	e.attach(e.server, "2.96", `{"volumeAttachment":{"volumeId":"`+vol+`"}}`)
	e.volumeStatus(vol, "in-use")
	testenv.Eventually(t, 10*time.Second, "disk plugged", func() bool { return len(e.disks(e.server)) == 1 })
	if err := e.c.Compute.VolumeExtended(context.Background(), e.server, vol, 2<<30); err != nil {
		t.Fatal(err)
	}
	sp, _ := e.c.Fake.Spec(e.server)
	if sp.Volumes[0].Conn.SizeBytes != 2<<30 {
		t.Errorf("driver's size %d", sp.Volumes[0].Conn.SizeBytes)
	}
	e.waitAction(e.server, "extend_volume", "compute_extend_volume", "Success")
}

// TestVolumeAttachResumesAfterRestart: an attach whose hot-plug a stopped
// controller cut short is finished at the next start.
func TestVolumeAttachResumesAfterRestart(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		dir := t.TempDir()
		at := func(delay time.Duration) testenv.Options {
			return func(cfg *cloud.Config) { cfg.DataDir = dir; cfg.FakeDelay = delay }
		}
		e := &volEnv{env: newEnv(t, dbURL, at(20*time.Millisecond))}
		e.server = e.create(e.demo, "2.96", "")
		e.wait(e.server, e.demo, "ACTIVE")
		var err error
		if e.bs, err = openstack.NewBlockStorageV3(testenv.Provider(t, e.c, cloud.DemoUser), gophercloud.EndpointOpts{Region: "RegionOne"}); err != nil {
			t.Fatal(err)
		}
		vol := e.volume()
		e.c.Close()

		// A hot-plug that takes a long time, cut short by a stop.
		slow := &volEnv{env: newEnv(t, dbURL, at(5*time.Second)), server: e.server}
		slow.attach(slow.server, "2.96", `{"volumeAttachment":{"volumeId":"`+vol+`"}}`)
		time.Sleep(100 * time.Millisecond)
		slow.c.Close()
		db, err := store.Open(context.Background(), dbURLOrFile(dbURL, dir))
		if err != nil {
			t.Fatal(err)
		}
		var doc string
		db.QueryRow(context.Background(), "SELECT doc FROM compute_servers WHERE id = ?", e.server).Scan(&doc)
		db.Close()
		if !strings.Contains(doc, `"volume_ops":[`) {
			t.Fatalf("no volume op at restart; the test needs an unfinished attach: %s", doc)
		}

		e2 := &volEnv{env: newEnv(t, dbURL, at(20*time.Millisecond)), server: e.server}
		if e2.bs, err = openstack.NewBlockStorageV3(testenv.Provider(t, e2.c, cloud.DemoUser), gophercloud.EndpointOpts{Region: "RegionOne"}); err != nil {
			t.Fatal(err)
		}
		e2.volumeStatus(vol, "in-use")
		testenv.Eventually(t, 10*time.Second, "disk plugged after restart", func() bool { return slices.Equal(e2.disks(e2.server), []string{vol}) })
		e2.waitAction(e2.server, "attach_volume", "compute_attach_volume", "Success")
	})
}
