package volume

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"time"

	"nimbus/internal/api"
)

// The proxy entry points let another service's API act on volumes and
// snapshots for its caller, as Nova's deprecated os-volumes and
// os-snapshots do through cinderclient with the user's token
// (nova/volume/cinder.py API.get, get_all, create, delete, get_snapshot,
// get_all_snapshots, create_snapshot(_force), delete_snapshot). They run
// with the caller's project and rights, never more: reads use the same
// visibility rule as this API (ownedVol, ownedSnap), and writes go
// through this API's own handlers, so quotas, billing and state rules are
// Cinder's.

// ProxyVolume is a volume as a proxy shows it.
type ProxyVolume struct {
	ID, Status, Zone  string
	Size              int64
	Name, Description *string
	// Type is the volume type's name (its id when it has none).
	Type       string
	SnapshotID string
	Metadata   map[string]string
	CreatedAt  time.Time
	// Attachments are the attached ones (Cinder's attach_status
	// attached), oldest first.
	Attachments []Attachment
}

// ProxySnapshot is a snapshot as a proxy shows it.
type ProxySnapshot struct {
	ID, VolumeID, Status string
	Size                 int64
	Name, Description    *string
	CreatedAt            time.Time
}

// ProxyVolumeRequest is a volume to create. Nil fields are not given.
type ProxyVolumeRequest struct {
	Size              int64
	Name, Description *string
	Type, Zone        *string
	SnapshotID        *string
	Metadata          map[string]string
}

// ProxySnapshotRequest is a snapshot to take of VolumeID; Force takes one
// of an in-use volume.
type ProxySnapshotRequest struct {
	VolumeID          string
	Force             bool
	Name, Description *string
}

func proxyVolume(v *volRow) ProxyVolume {
	typ := v.TypeName
	if typ == "" {
		typ = v.TypeID
	}
	out := ProxyVolume{ID: v.ID, Status: v.Status, Zone: v.Zone, Size: v.Size, Name: v.Name, Description: v.Description,
		Type: typ, SnapshotID: v.SnapshotID, Metadata: visibleMetadata(v), CreatedAt: v.CreatedAt}
	for _, a := range v.Attachments {
		if a.Status == AttachAttached {
			out.Attachments = append(out.Attachments, a.Attachment)
		}
	}
	return out
}

func proxySnapshot(sn *snapRow) ProxySnapshot {
	return ProxySnapshot{ID: sn.ID, VolumeID: sn.VolumeID, Status: sn.Status, Size: sn.Size, Name: sn.Name,
		Description: sn.Description, CreatedAt: sn.CreatedAt}
}

// ProxyVolumes are the volumes of c's project, newest first (Cinder's
// list without all_tenants, which Nova never sends).
func (s *Service) ProxyVolumes(ctx context.Context, c *api.Caller) ([]ProxyVolume, error) {
	vols, err := loadVols(ctx, s.db, "v.project_id = ? ORDER BY v.created_at DESC, v.id DESC", c.ProjectID)
	if err != nil {
		return nil, err
	}
	if err := withAttachments(ctx, s.db, vols...); err != nil {
		return nil, err
	}
	out := make([]ProxyVolume, 0, len(vols))
	for _, v := range vols {
		out = append(out, proxyVolume(v))
	}
	return out, nil
}

// ProxyVolume is volume id if c may see it, else Cinder's 404.
func (s *Service) ProxyVolume(ctx context.Context, c *api.Caller, id string) (ProxyVolume, error) {
	v, err := ownedVol(ctx, s.db, c, id)
	if err != nil {
		return ProxyVolume{}, err
	}
	if err := withAttachments(ctx, s.db, v); err != nil {
		return ProxyVolume{}, err
	}
	return proxyVolume(v), nil
}

