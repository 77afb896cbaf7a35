package image

import (
	"context"
	"crypto/md5"
	"crypto/sha512"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// hashAlgo is Glance's default hashing_algorithm.
const hashAlgo = "sha512"

func (s *Service) dataPath(id string) string { return filepath.Join(s.dataDir, id) }

// DataPath is where the file store keeps image id's data ("" for an id
// that is not a UUID); an image whose location is in Ceph has none there.
func (s *Service) DataPath(id string) string {
	if !uuidPattern.MatchString(id) {
		return ""
	}
	return s.dataPath(id)
}

// beginUpload moves a queued image to saving, so that a second upload
// conflicts (glance/api/v2/image_data.py upload and the domain's status
// transitions).
func (s *Service) beginUpload(ctx context.Context, img *Image) error {
	return s.db.Tx(ctx, func(tx *store.Tx) error {
		cur, err := getImage(ctx, tx, img.ID)
		if err != nil {
			return err
		}
		if cur.Status != StatusQueued {
			return api.Conflict("Image status transition from %s to saving is not allowed", cur.Status)
		}
		var missing []string
		if cur.ContainerFormat == "" {
			missing = append(missing, "container_format")
		}
		if cur.DiskFormat == "" {
			missing = append(missing, "disk_format")
		}
		if len(missing) > 0 {
			return api.BadRequest("Properties %s must be set prior to saving data.", strings.Join(missing, ", "))
		}
		if err := checkUpload(ctx, tx, cur); err != nil {
			return err
		}
		cur.Status = StatusSaving
		cur.UpdatedAt = time.Now().UTC().Truncate(time.Second)
		*img = *cur
		return updateImage(ctx, tx, cur)
	})
}

// readError marks a failure to read the data being stored, as opposed to a
// failure of our own disk.
type readError struct{ err error }

func (e *readError) Error() string { return "reading image data: " + e.err.Error() }
func (e *readError) Unwrap() error { return e.err }

type readTracker struct {
	r   io.Reader
	err error
}

func (t *readTracker) Read(p []byte) (int, error) {
	n, err := t.r.Read(p)
	if err != nil && err != io.EOF {
		t.err = err
	}
	return n, err
}

// prefix keeps the first bytes written, to read a qcow2 header.
type prefix struct{ b []byte }

func (p *prefix) Write(b []byte) (int, error) {
	if room := 512 - len(p.b); room > 0 {
		p.b = append(p.b, b[:min(room, len(b))]...)
	}
	return len(b), nil
}

// virtualSize is the disk size a guest sees: the qcow2 header's size field,
// the data size for raw images, unknown (0) otherwise.
func virtualSize(diskFormat string, head []byte, size int64) int64 {
	switch diskFormat {
	case "raw":
		return size
	case "qcow2":
		if len(head) >= 32 && string(head[:4]) == "QFI\xfb" {
			// The header is the uploader's to write: a size past int64
			// is no real disk, and shown as unknown.
			if v := binary.BigEndian.Uint64(head[24:32]); v <= math.MaxInt64 {
				return int64(v)
			}
		}
	}
	return 0
}

// storeData streams data into the store under a staging name, hashing
// it on the way, then commits it as the image's data and marks the saving
// image active. Data of declared bytes (-1: unknown) that would not fit
// in the owner's image_size_total is refused before it is read, and data
// that outgrows it is cut off as soon as it does. On any failure the
// staged data is removed and the image goes back to queued, as Glance's
// _restore does.
func (s *Service) storeData(ctx context.Context, img *Image, data io.Reader, declared int64) (err error) {
	defer func() {
		if err == nil {
			return
		}
		// Detached from the request: the client may be gone.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_, _ = s.db.Exec(rctx, "UPDATE images SET status = ? WHERE id = ? AND status = ?",
			StatusQueued, img.ID, StatusSaving)
	}()
	rm, err := roomFor(ctx, s.db, img)
	if err != nil {
		return err
	}
	if declared > 0 {
		if err := rm.check(img.Owner, declared); err != nil {
			return err
		}
	}
	md, sh, head, count := md5.New(), sha512.New(), &prefix{}, &counter{}
	src := &readTracker{r: data}
	var in io.Reader = src
	if left := rm.left(); left >= 0 {
		in = &capReader{r: src, left: left}
	}
	staged, err := s.stage(ctx, img.ID, io.TeeReader(in, io.MultiWriter(md, sh, head, count)))
	if err != nil {
		if src.err != nil {
			return &readError{src.err}
		}
		if errors.Is(err, errQuota) {
			return rm.check(img.Owner, count.n)
		}
		return s.goneOr(ctx, img.ID, fmt.Errorf("image store: %w", err))
	}
	n := count.n
	loc, err := s.commit(ctx, staged, img.ID, false)
	if err != nil {
		return s.goneOr(ctx, img.ID, fmt.Errorf("image store: %w", err))
	}
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		cur, err := getImage(ctx, tx, img.ID)
		if err != nil {
			return err
		}
		if cur.Status != StatusSaving {
			return api.Conflict("Image status transition from %s to active is not allowed", cur.Status)
		}
		if err := checkSize(ctx, tx, cur, n); err != nil {
			return err
		}
		cur.Size, cur.Checksum = n, hex.EncodeToString(md.Sum(nil))
		cur.OSHashAlgo, cur.OSHashValue = hashAlgo, hex.EncodeToString(sh.Sum(nil))
		cur.VirtualSize = virtualSize(cur.DiskFormat, head.b, n)
		cur.Location = loc
		if cur.Licence, err = dataLicence(ctx, tx, cur); err != nil {
			return err
		}
		cur.Status = StatusActive
		cur.UpdatedAt = time.Now().UTC().Truncate(time.Second)
		*img = *cur
		return updateImage(ctx, tx, cur)
	})
	if err != nil {
		// The record is gone or changed under us: drop the data we placed.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if rerr := s.removeData(rctx, img.ID, loc); rerr != nil {
			s.log.Warn("image store: data of a failed upload left", "image", img.ID, "location", loc, "error", rerr)
		}
		if errors.Is(err, store.ErrNotFound) {
			return gone(img.ID)
		}
	}
	return err
}

