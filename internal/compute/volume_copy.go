package compute

import (
	"context"
	"fmt"

	"nimbus/internal/driver"
	"nimbus/internal/volume"
)

// Compute copies the volumes its running servers have open.
var _ volume.LiveCopier = (*Service)(nil)

// CopyVolumeLive is the volume service's snapshot of an in-use volume
// that a server on the storage node's own host opens directly: the
// driver copies the disk from the server's running VM into target (a
// file the volume service made on that host), as the guest sees it at
// one instant. The volume must be attached to the server (compute's own
// record, not the caller's word); a server without a running or paused
// VM answers driver.ErrNotRunning, and the volume service copies the file
// itself, nothing writing it.
func (s *Service) CopyVolumeLive(ctx context.Context, serverID, volumeID, target string) error {
	sv, err := s.loadServer(ctx, s.db, serverID, false)
	if err != nil {
		return err
	}
	if sv.Deleted {
		return driver.ErrNotRunning
	}
	atts, err := s.serverAttachments(ctx, s.db, sv.ID)
	if err != nil {
		return err
	}
	if a, ok := attachmentOf(atts, volumeID); !ok || a.Status != volume.AttachAttached {
		return fmt.Errorf("compute: volume %s is not attached to server %s", volumeID, sv.ID)
	}
	// The driver knows best whether the VM runs; a server recorded as
	// powered off (or suspended: its QEMU is gone) is not asked.
	switch driver.PowerState(sv.Power) {
	case driver.Shutdown, driver.Crashed, driver.Suspended:
		return driver.ErrNotRunning
	}
	if volumeVMHost(sv) == "" {
		return driver.ErrNotRunning
	}
	c, ok := s.driver.(driver.VolumeCopier)
	if !ok {
		return driver.ErrNotRunning
	}
	ctx = driver.WithOpKey(ctx, sv.ID+"/volume-copy/"+volumeID+"/"+target)
	return c.CopyVolume(ctx, sv.ID, volumeID, target)
}
