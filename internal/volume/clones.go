package volume

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"

	"github.com/google/uuid"
	"golang.org/x/sys/unix"

	"nimbus/internal/store"
)

// snapKey prefixes a snapshot's id on the work queue, beside volumes' ids.
const snapKey = "snapshot:"

// snapPath is where snapshot id's data lives: under the volumes' directory.
func (s *Service) snapPath(id string) string { return filepath.Join(s.dataDir, "snapshots", id) }

// processSnapshot does what a snapshot's status asks: copy its volume's
// file (creating) or remove its file and row (deleting), recording the
// outcome in one transaction. An error (the store failed) is retried.
func (s *Service) processSnapshot(ctx context.Context, id string) error {
	sn, err := getSnap(ctx, s.db, id)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) || ctx.Err() != nil {
			return nil
		}
		return err
	}
	switch sn.Status {
	case SnapCreating:
		werr := s.backend.createSnapshot(ctx, sn)
		if ctx.Err() != nil {
			return nil // stopped: the next start resumes it
		}
		status, reason := SnapAvailable, ""
		if werr != nil {
			s.log.Error("volume: snapshot failed", "snapshot", sn.ID, "volume", sn.VolumeID, "error", werr)
			status, reason = SnapError, werr.Error()
		}
		err := s.db.Tx(ctx, func(tx *store.Tx) error {
			_, err := s.setSnapStatus(ctx, tx, sn, status, reason, SnapCreating)
			return err
		})
		if err != nil && ctx.Err() == nil {
			return err
		}
	case SnapDeleting:
		err := s.removeSnapshot(ctx, sn)
		var de *dataError
		if err != nil && !errors.As(err, &de) && ctx.Err() == nil {
			return err
		}
	}
	return nil
}

// takeSnapshot copies the volume's data as it is now to the snapshot's,
// of the snapshot's size (a volume extended meanwhile adds only zeros).
func (s *Service) takeSnapshot(ctx context.Context, sn *snapRow) error {
	path := s.snapPath(sn.ID)
	if fi, err := os.Stat(path); err == nil && fi.Size() == sn.Size<<30 {
		return nil // made before a restart
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return s.copyVolume(ctx, sn.VolumeID, path, sn.Size<<30) // live when a VM writes it (livecopy.go)
}

// removeSnapshot removes a deleting snapshot's data, then its row. Data
// that cannot be removed puts the snapshot in error_deleting, or back in
// available when volumes made from it depend on it (Cinder's manager on
// SnapshotIsBusy), and is the error returned (a *dataError).
func (s *Service) removeSnapshot(ctx context.Context, sn *snapRow) error {
	if err := s.backend.deleteSnapshot(ctx, sn); err != nil {
		s.log.Error("volume: removing snapshot data failed", "snapshot", sn.ID, "error", err)
		status := SnapErrorDeleting
		if errors.Is(err, errSnapshotBusy) {
			status = SnapAvailable
		}
		if rerr := s.db.Tx(ctx, func(tx *store.Tx) error {
			_, err := s.setSnapStatus(ctx, tx, sn, status, err.Error(), SnapDeleting)
			return err
		}); rerr != nil {
			return rerr
		}
		return &dataError{err}
	}
	return s.db.Tx(ctx, func(tx *store.Tx) error {
		_, err := tx.Exec(ctx, "DELETE FROM volume_snapshots WHERE id = ? AND status = ?", sn.ID, SnapDeleting)
		return err
	})
}

// dataError is a failure of the data work that is recorded in the row's
// status: the queue does not retry it.
type dataError struct{ err error }

func (e *dataError) Error() string { return e.err.Error() }
func (e *dataError) Unwrap() error { return e.err }

// copyFile copies src to dst through a temporary file renamed into place,
// so that a file at dst is always whole: a reflink (FICLONE) where the
// file system shares blocks, else a sparse copy of src's data extents.
// size > 0 makes dst exactly that long.
func copyFile(ctx context.Context, src, dst string, size int64) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	tmp := dst + ".tmp-" + uuid.NewString()[:8]
	defer os.Remove(tmp)
	out, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	if err := cloneOrCopy(ctx, in, out); err != nil {
		return err
	}
	if size > 0 {
		if err := out.Truncate(size); err != nil {
			return err
		}
	}
	if err := out.Sync(); err != nil {
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

// cloneOrCopy makes out a copy of in: a reflink when the file system can,
// else only in's data extents (SEEK_DATA/SEEK_HOLE), holes left as holes.
func cloneOrCopy(ctx context.Context, in, out *os.File) error {
	if unix.IoctlFileClone(int(out.Fd()), int(in.Fd())) == nil {
		return nil
	}
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	size := fi.Size()
	for off := int64(0); off < size; {
		if err := ctx.Err(); err != nil {
			return err
		}
		data, err := unix.Seek(int(in.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole is left
		} else if err != nil {
			return err
		}
		hole, err := unix.Seek(int(in.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return err
		}
		if err := copyRange(in, out, data, hole-data); err != nil {
			return err
		}
		off = hole
	}
	return out.Truncate(size)
}

// copyRange copies n bytes at off from in to out at the same offset, in
// the kernel when it can.
func copyRange(in, out *os.File, off, n int64) error {
	roff, woff := off, off
	for n > 0 {
		c, err := unix.CopyFileRange(int(in.Fd()), &roff, int(out.Fd()), &woff, int(min(n, 1<<30)), 0)
		if err != nil || c == 0 {
			// No copy_file_range here (or short): copy through memory.
			_, err := io.Copy(io.NewOffsetWriter(out, woff), io.NewSectionReader(in, roff, n))
			return err
		}
		n -= int64(c)
	}
	return nil
}
