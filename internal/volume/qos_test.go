package volume_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/qos"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/volumes"
	"github.com/gophercloud/gophercloud/v2/pagination"

	"nimbus/internal/store"
	"nimbus/internal/testenv"
	"nimbus/internal/volume"
)

func TestQoS(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		t.Run("NetworkDefault", e.testQoSNetworkDefault)
		t.Run("API", e.testQoSAPI)
		t.Run("Retype", e.testRetype)
		t.Run("Readonly", e.testReadonly)
	})
}

// specByName finds a QoS spec in the admin's list.
func (e *env) qosSpecByName(t *testing.T, name string) map[string]any {
	t.Helper()
	m := e.want(t, 200, "GET", "/v3/qos-specs?name="+name, e.adTok, "")
	list := m["qos_specs"].([]any)
	if len(list) != 1 {
		t.Fatalf("qos spec %s: %v", name, m)
	}
	return list[0].(map[string]any)
}

func (e *env) qosVolume(t *testing.T, typ string) string {
	t.Helper()
	v, err := volumes.Create(context.Background(), e.demo, volumes.CreateOpts{Size: 1, VolumeType: typ}, nil).Extract()
	if err != nil {
		t.Fatal(err)
	}
	waitStatus(t, e.demo, v.ID, "available")
	return v.ID
}

