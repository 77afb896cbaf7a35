package volume

import (
	"context"
	"errors"
	"strconv"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// Volumes compute makes for a server's block device mappings (Nova's
// _prep_block_device: source image, snapshot or blank, destination
// volume), and the mark of a root volume that a network-disk flavor
// already pays for.

// FlavorDiskKey is the admin metadata key (written by the service only,
// never by the volume's owner) of a server's root volume made for a
// flavor whose price includes its disk (nimbus:disk_type=network): its
// value is the number of GiB the flavor pays for, which the volume's own
// metering leaves out, so that the disk is charged once, with the server.
// A volume grown past it is charged for the excess only.
const FlavorDiskKey = "nimbus_flavor_disk_gb"

// ServerVolumeRequest asks for a new volume for a server's block device
// mapping.
type ServerVolumeRequest struct {
	// Caller is the one who created the server: the volume is theirs,
	// made with their rights and counted against their project's quota.
	Caller *api.Caller
	// Name of the volume (Nova names them after nothing; Cinder shows "").
	Name string
	// SizeGB is the size; 0 takes the source's (an image's or snapshot's).
	SizeGB int64
	// ImageID or SnapshotID is the source; neither makes a blank volume.
	ImageID, SnapshotID string
	// Type is the volume type's name or id ("" : the default).
	Type string
	// FlavorDisk marks the volume as the root disk a flavor's price
	// includes, FlavorDiskGB of it (FlavorDiskKey).
	FlavorDisk   bool
	FlavorDiskGB int64
}

// CreateForServer makes a volume in tx as POST /volumes would for the
// request's caller (the same checks, quota and errors), in status
// creating; its data is made after commit. It answers the volume's id.
func (s *Service) CreateForServer(ctx context.Context, tx *store.Tx, req ServerVolumeRequest) (string, error) {
	c := req.Caller
	name := req.Name
	v := &volRow{ID: newID(), ProjectID: c.ProjectID, UserID: c.UserID, Status: StatusCreating, Zone: AvailabilityZone,
		Name: &name, Metadata: map[string]string{}, ImageMetadata: map[string]string{}, AdminMetadata: map[string]string{}}
	size := req.SizeGB
	var typeRef *string
	if req.Type != "" {
		typeRef = &req.Type
	}
	switch {
	case req.SnapshotID != "":
		v.SnapshotID = req.SnapshotID
		src, err := s.sourceOf(ctx, tx, c, v)
		if err != nil {
			return "", err
		}
		if size == 0 {
			size = src.size
		}
		if size < src.size {
			return "", invalidInput("Volume size '%d'GB cannot be smaller than the snapshot size %dGB. They must be >= original snapshot size.", size, src.size)
		}
		if typeRef == nil {
			typeRef = &src.typeID
		}
		v.Bootable, v.SourceImageID = src.bootable, src.imageID
		for k, x := range src.imageMeta {
			v.ImageMetadata[k] = x
		}
	case req.ImageID != "":
		img, err := s.volumeImage(ctx, c, req.ImageID)
		if err != nil {
			return "", err
		}
		if size, err = fromImage(v, img, size); err != nil {
			return "", err
		}
	}
	if size <= 0 {
		return "", invalidInput("Volume size '%d' must be an integer and greater than 0", size)
	}
	v.Size = size
	t, err := s.findType(ctx, tx, c, typeRef)
	if err != nil {
		return "", err
	}
	v.TypeID, v.TypeName = t.ID, t.Name
	if err := s.reserve(ctx, tx, v.ProjectID, 1, v.Size, v.Size); err != nil {
		return "", err
	}
	if err := s.reserveType(ctx, tx, v.ProjectID, t, 1, v.Size); err != nil {
		return "", err
	}
	now := s.now()
	v.CreatedAt, v.UpdatedAt = now, now
	if err := insertVol(ctx, tx, v); err != nil {
		return "", err
	}
	if req.FlavorDiskGB >= 0 && req.FlavorDisk {
		v.AdminMetadata[FlavorDiskKey] = strconv.FormatInt(req.FlavorDiskGB, 10)
		if _, err := tx.Exec(ctx, "UPDATE volumes SET admin_metadata = ? WHERE id = ?", store.JSON(v.AdminMetadata), v.ID); err != nil {
			return "", err
		}
	}
	if err := s.meter(ctx, tx, v, now); err != nil {
		return "", err
	}
	tx.AfterCommit(func() { s.kick(v.ID) })
	return v.ID, nil
}

// ServerVolume is what compute needs to know of a volume a server's
// block device mapping names.
type ServerVolume struct {
	ID, ProjectID, Status string
	SizeGB                int64
	Bootable              bool
	// ImageID is the image the volume's data came from, through clones
	// and snapshots (service-written, unlike the volume_image_metadata
	// its owner may change), "" when none.
	ImageID string
	// Error is why a create failed.
	Error string
}

// VolumeForServer is volume id as the caller sees it: Cinder's 404 for
// one of another project's (unless admin).
func (s *Service) VolumeForServer(ctx context.Context, q store.Querier, c *api.Caller, id string) (ServerVolume, error) {
	v, err := ownedVol(ctx, q, c, id)
	if err != nil {
		return ServerVolume{}, err
	}
	return ServerVolume{ID: v.ID, ProjectID: v.ProjectID, Status: v.Status, SizeGB: v.Size, Bootable: v.Bootable,
		ImageID: v.SourceImageID, Error: v.Error}, nil
}

// SnapshotForServer checks that snapshot id is one the caller may make a
// volume of (theirs, available) and answers its size and its image's id.
func (s *Service) SnapshotForServer(ctx context.Context, q store.Querier, c *api.Caller, id string) (sizeGB int64, imageID string, err error) {
	sn, err := ownedSnap(ctx, q, c, id)
	if err != nil {
		return 0, "", err
	}
	if sn.Status != SnapAvailable {
		return 0, "", invalidSnapshot("Originating snapshot status must be one of 'available' values")
	}
	return sn.Size, sn.SourceImageID, nil
}

// flavorDiskGB is the GiB of v a server's flavor pays for (FlavorDiskKey).
func flavorDiskGB(v *volRow) int64 {
	n, err := strconv.ParseInt(v.AdminMetadata[FlavorDiskKey], 10, 64)
	if err != nil || n < 0 {
		return 0
	}
	return n
}

// SetDevice names the device of a server's attachment, in tx: a boot
// volume is the server's root device (/dev/vda), which Reserve never
// picks for a disk hot-plugged next to the server's own.
func (s *Service) SetDevice(ctx context.Context, tx *store.Tx, attachmentID, device string) error {
	res, err := tx.Exec(ctx, "UPDATE volume_attachments SET mountpoint = ?, updated_at = ? WHERE id = ? AND origin = ?",
		device, store.FormatTime(s.now()), attachmentID, originCompute)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return store.ErrNotFound
	}
	return nil
}

