package compute_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/aggregates"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/availabilityzones"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/services"

	"nimbus/internal/cloud"
	"nimbus/internal/testenv"
)

// aggCreate creates an aggregate and returns its id.
func aggCreate(e *rsEnv, mv, body string) string {
	e.t.Helper()
	a := rsObj(e.must(200, "POST", "/os-aggregates", e.admin, mv, body), "aggregate")
	return fmt.Sprint(a["id"])
}

func aggAction(e *rsEnv, id, body string) map[string]any {
	e.t.Helper()
	return rsObj(e.must(200, "POST", "/os-aggregates/"+id+"/action", e.admin, "", body), "aggregate")
}

// azZones lists os-availability-zone(/detail) as zone name → entry, in
// order.
func azZones(e *rsEnv, detail bool) ([]string, map[string]map[string]any) {
	e.t.Helper()
	path, tok := "/os-availability-zone", e.demo
	if detail {
		path, tok = "/os-availability-zone/detail", e.admin
	}
	var names []string
	out := map[string]map[string]any{}
	for _, z := range rsList(e.must(200, "GET", path, tok, "", ""), "availabilityZoneInfo") {
		m := z.(map[string]any)
		names = append(names, m["zoneName"].(string))
		out[m["zoneName"].(string)] = m
	}
	return names, out
}

