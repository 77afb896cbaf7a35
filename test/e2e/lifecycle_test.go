// Package e2e drives a whole Nimbus cloud over HTTPS with gophercloud v2,
// as a customer's program would: the identity catalog, flavors, images,
// networks, key pairs and a server's life from create to delete, on SQLite
// and on PostgreSQL.
package e2e

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/flavors"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/keypairs"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/tokens"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/images"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"

	"nimbus/internal/cloud"
	"nimbus/internal/testenv"
)

const waitTimeout = 30 * time.Second

func TestCustomerLife(t *testing.T) {
	for _, mv := range []string{"", "2.79", "latest"} {
		name := mv
		if name == "" {
			name = "2.1"
		}
		t.Run("microversion="+name, func(t *testing.T) {
			testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
				customerLife(t, testenv.StartCloud(t, dbURL), mv)
			})
		})
	}
}

func customerLife(t *testing.T, c *cloud.Cloud, mv string) {
	ctx := context.Background()
	pc := testenv.Provider(t, c, cloud.DemoUser)

	// The token's catalog names every service Nimbus runs.
	idc, err := openstack.NewIdentityV3(pc, gophercloud.EndpointOpts{})
	if err != nil {
		t.Fatal(err)
	}
	cat, err := tokens.Get(ctx, idc, pc.Token()).ExtractServiceCatalog()
	if err != nil {
		t.Fatalf("token catalog: %v", err)
	}
	var types []string
	for _, e := range cat.Entries {
		types = append(types, e.Type)
	}
	for _, want := range []string{"identity", "compute", "image", "network"} {
		if !slices.Contains(types, want) {
			t.Errorf("catalog lacks %s: %v", want, types)
		}
	}

	compute := testenv.Compute(t, pc, mv)
	imageClient, err := openstack.NewImageV2(pc, gophercloud.EndpointOpts{})
	if err != nil {
		t.Fatal(err)
	}
	netClient, err := openstack.NewNetworkV2(pc, gophercloud.EndpointOpts{})
	if err != nil {
		t.Fatal(err)
	}

	// Pick the smallest flavor and a Linux image, as a user reading the lists would.
	fpages, err := flavors.ListDetail(compute, nil).AllPages(ctx)
	if err != nil {
		t.Fatalf("flavors: %v", err)
	}
	fl, err := flavors.ExtractFlavors(fpages)
	if err != nil || len(fl) == 0 {
		t.Fatalf("flavors: %v (%d)", err, len(fl))
	}
	slices.SortFunc(fl, func(a, b flavors.Flavor) int { return a.VCPUs*100000 + a.RAM - b.VCPUs*100000 - b.RAM })

	ipages, err := images.List(imageClient, images.ListOpts{}).AllPages(ctx)
	if err != nil {
		t.Fatalf("images: %v", err)
	}
	imgs, err := images.ExtractImages(ipages)
	if err != nil {
		t.Fatal(err)
	}
	var image *images.Image
	for i := range imgs {
		if imgs[i].Properties["os_type"] == "linux" && imgs[i].Status == images.ImageStatusActive {
			image = &imgs[i]
			break
		}
	}
	if image == nil {
		t.Fatalf("no active Linux image among %d", len(imgs))
	}

	// The smallest flavor whose disk holds the image, as Nova requires.
	var flavor flavors.Flavor
	for _, f := range fl {
		if f.Disk >= image.MinDiskGigabytes && f.RAM >= image.MinRAMMegabytes {
			flavor = f
			break
		}
	}
	if flavor.ID == "" {
		t.Fatalf("no flavor fits image %s (min_disk %d)", image.Name, image.MinDiskGigabytes)
	}

	npages, err := networks.List(netClient, networks.ListOpts{Name: "private"}).AllPages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	nets, err := networks.ExtractNetworks(npages)
	if err != nil || len(nets) != 1 {
		t.Fatalf("private network: %v (%d)", err, len(nets))
	}

	kp, err := keypairs.Create(ctx, compute, keypairs.CreateOpts{Name: "life-key",
		PublicKey: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBd9PaUVW/Mx2t7Lz4lOpmNCcSl9xmXbDrhG6Lm7VCj5 e2e"}).Extract()
	if err != nil {
		t.Fatalf("keypair: %v", err)
	}

	// Two servers in one request, as the spec's example does with min/max.
	created, err := servers.Create(ctx, compute, keypairs.CreateOptsExt{
		CreateOptsBuilder: servers.CreateOpts{
			Name: "life", ImageRef: image.ID, FlavorRef: flavor.ID,
			Networks: []servers.Network{{UUID: nets[0].ID}}, Min: 2, Max: 2,
		},
		KeyName: kp.Name,
	}, nil).Extract()
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	spages, err := servers.List(compute, servers.ListOpts{Name: "^life-"}).AllPages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	batch, err := servers.ExtractServers(spages)
	if err != nil || len(batch) != 2 {
		t.Fatalf("multi-create made %d servers (%v), want 2", len(batch), err)
	}
	names := []string{batch[0].Name, batch[1].Name}
	slices.Sort(names)
	if names[0] != "life-1" || names[1] != "life-2" {
		t.Fatalf("names %v, want life-1 and life-2", names)
	}
	for _, s := range batch {
		waitStatus(t, compute, s.ID, "ACTIVE")
	}
	id := created.ID
	srv, err := servers.Get(ctx, compute, id).Extract()
	if err != nil {
		t.Fatal(err)
	}
	if len(srv.Addresses["private"].([]any)) == 0 {
		t.Errorf("ACTIVE server has no private address: %v", srv.Addresses)
	}
	if srv.KeyName != kp.Name || srv.TenantID == "" || srv.HostID == "" {
		t.Errorf("server fields: key %q tenant %q hostId %q", srv.KeyName, srv.TenantID, srv.HostID)
	}

	steps := []struct {
		name string
		act  func() error
		want string
	}{
		{"stop", func() error { return servers.Stop(ctx, compute, id).ExtractErr() }, "SHUTOFF"},
		{"start", func() error { return servers.Start(ctx, compute, id).ExtractErr() }, "ACTIVE"},
		{"soft reboot", func() error {
			return servers.Reboot(ctx, compute, id, servers.RebootOpts{Type: servers.SoftReboot}).ExtractErr()
		}, "ACTIVE"},
		{"hard reboot", func() error {
			return servers.Reboot(ctx, compute, id, servers.RebootOpts{Type: servers.HardReboot}).ExtractErr()
		}, "ACTIVE"},
		{"shelve", func() error { return shelve(ctx, compute, id, "shelve") }, "SHELVED_OFFLOADED"},
		{"unshelve", func() error { return shelve(ctx, compute, id, "unshelve") }, "ACTIVE"},
	}
	for _, st := range steps {
		if err := st.act(); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		waitStatus(t, compute, id, st.want)
	}
	// An action the state does not allow is Nova's 409.
	err = servers.Start(ctx, compute, id).ExtractErr()
	if !gophercloud.ResponseCodeIs(err, http.StatusConflict) {
		t.Errorf("start while ACTIVE: %v, want 409", err)
	}

	for _, s := range batch {
		if err := servers.Delete(ctx, compute, s.ID).ExtractErr(); err != nil {
			t.Fatalf("delete: %v", err)
		}
	}
	for _, s := range batch {
		waitGone(t, compute, s.ID)
	}
	if err := keypairs.Delete(ctx, compute, kp.Name, nil).ExtractErr(); err != nil {
		t.Fatalf("delete keypair: %v", err)
	}
}

// shelve posts {"shelve": null} or {"unshelve": null}.
func shelve(ctx context.Context, c *gophercloud.ServiceClient, id, action string) error {
	_, err := c.Post(ctx, c.ServiceURL("servers", id, "action"), map[string]any{action: nil}, nil,
		&gophercloud.RequestOpts{OkCodes: []int{http.StatusAccepted}})
	return err
}

func waitStatus(t *testing.T, c *gophercloud.ServiceClient, id, want string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	if err := servers.WaitForStatus(ctx, c, id, want); err != nil {
		s, _ := servers.Get(context.Background(), c, id).Extract()
		if s != nil {
			t.Fatalf("server %s: waiting for %s: %v (status %s, task %s, fault %+v)", id, want, err, s.Status, s.TaskState, s.Fault)
		}
		t.Fatalf("server %s: waiting for %s: %v", id, want, err)
	}
}

func waitGone(t *testing.T, c *gophercloud.ServiceClient, id string) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for {
		_, err := servers.Get(context.Background(), c, id).Extract()
		if gophercloud.ResponseCodeIs(err, http.StatusNotFound) {
			return
		}
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("get deleted server: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("server %s still there after delete", id)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
