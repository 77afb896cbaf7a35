package fake

import (
	"context"
	"fmt"
	"slices"

	"nimbus/internal/driver"
)

// AttachVolume adds vol to a server's disks (its spec's volumes), as a
// hot-plug does; a volume it has already takes the new connection.
func (d *Driver) AttachVolume(ctx context.Context, id string, vol driver.Volume) error {
	if err := d.exists(id); err != nil {
		return err
	}
	if err := d.wait(ctx, OpAttachVolume); err != nil {
		return err
	}
	return d.change(id, func(v *vm) error {
		k := slices.IndexFunc(v.Spec.Volumes, func(x driver.Volume) bool { return x.ID == vol.ID })
		if k < 0 {
			v.Spec.Volumes = append(v.Spec.Volumes, vol)
		} else {
			v.Spec.Volumes[k] = vol
		}
		return nil
	})
}

// DetachVolume removes volume volumeID from a server's disks; a volume it
// does not have is not an error.
func (d *Driver) DetachVolume(ctx context.Context, id, volumeID string) error {
	if err := d.exists(id); err != nil {
		return err
	}
	if err := d.wait(ctx, OpDetachVolume); err != nil {
		return err
	}
	return d.change(id, func(v *vm) error {
		v.Spec.Volumes = slices.DeleteFunc(v.Spec.Volumes, func(x driver.Volume) bool { return x.ID == volumeID })
		return nil
	})
}

// ExtendVolume records a volume's new size on the server's disk; a volume
// it does not have is driver.ErrNotFound.
func (d *Driver) ExtendVolume(ctx context.Context, id, volumeID string, sizeBytes int64) error {
	if err := d.exists(id); err != nil {
		return err
	}
	if err := d.wait(ctx, OpExtendVolume); err != nil {
		return err
	}
	return d.change(id, func(v *vm) error {
		k := slices.IndexFunc(v.Spec.Volumes, func(x driver.Volume) bool { return x.ID == volumeID })
		if k < 0 {
			return driver.ErrNotFound
		}
		v.Spec.Volumes[k].Conn.SizeBytes = sizeBytes
		return nil
	})
}

// checkBootVolume refuses a spec the qemu driver could not boot: a boot
// volume that is not the first volume, more than one, or one with no
// connection; a spec without one boots its image.
func checkBootVolume(spec driver.Spec) error {
	for i, v := range spec.Volumes {
		if !v.Boot {
			continue
		}
		if i != 0 {
			return fmt.Errorf("fake: spawn %s: boot volume %s is not the first volume", spec.ServerID, v.ID)
		}
		if v.Conn.Driver == "" {
			return fmt.Errorf("fake: spawn %s: boot volume %s has no connection", spec.ServerID, v.ID)
		}
	}
	return nil
}

// bootVolume is the id of the volume the VM boots from, "" when it boots
// its image from its host's disk.
func (v *vm) bootVolume() string {
	if len(v.Spec.Volumes) > 0 && v.Spec.Volumes[0].Boot {
		return v.Spec.Volumes[0].ID
	}
	return ""
}

// BootVolume is the volume server id boots from ("" when it boots its
// image, or is not in the fleet).
func (d *Driver) BootVolume(id string) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if v, ok := d.vms[id]; ok {
		return v.bootVolume()
	}
	return ""
}

// volumeOf is volume volumeID as server id's disks have it (ok false when
// they have none) and the server's power state.
func (d *Driver) volumeOf(id, volumeID string) (vol driver.Volume, power driver.PowerState, ok bool, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	v, found := d.vms[id]
	if !found {
		return vol, power, false, driver.ErrNotFound
	}
	k := slices.IndexFunc(v.Spec.Volumes, func(x driver.Volume) bool { return x.ID == volumeID })
	if k < 0 {
		return vol, v.Power, false, nil
	}
	return v.Spec.Volumes[k], v.Power, true, nil
}
