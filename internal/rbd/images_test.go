package rbd

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"nimbus/internal/cephtest"
)

func TestParseLocation(t *testing.T) {
	id := "0b7e2a4e-2c8e-4c1a-9d3e-5f6a7b8c9d0e"
	fsid := "2a2d32fe-aa05-4bd8-962a-60a7c1074ca2"
	good := Location{FSID: fsid, Pool: "images", Image: id, Snap: ImageSnap}
	if got, err := ParseLocation(good.String()); err != nil || got != good {
		t.Errorf("ParseLocation(%s) = %+v, %v", good, got, err)
	}
	for _, bad := range []string{
		"", "file:///var/lib/glance/" + id, "rbd://" + id,
		"rbd://" + fsid + "/images/" + id,
		"rbd://" + fsid + "/images/" + id + "/snap/x",
		"rbd://" + fsid + "//" + id + "/snap",
		"rbd://" + fsid + "/images/volume-" + id + "/snap",
		"rbd://" + fsid + "/images/" + id + "/other",
		"rbd://" + fsid + "/im%2Fages/" + id + "/snap",
		"rbd://" + fsid + "/images/" + id + "%40x/snap",
	} {
		if l, err := ParseLocation(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseLocation(%q) = %+v, %v; want ErrInvalid", bad, l, err)
		}
	}
}

// imageStore is a store on the shared cluster's images pool.
func imageStore(t *testing.T) *Store {
	t.Helper()
	s, _ := newStore(t, func(c *Config) { c.Pool = cephtest.ImagesPool })
	return s
}

// cutReader gives n bytes of data and then fails, as a client that
// hangs up mid-upload.
type cutReader struct {
	data []byte
	err  error
}

func (c *cutReader) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, c.err
	}
	n := copy(p, c.data)
	c.data = c.data[n:]
	return n, nil
}

