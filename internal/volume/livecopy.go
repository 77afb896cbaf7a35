package volume

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/google/uuid"

	"nimbus/internal/driver"
)

// Live copies: a snapshot of an in-use volume (Cinder's force, or
// in-use), and the temporary snapshot a forced backup of an in-use volume
// reads (cinder/backup/api.py create: force backs up an in-use volume,
// through a temporary snapshot the backup driver removes after), are the
// volume at one instant while its guest goes on writing. A plain copy of
// the file would be torn: its start read before some of the guest's
// writes and its end after. So the copy is taken by the process that
// writes the volume, which copies each block before it overwrites it
// (QMP blockdev-backup, sync=full):
//
//   - a server on the storage node's own host opens the file in its QEMU:
//     compute (LiveCopier) has the driver run the copy there, into a file
//     the volume service made;
//   - a server on another host writes through the attachment's NBD export,
//     whose qemu-storage-daemon runs here: the exporter runs the copy in
//     that daemon (liveExporter).
//
// A volume no running VM writes (its server stopped, shelved, or
// attached through Cinder's attachments API only) is copied as a file.

// LiveCopier copies a volume a server's running VM has open, in that VM
// (compute's CopyVolumeLive). It answers driver.ErrNotRunning when no VM
// of the server runs, and the volume service copies the file itself.
type LiveCopier interface {
	CopyVolumeLive(ctx context.Context, serverID, volumeID, target string) error
}

// liveExporter is an Exporter that copies an export's volume inside the
// daemon serving it (blockexport.Exporter.Backup).
type liveExporter interface {
	Backup(ctx context.Context, name, target string) error
}

// SetLiveCopier sets what copies volumes the storage node's own host's
// VMs write (compute, which is made after the volume service); call it
// before serving.
func (s *Service) SetLiveCopier(c LiveCopier) { s.liveCopier = c }

// copyVolume writes volume volID's data, as it is now, into dst (a file
// of size bytes when size > 0, always whole: made aside and renamed): by
// the process that writes it when a running VM has it open, else as a
// file copy.
func (s *Service) copyVolume(ctx context.Context, volID, dst string, size int64) error {
	done, err := s.copyLive(ctx, volID, dst, size)
	if err != nil || done {
		return err
	}
	return copyFile(ctx, s.dataPath(volID), dst, size)
}

// copyLive copies volume volID into dst through the first of its
// connected attachments whose writer can copy it live; done is false when
// none could (nothing writes the volume but its file's owner).
func (s *Service) copyLive(ctx context.Context, volID, dst string, size int64) (done bool, err error) {
	atts, err := attachmentsOf(ctx, s.db, volID)
	if err != nil {
		return false, err
	}
	for _, a := range atts {
		var run func(target string) error
		switch {
		case a.Host == "":
			continue // not connected: no VM has it
		case s.isLocal(a.Host):
			if a.Origin != originCompute || s.liveCopier == nil {
				continue
			}
			run = func(target string) error { return s.liveCopier.CopyVolumeLive(ctx, a.ServerID, volID, target) }
		default:
			le, ok := s.exporter.(liveExporter)
			if !ok || !slices.Contains(s.exporter.Exports(), exportName(a.ID)) {
				continue
			}
			run = func(target string) error { return le.Backup(ctx, exportName(a.ID), target) }
		}
		start := time.Now()
		err := s.liveInto(volID, dst, size, run)
		if errors.Is(err, driver.ErrNotRunning) {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("live copy of volume %s through attachment %s: %w", volID, a.ID, err)
		}
		s.log.Info("volume: copied live", "volume", volID, "attachment", a.ID, "server", a.ServerID, "host", a.Host,
			"took", time.Since(start))
		return true, nil
	}
	return false, nil
}

// liveInto has run copy the volume into a new file beside dst (as large
// as the volume's file; the copy makes it its disk's size, which an NBD
// export that began before an extend keeps smaller), then gives it size
// bytes and renames it to dst.
func (s *Service) liveInto(volID, dst string, size int64, run func(target string) error) error {
	fi, err := os.Stat(s.dataPath(volID))
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return err
	}
	tmp := dst + ".live-" + uuid.NewString()[:8]
	defer os.Remove(tmp)
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Truncate(fi.Size()); err != nil {
		return err
	}
	if err := run(tmp); err != nil {
		return err
	}
	if size > 0 {
		if err := f.Truncate(size); err != nil {
			return err
		}
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

// backupSource is the file a backup reads: a snapshot's backup, the
// snapshot's file; for a volume that was in-use (a forced backup), a
// temporary snapshot copied live when a running VM writes it, which
// release removes; else the volume's own file.
func (s *Service) backupSource(ctx context.Context, b *bkRow) (path string, release func(), err error) {
	path, release = s.dataPath(b.VolumeID), func() {}
	if b.SnapshotID != "" {
		return s.snapPath(b.SnapshotID), release, nil
	}
	if b.VolumeStatus != StatusInUse {
		return path, release, nil
	}
	tmp := filepath.Join(s.dataDir, "snapshots", "backup-"+b.ID)
	done, err := s.copyLive(ctx, b.VolumeID, tmp, b.Size<<30)
	if err != nil || !done {
		return path, release, err
	}
	return tmp, func() { os.Remove(tmp) }, nil
}
