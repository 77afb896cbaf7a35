package e2e

import (
	"context"
	"strings"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/volumes"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/flavors"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/images"

	"nimbus/internal/testenv"
)

// networkDiskAcrossHosts is issue 14's network disk on real VMs: a server
// of a flavor whose disk type is network boots from a volume made from
// its image, served by the controller over NBD to the host it lands on;
// a file written on its root survives a shelve, which uploads no image
// and frees the host, and an unshelve onto the other of hosts, where the
// same volume is connected anew. (No scheduler hint places it: a server
// keeps its hints, and an unshelve honours them as Nova's does.) jump
// reaches the tenant's private network (SSH through web). Delete takes
// the volume with the server.
func (l *netlab) networkDiskAcrossHosts(ctx context.Context, tn *labTenant, jump testenv.Dial, hosts [2]string) {
	t := l.t
	t.Helper()
	start := time.Now()
	adm := testenv.Compute(t, l.admin, "2.91")
	flavor := tn.q.flavor(ctx, "lab.1c.net", 1, 256, 1)
	_, err := flavors.CreateExtraSpecs(ctx, adm, flavor, flavors.ExtraSpecsOpts{"nimbus:disk_type": "network"}).Extract()
	must(t, err)
	id, ip, from := tn.boot(ctx, l, "vault", flavor)
	to := hosts[0]
	if from == to {
		to = hosts[1]
	}
	bs, err := openstack.NewBlockStorageV3(tn.q.demo, gophercloud.EndpointOpts{})
	must(t, err)
	root := func() volumes.Volume {
		t.Helper()
		pages, err := volumes.List(bs, volumes.ListOpts{}).AllPages(ctx)
		must(t, err)
		all, err := volumes.ExtractVolumes(pages)
		must(t, err)
		for _, v := range all {
			for _, a := range v.Attachments {
				if a.ServerID == id {
					return v
				}
			}
		}
		t.Fatalf("no volume attached to vault %s: %+v", id, all)
		return volumes.Volume{}
	}
	vol := root()
	if vol.Size != 1 || vol.Bootable != "true" {
		t.Errorf("vault's root volume: size %d bootable %s, want 1 and true", vol.Size, vol.Bootable)
	}
	vm := l.vmVia(tn, jump, id, ip)
	if out, err := vm.run("echo kept-on-the-volume > /root/mark && sync && cat /root/mark"); err != nil || out != "kept-on-the-volume" {
		t.Fatalf("write on vault's root: %v\n%s", err, out)
	}
	imageCount := func() int {
		pages, err := images.List(tn.q.image, images.ListOpts{}).AllPages(ctx)
		must(t, err)
		all, err := images.ExtractImages(pages)
		must(t, err)
		return len(all)
	}
	before := imageCount()
	must(t, servers.Shelve(ctx, tn.q.compute, id).ExtractErr())
	tn.q.waitStatus(ctx, id, "SHELVED_OFFLOADED")
	if n := imageCount(); n != before {
		t.Errorf("shelving a network-disk server: %d images, had %d (none should be uploaded)", n, before)
	}
	if p := qemuProcesses(id); len(p) != 0 {
		t.Errorf("shelved vault still has QEMU processes %v", p)
	}
	if v := root(); v.ID != vol.ID || v.Status != "in-use" {
		t.Errorf("while shelved, vault's volume %s is %s, want %s in-use", v.ID, v.Status, vol.ID)
	}
	// An admin unshelves it onto the other host (Nova's 2.91 host).
	_, err = adm.Post(ctx, adm.ServiceURL("servers", id, "action"), map[string]any{"unshelve": map[string]any{"host": to}}, nil,
		&gophercloud.RequestOpts{OkCodes: []int{202}})
	must(t, err)
	var shown struct {
		Server map[string]any `json:"server"`
	}
	for deadline := time.Now().Add(vmTimeout); ; time.Sleep(200 * time.Millisecond) {
		shown.Server = nil
		_, err := adm.Get(ctx, adm.ServiceURL("servers", id), &shown, nil)
		if err == nil && shown.Server["status"] == "ACTIVE" && shown.Server["OS-EXT-STS:task_state"] == nil {
			break
		}
		if time.Now().After(deadline) {
			var acts any
			adm.Get(ctx, adm.ServiceURL("servers", id, "os-instance-actions"), &acts, nil)
			t.Fatalf("vault not ACTIVE on %s within %v: %v\nactions: %v\n%s\n%s", to, vmTimeout, shown.Server, acts,
				l.agents[to].tail(), l.ctl.tail())
		}
	}
	if h, _ := shown.Server["OS-EXT-SRV-ATTR:host"].(string); h != to {
		t.Errorf("vault unshelved on %q, want %s", h, to)
	}
	var out string
	waitFor(t, vmTimeout, "vault's file after unshelve on "+to, func() bool {
		out, err = vm.run("cat /root/mark")
		return err == nil
	}, l.ctl)
	if strings.TrimSpace(out) != "kept-on-the-volume" {
		t.Errorf("after unshelve onto %s, /root/mark is %q", to, out)
	}
	t.Logf("network disk: boot, write, shelve and unshelve from %s onto %s took %v", from, to, time.Since(start).Round(100*time.Millisecond))
	must(t, servers.Delete(ctx, tn.q.compute, id).ExtractErr())
	waitGone(t, tn.q.compute, id)
	waitFor(t, 60*time.Second, "vault's volume deleted with it", func() bool {
		_, err := volumes.Get(ctx, bs, vol.ID).Extract()
		return gophercloud.ResponseCodeIs(err, 404)
	}, l.ctl)
}
