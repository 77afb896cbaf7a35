package compute

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/volume"
)

// Nova's deprecated volume proxy (nova/api/openstack/compute/volumes.py
// VolumeController and SnapshotController, schemas/volumes.py create and
// snapshot_create): os-volumes and os-snapshots show and change the
// caller's block storage volumes and snapshots in Nova's words. Nova
// calls Cinder with the user's token; Nimbus calls the volume service in
// process as the same caller (volume.Service's Proxy* entry points), so
// the proxy can do nothing Cinder's API would refuse. Like the image
// proxy, it answers 404 from 2.36 (MAX_PROXY_API_SUPPORT_VERSION 2.35).

// volumeProxyRoutes are the os-volumes and os-snapshots endpoints.
func (s *Service) volumeProxyRoutes() []api.Route {
	return []api.Route{
		{Pattern: "GET /v2.1/os-volumes", Handler: s.osVolumeList},
		{Pattern: "GET /v2.1/os-volumes/detail", Handler: s.osVolumeList},
		{Pattern: "POST /v2.1/os-volumes", Handler: s.osVolumeCreate},
		{Pattern: "GET /v2.1/os-volumes/{id}", Handler: s.osVolumeShow},
		{Pattern: "DELETE /v2.1/os-volumes/{id}", Handler: s.osVolumeDelete},
		{Pattern: "GET /v2.1/os-snapshots", Handler: s.osSnapshotList},
		{Pattern: "GET /v2.1/os-snapshots/detail", Handler: s.osSnapshotList},
		{Pattern: "POST /v2.1/os-snapshots", Handler: s.osSnapshotCreate},
		{Pattern: "GET /v2.1/os-snapshots/{id}", Handler: s.osSnapshotShow},
		{Pattern: "DELETE /v2.1/os-snapshots/{id}", Handler: s.osSnapshotDelete},
	}
}

// VolumeProxy is what the proxy needs of the volume service
// (*volume.Service): its caller-scoped entry points.
type VolumeProxy interface {
	ProxyVolumes(ctx context.Context, c *api.Caller) ([]volume.ProxyVolume, error)
	ProxyVolume(ctx context.Context, c *api.Caller, id string) (volume.ProxyVolume, error)
	ProxyCreateVolume(ctx context.Context, c *api.Caller, req volume.ProxyVolumeRequest) (volume.ProxyVolume, error)
	ProxyDeleteVolume(ctx context.Context, c *api.Caller, id string) error
	ProxySnapshots(ctx context.Context, c *api.Caller) ([]volume.ProxySnapshot, error)
	ProxySnapshot(ctx context.Context, c *api.Caller, id string) (volume.ProxySnapshot, error)
	ProxyCreateSnapshot(ctx context.Context, c *api.Caller, req volume.ProxySnapshotRequest) (volume.ProxySnapshot, error)
	ProxyDeleteSnapshot(ctx context.Context, c *api.Caller, id string) error
}

var _ VolumeProxy = (*volume.Service)(nil)

// volumeProxy is the volume service behind the proxy, for a request at a
// microversion that has the proxy. A cloud without block storage answers
// 404, as Nova does for an API it does not serve.
func (s *Service) volumeProxy(r *http.Request) (VolumeProxy, *api.Caller, error) {
	if err := proxyDeprecated(r); err != nil {
		return nil, nil, err
	}
	p, ok := s.volumes.(VolumeProxy)
	if !ok {
		return nil, nil, api.NotFound("The resource could not be found.")
	}
	return p, api.CallerFrom(r.Context()), nil
}

