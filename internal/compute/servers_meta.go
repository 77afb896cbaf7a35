package compute

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// Server metadata (nova/api/openstack/compute/server_metadata.py) and tags
// (server_tags.py).

func (s *Service) handleMetaList(r *http.Request) (*api.Response, error) {
	sv, err := s.visibleServer(r.Context(), s.db, r.PathValue("id"), false)
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, map[string]any{"metadata": sv.Doc.Metadata}), nil
}

func (s *Service) handleMetaGet(r *http.Request) (*api.Response, error) {
	sv, err := s.visibleServer(r.Context(), s.db, r.PathValue("id"), false)
	if err != nil {
		return nil, err
	}
	k := r.PathValue("key")
	v, ok := sv.Doc.Metadata[k]
	if !ok {
		return nil, api.NotFound("Metadata item was not found")
	}
	return api.JSON(http.StatusOK, map[string]any{"meta": map[string]string{k: v}}), nil
}

// decodeMetaBody reads {"<key>": {string: string}}.
func decodeMetaBody(r *http.Request, key string) (map[string]string, error) {
	var body map[string]json.RawMessage
	if err := api.DecodeJSON(r, &body); err != nil {
		return nil, err
	}
	if err := api.UnknownFields(body, key); err != nil {
		return nil, err
	}
	raw, ok := body[key]
	if !ok {
		return nil, api.BadRequest("Invalid input for field/attribute %s. '%s' is a required property", key, key)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil || m == nil {
		return nil, badField(key, raw, fmt.Sprintf("%s is not of type 'object'", raw))
	}
	return checkMetadata(key, m)
}

// updateMeta changes a server's metadata in one transaction under the
// state rule and the metadata_items quota.
func (s *Service) updateMeta(r *http.Request, rule string, f func(m map[string]string) error) (map[string]string, error) {
	ctx := r.Context()
	c := api.CallerFrom(ctx)
	var out map[string]string
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		sv, err := s.visibleServer(ctx, tx, r.PathValue("id"), true)
		if err != nil {
			return err
		}
		if err := checkState(sv, rule, c); err != nil {
			return err
		}
		if err := f(sv.Doc.Metadata); err != nil {
			return err
		}
		q, err := s.quotaFor(ctx, tx, sv.ProjectID)
		if err != nil {
			return err
		}
		if err := checkMetadataCount(q.MetadataItems, len(sv.Doc.Metadata)); err != nil {
			return err
		}
		out = sv.Doc.Metadata
		return s.saveServer(ctx, tx, sv)
	})
	return out, err
}

func (s *Service) handleMetaSet(replace bool) api.HandlerFunc {
	return func(r *http.Request) (*api.Response, error) {
		in, err := decodeMetaBody(r, "metadata")
		if err != nil {
			return nil, err
		}
		out, err := s.updateMeta(r, "update_metadata", func(m map[string]string) error {
			if replace {
				clear(m)
			}
			for k, v := range in {
				m[k] = v
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		if replace {
			out = in
		}
		return api.JSON(http.StatusOK, map[string]any{"metadata": out}), nil
	}
}

func (s *Service) handleMetaPut(r *http.Request) (*api.Response, error) {
	in, err := decodeMetaBody(r, "meta")
	if err != nil {
		return nil, err
	}
	k := r.PathValue("key")
	if len(in) > 1 {
		return nil, api.BadRequest("Request body contains too many items")
	}
	if _, ok := in[k]; !ok {
		return nil, api.BadRequest("Request body and URI mismatch")
	}
	if _, err := s.updateMeta(r, "update_metadata", func(m map[string]string) error {
		m[k] = in[k]
		return nil
	}); err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, map[string]any{"meta": in}), nil
}

func (s *Service) handleMetaDelete(r *http.Request) (*api.Response, error) {
	k := r.PathValue("key")
	if _, err := s.updateMeta(r, "delete_metadata", func(m map[string]string) error {
		if _, ok := m[k]; !ok {
			return api.NotFound("Metadata item was not found")
		}
		delete(m, k)
		return nil
	}); err != nil {
		return nil, err
	}
	return api.Empty(http.StatusNoContent), nil
}

// tagServer loads a server for a tag call: tags exist from 2.26.
func (s *Service) tagsSupported(r *http.Request) error {
	if !VersionFrom(r.Context()).AtLeast(26) {
		return api.NotFound("The resource could not be found.")
	}
	return nil
}

func (s *Service) handleTagList(r *http.Request) (*api.Response, error) {
	if err := s.tagsSupported(r); err != nil {
		return nil, err
	}
	sv, err := s.visibleServer(r.Context(), s.db, r.PathValue("id"), false)
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, map[string]any{"tags": sv.Tags}), nil
}

func (s *Service) handleTagCheck(r *http.Request) (*api.Response, error) {
	if err := s.tagsSupported(r); err != nil {
		return nil, err
	}
	sv, err := s.visibleServer(r.Context(), s.db, r.PathValue("id"), false)
	if err != nil {
		return nil, err
	}
	tag := r.PathValue("tag")
	if !slices.Contains(sv.Tags, tag) {
		return nil, api.NotFound("Instance %s has no tag '%s'", sv.ID, tag)
	}
	return api.Empty(http.StatusNoContent), nil
}

func (s *Service) updateTags(r *http.Request, rule string, f func(sv *server) error) (*server, error) {
	if err := s.tagsSupported(r); err != nil {
		return nil, err
	}
	ctx := r.Context()
	c := api.CallerFrom(ctx)
	var out *server
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		sv, err := s.visibleServer(ctx, tx, r.PathValue("id"), true)
		if err != nil {
			return err
		}
		if err := checkState(sv, rule, c); err != nil {
			return err
		}
		if err := f(sv); err != nil {
			return err
		}
		out = sv
		return s.saveServer(ctx, tx, sv)
	})
	return out, err
}

