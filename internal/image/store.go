package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/driver"
	"nimbus/internal/rbd"
	"nimbus/internal/store"
)

// Where image data lives, as Glance's filesystem and rbd stores keep it.
// An image's record says where its data is (its location, as Glance's
// image_locations do): "" for a file named by its id in this
// controller's images directory, the store of one controller; or
// rbd://fsid/pool/image/snap for an RBD image in a Ceph pool, which every
// controller reaches. New data goes to the service's backend; data is
// read and removed where the record says, so that images stored before
// a change of backend stay readable.

// Image data backends.
const (
	BackendFile = "file"
	BackendRBD  = "rbd"
)

// UseRBD keeps new image data as RBD images in st's pool (the rbd
// backend); call it before serving. Without it, data goes to files.
func (s *Service) UseRBD(st *rbd.Store) { s.rbd = st }

// stagePrefix names data being written into the file store.
const stagePrefix = ".upload-"

// stage writes r as data for image id that is not yet the image's and
// returns its name for commit or discard. On failure nothing is left.
func (s *Service) stage(ctx context.Context, id string, r io.Reader) (string, error) {
	if s.rbd != nil {
		return s.rbd.StageImage(ctx, id, r)
	}
	if err := os.MkdirAll(s.dataDir, 0o700); err != nil {
		return "", err
	}
	f, err := os.CreateTemp(s.dataDir, stagePrefix+id+"-*")
	if err != nil {
		return "", err
	}
	_, err = io.Copy(f, r)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
		return "", err
	}
	return f.Name(), nil
}

// commit makes staged data image id's and answers its location. The
// staged data is gone either way. Data already there under the id is
// replaced, or with keep (the same data written twice) kept.
func (s *Service) commit(ctx context.Context, staged, id string, keep bool) (string, error) {
	if s.rbd != nil {
		l, err := s.rbd.CommitImage(ctx, staged, id, keep)
		if err != nil {
			return "", err
		}
		return l.String(), nil
	}
	if err := os.Rename(staged, s.dataPath(id)); err != nil {
		os.Remove(staged)
		return "", err
	}
	return "", nil
}

// discard removes staged data that will not be committed, even when the
// request that wrote it is gone.
func (s *Service) discard(ctx context.Context, staged string) {
	if s.rbd != nil {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if err := s.rbd.RemoveStaged(ctx, staged); err != nil {
			s.log.Warn("image store: staged data left", "staged", staged, "error", err)
		}
		return
	}
	os.Remove(staged)
}

// rbdAt is the RBD store that reaches location loc.
func (s *Service) rbdAt(loc string) (*rbd.Store, rbd.Location, error) {
	l, err := rbd.ParseLocation(loc)
	if err != nil {
		return nil, l, err
	}
	if s.rbd == nil {
		return nil, l, fmt.Errorf("image data is in Ceph (%s) but this controller has no rbd image backend", loc)
	}
	return s.rbd, l, nil
}

// errNoData is image data that is not where its record says.
var errNoData = errors.New("image data not found")

// openData reads image id's data at loc and says its size; errNoData
// when it is not there.
func (s *Service) openData(ctx context.Context, id, loc string) (io.ReadCloser, int64, error) {
	if loc == "" {
		f, err := os.Open(s.dataPath(id))
		if errors.Is(err, os.ErrNotExist) {
			return nil, 0, errNoData
		}
		if err != nil {
			return nil, 0, err
		}
		st, err := f.Stat()
		if err != nil {
			f.Close()
			return nil, 0, err
		}
		return f, st.Size(), nil
	}
	st, l, err := s.rbdAt(loc)
	if err != nil {
		return nil, 0, err
	}
	size, err := st.ImageSize(ctx, l)
	if errors.Is(err, rbd.ErrNotFound) {
		return nil, 0, errNoData
	}
	if err != nil {
		return nil, 0, err
	}
	rc, err := st.OpenImage(ctx, l)
	return rc, size, err
}

