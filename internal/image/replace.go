package image

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// replaceDataRoute is Nimbus's own admin action: Glance cannot re-upload
// an active image, yet a catalog placeholder must become the real image
// under the same id, name and properties, since flavors, quotes, panel
// choices and servers refer to it by id.
const replaceDataRoute = "POST /v2/images/{id}/actions/nimbus-replace-data"

// replaceDataRequest names the staging image whose data takes the place
// of the target's.
type replaceDataRequest struct {
	From string `json:"from"`
}

// replaceData moves a freshly uploaded active image's data (file, size,
// checksum, multihash, formats, virtual size) into the image of the path,
// clears its placeholder mark and deletes the staging image, in one
// transaction. Hosts cache image data by hash, so the new hash is a new
// cache entry and servers already running keep their disks.
func (s *Service) replaceData(r *http.Request) (*api.Response, error) {
	var req replaceDataRequest
	if err := api.DecodeJSON(r, &req); err != nil {
		return nil, err
	}
	if !uuidPattern.MatchString(req.From) {
		return nil, api.BadRequest("'from' must be the id of an active image holding the new data")
	}
	var out *Image
	ctx := r.Context()
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		dst, err := s.lookup(ctx, tx, r)
		if err != nil {
			return err
		}
		src, err := getImage(ctx, tx, req.From)
		if errors.Is(err, store.ErrNotFound) {
			return api.NotFound("No image found with ID %s", req.From)
		}
		if err != nil {
			return err
		}
		if err := checkReplace(dst, src); err != nil {
			return err
		}
		old, renamed := dst.Location, false
		swapData(dst, src)
		if err := updateImage(ctx, tx, dst); err != nil {
			return err
		}
		// The staging image goes; its data is dst's now.
		if err := s.dropRow(ctx, tx, src.ID); err != nil {
			return err
		}
		if src.Location == "" {
			// Last, so that a failure to move the file rolls the records
			// back; it takes the place of dst's old file.
			if err := os.Rename(s.dataPath(src.ID), s.dataPath(dst.ID)); err != nil {
				return fmt.Errorf("image store: %w", err)
			}
			renamed = true
		}
		if !renamed || old != "" {
			// dst's old data once the swap is committed. Data volumes
			// are cloned from stays until they go.
			tx.AfterCommit(func() {
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
				defer cancel()
				if err := s.removeData(rctx, dst.ID, old); err != nil {
					s.log.Warn("image store: replaced data left", "image", dst.ID, "location", old, "error", err)
				}
			})
		}
		out = dst
		return nil
	})
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, view(out)), nil
}

// checkReplace refuses a swap that would lose data or cross projects.
func checkReplace(dst, src *Image) error {
	switch {
	case src.ID == dst.ID:
		return api.BadRequest("An image cannot replace its own data.")
	case src.Status != StatusActive || !src.HasData():
		return api.Conflict("Image %s is %s: only an active image's data can replace another's.", src.ID, src.Status)
	case dst.Status != StatusActive && dst.Status != StatusQueued:
		return api.Conflict("Image %s is %s: only an active or queued image's data can be replaced.", dst.ID, dst.Status)
	case src.Owner != dst.Owner:
		return api.Conflict("Image %s belongs to another project than image %s.", src.ID, dst.ID)
	}
	return nil
}

// swapData gives dst src's data and what describes it, keeping dst's id,
// name, visibility and properties; the placeholder mark goes.
func swapData(dst, src *Image) {
	dst.Size, dst.VirtualSize, dst.Checksum = src.Size, src.VirtualSize, src.Checksum
	dst.OSHashAlgo, dst.OSHashValue = src.OSHashAlgo, src.OSHashValue
	dst.DiskFormat, dst.ContainerFormat = src.DiskFormat, src.ContainerFormat
	dst.Location = src.Location
	if dst.Licence == "" {
		dst.Licence = src.Licence // licensed data stays licensed
	}
	delete(dst.Properties, "nimbus_placeholder")
	dst.Status = StatusActive
	dst.UpdatedAt = time.Now().UTC().Truncate(time.Second)
}