// cinderTime is created_at as Cinder sends it, which Nova passes on.
func cinderTime(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000000") }

// osVolumeView is _translate_volume_detail_view (the summary view is the
// same): the first attachment of an attached volume, else [{}].
func osVolumeView(v volume.ProxyVolume) obj {
	att := []any{map[string]any{}}
	if len(v.Attachments) > 0 {
		a := obj{{"id", v.ID}, {"volumeId", v.ID}, {"serverId", v.Attachments[0].ServerID}}
		if d := v.Attachments[0].Device; d != "" {
			a.set("device", d)
		}
		att = []any{a}
	}
	meta := v.Metadata
	if meta == nil {
		meta = map[string]string{}
	}
	return obj{{"id", v.ID}, {"status", v.Status}, {"size", v.Size}, {"availabilityZone", v.Zone},
		{"createdAt", cinderTime(v.CreatedAt)}, {"attachments", att}, {"displayName", v.Name},
		{"displayDescription", v.Description}, {"volumeType", strOrNil(v.Type)}, {"snapshotId", strOrNil(v.SnapshotID)},
		{"metadata", meta}}
}

// osSnapshotView is _translate_snapshot_detail_view; size is the
// snapshot's volume_size.
func osSnapshotView(sn volume.ProxySnapshot) obj {
	return obj{{"id", sn.ID}, {"volumeId", sn.VolumeID}, {"status", sn.Status}, {"size", sn.Size},
		{"createdAt", cinderTime(sn.CreatedAt)}, {"displayName", sn.Name}, {"displayDescription", sn.Description}}
}

// limited is nova/api/openstack/common.py limited with
// get_pagination_params: offset, then at most limit (0 or none: the
// maximum, 1000); a limit or offset that is not a non-negative integer is
// 400.
func limited[T any](r *http.Request, items []T) ([]T, error) {
	q := r.URL.Query()
	param := func(key string) (int, error) {
		if !q.Has(key) {
			return 0, nil
		}
		n, err := strconv.Atoi(q.Get(key))
		if err != nil {
			return 0, api.BadRequest("%s param must be an integer", key)
		}
		if n < 0 {
			return 0, api.BadRequest("%s param must be positive", key)
		}
		return n, nil
	}
	limit, err := param("limit")
	if err != nil {
		return nil, err
	}
	offset, err := param("offset")
	if err != nil {
		return nil, err
	}
	if limit == 0 || limit > resMaxLimit {
		limit = resMaxLimit
	}
	items = items[min(offset, len(items)):]
	return items[:min(limit, len(items))], nil
}

func (s *Service) osVolumeList(r *http.Request) (*api.Response, error) {
	p, c, err := s.volumeProxy(r)
	if err != nil {
		return nil, err
	}
	vols, err := p.ProxyVolumes(r.Context(), c)
	if err != nil {
		return nil, err
	}
	if vols, err = limited(r, vols); err != nil {
		return nil, err
	}
	out := make([]any, 0, len(vols))
	for _, v := range vols {
		out = append(out, osVolumeView(v))
	}
	return api.JSON(http.StatusOK, map[string]any{"volumes": out}), nil
}

func (s *Service) osVolumeShow(r *http.Request) (*api.Response, error) {
	p, c, err := s.volumeProxy(r)
	if err != nil {
		return nil, err
	}
	v, err := p.ProxyVolume(r.Context(), c, r.PathValue("id"))
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, map[string]any{"volume": osVolumeView(v)}), nil
}

// osVolumeDelete is 202; Cinder's 400 for a volume in use stays a 400.
func (s *Service) osVolumeDelete(r *http.Request) (*api.Response, error) {
	p, c, err := s.volumeProxy(r)
	if err != nil {
		return nil, err
	}
	if err := p.ProxyDeleteVolume(r.Context(), c, r.PathValue("id")); err != nil {
		return nil, err
	}
	return api.Empty(http.StatusAccepted), nil
}

// osVolumeCreate is 200 (Nova never made it 202) with the new volume and
// its URL in Location.
func (s *Service) osVolumeCreate(r *http.Request) (*api.Response, error) {
	p, c, err := s.volumeProxy(r)
	if err != nil {
		return nil, err
	}
	req, err := parseOSVolumeCreate(r)
	if err != nil {
		return nil, err
	}
	ctx := r.Context()
	if req.SnapshotID != nil {
		// Nova reads the snapshot first: an unknown one is its 404.
		if _, err := p.ProxySnapshot(ctx, c, *req.SnapshotID); err != nil {
			return nil, err
		}
	}
	v, err := p.ProxyCreateVolume(ctx, c, req)
	if err != nil {
		return nil, overQuota(err)
	}
	return api.JSON(http.StatusOK, map[string]any{"volume": osVolumeView(v)}).
		WithHeader("Location", links(r, "os-volumes/"+v.ID)[0]["href"]), nil
}