func (s *Service) handleTagReplace(r *http.Request) (*api.Response, error) {
	if err := s.tagsSupported(r); err != nil {
		return nil, err
	}
	var body map[string]json.RawMessage
	if err := api.DecodeJSON(r, &body); err != nil {
		return nil, err
	}
	if err := api.UnknownFields(body, "tags"); err != nil {
		return nil, err
	}
	var tags []string
	raw, ok := body["tags"]
	if !ok {
		return nil, api.BadRequest("Invalid input for field/attribute tags. 'tags' is a required property")
	}
	if err := json.Unmarshal(raw, &tags); err != nil || tags == nil {
		return nil, badField("tags", raw, fmt.Sprintf("%s is not of type 'array'", raw))
	}
	if err := checkTags(tags); err != nil {
		return nil, err
	}
	uniq := []string{}
	for _, t := range tags {
		if !slices.Contains(uniq, t) {
			uniq = append(uniq, t)
		}
	}
	sv, err := s.updateTags(r, "update_tags", func(sv *server) error { sv.Tags = uniq; return nil })
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, map[string]any{"tags": sv.Tags}), nil
}

func (s *Service) handleTagDeleteAll(r *http.Request) (*api.Response, error) {
	if _, err := s.updateTags(r, "delete_tags", func(sv *server) error { sv.Tags = []string{}; return nil }); err != nil {
		return nil, err
	}
	return api.Empty(http.StatusNoContent), nil
}

func (s *Service) handleTagAdd(r *http.Request) (*api.Response, error) {
	tag := r.PathValue("tag")
	if err := checkTags([]string{tag}); err != nil {
		return nil, err
	}
	existed := false
	sv, err := s.updateTags(r, "update_tags", func(sv *server) error {
		if slices.Contains(sv.Tags, tag) {
			existed = true
			return nil
		}
		if len(sv.Tags) >= 50 {
			return api.BadRequest("The number of tags exceeded the per-server limit 50")
		}
		sv.Tags = append(sv.Tags, tag)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if existed {
		return api.Empty(http.StatusNoContent), nil
	}
	loc := links(r, "servers/"+sv.ID+"/tags/"+tag)[0]["href"]
	return api.Empty(http.StatusCreated).WithHeader("Location", loc), nil
}

func (s *Service) handleTagDelete(r *http.Request) (*api.Response, error) {
	tag := r.PathValue("tag")
	if _, err := s.updateTags(r, "delete_tags", func(sv *server) error {
		i := slices.Index(sv.Tags, tag)
		if i < 0 {
			return api.NotFound("Instance %s has no tag '%s'", sv.ID, tag)
		}
		sv.Tags = slices.Delete(sv.Tags, i, i+1)
		return nil
	}); err != nil {
		return nil, err
	}
	return api.Empty(http.StatusNoContent), nil
}

// metadataOverLimit is nova's MetadataLimitExceeded, a 403
// (nova/compute/api.py _check_metadata_properties_quota).
func metadataOverLimit(allowed int) error {
	return api.Forbidden("Maximum number of metadata items exceeds %d", allowed)
}

// maxMetadataItems caps a server's metadata even where the metadata_items
// quota is unlimited (-1) or higher: it rides in every server document.
const maxMetadataItems = 1024

// checkMetadataCount refuses n metadata items past the quota or the cap.
func checkMetadataCount(quota, n int) error {
	limit := quota
	if limit < 0 || limit > maxMetadataItems {
		limit = maxMetadataItems
	}
	if n > limit {
		return metadataOverLimit(limit)
	}
	return nil
}
