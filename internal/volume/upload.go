package volume

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"

	"nimbus/internal/api"
	"nimbus/internal/image"
	"nimbus/internal/store"
)

// StatusUploading is a volume whose data is being copied into an image
// (os-volume_upload_image).
const StatusUploading = "uploading"

// The upload's bookkeeping, in the volume's admin metadata (the service's
// own, never the owner's): the image it fills. Resumed after a restart.
const uploadImageKey = "upload_image_id"

// uploadFormats are the disk formats an upload converts to
// (cinder/volume/api.py copy_volume_to_image's allowed disk formats that
// qemu-img writes here).
var uploadFormats = []string{"raw", "qcow2", "vmdk", "vdi", "vhdx"}

// upload is what os-volume_upload_image asks for.
type upload struct {
	name                        string
	force                       bool
	diskFormat, containerFormat string
}

// decodeUpload reads os-volume_upload_image's argument: an image name, the
// formats qemu-img writes, and neither another visibility nor protection.
func decodeUpload(raw json.RawMessage) (upload, error) {
	var up upload
	b, err := actionBody("os-volume_upload_image", raw)
	if err != nil {
		return up, err
	}
	if err := api.UnknownFields(b, "image_name", "force", "disk_format", "container_format", "visibility", "protected"); err != nil {
		return up, err
	}
	name, err := b.optString("image_name", 255)
	if err != nil {
		return up, err
	}
	if name == nil {
		return up, api.BadRequest("No image_name was specified in request.")
	}
	up.name = *name
	if up.force, _, err = b.boolean("force"); err != nil {
		return up, err
	}
	df, cf := "raw", "bare"
	for key, dst := range map[string]*string{"disk_format": &df, "container_format": &cf} {
		v, err := b.optString(key, 255)
		if err != nil {
			return up, err
		}
		if v != nil {
			*dst = *v
		}
	}
	if !slices.Contains(uploadFormats, df) {
		return up, api.BadRequest("Invalid disk-format '%s' specified. Allowed disk-formats are %s.", df, strings.Join(uploadFormats, ", "))
	}
	if cf != "bare" {
		return up, api.BadRequest("Invalid container-format '%s' specified. Allowed container-formats are bare.", cf)
	}
	// Images made here are private to the owner, as Glance makes a
	// member's: another visibility, or protection, is set afterwards
	// through the image API with its own policies.
	if v, err := b.optString("visibility", 255); err != nil {
		return up, err
	} else if v != nil && *v != "private" {
		return up, api.BadRequest("Invalid visibility '%s': an uploaded image is private; change it through the image API.", *v)
	}
	if p, _, err := b.boolean("protected"); err != nil {
		return up, err
	} else if p {
		return up, api.BadRequest("An uploaded image is not protected; protect it through the image API.")
	}
	up.diskFormat, up.containerFormat = df, cf
	return up, nil
}

// uploadImage is os-volume_upload_image {"image_name", "force",
// "disk_format", "container_format"}: a new private image of the owner's
// with the volume's data, made in the background while the volume is
// uploading (cinder/api/contrib/volume_actions.py). Only an available
// volume is uploaded: an in-use one changes under the copy, which Cinder
// allows only where the operator turned enable_force_upload on. 202.
func (s *Service) uploadImage(r *http.Request, raw json.RawMessage) (*api.Response, error) {
	ctx := r.Context()
	up, err := decodeUpload(raw)
	if err != nil {
		return nil, err
	}
	name, force, df, cf := &up.name, up.force, up.diskFormat, up.containerFormat
	if s.images == nil {
		return nil, api.BadRequest("This cloud has no image service to upload to.")
	}
	c := caller(r)
	var v *volRow
	var img *image.Image
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		if v, err = ownedVol(ctx, tx, c, r.PathValue("id")); err != nil {
			return err
		}
		if err := s.checkSpend(ctx, v.ProjectID); err != nil {
			return err
		}
		if v.Status == StatusInUse {
			if !force {
				return invalidVolume("Volume %s status must be available, but current status is: in-use.", v.ID)
			}
			return invalidVolume("Unable to copy volume %s: uploading an in-use volume is not enabled on this cloud (enable_force_upload).", v.ID)
		}
		ok, err := s.setStatus(ctx, tx, v, StatusUploading, "", StatusAvailable)
		if err != nil {
			return err
		}
		if !ok {
			return invalidVolume("Volume %s status must be available, but current status is: %s.", v.ID, v.Status)
		}
		// The image carries what the volume's came with (how to boot and
		// log in to it), as Cinder copies its Glance metadata, and the
		// licence of the image the volume's data came from: its servers
		// pay for it as the original's do.
		base := &image.Image{DiskFormat: df, ContainerFormat: cf, MinDisk: int(v.Size), Properties: v.ImageMetadata}
		if img, err = s.images.CreateSnapshot(ctx, tx, v.ProjectID, *name, nil, base, s.licenceOf(ctx, v)); err != nil {
			return err
		}
		v.AdminMetadata[uploadImageKey] = img.ID
		_, err = tx.Exec(ctx, "UPDATE volumes SET admin_metadata = ? WHERE id = ?", store.JSON(v.AdminMetadata), v.ID)
		return err
	})
	if err != nil {
		return nil, err
	}
	s.kick(v.ID)
	out := map[string]any{"id": v.ID, "updated_at": cinderTime(v.UpdatedAt), "status": v.Status,
		"display_description": v.Description, "size": v.Size, "image_id": img.ID, "image_name": img.Name,
		"container_format": img.ContainerFormat, "disk_format": img.DiskFormat, "volume_type": nil}
	if ts, err := loadTypes(ctx, s.db, "id = ?", v.TypeID); err == nil && len(ts) == 1 {
		out["volume_type"] = typeView(r, ts[0])
	}
	if minor(r) >= 1 {
		out["visibility"], out["protected"] = img.Visibility, false
	}
	return api.JSON(http.StatusAccepted, map[string]any{"os-volume_upload_image": out}), nil
}

