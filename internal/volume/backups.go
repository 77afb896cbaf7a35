package volume

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/metering"
	"nimbus/internal/quota"
	"nimbus/internal/store"
	"nimbus/internal/workqueue"
)

// Backup statuses (cinder/objects/fields.py BackupStatus), and the volume
// statuses a backup's copy puts its volume in.
const (
	backupCreating      = "creating"
	backupAvailable     = "available"
	backupDeleting      = "deleting"
	backupRestoring     = "restoring"
	backupError         = "error"
	backupErrorDeleting = "error_deleting"

	volBackingUp      = "backing-up"
	volRestoring      = "restoring-backup"
	volErrorRestoring = "error_restoring"
)

// backupBillable reports whether a backup in status holds stored data that
// is charged: from its create until its delete, not after a failed create.
func backupBillable(status string) bool {
	return status != backupError && status != backupDeleting && status != backupErrorDeleting
}

// bkRow is one row of volume_backups, with whether incremental backups
// build on it.
type bkRow struct {
	ID, ProjectID, UserID, VolumeID string
	Name, Description, Container    *string
	Size, ObjectCount               int64
	Status, ParentID, RestoreVolume string
	VolumeStatus                    string // the volume's status before the copy
	// SnapshotID is the snapshot of the volume the backup's data is ("":
	// the volume's own data); it is backing-up, not the volume, meanwhile.
	SnapshotID string
	Metadata   map[string]string
	// Vol is what the backup keeps of its volume besides the data, for a
	// restore to give back: its metadata, image metadata, bootable flag
	// and service-written source image.
	Vol                  backupVolume
	FailReason           string
	Dependents           int64
	DataTimestamp        time.Time
	CreatedAt, UpdatedAt time.Time
}

const bkColumns = `b.id, b.project_id, b.user_id, b.volume_id, b.name, b.description, b.container, b.size, b.object_count,
	b.status, b.parent_id, b.restore_volume_id, b.volume_status, b.metadata, b.fail_reason,
	(SELECT COUNT(*) FROM volume_backups c WHERE c.parent_id = b.id), b.data_timestamp, b.created_at, b.updated_at,
	b.volume_metadata, b.image_metadata, b.bootable, b.source_image_id, b.snapshot_id`

// backupVolume is what a backup keeps of its volume besides the data.
type backupVolume struct {
	Metadata, ImageMetadata map[string]string
	Bootable                bool
	SourceImageID           string
}

func scanBackup(sc interface{ Scan(...any) error }) (*bkRow, error) {
	b := &bkRow{}
	var meta, ts, created, updated, vmeta, imeta string
	var boot int
	if err := sc.Scan(&b.ID, &b.ProjectID, &b.UserID, &b.VolumeID, &b.Name, &b.Description, &b.Container, &b.Size,
		&b.ObjectCount, &b.Status, &b.ParentID, &b.RestoreVolume, &b.VolumeStatus, &meta, &b.FailReason, &b.Dependents, &ts, &created, &updated,
		&vmeta, &imeta, &boot, &b.Vol.SourceImageID, &b.SnapshotID); err != nil {
		return nil, err
	}
	b.Metadata, b.Vol.Metadata, b.Vol.ImageMetadata = map[string]string{}, map[string]string{}, map[string]string{}
	for _, m := range []struct {
		raw string
		dst *map[string]string
	}{{meta, &b.Metadata}, {vmeta, &b.Vol.Metadata}, {imeta, &b.Vol.ImageMetadata}} {
		if err := store.FromJSON(m.raw, m.dst); err != nil {
			return nil, err
		}
	}
	b.Vol.Bootable = boot != 0
	b.DataTimestamp, b.CreatedAt, b.UpdatedAt = store.ParseTime(ts), store.ParseTime(created), store.ParseTime(updated)
	return b, nil
}