// overQuota turns Cinder's 413 for a quota into Nova's 403 (create's
// "except exception.OverQuota: raise exc.HTTPForbidden").
func overQuota(err error) error {
	var ae *api.Error
	if errors.As(err, &ae) && ae.Status == http.StatusRequestEntityTooLarge {
		return api.Forbidden("%s", ae.Message)
	}
	return err
}

// proxyBody reads {key: {...}} with the object's allowed fields, in the
// words of Nova's schema errors.
func proxyBody(r *http.Request, key string, allowed ...string) (map[string]json.RawMessage, error) {
	var body map[string]json.RawMessage
	if err := api.DecodeJSON(r, &body); err != nil {
		return nil, err
	}
	if body == nil {
		return nil, api.BadRequest("Invalid input for field/attribute body. Value: null. None is not of type 'object'")
	}
	if err := api.UnknownFields(body, key); err != nil {
		return nil, err
	}
	raw, ok := body[key]
	if !ok {
		return nil, api.BadRequest("Invalid input for field/attribute %s. Value: %s. '%s' is a required property", key, mustJSON(body), key)
	}
	var inner map[string]json.RawMessage
	if err := json.Unmarshal(raw, &inner); err != nil || inner == nil {
		return nil, badField(key, raw, fmt.Sprintf("%s is not of type 'object'", raw))
	}
	if err := api.UnknownFields(inner, allowed...); err != nil {
		return nil, err
	}
	return inner, nil
}

// parseOSVolumeCreate is schemas/volumes.py create. size is an integer
// of at least 1 or a string of digits (which Cinder then checks); a
// string size "0" passes the schema and is Cinder's 400.
func parseOSVolumeCreate(r *http.Request) (volume.ProxyVolumeRequest, error) {
	var req volume.ProxyVolumeRequest
	vol, err := proxyBody(r, "volume", "volume_type", "metadata", "snapshot_id", "size", "availability_zone",
		"display_name", "display_description")
	if err != nil {
		return req, err
	}
	for field, dst := range map[string]**string{"volume_type": &req.Type, "snapshot_id": &req.SnapshotID,
		"availability_zone": &req.Zone, "display_name": &req.Name, "display_description": &req.Description} {
		if *dst, err = strField(vol, field); err != nil {
			return req, err
		}
	}
	if raw, ok := vol["metadata"]; ok {
		var meta map[string]json.RawMessage
		if err := json.Unmarshal(raw, &meta); err != nil || meta == nil {
			return req, badField("metadata", raw, fmt.Sprintf("%s is not of type 'object'", raw))
		}
		req.Metadata = map[string]string{}
		for k, v := range meta {
			val, ok := rawString(v)
			if !ok || strings.TrimSpace(string(v)) == "null" {
				// Cinder's metadata schema: values are strings.
				return req, api.BadRequest("Invalid input for field/attribute metadata. Value: %s. %s is not of type 'string'", raw, v)
			}
			req.Metadata[k] = val
		}
	}
	raw, ok := vol["size"]
	if !ok {
		return req, badField("volume", rawJSON(vol), "'size' is a required property")
	}
	if req.Size, err = osVolumeSize(raw); err != nil {
		return req, err
	}
	return req, nil
}

// rawJSON is an object as JSON text, for a schema error's Value.
func rawJSON(obj map[string]json.RawMessage) json.RawMessage {
	return json.RawMessage(mustJSON(obj))
}

