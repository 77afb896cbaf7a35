package rbd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"time"

	"nimbus/internal/driver"
)

// Glance images. A store on the images pool keeps image data as Glance's
// rbd store does (glance_store/_drivers/rbd.py): each image is an RBD
// image named by the Glance image's id, with one snapshot, ImageSnap,
// protected so that volumes are copy-on-write clones of it (Cinder's
// clone_image). Its location is rbd://<fsid>/<pool>/<id>/snap.
//
// Data is written under a staging name, <id>.upload.<random>, and
// renamed to the id only once whole and snapshotted, so that an image
// name in the pool always holds complete data; a staged image is garbage
// once its upload has ended (StagedImages lists them for a sweep).

// ImageSnap is the snapshot every image has (glance_store's DEFAULT_SNAPNAME).
const ImageSnap = "snap"

var (
	glanceRE = regexp.MustCompile(`^` + uuidPat + `$`)
	stagedRE = regexp.MustCompile(`^(` + uuidPat + `)\.upload\.[0-9a-f]{16}$`)
)

func checkGlanceImage(name string) error {
	if !glanceRE.MatchString(name) {
		return fmt.Errorf("rbd: image name %q is not an image id: %w", name, ErrInvalid)
	}
	return nil
}

// Location is where an image's data is: Glance's rbd location.
type Location struct {
	FSID, Pool, Image, Snap string
}

// String is the location as Glance writes it, rbd://fsid/pool/image/snap.
func (l Location) String() string {
	return "rbd://" + url.PathEscape(l.FSID) + "/" + url.PathEscape(l.Pool) + "/" + url.PathEscape(l.Image) + "/" + url.PathEscape(l.Snap)
}

// ParseLocation reads rbd://fsid/pool/image/snap (Cinder's
// _parse_location): four non-empty components, each of the names this
// package makes.
func ParseLocation(s string) (Location, error) {
	rest, ok := strings.CutPrefix(s, "rbd://")
	if !ok {
		return Location{}, fmt.Errorf("rbd: location %q is not rbd://: %w", s, ErrInvalid)
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 4 {
		return Location{}, fmt.Errorf("rbd: location %q is not rbd://fsid/pool/image/snap: %w", s, ErrInvalid)
	}
	for i, p := range parts {
		u, err := url.PathUnescape(p)
		if err != nil || u == "" {
			return Location{}, fmt.Errorf("rbd: location %q has a bad component: %w", s, ErrInvalid)
		}
		parts[i] = u
	}
	l := Location{FSID: parts[0], Pool: parts[1], Image: parts[2], Snap: parts[3]}
	if !poolRE.MatchString(l.Pool) || checkGlanceImage(l.Image) != nil || l.Snap != ImageSnap {
		return Location{}, fmt.Errorf("rbd: location %q names no image of an images pool: %w", s, ErrInvalid)
	}
	return l, nil
}

// fsidCache keeps each cluster's fsid by ceph.conf path: it never
// changes, and asking costs a process.
var fsidCache sync.Map

// FSID is the cluster's id (ceph fsid), as locations carry it.
func (s *Store) FSID(ctx context.Context) (string, error) {
	if v, ok := fsidCache.Load(s.cfg.Conf); ok {
		return v.(string), nil
	}
	out, err := s.run(ctx, cmd{name: "ceph", args: s.rbdArgs("fsid")})
	if err != nil {
		return "", err
	}
	fsid := strings.TrimSpace(string(out))
	if fsid == "" || strings.ContainsAny(fsid, "/ \n") {
		return "", fmt.Errorf("rbd: ceph fsid said %q", fsid)
	}
	fsidCache.Store(s.cfg.Conf, fsid)
	return fsid, nil
}

// StageImage writes r whole into a new image under a staging name for
// image id and returns that name; the image is as long as the data.
// Nothing is left behind when it fails (r's error included): rbd import
// reading a cut stream would otherwise make an image of what came.
func (s *Store) StageImage(ctx context.Context, id string, r io.Reader) (string, error) {
	if err := checkGlanceImage(id); err != nil {
		return "", err
	}
	var rnd [8]byte
	if _, err := rand.Read(rnd[:]); err != nil {
		return "", err
	}
	staged := id + ".upload." + hex.EncodeToString(rnd[:])
	src := &failReader{r: ctxReader{ctx, r}}
	// The import is not killed when ctx ends (a client that hangs up):
	// killed, it would hold its watch on the image for 30 s, and the
	// image could not be removed. It ends as the data does.
	_, err := s.run(context.WithoutCancel(ctx), cmd{name: "rbd", args: s.rbdArgs("import", "--no-progress", "-", s.spec(staged)), long: true, stdin: src})
	if err == nil && src.err != nil {
		err = src.err
	}
	if err != nil {
		if src.err != nil {
			err = src.err // the reader's failure, not the import's reaction to it
		}
		s.removeStaged(ctx, staged)
		return "", err
	}
	return staged, nil
}

// ctxReader ends a stream when ctx ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// failReader remembers the error that ended a read other than EOF.
type failReader struct {
	r   io.Reader
	err error
}

func (f *failReader) Read(p []byte) (int, error) {
	n, err := f.r.Read(p)
	if err != nil && err != io.EOF && f.err == nil {
		f.err = err
	}
	return n, err
}

// removeStaged removes a staged image and its snapshot, detached from
// ctx: a cancelled request still cleans up.
func (s *Store) removeStaged(ctx context.Context, staged string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.Timeout)
	defer cancel()
	s.removeImageSnaps(ctx, staged)
	s.rbd(ctx, "rm", "--no-progress", s.spec(staged))
}