func loadBackups(ctx context.Context, q store.Querier, where string, args ...any) ([]*bkRow, error) {
	rows, err := q.Query(ctx, "SELECT "+bkColumns+" FROM volume_backups b WHERE "+where, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*bkRow
	for rows.Next() {
		b, err := scanBackup(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, rows.Err()
}

func getBackup(ctx context.Context, q store.Querier, id string) (*bkRow, error) {
	b, err := scanBackup(q.QueryRow(ctx, "SELECT "+bkColumns+" FROM volume_backups b WHERE b.id = ?", id))
	if store.IsNoRows(err) {
		return nil, store.ErrNotFound
	}
	return b, err
}

// ownedBackup is a backup the caller may see: its project's, or any for
// an admin; anything else is Cinder's BackupNotFound (404).
func ownedBackup(ctx context.Context, q store.Querier, c *api.Caller, id string) (*bkRow, error) {
	b, err := getBackup(ctx, q, id)
	if errors.Is(err, store.ErrNotFound) || (err == nil && !c.IsAdmin() && b.ProjectID != c.ProjectID) {
		return nil, api.NotFound("Backup %s could not be found.", id)
	}
	return b, err
}

func invalidBackup(format string, args ...any) *api.Error {
	return api.BadRequest("Invalid backup: "+format, args...)
}

// meterBackup writes the backup's usage period as its status says, in the
// transaction that changed it: per started GB-hour of its size.
func meterBackup(ctx context.Context, q store.Querier, b *bkRow, at time.Time) error {
	var spec *metering.Spec
	if backupBillable(b.Status) {
		spec = &metering.Spec{SizeGB: b.Size, Name: deref(b.Name)}
	}
	return metering.Set(ctx, q, metering.KindBackup, b.ID, b.ProjectID, spec, at)
}

// setBackupStatus moves a backup to status in q and meters it, when its
// status is still from; it reports whether it did.
func (s *Service) setBackupStatus(ctx context.Context, q store.Querier, b *bkRow, status, from string) (bool, error) {
	t := s.now()
	res, err := q.Exec(ctx, `UPDATE volume_backups SET status = ?, fail_reason = ?, object_count = ?, restore_volume_id = ?,
		updated_at = ? WHERE id = ? AND status = ?`, status, b.FailReason, b.ObjectCount, b.RestoreVolume, store.FormatTime(t), b.ID, from)
	if err != nil {
		return false, err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return false, nil
	}
	b.Status, b.UpdatedAt = status, t
	return true, meterBackup(ctx, q, b, t)
}

// ---- Views (cinder/api/views/backups.py, v3/views/backups.py, v3/backups.py) ----

func backupView(r *http.Request, b *bkRow) map[string]any {
	var fail any
	if b.FailReason != "" {
		fail = b.FailReason
	}
	out := map[string]any{
		"id": b.ID, "status": b.Status, "size": b.Size, "object_count": b.ObjectCount,
		"availability_zone": AvailabilityZone, "container": b.Container,
		"created_at": cinderTime(b.CreatedAt), "updated_at": cinderTime(b.UpdatedAt),
		"name": b.Name, "description": b.Description, "fail_reason": fail, "volume_id": b.VolumeID,
		"links": links(r, "backups", b.ID), "is_incremental": b.ParentID != "",
		"has_dependent_backups": b.Dependents > 0, "snapshot_id": nullID(b.SnapshotID), "data_timestamp": cinderTime(b.DataTimestamp),
	}
	mv, admin := minor(r), caller(r).IsAdmin()
	if mv >= 43 {
		out["metadata"] = b.Metadata
	}
	// BACKUP_ATTRIBUTES_POLICY shows these to admins.
	if mv >= 18 && admin {
		out["os-backup-project-attr:project_id"] = b.ProjectID
	}
	if mv >= 56 && admin {
		out["user_id"] = b.UserID
	}
	return out
}

func backupSummary(r *http.Request, b *bkRow) map[string]any {
	return map[string]any{"id": b.ID, "name": b.Name, "links": links(r, "backups", b.ID)}
}

func (s *Service) showBackup(r *http.Request) (*api.Response, error) {
	b, err := ownedBackup(r.Context(), s.db, caller(r), r.PathValue("id"))
	if err != nil {
		return nil, err
	}
	return api.JSON(200, map[string]any{"backup": backupView(r, b)}), nil
}

// ---- Create ----

// backupRequest is a create body read and checked
// (cinder/api/schemas/backups.py create, create_backup_v343).
type backupRequest struct {
	volumeID, snapshotID    string
	name, description, cont *string
	incremental, force      bool
	metadata                map[string]string
}

func readBackupRequest(r *http.Request) (*backupRequest, error) {
	b, err := decodeBody(r, "backup")
	if err != nil {
		return nil, err
	}
	keys := []string{"volume_id", "container", "description", "incremental", "force", "name", "snapshot_id"}
	if minor(r) >= 43 {
		keys = append(keys, "metadata")
	}
	if err := api.UnknownFields(b, keys...); err != nil {
		return nil, err
	}
	req := &backupRequest{metadata: map[string]string{}}
	vol, err := b.optString("volume_id", 36)
	if err != nil {
		return nil, err
	}
	if vol == nil {
		return nil, api.BadRequest("Invalid input for field/attribute backup. 'volume_id' is a required property")
	}
	req.volumeID = *vol
	if sn, err := b.optString("snapshot_id", 36); err != nil {
		return nil, err
	} else if sn != nil {
		req.snapshotID = *sn
	}
	for _, f := range []struct {
		key string
		dst **string
	}{{"name", &req.name}, {"description", &req.description}, {"container", &req.cont}} {
		v, err := b.optString(f.key, 255)
		if err != nil {
			return nil, err
		}
		if v != nil && f.key != "container" {
			t := strings.TrimSpace(*v)
			v = &t
		}
		*f.dst = v
	}
	if req.incremental, _, err = b.boolean("incremental"); err != nil {
		return nil, err
	}
	if req.force, _, err = b.boolean("force"); err != nil {
		return nil, err
	}
	if raw, ok := b["metadata"]; ok {
		if req.metadata, err = parseMetadata("metadata", raw); err != nil {
			return nil, err
		}
	}
	return req, nil
}

// createBackup is POST /backups (cinder/backup/api.py API.create): 202
// with the backup's summary; the volume, or the snapshot backed up, is
// backing-up until the copy is done (processBackup).
func (s *Service) createBackup(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	c := caller(r)
	req, err := readBackupRequest(r)
	if err != nil {
		return nil, err
	}
	// A backup is the size of its volume, of a snapshot too.
	pre, err := ownedVol(ctx, s.db, c, req.volumeID)
	if err != nil {
		return nil, err
	}
	if err := s.checkStart(ctx, c.ProjectID, metering.KindBackup, pre.Size); err != nil {
		return nil, err
	}
	var b *bkRow
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		v, err := ownedVol(ctx, tx, c, req.volumeID)
		if err != nil {
			return err
		}
		sn, err := backupSnapshot(ctx, tx, c, v, req)
		if err != nil {
			return err
		}
		// backup_gigabytes counts the volume's size, a snapshot's backup too.
		if err := s.reserveBackup(ctx, tx, c.ProjectID, v.Size); err != nil {
			return err
		}
		parent, err := incrementalParent(ctx, tx, req, v.ID, c.ProjectID, sn)
		if err != nil {
			return err
		}
		prev := v.Status
		if err := s.holdBackupSource(ctx, tx, v, sn); err != nil {
			return err
		}
		now := s.now()
		b = &bkRow{ID: newID(), ProjectID: c.ProjectID, UserID: c.UserID, VolumeID: v.ID, Name: req.name,
			Description: req.description, Container: req.cont, Size: v.Size, Status: backupCreating, ParentID: parent,
			VolumeStatus: prev, Metadata: req.metadata, DataTimestamp: now, CreatedAt: now, UpdatedAt: now,
			Vol: backupVolume{Metadata: v.Metadata, ImageMetadata: v.ImageMetadata, Bootable: v.Bootable, SourceImageID: v.SourceImageID}}
		if sn != nil {
			// The data is the snapshot's, as of its taking.
			b.SnapshotID, b.DataTimestamp = sn.ID, sn.CreatedAt
		}
		if _, err := tx.Exec(ctx, `INSERT INTO volume_backups (id, project_id, user_id, volume_id, name, description, container,
			size, status, parent_id, volume_status, metadata, data_timestamp, created_at, updated_at,
			volume_metadata, image_metadata, bootable, source_image_id, snapshot_id)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			b.ID, b.ProjectID, b.UserID, b.VolumeID, b.Name, b.Description, b.Container, b.Size, b.Status, b.ParentID, b.VolumeStatus,
			store.JSON(b.Metadata), store.FormatTime(b.DataTimestamp), store.FormatTime(now), store.FormatTime(now),
			store.JSON(b.Vol.Metadata), store.JSON(b.Vol.ImageMetadata), b2i(b.Vol.Bootable), b.Vol.SourceImageID, b.SnapshotID); err != nil {
			return err
		}
		if err := meterBackup(ctx, tx, b, now); err != nil {
			return err
		}
		tx.AfterCommit(func() { s.backupQueue.Add(b.ID) })
		return nil
	})
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusAccepted, map[string]any{"backup": backupSummary(r, b)}), nil
}

// backupSnapshot checks what a create backs up: the snapshot asked for,
// which must be the volume's and available (the volume's own status does
// not matter then, as in Cinder); or else the volume, available, or in-use
// with force. It answers the snapshot, nil for the volume.
func backupSnapshot(ctx context.Context, q store.Querier, c *api.Caller, v *volRow, req *backupRequest) (*snapRow, error) {
	if req.snapshotID == "" {
		// in-use comes with attachments; the check is Cinder's already.
		if v.Status != StatusAvailable && v.Status != StatusInUse {
			return nil, invalidVolume("Volume to be backed up must be available or in-use, but the current status is \"%s\".", v.Status)
		}
		if v.Status == StatusInUse && !req.force {
			return nil, invalidVolume("Backing up an in-use volume must use the force flag.")
		}
		return nil, nil
	}
	sn, err := ownedSnap(ctx, q, c, req.snapshotID)
	if err != nil {
		return nil, err
	}
	if sn.VolumeID != v.ID {
		return nil, invalidVolume("Volume %s does not match with snapshot.volume_id %s.", v.ID, sn.VolumeID)
	}
	if sn.Status != SnapAvailable {
		return nil, invalidSnapshot("Snapshot to be backed up must be available, but the current status is \"%s\".", sn.Status)
	}
	return sn, nil
}

// holdBackupSource puts what a backup reads in backing-up until it is
// made: the snapshot, when it backs one up, else the volume.
func (s *Service) holdBackupSource(ctx context.Context, tx *store.Tx, v *volRow, sn *snapRow) error {
	if sn == nil {
		_, err := s.setStatus(ctx, tx, v, volBackingUp, "", v.Status)
		return err
	}
	ok, err := s.setSnapStatus(ctx, tx, sn, SnapBackingUp, sn.Error, SnapAvailable)
	if err == nil && !ok { // changed since it was read
		err = invalidSnapshot("Snapshot to be backed up must be available.")
	}
	return err
}

// incrementalParent is the backup an incremental one builds on: the
// volume's latest in the project by data_timestamp, which must be
// available ("" for a full backup). For a snapshot's backup it is the
// latest whose data is older than the snapshot, as in Cinder; when none
// is, Cinder still takes one, and so the latest.
func incrementalParent(ctx context.Context, q store.Querier, req *backupRequest, volumeID, project string, sn *snapRow) (string, error) {
	if !req.incremental {
		return "", nil
	}
	const order = " ORDER BY b.data_timestamp DESC, b.created_at DESC LIMIT 1"
	where, args := "b.volume_id = ? AND b.project_id = ?", []any{volumeID, project}
	var bs []*bkRow
	var err error
	if sn != nil {
		bs, err = loadBackups(ctx, q, where+" AND b.data_timestamp < ?"+order, append(args, store.FormatTime(sn.CreatedAt))...)
	}
	if err == nil && len(bs) == 0 {
		bs, err = loadBackups(ctx, q, where+order, args...)
	}
	if err != nil {
		return "", err
	}
	if len(bs) == 0 {
		return "", invalidBackup("No backups available to do an incremental backup.")
	}
	if bs[0].Status != backupAvailable {
		return "", invalidBackup("The parent backup must be available for incremental backup.")
	}
	return bs[0].ID, nil
}

// ---- Update, delete, restore, actions ----

// updateBackup is PUT /backups/{id} (3.9; metadata from 3.43): 200 with
// the summary.
func (s *Service) updateBackup(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	if minor(r) < 9 {
		return nil, api.NotFound("API version 3.%d is not supported on this method.", minor(r))
	}
	body, err := decodeBody(r, "backup")
	if err != nil {
		return nil, err
	}
	keys := []string{"name", "description"}
	if minor(r) >= 43 {
		keys = append(keys, "metadata")
	}
	if err := api.UnknownFields(body, keys...); err != nil {
		return nil, err
	}
	set := map[string]*string{}
	for _, k := range []string{"name", "description"} {
		if _, ok := body[k]; !ok {
			continue
		}
		v, err := body.optString(k, 255)
		if err != nil {
			return nil, err
		}
		if v != nil {
			t := strings.TrimSpace(*v)
			v = &t
		}
		set[k] = v
	}
	var meta map[string]string
	if raw, ok := body["metadata"]; ok {
		if meta, err = parseMetadata("metadata", raw); err != nil {
			return nil, err
		}
	}
	var b *bkRow
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		if b, err = ownedBackup(ctx, tx, caller(r), r.PathValue("id")); err != nil {
			return err
		}
		if v, ok := set["name"]; ok {
			b.Name = v
		}
		if v, ok := set["description"]; ok {
			b.Description = v
		}
		if meta != nil {
			b.Metadata = meta
		}
		b.UpdatedAt = s.now()
		_, err := tx.Exec(ctx, "UPDATE volume_backups SET name = ?, description = ?, metadata = ?, updated_at = ? WHERE id = ?",
			b.Name, b.Description, store.JSON(b.Metadata), store.FormatTime(b.UpdatedAt), b.ID)
		return err
	})
	if err != nil {
		return nil, err
	}
	return api.JSON(200, map[string]any{"backup": backupSummary(r, b)}), nil
}

// deleteBackup is DELETE /backups/{id}: available or error, and no
// incremental backup built on it (cinder/backup/api.py API.delete). The
// charge stops at once; the row goes once the store has dropped the data.
func (s *Service) deleteBackup(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		b, err := ownedBackup(ctx, tx, caller(r), r.PathValue("id"))
		if err != nil {
			return err
		}
		if b.Status != backupAvailable && b.Status != backupError {
			return invalidBackup("Backup status must be available or error")
		}
		if b.Dependents > 0 {
			return invalidBackup("Incremental backups exist for this backup.")
		}
		if _, err := s.setBackupStatus(ctx, tx, b, backupDeleting, b.Status); err != nil {
			return err
		}
		tx.AfterCommit(func() { s.backupQueue.Add(b.ID) })
		return nil
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(http.StatusAccepted), nil
}

// restoreBackup is POST /backups/{id}/restore {"restore": {"volume_id",
// "name"}}: onto an available volume at least the backup's size, or a
// new volume of its size; 202 with Cinder's restore summary.
func (s *Service) restoreBackup(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	c := caller(r)
	var outer map[string]json.RawMessage
	if err := api.DecodeJSON(r, &outer); err != nil {
		return nil, err
	}
	in := body{}
	if raw, ok := outer["restore"]; !ok {
		return nil, api.BadRequest("Missing required element 'restore' in request body.")
	} else if !isNull(raw) {
		var err error
		if in, err = inner(outer, "restore"); err != nil {
			return nil, err
		}
	}
	if err := api.UnknownFields(in, "volume_id", "name"); err != nil {
		return nil, err
	}
	volID, err := in.optString("volume_id", 36)
	if err != nil {
		return nil, err
	}
	name, err := in.optString("name", 255)
	if err != nil {
		return nil, err
	}
	if volID == nil {
		// A restore to a new volume starts its charge: the backup's size.
		pre, err := ownedBackup(ctx, s.db, c, r.PathValue("id"))
		if err != nil {
			return nil, err
		}
		if err := s.checkStart(ctx, c.ProjectID, metering.KindVolume, pre.Size); err != nil {
			return nil, err
		}
	}
	var v *volRow
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		b, err := ownedBackup(ctx, tx, c, r.PathValue("id"))
		if err != nil {
			return err
		}
		if b.Status != backupAvailable {
			return invalidBackup("Backup status must be available")
		}
		if volID == nil {
			v, err = s.restoreVolume(ctx, tx, c, b, name)
		} else {
			v, err = s.restoreTarget(ctx, tx, c, b, *volID)
		}
		if err != nil {
			return err
		}
		b.RestoreVolume = v.ID
		if _, err := s.setBackupStatus(ctx, tx, b, backupRestoring, backupAvailable); err != nil {
			return err
		}
		tx.AfterCommit(func() { s.backupQueue.Add(b.ID) })
		return nil
	})
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusAccepted, map[string]any{"restore": map[string]any{
		"backup_id": r.PathValue("id"), "volume_id": v.ID, "volume_name": v.Name}}), nil
}

// restoreVolume makes the new volume a restore writes: the backup's size,
// the default type, counted against the volume quotas and charged from
// now, in status restoring-backup until the data is in.
func (s *Service) restoreVolume(ctx context.Context, tx *store.Tx, c *api.Caller, b *bkRow, name *string) (*volRow, error) {
	if name == nil {
		n := "restore_backup_" + b.ID
		name = &n
	}
	desc := "auto-created_from_restore_from_backup"
	v := &volRow{ID: newID(), ProjectID: c.ProjectID, UserID: c.UserID, Name: name, Description: &desc, Size: b.Size,
		Status: volRestoring, Zone: AvailabilityZone, Metadata: maps.Clone(b.Vol.Metadata), ImageMetadata: maps.Clone(b.Vol.ImageMetadata),
		Bootable: b.Vol.Bootable, SourceImageID: b.Vol.SourceImageID}
	t, err := s.findType(ctx, tx, c, nil)
	if err != nil {
		return nil, err
	}
	v.TypeID, v.TypeName = t.ID, t.Name
	if err := s.reserve(ctx, tx, v.ProjectID, 1, v.Size, v.Size); err != nil {
		return nil, err
	}
	now := s.now()
	v.CreatedAt, v.UpdatedAt = now, now
	if err := insertVol(ctx, tx, v); err != nil {
		return nil, err
	}
	return v, s.meter(ctx, tx, v, now)
}

// restoreTarget checks an existing volume a restore overwrites and moves
// it to restoring-backup.
func (s *Service) restoreTarget(ctx context.Context, tx *store.Tx, c *api.Caller, b *bkRow, id string) (*volRow, error) {
	v, err := ownedVol(ctx, tx, c, id)
	if err != nil {
		return nil, err
	}
	if v.Status != StatusAvailable {
		return nil, invalidVolume("Volume to be restored to must be available")
	}
	if b.Size > v.Size {
		return nil, invalidVolume("volume size %d is too small to restore backup of size %d.", v.Size, b.Size)
	}
	// The backup's data brings what came with it: its volume's metadata
	// over the volume's own, its image metadata, bootable flag and source
	// image (and with that the licence an upload of it inherits).
	meta := maps.Clone(v.Metadata)
	maps.Copy(meta, b.Vol.Metadata)
	if _, err := tx.Exec(ctx, "UPDATE volumes SET metadata = ?, image_metadata = ?, bootable = ?, source_image_id = ? WHERE id = ?",
		store.JSON(meta), store.JSON(b.Vol.ImageMetadata), b2i(b.Vol.Bootable), b.Vol.SourceImageID, v.ID); err != nil {
		return nil, err
	}
	_, err = s.setStatus(ctx, tx, v, volRestoring, "", StatusAvailable)
	return v, err
}

// backupResettable are the statuses os-reset_status may set
// (cinder/api/contrib/admin_actions.py BackupAdminController.valid_status).
var backupResettable = map[string]bool{backupAvailable: true, backupError: true}

// backupAction is POST /backups/{id}/action: the admin's os-reset_status.
// Only the record changes (and with it whether the backup is charged).
func (s *Service) backupAction(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	var outer map[string]json.RawMessage
	if err := api.DecodeJSON(r, &outer); err != nil {
		return nil, err
	}
	raw, ok := outer["os-reset_status"]
	if len(outer) != 1 || !ok {
		for name := range outer {
			return nil, api.BadRequest("There is no such action: %s", name)
		}
		return nil, api.BadRequest("Malformed request body")
	}
	if !caller(r).IsAdmin() {
		return nil, api.PolicyForbidden("backup:reset_status")
	}
	b, err := actionBody("os-reset_status", raw)
	if err != nil {
		return nil, err
	}
	if err := api.UnknownFields(b, "status"); err != nil {
		return nil, err
	}
	st, err := b.optString("status", 255)
	if err != nil {
		return nil, err
	}
	if st == nil || !backupResettable[strings.ToLower(*st)] {
		return nil, api.BadRequest("Must specify a valid status")
	}
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		bk, err := ownedBackup(ctx, tx, caller(r), r.PathValue("id"))
		if err != nil {
			return err
		}
		_, err = s.setBackupStatus(ctx, tx, bk, strings.ToLower(*st), bk.Status)
		return err
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(http.StatusAccepted), nil
}

// ---- Listing ----

var backupSortColumns = map[string]string{
	"id": "b.id", "name": "COALESCE(b.name, '')", "display_name": "COALESCE(b.name, '')", "status": "b.status",
	"size": "b.size", "volume_id": "b.volume_id", "created_at": "b.created_at", "updated_at": "b.updated_at",
	"data_timestamp": "b.data_timestamp", "project_id": "b.project_id", "user_id": "b.user_id",
}

// backupPage is a backup list's scope, filters and order: the caller's
// project's backups, or every project's with all_tenants (admin), narrowed
// by name, status and volume_id (_get_backup_filter_options).
func backupPage(r *http.Request) (*api.Page, error) {
	c, q := caller(r), r.URL.Query()
	p := &api.Page{}
	if all, _ := api.ParseBool(q.Get("all_tenants")); !all || !c.IsAdmin() {
		p.Add("b.project_id = ?", c.ProjectID)
	} else if pid := q.Get("project_id"); pid != "" {
		p.Add("b.project_id = ?", pid)
	}
	for param, col := range map[string]string{"name": "COALESCE(b.name, '')", "display_name": "COALESCE(b.name, '')",
		"status": "b.status", "volume_id": "b.volume_id"} {
		if q.Has(param) {
			p.Add(col+" = ?", q.Get(param))
		}
	}
	keys, err := sortParams(q, backupSortColumns, "b.id")
	if err != nil {
		return nil, err
	}
	p.Keys = keys
	return p, nil
}

// listBackups is GET /backups and /backups/detail with Cinder's paging
// (limit, marker, offset, sort), with_count from 3.45, and backups_links
// when more follow.
func (s *Service) listBackups(detail bool) api.HandlerFunc {
	return func(r *http.Request) (*api.Response, error) {
		ctx := r.Context()
		q := r.URL.Query()
		limit, offset, err := pageSize(q)
		if err != nil {
			return nil, err
		}
		p, err := backupPage(r)
		if err != nil {
			return nil, err
		}
		out := map[string]any{}
		if wantCount(r) {
			var n int
			where := "1 = 1"
			if len(p.Where) > 0 {
				where = strings.Join(p.Where, " AND ")
			}
			if err := s.db.QueryRow(ctx, "SELECT COUNT(*) FROM volume_backups b WHERE "+where, p.Args...).Scan(&n); err != nil {
				return nil, err
			}
			out["count"] = n
		}
		if m := q.Get("marker"); m != "" {
			if err := pastMarker(ctx, s.db, p, "volume_backups b", "b.id", m); err != nil {
				return nil, err
			}
		}
		p.Limit = offset + limit
		rows, err := s.db.Query(ctx, "SELECT "+bkColumns+" FROM volume_backups b "+p.SQL(), p.Args...)
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		var got []*bkRow
		for rows.Next() {
			b, err := scanBackup(rows)
			if err != nil {
				return nil, err
			}
			got = append(got, b)
		}
		if err := rows.Err(); err != nil {
			return nil, err
		}
		got = got[min(offset, len(got)):]
		page := got[:min(limit, len(got))]
		items := make([]map[string]any, 0, len(page))
		for _, b := range page {
			if detail {
				items = append(items, backupView(r, b))
			} else {
				items = append(items, backupSummary(r, b))
			}
		}
		out["backups"] = items
		if fullPage(len(page), limit) {
			out["backups_links"] = nextLink(r, q, listPath("/backups", detail), limit, page[len(page)-1].ID)
		}
		return api.JSON(200, out), nil
	}
}

// ---- Quotas ----

// backupUsage is what a project's backups take: their count and gigabytes.
func backupUsage(ctx context.Context, q store.Querier, project string) (backups, gigabytes int64, err error) {
	err = q.QueryRow(ctx, "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM volume_backups WHERE project_id = ?", project).
		Scan(&backups, &gigabytes)
	return
}

// reserveBackup checks, in tx, that project may add a backup of gb
// gigabytes, under the project's quota lock as volumes' reserve does
// (cinder/quota_utils.py process_reserve_over_quota, 413).
func (s *Service) reserveBackup(ctx context.Context, tx *store.Tx, project string, gb int64) error {
	if err := quota.Lock(ctx, tx, "volume_quota_locks", project); err != nil {
		return err
	}
	lim, err := quotaOf(ctx, tx, project)
	if err != nil {
		return err
	}
	n, used, err := backupUsage(ctx, tx, project)
	if err != nil {
		return err
	}
	if l := lim["backups"]; l >= 0 && n+1 > l {
		// cinder/exception.py BackupLimitExceeded
		return api.OverLimit("Maximum number of backups allowed (%d) exceeded", l)
	}
	if l := lim["backup_gigabytes"]; l >= 0 && used+gb > l {
		// cinder/exception.py VolumeBackupSizeExceedsAvailableQuota
		return api.OverLimit("Requested backup exceeds allowed Backup gigabytes quota. Requested %dG, quota is %dG and %dG has been consumed.",
			gb, l, used)
	}
	return nil
}

// ---- Data work ----

// backupWorkers bounds how many backups are copied at once.
const backupWorkers = 4

// startBackups opens the backup store (dir, or "backups" beside the
// volumes' directory) and the queue its work runs on, keyed by backup id.
func (s *Service) startBackups(dir string) {
	if dir == "" {
		dir = filepath.Join(filepath.Dir(filepath.Clean(s.dataDir)), "backups")
	}
	s.backupStore = NewBackupStore(dir)
	s.backupQueue = workqueue.New(workqueue.Config{Backoff: workRetry, MaxBackoff: workRetryMax})
	s.backupQueue.Work(backupWorkers, func(id string) error {
		return s.owned(s.ctx, backupKey+id, func(ctx context.Context) error { return s.processBackup(ctx, id) })
	})
}

// processBackup does what a backup's status asks, then records the
// outcome in one transaction. Each step is idempotent, so a stopped
// controller's work is redone from the start.
func (s *Service) processBackup(ctx context.Context, id string) error {
	b, err := getBackup(ctx, s.db, id)
	if err != nil {
		if errors.Is(err, store.ErrNotFound) || ctx.Err() != nil {
			return nil
		}
		return err
	}
	switch b.Status {
	case backupCreating:
		objects, werr := s.backend.backup(ctx, b)
		if ctx.Err() != nil {
			return nil
		}
		return s.finishCreate(ctx, b, objects, werr)
	case backupRestoring:
		werr := s.backend.restore(ctx, b)
		if ctx.Err() != nil {
			return nil
		}
		return s.finishRestore(ctx, b, werr)
	case backupDeleting:
		if werr := s.backend.deleteBackup(ctx, b); werr != nil {
			s.log.Error("volume: deleting backup data failed", "backup", b.ID, "error", werr)
			b.FailReason = werr.Error()
			return s.recordBackup(ctx, b, func(tx *store.Tx) error {
				_, err := s.setBackupStatus(ctx, tx, b, backupErrorDeleting, backupDeleting)
				return err
			})
		}
		return s.recordBackup(ctx, b, func(tx *store.Tx) error {
			_, err := tx.Exec(ctx, "DELETE FROM volume_backups WHERE id = ? AND status = ?", b.ID, backupDeleting)
			return err
		})
	}
	return nil
}

// finishCreate records a backup's copy: available with its object count,
// or error with the reason (unless an admin reset it meanwhile); its
// volume or snapshot returns to the status it had either way.
func (s *Service) finishCreate(ctx context.Context, b *bkRow, objects int64, werr error) error {
	status := backupAvailable
	if werr != nil {
		s.log.Error("volume: backup failed", "backup", b.ID, "error", werr)
		status, b.FailReason = backupError, werr.Error()
	} else {
		b.ObjectCount = objects
	}
	return s.recordBackup(ctx, b, func(tx *store.Tx) error {
		if _, err := s.setBackupStatus(ctx, tx, b, status, backupCreating); err != nil {
			return err
		}
		return s.releaseBackupSource(ctx, tx, b)
	})
}

// releaseBackupSource returns what a backup read to the status it had:
// the snapshot to available, or the volume to its status before. Either
// may have been reset or deleted meanwhile, and is left alone then.
func (s *Service) releaseBackupSource(ctx context.Context, tx *store.Tx, b *bkRow) error {
	if b.SnapshotID != "" {
		sn, err := getSnap(ctx, tx, b.SnapshotID)
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		_, err = s.setSnapStatus(ctx, tx, sn, SnapAvailable, sn.Error, SnapBackingUp)
		return err
	}
	prev := b.VolumeStatus
	if prev == "" {
		prev = StatusAvailable
	}
	return s.volumeBack(ctx, tx, b.VolumeID, volBackingUp, prev)
}

// restoreData writes the backup into its target volume's file, making the
// file first for a new volume.
func (s *Service) restoreData(b *bkRow) error {
	path := s.dataPath(b.RestoreVolume)
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(s.dataDir, 0o700); err != nil {
			return err
		}
		f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o600)
		if err != nil {
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
		if err := s.growFile(path, b.Size); err != nil {
			return err
		}
	}
	return s.backupStore.Restore(b.ID, path)
}

// finishRestore records a restore: the backup is available again, the
// volume available or, when the data could not be written,
// error_restoring.
func (s *Service) finishRestore(ctx context.Context, b *bkRow, werr error) error {
	volStatus := StatusAvailable
	if werr != nil {
		s.log.Error("volume: restore failed", "backup", b.ID, "volume", b.RestoreVolume, "error", werr)
		volStatus = volErrorRestoring
	}
	target := b.RestoreVolume
	b.RestoreVolume = ""
	return s.recordBackup(ctx, b, func(tx *store.Tx) error {
		if _, err := s.setBackupStatus(ctx, tx, b, backupAvailable, backupRestoring); err != nil {
			return err
		}
		return s.volumeBack(ctx, tx, target, volRestoring, volStatus)
	})
}

// volumeBack moves volume id from status from to status, if it is still
// there and in from.
func (s *Service) volumeBack(ctx context.Context, q store.Querier, id, from, status string) error {
	v, err := getVol(ctx, q, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if status == StatusInUse {
		// Its server may have let go of it meanwhile (attach.go).
		if status, err = heldStatus(ctx, q, v.ID); err != nil {
			return err
		}
	}
	_, err = s.setStatus(ctx, q, v, status, "", from)
	return err
}

func (s *Service) recordBackup(ctx context.Context, b *bkRow, f func(tx *store.Tx) error) error {
	err := s.db.Tx(ctx, f)
	if err != nil && ctx.Err() == nil {
		s.log.Error("volume: recording backup status failed", "backup", b.ID, "error", err)
		return err
	}
	return nil
}