func TestAggregateViewsAndErrors(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := rsStart(t, dbURL)
		created := rsObj(e.must(200, "POST", "/os-aggregates", e.admin, "", `{"aggregate":{"name":"a1"}}`), "aggregate")
		rsWantKeys(t, "create at 2.1", created, "id", "name", "availability_zone", "created_at", "updated_at", "deleted", "deleted_at")
		if created["availability_zone"] != nil || created["updated_at"] != nil || created["deleted"] != false || created["deleted_at"] != nil {
			t.Errorf("created %v", created)
		}
		if _, err := time.Parse("2006-01-02T15:04:05.000000", created["created_at"].(string)); err != nil {
			t.Errorf("created_at %v: %v", created["created_at"], err)
		}
		id := fmt.Sprint(created["id"])
		ctrl := rsList(e.must(200, "GET", "/os-services?binary=nova-scheduler", e.admin, "", ""), "services")[0].(map[string]any)["host"].(string)
		a := rsObj(e.must(200, "GET", "/os-aggregates/"+id, e.admin, "", ""), "aggregate")
		rsWantKeys(t, "show at 2.1", a, "id", "name", "availability_zone", "created_at", "updated_at", "deleted", "deleted_at", "hosts", "metadata")
		if len(rsList(a, "hosts")) != 0 || a["hosts"] == nil || len(rsObj(a, "metadata")) != 0 {
			t.Errorf("show %v", a)
		}
		a41 := rsObj(e.must(200, "GET", "/os-aggregates/"+id, e.admin, "2.41", ""), "aggregate")
		if u, _ := a41["uuid"].(string); len(u) != 36 {
			t.Errorf("uuid at 2.41: %v", a41)
		}
		withZone := rsObj(e.must(200, "POST", "/os-aggregates", e.admin, "2.41", `{"aggregate":{"name":"a2","availability_zone":"az2"}}`), "aggregate")
		rsWantKeys(t, "create at 2.41", withZone, "id", "name", "availability_zone", "created_at", "updated_at", "deleted", "deleted_at", "uuid")
		if withZone["availability_zone"] != "az2" {
			t.Errorf("created with a zone %v", withZone)
		}
		// The zone is the aggregate's availability_zone metadata.
		shown := rsObj(e.must(200, "GET", "/os-aggregates/"+fmt.Sprint(withZone["id"]), e.admin, "", ""), "aggregate")
		if rsObj(shown, "metadata")["availability_zone"] != "az2" {
			t.Errorf("metadata %v", shown)
		}
		list := rsList(e.must(200, "GET", "/os-aggregates", e.admin, "", ""), "aggregates")
		if len(list) != 2 || list[0].(map[string]any)["name"] != "a1" || list[1].(map[string]any)["availability_zone"] != "az2" {
			t.Errorf("list %v", list)
		}

		// Policy: admin only, naming the rule.
		for _, c := range []struct{ method, path, body, rule string }{
			{"GET", "/os-aggregates", "", "os_compute_api:os-aggregates:index"},
			{"POST", "/os-aggregates", `{"aggregate":{"name":"x"}}`, "os_compute_api:os-aggregates:create"},
			{"GET", "/os-aggregates/" + id, "", "os_compute_api:os-aggregates:show"},
			{"PUT", "/os-aggregates/" + id, `{"aggregate":{"name":"x"}}`, "os_compute_api:os-aggregates:update"},
			{"DELETE", "/os-aggregates/" + id, "", "os_compute_api:os-aggregates:delete"},
			{"POST", "/os-aggregates/" + id + "/action", `{"add_host":{"host":"fake-host-1"}}`, "os_compute_api:os-aggregates:add_host"},
			{"POST", "/os-aggregates/" + id + "/action", `{"remove_host":{"host":"fake-host-1"}}`, "os_compute_api:os-aggregates:remove_host"},
			{"POST", "/os-aggregates/" + id + "/action", `{"set_metadata":{"metadata":{}}}`, "os_compute_api:os-aggregates:set_metadata"},
		} {
			e.fault(403, "Policy doesn't allow "+c.rule+" to be performed.", c.method, c.path, e.demo, "", c.body)
		}

		tests := []struct {
			name, method, path, body string
			status                   int
			msg                      string
		}{
			{"duplicate name", "POST", "/os-aggregates", `{"aggregate":{"name":"a1"}}`, 409, "Aggregate a1 already exists."},
			{"no name", "POST", "/os-aggregates", `{"aggregate":{"availability_zone":"z"}}`, 400, "'name' is a required property"},
			{"empty name", "POST", "/os-aggregates", `{"aggregate":{"name":""}}`, 400, "'' is too short"},
			{"long name", "POST", "/os-aggregates", `{"aggregate":{"name":"` + string(make256('n')) + `"}}`, 400, "is too long"},
			{"spaced name", "POST", "/os-aggregates", `{"aggregate":{"name":" a"}}`, 400, "field/attribute name"},
			{"zone with colon", "POST", "/os-aggregates", `{"aggregate":{"name":"b","availability_zone":"a:b"}}`, 400, "field/attribute availability_zone"},
			{"extra key", "POST", "/os-aggregates", `{"aggregate":{"name":"b","hosts":[]}}`, 400, "Additional properties are not allowed ('hosts' was unexpected)"},
			{"id not a number", "GET", "/os-aggregates/abc", "", 400, "Invalid input received: id must be an integer"},
			{"unknown id", "GET", "/os-aggregates/999", "", 404, "Aggregate 999 could not be found."},
			{"delete unknown", "DELETE", "/os-aggregates/999", "", 404, "Aggregate 999 could not be found."},
			{"update unknown", "PUT", "/os-aggregates/999", `{"aggregate":{"name":"z"}}`, 404, "Aggregate 999 could not be found."},
			{"update nothing", "PUT", "/os-aggregates/" + id, `{"aggregate":{}}`, 400, "is not valid under any of the given schemas"},
			{"update taken name", "PUT", "/os-aggregates/" + id, `{"aggregate":{"name":"a2"}}`, 409, "Aggregate a2 already exists."},
			{"update zone to null", "PUT", "/os-aggregates/" + id, `{"aggregate":{"availability_zone":null}}`, 400,
				"Cannot update aggregate " + id + ". Reason: Aggregate a1 does not support empty named availability zone."},
			{"unknown action", "POST", "/os-aggregates/" + id + "/action", `{"fly":{}}`, 400, "There is no such action: fly"},
			{"two actions", "POST", "/os-aggregates/" + id + "/action", `{"add_host":{"host":"fake-host-1"},"remove_host":{"host":"fake-host-1"}}`, 400,
				"Malformed request body: too many body keys"},
			{"add unknown host", "POST", "/os-aggregates/" + id + "/action", `{"add_host":{"host":"nope"}}`, 404, "Compute host nope could not be found."},
			{"add the controller", "POST", "/os-aggregates/" + id + "/action", `{"add_host":{"host":"` + ctrl + `"}}`, 404, "could not be found."},
			{"add to unknown aggregate", "POST", "/os-aggregates/999/action", `{"add_host":{"host":"fake-host-1"}}`, 404, "Aggregate 999 could not be found."},
			{"add bad host name", "POST", "/os-aggregates/" + id + "/action", `{"add_host":{"host":"a b"}}`, 400, "'a b' does not match"},
			{"add without host", "POST", "/os-aggregates/" + id + "/action", `{"add_host":{}}`, 400, "'host' is a required property"},
			{"remove absent host", "POST", "/os-aggregates/" + id + "/action", `{"remove_host":{"host":"fake-host-1"}}`, 404,
				"Cannot remove host fake-host-1 in aggregate " + id},
			{"remove unknown host", "POST", "/os-aggregates/" + id + "/action", `{"remove_host":{"host":"nope"}}`, 404, "Cannot remove host nope in aggregate " + id},
			{"metadata bad key", "POST", "/os-aggregates/" + id + "/action", `{"set_metadata":{"metadata":{"a/b":"c"}}}`, 400, "('a/b' was unexpected)"},
			{"metadata bad value", "POST", "/os-aggregates/" + id + "/action", `{"set_metadata":{"metadata":{"k":1}}}`, 400, "1 is not of type 'string', 'null'"},
			{"metadata missing", "POST", "/os-aggregates/" + id + "/action", `{"set_metadata":{}}`, 400, "'metadata' is a required property"},
			{"metadata empty zone", "POST", "/os-aggregates/" + id + "/action", `{"set_metadata":{"metadata":{"availability_zone":null}}}`, 400,
				"Cannot update metadata of aggregate " + id + ". Reason: Aggregate a1 does not support empty named availability zone."},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				e.t = t
				e.fault(tc.status, tc.msg, tc.method, tc.path, e.admin, "", tc.body)
			})
		}
		e.t = t

		// Update: name (spaces stripped, as normalize_name does) and zone.
		up := rsObj(e.must(200, "PUT", "/os-aggregates/"+id, e.admin, "", `{"aggregate":{"name":" a1-new ","availability_zone":"az1"}}`), "aggregate")
		if up["name"] != "a1-new" || up["availability_zone"] != "az1" || up["updated_at"] == nil {
			t.Errorf("updated %v", up)
		}
		// Metadata: strings set, null removes, other keys stay.
		md := aggAction(e, id, `{"set_metadata":{"metadata":{"ssd":"true","gpu":"none"}}}`)
		if m := rsObj(md, "metadata"); len(m) != 3 || m["ssd"] != "true" || m["availability_zone"] != "az1" {
			t.Errorf("metadata %v", md)
		}
		md = aggAction(e, id, `{"set_metadata":{"metadata":{"gpu":null,"absent":null}}}`)
		if m := rsObj(md, "metadata"); len(m) != 2 || m["gpu"] != nil {
			t.Errorf("metadata after removal %v", md)
		}
		if m := rsObj(rsObj(e.must(200, "GET", "/os-aggregates/"+id, e.admin, "", ""), "aggregate"), "metadata"); len(m) != 2 {
			t.Errorf("stored metadata %v", m)
		}
		// Delete: 200 without a body; then gone.
		st, _, raw := e.call("DELETE", "/os-aggregates/"+fmt.Sprint(withZone["id"]), e.admin, "", "")
		if st != 200 || raw != "" {
			t.Errorf("delete: %d %q", st, raw)
		}
		e.fault(404, "could not be found", "GET", "/os-aggregates/"+fmt.Sprint(withZone["id"]), e.admin, "", "")
		// The name is free again; the id is not, as with Nova's
		// autoincrement ids.
		again := aggCreate(e, "", `{"aggregate":{"name":"a2"}}`)
		if again == fmt.Sprint(withZone["id"]) {
			t.Errorf("a deleted aggregate's id %s was handed out again", again)
		}
	})
}

