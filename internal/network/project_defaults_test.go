package network_test

import (
	"context"
	"testing"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/projects"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/roles"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/users"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/security/groups"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"

	"nimbus/internal/cloud"
	"nimbus/internal/testenv"
)

// TestNewProjectHasDefaults: a project an operator makes through Keystone
// has its "private" network (with its subnet) and "default" security group
// at its first request, before any server; a project left without them (made
// before the hook) gets them when the controller starts again.
func TestNewProjectHasDefaults(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		c := testenv.StartCloud(t, dbURL)
		projectID := makeProjectUser(t, c, "walk", "walker", "walker-pw-1")
		checkProjectDefaults(t, c, "walk", "walker", "walker-pw-1")

		// A project from before: its defaults gone from the database.
		for _, q := range []string{
			"DELETE FROM security_group_rules WHERE project_id = ?",
			"DELETE FROM security_groups WHERE project_id = ?",
			"DELETE FROM subnets WHERE project_id = ?",
			"DELETE FROM networks WHERE project_id = ?",
		} {
			if _, err := c.DB.Exec(ctx, q, projectID); err != nil {
				t.Fatalf("%s: %v", q, err)
			}
		}
		c.Close()
		c2 := testenv.StartCloud(t, dbURL)
		checkProjectDefaults(t, c2, "walk", "walker", "walker-pw-1")
	})
}

// makeProjectUser does what docs/operator.md's operator does: project create,
// user create, role add member; it returns the project's id.
func makeProjectUser(t *testing.T, c *cloud.Cloud, project, user, password string) string {
	t.Helper()
	ctx := context.Background()
	id, err := openstack.NewIdentityV3(testenv.Provider(t, c, cloud.AdminUser), gophercloud.EndpointOpts{})
	if err != nil {
		t.Fatal(err)
	}
	p, err := projects.Create(ctx, id, projects.CreateOpts{Name: project, DomainID: "default"}).Extract()
	if err != nil {
		t.Fatalf("project create: %v", err)
	}
	u, err := users.Create(ctx, id, users.CreateOpts{Name: user, DomainID: "default", Password: password}).Extract()
	if err != nil {
		t.Fatalf("user create: %v", err)
	}
	pages, err := roles.List(id, roles.ListOpts{Name: "member"}).AllPages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := roles.ExtractRoles(pages)
	if err != nil || len(rs) != 1 {
		t.Fatalf("role member: %v %v", rs, err)
	}
	if err := roles.Assign(ctx, id, rs[0].ID, roles.AssignOpts{UserID: u.ID, ProjectID: p.ID}).ExtractErr(); err != nil {
		t.Fatalf("role add: %v", err)
	}
	return p.ID
}

// checkProjectDefaults logs in as the project's user and expects exactly one
// "private" network with its 10.0.0.0/24 subnet and one "default" group.
func checkProjectDefaults(t *testing.T, c *cloud.Cloud, project, user, password string) {
	t.Helper()
	ctx := context.Background()
	nc, err := openstack.NewNetworkV2(testenv.ProviderAs(t, c, user, password, project), gophercloud.EndpointOpts{Region: "RegionOne"})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.ProviderClient.HTTPClient.CloseIdleConnections()
	pages, err := networks.List(nc, networks.ListOpts{Name: "private"}).AllPages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	nets, err := networks.ExtractNetworks(pages)
	if err != nil {
		t.Fatal(err)
	}
	if len(nets) != 1 || nets[0].TenantID == "" || len(nets[0].Subnets) != 1 {
		t.Fatalf("private networks = %+v, want one of the project's with one subnet", nets)
	}
	sub, err := subnets.Get(ctx, nc, nets[0].Subnets[0]).Extract()
	if err != nil || sub.CIDR != "10.0.0.0/24" {
		t.Fatalf("private subnet = %+v, %v", sub, err)
	}
	pages, err = groups.List(nc, groups.ListOpts{Name: "default"}).AllPages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sgs, err := groups.ExtractGroups(pages)
	if err != nil {
		t.Fatal(err)
	}
	if len(sgs) != 1 || sgs[0].TenantID != nets[0].TenantID || len(sgs[0].Rules) != 4 {
		t.Fatalf("default groups = %+v, want one with 4 rules", sgs)
	}
}
