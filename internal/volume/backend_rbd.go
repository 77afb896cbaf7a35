package volume

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"nimbus/internal/driver"
	"nimbus/internal/rbd"
)

// rbdBackend keeps each volume as an RBD image volume-<id> in a Ceph
// pool, as Cinder's RBD driver does (internal/rbd): snapshots are RBD
// snapshots of the volume's image, volumes from snapshots and clones of
// volumes are RBD clones, and every host's QEMU opens the images itself
// with its rbd driver.
//
// Backups go to a second pool, as Cinder's Ceph backup driver keeps them
// (cinder/backup/drivers/ceph.py), rather than to the directory store:
// a backup stays in the cluster and streams from pool to pool through
// the controller's rbd tools without touching its disk, and an
// incremental backup is rbd's own diff between two snapshots of the
// volume, which copies only what changed without reading the rest.
// A full backup b of volume v is the image volume-<v>.backup.<b> in that
// pool with one snapshot backup.<b>.snap.<time>; an incremental adds
// its snapshot to its parent's image, from the diff between the
// parent's snapshot and its own on the volume. The volume keeps its
// latest backup's snapshot for the next incremental; when that snapshot
// is gone (the backup was deleted), an incremental is stored as a full
// one. A backup of a volume's snapshot takes no snapshot of its own: its
// diff ends at the volume's RBD snapshot, renamed to the backup's on the
// backup image.
type rbdBackend struct {
	s             *Service
	vols, backups *rbd.Store
	// chains serialises the backups of one volume (id → *sync.Mutex):
	// a snapshot's backup runs beside its volume's, and incrementals
	// apply their diffs to the same image, whose head every import-diff
	// writes before it snapshots it.
	chains sync.Map
}

var _ backend = (*rbdBackend)(nil)

// makeVolume starts over: an image a stopped controller left half-made
// goes first (a creating volume is nobody's yet).
func (r *rbdBackend) makeVolume(ctx context.Context, v *volRow) error {
	name, size := rbd.VolumeName(v.ID), v.Size<<30
	if err := r.vols.Delete(ctx, name); err != nil {
		return err
	}
	switch {
	case v.SnapshotID != "":
		sn, err := getSnap(ctx, r.s.db, v.SnapshotID)
		if err != nil {
			return fmt.Errorf("snapshot %s: %w", v.SnapshotID, err)
		}
		return r.vols.CloneFromSnapshot(ctx, rbd.VolumeName(sn.VolumeID), rbd.SnapshotName(sn.ID), name, size)
	case v.SourceVolID != "":
		return r.vols.CloneVolume(ctx, rbd.VolumeName(v.SourceVolID), name, size)
	case v.ImageID != "":
		if l, ok, err := r.cloneable(ctx, v); err != nil || ok {
			if err != nil {
				return err
			}
			return r.vols.CloneImage(ctx, l, name, size)
		}
		_, src, format, done, err := r.s.imageSource(ctx, v)
		if err != nil {
			return err
		}
		defer done()
		return r.vols.ImportImage(ctx, name, src, format, size)
	}
	return r.vols.Create(ctx, name, size)
}

// cloneable is where volume v's image is in Ceph when the volume can be
// a copy-on-write clone of it, as Cinder's _is_cloneable decides: raw
// data (a clone is read as the disk itself) in this cluster (the
// location's fsid). A raw image larger than the volume is refused.
func (r *rbdBackend) cloneable(ctx context.Context, v *volRow) (rbd.Location, bool, error) {
	if r.s.images == nil {
		return rbd.Location{}, false, errors.New("no image service")
	}
	im, err := r.s.images.Get(ctx, v.ProjectID, true, v.ImageID)
	if err != nil {
		return rbd.Location{}, false, fmt.Errorf("image %s: %w", v.ImageID, err)
	}
	if im.DiskFormat != "raw" {
		return rbd.Location{}, false, nil
	}
	l, ok, err := r.s.images.RBDLocation(ctx, v.ImageID)
	if err != nil || !ok {
		return l, false, err
	}
	fsid, err := r.vols.FSID(ctx)
	if err != nil || fsid != l.FSID {
		return l, false, err
	}
	if im.Size > v.Size<<30 {
		return l, false, fmt.Errorf("image %s is %d bytes, larger than the volume's %d GiB", v.ImageID, im.Size, v.Size)
	}
	return l, true, nil
}

func (r *rbdBackend) extend(ctx context.Context, id string, sizeGB int64) error {
	return r.vols.Extend(ctx, rbd.VolumeName(id), sizeGB<<30)
}

func (r *rbdBackend) deleteVolume(ctx context.Context, id string) error {
	return r.vols.Delete(ctx, rbd.VolumeName(id))
}

func (r *rbdBackend) createSnapshot(ctx context.Context, sn *snapRow) error {
	image, snap := rbd.VolumeName(sn.VolumeID), rbd.SnapshotName(sn.ID)
	if ok, err := r.vols.HasSnapshot(ctx, image, snap); err != nil || ok {
		return err // made before a restart
	}
	return r.vols.CreateSnapshot(ctx, image, snap)
}

