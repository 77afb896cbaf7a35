package compute_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/snapshots"

	"nimbus/internal/driver"
	"nimbus/internal/testenv"
)

// TestVolumeCopyLive: a forced snapshot of a volume attached to a running
// server is copied by the driver (compute → fleet → the local agent →
// the fake's CopyVolume); once the server is stopped the volume service
// copies the file itself. Compute copies only a volume the server has
// attached.
func TestVolumeCopyLive(t *testing.T) {
	e := newVolEnv(t, "")
	ctx := context.Background()
	vol := e.volume()
	e.attach(e.server, "2.96", `{"volumeAttachment":{"volumeId":"`+vol+`"}}`)
	e.volumeStatus(vol, "in-use")
	snap := func() {
		t.Helper()
		sn, err := snapshots.Create(ctx, e.bs, snapshots.CreateOpts{VolumeID: vol, Force: true}).Extract()
		if err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 20*time.Second, "snapshot available", func() bool {
			s, err := snapshots.Get(ctx, e.bs, sn.ID).Extract()
			return err == nil && s.Status == "available"
		})
	}
	snap()
	if n := e.c.Fake.Copies(vol); n != 1 {
		t.Errorf("the driver copied the volume %d times, want 1", n)
	}

	other := e.volume()
	if err := e.c.Compute.CopyVolumeLive(ctx, e.server, other, "/tmp/none"); err == nil || errors.Is(err, driver.ErrNotRunning) {
		t.Errorf("CopyVolumeLive of a volume the server does not have: %v", err)
	}

	e.must(202, "POST", "/servers/"+e.server+"/action", e.demo, "2.96", `{"os-stop":null}`)
	e.wait(e.server, e.demo, "SHUTOFF")
	snap()
	if n := e.c.Fake.Copies(vol); n != 1 {
		t.Errorf("the driver copied a stopped server's volume: %d copies", n)
	}
}
