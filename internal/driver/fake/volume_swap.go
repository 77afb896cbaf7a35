package fake

import (
	"context"
	"os"
	"slices"

	"nimbus/internal/driver"
)

var _ driver.VolumeSwapper = (*Driver)(nil)

// SwapVolume stands for a live mirror: a running or paused server's disk
// on volume oldID moves to vol, which takes its place (device name and
// boot flag) among the server's volumes; between file volumes the data
// is copied, and vol keeps its own size. A server that has vol and not
// oldID is done.
func (d *Driver) SwapVolume(ctx context.Context, id, oldID string, vol driver.Volume) error {
	if err := d.exists(id); err != nil {
		return err
	}
	if err := d.wait(ctx, OpSwapVolume); err != nil {
		return err
	}
	old, power, ok, err := d.volumeOf(id, oldID)
	if err != nil {
		return err
	}
	if !ok {
		if _, _, done, err := d.volumeOf(id, vol.ID); err != nil || done {
			return err
		}
		return driver.ErrNotFound
	}
	if power != driver.Running && power != driver.Paused {
		return driver.ErrNotRunning
	}
	if old.Conn.Driver == driver.VolumeFile && vol.Conn.Driver == driver.VolumeFile {
		if err := copyKeepingSize(old.Conn.Path, vol.Conn.Path); err != nil {
			return err
		}
	}
	vol.Device, vol.Boot = old.Device, old.Boot
	return d.change(id, func(v *vm) error {
		k := slices.IndexFunc(v.Spec.Volumes, func(x driver.Volume) bool { return x.ID == oldID })
		if k < 0 {
			return driver.ErrNotFound // detached meanwhile
		}
		v.Spec.Volumes[k] = vol
		return nil
	})
}

// copyKeepingSize copies src's data over dst, which keeps its size when
// it is the larger.
func copyKeepingSize(src, dst string) error {
	fi, err := os.Stat(dst)
	if err != nil {
		return err
	}
	if err := copyInto(src, dst); err != nil {
		return err
	}
	if fs, err := os.Stat(dst); err != nil || fs.Size() >= fi.Size() {
		return err
	}
	return os.Truncate(dst, fi.Size())
}
