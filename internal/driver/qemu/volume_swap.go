package qemu

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"nimbus/internal/driver"
	"nimbus/internal/qmp"
)

var _ driver.VolumeSwapper = (*Driver)(nil)

// SwapVolume moves a running server's disk from volume oldID to vol in
// its QEMU: vol's objects and node tree are added (no device), a mirror
// job copies the old tree's data into the new one while the guest writes
// and switches the device onto it (qmp.Mirror), the old tree and its
// objects are deleted, and vol takes oldID's place in the record. The
// device stays (its id and serial are the old volume's until the next
// start builds it anew from the record). The server's lock is held
// meanwhile, so nothing else changes its disks under the job.
func (d *Driver) SwapVolume(ctx context.Context, id, oldID string, vol driver.Volume) error {
	if err := validVolume(vol); err != nil {
		return fmt.Errorf("qemu: swap volume: %w", err)
	}
	v, err := d.acquire(ctx, id)
	if err != nil {
		return err
	}
	defer d.release(v)
	old, ok := v.volume(oldID)
	if !ok {
		if _, done := v.volume(vol.ID); done {
			return nil
		}
		return fmt.Errorf("qemu: server %s: swap volume %s: %w", id, oldID, driver.ErrNotFound)
	}
	if v.want() == wantSuspended {
		// The saved state has the old disk's nodes.
		return fmt.Errorf("qemu: server %s: swap volume %s: the server is suspended", id, oldID)
	}
	p := v.current()
	if p == nil || p.mon == nil {
		return fmt.Errorf("qemu: server %s: swap volume %s: %w", id, oldID, driver.ErrNotRunning)
	}
	vol.Device, vol.Boot = old.Device, old.Boot
	start := time.Now()
	if err := d.swapVolumeDisk(ctx, p.mon, v.dir, old, vol); err != nil {
		return fmt.Errorf("qemu: server %s: swap volume %s to %s: %w", id, oldID, vol.ID, err)
	}
	if err := d.replaceVolume(v, old, vol); err != nil {
		return err
	}
	d.log.Info("qemu: volume swapped", "server", id, "old", oldID, "new", vol.ID, "took", time.Since(start))
	return nil
}

// swapVolumeDisk does SwapVolume's work in a live QEMU. A swap cut short is
// taken up again: when the device already uses vol's nodes, only the old
// tree is left to delete.
func (d *Driver) swapVolumeDisk(ctx context.Context, mon *qmp.Monitor, dir string, old, vol driver.Volume) (err error) {
	dev, err := diskOf(ctx, mon, old.ID)
	if err != nil {
		return err
	}
	if dev == "" {
		if dev, err = diskOf(ctx, mon, vol.ID); err != nil {
			return err
		}
		if dev == "" {
			return fmt.Errorf("the disk is not plugged: %w", driver.ErrNotFound)
		}
		return cleanVolume(ctx, mon, old) // switched before a restart
	}
	from := namesOf(old.ID, throttled(old.Throttle))
	size, err := mon.NodeSize(ctx, from.fmt)
	if err != nil {
		return err
	}
	// What an attempt cut short left would make the adds fail.
	cleanVolume(context.WithoutCancel(ctx), mon, vol)
	if _, err := stashVolumeKeys(dir, []driver.Volume{vol}); err != nil {
		return err
	}
	switched := false
	defer func() {
		if err != nil && !switched {
			cleanVolume(context.WithoutCancel(ctx), mon, vol)
			removeVolumeKeys(dir, vol)
		}
	}()
	if err := d.volumeFiles(dir, []driver.Volume{vol}); err != nil {
		return err
	}
	to := namesOf(vol.ID, throttled(vol.Throttle))
	if err := addNodes(ctx, mon, dir, vol, 0); err != nil {
		return err
	}
	switch got, err := mon.NodeSize(ctx, to.fmt); {
	case err != nil:
		return err
	case got < size:
		return fmt.Errorf("volume %s has %d bytes, fewer than the %d of volume %s", vol.ID, got, size, old.ID)
	case got > size:
		// The mirror wants a target of the source's size: the raw node
		// shows the first size bytes; the next start shows them all.
		if err := cleanVolume(ctx, mon, vol); err != nil {
			return err
		}
		if err := addNodes(ctx, mon, dir, vol, size); err != nil {
			return err
		}
	}
	if err := mon.Mirror(ctx, from.top, to.top); err != nil {
		return err
	}
	switched = true
	if err := cleanVolume(context.WithoutCancel(ctx), mon, old); err != nil {
		// The guest is on vol: the old tree is only left over, and a
		// retry (the device found on vol's nodes) deletes it.
		return errors.Join(errLeftover, err)
	}
	return nil
}

// errLeftover marks a swap whose switch happened but whose old nodes
// could not all be deleted.
var errLeftover = errors.New("the old volume's nodes are left in QEMU")

// addNodes adds vol's objects and node tree to a live QEMU, without a
// device; a size > 0 caps what its raw node shows.
func addNodes(ctx context.Context, mon *qmp.Monitor, dir string, vol driver.Volume, size int64) error {
	parts := volumeSpec(dir, vol, "")
	if size > 0 {
		raw := parts.node
		if raw["driver"] == "throttle" {
			raw = raw["file"].(map[string]any)
		}
		raw["size"] = size
	}
	for _, o := range parts.objects {
		if err := mon.Execute(ctx, "object-add", o, nil); err != nil {
			return fmt.Errorf("object-add %s: %w", o["qom-type"], err)
		}
	}
	if err := mon.Execute(ctx, "blockdev-add", parts.node, nil); err != nil {
		return fmt.Errorf("blockdev-add: %w", err)
	}
	return nil
}

// replaceVolume puts vol in old's place in v's record and removes old's
// key files.
func (d *Driver) replaceVolume(v *vm, old, vol driver.Volume) error {
	err := saveVolumes(v, func(vols []driver.Volume) ([]driver.Volume, error) {
		k := slices.IndexFunc(vols, func(r driver.Volume) bool { return r.ID == old.ID })
		if k < 0 {
			return nil, fmt.Errorf("qemu: volume %s left the record during its swap", old.ID)
		}
		vols[k] = vol
		return vols, nil
	})
	if err == nil {
		removeVolumeKeys(v.dir, old)
	}
	return err
}