// CommitImage makes a staged image image id's data: it snapshots it
// (ImageSnap, protected) and renames it to id. An id already there is
// data of an upload that never finished (the caller knows no image
// refers to it) and is replaced; with keep, it is rather kept as the
// data (two writers of the same data) and the staged image dropped. The
// staged image is removed on failure.
func (s *Store) CommitImage(ctx context.Context, staged, id string, keep bool) (Location, error) {
	if m := stagedRE.FindStringSubmatch(staged); m == nil || m[1] != id {
		return Location{}, fmt.Errorf("rbd: %q is not a staged image of %s: %w", staged, id, ErrInvalid)
	}
	fsid, err := s.FSID(ctx)
	if err == nil {
		_, err = s.rbd(ctx, "snap", "create", "--no-progress", s.spec(staged, ImageSnap))
	}
	if err == nil {
		_, err = s.rbd(ctx, "snap", "protect", s.spec(staged, ImageSnap))
	}
	if err == nil {
		_, err = s.rbd(ctx, "rename", s.spec(staged), s.spec(id))
		switch {
		case errors.Is(err, ErrExists) && keep:
			s.removeStaged(ctx, staged)
			return Location{FSID: fsid, Pool: s.cfg.Pool, Image: id, Snap: ImageSnap}, nil
		case errors.Is(err, ErrExists):
			if err = s.RemoveImage(ctx, id); err == nil {
				_, err = s.rbd(ctx, "rename", s.spec(staged), s.spec(id))
			}
		}
	}
	if err != nil {
		s.removeStaged(ctx, staged)
		return Location{}, err
	}
	return Location{FSID: fsid, Pool: s.cfg.Pool, Image: id, Snap: ImageSnap}, nil
}

// RemoveImage removes image name and its snapshot; one not there is no
// error. ErrBusy while volumes cloned from it depend on it (glance's
// InUseByStore): then nothing is changed.
func (s *Store) RemoveImage(ctx context.Context, name string) error {
	if err := checkGlanceImage(name); err != nil {
		return err
	}
	if err := s.removeImageSnaps(ctx, name); err != nil {
		return err
	}
	if _, err := s.rbd(ctx, "rm", "--no-progress", s.spec(name)); err != nil && !errors.Is(err, ErrNotFound) {
		return err
	}
	return nil
}

// removeImageSnaps removes an image's snapshots (ImageSnap, unprotected
// first if it is protected; any other a stopped commit left); ErrBusy,
// changing nothing, while clones depend on ImageSnap.
func (s *Store) removeImageSnaps(ctx context.Context, name string) error {
	snaps, err := s.snaps(ctx, name)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, sn := range snaps {
		if sn.Protected == "true" {
			cs, err := s.children(ctx, name, sn.Name)
			if err != nil {
				return err
			}
			if len(cs) > 0 {
				return fmt.Errorf("rbd: image %s has dependent volumes %s: %w", name, strings.Join(cs, ", "), ErrBusy)
			}
		}
		if err := s.removeSnap(ctx, name, sn); err != nil {
			if errors.Is(err, ErrBusy) {
				return fmt.Errorf("rbd: image %s: %w", name, err)
			}
			return err
		}
	}
	return nil
}

// RemoveStaged removes a staged image StagedImages listed.
func (s *Store) RemoveStaged(ctx context.Context, staged string) error {
	if !stagedRE.MatchString(staged) {
		return fmt.Errorf("rbd: %q is not a staged image: %w", staged, ErrInvalid)
	}
	if err := s.removeImageSnaps(ctx, staged); err != nil {
		return err
	}
	if _, err := s.rbd(ctx, "rm", "--no-progress", s.spec(staged)); err != nil && !errors.Is(err, ErrNotFound) {
		return err
	}
	return nil
}

// StagedImages lists the pool's staged images by the image id each is
// for.
func (s *Store) StagedImages(ctx context.Context) (map[string][]string, error) {
	out, err := s.rbd(ctx, "ls", s.cfg.Pool)
	if err != nil {
		return nil, err
	}
	staged := map[string][]string{}
	for _, name := range strings.Fields(string(out)) {
		if m := stagedRE.FindStringSubmatch(name); m != nil {
			staged[m[1]] = append(staged[m[1]], name)
		}
	}
	return staged, nil
}

