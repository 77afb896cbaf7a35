package fake

import (
	"context"
	"errors"
	"io"
	"os"
	"syscall"

	"nimbus/internal/driver"
)

// OpCopyVolume is CopyVolume's name for FailNext.
const OpCopyVolume = "copy_volume"

var _ driver.VolumeCopier = (*Driver)(nil)

// CopyVolume stands for a live copy: a running or paused server's volume
// is copied into target (a file volume's data; a remote one's target is
// left as it is, the fake has no NBD client), and counted (Copies). A
// server whose VM does not run answers driver.ErrNotRunning.
func (d *Driver) CopyVolume(ctx context.Context, id, volumeID, target string) error {
	if err := d.exists(id); err != nil {
		return err
	}
	if err := d.wait(ctx, OpCopyVolume); err != nil {
		return err
	}
	vol, power, ok, err := d.volumeOf(id, volumeID)
	switch {
	case err != nil:
		return err
	case !ok:
		return driver.ErrNotFound
	case power != driver.Running && power != driver.Paused:
		return driver.ErrNotRunning
	}
	if vol.Conn.Driver == driver.VolumeFile {
		if err := copyInto(vol.Conn.Path, target); err != nil {
			return err
		}
	}
	d.mu.Lock()
	if d.copies == nil {
		d.copies = map[string]int{}
	}
	d.copies[volumeID]++
	d.mu.Unlock()
	return nil
}

// Copies is how many times CopyVolume copied volume volumeID.
func (d *Driver) Copies(volumeID string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.copies[volumeID]
}

// copyInto writes src's bytes over the existing file dst, which becomes
// src's size. It copies src's data extents only (SEEK_DATA, SEEK_HOLE),
// as QEMU's backup job skips what was never written: a mostly empty
// volume of many GiB copies at the speed of its data.
func copyInto(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer out.Close()
	// What dst held goes: src's holes must read as zeros there too.
	if err := out.Truncate(0); err != nil {
		return err
	}
	if err := out.Truncate(fi.Size()); err != nil {
		return err
	}
	const seekData, seekHole = 3, 4 // Linux's lseek whence values
	for off := int64(0); off < fi.Size(); {
		start, err := in.Seek(off, seekData)
		if errors.Is(err, syscall.ENXIO) {
			break // no data past off
		}
		if err != nil {
			return err
		}
		end, err := in.Seek(start, seekHole)
		if err != nil {
			return err
		}
		if _, err := in.Seek(start, io.SeekStart); err != nil {
			return err
		}
		if _, err := out.Seek(start, io.SeekStart); err != nil {
			return err
		}
		if _, err := io.CopyN(out, in, end-start); err != nil {
			return err
		}
		off = end
	}
	return out.Close()
}
