package compute_test

import (
	"context"
	"testing"

	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/services"

	"nimbus/internal/cloud"
	"nimbus/internal/driver/fake"
	"nimbus/internal/testenv"
)

func TestServices(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := rsStart(t, dbURL)
		ctx := context.Background()
		fleet := len(fake.DefaultFleet())
		view := []string{"id", "binary", "host", "zone", "status", "state", "updated_at", "disabled_reason"}

		all := rsList(e.must(200, "GET", "/os-services", e.admin, "", ""), "services")
		if len(all) != fleet+2 {
			t.Fatalf("%d services, want %d", len(all), fleet+2)
		}
		rsWantKeys(t, "service at 2.1", all[0], view...)
		rsWantKeys(t, "service at 2.11", rsList(e.must(200, "GET", "/os-services", e.admin, "2.11", ""), "services")[0],
			append(view, "forced_down")...)
		computes := rsList(e.must(200, "GET", "/os-services?binary=nova-compute", e.admin, "", ""), "services")
		if len(computes) != fleet {
			t.Fatalf("%d nova-compute services", len(computes))
		}
		for _, s := range computes {
			m := s.(map[string]any)
			if m["zone"] != "nova" || m["state"] != "up" || m["status"] != "enabled" || m["disabled_reason"] != nil {
				t.Errorf("compute service %v", m)
			}
		}
		if got := rsList(e.must(200, "GET", "/os-services?host=fake-host-1", e.admin, "", ""), "services"); len(got) != 1 {
			t.Errorf("host filter gave %d", len(got))
		}
		e.fault(403, "os_compute_api:os-services:list", "GET", "/os-services", e.demo, "", "")

		// Before 2.53: actions by name with host and binary.
		dis := rsObj(e.must(200, "PUT", "/os-services/disable-log-reason", e.admin, "",
			`{"host":"fake-host-1","binary":"nova-compute","disabled_reason":"maintenance"}`), "service")
		rsWantKeys(t, "disable-log-reason answer", dis, "host", "binary", "status", "disabled_reason")
		hyp := rsList(e.must(200, "GET", "/os-hypervisors?hypervisor_hostname_pattern=fake-host-1", e.admin, "2.53", ""), "hypervisors")[0].(map[string]any)
		if hyp["status"] != "disabled" {
			t.Errorf("hypervisor of a disabled service: %v", hyp)
		}
		s1 := rsList(e.must(200, "GET", "/os-services?host=fake-host-1", e.admin, "", ""), "services")[0].(map[string]any)
		if s1["status"] != "disabled" || s1["disabled_reason"] != "maintenance" {
			t.Errorf("disabled service %v", s1)
		}
		en := rsObj(e.must(200, "PUT", "/os-services/enable", e.admin, "", `{"host":"fake-host-1","binary":"nova-compute"}`), "service")
		if en["status"] != "enabled" {
			t.Errorf("enable %v", en)
		}
		e.fault(404, "Could not find binary nova-compute on host nowhere.", "PUT", "/os-services/disable", e.admin, "", `{"host":"nowhere","binary":"nova-compute"}`)
		e.fault(404, "Unknown action", "PUT", "/os-services/explode", e.admin, "", `{"host":"fake-host-1","binary":"nova-compute"}`)
		e.fault(404, "Unknown action", "PUT", "/os-services/force-down", e.admin, "2.10", `{"host":"fake-host-1","binary":"nova-compute","forced_down":true}`)
		e.fault(400, "'binary' is a required property", "PUT", "/os-services/disable", e.admin, "", `{"host":"fake-host-1"}`)
		e.fault(400, "disabled_reason", "PUT", "/os-services/disable-log-reason", e.admin, "", `{"host":"fake-host-1","binary":"nova-compute"}`)
		fd := rsObj(e.must(200, "PUT", "/os-services/force-down", e.admin, "2.11", `{"host":"fake-host-3","binary":"nova-compute","forced_down":true}`), "service")
		if fd["forced_down"] != true {
			t.Errorf("force-down %v", fd)
		}
		s3 := rsList(e.must(200, "GET", "/os-services?host=fake-host-3", e.admin, "2.11", ""), "services")[0].(map[string]any)
		if s3["state"] != "down" || s3["forced_down"] != true {
			t.Errorf("forced down service %v", s3)
		}
		e.fault(400, "Updating a nova-scheduler service is not supported.", "PUT", "/os-services/disable", e.admin, "", `{"host":"x","binary":"nova-scheduler"}`)
		e.fault(400, "Additional properties", "GET", "/os-services?zone=nova", e.admin, "2.75", "")
		e.fault(403, "os_compute_api:os-services:update", "PUT", "/os-services/disable", e.demo, "", `{"host":"fake-host-1","binary":"nova-compute"}`)

		// From 2.53: by UUID, with gophercloud.
		sc := testenv.Compute(t, testenv.Provider(t, e.c, cloud.AdminUser), "2.53")
		pages, err := services.List(sc, services.ListOpts{Host: "fake-host-2"}).AllPages(ctx)
		if err != nil {
			t.Fatal(err)
		}
		svcs, err := services.ExtractServices(pages)
		if err != nil || len(svcs) != 1 || len(svcs[0].ID) != 36 {
			t.Fatalf("gophercloud list %+v %v", svcs, err)
		}
		id := svcs[0].ID
		got, err := services.Update(ctx, sc, id, services.UpdateOpts{Status: services.ServiceDisabled, DisabledReason: "bad disk"}).Extract()
		if err != nil || got.Status != "disabled" || got.DisabledReason != "bad disk" || got.ID != id {
			t.Fatalf("gophercloud update %+v %v", got, err)
		}
		rsWantKeys(t, "update answer at 2.53", rsObj(e.must(200, "PUT", "/os-services/"+id, e.admin, "2.53", `{"status":"enabled"}`), "service"),
			append(view, "forced_down")...)
		for _, b := range []struct{ body, msg string }{
			{`{}`, "No updates were requested. Fields 'status' or 'forced_down' should be specified."},
			{`{"disabled_reason":"x"}`, "No updates were requested."},
			{`{"status":"enabled","disabled_reason":"x"}`, "Specifying 'disabled_reason' with status 'enabled' is invalid."},
			{`{"status":"sleeping"}`, "is not one of"},
			{`{"status":"enabled","zone":"x"}`, "Additional properties"},
			{`{"forced_down":"perhaps"}`, "forced_down"},
		} {
			e.fault(400, b.msg, "PUT", "/os-services/"+id, e.admin, "2.53", b.body)
		}
		e.fault(400, "Invalid uuid disable", "PUT", "/os-services/disable", e.admin, "2.53", `{"status":"enabled"}`)
		e.fault(404, "Service 00000000-0000-0000-0000-000000000000 could not be found.", "PUT", "/os-services/00000000-0000-0000-0000-000000000000", e.admin, "2.53", `{"status":"enabled"}`)
		sched := rsList(e.must(200, "GET", "/os-services?binary=nova-scheduler", e.admin, "2.53", ""), "services")[0].(map[string]any)
		if sched["zone"] != "internal" || sched["state"] != "up" {
			t.Errorf("scheduler %v", sched)
		}
		e.fault(400, "Updating a nova-scheduler service is not supported.", "PUT", "/os-services/"+sched["id"].(string), e.admin, "2.53", `{"status":"disabled"}`)

		// Delete: 204, gone from lists; a restart brings a compute back once
		// its agent presents it again.
		if err := services.Delete(ctx, sc, id).ExtractErr(); err != nil {
			t.Fatal(err)
		}
		if n := len(rsList(e.must(200, "GET", "/os-services", e.admin, "", ""), "services")); n != fleet+1 {
			t.Errorf("%d services after delete", n)
		}
		e.fault(404, "not found", "DELETE", "/os-services/"+id, e.admin, "2.53", "")
		e.fault(400, "Invalid uuid 1", "DELETE", "/os-services/1", e.admin, "2.53", "")
		e.fault(400, "Invalid input received: id must be an integer", "DELETE", "/os-services/x", e.admin, "", "")
		e.fault(403, "os_compute_api:os-services:delete", "DELETE", "/os-services/1", e.demo, "", "")
		// The delete took the host out of the fleet; the local agent, still
		// presenting it, registers it again on its next reports.
		for range 2 {
			if err := e.c.Agent.Heartbeat(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if err := e.c.Compute.Bootstrap(ctx); err != nil {
			t.Fatal(err)
		}
		if n := len(rsList(e.must(200, "GET", "/os-services", e.admin, "", ""), "services")); n != fleet+2 {
			t.Errorf("%d services after restart", n)
		}
	})
}