// ImageSize is the size of the image's snapshot in bytes; ErrNotFound
// when the image or its snapshot is not there.
func (s *Store) ImageSize(ctx context.Context, l Location) (int64, error) {
	src, err := s.at(l)
	if err != nil {
		return 0, err
	}
	var info imageInfo
	out, err := src.rbd(ctx, "info", "--format", "json", src.spec(l.Image, l.Snap))
	if err != nil {
		return 0, err
	}
	if err := json.Unmarshal(out, &info); err != nil {
		return 0, fmt.Errorf("rbd info %s: %v", l, err)
	}
	return info.Size, nil
}

// at is a store on l's pool, which must be on this store's cluster.
func (s *Store) at(l Location) (*Store, error) {
	if checkGlanceImage(l.Image) != nil || l.Snap != ImageSnap {
		return nil, fmt.Errorf("rbd: location %s names no image snapshot: %w", l, ErrInvalid)
	}
	if l.Pool == s.cfg.Pool {
		return s, nil
	}
	return s.InPool(l.Pool)
}

// OpenImage streams the image's snapshot: rbd export to a pipe. Closing
// the reader ends the export; a failed export is the error of the read
// that would have ended the data.
func (s *Store) OpenImage(ctx context.Context, l Location) (io.ReadCloser, error) {
	src, err := s.at(l)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.LongTimeout)
	args := append([]string{"rbd"}, src.rbdArgs("export", "--no-progress", src.spec(l.Image, l.Snap), "-")...)
	x := exec.CommandContext(ctx, args[0], args[1:]...)
	x.WaitDelay = 5 * time.Second
	stderr := &tailBuffer{}
	x.Stderr = stderr
	out, err := x.StdoutPipe()
	if err != nil {
		cancel()
		return nil, err
	}
	if err := x.Start(); err != nil {
		cancel()
		return nil, err
	}
	return &export{r: out, x: x, cancel: cancel, stderr: stderr, args: args}, nil
}

type export struct {
	r      io.Reader
	x      *exec.Cmd
	cancel context.CancelFunc
	stderr *tailBuffer
	args   []string
	once   sync.Once
	err    error
}

func (e *export) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err == io.EOF {
		if werr := e.wait(); werr != nil {
			return n, werr
		}
	}
	return n, err
}

// wait reaps the process once and says how it ended.
func (e *export) wait() error {
	e.once.Do(func() {
		err := e.x.Wait()
		e.cancel()
		if err != nil {
			e.err = cmdError(e.args, e.stderr, err)
		}
	})
	return e.err
}

func (e *export) Close() error {
	e.cancel()
	e.wait()
	return nil
}

// ExportImage writes the image's snapshot to a new file at path as raw
// data, sparse.
func (s *Store) ExportImage(ctx context.Context, l Location, path string) error {
	src, err := s.at(l)
	if err != nil {
		return err
	}
	_, err = src.run(ctx, cmd{name: "rbd", args: src.rbdArgs("export", "--no-progress", src.spec(l.Image, l.Snap), path), long: true})
	return err
}

// CloneImage makes volume dest a copy-on-write clone of the image at l
// (Cinder's clone_image for a raw Glance image in the same cluster),
// flattened when Config.FlattenFromSnapshot, grown to sizeBytes. l
// must be on this store's cluster (its fsid), which the caller checks.
func (s *Store) CloneImage(ctx context.Context, l Location, dest string, sizeBytes int64) error {
	if err := checkImage(dest); err != nil {
		return err
	}
	src, err := s.at(l)
	if err != nil {
		return err
	}
	if _, err := s.rbd(ctx, "clone", src.spec(l.Image, l.Snap), s.spec(dest)); err != nil {
		return err
	}
	if err := s.finishClone(ctx, dest, sizeBytes, s.cfg.FlattenFromSnapshot); err != nil {
		s.rbd(context.WithoutCancel(ctx), "rm", "--no-progress", s.spec(dest))
		return err
	}
	return nil
}

// ImageConn is how a host's QEMU tools open the image at l themselves, as
// Conn is for a volume: pool, image, client, key and monitors, the size
// that of its snapshot (l.Snap, which the opener names).
func (s *Store) ImageConn(ctx context.Context, l Location) (driver.VolumeConn, error) {
	size, err := s.ImageSize(ctx, l)
	if err != nil {
		return driver.VolumeConn{}, err
	}
	mons, err := s.monitors(ctx)
	if err != nil {
		return driver.VolumeConn{}, err
	}
	return driver.VolumeConn{
		Driver: driver.VolumeRBD, Pool: l.Pool, Image: l.Image,
		User: s.cfg.User, Key: s.cfg.Key, Monitors: mons, SizeBytes: size,
	}, nil
}
