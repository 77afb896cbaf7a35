package compute_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/snapshots"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/volumes"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"

	"nimbus/internal/cloud"
	"nimbus/internal/testenv"
)

// bfvEnv is a cloud with demo's block storage client and no server yet.
type bfvEnv struct {
	*volEnv
}

func newBFVEnv(t *testing.T, dbURL string) *bfvEnv {
	e := &volEnv{env: newEnv(t, dbURL)}
	var err error
	if e.bs, err = openstack.NewBlockStorageV3(testenv.Provider(t, e.c, cloud.DemoUser), gophercloud.EndpointOpts{Region: "RegionOne"}); err != nil {
		t.Fatal(err)
	}
	return &bfvEnv{e}
}

// createBDM posts a create with block_device_mapping_v2 bdms (JSON) and
// no imageRef, and returns the status and body.
func (e *bfvEnv) createBDM(mv, bdms, extra string) (int, map[string]any) {
	return e.createMapped(mv, "block_device_mapping_v2", bdms, extra)
}

// createMapped is createBDM with the mappings under key.
func (e *bfvEnv) createMapped(mv, key, bdms, extra string) (int, map[string]any) {
	e.t.Helper()
	body := fmt.Sprintf(`{"server":{"name":"bfv","flavorRef":%q,"networks":"auto",%q:%s%s}}`, e.flavorID, key, bdms, extra)
	st, m, _ := e.do("POST", "/servers", e.demo, mv, body)
	return st, m
}

// volumeOf reads a volume of demo's.
func (e *bfvEnv) volumeOf(id string) *volumes.Volume {
	e.t.Helper()
	v, err := volumes.Get(context.Background(), e.bs, id).Extract()
	if err != nil {
		e.t.Fatalf("volume %s: %v", id, err)
	}
	return v
}

// attachedIDs are the ids of a server view's volumes_attached.
func attachedIDs(s map[string]any) []string {
	var ids []string
	for _, x := range s["os-extended-volumes:volumes_attached"].([]any) {
		ids = append(ids, x.(map[string]any)["id"].(string))
	}
	return ids
}