// gone is Glance's answer to an upload whose image was deleted meanwhile.
func gone(id string) error {
	return api.Errorf(http.StatusGone, "Image %s could not be found after upload. The image may have been deleted during the upload.", id)
}

// goneOr is gone when image id was deleted while its data was stored
// (which removes what it staged), else err.
func (s *Service) goneOr(ctx context.Context, id string, err error) error {
	if _, gerr := getImage(context.WithoutCancel(ctx), s.db, id); errors.Is(gerr, store.ErrNotFound) {
		return gone(id)
	}
	return err
}

// counter counts the bytes written to it.
type counter struct{ n int64 }

func (c *counter) Write(p []byte) (int, error) {
	c.n += int64(len(p))
	return len(p), nil
}

func (s *Service) uploadData(r *http.Request) (*api.Response, error) {
	c := api.CallerFrom(r.Context())
	img, err := s.lookup(r.Context(), s.db, r)
	if err != nil {
		return nil, err
	}
	if !owns(c, img) {
		return nil, api.Forbidden("You are not permitted to upload data for this image.")
	}
	ct := r.Header.Get("Content-Type")
	if i := strings.IndexByte(ct, ';'); i >= 0 {
		ct = ct[:i]
	}
	if strings.TrimSpace(ct) != "application/octet-stream" {
		return nil, api.Errorf(http.StatusUnsupportedMediaType, "The request media type %s is not supported by this server.", ct)
	}
	// Stored data is charged to its owner (the operator's public images
	// excepted): billing is asked first, as for every charge a call starts.
	if img.Visibility != Public && s.gate != nil {
		if err := s.gate.CanSpend(r.Context(), img.Owner); err != nil {
			return nil, err
		}
	}
	if err := s.beginUpload(r.Context(), img); err != nil {
		return nil, err
	}
	if err := s.storeData(r.Context(), img, r.Body, r.ContentLength); err != nil {
		var re *readError
		if errors.As(err, &re) {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				return nil, api.OverLimit("Image exceeds the storage quota.")
			}
			return nil, api.BadRequest("Error in reading image data: %v", re.err)
		}
		return nil, err
	}
	return api.Empty(http.StatusNoContent), nil
}