func (r *rbdBackend) deleteSnapshot(ctx context.Context, sn *snapRow) error {
	err := r.vols.DeleteSnapshot(ctx, rbd.VolumeName(sn.VolumeID), rbd.SnapshotName(sn.ID))
	if errors.Is(err, rbd.ErrBusy) {
		return fmt.Errorf("%w (%v)", errSnapshotBusy, err)
	}
	return err
}

// readFile exports the image to a sparse temporary file in a private
// directory under the data directory.
func (r *rbdBackend) readFile(ctx context.Context, id string) (string, func(), error) {
	if err := os.MkdirAll(r.s.dataDir, 0o700); err != nil {
		return "", nil, err
	}
	dir, err := os.MkdirTemp(r.s.dataDir, ".export-")
	if err != nil {
		return "", nil, err
	}
	done := func() { os.RemoveAll(dir) }
	path := filepath.Join(dir, id+".raw")
	if err := r.vols.ExportFile(ctx, rbd.VolumeName(id), "", path); err != nil {
		done()
		return "", nil, err
	}
	return path, done, nil
}

// backupImage is the backup pool's image a full backup's data starts.
func backupImage(volumeID, backupID string) string {
	return rbd.VolumeName(volumeID) + ".backup." + backupID
}

// backupSnap is backup b's snapshot, on its volume and its backup image.
func backupSnap(b *bkRow) string { return rbd.BackupSnapName(b.ID, b.CreatedAt) }

// errNoBackupImage: nothing of the backup was stored.
var errNoBackupImage = errors.New("backup has no image in the backup pool")

// imageOf is the backup pool's image that holds backup b's snapshot: its
// own, or else (an incremental) its parent's.
func (r *rbdBackend) imageOf(ctx context.Context, b *bkRow) (string, error) {
	for cur := b; ; {
		name := backupImage(b.VolumeID, cur.ID)
		if ok, err := r.backups.Exists(ctx, name); err != nil || ok {
			return name, err
		}
		if cur.ParentID == "" {
			return "", errNoBackupImage
		}
		p, err := getBackup(ctx, r.s.db, cur.ParentID)
		if err != nil {
			return "", fmt.Errorf("parent backup %s: %w", cur.ParentID, err)
		}
		cur = p
	}
}

// volSnap is the volume's snapshot that holds backup b's data: the
// snapshot it backs up, or else the one the backup takes.
func volSnap(b *bkRow) string {
	if b.SnapshotID != "" {
		return rbd.SnapshotName(b.SnapshotID)
	}
	return backupSnap(b)
}

// incrementalBase is where an incremental backup b goes: its parent's
// image, from the parent's snapshot there (fromImage) and its data's on
// the volume (fromVol), when both are still there and the parent's data
// is older than b's (rbd diffs only forward; a snapshot's backup may have
// a newer parent). image is "" for a full backup.
func (r *rbdBackend) incrementalBase(ctx context.Context, b *bkRow) (image, fromImage, fromVol string, err error) {
	if b.ParentID == "" {
		return "", "", "", nil
	}
	p, err := getBackup(ctx, r.s.db, b.ParentID)
	if err != nil {
		return "", "", "", fmt.Errorf("parent backup %s: %w", b.ParentID, err)
	}
	if !p.DataTimestamp.Before(b.DataTimestamp) {
		return "", "", "", nil
	}
	pimage, err := r.imageOf(ctx, p)
	if errors.Is(err, errNoBackupImage) {
		return "", "", "", nil
	}
	if err != nil {
		return "", "", "", err
	}
	onVol, err := r.vols.HasSnapshot(ctx, rbd.VolumeName(b.VolumeID), volSnap(p))
	if err != nil || !onVol {
		return "", "", "", err
	}
	onImage, err := r.backups.HasSnapshot(ctx, pimage, backupSnap(p))
	if err != nil || !onImage {
		return "", "", "", err
	}
	return pimage, backupSnap(p), volSnap(p), nil
}