// ProxyCreateVolume creates a volume for c through POST /v3/volumes.
func (s *Service) ProxyCreateVolume(ctx context.Context, c *api.Caller, req ProxyVolumeRequest) (ProxyVolume, error) {
	b := map[string]any{"size": req.Size}
	for k, v := range map[string]*string{"name": req.Name, "description": req.Description, "volume_type": req.Type,
		"availability_zone": req.Zone, "snapshot_id": req.SnapshotID} {
		if v != nil {
			b[k] = *v
		}
	}
	if req.Metadata != nil {
		b["metadata"] = req.Metadata
	}
	resp, err := s.proxyCall(ctx, c, s.createVolume, "POST", "/v3/volumes", "", map[string]any{"volume": b})
	if err != nil {
		return ProxyVolume{}, err
	}
	return s.ProxyVolume(ctx, c, createdID(resp, "volume"))
}

// ProxyDeleteVolume deletes volume id for c through DELETE /v3/volumes/{id}.
func (s *Service) ProxyDeleteVolume(ctx context.Context, c *api.Caller, id string) error {
	_, err := s.proxyCall(ctx, c, s.deleteVolume, "DELETE", "/v3/volumes/", id, nil)
	return err
}

// ProxySnapshots are the snapshots of c's project, newest first.
func (s *Service) ProxySnapshots(ctx context.Context, c *api.Caller) ([]ProxySnapshot, error) {
	snaps, err := loadSnaps(ctx, s.db, "s.project_id = ? ORDER BY s.created_at DESC, s.id DESC", c.ProjectID)
	if err != nil {
		return nil, err
	}
	out := make([]ProxySnapshot, 0, len(snaps))
	for _, sn := range snaps {
		out = append(out, proxySnapshot(sn))
	}
	return out, nil
}

// ProxySnapshot is snapshot id if c may see it, else Cinder's 404.
func (s *Service) ProxySnapshot(ctx context.Context, c *api.Caller, id string) (ProxySnapshot, error) {
	sn, err := ownedSnap(ctx, s.db, c, id)
	if err != nil {
		return ProxySnapshot{}, err
	}
	return proxySnapshot(sn), nil
}

// ProxyCreateSnapshot takes a snapshot for c through POST /v3/snapshots.
func (s *Service) ProxyCreateSnapshot(ctx context.Context, c *api.Caller, req ProxySnapshotRequest) (ProxySnapshot, error) {
	b := map[string]any{"volume_id": req.VolumeID, "force": req.Force}
	if req.Name != nil {
		b["name"] = *req.Name
	}
	if req.Description != nil {
		b["description"] = *req.Description
	}
	resp, err := s.proxyCall(ctx, c, s.createSnapshot, "POST", "/v3/snapshots", "", map[string]any{"snapshot": b})
	if err != nil {
		return ProxySnapshot{}, err
	}
	return s.ProxySnapshot(ctx, c, createdID(resp, "snapshot"))
}

// ProxyDeleteSnapshot deletes snapshot id for c through
// DELETE /v3/snapshots/{id}.
func (s *Service) ProxyDeleteSnapshot(ctx context.Context, c *api.Caller, id string) error {
	_, err := s.proxyCall(ctx, c, s.deleteSnapshot, "DELETE", "/v3/snapshots/", id, nil)
	return err
}

// proxyCall runs one of this API's handlers in process as c, at the base
// microversion 3.0, with body as its JSON body and id as its {id}.
func (s *Service) proxyCall(ctx context.Context, c *api.Caller, h api.HandlerFunc, method, path, id string, body any) (*api.Response, error) {
	var raw []byte
	if body != nil {
		var err error
		if raw, err = json.Marshal(body); err != nil {
			return nil, err
		}
	}
	r, err := http.NewRequestWithContext(api.WithCaller(ctx, c), method, path+id, bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	r.Header.Set("Content-Type", "application/json")
	r.SetPathValue("id", id)
	// Before negotiates the version: with no header, Cinder's minimum,
	// whatever the calling API's request carried.
	if r, err = microversions.Before(r); err != nil {
		return nil, err
	}
	return h(r)
}

// createdID is the id in a create answer {key: {"id": …}}.
func createdID(resp *api.Response, key string) string {
	m, _ := resp.Body.(map[string]any)
	obj, _ := m[key].(map[string]any)
	id, _ := obj["id"].(string)
	return id
}
