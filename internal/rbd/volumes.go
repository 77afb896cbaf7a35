package rbd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"nimbus/internal/driver"
)

// imageInfo is what `rbd info --format json` says that we use.
type imageInfo struct {
	Size   int64 `json:"size"`
	Parent *struct {
		Pool     string `json:"pool"`
		Image    string `json:"image"`
		Snapshot string `json:"snapshot"`
	} `json:"parent"`
}

type snapInfo struct {
	Name      string `json:"name"`
	Size      int64  `json:"size"`
	Protected string `json:"protected"` // "true" or "false"
}

func (s *Store) info(ctx context.Context, image string) (imageInfo, error) {
	var info imageInfo
	out, err := s.rbd(ctx, "info", "--format", "json", s.spec(image))
	if err != nil {
		return info, err
	}
	if err := json.Unmarshal(out, &info); err != nil {
		return info, fmt.Errorf("rbd info %s: %v", image, err)
	}
	return info, nil
}

func (s *Store) snaps(ctx context.Context, image string) ([]snapInfo, error) {
	var snaps []snapInfo
	out, err := s.rbd(ctx, "snap", "ls", "--format", "json", s.spec(image))
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(out, &snaps); err != nil {
		return nil, fmt.Errorf("rbd snap ls %s: %v", image, err)
	}
	return snaps, nil
}

// children are the images cloned from image@snap, as pool/image.
func (s *Store) children(ctx context.Context, image, snap string) ([]string, error) {
	out, err := s.rbd(ctx, "children", "--format", "json", s.spec(image, snap))
	if err != nil {
		return nil, err
	}
	var cs []struct {
		Pool  string `json:"pool"`
		Image string `json:"image"`
	}
	if err := json.Unmarshal(out, &cs); err != nil {
		return nil, fmt.Errorf("rbd children %s@%s: %v", image, snap, err)
	}
	var names []string
	for _, c := range cs {
		names = append(names, c.Pool+"/"+c.Image)
	}
	return names, nil
}

// Create makes an empty image of sizeBytes. ErrExists if it is there.
func (s *Store) Create(ctx context.Context, name string, sizeBytes int64) error {
	if err := checkImage(name); err != nil {
		return err
	}
	if sizeBytes <= 0 {
		return fmt.Errorf("rbd: size %d: %w", sizeBytes, ErrInvalid)
	}
	_, err := s.rbd(ctx, "create", "--size", strconv.FormatInt(sizeBytes, 10)+"B", s.spec(name))
	return err
}