func make256(c byte) []byte {
	b := make([]byte, 256)
	for i := range b {
		b[i] = c
	}
	return b
}

// TestAggregateHostsAndZones adds and removes hosts, with Nova's zone
// checks, and follows the zones in os-availability-zone and os-services.
func TestAggregateHostsAndZones(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := rsStart(t, dbURL)
		names, _ := azZones(e, false)
		if !slices.Equal(names, []string{"nova"}) {
			t.Fatalf("zones before aggregates %v", names)
		}
		plain := aggCreate(e, "", `{"aggregate":{"name":"plain"}}`)
		az1 := aggCreate(e, "", `{"aggregate":{"name":"rack1","availability_zone":"az1"}}`)
		az1b := aggCreate(e, "", `{"aggregate":{"name":"rack1b","availability_zone":"az1"}}`)
		az2 := aggCreate(e, "", `{"aggregate":{"name":"rack2","availability_zone":"az2"}}`)
		// An aggregate zone without hosts is no zone yet.
		if names, _ := azZones(e, false); !slices.Equal(names, []string{"nova"}) {
			t.Errorf("zones with empty aggregates %v", names)
		}

		a := aggAction(e, az1, `{"add_host":{"host":"fake-host-1"}}`)
		if !slices.Equal(rsList(a, "hosts"), []any{"fake-host-1"}) {
			t.Errorf("hosts %v", a["hosts"])
		}
		aggAction(e, az1, `{"add_host":{"host":"fake-host-2"}}`)
		e.fault(409, "Aggregate "+az1+" already has host fake-host-1.", "POST", "/os-aggregates/"+az1+"/action", e.admin, "",
			`{"add_host":{"host":"fake-host-1"}}`)
		// A host is in one zone: another aggregate of another zone refuses it,
		// one of the same zone or of none takes it.
		e.fault(409, "Cannot add host to aggregate "+az2+". Reason: One or more hosts already in availability zone(s) ['az1'].",
			"POST", "/os-aggregates/"+az2+"/action", e.admin, "", `{"add_host":{"host":"fake-host-1"}}`)
		aggAction(e, az1b, `{"add_host":{"host":"fake-host-1"}}`)
		aggAction(e, plain, `{"add_host":{"host":"fake-host-1"}}`)
		aggAction(e, az2, `{"add_host":{"host":"fake-host-3"}}`)
		// Renaming a zone whose hosts another aggregate zones is refused,
		// by update and by set_metadata (400, Nova's words per action).
		e.fault(400, "Cannot update aggregate "+az1b+". Reason: One or more hosts already in availability zone(s) ['az1'].",
			"PUT", "/os-aggregates/"+az1b, e.admin, "", `{"aggregate":{"availability_zone":"az3"}}`)
		e.fault(400, "Cannot update metadata of aggregate "+plain+". Reason: One or more hosts already in availability zone(s) ['az1', 'az1'].",
			"POST", "/os-aggregates/"+plain+"/action", e.admin, "", `{"set_metadata":{"metadata":{"availability_zone":"az9"}}}`)
		// Giving the zone it already has is fine.
		aggAction(e, plain, `{"set_metadata":{"metadata":{"availability_zone":"az1"}}}`)

		names, zones := azZones(e, false)
		if !slices.Equal(names, []string{"az1", "az2", "nova"}) {
			t.Fatalf("zones %v", names)
		}
		for _, z := range zones {
			if z["hosts"] != nil || rsObj(z, "zoneState")["available"] != true {
				t.Errorf("zone %v", z)
			}
		}
		names, zones = azZones(e, true)
		if !slices.Equal(names, []string{"az1", "az2", "internal", "nova"}) {
			t.Fatalf("detail zones %v", names)
		}
		if hs := rsObj(zones["az1"], "hosts"); len(hs) != 2 || rsObj(rsObj(hs, "fake-host-1"), "nova-compute")["available"] != true {
			t.Errorf("az1 hosts %v", hs)
		}
		if hs := rsObj(zones["nova"], "hosts"); len(hs) != 2 || hs["fake-host-4"] == nil || hs["fake-gpu-host-1"] == nil {
			t.Errorf("nova hosts %v", hs)
		}
		// os-services shows the zone too.
		svcZones := map[string]string{}
		for _, s := range rsList(e.must(200, "GET", "/os-services?binary=nova-compute", e.admin, "", ""), "services") {
			m := s.(map[string]any)
			svcZones[m["host"].(string)] = m["zone"].(string)
		}
		if svcZones["fake-host-1"] != "az1" || svcZones["fake-host-3"] != "az2" || svcZones["fake-host-4"] != "nova" {
			t.Errorf("service zones %v", svcZones)
		}

		// A zone whose every service is disabled is listed as unavailable,
		// after the available ones.
		e.must(200, "PUT", "/os-services/disable", e.admin, "", `{"host":"fake-host-3","binary":"nova-compute"}`)
		names, zones = azZones(e, false)
		if !slices.Equal(names, []string{"az1", "nova", "az2"}) || rsObj(zones["az2"], "zoneState")["available"] != false {
			t.Errorf("zones with az2 disabled %v %v", names, zones["az2"])
		}
		e.must(200, "PUT", "/os-services/enable", e.admin, "", `{"host":"fake-host-3","binary":"nova-compute"}`)

		// An aggregate with hosts is not deleted (400); removing them frees it.
		e.fault(400, "Cannot remove host from aggregate "+az2+". Reason: Host aggregate is not empty.", "DELETE", "/os-aggregates/"+az2, e.admin, "", "")
		a = aggAction(e, az2, `{"remove_host":{"host":"fake-host-3"}}`)
		if len(rsList(a, "hosts")) != 0 {
			t.Errorf("hosts after removal %v", a["hosts"])
		}
		e.fault(404, "Cannot remove host fake-host-3 in aggregate "+az2, "POST", "/os-aggregates/"+az2+"/action", e.admin, "",
			`{"remove_host":{"host":"fake-host-3"}}`)
		e.must(200, "DELETE", "/os-aggregates/"+az2, e.admin, "", "")
		if _, zones := azZones(e, true); zones["az2"] != nil || rsObj(zones["nova"], "hosts")["fake-host-3"] == nil {
			t.Errorf("fake-host-3 back in nova: %v", zones)
		}
		// Now fake-host-3 may join another zone.
		aggAction(e, az1, `{"add_host":{"host":"fake-host-3"}}`)
	})
}