func (r *rbdBackend) backup(ctx context.Context, b *bkRow) (int64, error) {
	mu, _ := r.chains.LoadOrStore(b.VolumeID, new(sync.Mutex))
	mu.(*sync.Mutex).Lock()
	defer mu.(*sync.Mutex).Unlock()
	vol, snap := rbd.VolumeName(b.VolumeID), backupSnap(b)
	own := backupImage(b.VolumeID, b.ID)
	image, fromImage, fromVol, err := r.incrementalBase(ctx, b)
	if err != nil {
		return 0, err
	}
	if image == "" {
		image = own
	}
	// Stored before a restart.
	for _, img := range []string{image, own} {
		if ok, err := r.backups.HasSnapshot(ctx, img, snap); err == nil && ok {
			return 0, r.keepLatestSnap(ctx, b)
		} else if err != nil && !errors.Is(err, rbd.ErrNotFound) {
			return 0, err
		}
	}
	if b.SnapshotID == "" {
		if ok, err := r.vols.HasSnapshot(ctx, vol, snap); err != nil {
			return 0, err
		} else if !ok {
			if err := r.vols.CreateSnapshot(ctx, vol, snap); err != nil {
				return 0, err
			}
		}
	}
	if image == own {
		size, err := r.vols.Size(ctx, vol)
		if err != nil {
			return 0, err
		}
		// A full backup resumed finds its image made; applying the whole
		// diff again writes what it had written. The diff sizes the image
		// as its snapshot.
		if err := r.backups.Create(ctx, own, size); err != nil && !errors.Is(err, rbd.ErrExists) {
			return 0, err
		}
	}
	n, err := r.diff(ctx, vol, fromVol, volSnap(b), image, fromImage, snap)
	if err != nil {
		return 0, err
	}
	return (n + BackupChunkSize - 1) / BackupChunkSize, r.keepLatestSnap(ctx, b)
}

// keepLatestSnap drops the volume's backup snapshots older than backup
// b's own, from which the volume's next incremental starts. A snapshot's
// backup leaves them: the latest backup by data_timestamp, the next
// one's parent, may be a backup of the volume newer than the snapshot.
func (r *rbdBackend) keepLatestSnap(ctx context.Context, b *bkRow) error {
	if b.SnapshotID != "" {
		return nil
	}
	return r.dropOlderSnaps(ctx, rbd.VolumeName(b.VolumeID), backupSnap(b))
}

// diff streams the volume's changes from..to into the backup pool's
// image (rbd export-diff | rbd import-diff), where they start at
// snapshot imageFrom and end at imageTo, and answers the diff's size.
func (r *rbdBackend) diff(ctx context.Context, vol, from, to, image, imageFrom, imageTo string) (int64, error) {
	pr, pw := io.Pipe()
	exported := make(chan error, 1)
	go func() {
		err := r.vols.ExportDiff(ctx, vol, from, to, pw)
		pw.CloseWithError(err)
		exported <- err
	}()
	cr := &countingReader{r: pr}
	err := r.backups.ImportDiff(ctx, image, rbd.RenameDiff(cr, imageFrom, imageTo))
	pr.CloseWithError(errors.New("import-diff ended"))
	if xerr := <-exported; xerr != nil && err == nil {
		err = xerr
	}
	return cr.n, err
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// dropOlderSnaps removes the volume's backup snapshots other than keep:
// the next incremental starts from keep.
func (r *rbdBackend) dropOlderSnaps(ctx context.Context, vol, keep string) error {
	snaps, err := r.vols.Snapshots(ctx, vol)
	if errors.Is(err, rbd.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, sn := range snaps {
		if sn != keep && strings.HasPrefix(sn, "backup.") {
			if err := r.vols.DeleteSnapshot(ctx, vol, sn); err != nil {
				return err
			}
		}
	}
	return nil
}

// restore copies the backup's snapshot over the volume's image whole,
// making the image first for a new volume.
func (r *rbdBackend) restore(ctx context.Context, b *bkRow) error {
	image, err := r.imageOf(ctx, b)
	if err != nil {
		return err
	}
	target := rbd.VolumeName(b.RestoreVolume)
	if err := r.vols.Create(ctx, target, b.Size<<30); err != nil && !errors.Is(err, rbd.ErrExists) {
		return err
	}
	return r.backups.Copy(ctx, image, backupSnap(b), r.vols, target)
}

// deleteBackup removes the backup's snapshot from its image, the image
// with its last snapshot, and the snapshot the volume kept for it (a
// snapshot's backup took none).
func (r *rbdBackend) deleteBackup(ctx context.Context, b *bkRow) error {
	snap := backupSnap(b)
	image, err := r.imageOf(ctx, b)
	switch {
	case errors.Is(err, errNoBackupImage):
	case err != nil:
		return err
	default:
		if err := r.backups.DeleteSnapshot(ctx, image, snap); err != nil {
			return err
		}
		left, err := r.backups.Snapshots(ctx, image)
		if err != nil && !errors.Is(err, rbd.ErrNotFound) {
			return err
		}
		if err == nil && len(left) == 0 {
			if err := r.backups.Delete(ctx, image); err != nil {
				return err
			}
		}
	}
	if b.SnapshotID != "" {
		return nil // the volume's snapshot is its owner's
	}
	return r.vols.DeleteSnapshot(ctx, rbd.VolumeName(b.VolumeID), snap)
}

// conn is the same for every host: QEMU's rbd driver reaches the
// cluster's monitors with the client's key.
func (r *rbdBackend) conn(ctx context.Context, _ *attRow, v *volRow, _ string, _ bool) (driver.VolumeConn, bool, error) {
	c, err := r.vols.Conn(ctx, rbd.VolumeName(v.ID))
	if err != nil {
		return driver.VolumeConn{}, false, fmt.Errorf("volume: connecting %s: %w", v.ID, err)
	}
	return c, false, nil
}