// Exists reports whether the image is there.
func (s *Store) Exists(ctx context.Context, name string) (bool, error) {
	_, err := s.Size(ctx, name)
	if errors.Is(err, ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

// Size is the image's size in bytes; ErrNotFound if it is not there.
func (s *Store) Size(ctx context.Context, name string) (int64, error) {
	if err := checkImage(name); err != nil {
		return 0, err
	}
	info, err := s.info(ctx, name)
	return info.Size, err
}

// Extend grows the image to sizeBytes; shrinking is refused (Cinder
// extends only). An image a VM has open grows under it: QEMU then needs
// block_resize to see the new size.
func (s *Store) Extend(ctx context.Context, name string, sizeBytes int64) error {
	size, err := s.Size(ctx, name)
	if err != nil {
		return err
	}
	switch {
	case sizeBytes < size:
		return fmt.Errorf("rbd: %s is %d bytes, will not shrink it to %d: %w", name, size, sizeBytes, ErrInvalid)
	case sizeBytes == size:
		return nil
	}
	_, err = s.rbd(ctx, "resize", "--size", strconv.FormatInt(sizeBytes, 10)+"B", s.spec(name))
	return err
}

// cloneSnapSuffix marks CloneVolume's snapshots: <dest>.clone_snap on
// the source.
const (
	cloneSnapSuffix = ".clone_snap"
	deletedSuffix   = ".deleted"
)

// Delete removes the image; an image that is not there is no error.
// It refuses (ErrBusy) while the image has snapshots of its own or a
// client has it open. Snapshots the backup driver left go with it. If
// CloneVolume's clones still depend on it, it is renamed
// <name>.deleted and removed with the last of them. Deleting a clone
// made by CloneVolume drops its snapshot on the source.
func (s *Store) Delete(ctx context.Context, name string) error {
	if err := checkImage(name); err != nil {
		return err
	}
	snaps, err := s.snaps(ctx, name)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	pinned := false
	for _, sn := range snaps {
		switch {
		case backupSnapRE.MatchString(sn.Name):
			if err := s.removeSnap(ctx, name, sn); err != nil {
				return err
			}
		case strings.HasSuffix(sn.Name, cloneSnapSuffix):
			cs, err := s.children(ctx, name, sn.Name)
			if err != nil {
				return err
			}
			if len(cs) > 0 {
				pinned = true
				continue
			}
			// Its clone is gone (flattened, or deleted halfway).
			if err := s.removeSnap(ctx, name, sn); err != nil {
				return err
			}
		default:
			return fmt.Errorf("rbd: volume %s has snapshot %s; delete its snapshots first: %w", name, sn.Name, ErrBusy)
		}
	}
	if pinned {
		_, err := s.rbd(ctx, "rename", s.spec(name), s.spec(name+deletedSuffix))
		return err
	}
	return s.remove(ctx, name)
}

// remove removes an image without snapshots and then its CloneVolume
// parent's snapshot, walking up past parents that are already deleted.
func (s *Store) remove(ctx context.Context, name string) error {
	info, err := s.info(ctx, name)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if _, err := s.rbd(ctx, "rm", "--no-progress", s.spec(name)); err != nil {
		if errors.Is(err, ErrNotFound) {
			return nil
		}
		if errors.Is(err, ErrBusy) {
			return fmt.Errorf("rbd: %s is open by a client (attached, or a crashed client's watch not yet expired, about 30 s): %w", name, err)
		}
		return err
	}
	p := info.Parent
	if p == nil || p.Pool != s.cfg.Pool || p.Snapshot != strings.TrimSuffix(name, deletedSuffix)+cloneSnapSuffix {
		return nil
	}
	if err := s.removeSnap(ctx, p.Image, snapInfo{Name: p.Snapshot, Protected: "true"}); err != nil {
		return err
	}
	if !strings.HasSuffix(p.Image, deletedSuffix) {
		return nil
	}
	left, err := s.snaps(ctx, p.Image)
	if err != nil || len(left) > 0 {
		return err
	}
	return s.remove(ctx, p.Image)
}

// removeSnap unprotects and removes a snapshot; one not there is no
// error.
func (s *Store) removeSnap(ctx context.Context, image string, sn snapInfo) error {
	if sn.Protected == "true" {
		if _, err := s.rbd(ctx, "snap", "unprotect", s.spec(image, sn.Name)); err != nil && !errors.Is(err, ErrNotFound) && !errors.Is(err, ErrInvalid) {
			return err
		}
	}
	if _, err := s.rbd(ctx, "snap", "rm", "--no-progress", s.spec(image, sn.Name)); err != nil && !errors.Is(err, ErrNotFound) {
		return err
	}
	return nil
}

// Conn is how a host's QEMU opens the image (Cinder's
// initialize_connection for rbd): pool, image, client, key, monitors.
func (s *Store) Conn(ctx context.Context, name string) (driver.VolumeConn, error) {
	size, err := s.Size(ctx, name)
	if err != nil {
		return driver.VolumeConn{}, err
	}
	mons, err := s.monitors(ctx)
	if err != nil {
		return driver.VolumeConn{}, err
	}
	return driver.VolumeConn{
		Driver: driver.VolumeRBD, Pool: s.cfg.Pool, Image: name,
		User: s.cfg.User, Key: s.cfg.Key, Monitors: mons, SizeBytes: size,
	}, nil
}

// monitors are the configured ones, or the monitors' v1 addresses from
// the monitor map (Cinder's _get_mon_addrs): librbd takes a bare
// host:port as v1 and still learns v2 addresses from the map.
func (s *Store) monitors(ctx context.Context) ([]string, error) {
	if len(s.cfg.Monitors) > 0 {
		return s.cfg.Monitors, nil
	}
	out, err := s.run(ctx, cmd{name: "ceph", args: s.rbdArgs("mon", "dump", "--format", "json")})
	if err != nil {
		return nil, err
	}
	var m struct {
		Mons []struct {
			Addr        string `json:"addr"` // legacy v1 "ip:port/nonce"
			PublicAddrs struct {
				Addrvec []struct {
					Type string `json:"type"`
					Addr string `json:"addr"`
				} `json:"addrvec"`
			} `json:"public_addrs"`
		} `json:"mons"`
	}
	if err := json.Unmarshal(out, &m); err != nil {
		return nil, fmt.Errorf("ceph mon dump: %v", err)
	}
	var mons []string
	for _, mon := range m.Mons {
		addr := ""
		for _, a := range mon.PublicAddrs.Addrvec {
			if a.Type == "v1" {
				addr = a.Addr
			}
		}
		if addr == "" {
			addr, _, _ = strings.Cut(mon.Addr, "/")
		}
		if addr != "" {
			mons = append(mons, addr)
		}
	}
	if len(mons) == 0 {
		return nil, fmt.Errorf("ceph mon dump lists no monitors")
	}
	return mons, nil
}