// TestAggregateZoneWithServers checks that a zone change is refused while
// the aggregate's hosts run servers.
func TestAggregateZoneWithServers(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		e := rsStart(t, dbURL)
		var imageID string
		if err := e.c.DB.QueryRow(ctx, "SELECT id FROM images WHERE name = ?", "Debian 12").Scan(&imageID); err != nil {
			t.Fatal(err)
		}
		sid := rsObj(e.must(202, "POST", "/servers", e.admin, "2.96",
			`{"server":{"name":"busy","imageRef":"`+imageID+`","flavorRef":"2","networks":"none"}}`), "server")["id"].(string)
		host := ""
		for deadline := time.Now().Add(20 * time.Second); host == "" && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			host, _ = rsObj(e.must(200, "GET", "/servers/"+sid, e.admin, "", ""), "server")["OS-EXT-SRV-ATTR:host"].(string)
		}
		if host == "" {
			t.Fatal("server never placed")
		}
		agg := aggCreate(e, "", `{"aggregate":{"name":"busy"}}`)
		// Adding a busy host to a zone is allowed (Nova checks only renames).
		aggAction(e, agg, `{"add_host":{"host":"`+host+`"}}`)
		e.fault(400, "Cannot update aggregate "+agg+". Reason: One or more hosts contain instances in this zone.",
			"PUT", "/os-aggregates/"+agg, e.admin, "", `{"aggregate":{"availability_zone":"az1"}}`)
		e.fault(400, "Cannot update metadata of aggregate "+agg+". Reason: One or more hosts contain instances in this zone.",
			"POST", "/os-aggregates/"+agg+"/action", e.admin, "", `{"set_metadata":{"metadata":{"availability_zone":"az1"}}}`)
		// A rename alone is fine.
		e.must(200, "PUT", "/os-aggregates/"+agg, e.admin, "", `{"aggregate":{"name":"busy2"}}`)
	})
}