// The network type gets its 70,000/60,000 IOPS spec at bootstrap, once: a
// later bootstrap leaves the operator's choice alone.
func (e *env) testQoSNetworkDefault(t *testing.T) {
	ctx := context.Background()
	spec := e.qosSpecByName(t, "network")
	if spec["consumer"] != "front-end" {
		t.Errorf("network spec: %v", spec)
	}
	if sp := spec["specs"].(map[string]any); sp["read_iops_sec"] != "70000" || sp["write_iops_sec"] != "60000" || len(sp) != 2 {
		t.Errorf("network spec keys: %v", sp)
	}
	ty := e.want(t, 200, "GET", "/v3/types/default", e.adTok, "")["volume_type"].(map[string]any)
	if ty["qos_specs_id"] != spec["id"] {
		t.Errorf("default type's qos_specs_id %v, want %v", ty["qos_specs_id"], spec["id"])
	}
	// A member sees no qos_specs_id, as Cinder's view.
	if _, ok := e.want(t, 200, "GET", "/v3/types/default", e.demoTok, "")["volume_type"].(map[string]any)["qos_specs_id"]; ok {
		t.Error("member sees qos_specs_id")
	}

	id := e.qosVolume(t, "")
	got, err := e.c.Volumes.QoS(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if want := (volume.Throttle{ReadIOPS: volume.Rate{Avg: 70000}, WriteIOPS: volume.Rate{Avg: 60000}}); got != want {
		t.Errorf("QoS of a network volume: %+v, want %+v", got, want)
	}
	if _, err := e.c.Volumes.QoS(ctx, "6a1b6a2a-3d3e-4b7e-9e43-5c4d4f8f0a11"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("QoS of no volume: %v", err)
	}

	sid := spec["id"].(string)
	e.want(t, 202, "GET", "/v3/qos-specs/"+sid+"/disassociate_all", e.adTok, "")
	if err := e.c.Volumes.Bootstrap(ctx); err != nil {
		t.Fatal(err)
	}
	if got, _ := e.c.Volumes.QoS(ctx, id); !got.IsZero() {
		t.Errorf("bootstrap re-associated the spec: %+v", got)
	}
	// A cloud upgraded to QoS whose operator already made a spec named
	// network keeps it, and starts.
	if err := e.c.DB.Tx(ctx, func(tx *store.Tx) error {
		_, err := tx.Exec(ctx, "DELETE FROM volume_settings")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if err := e.c.Volumes.Bootstrap(ctx); err != nil {
		t.Fatalf("bootstrap beside an operator's network spec: %v", err)
	}
	if got, _ := e.c.Volumes.QoS(ctx, id); !got.IsZero() || e.qosSpecByName(t, "network")["id"] != sid {
		t.Errorf("bootstrap replaced the operator's spec: %+v", got)
	}
	e.want(t, 202, "GET", "/v3/qos-specs/"+sid+"/associate?vol_type_id="+ty["id"].(string), e.adTok, "")
	if got, _ := e.c.Volumes.QoS(ctx, id); got.ReadIOPS.Avg != 70000 {
		t.Errorf("after re-associating: %+v", got)
	}
	e.qosDropVolume(t, id)
}

func (e *env) qosDropVolume(t *testing.T, id string) {
	t.Helper()
	if err := volumes.Delete(context.Background(), e.demo, id, volumes.DeleteOpts{}).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	waitGone(t, e.demo, id)
}

func (e *env) testQoSAPI(t *testing.T) {
	ctx := context.Background()
	// gophercloud's client: create with the specs flat beside name and consumer.
	created, err := qos.Create(ctx, e.admin, qos.CreateOpts{Name: "gold", Consumer: qos.ConsumerBoth,
		Specs: map[string]string{"total_iops_sec": "2000", "total_iops_sec_max": "4000", "total_iops_sec_max_length": "10"}}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	if created.Name != "gold" || created.Consumer != "both" || created.Specs["total_iops_sec_max"] != "4000" {
		t.Errorf("created: %+v", created)
	}
	gold := created.ID
	ty := e.want(t, 200, "POST", "/v3/types", e.adTok, `{"volume_type":{"name":"qos-gold"}}`)["volume_type"].(map[string]any)["id"].(string)
	ty2 := e.want(t, 200, "POST", "/v3/types", e.adTok, `{"volume_type":{"name":"qos-plain"}}`)["volume_type"].(map[string]any)["id"].(string)
	const missing = "6a1b6a2a-3d3e-4b7e-9e43-5c4d4f8f0a11"
	base := "/v3/qos-specs/" + gold

	for _, c := range []struct {
		name, method, path, body string
		tok                      string
		status                   int
		msg                      string
	}{
		// Cinder's policy: every qos-specs call is an admin's.
		{"member list", "GET", "/v3/qos-specs", "", e.demoTok, 403, "Policy doesn't allow volume_extension:qos_specs_manage:get_all to be performed."},
		{"member create", "POST", "/v3/qos-specs", `{"qos_specs":{"name":"x"}}`, e.demoTok, 403, ""},
		{"member show", "GET", base, "", e.demoTok, 403, ""},
		{"member update", "PUT", base, `{"qos_specs":{"read_iops_sec":"1"}}`, e.demoTok, 403, ""},
		{"member delete", "DELETE", base, "", e.demoTok, 403, ""},
		{"member delete_keys", "PUT", base + "/delete_keys", `{"keys":["total_iops_sec"]}`, e.demoTok, 403, ""},
		{"member associate", "GET", base + "/associate?vol_type_id=" + ty, "", e.demoTok, 403, ""},
		{"member associations", "GET", base + "/associations", "", e.demoTok, 403, ""},

		{"duplicate name", "POST", "/v3/qos-specs", `{"qos_specs":{"name":"gold"}}`, e.adTok, 409, "QoS Specs gold already exists."},
		{"no name", "POST", "/v3/qos-specs", `{"qos_specs":{"read_iops_sec":"5"}}`, e.adTok, 400, ""},
		{"blank name", "POST", "/v3/qos-specs", `{"qos_specs":{"name":"  "}}`, e.adTok, 400, ""},
		{"long key", "POST", "/v3/qos-specs", `{"qos_specs":{"name":"a","` + strings.Repeat("k", 256) + `":"5"}}`, e.adTok, 400, ""},
		{"zero value", "POST", "/v3/qos-specs", `{"qos_specs":{"name":"a","read_iops_sec":"0"}}`, e.adTok, 400, "Invalid qos specs: read_iops_sec must be a positive integer of at most 1000000000000000, not '0'."},
		{"not a number", "POST", "/v3/qos-specs", `{"qos_specs":{"name":"a","read_bytes_sec":"fast"}}`, e.adTok, 400, ""},
		{"float", "POST", "/v3/qos-specs", `{"qos_specs":{"name":"a","read_bytes_sec":1.5}}`, e.adTok, 400, ""},
		{"bad consumer", "POST", "/v3/qos-specs", `{"qos_specs":{"name":"a","consumer":"guest"}}`, e.adTok, 400, "Invalid qos specs: Valid consumer of QoS specs are: ['front-end', 'back-end', 'both']"},
		{"total with read", "POST", "/v3/qos-specs", `{"qos_specs":{"name":"a","total_iops_sec":"5","read_iops_sec":"5"}}`, e.adTok, 400, ""},
		{"max without avg", "POST", "/v3/qos-specs", `{"qos_specs":{"name":"a","read_iops_sec_max":"5"}}`, e.adTok, 400, ""},
		{"max below avg", "POST", "/v3/qos-specs", `{"qos_specs":{"name":"a","read_iops_sec":"9","read_iops_sec_max":"5"}}`, e.adTok, 400, ""},
		{"extra top-level key", "POST", "/v3/qos-specs", `{"qos_specs":{"name":"a"},"x":1}`, e.adTok, 400, ""},
		{"show missing", "GET", "/v3/qos-specs/" + missing, "", e.adTok, 404, "No such QoS spec " + missing + "."},
		{"update missing", "PUT", "/v3/qos-specs/" + missing, `{"qos_specs":{"read_iops_sec":"1"}}`, e.adTok, 404, ""},
		// The merged spec must still be valid: read beside total is not.
		{"update conflicting", "PUT", base, `{"qos_specs":{"read_iops_sec":"1"}}`, e.adTok, 400, ""},
		{"delete_keys unknown", "PUT", base + "/delete_keys", `{"keys":["read_iops_sec"]}`, e.adTok, 404, "QoS spec " + gold + " has no spec with key read_iops_sec."},
		// Deleting the rate leaves its burst without one.
		{"delete_keys leaving burst", "PUT", base + "/delete_keys", `{"keys":["total_iops_sec"]}`, e.adTok, 400, ""},
		{"delete_keys no list", "PUT", base + "/delete_keys", `{"keys":"total_iops_sec"}`, e.adTok, 400, ""},
		{"associate without type", "GET", base + "/associate", "", e.adTok, 400, "Volume Type id must not be None."},
		{"associate unknown type", "GET", base + "/associate?vol_type_id=" + missing, "", e.adTok, 404, ""},
		{"associate unknown spec", "GET", "/v3/qos-specs/" + missing + "/associate?vol_type_id=" + ty, "", e.adTok, 404, ""},
		{"delete bad force", "DELETE", base + "?force=maybe", "", e.adTok, 400, ""},
		{"list bad sort", "GET", "/v3/qos-specs?sort=color", "", e.adTok, 400, ""},
		{"list bad marker", "GET", "/v3/qos-specs?marker=" + missing, "", e.adTok, 404, ""},
	} {
		resp, m := e.do(t, c.method, c.path, c.tok, c.body)
		if resp.StatusCode != c.status {
			t.Errorf("%s: status %d, want %d: %v", c.name, resp.StatusCode, c.status, m)
			continue
		}
		if c.msg != "" && qosFault(m) != c.msg {
			t.Errorf("%s: message %q, want %q", c.name, qosFault(m), c.msg)
		}
	}

	// Update answers the body; the spec keeps the other keys.
	m := e.want(t, 200, "PUT", base, e.adTok, `{"qos_specs":{"total_iops_sec":3000,"consumer":"front-end"}}`)
	if m["qos_specs"].(map[string]any)["total_iops_sec"] != float64(3000) {
		t.Errorf("update answer: %v", m)
	}
	got, err := qos.Get(ctx, e.admin, gold).Extract()
	if err != nil {
		t.Fatal(err)
	}
	if got.Consumer != "front-end" || got.Specs["total_iops_sec"] != "3000" || got.Specs["total_iops_sec_max"] != "4000" {
		t.Errorf("after update: %+v", got)
	}
	// Any other key is kept, as Cinder keeps back-end drivers' keys (Tempest
	// sets one of its own), and enforced by nothing.
	m = e.want(t, 200, "PUT", base, e.adTok, `{"qos_specs":{"iops_bytes":"500"}}`)
	if got, _ = qos.Get(ctx, e.admin, gold).Extract(); got.Specs["iops_bytes"] != "500" || m["qos_specs"].(map[string]any)["iops_bytes"] != "500" {
		t.Errorf("free key: %+v %v", got.Specs, m)
	}
	if err := qos.DeleteKeys(ctx, e.admin, gold, qos.DeleteKeysOpts{"iops_bytes", "total_iops_sec_max_length"}).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	if got, _ = qos.Get(ctx, e.admin, gold).Extract(); len(got.Specs) != 2 {
		t.Errorf("after delete_keys: %+v", got.Specs)
	}

	// Associations: one spec per type; associating again is a no-op.
	if err := qos.Associate(ctx, e.admin, gold, qos.AssociateOpts{VolumeTypeID: ty}).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	e.want(t, 202, "GET", base+"/associate?vol_type_id="+ty, e.adTok, "")
	e.want(t, 202, "GET", base+"/associate?vol_type_id="+ty2, e.adTok, "")
	// Cinder's associate takes a type id, not a name.
	e.want(t, 404, "GET", base+"/associate?vol_type_id=qos-plain", e.adTok, "")
	m = e.want(t, 200, "GET", base+"/associations", e.adTok, "")
	if as := m["qos_associations"].([]any); len(as) != 2 || as[0].(map[string]any)["association_type"] != "volume_type" {
		t.Errorf("associations: %v", m)
	}
	other := e.want(t, 200, "POST", "/v3/qos-specs", e.adTok, `{"qos_specs":{"name":"silver","write_bytes_sec":"1048576"}}`)
	silver := other["qos_specs"].(map[string]any)["id"].(string)
	if other["qos_specs"].(map[string]any)["consumer"] != "back-end" || other["links"] == nil {
		t.Errorf("default consumer and links: %v", other)
	}
	m = e.want(t, 400, "GET", "/v3/qos-specs/"+silver+"/associate?vol_type_id="+ty, e.adTok, "")
	if qosFault(m) != "Invalid volume type: Type "+ty+" is already associated with another qos specs: "+gold {
		t.Errorf("second spec on a type: %v", m)
	}
	e.want(t, 202, "GET", base+"/disassociate?vol_type_id="+ty2, e.adTok, "")
	m = e.want(t, 200, "GET", base+"/associations", e.adTok, "")
	if as := m["qos_associations"].([]any); len(as) != 1 || as[0].(map[string]any)["id"] != ty {
		t.Errorf("after disassociate: %v", m)
	}

	// Listing: filters, sort and paging through qos_specs_links.
	var names []string
	err = qos.List(e.admin, qos.ListOpts{Limit: 1, Sort: "name:asc"}).EachPage(ctx, func(_ context.Context, p pagination.Page) (bool, error) {
		qs, err := qos.ExtractQoS(p)
		for _, q := range qs {
			names = append(names, q.Name)
		}
		return true, err
	})
	if err != nil || strings.Join(names, ",") != "gold,network,silver" {
		t.Errorf("paged list: %v %v", names, err)
	}
	if m := e.want(t, 200, "GET", "/v3/qos-specs?consumer=back-end", e.adTok, ""); len(m["qos_specs"].([]any)) != 1 {
		t.Errorf("consumer filter: %v", m)
	}

	// Delete: refused while a type uses it, unless forced.
	m = e.want(t, 400, "DELETE", base, e.adTok, "")
	if qosFault(m) != "Qos specs still in use." {
		t.Errorf("delete in use: %v", m)
	}
	if err := qos.Delete(ctx, e.admin, gold, qos.DeleteOpts{Force: true}).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	e.want(t, 404, "GET", base, e.adTok, "")
	if tv := e.want(t, 200, "GET", "/v3/types/"+ty, e.adTok, "")["volume_type"].(map[string]any); tv["qos_specs_id"] != nil {
		t.Errorf("type still refers to the deleted spec: %v", tv)
	}
	e.want(t, 202, "DELETE", "/v3/qos-specs/"+silver, e.adTok, "")
	e.want(t, 202, "DELETE", "/v3/types/"+ty, e.adTok, "")
	e.want(t, 202, "DELETE", "/v3/types/"+ty2, e.adTok, "")
}

// faultMessage is the message of an error body ({"badRequest": {...}}).
func qosFault(m map[string]any) string {
	for _, v := range m {
		if f, ok := v.(map[string]any); ok {
			s, _ := f["message"].(string)
			return s
		}
	}
	return ""
}

// Retype moves a volume to another type of the same back end: the type and
// the QoS change, the per-type quotas follow.
func (e *env) testRetype(t *testing.T) {
	ctx := context.Background()
	spec := e.want(t, 200, "POST", "/v3/qos-specs", e.adTok,
		`{"qos_specs":{"name":"bronze","consumer":"front-end","total_iops_sec":"500","total_iops_sec_max":"1000","total_iops_sec_max_length":"5","read_bytes_sec":"10485760","write_bytes_sec":"5242880","vendor:tier":"x"}}`)
	sid := spec["qos_specs"].(map[string]any)["id"].(string)
	bronze := e.want(t, 200, "POST", "/v3/types", e.adTok, `{"volume_type":{"name":"bronze"}}`)["volume_type"].(map[string]any)["id"].(string)
	e.want(t, 202, "GET", "/v3/qos-specs/"+sid+"/associate?vol_type_id="+bronze, e.adTok, "")
	private := e.want(t, 200, "POST", "/v3/types", e.adTok, `{"volume_type":{"name":"hidden","is_public":false}}`)["volume_type"].(map[string]any)["id"].(string)

	id := e.qosVolume(t, "")
	path := "/v3/volumes/" + id + "/action"
	for _, c := range []struct {
		name, body string
		status     int
		msg        string
	}{
		{"unknown type", `{"os-retype":{"new_type":"nope"}}`, 404, "Volume type with name nope could not be found."},
		{"private type", `{"os-retype":{"new_type":"hidden"}}`, 404, ""},
		{"same type", `{"os-retype":{"new_type":"network"}}`, 400, "Invalid input received: New volume_type same as original: network."},
		{"no type", `{"os-retype":{}}`, 400, ""},
		{"bad policy", `{"os-retype":{"new_type":"bronze","migration_policy":"always"}}`, 400, ""},
		{"extra key", `{"os-retype":{"new_type":"bronze","x":1}}`, 400, ""},
	} {
		resp, m := e.do(t, "POST", path, e.demoTok, c.body)
		if resp.StatusCode != c.status || (c.msg != "" && qosFault(m) != c.msg) {
			t.Errorf("%s: %d %v, want %d %q", c.name, resp.StatusCode, m, c.status, c.msg)
		}
	}

	// The per-type volume quota of the new type is checked.
	e.want(t, 200, "PUT", "/v3/os-quota-sets/"+e.demoProj, e.adTok, `{"quota_set":{"volumes_bronze":0}}`)
	m := e.want(t, 413, "POST", path, e.demoTok, `{"os-retype":{"new_type":"bronze"}}`)
	if qosFault(m) != "Maximum number of volumes allowed (0) exceeded for quota 'volumes_bronze'." {
		t.Errorf("per-type quota: %v", m)
	}
	e.want(t, 200, "PUT", "/v3/os-quota-sets/"+e.demoProj, e.adTok, `{"quota_set":{"volumes_bronze":1,"gigabytes_bronze":1}}`)
	// ... and so is it on create.
	m = e.want(t, 413, "POST", "/v3/"+e.demoProj+"/volumes", e.demoTok, `{"volume":{"size":2,"volume_type":"bronze"}}`)
	if qosFault(m) != "Requested volume or snapshot exceeds allowed gigabytes_bronze quota. Requested 2G, quota is 1G and 0G has been consumed." {
		t.Errorf("per-type quota on create: %v", m)
	}

	if err := volumes.ChangeType(ctx, e.demo, id, volumes.ChangeTypeOpts{NewType: "bronze", MigrationPolicy: volumes.MigrationPolicyNever}).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	v := waitStatus(t, e.demo, id, "available")
	if v.VolumeType != "bronze" {
		t.Errorf("after retype the type is %q", v.VolumeType)
	}
	got, err := e.c.Volumes.QoS(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	want := volume.Throttle{TotalIOPS: volume.Rate{Avg: 500, Max: 1000, MaxLength: 5}, ReadBytes: volume.Rate{Avg: 10485760}, WriteBytes: volume.Rate{Avg: 5242880}}
	if got != want {
		t.Errorf("QoS after retype: %+v, want %+v", got, want)
	}
	// bronze is now full: a second volume cannot join it.
	id2 := e.qosVolume(t, "")
	e.want(t, 413, "POST", "/v3/volumes/"+id2+"/action", e.demoTok, `{"os-retype":{"new_type":"bronze"}}`)

	// Back to network by id; a volume that is not available stays put.
	network := e.want(t, 200, "GET", "/v3/types/default", e.demoTok, "")["volume_type"].(map[string]any)["id"].(string)
	e.want(t, 202, "POST", path, e.demoTok, `{"os-retype":{"new_type":"`+network+`"}}`)
	if got, _ := e.c.Volumes.QoS(ctx, id); got.ReadIOPS.Avg != 70000 || got.TotalIOPS.Avg != 0 {
		t.Errorf("QoS after retype back: %+v", got)
	}
	e.want(t, 202, "POST", "/v3/volumes/"+id2+"/action", e.adTok, `{"os-reset_status":{"status":"error"}}`)
	e.want(t, 400, "POST", "/v3/volumes/"+id2+"/action", e.demoTok, `{"os-retype":{"new_type":"bronze"}}`)

	e.qosDropVolume(t, id)
	e.qosDropVolume(t, id2)
	e.want(t, 202, "DELETE", "/v3/qos-specs/"+sid+"?force=true", e.adTok, "")
	e.want(t, 202, "DELETE", "/v3/types/"+bronze, e.adTok, "")
	e.want(t, 202, "DELETE", "/v3/types/"+private, e.adTok, "")
	if got, err := e.c.Volumes.QoS(ctx, id); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("QoS of a deleted volume: %+v %v", got, err)
	}
}

// The read-only flag is kept apart from the owner's metadata and shown in
// it as Cinder does.
func (e *env) testReadonly(t *testing.T) {
	ctx := context.Background()
	id := e.qosVolume(t, "")
	path := "/v3/volumes/" + id + "/action"
	e.want(t, 200, "PUT", "/v3/volumes/"+id+"/metadata", e.demoTok, `{"metadata":{"owner":"me"}}`)
	for _, c := range []struct {
		body string
		want string
	}{
		{`{"os-update_readonly_flag":{"readonly":true}}`, "True"},
		{`{"os-update_readonly_flag":{"readonly":"false"}}`, "False"},
		{`{"os-update_readonly_flag":{"readonly":"yes"}}`, "True"},
	} {
		e.want(t, 202, "POST", path, e.demoTok, c.body)
		v, err := volumes.Get(ctx, e.demo, id).Extract()
		if err != nil {
			t.Fatal(err)
		}
		if v.Metadata["readonly"] != c.want || v.Metadata["owner"] != "me" {
			t.Errorf("%s: metadata %v", c.body, v.Metadata)
		}
		ro, err := e.c.Volumes.ReadOnly(ctx, id)
		if err != nil || ro != (c.want == "True") {
			t.Errorf("%s: ReadOnly() %v %v", c.body, ro, err)
		}
	}
	// The owner's metadata API does not hold it, and replacing the
	// owner's metadata does not clear it.
	if m := e.want(t, 200, "GET", "/v3/volumes/"+id+"/metadata", e.demoTok, ""); m["metadata"].(map[string]any)["readonly"] != nil {
		t.Errorf("metadata API shows readonly: %v", m)
	}
	e.want(t, 200, "PUT", "/v3/volumes/"+id+"/metadata", e.demoTok, `{"metadata":{"readonly":"False"}}`)
	if ro, _ := e.c.Volumes.ReadOnly(ctx, id); !ro {
		t.Error("the owner's metadata overwrote the flag")
	}
	for _, body := range []string{`{"os-update_readonly_flag":{}}`, `{"os-update_readonly_flag":{"readonly":"maybe"}}`,
		`{"os-update_readonly_flag":{"readonly":true,"x":1}}`} {
		e.want(t, 400, "POST", path, e.demoTok, body)
	}
	e.want(t, 202, "POST", path, e.adTok, `{"os-reset_status":{"status":"error"}}`)
	m := e.want(t, 400, "POST", path, e.demoTok, `{"os-update_readonly_flag":{"readonly":true}}`)
	if qosFault(m) != "Invalid volume: Volume "+id+" status must be available to update readonly flag, but current status is: error." {
		t.Errorf("readonly in error: %v", m)
	}
	e.qosDropVolume(t, id)
}
