package e2e

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/volumes"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/images"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/security/groups"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"

	"nimbus/internal/cloud"
	"nimbus/internal/testenv"
)

// TestDeletedServerReleasedFirst: a deleted server answers 404 only once
// its ports, claims and volumes are released, as Nova's does
// (nova/compute/manager.py _delete_instance: _shutdown_instance
// deallocates the network and detaches the volumes, _cleanup_volumes
// deletes those marked delete_on_termination, and only then
// instance.destroy() makes the API answer 404; until then the server
// shows its task_state deleting). So a client that waits for the 404,
// as Tempest's wait_for_server_termination does, can delete the
// security group its servers used: here two servers made in one
// request, as Tempest's multiple-create tests make them, with a boot
// volume each.
func TestDeletedServerReleasedFirst(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		c := testenv.StartCloud(t, dbURL, func(cfg *cloud.Config) { cfg.FakeDelay = 200 * time.Millisecond })
		pc := testenv.Provider(t, c, cloud.DemoUser)
		compute := testenv.Compute(t, pc, "2.67")
		nc, err := openstack.NewNetworkV2(pc, gophercloud.EndpointOpts{})
		if err != nil {
			t.Fatal(err)
		}
		vc, err := openstack.NewBlockStorageV3(pc, gophercloud.EndpointOpts{})
		if err != nil {
			t.Fatal(err)
		}
		ic, err := openstack.NewImageV2(pc, gophercloud.EndpointOpts{})
		if err != nil {
			t.Fatal(err)
		}
		image, flavor, network := bootChoice(t, pc)
		img, err := images.Get(ctx, ic, image).Extract()
		if err != nil {
			t.Fatal(err)
		}
		sg, err := groups.Create(ctx, nc, groups.CreateOpts{Name: "release-sg"}).Extract()
		if err != nil {
			t.Fatal(err)
		}
		body := map[string]any{"server": map[string]any{"name": "release", "flavorRef": flavor, "min_count": 2, "max_count": 2,
			"networks": []map[string]any{{"uuid": network}}, "security_groups": []map[string]any{{"name": "release-sg"}},
			"block_device_mapping_v2": []map[string]any{{"boot_index": 0, "uuid": image, "source_type": "image",
				"destination_type": "volume", "volume_size": max(img.MinDiskGigabytes, 1), "delete_on_termination": true}}}}
		if _, err := compute.Post(ctx, compute.ServiceURL("servers"), body, nil, &gophercloud.RequestOpts{OkCodes: []int{202}}); err != nil {
			t.Fatalf("create: %v", err)
		}
		pages, err := servers.List(compute, servers.ListOpts{Name: "^release-"}).AllPages(ctx)
		if err != nil {
			t.Fatal(err)
		}
		made, _ := servers.ExtractServers(pages)
		if len(made) != 2 {
			t.Fatalf("%d servers made, want 2", len(made))
		}
		held := map[string][]string{} // server → its volumes
		for _, s := range made {
			waitStatus(t, compute, s.ID, "ACTIVE")
			got, err := servers.Get(ctx, compute, s.ID).Extract()
			if err != nil {
				t.Fatal(err)
			}
			for _, v := range got.AttachedVolumes {
				held[s.ID] = append(held[s.ID], v.ID)
			}
			if len(held[s.ID]) != 1 || len(serverPorts(t, nc, s.ID)) != 1 {
				t.Fatalf("server %s holds volumes %v and ports %v", s.ID, held[s.ID], serverPorts(t, nc, s.ID))
			}
		}
		for _, s := range made {
			if err := servers.Delete(ctx, compute, s.ID).ExtractErr(); err != nil {
				t.Fatal(err)
			}
		}
		gone := map[string]bool{}
		sawDeleting := false
		deadline := time.Now().Add(waitTimeout)
		for len(gone) < len(made) {
			if time.Now().After(deadline) {
				t.Fatalf("servers not gone %s after their delete", waitTimeout)
			}
			for _, s := range made {
				if gone[s.ID] {
					continue
				}
				got, err := servers.Get(ctx, compute, s.ID).Extract()
				if err == nil {
					sawDeleting = sawDeleting || got.TaskState == "deleting"
					continue
				}
				if !gophercloud.ResponseCodeIs(err, http.StatusNotFound) {
					t.Fatal(err)
				}
				gone[s.ID] = true
				// The moment it answers 404, it holds nothing.
				if p := serverPorts(t, nc, s.ID); len(p) != 0 {
					t.Errorf("server %s answers 404 and still holds ports %v", s.ID, p)
				}
				for _, v := range held[s.ID] {
					vol, err := volumes.Get(ctx, vc, v).Extract()
					if err == nil && vol.Status != "deleting" {
						t.Errorf("server %s answers 404 and its delete_on_termination volume %s is %s", s.ID, v, vol.Status)
					} else if err != nil && !gophercloud.ResponseCodeIs(err, http.StatusNotFound) {
						t.Fatal(err)
					}
				}
				var claims int
				if err := c.DB.QueryRow(ctx, "SELECT COUNT(*) FROM compute_claims WHERE server_id = ?", s.ID).Scan(&claims); err != nil || claims != 0 {
					t.Errorf("server %s answers 404 and still holds %d claims (%v)", s.ID, claims, err)
				}
			}
			time.Sleep(10 * time.Millisecond)
		}
		if !sawDeleting {
			t.Error("no server showed task_state deleting before its 404")
		}
		if err := groups.Delete(ctx, nc, sg.ID).ExtractErr(); err != nil {
			t.Fatalf("the servers' security group, once they answer 404: %v", err)
		}
	})
}

// serverPorts are the ids of the ports bound to server id.
func serverPorts(t *testing.T, nc *gophercloud.ServiceClient, id string) []string {
	t.Helper()
	pages, err := ports.List(nc, ports.ListOpts{DeviceID: id}).AllPages(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ps, _ := ports.ExtractPorts(pages)
	var out []string
	for _, p := range ps {
		out = append(out, p.ID)
	}
	return out
}