// licenceOf is the OS licence of the image a volume's data came from
// (through clones and snapshots: SourceImageID, which only the service
// writes, never the image metadata its owner may change), "" when none or
// when that image is gone.
func (s *Service) licenceOf(ctx context.Context, v *volRow) string {
	id := v.SourceImageID
	if id == "" {
		return ""
	}
	img, err := s.images.Get(ctx, v.ProjectID, true, id)
	if err != nil {
		if !errors.Is(err, store.ErrNotFound) {
			s.log.Warn("volume: reading the licence of a volume's image", "volume", v.ID, "image", id, "error", err)
		}
		return ""
	}
	return img.Licence
}

// finishUpload copies an uploading volume's data into its image (converted
// to the image's disk format) and gives the volume back, available. The
// image goes if the copy fails; one left half-stored by a stopped
// controller is deleted the same way, and the volume is given back.
func (s *Service) finishUpload(ctx context.Context, v *volRow) error {
	failed := false
	if id := v.AdminMetadata[uploadImageKey]; id == "" {
		s.log.Error("volume: uploading with no image to upload to", "volume", v.ID)
	} else if werr := s.copyToImage(ctx, v, id); ctx.Err() != nil {
		return nil // stopped: the next start resumes it
	} else if werr != nil {
		failed = true
		s.log.Error("volume: upload to image failed", "volume", v.ID, "image", id, "error", werr)
		if err := s.images.Delete(ctx, id); err != nil && !errors.Is(err, store.ErrNotFound) {
			s.log.Warn("volume: removing a failed upload's image", "image", id, "error", err)
		}
	}
	return s.record(ctx, v, func(q store.Querier) error {
		if failed {
			if err := s.addMessage(ctx, q, v.ProjectID, "", v.ID, actionUpload, detailUpload); err != nil {
				return err
			}
		}
		delete(v.AdminMetadata, uploadImageKey)
		if _, err := q.Exec(ctx, "UPDATE volumes SET admin_metadata = ? WHERE id = ?", store.JSON(v.AdminMetadata), v.ID); err != nil {
			return err
		}
		// Cinder gives the volume back available either way; the
		// failure is the image's.
		_, err := s.setStatus(ctx, q, v, StatusAvailable, "", StatusUploading)
		return err
	})
}

// copyToImage stores the volume's data as image id's, in its disk format.
func (s *Service) copyToImage(ctx context.Context, v *volRow, id string) error {
	img, err := s.images.Get(ctx, v.ProjectID, true, id)
	if err != nil {
		return err
	}
	switch img.Status {
	case image.StatusActive:
		return nil // stored before a restart
	case image.StatusQueued:
	default:
		return fmt.Errorf("image %s is %s: an upload stopped half-way", id, img.Status)
	}
	src, done, err := s.backend.readFile(ctx, v.ID)
	if err != nil {
		return err
	}
	defer done()
	if img.DiskFormat == "raw" {
		f, err := os.Open(src)
		if err != nil {
			return err
		}
		defer f.Close()
		return s.images.FinishSnapshot(ctx, id, "raw", f)
	}
	bin, err := s.qemuImgPath()
	if err != nil {
		return fmt.Errorf("qemu-img: %w", err)
	}
	tmp, err := os.CreateTemp(s.dataDir, ".upload-*")
	if err != nil {
		return err
	}
	tmp.Close()
	defer os.Remove(tmp.Name())
	cctx, cancel := context.WithTimeout(ctx, convertTimeout)
	defer cancel()
	out, err := exec.CommandContext(cctx, bin, "convert", "-f", "raw", "-O", img.DiskFormat, src, tmp.Name()).CombinedOutput()
	if err != nil {
		return fmt.Errorf("converting to %s: %v: %s", img.DiskFormat, err, strings.TrimSpace(string(out)))
	}
	f, err := os.Open(tmp.Name())
	if err != nil {
		return err
	}
	defer f.Close()
	return s.images.FinishSnapshot(ctx, id, img.DiskFormat, io.Reader(f))
}