// SnapshotForImage takes, in tx, a snapshot of a server's volume for an
// image of the server (Nova's snapshot_volume_backed: Cinder's
// create_snapshot_force, so an in-use volume is taken too), as the
// caller, counted against their quota. It answers the snapshot's id; the
// data is copied after commit.
func (s *Service) SnapshotForImage(ctx context.Context, tx *store.Tx, c *api.Caller, volumeID, name string) (string, error) {
	v, err := ownedVol(ctx, tx, c, volumeID)
	if err != nil {
		return "", err
	}
	if v.Status != StatusAvailable && v.Status != StatusInUse {
		return "", invalidVolume("Volume %s status must be available or in-use, but current status is: %s.", v.ID, v.Status)
	}
	if err := s.reserveSnapshot(ctx, tx, v); err != nil {
		return "", err
	}
	now := s.now()
	desc := "snapshot for " + name
	sn := &snapRow{ID: newID(), ProjectID: v.ProjectID, UserID: c.UserID, VolumeID: v.ID, TypeID: v.TypeID,
		Name: &desc, Description: &desc, Size: v.Size, Status: SnapCreating, Bootable: v.Bootable,
		ImageMetadata: v.ImageMetadata, Metadata: map[string]string{}, SourceImageID: v.SourceImageID, CreatedAt: now, UpdatedAt: now}
	if err := insertSnap(ctx, tx, sn); err != nil {
		return "", err
	}
	if err := meterSnap(ctx, tx, sn, now); err != nil {
		return "", err
	}
	tx.AfterCommit(func() { s.kick(snapKey + sn.ID) })
	return sn.ID, nil
}

// SetFlavorDisk records, in q, how many GiB of a server's root volume its
// flavor pays for now (FlavorDiskKey): the flavor's disk while the server
// is billed, 0 while it is not (shelved), so that the volume is charged
// for the rest. A volume without the mark, or gone, is left alone.
func (s *Service) SetFlavorDisk(ctx context.Context, q store.Querier, volumeID string, gb int64) error {
	v, err := getVol(ctx, q, volumeID)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	want := strconv.FormatInt(max(gb, 0), 10)
	if cur, ok := v.AdminMetadata[FlavorDiskKey]; !ok || cur == want {
		return nil
	}
	v.AdminMetadata[FlavorDiskKey] = want
	if _, err := q.Exec(ctx, "UPDATE volumes SET admin_metadata = ? WHERE id = ?", store.JSON(v.AdminMetadata), v.ID); err != nil {
		return err
	}
	return s.meter(ctx, q, v, s.now())
}