// TestBootFromVolumeSources boots a server from a volume made from an
// image, from a snapshot, and from an existing volume (with a blank data
// volume beside it), checks what the API and the driver see, that the
// root volume cannot be detached, and what its delete leaves.
func TestBootFromVolumeSources(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newBFVEnv(t, dbURL)
		ctx := context.Background()
		// A bootable volume and a snapshot of it, demo's.
		src := e.volume()
		snap, err := snapshots.Create(ctx, e.bs, snapshots.CreateOpts{VolumeID: src, Name: "s"}).Extract()
		if err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 20e9, "snapshot available", func() bool {
			s, err := snapshots.Get(ctx, e.bs, snap.ID).Extract()
			return err == nil && s.Status == "available"
		})
		existing, legacy := e.volume(), e.volume()
		for _, tc := range []struct {
			name, key, bdms string
			// keep: the boot volume outlives the server (no
			// delete_on_termination), made: compute made it.
			keep, made bool
			volumes    int
		}{
			{"image", "", `[{"source_type":"image","destination_type":"volume","uuid":"` + e.imageID + `","boot_index":0,"volume_size":10,"delete_on_termination":true}]`, false, true, 1},
			{"snapshot", "", `[{"source_type":"snapshot","destination_type":"volume","uuid":"` + snap.ID + `","boot_index":"0"}]`, true, true, 1},
			{"legacy volume", "block_device_mapping", `[{"volume_id":"` + legacy + `","device_name":"vda","delete_on_termination":false}]`, true, false, 1},
			{"volume and blank", "", `[{"source_type":"volume","uuid":"` + existing + `","boot_index":0},
				{"source_type":"blank","destination_type":"volume","volume_size":1,"boot_index":-1,"delete_on_termination":true,"tag":"data"}]`, true, false, 2},
		} {
			t.Run(tc.name, func(t *testing.T) {
				e.t = t
				key := tc.key
				if key == "" {
					key = "block_device_mapping_v2"
				}
				st, m := e.createMapped("2.96", key, tc.bdms, "")
				if st != 202 {
					t.Fatalf("create: %d %v", st, m)
				}
				id := m["server"].(map[string]any)["id"].(string)
				s := e.wait(id, e.demo, "ACTIVE")
				if s["image"] != "" {
					t.Errorf("image %v, want \"\" for a server booted from a volume", s["image"])
				}
				ids := attachedIDs(s)
				if len(ids) != tc.volumes {
					t.Fatalf("volumes_attached %v", ids)
				}
				atts := e.must(200, "GET", "/servers/"+id+"/os-volume_attachments", e.demo, "2.96", "")["volumeAttachments"].([]any)
				boot := ""
				for _, a := range atts {
					a := a.(map[string]any)
					if a["device"] == "/dev/vda" {
						boot = a["volumeId"].(string)
					}
				}
				if boot == "" || (!tc.made && boot != existing && boot != legacy) {
					t.Fatalf("attachments %v: no boot volume on /dev/vda", atts)
				}
				sp, ok := e.c.Fake.Spec(id)
				if !ok || len(sp.Volumes) != tc.volumes || sp.Volumes[0].ID != boot || !sp.Volumes[0].Boot || sp.DiskGB != 0 {
					t.Fatalf("driver spec: %+v", sp)
				}
				if e.c.Fake.BootVolume(id) != boot {
					t.Errorf("the fake VM boots from %q, want %s", e.c.Fake.BootVolume(id), boot)
				}
				if v := e.volumeOf(boot); v.Status != "in-use" || v.UserID == "" {
					t.Errorf("boot volume %+v", v)
				}
				// Charged once: the volume as a volume, the server without
				// the flavor's root disk, which it does not use.
				var srvSpec, volSpec string
				if err := e.c.DB.QueryRow(context.Background(), "SELECT spec FROM metering_periods WHERE resource_id = ? AND ended_at = ''", id).Scan(&srvSpec); err != nil ||
					strings.Contains(srvSpec, "disk_gb") {
					t.Errorf("server usage %q %v", srvSpec, err)
				}
				if err := e.c.DB.QueryRow(context.Background(), "SELECT spec FROM metering_periods WHERE resource_id = ? AND ended_at = ''", boot).Scan(&volSpec); err != nil ||
					!strings.Contains(volSpec, "size_gb") {
					t.Errorf("boot volume usage %q %v", volSpec, err)
				}
				st, m, _ = e.do("DELETE", "/servers/"+id+"/os-volume_attachments/"+boot, e.demo, "2.96", "")
				if st != 400 || !strings.Contains(fmt.Sprint(m), "Can't detach root device volume") {
					t.Errorf("detach root: %d %v", st, m)
				}
				e.must(204, "DELETE", "/servers/"+id, e.demo, "2.96", "")
				for _, v := range ids {
					want := "deleted"
					if v == boot && tc.keep {
						want = "available"
					}
					e.volumeStatus(v, want)
				}
			})
		}
	})
}

