package volume

import (
	"context"
	"encoding/json"
	"net/http"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// A volume's image metadata (volume_image_metadata, Cinder's
// cinder/api/contrib/volume_image_metadata.py actions): copied from the
// image it was made from, and then its owner's to change. Nothing the
// service decides by reads it: the licence an uploaded image inherits
// comes from the service-written SourceImageID.

// volumeImageMeta is a volume's image metadata as a metadata resource.
// It does not change while the volume is being made from its image,
// uploaded, or deleted.
var volumeImageMeta = metaOwner{table: "volumes", column: "image_metadata",
	load: func(ctx context.Context, q store.Querier, c *api.Caller, id string) (map[string]string, error, error) {
		v, err := ownedVol(ctx, q, c, id)
		if err != nil {
			return nil, nil, err
		}
		switch v.Status {
		case StatusCreating, StatusUploading, StatusDeleting:
			return v.ImageMetadata, invalidVolume("Volume %s status must not be %s to change its image metadata.", v.ID, v.Status), nil
		}
		return v.ImageMetadata, nil, nil
	}}

// setImageMetadata is os-set_image_metadata {"metadata": {...}}: merged
// into the volume's image metadata, answering all of it.
func (s *Service) setImageMetadata(r *http.Request, raw json.RawMessage) (*api.Response, error) {
	b, err := actionBody("os-set_image_metadata", raw)
	if err != nil {
		return nil, err
	}
	if err := api.UnknownFields(b, "metadata"); err != nil {
		return nil, err
	}
	mraw, ok := b["metadata"]
	if !ok {
		return nil, api.BadRequest("Malformed request body")
	}
	meta, err := parseMetadata("metadata", mraw)
	if err != nil {
		return nil, err
	}
	return s.changeMetadata(r, volumeImageMeta, func(m map[string]string) (map[string]string, error) {
		for k, v := range meta {
			m[k] = v
		}
		return m, nil
	}, func(m map[string]string) any { return map[string]any{"metadata": m} })
}

// unsetImageMetadata is os-unset_image_metadata {"key": k}: 200 with no
// body; 404 for a key the volume's image metadata lacks.
func (s *Service) unsetImageMetadata(r *http.Request, raw json.RawMessage) (*api.Response, error) {
	b, err := actionBody("os-unset_image_metadata", raw)
	if err != nil {
		return nil, err
	}
	if err := api.UnknownFields(b, "key"); err != nil {
		return nil, err
	}
	key, err := b.optString("key", 255)
	if err != nil {
		return nil, err
	}
	if key == nil || *key == "" {
		return nil, api.BadRequest("Malformed request body")
	}
	if _, err := s.changeMetadata(r, volumeImageMeta, func(m map[string]string) (map[string]string, error) {
		if _, ok := m[*key]; !ok {
			return nil, api.NotFound("Glance metadata for volume %s cannot be found.", r.PathValue("id"))
		}
		delete(m, *key)
		return m, nil
	}, func(map[string]string) any { return nil }); err != nil {
		return nil, err
	}
	return api.Empty(http.StatusOK), nil
}

// showImageMetadata is os-show_image_metadata: {"metadata": {...}}.
func (s *Service) showImageMetadata(r *http.Request) (*api.Response, error) {
	v, err := ownedVol(r.Context(), s.db, caller(r), r.PathValue("id"))
	if err != nil {
		return nil, err
	}
	return api.JSON(200, map[string]any{"metadata": v.ImageMetadata}), nil
}
