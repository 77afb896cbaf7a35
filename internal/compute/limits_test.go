package compute_test

import (
	"context"
	"testing"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/limits"

	"nimbus/internal/cloud"
	"nimbus/internal/testenv"
)

// limitsGet reads maxTotalCores through gophercloud's limits client.
func limitsGet(ctx context.Context, sc *gophercloud.ServiceClient) (int, error) {
	l, err := limits.Get(ctx, sc, nil).Extract()
	if err != nil {
		return 0, err
	}
	return l.Absolute.MaxTotalCores, nil
}

func TestLimits(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := rsStart(t, dbURL)
		ctx := context.Background()
		core := []string{"maxServerMeta", "maxTotalCores", "maxTotalInstances", "maxTotalKeypairs", "maxTotalRAMSize",
			"maxServerGroups", "maxServerGroupMembers", "totalCoresUsed", "totalInstancesUsed", "totalRAMUsed", "totalServerGroupsUsed"}
		files := []string{"maxImageMeta", "maxPersonality", "maxPersonalitySize"}
		network := []string{"maxSecurityGroups", "maxSecurityGroupRules", "maxTotalFloatingIps", "totalFloatingIpsUsed", "totalSecurityGroupsUsed"}
		for mv, want := range map[string][]string{
			"":     append(append(append([]string{}, core...), files...), network...),
			"2.37": append(append([]string{}, core...), files...),
			"2.57": core,
		} {
			l := rsObj(e.must(200, "GET", "/limits", e.demo, mv, ""), "limits")
			rsWantKeys(t, "limits at "+mv, l, "rate", "absolute")
			rsWantKeys(t, "absolute limits at "+mv, l["absolute"], want...)
		}
		demoProject, _ := e.c.Identity.ProjectByName(ctx, cloud.DemoProject)
		e.must(200, "PUT", "/os-quota-sets/"+demoProject.ID, e.admin, "", `{"quota_set":{"cores":7}}`)
		demo := testenv.Compute(t, testenv.Provider(t, e.c, cloud.DemoUser), "2.57")
		lim, err := limitsGet(ctx, demo)
		if err != nil || lim != 7 {
			t.Fatalf("maxTotalCores %d %v", lim, err)
		}
		abs := rsObj(rsObj(e.must(200, "GET", "/limits?tenant_id="+demoProject.ID, e.admin, "", ""), "limits"), "absolute")
		if abs["maxTotalCores"] != float64(7) {
			t.Errorf("admin view of demo limits %v", abs)
		}
		e.fault(403, "os_compute_api:limits:other_project", "GET", "/limits?tenant_id=someone", e.demo, "", "")
	})
}
