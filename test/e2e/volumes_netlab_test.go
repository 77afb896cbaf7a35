package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/volumes"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/volumeattach"

	"nimbus/internal/testenv"
)

// labVM is one of the lab's servers as a volume step needs it: its id,
// and how to run a command in it.
type labVM struct {
	id  string
	run func(command string) (string, error)
}

// volumeAcrossHosts is issue 14's attach over the network on the lab's
// running servers: the controller is the storage node and hosts no VM, so
// both hosts reach the volume over NBD with TLS-PSK. A volume is
// hot-plugged into from, which sees it by its serial and writes to it; it
// is detached (the disk leaves the guest and the controller's export
// stops), attached to to, on the other host, which reads the data back,
// and detached and deleted.
func (l *netlab) volumeAcrossHosts(ctx context.Context, tn *labTenant, from, to labVM) {
	t := l.t
	t.Helper()
	bs, err := openstack.NewBlockStorageV3(tn.q.demo, gophercloud.EndpointOpts{})
	must(t, err)
	v, err := volumes.Create(ctx, bs, volumes.CreateOpts{Size: 1, Name: "lab-data"}, nil).Extract()
	must(t, err)
	status := func(want string) {
		t.Helper()
		waitFor(t, 60*time.Second, "volume "+want, func() bool {
			got, err := volumes.Get(ctx, bs, v.ID).Extract()
			if want == "deleted" {
				return gophercloud.ResponseCodeIs(err, 404)
			}
			return err == nil && got.Status == want
		}, l.ctl)
	}
	status("available")
	pattern := "nimbus-volume-" + v.ID[:8]
	// disk waits in the guest for the disk with the volume's serial (the
	// first 20 characters of its id, as virtio-blk keeps them) and prints
	// its name; gone waits for it to leave.
	disk := func(present bool) string {
		test := `[ -n "$d" ]`
		if !present {
			test = `[ -z "$d" ]`
		}
		return fmt.Sprintf(`i=0; while [ $i -lt 300 ]; do d=; for b in /sys/block/vd*; do [ "$(cat $b/serial 2>/dev/null)" = %q ] && d=$(basename $b); done
%s && { echo "disk=$d"; exit 0; }; sleep 0.1; i=$((i+1)); done; echo "no change: disk=$d"; exit 1`, v.ID[:20], test)
	}
	attach := func(vm labVM) string {
		t.Helper()
		start := time.Now()
		if _, err := volumeattach.Create(ctx, tn.q.compute, vm.id, volumeattach.CreateOpts{VolumeID: v.ID}).Extract(); err != nil {
			t.Fatalf("attach %s to %s: %v", v.ID, vm.id, err)
		}
		status("in-use")
		out, err := vm.run(disk(true))
		if err != nil {
			t.Fatalf("the volume's disk in %s: %v\n%s\n%s", vm.id, err, out, l.ctl.tail())
		}
		t.Logf("attach to %s: visible in the guest after %v", vm.id, time.Since(start).Round(10*time.Millisecond))
		return strings.TrimPrefix(strings.TrimSpace(out), "disk=")
	}
	detach := func(vm labVM) {
		t.Helper()
		must(t, volumeattach.Delete(ctx, tn.q.compute, vm.id, v.ID).ExtractErr())
		status("available")
		if out, err := vm.run(disk(false)); err != nil {
			t.Errorf("the volume's disk still in %s after detach: %v\n%s", vm.id, err, out)
		}
		// The controller stops serving it: no daemon of its exports left.
		waitFor(t, 10*time.Second, "the controller's export gone", func() bool {
			return exec.Command("pgrep", "-f", "qemu-storage-daemon.*"+l.ctlDir).Run() != nil
		})
	}

	dev := attach(from)
	write := fmt.Sprintf(`printf '%%s' %q > /tmp/pattern && dd if=/tmp/pattern of=/dev/%s bs=%d count=1 conv=fsync 2>/dev/null && sync && echo written`,
		pattern, dev, len(pattern))
	if out, err := from.run(write); err != nil || !strings.Contains(out, "written") {
		t.Fatalf("write to /dev/%s in %s: %v\n%s", dev, from.id, err, out)
	}
	detach(from)

	dev = attach(to)
	out, err := to.run(fmt.Sprintf(`dd if=/dev/%s bs=%d count=1 2>/dev/null`, dev, len(pattern)))
	if err != nil || strings.TrimSpace(out) != pattern {
		t.Errorf("read back in %s on the other host: %v: %q, want %q", to.id, err, out, pattern)
	}
	detach(to)
	must(t, volumes.Delete(ctx, bs, v.ID, nil).ExtractErr())
	status("deleted")
}

// vmVia is a labVM reached by SSH through jump (a server with a floating
// IP) at its private address.
func (l *netlab) vmVia(tn *labTenant, jump testenv.Dial, id, ip string) labVM {
	return labVM{id: id, run: func(command string) (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), vmTimeout)
		defer cancel()
		out, err := testenv.SSHVia(ctx, jump, ip+":22", "root", tn.q.key, command)
		return strings.TrimSpace(out), err
	}}
}
