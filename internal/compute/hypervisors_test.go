package compute_test

import (
	"context"
	"strings"
	"testing"

	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/hypervisors"

	"nimbus/internal/cloud"
	"nimbus/internal/driver/fake"
	"nimbus/internal/testenv"
)

func TestHypervisors(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := rsStart(t, dbURL)
		ctx := context.Background()
		fleet := len(fake.DefaultFleet())

		basic := []string{"id", "hypervisor_hostname", "state", "status"}
		old := append([]string{"vcpus", "memory_mb", "local_gb", "vcpus_used", "memory_mb_used", "local_gb_used",
			"hypervisor_type", "hypervisor_version", "free_ram_mb", "free_disk_gb", "current_workload", "running_vms",
			"cpu_info", "disk_available_least", "host_ip", "service"}, basic...)
		recent := append([]string{"hypervisor_type", "hypervisor_version", "host_ip", "service", "uptime"}, basic...)

		l := rsList(e.must(200, "GET", "/os-hypervisors", e.admin, "", ""), "hypervisors")
		if len(l) != fleet {
			t.Fatalf("%d hypervisors, want %d", len(l), fleet)
		}
		rsWantKeys(t, "list item at 2.1", l[0], basic...)
		h := rsList(e.must(200, "GET", "/os-hypervisors/detail", e.admin, "", ""), "hypervisors")[0].(map[string]any)
		rsWantKeys(t, "detail at 2.1", h, old...)
		if _, ok := h["id"].(float64); !ok {
			t.Errorf("id at 2.1 is %T, want a number", h["id"])
		}
		if _, ok := h["cpu_info"].(string); !ok {
			t.Errorf("cpu_info before 2.28 is %T, want a string", h["cpu_info"])
		}
		if h["hypervisor_type"] != "fake" || h["state"] != "up" || h["status"] != "enabled" || h["vcpus"] != float64(64) {
			t.Errorf("detail %v", h)
		}
		rsWantKeys(t, "service at 2.1", h["service"], "id", "host", "disabled_reason")
		h = rsList(e.must(200, "GET", "/os-hypervisors/detail", e.admin, "2.37", ""), "hypervisors")[0].(map[string]any)
		if _, ok := h["cpu_info"].(map[string]any); !ok {
			t.Errorf("cpu_info at 2.37 is %T, want an object", h["cpu_info"])
		}
		h = rsList(e.must(200, "GET", "/os-hypervisors/detail", e.admin, "2.96", ""), "hypervisors")[0].(map[string]any)
		rsWantKeys(t, "detail at 2.96", h, recent...)
		uuidID, _ := h["id"].(string)
		if len(uuidID) != 36 || !strings.Contains(h["uptime"].(string), " up ") {
			t.Errorf("detail at 2.96: %v", h)
		}

		// Show by integer id before 2.53 and by UUID after.
		e.must(200, "GET", "/os-hypervisors/1", e.admin, "", "")
		rsWantKeys(t, "show at 2.96", rsObj(e.must(200, "GET", "/os-hypervisors/"+uuidID, e.admin, "2.96", ""), "hypervisor"), recent...)
		e.fault(404, "Hypervisor with ID 'abc' could not be found.", "GET", "/os-hypervisors/abc", e.admin, "", "")
		e.fault(404, "Hypervisor with ID '999' could not be found.", "GET", "/os-hypervisors/999", e.admin, "", "")
		e.fault(400, "Invalid uuid 1", "GET", "/os-hypervisors/1", e.admin, "2.53", "")
		ws := rsObj(e.must(200, "GET", "/os-hypervisors/"+uuidID+"?with_servers=true", e.admin, "2.96", ""), "hypervisor")
		if _, ok := ws["servers"]; !ok {
			t.Errorf("with_servers at 2.96: %v", ws)
		}

		// Statistics and uptime until 2.88; search and servers until 2.53.
		st := rsObj(e.must(200, "GET", "/os-hypervisors/statistics", e.admin, "", ""), "hypervisor_statistics")
		if st["count"] != float64(fleet) || st["vcpus"] != float64(4*64+96) {
			t.Errorf("statistics %v", st)
		}
		e.fault(404, "could not be found", "GET", "/os-hypervisors/statistics", e.admin, "2.88", "")
		up := rsObj(e.must(200, "GET", "/os-hypervisors/1/uptime", e.admin, "", ""), "hypervisor")
		rsWantKeys(t, "uptime", up, append(basic, "uptime")...)
		e.fault(404, "could not be found", "GET", "/os-hypervisors/"+uuidID+"/uptime", e.admin, "2.88", "")
		found := rsList(e.must(200, "GET", "/os-hypervisors/gpu/search", e.admin, "", ""), "hypervisors")
		if len(found) != 1 || found[0].(map[string]any)["hypervisor_hostname"] != "fake-gpu-host-1" {
			t.Errorf("search %v", found)
		}
		e.fault(404, "No hypervisor matching 'nothing' could be found.", "GET", "/os-hypervisors/nothing/search", e.admin, "", "")
		e.fault(404, "No hypervisor matching 'nothing' could be found.", "GET", "/os-hypervisors/nothing/servers", e.admin, "", "")
		e.must(200, "GET", "/os-hypervisors/fake-host/servers", e.admin, "", "")
		e.fault(404, "could not be found", "GET", "/os-hypervisors/fake/search", e.admin, "2.53", "")

		// 2.53 listing: pattern, paging, with_servers, strict query.
		p := rsList(e.must(200, "GET", "/os-hypervisors?hypervisor_hostname_pattern=fake-host", e.admin, "2.53", ""), "hypervisors")
		if len(p) != 4 {
			t.Errorf("pattern matched %d", len(p))
		}
		e.fault(404, "No hypervisor matching 'zzz'", "GET", "/os-hypervisors?hypervisor_hostname_pattern=zzz", e.admin, "2.53", "")
		e.fault(400, "Paging over hypervisors", "GET", "/os-hypervisors?hypervisor_hostname_pattern=a&limit=1", e.admin, "2.53", "")
		e.fault(400, "with_servers", "GET", "/os-hypervisors?with_servers=maybe", e.admin, "2.53", "")
		e.fault(400, "Additional properties", "GET", "/os-hypervisors?bogus=1", e.admin, "2.53", "")
		e.fault(400, "marker [nope] not found", "GET", "/os-hypervisors?marker=nope", e.admin, "2.53", "")
		page := e.must(200, "GET", "/os-hypervisors?limit=2", e.admin, "2.33", "")
		if len(rsList(page, "hypervisors")) != 2 || len(rsList(page, "hypervisors_links")) != 1 {
			t.Errorf("page %v", page)
		}

		// A host that stops answering is down, once its agent reports it.
		e.c.Fake.SetHostUp("fake-host-2", false)
		if err := e.c.Agent.Heartbeat(ctx); err != nil {
			t.Fatal(err)
		}
		h2 := rsList(e.must(200, "GET", "/os-hypervisors?hypervisor_hostname_pattern=fake-host-2", e.admin, "2.53", ""), "hypervisors")[0].(map[string]any)
		if h2["state"] != "down" {
			t.Errorf("down host shows %v", h2)
		}
		e.fault(400, "Compute service of fake-host-2 is unavailable", "GET", "/os-hypervisors/2/uptime", e.admin, "", "")

		e.fault(403, "os_compute_api:os-hypervisors:list", "GET", "/os-hypervisors", e.demo, "", "")
		e.fault(403, "os_compute_api:os-hypervisors:show", "GET", "/os-hypervisors/1", e.demo, "", "")

		// Gophercloud at both ends of the range.
		for _, mv := range []string{"2.1", "2.96"} {
			sc := testenv.Compute(t, testenv.Provider(t, e.c, cloud.AdminUser), mv)
			pages, err := hypervisors.List(sc, nil).AllPages(ctx)
			if err != nil {
				t.Fatal(err)
			}
			hs, err := hypervisors.ExtractHypervisors(pages)
			if err != nil || len(hs) != fleet || hs[0].HypervisorType != "fake" {
				t.Fatalf("gophercloud at %s: %d %v", mv, len(hs), err)
			}
			one, err := hypervisors.Get(ctx, sc, hs[0].ID).Extract()
			if err != nil || one.HypervisorHostname != hs[0].HypervisorHostname {
				t.Fatalf("gophercloud get at %s: %+v %v", mv, one, err)
			}
		}
		sc := testenv.Compute(t, testenv.Provider(t, e.c, cloud.AdminUser), "")
		stats, err := hypervisors.GetStatistics(ctx, sc).Extract()
		if err != nil || stats.Count != fleet {
			t.Fatalf("gophercloud statistics %+v %v", stats, err)
		}
		upt, err := hypervisors.GetUptime(ctx, sc, "1").Extract()
		if err != nil || upt.Uptime == "" {
			t.Fatalf("gophercloud uptime %+v %v", upt, err)
		}
	})
}
