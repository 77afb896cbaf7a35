package volume

import (
	"context"
	"encoding/json"
	"net/http"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// Cinder's metadata API (cinder/api/v2/volume_metadata.py and
// v3/snapshot_metadata.py), the same for volumes and snapshots.

// metaOwner is a resource with a metadata API.
type metaOwner struct {
	// load reads the caller's resource id: its metadata, and why it may
	// not change now (nil when it may).
	load func(ctx context.Context, q store.Querier, c *api.Caller, id string) (meta map[string]string, busy, err error)
	// table holds the resource's metadata and updated_at columns; column
	// names the metadata's ("metadata" when empty).
	table, column string
}

var (
	volumeMeta = metaOwner{table: "volumes", load: func(ctx context.Context, q store.Querier, c *api.Caller, id string) (map[string]string, error, error) {
		v, err := ownedVol(ctx, q, c, id)
		if err != nil {
			return nil, nil, err
		}
		if v.Status == StatusDeleting {
			return v.Metadata, invalidVolume("Volume %s is being deleted.", v.ID), nil
		}
		return v.Metadata, nil, nil
	}}
	snapshotMeta = metaOwner{table: "volume_snapshots", load: func(ctx context.Context, q store.Querier, c *api.Caller, id string) (map[string]string, error, error) {
		sn, err := ownedSnap(ctx, q, c, id)
		if err != nil {
			return nil, nil, err
		}
		if sn.Status == SnapDeleting {
			return sn.Metadata, invalidSnapshot("Snapshot %s is being deleted.", sn.ID), nil
		}
		return sn.Metadata, nil, nil
	}}
)

// metadataRoutes are the metadata API of the resources under prefix.
func (s *Service) metadataRoutes(prefix string, o metaOwner) []api.Route {
	return []api.Route{
		{Pattern: "GET " + prefix + "/{id}/metadata", Handler: s.listMetadata(o)},
		{Pattern: "POST " + prefix + "/{id}/metadata", Handler: s.setMetadata(o, false)},
		{Pattern: "PUT " + prefix + "/{id}/metadata", Handler: s.setMetadata(o, true)},
		{Pattern: "GET " + prefix + "/{id}/metadata/{key}", Handler: s.showMetadataItem(o)},
		{Pattern: "PUT " + prefix + "/{id}/metadata/{key}", Handler: s.putMetadataItem(o)},
		{Pattern: "DELETE " + prefix + "/{id}/metadata/{key}", Handler: s.deleteMetadataItem(o)},
	}
}

func (s *Service) listMetadata(o metaOwner) api.HandlerFunc {
	return func(r *http.Request) (*api.Response, error) {
		meta, _, err := o.load(r.Context(), s.db, caller(r), r.PathValue("id"))
		if err != nil {
			return nil, err
		}
		return api.JSON(200, map[string]any{"metadata": meta}), nil
	}
}

// setMetadata is POST (merge) and PUT (replace) of {"metadata": {...}},
// answering the whole set.
func (s *Service) setMetadata(o metaOwner, replace bool) api.HandlerFunc {
	return func(r *http.Request) (*api.Response, error) {
		var outer map[string]json.RawMessage
		if err := api.DecodeJSON(r, &outer); err != nil {
			return nil, err
		}
		raw, ok := outer["metadata"]
		if !ok {
			return nil, api.BadRequest("Malformed request body")
		}
		meta, err := parseMetadata("metadata", raw)
		if err != nil {
			return nil, err
		}
		return s.changeMetadata(r, o, func(m map[string]string) (map[string]string, error) {
			if replace {
				return meta, nil
			}
			for k, v := range meta {
				m[k] = v
			}
			return m, nil
		}, func(m map[string]string) any { return map[string]any{"metadata": m} })
	}
}

// changeMetadata applies change to the resource's metadata in one
// transaction and answers what answer makes of the result.
func (s *Service) changeMetadata(r *http.Request, o metaOwner, change func(map[string]string) (map[string]string, error), answer func(map[string]string) any) (*api.Response, error) {
	ctx := r.Context()
	var out map[string]string
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		id := r.PathValue("id")
		meta, busy, err := o.load(ctx, tx, caller(r), id)
		if err != nil {
			return err
		}
		if busy != nil {
			return busy
		}
		before := len(meta)
		if out, err = change(meta); err != nil {
			return err
		}
		// A merge may pass the bound; metadata already past it (from
		// before there was one) may still shrink.
		if len(out) > maxMetadata && len(out) > before {
			return errTooMuchMetadata()
		}
		col := o.column
		if col == "" {
			col = "metadata"
		}
		_, err = tx.Exec(ctx, "UPDATE "+o.table+" SET "+col+" = ?, updated_at = ? WHERE id = ?", store.JSON(out), store.FormatTime(s.now()), id)
		return err
	})
	if err != nil {
		return nil, err
	}
	return api.JSON(200, answer(out)), nil
}

func (s *Service) showMetadataItem(o metaOwner) api.HandlerFunc {
	return func(r *http.Request) (*api.Response, error) {
		meta, _, err := o.load(r.Context(), s.db, caller(r), r.PathValue("id"))
		if err != nil {
			return nil, err
		}
		key := r.PathValue("key")
		val, ok := meta[key]
		if !ok {
			return nil, api.NotFound("Metadata item was not found")
		}
		return api.JSON(200, map[string]any{"meta": map[string]string{key: val}}), nil
	}
}

// putMetadataItem is PUT /metadata/{key} with {"meta": {key: value}}.
func (s *Service) putMetadataItem(o metaOwner) api.HandlerFunc {
	return func(r *http.Request) (*api.Response, error) {
		var outer map[string]json.RawMessage
		if err := api.DecodeJSON(r, &outer); err != nil {
			return nil, err
		}
		raw, ok := outer["meta"]
		if !ok {
			return nil, api.BadRequest("Malformed request body")
		}
		meta, err := parseMetadata("meta", raw)
		if err != nil {
			return nil, err
		}
		key := r.PathValue("key")
		if _, ok := meta[key]; !ok {
			return nil, api.BadRequest("Request body and URI mismatch")
		}
		if len(meta) > 1 {
			return nil, api.BadRequest("Request body contains too many items")
		}
		return s.changeMetadata(r, o, func(m map[string]string) (map[string]string, error) {
			m[key] = meta[key]
			return m, nil
		}, func(map[string]string) any { return map[string]any{"meta": meta} })
	}
}

func (s *Service) deleteMetadataItem(o metaOwner) api.HandlerFunc {
	return func(r *http.Request) (*api.Response, error) {
		key := r.PathValue("key")
		if _, err := s.changeMetadata(r, o, func(m map[string]string) (map[string]string, error) {
			if _, ok := m[key]; !ok {
				return nil, api.NotFound("Metadata item was not found")
			}
			delete(m, key)
			return m, nil
		}, func(map[string]string) any { return nil }); err != nil {
			return nil, err
		}
		return api.Empty(http.StatusOK), nil
	}
}