func (s *Service) downloadData(r *http.Request) (*api.Response, error) {
	c := api.CallerFrom(r.Context())
	img, err := s.lookup(r.Context(), s.db, r)
	if err != nil {
		return nil, err
	}
	if img.Status == StatusDeactivated && !c.IsAdmin() {
		return nil, api.Forbidden("The requested image has been deactivated. Image data download is forbidden.")
	}
	if !img.HasData() || (img.Status != StatusActive && img.Status != StatusDeactivated) {
		return api.Empty(http.StatusNoContent), nil
	}
	f, size, err := s.openData(r.Context(), img.ID, img.Location)
	if errors.Is(err, errNoData) {
		return nil, api.NotFound("Image data for %s could not be found.", img.ID)
	}
	if err != nil {
		return nil, err
	}
	if rng := r.Header.Get("Range"); rng != "" {
		// glance/api/v2/image_data.py download serves one byte range as 206.
		start, end, ok := parseRange(rng, size)
		if !ok {
			f.Close()
			e := api.Errorf(http.StatusRequestedRangeNotSatisfiable, "Requested range not satisfiable")
			e.Header = http.Header{"Content-Range": {"bytes */" + strconv.FormatInt(size, 10)}}
			return nil, e
		}
		body, err := section(f, start, end-start+1)
		if err != nil {
			f.Close()
			return nil, err
		}
		resp := &api.Response{Status: http.StatusPartialContent, Body: body}
		return resp.WithHeader("Content-Type", "application/octet-stream").
			WithHeader("Content-Range", fmt.Sprintf("bytes %d-%d/%d", start, end, size)).
			WithHeader("Content-Length", strconv.FormatInt(end-start+1, 10)), nil
	}
	resp := &api.Response{Status: http.StatusOK, Body: f}
	return resp.WithHeader("Content-Type", "application/octet-stream").
		WithHeader("Content-MD5", img.Checksum).
		WithHeader("Content-Length", strconv.FormatInt(size, 10)), nil
}

// section reads n bytes of f from offset start: seeking in a file,
// skipping the bytes before in a stream (an RBD export).
func section(f io.ReadCloser, start, n int64) (io.ReadCloser, error) {
	if ra, ok := f.(io.ReaderAt); ok {
		return struct {
			io.Reader
			io.Closer
		}{io.NewSectionReader(ra, start, n), f}, nil
	}
	if _, err := io.CopyN(io.Discard, f, start); err != nil {
		return nil, err
	}
	return struct {
		io.Reader
		io.Closer
	}{io.LimitReader(f, n), f}, nil
}

// parseRange reads a single "bytes=a-b", "bytes=a-" or "bytes=-n" range
// and returns inclusive offsets within size.
func parseRange(h string, size int64) (start, end int64, ok bool) {
	spec, found := strings.CutPrefix(strings.TrimSpace(h), "bytes=")
	if !found || strings.Contains(spec, ",") {
		return 0, 0, false
	}
	a, b, found := strings.Cut(strings.TrimSpace(spec), "-")
	if !found {
		return 0, 0, false
	}
	var err error
	switch {
	case a == "":
		n, err := strconv.ParseInt(b, 10, 64)
		if err != nil || n <= 0 {
			return 0, 0, false
		}
		start, end = max(size-n, 0), size-1
	default:
		if start, err = strconv.ParseInt(a, 10, 64); err != nil || start < 0 {
			return 0, 0, false
		}
		end = size - 1
		if b != "" {
			if end, err = strconv.ParseInt(b, 10, 64); err != nil || end < start {
				return 0, 0, false
			}
			end = min(end, size-1)
		}
	}
	if start >= size || size == 0 {
		return 0, 0, false
	}
	return start, end, true
}
