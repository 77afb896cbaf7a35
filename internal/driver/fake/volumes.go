package fake

import (
	"context"
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