func TestAggregateImages(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		e := rsStart(t, dbURL)
		var imageID string
		if err := e.c.DB.QueryRow(ctx, "SELECT id FROM images WHERE name = ?", "Debian 12").Scan(&imageID); err != nil {
			t.Fatal(err)
		}
		id := aggCreate(e, "", `{"aggregate":{"name":"cache"}}`)
		body := `{"cache":[{"id":"` + imageID + `"}]}`
		e.fault(404, "The resource could not be found.", "POST", "/os-aggregates/"+id+"/images", e.admin, "2.80", body)
		st, _, raw := e.call("POST", "/os-aggregates/"+id+"/images", e.admin, "2.81", body)
		if st != http.StatusAccepted || raw != "" {
			t.Fatalf("images: %d %q", st, raw)
		}
		e.fault(403, "compute:aggregates:images", "POST", "/os-aggregates/"+id+"/images", e.demo, "2.81", body)
		for _, c := range []struct{ name, path, body, msg string }{
			{"duplicate", "/os-aggregates/" + id + "/images", `{"cache":[{"id":"` + imageID + `"},{"id":"` + imageID + `"}]}`, "Duplicate images in request"},
			{"empty", "/os-aggregates/" + id + "/images", `{"cache":[]}`, "[] is too short"},
			{"not uuid", "/os-aggregates/" + id + "/images", `{"cache":[{"id":"x"}]}`, "'x' is not a 'uuid'"},
			{"extra", "/os-aggregates/" + id + "/images", `{"cache":[{"id":"` + imageID + `","x":1}]}`, "('x' was unexpected)"},
			{"unknown image", "/os-aggregates/" + id + "/images", `{"cache":[{"id":"00000000-0000-4000-8000-000000000000"}]}`,
				"Image 00000000-0000-4000-8000-000000000000 could not be found."},
			{"bad id", "/os-aggregates/x/images", body, "id must be an integer"},
		} {
			e.fault(400, c.msg, "POST", c.path, e.admin, "2.81", c.body)
		}
		e.fault(404, "Aggregate 999 could not be found.", "POST", "/os-aggregates/999/images", e.admin, "2.81", body)
	})
}