// TestBootFromVolumeRefused: bad mappings, someone else's volume, a
// volume in use and the block storage quota are 400s and 403s with
// Nova's messages, and nothing is left behind.
func TestBootFromVolumeRefused(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newBFVEnv(t, dbURL)
		ctx := context.Background()
		adminBS, err := openstack.NewBlockStorageV3(testenv.Provider(t, e.c, cloud.AdminUser), gophercloud.EndpointOpts{Region: "RegionOne"})
		if err != nil {
			t.Fatal(err)
		}
		theirs, err := volumes.Create(ctx, adminBS, volumes.CreateOpts{Size: 1}, nil).Extract()
		if err != nil {
			t.Fatal(err)
		}
		busy := e.volume()
		holder := e.create(e.demo, "2.96", "")
		e.wait(holder, e.demo, "ACTIVE")
		e.attach(holder, "2.96", `{"volumeAttachment":{"volumeId":"`+busy+`"}}`)
		e.volumeStatus(busy, "in-use")
		img := func(extra string) string {
			return `[{"source_type":"image","destination_type":"volume","uuid":"` + e.imageID + `","boot_index":0` + extra + `}]`
		}
		missing := "6f2a3a55-1d4e-4c3a-9d1e-0b1d2c3e4f50"
		for _, tc := range []struct {
			name, mv, bdms, extra string
			status                int
			want                  string
		}{
			{"bad source type", "2.96", `[{"source_type":"disk","uuid":"x","boot_index":0}]`, "", 400, "'disk' is not one of ['volume', 'image', 'snapshot', 'blank']"},
			{"no uuid", "2.96", `[{"source_type":"volume","destination_type":"volume","boot_index":0}]`, "", 400, "Block Device Mapping is Invalid: Missing device UUID."},
			{"no source type", "2.96", `[{"uuid":"` + missing + `","boot_index":0}]`, "", 400, "Block Device Mapping is Invalid: Invalid source_type field."},
			{"blank without size", "2.96", `[{"source_type":"image","destination_type":"volume","uuid":"` + e.imageID + `","boot_index":0},{"source_type":"blank","destination_type":"volume","boot_index":-1}]`, "", 400, "Blank volumes (source: 'blank', dest: 'volume') need to have non-zero size"},
			{"boot index gap", "2.96", `[{"source_type":"image","destination_type":"volume","uuid":"` + e.imageID + `","boot_index":0},{"source_type":"blank","destination_type":"volume","volume_size":1,"boot_index":2}]`, "", 400, "Boot sequence for the instance and image/block device mapping combination is not valid."},
			{"nothing to boot", "2.96", `[{"source_type":"blank","destination_type":"volume","volume_size":1,"boot_index":-1}]`, "", 400, "Boot sequence for the instance and image/block device mapping combination is not valid."},
			{"bad boot index", "2.96", img(`,"boot_index":"first"`), "", 400, "Invalid input for field/attribute boot_index"},
			{"negative size", "2.96", img(`,"volume_size":-1`), "", 400, "Invalid input for field/attribute volume_size"},
			{"tag before 2.42", "2.41", img(`,"tag":"x"`), "", 400, "Additional properties are not allowed ('tag' was unexpected)"},
			{"volume_type before 2.67", "2.66", img(`,"volume_type":"network"`), "", 400, "Additional properties are not allowed ('volume_type' was unexpected)"},
			{"unknown volume type", "2.96", img(`,"volume_type":"gold"`), "", 400, "Volume type with name gold could not be found."},
			{"unknown image", "2.96", `[{"source_type":"image","destination_type":"volume","uuid":"` + missing + `","boot_index":0}]`, "", 400, "Block Device Mapping is Invalid: failed to get image " + missing + "."},
			{"unknown snapshot", "2.96", `[{"source_type":"snapshot","uuid":"` + missing + `","boot_index":0}]`, "", 400, "Block Device Mapping is Invalid: failed to get snapshot " + missing + "."},
			{"another project's volume", "2.96", `[{"source_type":"volume","uuid":"` + theirs.ID + `","boot_index":0}]`, "", 400, "Block Device Mapping is Invalid: failed to get volume " + theirs.ID + "."},
			{"volume in use", "2.96", `[{"source_type":"volume","uuid":"` + busy + `","boot_index":0}]`, "", 400, "Invalid volume: volume '" + busy + "' status must be 'available'. Currently in 'in-use'"},
			{"both syntaxes", "2.96", img("") + `,"block_device_mapping":[{"volume_id":"` + busy + `"}]`, "", 400, "Using different block_device_mapping syntaxes is not allowed in the same request."},
			{"one volume, two servers", "2.96", `[{"source_type":"volume","uuid":"` + busy + `","boot_index":0}]`, `,"max_count":2`, 400, "Cannot attach one or more volumes to multiple instances"},
			{"volume under the image's min_disk", "2.96", img(`,"volume_size":2`), "", 400, "Volume is smaller than the minimum size specified in image metadata. Volume size is 2147483648 bytes, minimum size is 10737418240 bytes."},
			{"size from the image", "2.96", img(`,"volume_size":0`), "", 202, ""},
		} {
			t.Run(tc.name, func(t *testing.T) {
				e.t = t
				st, m := e.createBDM(tc.mv, tc.bdms, tc.extra)
				if st != tc.status || (tc.want != "" && !strings.Contains(fmt.Sprint(m), tc.want)) {
					t.Errorf("create: %d %v, want %d %q", st, m, tc.status, tc.want)
				}
				if st == 202 {
					id := m["server"].(map[string]any)["id"].(string)
					e.wait(id, e.demo, "ACTIVE")
					e.must(204, "DELETE", "/servers/"+id, e.demo, "2.96", "")
				}
			})
		}
		e.t = t
		// The block storage quota (1000 GB): Nova's 403, and no server or
		// volume made.
		before, err := volumes.List(e.bs, nil).AllPages(ctx)
		if err != nil {
			t.Fatal(err)
		}
		st, m := e.createBDM("2.96", img(`,"volume_size":990`), "")
		if st != 403 || !strings.Contains(fmt.Sprint(m), "Volume resource quota exceeded") {
			t.Errorf("over the gigabytes quota: %d %v", st, m)
		}
		after, _ := volumes.List(e.bs, nil).AllPages(ctx)
		b, _ := volumes.ExtractVolumes(before)
		a, _ := volumes.ExtractVolumes(after)
		if len(a) != len(b) {
			t.Errorf("a refused create left volumes: %d before, %d after", len(b), len(a))
		}
	})
}

