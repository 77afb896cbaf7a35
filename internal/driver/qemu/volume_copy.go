package qemu

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"nimbus/internal/driver"
	"nimbus/internal/qmp"
)

var _ driver.VolumeCopier = (*Driver)(nil)

// CopyVolume copies volume volumeID's disk, as it is now, into the file
// at target, inside the server's running QEMU (qmp.Backup of the disk's
// raw format node, below any throttle, so the copy is not throttled):
// the guest goes on writing and the copy is its disk at one instant. The
// file is opened here and handed to QEMU as a descriptor, so a QEMU that
// runs as --qemu-user needs no right to it. The server's lock is held
// meanwhile, so the disk cannot be detached under the job.
func (d *Driver) CopyVolume(ctx context.Context, id, volumeID, target string) error {
	if !filepath.IsAbs(target) {
		return fmt.Errorf("qemu: copy volume %s: target %q is not absolute", volumeID, target)
	}
	v, err := d.acquire(ctx, id)
	if err != nil {
		return err
	}
	defer d.release(v)
	vol, ok := v.volume(volumeID)
	if !ok {
		return fmt.Errorf("qemu: server %s: copy volume %s: %w", id, volumeID, driver.ErrNotFound)
	}
	p := v.current()
	if p == nil || p.mon == nil {
		return fmt.Errorf("qemu: server %s: copy volume %s: %w", id, volumeID, driver.ErrNotRunning)
	}
	n := namesOf(vol.ID, throttled(vol.Throttle))
	if dev, err := diskOf(ctx, p.mon, vol.ID); err != nil {
		return fmt.Errorf("qemu: server %s: copy volume %s: %w", id, volumeID, err)
	} else if dev == "" {
		return fmt.Errorf("qemu: server %s: copy volume %s: the disk is not plugged: %w", id, volumeID, driver.ErrNotFound)
	}
	f, err := os.OpenFile(target, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("qemu: copy volume %s: %w", volumeID, err)
	}
	defer f.Close()
	start := time.Now()
	if err := p.mon.Backup(ctx, n.fmt, qmp.BackupTarget{File: f}); err != nil {
		return fmt.Errorf("qemu: server %s: copy volume %s: %w", id, volumeID, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("qemu: copy volume %s: %w", volumeID, err)
	}
	d.log.Info("qemu: volume copied live", "server", id, "volume", volumeID, "took", time.Since(start))
	return nil
}
