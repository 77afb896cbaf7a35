package volume

import (
	"context"
	"errors"
	"fmt"
	"os"

	"nimbus/internal/driver"
)

// backend is where the volumes' data lives: files in the data directory
// exported over NBD (fileBackend, the default) or RBD images in a Ceph
// pool (rbdBackend, backend_rbd.go). The worker calls it for the data
// work a row's status asks for, after the transaction that set the
// status, so every method is idempotent: a stopped controller's work is
// redone from the start at the next Run.
type backend interface {
	// makeVolume makes a creating volume's data of its size: blank, or
	// from its image, its source snapshot or its source volume.
	makeVolume(ctx context.Context, v *volRow) error
	// extend grows volume id's data to sizeGB; it never shrinks it.
	extend(ctx context.Context, id string, sizeGB int64) error
	// deleteVolume removes volume id's data; none there is no error.
	deleteVolume(ctx context.Context, id string) error

	// createSnapshot keeps the snapshot's volume's data as it is now.
	createSnapshot(ctx context.Context, sn *snapRow) error
	// deleteSnapshot removes a snapshot's data; errSnapshotBusy while
	// volumes made from it still depend on it.
	deleteSnapshot(ctx context.Context, sn *snapRow) error

	// readFile is a file holding volume id's raw data to read (an upload
	// to an image), and what to call when done with it.
	readFile(ctx context.Context, id string) (path string, done func(), err error)

	// backup stores volume b.VolumeID's data, or its snapshot
	// b.SnapshotID's, as backup b (incremental from b.ParentID when it has
	// one) and answers Cinder's object_count.
	backup(ctx context.Context, b *bkRow) (objects int64, err error)
	// restore writes backup b over volume b.RestoreVolume's data from its
	// start, making the data first for a new volume.
	restore(ctx context.Context, b *bkRow) error
	// deleteBackup removes backup b's data.
	deleteBackup(ctx context.Context, b *bkRow) error

	// conn is how a server on host opens volume v for attachment a, and
	// whether an export was made for it (one that unexport stops).
	conn(ctx context.Context, a *attRow, v *volRow, host string, ro bool) (c driver.VolumeConn, exported bool, err error)
}

// errSnapshotBusy is a snapshot that cannot be deleted while volumes
// depend on it (Cinder's SnapshotIsBusy): it stays available.
var errSnapshotBusy = errors.New("snapshot is busy: volumes made from it depend on it")

// fileBackend keeps each volume as a sparse raw file named by its id in
// the data directory, snapshots as copies beside them and backups in the
// directory BackupStore. Servers on the storage node's own hosts open a
// volume's file; others reach it through an NBD export.
type fileBackend struct{ s *Service }

var _ backend = fileBackend{}

func (f fileBackend) makeVolume(ctx context.Context, v *volRow) error { return f.s.makeData(ctx, v) }

func (f fileBackend) extend(_ context.Context, id string, sizeGB int64) error {
	return f.s.grow(id, sizeGB)
}

func (f fileBackend) deleteVolume(_ context.Context, id string) error {
	if err := os.Remove(f.s.dataPath(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

func (f fileBackend) createSnapshot(ctx context.Context, sn *snapRow) error {
	return f.s.takeSnapshot(ctx, sn)
}

func (f fileBackend) deleteSnapshot(_ context.Context, sn *snapRow) error {
	if err := os.Remove(f.s.snapPath(sn.ID)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

func (f fileBackend) readFile(_ context.Context, id string) (string, func(), error) {
	return f.s.dataPath(id), func() {}, nil
}

func (f fileBackend) backup(ctx context.Context, b *bkRow) (int64, error) {
	src, release, err := f.s.backupSource(ctx, b) // an in-use volume's temporary live copy (livecopy.go)
	if err != nil {
		return 0, err
	}
	defer release()
	m, err := f.s.backupStore.Create(b.ID, b.ParentID, src)
	if err != nil {
		return 0, err
	}
	return int64(m.Stored), nil
}

func (f fileBackend) restore(_ context.Context, b *bkRow) error { return f.s.restoreData(b) }

func (f fileBackend) deleteBackup(_ context.Context, b *bkRow) error {
	return f.s.backupStore.Delete(b.ID)
}

func (f fileBackend) conn(ctx context.Context, a *attRow, v *volRow, host string, ro bool) (driver.VolumeConn, bool, error) {
	s := f.s
	if s.isLocal(host) {
		return driver.VolumeConn{Driver: driver.VolumeFile, Path: s.dataPath(v.ID)}, false, nil
	}
	if s.exporter == nil {
		return driver.VolumeConn{}, false, invalidVolume("Volume %s can only be attached on the storage node's hosts %q: this cloud has no block export for host %q.",
			v.ID, *s.local.Load(), host)
	}
	c, err := s.exporter.Export(ctx, exportName(a.ID), s.dataPath(v.ID), ro)
	if err != nil {
		return driver.VolumeConn{}, false, fmt.Errorf("volume: exporting %s for %s: %w", v.ID, host, err)
	}
	return c, true, nil
}
