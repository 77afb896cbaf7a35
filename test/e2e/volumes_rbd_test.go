package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/volumes"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/keypairs"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/volumeattach"

	"nimbus/internal/cloud"
	"nimbus/internal/rbd"
	"nimbus/internal/testenv"
)

// TestQEMUVolumeRBD runs a cloud whose volumes are RBD images in a
// one-node Ceph and whose local agent runs real VMs: a volume attached
// through Nova reaches the running guest over QEMU's rbd driver, the
// guest's write lands in the image, and the volume's delete removes it.
func TestQEMUVolumeRBD(t *testing.T) {
	guest := testenv.TestGuest(t)
	ceph := testenv.StartCeph(t)
	c := testenv.StartCloud(t, "", func(cfg *cloud.Config) {
		cfg.DataDir = vmDir(t)
		cfg.Driver = "qemu"
		cfg.QEMU = cloud.QEMUOptions{Accel: "auto", ReservedCPUs: []int{}, ReservedMemoryMB: -1, AccessHost: "127.0.0.1"}
		cfg.AgentHeartbeat = 2 * time.Second
		cfg.Volumes = cloud.VolumeOptions{Backend: cloud.VolumeBackendRBD, RBD: cloud.RBDOptions{
			Conf: ceph.Conf, Keyring: ceph.Keyring, User: ceph.Client, Pool: testenv.VolumesPool, BackupPool: testenv.BackupsPool}}
	})
	q := &qemuCloud{t: t, c: c, guest: guest,
		admin: testenv.Provider(t, c, cloud.AdminUser), demo: testenv.Provider(t, c, cloud.DemoUser)}
	q.compute = testenv.Compute(t, q.demo, "2.79")
	var err error
	if q.image, err = openstack.NewImageV2(q.demo, gophercloud.EndpointOpts{}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	signer, pub := testenv.NewSSHKey(t)
	q.key = signer
	if _, err := keypairs.Create(ctx, q.compute, keypairs.CreateOpts{Name: "e2e", PublicKey: pub}).Extract(); err != nil {
		t.Fatal(err)
	}
	sv := q.create(ctx, "rbd-1", q.uploadGuest(ctx), q.flavor(ctx, "e2e.rbd", 1, 256, 1))

	bs, err := openstack.NewBlockStorageV3(q.demo, gophercloud.EndpointOpts{})
	must(t, err)
	v, err := volumes.Create(ctx, bs, volumes.CreateOpts{Size: 1, Name: "rbd-data"}, nil).Extract()
	must(t, err)
	status := func(want string) {
		t.Helper()
		waitFor(t, 60*time.Second, "volume "+want, func() bool {
			got, err := volumes.Get(ctx, bs, v.ID).Extract()
			if want == "deleted" {
				return gophercloud.ResponseCodeIs(err, 404)
			}
			return err == nil && got.Status == want
		})
	}
	status("available")
	disk := func(present bool) string {
		test := `[ -n "$d" ]`
		if !present {
			test = `[ -z "$d" ]`
		}
		return fmt.Sprintf(`i=0; while [ $i -lt 300 ]; do d=; for b in /sys/block/vd*; do [ "$(cat $b/serial 2>/dev/null)" = %q ] && d=$(basename $b); done
%s && { echo "disk=$d"; exit 0; }; sleep 0.1; i=$((i+1)); done; echo "no change: disk=$d"; exit 1`, v.ID[:20], test)
	}

	start := time.Now()
	if _, err := volumeattach.Create(ctx, q.compute, sv.ID, volumeattach.CreateOpts{VolumeID: v.ID}).Extract(); err != nil {
		t.Fatalf("attach: %v", err)
	}
	status("in-use")
	dev := strings.TrimPrefix(q.ssh(ctx, sv.ID, disk(true)), "disk=")
	t.Logf("rbd volume visible in the guest as %s %v after the attach call", dev, time.Since(start).Round(10*time.Millisecond))
	pattern := "nimbus-rbd-" + v.ID[:8]
	if out := q.ssh(ctx, sv.ID, fmt.Sprintf(`printf '%%s' %q > /tmp/p && dd if=/tmp/p of=/dev/%s bs=%d count=1 conv=fsync 2>/dev/null && sync && echo written`,
		pattern, dev, len(pattern))); !strings.Contains(out, "written") {
		t.Fatalf("write in the guest: %q", out)
	}
	must(t, volumeattach.Delete(ctx, q.compute, sv.ID, v.ID).ExtractErr())
	status("available")
	q.ssh(ctx, sv.ID, disk(false))

	st, err := rbd.New(rbd.Config{Conf: ceph.Conf, Keyring: ceph.Keyring, User: ceph.Client, Pool: testenv.VolumesPool})
	must(t, err)
	file := filepath.Join(t.TempDir(), "volume.raw")
	must(t, st.ExportFile(ctx, rbd.VolumeName(v.ID), "", file))
	f, err := os.Open(file)
	must(t, err)
	defer f.Close()
	got := make([]byte, len(pattern))
	if _, err := f.ReadAt(got, 0); err != nil || string(got) != pattern {
		t.Errorf("the image holds %q, want the guest's %q", got, pattern)
	}
	must(t, volumes.Delete(ctx, bs, v.ID, nil).ExtractErr())
	status("deleted")
	if ok, err := st.Exists(ctx, rbd.VolumeName(v.ID)); ok || err != nil {
		t.Errorf("the deleted volume's image is still there (%v)", err)
	}
}
