package fleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"nimbus/internal/api"
	"nimbus/internal/driver"
	"nimbus/internal/fleet/wire"
	"nimbus/internal/store"
)

// Images is the part of the image service hosts use through the agent
// API: they read the images they boot and store the snapshots they take.
type Images interface {
	// Open reads an active image's data and says its size and disk format.
	Open(ctx context.Context, id string) (rc io.ReadCloser, size int64, diskFormat string, err error)
	// SnapshotOf names the server an image is a snapshot of ("" for none).
	SnapshotOf(ctx context.Context, id string) (serverID string, err error)
	// FinishSnapshot stores a snapshot's data and makes the image active.
	FinishSnapshot(ctx context.Context, id, diskFormat string, r io.Reader) error
	// Direct is where a host reads an active image's data itself; nil
	// when only Open reads it.
	Direct(ctx context.Context, id string) (*driver.ImageDirect, error)
}

// SetImages gives the agent API the image service.
func (s *Service) SetImages(im Images) { s.images.Store(&im) }

// handleImage serves GET (download) and PUT (a snapshot's upload) of
// wire.PathImages + id. An agent reads only the images its hosts' pending
// ops name (404 for any other, as for one that does not exist); only the
// agent compute asked for a server's snapshot stores it, and only while
// the image waits for data.
func (s *Service) handleImage(w http.ResponseWriter, r *http.Request, agent string) {
	p := s.images.Load()
	if p == nil {
		writeError(w, &apiError{http.StatusNotFound, wire.CodeNotFound, "this controller serves no images"})
		return
	}
	im := *p
	id := strings.TrimPrefix(r.URL.Path, wire.PathImages)
	if id == "" || strings.Contains(id, "/") || len(id) > 64 {
		writeError(w, badRequest("bad image id %q", id))
		return
	}
	ctx := r.Context()
	switch r.Method {
	case http.MethodGet:
		named, err := s.opNamesImage(ctx, agent, id)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		if !named {
			s.log.Warn("fleet: image read refused: no op of this agent names it", "agent", agent, "image", id)
			writeError(w, &apiError{http.StatusNotFound, wire.CodeNotFound, "no such image"})
			return
		}
		if r.URL.RawQuery == wire.QueryDirect {
			d, err := im.Direct(ctx, id)
			if err != nil {
				s.failImage(w, r, err)
				return
			}
			if d == nil {
				w.WriteHeader(http.StatusNoContent)
				return
			}
			writeJSON(w, http.StatusOK, d)
			return
		}
		rc, size, format, err := im.Open(ctx, id)
		if err != nil {
			s.failImage(w, r, err)
			return
		}
		defer rc.Close()
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
		w.Header().Set(wire.HeaderDiskFormat, format)
		w.WriteHeader(http.StatusOK)
		if _, err := io.Copy(w, rc); err != nil && ctx.Err() == nil {
			s.log.Warn("fleet: image download cut", "image", id, "error", err)
		}
	case http.MethodPut:
		server, err := im.SnapshotOf(ctx, id)
		if err != nil {
			s.failImage(w, r, err)
			return
		}
		if err := s.authorizeUpload(ctx, agent, id, server); err != nil {
			s.fail(w, r, err)
			return
		}
		if err := im.FinishSnapshot(ctx, id, r.URL.Query().Get("disk_format"), r.Body); err != nil {
			s.failImage(w, r, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	default:
		w.Header().Set("Allow", "GET, PUT")
		writeError(w, &apiError{http.StatusMethodNotAllowed, wire.CodeMethod, r.Method + " is not allowed here; use GET or PUT"})
	}
}

// failImage answers an image service error with its status.
func (s *Service) failImage(w http.ResponseWriter, r *http.Request, err error) {
	var ae *api.Error
	switch {
	case errors.Is(err, store.ErrNotFound):
		writeError(w, &apiError{http.StatusNotFound, wire.CodeNotFound, "no such image"})
	case errors.As(err, &ae) && ae.Status == http.StatusConflict:
		writeError(w, &apiError{ae.Status, wire.CodeConflict, ae.Message})
	case errors.As(err, &ae) && ae.Status < 500:
		writeError(w, &apiError{ae.Status, wire.CodeBadRequest, ae.Message})
	default:
		s.fail(w, r, fmt.Errorf("image %s: %w", r.URL.Path, err))
	}
}
