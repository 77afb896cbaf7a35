package rbd

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// CreateSnapshot snapshots the image and protects the snapshot so it
// can be cloned (Cinder's create_snapshot). ErrExists if it is there.
func (s *Store) CreateSnapshot(ctx context.Context, image, snap string) error {
	if err := checkImage(image); err != nil {
		return err
	}
	if err := checkSnap(snap); err != nil {
		return err
	}
	if _, err := s.rbd(ctx, "snap", "create", "--no-progress", s.spec(image, snap)); err != nil {
		return err
	}
	if _, err := s.rbd(ctx, "snap", "protect", s.spec(image, snap)); err != nil {
		s.rbd(context.WithoutCancel(ctx), "snap", "rm", "--no-progress", s.spec(image, snap))
		return err
	}
	return nil
}

// DeleteSnapshot removes a snapshot; one (or an image) not there is no
// error. It refuses (ErrBusy) while clones depend on the snapshot, as
// Cinder's SnapshotIsBusy.
func (s *Store) DeleteSnapshot(ctx context.Context, image, snap string) error {
	if err := checkImage(image); err != nil {
		return err
	}
	if err := checkSnap(snap); err != nil {
		return err
	}
	snaps, err := s.snaps(ctx, image)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, sn := range snaps {
		if sn.Name != snap {
			continue
		}
		cs, err := s.children(ctx, image, snap)
		if err != nil {
			return err
		}
		if len(cs) > 0 {
			return fmt.Errorf("rbd: snapshot %s@%s has dependent volumes %s: %w", image, snap, strings.Join(cs, ", "), ErrBusy)
		}
		return s.removeSnap(ctx, image, sn)
	}
	return nil
}

// HasSnapshot reports whether the image has the snapshot.
func (s *Store) HasSnapshot(ctx context.Context, image, snap string) (bool, error) {
	if err := checkImage(image); err != nil {
		return false, err
	}
	snaps, err := s.snaps(ctx, image)
	if err != nil {
		return false, err
	}
	for _, sn := range snaps {
		if sn.Name == snap {
			return true, nil
		}
	}
	return false, nil
}

// Snapshots are the names of the image's snapshots, oldest first;
// ErrNotFound if the image is not there.
func (s *Store) Snapshots(ctx context.Context, image string) ([]string, error) {
	if err := checkImage(image); err != nil {
		return nil, err
	}
	snaps, err := s.snaps(ctx, image)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(snaps))
	for _, sn := range snaps {
		names = append(names, sn.Name)
	}
	return names, nil
}

// CloneFromSnapshot makes dest a copy-on-write clone of image@snap
// (Cinder's create_volume_from_snapshot), flattened when
// Config.FlattenFromSnapshot, and grown to sizeBytes if that is larger
// than the snapshot (0: the snapshot's size).
func (s *Store) CloneFromSnapshot(ctx context.Context, image, snap, dest string, sizeBytes int64) error {
	for _, n := range []string{image, dest} {
		if err := checkImage(n); err != nil {
			return err
		}
	}
	if err := checkSnap(snap); err != nil {
		return err
	}
	if _, err := s.rbd(ctx, "clone", s.spec(image, snap), s.spec(dest)); err != nil {
		return err
	}
	err := s.finishClone(ctx, dest, sizeBytes, s.cfg.FlattenFromSnapshot)
	if err != nil {
		s.rbd(context.WithoutCancel(ctx), "rm", "--no-progress", s.spec(dest))
	}
	return err
}

// finishClone flattens a new clone if asked and grows it to sizeBytes.
func (s *Store) finishClone(ctx context.Context, dest string, sizeBytes int64, flatten bool) error {
	if flatten {
		if _, err := s.run(ctx, cmd{name: "rbd", args: s.rbdArgs("flatten", "--no-progress", s.spec(dest)), long: true}); err != nil {
			return err
		}
	}
	size, err := s.Size(ctx, dest)
	if err != nil {
		return err
	}
	if sizeBytes > 0 && sizeBytes < size {
		return fmt.Errorf("rbd: %s would be %d bytes, smaller than its source's %d: %w", dest, sizeBytes, size, ErrInvalid)
	}
	if sizeBytes <= size {
		return nil
	}
	return s.Extend(ctx, dest, sizeBytes)
}

// CloneVolume makes dest a copy of src (Cinder's create_cloned_volume):
// a clone of the snapshot src@<dest>.clone_snap, flattened (and the
// snapshot dropped) when src already has MaxCloneDepth ancestors, or a
// full copy when MaxCloneDepth < 0. dest grows to sizeBytes if larger.
func (s *Store) CloneVolume(ctx context.Context, src, dest string, sizeBytes int64) error {
	for _, n := range []string{src, dest} {
		if err := checkImage(n); err != nil {
			return err
		}
	}
	if s.cfg.MaxCloneDepth < 0 {
		if _, err := s.run(ctx, cmd{name: "rbd", args: s.rbdArgs("cp", "--no-progress", s.spec(src), s.spec(dest)), long: true}); err != nil {
			return err
		}
		err := s.finishClone(ctx, dest, sizeBytes, false)
		if err != nil {
			s.rbd(context.WithoutCancel(ctx), "rm", "--no-progress", s.spec(dest))
		}
		return err
	}
	depth, err := s.depth(ctx, src)
	if err != nil {
		return err
	}
	snap := dest + cloneSnapSuffix
	if _, err := s.rbd(ctx, "snap", "create", "--no-progress", s.spec(src, snap)); err != nil {
		return err
	}
	dropSnap := func() {
		s.removeSnap(context.WithoutCancel(ctx), src, snapInfo{Name: snap, Protected: "true"})
	}
	if _, err := s.rbd(ctx, "snap", "protect", s.spec(src, snap)); err != nil {
		dropSnap()
		return err
	}
	// A dest that is there already is not ours to remove.
	if _, err := s.rbd(ctx, "clone", s.spec(src, snap), s.spec(dest)); err != nil {
		dropSnap()
		return err
	}
	flatten := depth >= s.cfg.MaxCloneDepth
	if err := s.finishClone(ctx, dest, sizeBytes, flatten); err != nil {
		s.rbd(context.WithoutCancel(ctx), "rm", "--no-progress", s.spec(dest))
		dropSnap()
		return err
	}
	if flatten {
		return s.removeSnap(ctx, src, snapInfo{Name: snap, Protected: "true"})
	}
	return nil
}

// depth is how many ancestors image has.
func (s *Store) depth(ctx context.Context, image string) (int, error) {
	d := 0
	for store := s; ; d++ {
		info, err := store.info(ctx, image)
		if err != nil {
			return 0, err
		}
		if info.Parent == nil {
			return d, nil
		}
		if d > 64 {
			return 0, fmt.Errorf("rbd: %s: clone chain longer than 64", image)
		}
		if info.Parent.Pool != store.cfg.Pool {
			cfg := store.cfg
			cfg.Pool = info.Parent.Pool
			store = &Store{cfg: cfg}
		}
		image = info.Parent.Image
	}
}