// TestNetworkDiskFlavor: a flavor with nimbus:disk_type=network boots its
// image from a volume of the flavor's disk made in block storage; the
// disk is charged once, with the server; shelve uploads no image and
// frees the host, unshelve boots the same volume, and delete removes it.
func TestNetworkDiskFlavor(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newBFVEnv(t, dbURL)
		ctx := context.Background()
		e.flavor("net", 2, 1024, 10, map[string]string{"hw:cpu_policy": "dedicated", "nimbus:disk_type": "network"})
		pc := testenv.Provider(t, e.c, cloud.DemoUser)
		sc := testenv.Compute(t, pc, "2.96")
		srv, err := servers.Create(ctx, sc, servers.CreateOpts{Name: "nd", ImageRef: e.imageID, FlavorRef: "net", Networks: "auto"}, nil).Extract()
		if err != nil {
			t.Fatal(err)
		}
		s := e.wait(srv.ID, e.demo, "ACTIVE")
		if img, _ := s["image"].(map[string]any); img == nil || img["id"] != e.imageID {
			t.Errorf("image %v, want the image asked for", s["image"])
		}
		ids := attachedIDs(s)
		if len(ids) != 1 {
			t.Fatalf("volumes_attached %v", ids)
		}
		root := ids[0]
		v := e.volumeOf(root)
		if v.Size != 10 || v.Status != "in-use" || v.Bootable != "true" || v.VolumeImageMetadata["image_id"] != e.imageID {
			t.Errorf("root volume %+v", v)
		}
		sp, _ := e.c.Fake.Spec(srv.ID)
		if len(sp.Volumes) != 1 || !sp.Volumes[0].Boot || sp.Volumes[0].ID != root || sp.DiskGB != 0 {
			t.Errorf("driver spec volumes %+v disk %d", sp.Volumes, sp.DiskGB)
		}
		// Charged once: the server with its 10 GB network disk, the
		// volume not at all.
		var n int
		if err := e.c.DB.QueryRow(ctx, "SELECT COUNT(*) FROM metering_periods WHERE resource_id = ?", root).Scan(&n); err != nil || n != 0 {
			t.Errorf("root volume usage periods: %d %v", n, err)
		}
		var raw string
		if err := e.c.DB.QueryRow(ctx, "SELECT spec FROM metering_periods WHERE resource_id = ? AND ended_at = ''", srv.ID).Scan(&raw); err != nil ||
			!strings.Contains(raw, `"disk_gb":10`) || !strings.Contains(raw, `"disk_type":"network"`) {
			t.Errorf("server usage period %q %v", raw, err)
		}
		// Grown past the flavor's disk, the excess is charged.
		bs42 := *e.bs
		bs42.Microversion = "3.42" // extend in use
		if err := volumes.ExtendSize(ctx, &bs42, root, volumes.ExtendSizeOpts{NewSize: 12}).ExtractErr(); err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 20e9, "extended", func() bool { return e.volumeOf(root).Size == 12 })
		if err := e.c.DB.QueryRow(ctx, "SELECT spec FROM metering_periods WHERE resource_id = ? AND ended_at = ''", root).Scan(&raw); err != nil ||
			raw != `{"size_gb":2}` {
			t.Errorf("grown root volume usage %q %v", raw, err)
		}

		imagesBefore := e.imageCount()
		e.action(srv.ID, e.demo, "2.96", `{"shelve":null}`, 202)
		s = e.wait(srv.ID, e.demo, "SHELVED_OFFLOADED")
		if s["OS-EXT-SRV-ATTR:host"] != nil {
			t.Errorf("offloaded server on host %v", s["OS-EXT-SRV-ATTR:host"])
		}
		if _, ok := e.c.Fake.Spec(srv.ID); ok {
			t.Errorf("the VM is still on its host")
		}
		if n := e.imageCount(); n != imagesBefore {
			t.Errorf("shelve made an image: %d images, had %d", n, imagesBefore)
		}
		if e.volumeOf(root).Status != "in-use" {
			t.Errorf("shelved root volume %s", e.volumeOf(root).Status)
		}
		// Shelved, the server is not billed: its disk is, as a volume.
		openSpec := func(id string) string {
			var raw string
			if err := e.c.DB.QueryRow(ctx, "SELECT spec FROM metering_periods WHERE resource_id = ? AND ended_at = ''", id).Scan(&raw); err != nil {
				return err.Error()
			}
			return raw
		}
		if got := openSpec(root); got != `{"size_gb":12}` {
			t.Errorf("shelved root volume usage %q", got)
		}
		e.action(srv.ID, e.demo, "2.96", `{"unshelve":null}`, 202)
		e.wait(srv.ID, e.demo, "ACTIVE")
		if e.c.Fake.BootVolume(srv.ID) != root {
			t.Errorf("unshelved VM boots from %q, want %s", e.c.Fake.BootVolume(srv.ID), root)
		}
		if got := openSpec(root); got != `{"size_gb":2}` {
			t.Errorf("unshelved root volume usage %q", got)
		}
		// Resize keeps the volume.
		e.flavor("net2", 4, 2048, 10, map[string]string{"hw:cpu_policy": "dedicated", "nimbus:disk_type": "network"})
		e.action(srv.ID, e.demo, "2.96", `{"resize":{"flavorRef":"net2"}}`, 202)
		e.wait(srv.ID, e.demo, "VERIFY_RESIZE")
		e.action(srv.ID, e.demo, "2.96", `{"confirmResize":null}`, 204)
		e.wait(srv.ID, e.demo, "ACTIVE")
		if e.c.Fake.BootVolume(srv.ID) != root {
			t.Errorf("resized VM boots from %q, want %s", e.c.Fake.BootVolume(srv.ID), root)
		}
		// Rebuild with another image is Nova's 400; with its own it is kept.
		other := ""
		if err := e.c.DB.QueryRow(ctx, "SELECT id FROM images WHERE name = ?", "Ubuntu 24.04").Scan(&other); err != nil {
			t.Fatal(err)
		}
		st, m, _ := e.do("POST", "/servers/"+srv.ID+"/action", e.demo, "2.96", `{"rebuild":{"imageRef":"`+other+`"}}`)
		if st != 400 || !strings.Contains(fmt.Sprint(m), "Unable to rebuild with a different image for a volume-backed server.") {
			t.Errorf("rebuild with another image: %d %v", st, m)
		}
		e.action(srv.ID, e.demo, "2.96", `{"rebuild":{"imageRef":"`+e.imageID+`"}}`, 202)
		e.wait(srv.ID, e.demo, "ACTIVE")
		if e.c.Fake.BootVolume(srv.ID) != root {
			t.Errorf("rebuilt VM boots from %q, want %s", e.c.Fake.BootVolume(srv.ID), root)
		}
		e.must(204, "DELETE", "/servers/"+srv.ID, e.demo, "2.96", "")
		e.volumeStatus(root, "deleted")
	})
}

