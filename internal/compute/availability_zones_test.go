package compute_test

import (
	"context"
	"testing"

	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/availabilityzones"

	"nimbus/internal/cloud"
	"nimbus/internal/driver/fake"
	"nimbus/internal/testenv"
)

func TestAvailabilityZones(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := rsStart(t, dbURL)
		zones := rsList(e.must(200, "GET", "/os-availability-zone", e.demo, "", ""), "availabilityZoneInfo")
		if len(zones) != 1 {
			t.Fatalf("zones %v", zones)
		}
		z := zones[0].(map[string]any)
		rsWantKeys(t, "zone", z, "zoneName", "zoneState", "hosts")
		if z["zoneName"] != "nova" || rsObj(z, "zoneState")["available"] != true || z["hosts"] != nil {
			t.Errorf("zone %v", z)
		}
		det := rsList(e.must(200, "GET", "/os-availability-zone/detail", e.admin, "", ""), "availabilityZoneInfo")
		if len(det) != 2 {
			t.Fatalf("detail zones %v", det)
		}
		for _, d := range det {
			m := d.(map[string]any)
			hosts := rsObj(m, "hosts")
			switch m["zoneName"] {
			case "internal":
				if len(hosts) != 1 {
					t.Errorf("internal hosts %v", hosts)
				}
			case "nova":
				svc := rsObj(rsObj(hosts, "fake-host-1"), "nova-compute")
				rsWantKeys(t, "zone host service", svc, "available", "active", "updated_at")
				if svc["available"] != true || svc["active"] != true {
					t.Errorf("fake-host-1 %v", svc)
				}
			default:
				t.Errorf("unexpected zone %v", m["zoneName"])
			}
		}
		e.fault(403, "os_compute_api:os-availability-zone:detail", "GET", "/os-availability-zone/detail", e.demo, "", "")

		// Gophercloud reads the same.
		sc := testenv.Compute(t, testenv.Provider(t, e.c, cloud.AdminUser), "2.96")
		pages, err := availabilityzones.ListDetail(sc).AllPages(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		azs, err := availabilityzones.ExtractAvailabilityZones(pages)
		if err != nil || len(azs) != 2 {
			t.Fatalf("gophercloud detail %+v %v", azs, err)
		}
		for _, z := range azs {
			if z.ZoneName == "nova" && (!z.ZoneState.Available || len(z.Hosts) != len(fake.DefaultFleet())) {
				t.Errorf("gophercloud zone %+v", z)
			}
		}
	})
}