// TestImageStore: an image's data staged, committed under its id with a
// protected snapshot, read back whole and in size, and removed; a cut
// upload and a failed commit leave nothing in the pool.
func TestImageStore(t *testing.T) {
	s := imageStore(t)
	ctx := context.Background()
	id := uuid.NewString()
	data := make([]byte, 5*mib+123)
	rand.Read(data)

	staged, err := s.StageImage(ctx, id, bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := s.StagedImages(ctx); err != nil || !slices.Contains(got[id], staged) {
		t.Errorf("StagedImages = %v, %v; want %s among them", got, err, staged)
	}
	loc, err := s.CommitImage(ctx, staged, id, false)
	if err != nil {
		t.Fatal(err)
	}
	fsid, _ := s.FSID(ctx)
	if want := (Location{FSID: fsid, Pool: cephtest.ImagesPool, Image: id, Snap: ImageSnap}); loc != want || fsid == "" {
		t.Errorf("location %+v, want %+v", loc, want)
	}
	if got, _ := s.StagedImages(ctx); len(got[id]) != 0 {
		t.Errorf("staged images left after commit: %v", got[id])
	}
	snaps, err := s.snaps(ctx, id)
	if err != nil || len(snaps) != 1 || snaps[0].Name != ImageSnap || snaps[0].Protected != "true" {
		t.Errorf("snapshots %+v, %v; want one protected %q", snaps, err, ImageSnap)
	}
	if size, err := s.ImageSize(ctx, loc); size != int64(len(data)) || err != nil {
		t.Errorf("ImageSize = %d, %v; want %d", size, err, len(data))
	}
	rc, err := s.OpenImage(ctx, loc)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, data) {
		t.Errorf("OpenImage read %d bytes (%v), equal %v", len(got), err, bytes.Equal(got, data))
	}
	// A reader closed early ends the export without waiting for it.
	rc, err = s.OpenImage(ctx, loc)
	if err != nil {
		t.Fatal(err)
	}
	io.ReadFull(rc, make([]byte, 100))
	rc.Close()
	path := filepath.Join(t.TempDir(), "img.raw")
	if err := s.ExportImage(ctx, loc, path); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); !bytes.Equal(b, data) {
		t.Errorf("ExportImage wrote %d bytes, not the data", len(b))
	}

	// A second upload's data replaces data left under the id.
	staged2, err := s.StageImage(ctx, id, strings.NewReader("second"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CommitImage(ctx, staged2, id, false); err != nil {
		t.Fatalf("commit over leftover data: %v", err)
	}
	if size, _ := s.ImageSize(ctx, loc); size != 6 {
		t.Errorf("size after the second commit %d, want 6", size)
	}
	// With keep, data there stays and the staged copy goes.
	staged4, err := s.StageImage(ctx, id, strings.NewReader("third!!"))
	if err != nil {
		t.Fatal(err)
	}
	if l, err := s.CommitImage(ctx, staged4, id, true); err != nil || l != loc {
		t.Fatalf("commit with keep: %+v, %v", l, err)
	}
	if size, _ := s.ImageSize(ctx, loc); size != 6 {
		t.Errorf("size after a commit with keep %d, want 6 (kept)", size)
	}
	if got, _ := s.StagedImages(ctx); len(got[id]) != 0 {
		t.Errorf("commit with keep left %v", got[id])
	}

	if err := s.RemoveImage(ctx, id); err != nil {
		t.Fatal(err)
	}
	if err := s.RemoveImage(ctx, id); err != nil {
		t.Errorf("second RemoveImage: %v", err)
	}
	if _, err := s.ImageSize(ctx, loc); !errors.Is(err, ErrNotFound) {
		t.Errorf("ImageSize after remove: %v, want ErrNotFound", err)
	}
	rc, err = s.OpenImage(ctx, loc)
	if err == nil {
		_, err = io.ReadAll(rc)
		rc.Close()
	}
	if !errors.Is(err, ErrNotFound) {
		t.Errorf("reading a removed image: %v, want ErrNotFound", err)
	}

	// A cut stream: the reader's error, and no image of what came.
	cut := errors.New("client went away")
	if _, err := s.StageImage(ctx, id, &cutReader{data: data[:3*mib], err: cut}); !errors.Is(err, cut) {
		t.Errorf("StageImage of a cut stream: %v, want the reader's error", err)
	}
	if got, _ := s.StagedImages(ctx); len(got[id]) != 0 {
		t.Errorf("a cut upload left %v", got[id])
	}
	// A commit that fails removes what was staged.
	staged3, err := s.StageImage(ctx, id, strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CommitImage(ctx, staged3, uuid.NewString(), false); !errors.Is(err, ErrInvalid) {
		t.Errorf("commit under another id: %v, want ErrInvalid", err)
	}
	if err := s.RemoveStaged(ctx, staged3); err != nil {
		t.Fatal(err)
	}
	if names := rbdLs(t, s); slices.ContainsFunc(names, func(n string) bool { return strings.HasPrefix(n, id) }) {
		t.Errorf("pool still holds %v", names)
	}
}

// hangUp gives data, then blocks until the client's request ends and
// fails, as the body of an upload whose client hangs up.
type hangUp struct {
	data []byte
	gone <-chan struct{}
}

func (h *hangUp) Read(p []byte) (int, error) {
	if len(h.data) == 0 {
		<-h.gone
		return 0, errors.New("connection reset")
	}
	n := copy(p, h.data)
	h.data = h.data[n:]
	return n, nil
}

// TestStageHangUp: a client that hangs up mid-upload ends the request's
// context and its body together: staging ends at once and leaves nothing
// (an import killed with the context would hold its watch on the staged
// image, which then could not be removed for 30 s).
func TestStageHangUp(t *testing.T) {
	s := imageStore(t)
	id := uuid.NewString()
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(500*time.Millisecond, cancel)
	start := time.Now()
	_, err := s.StageImage(ctx, id, &hangUp{data: make([]byte, 3*mib), gone: ctx.Done()})
	if err == nil {
		t.Fatal("staging a cut upload succeeded")
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("staging took %v to end", took)
	}
	if got, _ := s.StagedImages(context.Background()); len(got[id]) != 0 {
		t.Errorf("a cut upload left %v", got[id])
	}
}

// TestRemoveUnfinished: what a commit stopped halfway leaves — an image
// with its snapshot not yet protected, or with none — is removed.
func TestRemoveUnfinished(t *testing.T) {
	s := imageStore(t)
	ctx := context.Background()
	for _, snap := range []bool{true, false} {
		id := uuid.NewString()
		if _, err := s.rbd(ctx, "create", "--size", "1M", s.spec(id)); err != nil {
			t.Fatal(err)
		}
		if snap {
			if _, err := s.rbd(ctx, "snap", "create", s.spec(id, ImageSnap)); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.RemoveImage(ctx, id); err != nil {
			t.Errorf("RemoveImage (snapshot %v, unprotected): %v", snap, err)
		}
		if slices.Contains(rbdLs(t, s), id) {
			t.Errorf("image (snapshot %v) still in the pool", snap)
		}
	}
}

// TestCloneImage: a volume is a copy-on-write clone of a raw image in
// another pool; the image cannot be removed while the clone depends on
// it, and nothing of it changes for trying; removing the clone (a
// volume's Delete) leaves the image alone, which then goes.
func TestCloneImage(t *testing.T) {
	imgs := imageStore(t)
	vols, _ := newStore(t)
	ctx := context.Background()
	id := uuid.NewString()
	data := bytes.Repeat([]byte{0x5a}, 2*mib)
	staged, err := imgs.StageImage(ctx, id, bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	loc, err := imgs.CommitImage(ctx, staged, id, false)
	if err != nil {
		t.Fatal(err)
	}
	vol := newName()
	if err := vols.CloneImage(ctx, loc, vol, 64*mib); err != nil {
		t.Fatal(err)
	}
	info, err := vols.info(ctx, vol)
	if err != nil || info.Parent == nil || info.Parent.Pool != cephtest.ImagesPool || info.Parent.Image != id ||
		info.Parent.Snapshot != ImageSnap || info.Size != 64*mib {
		t.Errorf("clone info %+v (parent %+v), %v", info, info.Parent, err)
	}
	verify(t, vols, vol, 0, 0x5a, 2*mib)
	verify(t, vols, vol, 2*mib, 0, 1*mib)
	if err := vols.CloneImage(ctx, loc, newName(), 1*mib); !errors.Is(err, ErrInvalid) {
		t.Errorf("clone smaller than the image: %v, want ErrInvalid", err)
	}

	if err := imgs.RemoveImage(ctx, id); !errors.Is(err, ErrBusy) || !strings.Contains(err.Error(), vol) {
		t.Errorf("RemoveImage with a clone: %v, want ErrBusy naming %s", err, vol)
	}
	if size, err := imgs.ImageSize(ctx, loc); err != nil || size != int64(len(data)) {
		t.Errorf("image after the refused remove: %d, %v", size, err)
	}
	if err := vols.Delete(ctx, vol); err != nil {
		t.Fatal(err)
	}
	if size, err := imgs.ImageSize(ctx, loc); err != nil || size != int64(len(data)) {
		t.Errorf("image after its clone went: %d, %v", size, err)
	}
	if err := imgs.RemoveImage(ctx, id); err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(rbdLs(t, imgs), func(n string) bool { return strings.HasPrefix(n, id) }) {
		t.Errorf("image %s still in the pool", id)
	}
}

func rbdLs(t *testing.T, s *Store) []string {
	t.Helper()
	out, err := s.rbd(context.Background(), "ls", s.cfg.Pool)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Fields(string(out))
}