// imageCount is how many images demo sees.
func (e *bfvEnv) imageCount() int {
	e.t.Helper()
	var n int
	if err := e.c.DB.QueryRow(context.Background(), "SELECT COUNT(*) FROM images").Scan(&n); err != nil {
		e.t.Fatal(err)
	}
	return n
}

// TestVolumeBackedImage: createImage of a server booted from a volume
// takes a Cinder snapshot of the volume and makes an active image of
// size 0 with Nova's block device mapping properties; a server booted
// from that image gets a volume made from the snapshot.
func TestVolumeBackedImage(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newBFVEnv(t, dbURL)
		ctx := context.Background()
		st, m := e.createBDM("2.96", `[{"source_type":"image","destination_type":"volume","uuid":"`+e.imageID+`","boot_index":0,"volume_size":10,"delete_on_termination":true}]`, "")
		if st != 202 {
			t.Fatalf("create: %d %v", st, m)
		}
		first := m["server"].(map[string]any)["id"].(string)
		root := attachedIDs(e.wait(first, e.demo, "ACTIVE"))[0]
		imageID := e.action(first, e.demo, "2.96", `{"createImage":{"name":"golden","metadata":{"purpose":"test"}}}`, 202)["image_id"].(string)
		img := e.must(200, "GET", "/images/"+imageID, e.demo, "2.1", "")["image"].(map[string]any)
		md := img["metadata"].(map[string]any)
		if img["status"] != "ACTIVE" || img["OS-EXT-IMG-SIZE:size"] != 0.0 || md["bdm_v2"] != "True" ||
			md["root_device_name"] != "/dev/vda" || md["purpose"] != "test" || md["instance_uuid"] != first {
			t.Fatalf("image of a volume-backed server: %v", img)
		}
		var mappings []map[string]any
		if err := json.Unmarshal([]byte(md["block_device_mapping"].(string)), &mappings); err != nil || len(mappings) != 1 ||
			mappings[0]["boot_index"] != 0.0 || mappings[0]["source_type"] != "snapshot" || mappings[0]["volume_size"] != 10.0 {
			t.Fatalf("block_device_mapping %v %v", md["block_device_mapping"], err)
		}
		snapID := mappings[0]["snapshot_id"].(string)
		sn, err := snapshots.Get(ctx, e.bs, snapID).Extract()
		if err != nil || sn.VolumeID != root {
			t.Fatalf("snapshot %+v %v", sn, err)
		}
		testenv.Eventually(t, 20e9, "snapshot available", func() bool {
			s, err := snapshots.Get(ctx, e.bs, snapID).Extract()
			return err == nil && s.Status == "available"
		})
		// Boot from the image: a volume from the snapshot.
		body := fmt.Sprintf(`{"server":{"name":"again","imageRef":%q,"flavorRef":%q,"networks":"auto"}}`, imageID, e.flavorID)
		second := e.must(202, "POST", "/servers", e.demo, "2.96", body)["server"].(map[string]any)["id"].(string)
		s := e.wait(second, e.demo, "ACTIVE")
		ids := attachedIDs(s)
		if len(ids) != 1 || s["image"] != "" {
			t.Fatalf("server from the image: volumes %v image %v", ids, s["image"])
		}
		if v := e.volumeOf(ids[0]); v.SnapshotID != snapID || v.Size != 10 {
			t.Errorf("its boot volume %+v", v)
		}
		if e.c.Fake.BootVolume(second) != ids[0] {
			t.Errorf("the VM boots from %q", e.c.Fake.BootVolume(second))
		}
		e.must(204, "DELETE", "/servers/"+second, e.demo, "2.96", "")
		e.volumeStatus(ids[0], "deleted")
	})
}