// removeData removes image id's data at loc; none there is no error.
// Data that volumes are cloned from is refused with a 409, as Glance
// refuses to delete an image its store says is in use.
func (s *Service) removeData(ctx context.Context, id, loc string) error {
	if loc == "" {
		if err := os.Remove(s.dataPath(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	}
	st, l, err := s.rbdAt(loc)
	if err != nil {
		return err
	}
	pool, err := st.InPool(l.Pool)
	if err != nil {
		return err
	}
	err = pool.RemoveImage(ctx, l.Image)
	if errors.Is(err, rbd.ErrBusy) {
		// The volumes are named in the log only: they may be other
		// projects'.
		s.log.Info("image store: image in use", "image", id, "error", err)
		return api.Conflict("Image %s could not be deleted because it is in use: The image cannot be deleted because it is in use through the backend store outside of Glance.", id)
	}
	return err
}

// dataExists reports whether image id's data is at loc.
func (s *Service) dataExists(ctx context.Context, id, loc string) (bool, error) {
	if loc == "" {
		_, err := os.Stat(s.dataPath(id))
		if errors.Is(err, os.ErrNotExist) {
			return false, nil
		}
		return err == nil, err
	}
	st, l, err := s.rbdAt(loc)
	if err != nil {
		return false, err
	}
	_, err = st.ImageSize(ctx, l)
	if errors.Is(err, rbd.ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

// staged lists the staged data of the backend by image id.
func (s *Service) staged(ctx context.Context) (map[string][]string, error) {
	if s.rbd != nil {
		return s.rbd.StagedImages(ctx)
	}
	entries, err := os.ReadDir(s.dataDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := map[string][]string{}
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), stagePrefix)
		if !ok || len(rest) < 37 || rest[36] != '-' || !uuidPattern.MatchString(rest[:36]) {
			continue
		}
		out[rest[:36]] = append(out[rest[:36]], filepath.Join(s.dataDir, e.Name()))
	}
	return out, nil
}

// dropUnfinished removes what an upload of image id, deleted while
// saving, placed: its staged data, and on the rbd backend an RBD image
// under its id that a controller stopped between committing it and
// recording it left.
func (s *Service) dropUnfinished(ctx context.Context, id string) error {
	if err := s.sweepStaged(ctx, id); err != nil {
		return err
	}
	if s.rbd == nil {
		return nil
	}
	return s.rbd.RemoveImage(ctx, id)
}

// sweepStaged removes staged data whose upload has ended: that of images
// not saving (gone, queued again or active), or of only, when not "",
// the image about to go. A controller that stopped mid-upload leaves its
// image saving; deleting the image takes the staged data with it.
func (s *Service) sweepStaged(ctx context.Context, only string) error {
	staged, err := s.staged(ctx)
	if err != nil {
		return err
	}
	for id, names := range staged {
		if only != "" && id != only {
			continue
		}
		if only == "" {
			img, err := getImage(ctx, s.db, id)
			if err == nil && img.Status == StatusSaving {
				continue
			}
			if err != nil && !errors.Is(err, store.ErrNotFound) {
				return err
			}
		}
		for _, n := range names {
			s.discard(ctx, n)
		}
	}
	return nil
}

// activeData is the record of an active image with data, for a reader.
func (s *Service) activeData(ctx context.Context, id string) (*Image, error) {
	img, err := getImage(ctx, s.db, id)
	if err != nil {
		return nil, err
	}
	if img.Status != StatusActive || !img.HasData() {
		return nil, api.Conflict("Image %s is %s: it has no data to read.", id, img.Status)
	}
	return img, nil
}

// DataFile is a file holding active image id's data, for a tool that
// reads files (qemu-img): the image's own file in the file store, else
// a sparse copy exported into a new directory under dir, removed by
// done. Images marked nimbus_placeholder="true" hold only a stand-in.
func (s *Service) DataFile(ctx context.Context, id, dir string) (path string, done func(), err error) {
	img, err := s.activeData(ctx, id)
	if err != nil {
		return "", nil, err
	}
	if img.Location == "" {
		if ok, err := s.dataExists(ctx, id, ""); err != nil || !ok {
			return "", nil, fmt.Errorf("image store: image %s: %w", id, cmpErr(err, errNoData))
		}
		return s.dataPath(id), func() {}, nil
	}
	st, l, err := s.rbdAt(img.Location)
	if err != nil {
		return "", nil, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", nil, err
	}
	tmp, err := os.MkdirTemp(dir, ".image-")
	if err != nil {
		return "", nil, err
	}
	done = func() { os.RemoveAll(tmp) }
	path = filepath.Join(tmp, id)
	if err := st.ExportImage(ctx, l, path); err != nil {
		done()
		return "", nil, fmt.Errorf("image store: image %s: %w", id, err)
	}
	return path, done, nil
}

func cmpErr(err, def error) error {
	if err != nil {
		return err
	}
	return def
}

// RBDLocation is where active image id's data is in Ceph; ok is false
// for data in the file store.
func (s *Service) RBDLocation(ctx context.Context, id string) (l rbd.Location, ok bool, err error) {
	img, err := s.activeData(ctx, id)
	if err != nil || img.Location == "" {
		return l, false, err
	}
	l, err = rbd.ParseLocation(img.Location)
	return l, err == nil, err
}

// Direct is where a host reads active image id's data itself: its RBD
// snapshot with the client's key, for a host that reaches the cluster as
// it does the volumes. Nil for data in this controller's files.
func (s *Service) Direct(ctx context.Context, id string) (*driver.ImageDirect, error) {
	img, err := s.activeData(ctx, id)
	if err != nil || img.Location == "" {
		return nil, err
	}
	st, l, err := s.rbdAt(img.Location)
	if err != nil {
		return nil, err
	}
	conn, err := st.ImageConn(ctx, l)
	if err != nil {
		return nil, fmt.Errorf("image store: image %s: %w", id, err)
	}
	return &driver.ImageDirect{Conn: conn, Snapshot: l.Snap}, nil
}