// osVolumeSize is the size property: {'type': ['integer', 'string'],
// 'pattern': '^[0-9]+$', 'minimum': 1}.
func osVolumeSize(raw json.RawMessage) (int64, error) {
	if strings.TrimSpace(string(raw)) == "null" {
		return 0, badField("size", raw, "None is not of type 'integer', 'string'")
	}
	if s, ok := rawString(raw); ok {
		if s == "" || strings.TrimLeft(s, "0123456789") != "" {
			return 0, badField("size", raw, fmt.Sprintf("'%s' does not match '^[0-9]+$'", s))
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n > 2147483647 {
			// cinder/api/schemas volume_size maximum
			return 0, badField("size", raw, fmt.Sprintf("'%s' is greater than the maximum of 2147483647", s))
		}
		return n, nil
	}
	var n json.Number
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.UseNumber()
	if err := dec.Decode(&n); err != nil {
		return 0, badField("size", raw, fmt.Sprintf("%s is not of type 'integer', 'string'", api.PyRepr(raw)))
	}
	i, err := strconv.ParseInt(n.String(), 10, 64)
	if err != nil {
		if f, ferr := n.Float64(); ferr == nil && f > 2147483647 {
			return 0, badField("size", raw, fmt.Sprintf("%s is greater than the maximum of 2147483647", n))
		}
		return 0, badField("size", raw, fmt.Sprintf("%s is not of type 'integer', 'string'", n))
	}
	if i < 1 {
		return 0, badField("size", raw, fmt.Sprintf("%d is less than the minimum of 1", i))
	}
	if i > 2147483647 {
		return 0, badField("size", raw, fmt.Sprintf("%d is greater than the maximum of 2147483647", i))
	}
	return i, nil
}

func (s *Service) osSnapshotList(r *http.Request) (*api.Response, error) {
	p, c, err := s.volumeProxy(r)
	if err != nil {
		return nil, err
	}
	snaps, err := p.ProxySnapshots(r.Context(), c)
	if err != nil {
		return nil, err
	}
	if snaps, err = limited(r, snaps); err != nil {
		return nil, err
	}
	out := make([]any, 0, len(snaps))
	for _, sn := range snaps {
		out = append(out, osSnapshotView(sn))
	}
	return api.JSON(http.StatusOK, map[string]any{"snapshots": out}), nil
}

func (s *Service) osSnapshotShow(r *http.Request) (*api.Response, error) {
	p, c, err := s.volumeProxy(r)
	if err != nil {
		return nil, err
	}
	sn, err := p.ProxySnapshot(r.Context(), c, r.PathValue("id"))
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, map[string]any{"snapshot": osSnapshotView(sn)}), nil
}

// osSnapshotDelete is 202.
func (s *Service) osSnapshotDelete(r *http.Request) (*api.Response, error) {
	p, c, err := s.volumeProxy(r)
	if err != nil {
		return nil, err
	}
	if err := p.ProxyDeleteSnapshot(r.Context(), c, r.PathValue("id")); err != nil {
		return nil, err
	}
	return api.Empty(http.StatusAccepted), nil
}

// osSnapshotCreate is schemas/volumes.py snapshot_create, then 200 with
// the new snapshot; force (parameter_types.boolean) snapshots an in-use
// volume.
func (s *Service) osSnapshotCreate(r *http.Request) (*api.Response, error) {
	p, c, err := s.volumeProxy(r)
	if err != nil {
		return nil, err
	}
	b, err := proxyBody(r, "snapshot", "volume_id", "force", "display_name", "display_description")
	if err != nil {
		return nil, err
	}
	var req volume.ProxySnapshotRequest
	volID, err := strField(b, "volume_id")
	if err != nil {
		return nil, err
	}
	if volID == nil {
		return nil, badField("snapshot", rawJSON(b), "'volume_id' is a required property")
	}
	req.VolumeID = *volID
	if raw, ok := b["force"]; ok {
		if req.Force, err = rawBool("force", raw); err != nil {
			return nil, err
		}
	}
	if req.Name, err = strField(b, "display_name"); err != nil {
		return nil, err
	}
	if req.Description, err = strField(b, "display_description"); err != nil {
		return nil, err
	}
	sn, err := p.ProxyCreateSnapshot(r.Context(), c, req)
	if err != nil {
		return nil, overQuota(err)
	}
	return api.JSON(http.StatusOK, map[string]any{"snapshot": osSnapshotView(sn)}), nil
}
