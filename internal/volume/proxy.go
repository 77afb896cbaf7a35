package volume

import (
	"context"
	"time"

	"nimbus/internal/api"
)

// The proxy entry points let another service's API act on volumes and
// snapshots for its caller, as Nova's deprecated os-volumes and
// os-snapshots do through cinderclient with the user's token
// (nova/volume/cinder.py API.get, get_all, create, delete, get_snapshot,
// get_all_snapshots, create_snapshot(_force), delete_snapshot). They run
// with the caller's project and rights, never more: reads use the same
// visibility rule as this API (ownedVol, ownedSnap), and writes are the
// operations this API's handlers call (createVol, deleteVol, createSnap,
// deleteSnap), so quotas, billing and state rules are Cinder's.

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

// ProxyCreateVolume creates a volume for c as POST /v3/volumes does.
func (s *Service) ProxyCreateVolume(ctx context.Context, c *api.Caller, req ProxyVolumeRequest) (ProxyVolume, error) {
	size := req.Size
	v, err := s.createVol(ctx, c, VolumeSpec{Name: req.Name, Description: req.Description, Size: &size, Type: req.Type,
		Zone: req.Zone, SnapshotID: req.SnapshotID, Metadata: req.Metadata})
	if err != nil {
		return ProxyVolume{}, err
	}
	return s.ProxyVolume(ctx, c, v.ID)
}

// ProxyDeleteVolume deletes volume id for c as DELETE /v3/volumes/{id}
// does.
func (s *Service) ProxyDeleteVolume(ctx context.Context, c *api.Caller, id string) error {
	return s.deleteVol(ctx, c, id, false, false)
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

// ProxyCreateSnapshot takes a snapshot for c as POST /v3/snapshots does.
func (s *Service) ProxyCreateSnapshot(ctx context.Context, c *api.Caller, req ProxySnapshotRequest) (ProxySnapshot, error) {
	sn, err := s.createSnap(ctx, c, SnapshotSpec{VolumeID: req.VolumeID, Force: req.Force, Name: req.Name, Description: req.Description})
	if err != nil {
		return ProxySnapshot{}, err
	}
	return s.ProxySnapshot(ctx, c, sn.ID)
}

// ProxyDeleteSnapshot deletes snapshot id for c as
// DELETE /v3/snapshots/{id} does.
func (s *Service) ProxyDeleteSnapshot(ctx context.Context, c *api.Caller, id string) error {
	return s.deleteSnap(ctx, c, id, false)
}