// TestAggregatesGophercloud drives os-aggregates with gophercloud's
// aggregates package at 2.41 and reads the zone back through its
// availabilityzones and services packages.
func TestAggregatesGophercloud(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		c := testenv.StartCloud(t, dbURL)
		sc := testenv.Compute(t, testenv.Provider(t, c, cloud.AdminUser), "2.41")
		a, err := aggregates.Create(ctx, sc, aggregates.CreateOpts{Name: "gc", AvailabilityZone: "gz"}).Extract()
		if err != nil || a.Name != "gc" || a.AvailabilityZone != "gz" || a.UUID == "" || a.CreatedAt.IsZero() {
			t.Fatalf("create: %+v %v", a, err)
		}
		if _, err := aggregates.Create(ctx, sc, aggregates.CreateOpts{Name: "gc"}).Extract(); !gophercloud.ResponseCodeIs(err, http.StatusConflict) {
			t.Errorf("duplicate: %v", err)
		}
		a, err = aggregates.AddHost(ctx, sc, a.ID, aggregates.AddHostOpts{Host: "fake-host-2"}).Extract()
		if err != nil || !slices.Equal(a.Hosts, []string{"fake-host-2"}) {
			t.Fatalf("add host: %+v %v", a, err)
		}
		if _, err := aggregates.AddHost(ctx, sc, a.ID, aggregates.AddHostOpts{Host: "nope"}).Extract(); !gophercloud.ResponseCodeIs(err, http.StatusNotFound) {
			t.Errorf("unknown host: %v", err)
		}
		a, err = aggregates.SetMetadata(ctx, sc, a.ID, aggregates.SetMetadataOpts{Metadata: map[string]any{"ssd": "yes"}}).Extract()
		if err != nil || a.Metadata["ssd"] != "yes" || a.Metadata["availability_zone"] != "gz" || a.UpdatedAt.IsZero() {
			t.Fatalf("set metadata: %+v %v", a, err)
		}
		a, err = aggregates.Update(ctx, sc, a.ID, aggregates.UpdateOpts{Name: "gc2", AvailabilityZone: "gz2"}).Extract()
		if err != nil || a.Name != "gc2" || a.AvailabilityZone != "gz2" {
			t.Fatalf("update: %+v %v", a, err)
		}
		got, err := aggregates.Get(ctx, sc, a.ID).Extract()
		if err != nil || got.Name != "gc2" || got.UUID != a.UUID || !slices.Equal(got.Hosts, []string{"fake-host-2"}) {
			t.Fatalf("get: %+v %v", got, err)
		}

		pages, err := availabilityzones.ListDetail(sc).AllPages(ctx)
		if err != nil {
			t.Fatal(err)
		}
		azs, _ := availabilityzones.ExtractAvailabilityZones(pages)
		found := false
		for _, z := range azs {
			if z.ZoneName == "gz2" {
				found = len(z.Hosts) == 1 && z.Hosts["fake-host-2"] != nil
			}
		}
		if !found {
			t.Errorf("zone gz2 with fake-host-2 not in %+v", azs)
		}
		spages, err := services.List(sc, services.ListOpts{Host: "fake-host-2"}).AllPages(ctx)
		if err != nil {
			t.Fatal(err)
		}
		svcs, _ := services.ExtractServices(spages)
		if len(svcs) != 1 || svcs[0].Zone != "gz2" {
			t.Errorf("service %+v", svcs)
		}

		if err := aggregates.Delete(ctx, sc, a.ID).ExtractErr(); !gophercloud.ResponseCodeIs(err, http.StatusBadRequest) {
			t.Errorf("delete with a host: %v", err)
		}
		if _, err := aggregates.RemoveHost(ctx, sc, a.ID, aggregates.RemoveHostOpts{Host: "fake-host-2"}).Extract(); err != nil {
			t.Fatal(err)
		}
		if err := aggregates.Delete(ctx, sc, a.ID).ExtractErr(); err != nil {
			t.Fatalf("delete: %v", err)
		}
		lp, err := aggregates.List(sc).AllPages(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if l, _ := aggregates.ExtractAggregates(lp); len(l) != 0 {
			t.Errorf("after delete: %+v", l)
		}
	})
}

// TestAggregatesConcurrent creates aggregates at once: each gets its own
// id, and of two with one name exactly one is created.
func TestAggregatesConcurrent(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := rsStart(t, dbURL)
		const n = 8
		var wg sync.WaitGroup
		status := make([]int, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				name := fmt.Sprintf("c%d", i/2) // pairs share a name
				resp, _ := testenv.Do(t, e.client, "POST", e.c.ComputeURL+"/os-aggregates", e.admin, `{"aggregate":{"name":"`+name+`"}}`)
				status[i] = resp.StatusCode
			}()
		}
		wg.Wait()
		created, conflicts := 0, 0
		for _, st := range status {
			switch st {
			case 200:
				created++
			case 409:
				conflicts++
			}
		}
		ids := map[any]bool{}
		for _, a := range rsList(e.must(200, "GET", "/os-aggregates", e.admin, "", ""), "aggregates") {
			ids[a.(map[string]any)["id"]] = true
		}
		if created != n/2 || conflicts != n/2 || len(ids) != n/2 {
			t.Errorf("statuses %v, %d aggregates", status, len(ids))
		}
	})
}
