package compute

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strings"

	"nimbus/internal/api"
	"nimbus/internal/image"
	"nimbus/internal/metering"
	"nimbus/internal/store"
)

// createImage of a server booted from a volume, and booting from such an
// image (compute/api.py snapshot_volume_backed and
// _get_image_defined_bdms): the image holds no data, only Nova's
// block_device_mapping of Cinder snapshots of the server's volumes, and a
// server booted from it gets volumes made from those snapshots.

// volumeBackedImage is createImage of a volume-backed server: a snapshot
// of each of its volumes, taken with the caller's rights, and an active
// image of size 0 naming them, in one transaction.
func (s *Service) volumeBackedImage(r *http.Request, name string, meta map[string]string) (*api.Response, error) {
	ctx := r.Context()
	c := api.CallerFrom(ctx)
	pre, err := s.visibleServer(ctx, s.db, r.PathValue("id"), false)
	if err != nil {
		return nil, err
	}
	// A snapshot of each attached volume starts its charge: the funds must
	// pay their first hour.
	var gb int64
	for _, bd := range pre.Doc.BlockDevices {
		if bd.AttachmentID == "" {
			continue
		}
		v, err := s.volumes.VolumeForServer(ctx, s.db, c, bd.VolumeID)
		if err != nil {
			return nil, err
		}
		gb += v.SizeGB
	}
	if s.gate != nil {
		if _, err := s.gate.Cover(ctx, pre.ProjectID, metering.KindSnapshot, metering.Spec{SizeGB: gb}, 1, 1); err != nil {
			return nil, err
		}
	}
	baseRef := pre.ImageRef
	if baseRef == "" {
		baseRef = pre.Doc.BootImage
	}
	base := s.imageBase(ctx, pre.ProjectID, baseRef)
	var imageID string
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		sv, err := s.visibleServer(ctx, tx, r.PathValue("id"), true)
		if err != nil {
			return err
		}
		if err := checkState(sv, "createImage", c); err != nil {
			return err
		}
		var mappings []map[string]any
		for _, bd := range sv.Doc.BlockDevices {
			if bd.AttachmentID == "" {
				continue
			}
			v, err := s.volumes.VolumeForServer(ctx, tx, c, bd.VolumeID)
			if err != nil {
				return err
			}
			snap, err := s.volumes.SnapshotForImage(ctx, tx, c, bd.VolumeID, name)
			if err != nil {
				return volumeQuotaAsNova(err)
			}
			m := map[string]any{"source_type": "snapshot", "destination_type": "volume", "snapshot_id": snap,
				"volume_size": v.SizeGB, "delete_on_termination": bd.DeleteOnTermination, "device_type": "disk",
				"boot_index": nil, "volume_id": nil, "image_id": nil, "no_device": nil, "disk_bus": nil, "guest_format": nil,
				"tag": nil, "device_name": nil}
			if bd.BootIndex >= 0 {
				m["boot_index"] = bd.BootIndex
			}
			if bd.BootIndex == 0 {
				m["device_name"] = rootDevice
			}
			if bd.Tag != "" {
				m["tag"] = bd.Tag
			}
			mappings = append(mappings, m)
		}
		props := map[string]string{"image_type": "snapshot"}
		for k, v := range meta {
			props[k] = v
		}
		raw, _ := json.Marshal(mappings)
		props["instance_uuid"], props["user_id"] = sv.ID, c.UserID
		props["block_device_mapping"], props["bdm_v2"], props["root_device_name"] = string(raw), "True", rootDevice
		if baseRef != "" {
			props["base_image_ref"] = baseRef
		}
		img, err := s.images.CreateSnapshot(ctx, tx, sv.ProjectID, name, props, base, licenceOf(sv))
		if err != nil {
			return err
		}
		imageID = img.ID
		return s.recordAction(ctx, tx, sv.ID, "createImage")
	})
	if err != nil {
		return nil, err
	}
	// The image holds no data: it is active at once, of size 0.
	if err := s.images.FinishSnapshot(ctx, imageID, "raw", bytes.NewReader(nil)); err != nil {
		return nil, err
	}
	if VersionFrom(ctx).AtLeast(45) {
		return api.JSON(http.StatusAccepted, map[string]any{"image_id": imageID}), nil
	}
	return api.Empty(http.StatusAccepted).WithHeader("Location", imageURL(r, imageID)), nil
}

// imageDefinedBDMs adds to a create that boots an image the volume
// mappings the image names (an image made by createImage of a
// volume-backed server), unless the create names its own boot volume.
// It answers the image it read, and the error reading it, for the create
// to check (nil, nil when it read none).
func (s *Service) imageDefinedBDMs(ctx context.Context, c *api.Caller, req *createReq) (*image.Image, error) {
	if req.ImageRef == "" || req.bootVolumeReq() != nil {
		return nil, nil
	}
	img, err := s.images.Get(ctx, c.ProjectID, c.IsAdmin(), req.ImageRef)
	if err != nil || !strings.EqualFold(img.Properties["bdm_v2"], "true") {
		return img, err
	}
	var mappings []struct {
		Source     string `json:"source_type"`
		Dest       string `json:"destination_type"`
		SnapshotID string `json:"snapshot_id"`
		BootIndex  *int   `json:"boot_index"`
		VolumeSize int64  `json:"volume_size"`
		DOT        bool   `json:"delete_on_termination"`
		Tag        string `json:"tag"`
	}
	if json.Unmarshal([]byte(img.Properties["block_device_mapping"]), &mappings) != nil {
		return img, nil
	}
	for _, m := range mappings {
		if m.Source != "snapshot" || m.Dest != "volume" || m.SnapshotID == "" {
			continue
		}
		b := bdmReq{Source: "snapshot", Dest: "volume", UUID: m.SnapshotID, BootIndex: -1, VolumeSize: m.VolumeSize,
			DeleteOnTermination: m.DOT, Tag: m.Tag}
		if m.BootIndex != nil {
			b.BootIndex = *m.BootIndex
		}
		req.BDMs = append(req.BDMs, b)
	}
	return img, nil
}
