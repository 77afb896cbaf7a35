package volume

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"net/http"
	"strings"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/metering"
	"nimbus/internal/quota"
	"nimbus/internal/store"
)

// Snapshot statuses served (cinder/objects/fields.py SnapshotStatus).
const (
	SnapCreating      = "creating"
	SnapAvailable     = "available"
	SnapDeleting      = "deleting"
	SnapError         = "error"
	SnapErrorDeleting = "error_deleting"
	// SnapBackingUp: a backup is being made of it (backups.go).
	SnapBackingUp = "backing-up"
)

// snapResettable are the statuses os-reset_status may set on a snapshot
// (cinder/api/contrib/admin_actions.py SnapshotAdminController.valid_status).
var snapResettable = map[string]bool{
	"creating": true, "available": true, "deleting": true, "error": true, "error_deleting": true,
	"unmanaging": true, "backing-up": true, "restoring": true,
}

// snapBillable reports whether a snapshot in status takes space that is
// charged: from creation until delete, but not after a failed create.
func snapBillable(status string) bool {
	return status != SnapError && status != SnapDeleting && status != SnapErrorDeleting
}

// snapRow is one row of volume_snapshots. Size, type, bootable and image
// metadata are its volume's when it was taken.
type snapRow struct {
	ID, ProjectID, UserID, VolumeID, TypeID string
	Name, Description                       *string
	Size                                    int64
	Status                                  string
	Bootable                                bool
	ImageMetadata, Metadata                 map[string]string
	Error                                   string
	// Progress is what os-update_snapshot_status last said ("" if never).
	Progress string
	// SourceImageID is its volume's when it was taken (service-written).
	SourceImageID        string
	CreatedAt, UpdatedAt time.Time
}

const snapColumns = `s.id, s.project_id, s.user_id, s.volume_id, s.volume_type_id, s.name, s.description, s.size, s.status,
	s.bootable, s.image_metadata, s.metadata, s.error, s.progress, s.source_image_id, s.created_at, s.updated_at`

const snapFrom = " FROM volume_snapshots s"

func scanSnap(sc interface{ Scan(...any) error }) (*snapRow, error) {
	sn := &snapRow{}
	var boot int
	var imeta, meta, created, updated string
	if err := sc.Scan(&sn.ID, &sn.ProjectID, &sn.UserID, &sn.VolumeID, &sn.TypeID, &sn.Name, &sn.Description, &sn.Size,
		&sn.Status, &boot, &imeta, &meta, &sn.Error, &sn.Progress, &sn.SourceImageID, &created, &updated); err != nil {
		return nil, err
	}
	sn.Bootable = boot != 0
	sn.ImageMetadata, sn.Metadata = map[string]string{}, map[string]string{}
	if err := store.FromJSON(imeta, &sn.ImageMetadata); err != nil {
		return nil, err
	}
	if err := store.FromJSON(meta, &sn.Metadata); err != nil {
		return nil, err
	}
	sn.CreatedAt, sn.UpdatedAt = store.ParseTime(created), store.ParseTime(updated)
	return sn, nil
}

func loadSnaps(ctx context.Context, q store.Querier, where string, args ...any) ([]*snapRow, error) {
	rows, err := q.Query(ctx, "SELECT "+snapColumns+snapFrom+" WHERE "+where, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*snapRow
	for rows.Next() {
		sn, err := scanSnap(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, sn)
	}
	return out, rows.Err()
}

// insertSnap writes a new snapshot's row.
func insertSnap(ctx context.Context, q store.Querier, sn *snapRow) error {
	_, err := q.Exec(ctx, `INSERT INTO volume_snapshots (id, project_id, user_id, volume_id, volume_type_id, name,
		description, size, status, bootable, image_metadata, metadata, error, source_image_id, created_at, updated_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, '', ?, ?, ?)`,
		sn.ID, sn.ProjectID, sn.UserID, sn.VolumeID, sn.TypeID, sn.Name, sn.Description, sn.Size, sn.Status,
		b2i(sn.Bootable), store.JSON(sn.ImageMetadata), store.JSON(sn.Metadata), sn.SourceImageID,
		store.FormatTime(sn.CreatedAt), store.FormatTime(sn.UpdatedAt))
	return err
}

func getSnap(ctx context.Context, q store.Querier, id string) (*snapRow, error) {
	sn, err := scanSnap(q.QueryRow(ctx, "SELECT "+snapColumns+snapFrom+" WHERE s.id = ?", id))
	if store.IsNoRows(err) {
		return nil, store.ErrNotFound
	}
	return sn, err
}

func errSnapshotNotFound(id string) *api.Error {
	return api.NotFound("Snapshot %s could not be found.", id)
}

func invalidSnapshot(format string, args ...any) *api.Error {
	return api.BadRequest("Invalid snapshot: "+format, args...)
}

// ownedSnap is a snapshot the caller may see: its project's, or any for an
// admin; anything else is Cinder's 404.
func ownedSnap(ctx context.Context, q store.Querier, c *api.Caller, id string) (*snapRow, error) {
	sn, err := getSnap(ctx, q, id)
	if errors.Is(err, store.ErrNotFound) || (err == nil && !c.IsAdmin() && sn.ProjectID != c.ProjectID) {
		return nil, errSnapshotNotFound(id)
	}
	return sn, err
}

// meterSnap writes the snapshot's usage period as its status says, in the
// transaction that changed it.
func meterSnap(ctx context.Context, q store.Querier, sn *snapRow, at time.Time) error {
	var spec *metering.Spec
	if snapBillable(sn.Status) {
		spec = &metering.Spec{SizeGB: sn.Size, Name: deref(sn.Name)}
	}
	return metering.Set(ctx, q, metering.KindSnapshot, sn.ID, sn.ProjectID, spec, at)
}

// setSnapStatus moves a snapshot to status and meters it, when its status
// is still one of from (any when from is empty); it reports whether it did.
func (s *Service) setSnapStatus(ctx context.Context, q store.Querier, sn *snapRow, status, reason string, from ...string) (bool, error) {
	query := "UPDATE volume_snapshots SET status = ?, error = ?, updated_at = ? WHERE id = ?"
	t := s.now()
	args := []any{status, reason, store.FormatTime(t), sn.ID}
	if len(from) > 0 {
		query += " AND status IN (" + api.Placeholders(len(from)) + ")"
		for _, f := range from {
			args = append(args, f)
		}
	}
	res, err := q.Exec(ctx, query, args...)
	if err != nil {
		return false, err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return false, nil
	}
	sn.Status, sn.Error, sn.UpdatedAt = status, reason, t
	return true, meterSnap(ctx, q, sn, t)
}

// Snapshot views (cinder/api/views/snapshots.py, v3/views/snapshots.py):
// lists' summary; create's and update's detail, with the microversions'
// fields; show's and detail lists', which add the
// os-extended-snapshot-attributes its owner may see
// (cinder/api/contrib/extended_snapshot_attributes.py).
const (
	snapSummary = iota
	snapDetail
	snapExtended
)

// snapView is a snapshot at the request's microversion, in one of the
// views above.
func snapView(r *http.Request, sn *snapRow, level int) map[string]any {
	out := map[string]any{
		"id": sn.ID, "created_at": cinderTime(sn.CreatedAt), "updated_at": cinderTime(sn.UpdatedAt),
		"name": sn.Name, "description": sn.Description, "volume_id": sn.VolumeID, "status": sn.Status,
		"size": sn.Size, "metadata": sn.Metadata,
	}
	if level == snapSummary {
		return out
	}
	mv := minor(r)
	if mv >= 14 {
		out["group_snapshot_id"] = nil
	}
	if mv >= 41 {
		out["user_id"] = sn.UserID
	}
	if level == snapDetail {
		return out
	}
	progress := "0%"
	switch {
	case sn.Status == SnapAvailable:
		progress = "100%"
	case sn.Progress != "":
		progress = sn.Progress
	}
	out["os-extended-snapshot-attributes:project_id"] = sn.ProjectID
	out["os-extended-snapshot-attributes:progress"] = progress
	return out
}

func (s *Service) showSnapshot(r *http.Request) (*api.Response, error) {
	sn, err := ownedSnap(r.Context(), s.db, caller(r), r.PathValue("id"))
	if err != nil {
		return nil, err
	}
	return api.JSON(200, map[string]any{"snapshot": snapView(r, sn, snapExtended)}), nil
}

// nameDesc reads name and description (or their display_ forms) of a
// create or update body, trimmed; set reports which were given.
func nameDesc(b body) (name, desc *string, set map[string]bool, err error) {
	set = map[string]bool{}
	for _, k := range [][2]string{{"name", "display_name"}, {"description", "display_description"}} {
		for _, key := range k {
			if _, ok := b[key]; !ok {
				continue
			}
			val, err := b.optString(key, 255)
			if err != nil {
				return nil, nil, nil, err
			}
			if val != nil {
				t := strings.TrimSpace(*val)
				val = &t
			}
			if k[0] == "name" {
				name = val
			} else {
				desc = val
			}
			set[k[0]] = true
			break
		}
	}
	return name, desc, set, nil
}

// createSnapshot is POST /snapshots (cinder/api/v3/snapshots.py create,
// cinder/volume/api.py _create_snapshot_in_db): 202 with the snapshot in
// status creating; the worker copies the volume's file after commit.
func (s *Service) createSnapshot(r *http.Request) (*api.Response, error) {
	b, err := decodeBody(r, "snapshot")
	if err != nil {
		return nil, err
	}
	if err := api.UnknownFields(b, "name", "description", "display_name", "display_description", "volume_id",
		"force", "metadata"); err != nil {
		return nil, err
	}
	volID, err := b.optString("volume_id", 255)
	if err != nil {
		return nil, err
	}
	if raw, ok := b["volume_id"]; ok && isNull(raw) {
		// Cinder's schema allows a null volume_id, which no volume has.
		return nil, errVolumeNotFound("None")
	}
	if volID == nil {
		return nil, api.BadRequest("Invalid input for field/attribute snapshot. 'volume_id' is a required property")
	}
	spec := SnapshotSpec{VolumeID: *volID}
	if spec.Force, _, err = b.boolean("force"); err != nil {
		return nil, err
	}
	if spec.Name, spec.Description, _, err = nameDesc(b); err != nil {
		return nil, err
	}
	if raw, ok := b["metadata"]; ok {
		if spec.Metadata, err = parseMetadata("metadata", raw); err != nil {
			return nil, err
		}
	}
	sn, err := s.createSnap(r.Context(), caller(r), spec)
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusAccepted, map[string]any{"snapshot": snapView(r, sn, snapDetail)}), nil
}

// SnapshotSpec is a snapshot to take of VolumeID; Force takes one of an
// in-use volume. Nil fields are not given.
type SnapshotSpec struct {
	VolumeID          string
	Force             bool
	Name, Description *string
	Metadata          map[string]string
}

// createSnap takes the snapshot spec asks for, for c
// (cinder/volume/api.py _create_snapshot_in_db): of a volume c sees,
// available (or in use, forced), within quota and funds. It is in status
// creating; the worker copies the volume's data after commit.
func (s *Service) createSnap(ctx context.Context, c *api.Caller, spec SnapshotSpec) (*snapRow, error) {
	if err := checkLength("name", spec.Name, 255); err != nil {
		return nil, err
	}
	if err := checkLength("description", spec.Description, 255); err != nil {
		return nil, err
	}
	if err := checkMetadata("metadata", spec.Metadata); err != nil {
		return nil, err
	}
	meta := map[string]string{}
	maps.Copy(meta, spec.Metadata)
	name, desc := trimmed(spec.Name), trimmed(spec.Description)
	pre, err := ownedVol(ctx, s.db, c, spec.VolumeID)
	if err != nil {
		return nil, err
	}
	if err := s.checkStart(ctx, pre.ProjectID, metering.KindSnapshot, pre.Size); err != nil {
		return nil, err
	}
	var sn *snapRow
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		v, err := ownedVol(ctx, tx, c, spec.VolumeID)
		if err != nil {
			return err
		}
		valid := []string{StatusAvailable}
		if spec.Force {
			valid = append(valid, "in-use")
		}
		if !contains(valid, v.Status) {
			// cinder/volume/api.py create_snapshot_in_db: ', '.join(valid_status)
			return invalidVolume("Volume %s status must be %s, but current status is: %s.", v.ID, strings.Join(valid, ", "), v.Status)
		}
		if err := s.reserveSnapshot(ctx, tx, v); err != nil {
			return err
		}
		now := s.now()
		sn = &snapRow{ID: newID(), ProjectID: v.ProjectID, UserID: c.UserID, VolumeID: v.ID, TypeID: v.TypeID,
			Name: name, Description: desc, Size: v.Size, Status: SnapCreating, Bootable: v.Bootable,
			ImageMetadata: v.ImageMetadata, Metadata: meta, SourceImageID: v.SourceImageID, CreatedAt: now, UpdatedAt: now}
		if err := insertSnap(ctx, tx, sn); err != nil {
			return err
		}
		if err := meterSnap(ctx, tx, sn, now); err != nil {
			return err
		}
		tx.AfterCommit(func() { s.kick(snapKey + sn.ID) })
		return nil
	})
	if err != nil {
		return nil, err
	}
	return sn, nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// reserveSnapshot checks, in tx, that v's project may take one more
// snapshot of v (snapshots, snapshots_<type>) and its size in gigabytes,
// with Cinder's 413s (cinder/quota_utils.py process_reserve_over_quota).
func (s *Service) reserveSnapshot(ctx context.Context, tx *store.Tx, v *volRow) error {
	if err := quota.Lock(ctx, tx, "volume_quota_locks", v.ProjectID); err != nil {
		return err
	}
	lim, err := quotaOf(ctx, tx, v.ProjectID)
	if err != nil {
		return err
	}
	var total, ofType int64
	if err := tx.QueryRow(ctx, `SELECT COUNT(*), COALESCE(SUM(CASE WHEN volume_type_id = ? THEN 1 ELSE 0 END), 0)
		FROM volume_snapshots WHERE project_id = ?`, v.TypeID, v.ProjectID).Scan(&total, &ofType); err != nil {
		return err
	}
	for _, k := range []struct {
		name string
		used int64
	}{{"snapshots", total}, {"snapshots_" + v.TypeName, ofType}} {
		if l, ok := lim[k.name]; ok && l >= 0 && k.used+1 > l {
			// cinder/exception.py SnapshotLimitExceeded
			return api.OverLimit("Maximum number of snapshots allowed (%d) exceeded for quota '%s'.", l, k.name)
		}
	}
	return s.reserve(ctx, tx, v.ProjectID, 0, v.Size, 0)
}

// snapshotUsage is what a project's snapshots take: their count and
// gigabytes (which count in the gigabytes quota as well, as in Cinder).
func snapshotUsage(ctx context.Context, q store.Querier, project string) (count, gigabytes int64, err error) {
	err = q.QueryRow(ctx, "SELECT COUNT(*), COALESCE(SUM(size), 0) FROM volume_snapshots WHERE project_id = ?",
		project).Scan(&count, &gigabytes)
	return
}

// updateSnapshot is PUT /snapshots/{id}: name and description, 200 with
// the snapshot.
func (s *Service) updateSnapshot(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	b, err := decodeBody(r, "snapshot")
	if err != nil {
		return nil, err
	}
	if err := api.UnknownFields(b, "name", "description", "display_name", "display_description"); err != nil {
		return nil, err
	}
	name, desc, set, err := nameDesc(b)
	if err != nil {
		return nil, err
	}
	var sn *snapRow
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		if sn, err = ownedSnap(ctx, tx, caller(r), r.PathValue("id")); err != nil {
			return err
		}
		if set["name"] {
			sn.Name = name
		}
		if set["description"] {
			sn.Description = desc
		}
		sn.UpdatedAt = s.now()
		_, err := tx.Exec(ctx, "UPDATE volume_snapshots SET name = ?, description = ?, updated_at = ? WHERE id = ?",
			sn.Name, sn.Description, store.FormatTime(sn.UpdatedAt), sn.ID)
		return err
	})
	if err != nil {
		return nil, err
	}
	return api.JSON(200, map[string]any{"snapshot": snapView(r, sn, snapDetail)}), nil
}

// deleteSnapshot is DELETE /snapshots/{id}: 202; the snapshot goes to
// deleting (and stops being charged) at once, and is gone once its file
// is (cinder/volume/api.py delete_snapshot).
func (s *Service) deleteSnapshot(r *http.Request) (*api.Response, error) {
	if err := s.deleteSnap(r.Context(), caller(r), r.PathValue("id"), false); err != nil {
		return nil, err
	}
	return api.Empty(http.StatusAccepted), nil
}

// deleteSnap deletes snapshot id for c: one available or in error, or in
// any status when force (an admin's os-force_delete), but never one a
// volume is still being made from.
func (s *Service) deleteSnap(ctx context.Context, c *api.Caller, id string, force bool) error {
	return s.db.Tx(ctx, func(tx *store.Tx) error {
		sn, err := ownedSnap(ctx, tx, c, id)
		if err != nil {
			return err
		}
		if sn.Status == SnapDeleting {
			if force { // an admin's reset to deleting queued no work
				tx.AfterCommit(func() { s.kick(snapKey + sn.ID) })
			}
			return nil
		}
		if !force && sn.Status != SnapAvailable && sn.Status != SnapError {
			return invalidSnapshot("Snapshot status must be available or error and must not be part of a group.")
		}
		// A volume still being made from it reads its file.
		var n int
		if err := tx.QueryRow(ctx, "SELECT COUNT(*) FROM volumes WHERE snapshot_id = ? AND status = ?", sn.ID, StatusCreating).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			return invalidSnapshot("Snapshot %s has volumes being created from it.", sn.ID)
		}
		if _, err := s.setSnapStatus(ctx, tx, sn, SnapDeleting, ""); err != nil {
			return err
		}
		tx.AfterCommit(func() { s.kick(snapKey + sn.ID) })
		return nil
	})
}

// snapshotAction is POST /snapshots/{id}/action: the admin's
// os-reset_status and os-force_delete (cinder/api/contrib/admin_actions.py).
func (s *Service) snapshotAction(r *http.Request) (*api.Response, error) {
	var outer map[string]json.RawMessage
	if err := api.DecodeJSON(r, &outer); err != nil {
		return nil, err
	}
	if len(outer) != 1 {
		return nil, api.BadRequest("Malformed request body")
	}
	for name, raw := range outer {
		switch name {
		case "os-reset_status":
			return s.resetSnapshotStatus(r, raw)
		case "os-force_delete":
			if !caller(r).IsAdmin() {
				return nil, api.PolicyForbidden("volume_extension:snapshot_admin_actions:force_delete")
			}
			if err := s.deleteSnap(r.Context(), caller(r), r.PathValue("id"), true); err != nil {
				return nil, err
			}
			return api.Empty(http.StatusAccepted), nil
		case "os-update_snapshot_status":
			return s.updateSnapshotStatus(r, raw)
		}
		return nil, api.BadRequest("There is no such action: %s", name)
	}
	return nil, api.BadRequest("Malformed request body")
}

// resetSnapshotStatus changes only the record (and with it whether the
// snapshot is charged). 202.
func (s *Service) resetSnapshotStatus(r *http.Request, raw json.RawMessage) (*api.Response, error) {
	ctx := r.Context()
	if !caller(r).IsAdmin() {
		return nil, api.PolicyForbidden("volume_extension:snapshot_admin_actions:reset_status")
	}
	b, err := actionBody("os-reset_status", raw)
	if err != nil {
		return nil, err
	}
	if err := api.UnknownFields(b, "status"); err != nil {
		return nil, err
	}
	status, err := b.optString("status", 255)
	if err != nil {
		return nil, err
	}
	if status == nil || !snapResettable[strings.ToLower(*status)] {
		return nil, api.BadRequest("Must specify a valid status")
	}
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		sn, err := ownedSnap(ctx, tx, caller(r), r.PathValue("id"))
		if err != nil {
			return err
		}
		_, err = s.setSnapStatus(ctx, tx, sn, strings.ToLower(*status), "")
		return err
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(http.StatusAccepted), nil
}

// ---- Listing (cinder/api/v3/snapshots.py _items) ----

var snapSortColumns = map[string]string{
	"id": "s.id", "name": "COALESCE(s.name, '')", "display_name": "COALESCE(s.name, '')", "status": "s.status",
	"size": "s.size", "volume_size": "s.size", "volume_id": "s.volume_id", "created_at": "s.created_at",
	"updated_at": "s.updated_at", "project_id": "s.project_id",
}

// snapshotFilters reads the scope and filters: the caller's project's
// snapshots, or with all_tenants every project's (admin; project_id
// narrows it); status, volume_id, name, and metadata from 3.22.
func snapshotFilters(r *http.Request) (*volumeQuery, error) {
	c, q := caller(r), r.URL.Query()
	vq := &volumeQuery{}
	if all, _ := api.ParseBool(q.Get("all_tenants")); !all || !c.IsAdmin() {
		vq.page.Add("s.project_id = ?", c.ProjectID)
	} else if p := q.Get("project_id"); p != "" {
		vq.page.Add("s.project_id = ?", p)
	}
	for _, f := range []volumeFilter{
		{"name", 0, equal("COALESCE(s.name, '')")},
		{"display_name", 0, equal("COALESCE(s.name, '')")},
		{"name~", 34, snapNameContains},
		{"status", 0, equal("s.status")},
		{"volume_id", 0, equal("s.volume_id")},
		{"metadata", 22, metadataFilter},
		{"created_at", 60, timeFilter("s.created_at")},
		{"updated_at", 60, timeFilter("s.updated_at")},
	} {
		val, ok := q[f.param]
		if !ok || minor(r) < f.minMinor {
			continue
		}
		if err := f.add(vq, f.param, val[0]); err != nil {
			return nil, err
		}
	}
	return vq, nil
}

// snapNameContains is name~ (3.34) on snapshots, as nameContains on volumes.
func snapNameContains(vq *volumeQuery, _, val string) error {
	if val != "" {
		vq.page.Add("COALESCE(s.name, '') <> replace(COALESCE(s.name, ''), ?, '')", val)
	}
	return nil
}

func snapMatches(vq *volumeQuery, sn *snapRow) bool {
	for k, x := range vq.meta {
		if sn.Metadata[k] != x {
			return false
		}
	}
	return true
}

// scanSnaps reads the page's snapshots that match the metadata filter,
// skipping the first skip and stopping after n (-1: all).
func (s *Service) scanSnaps(ctx context.Context, vq *volumeQuery, skip, n int) ([]*snapRow, error) {
	rows, err := s.db.Query(ctx, "SELECT "+snapColumns+snapFrom+" "+vq.page.SQL(), vq.page.Args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*snapRow
	for (n < 0 || len(out) < n) && rows.Next() {
		sn, err := scanSnap(rows)
		if err != nil {
			return nil, err
		}
		if !snapMatches(vq, sn) {
			continue
		}
		if skip > 0 {
			skip--
			continue
		}
		out = append(out, sn)
	}
	return out, rows.Err()
}

// listSnapshots is GET /snapshots and /snapshots/detail with Cinder's
// paging (limit, marker, offset, sort, with_count from 3.45) and
// snapshots_links when more follow.
func (s *Service) listSnapshots(detail bool) api.HandlerFunc {
	return func(r *http.Request) (*api.Response, error) {
		ctx := r.Context()
		q := r.URL.Query()
		keys, err := sortParams(q, snapSortColumns, "s.id")
		if err != nil {
			return nil, err
		}
		limit, offset, err := pageSize(q)
		if err != nil {
			return nil, err
		}
		vq, err := snapshotFilters(r)
		if err != nil {
			return nil, err
		}
		out := map[string]any{}
		if wantCount(r) {
			all := *vq
			all.page.Keys, all.page.Limit = api.Keyset{{Col: "s.id"}}, -1
			snaps, err := s.scanSnaps(ctx, &all, 0, -1)
			if err != nil {
				return nil, err
			}
			out["count"] = len(snaps)
		}
		vq.page.Keys = keys
		if err := s.afterSnapMarker(ctx, vq, q.Get("marker")); err != nil {
			return nil, err
		}
		vq.page.Limit = -1
		if vq.meta == nil {
			vq.page.Limit = offset + limit
		}
		snaps, err := s.scanSnaps(ctx, vq, offset, limit)
		if err != nil {
			return nil, err
		}
		page := snaps[:min(limit, len(snaps))]
		level := snapSummary
		if detail {
			level = snapExtended
		}
		items := make([]map[string]any, 0, len(page))
		for _, sn := range page {
			items = append(items, snapView(r, sn, level))
		}
		out["snapshots"] = items
		if fullPage(len(page), limit) {
			out["snapshots_links"] = nextLink(r, q, listPath("/snapshots", detail), limit, page[len(page)-1].ID)
		}
		return api.JSON(200, out), nil
	}
}

// afterSnapMarker narrows the page to the snapshots after the marker's
// sort values; the marker must be one the filters keep (404 otherwise).
func (s *Service) afterSnapMarker(ctx context.Context, vq *volumeQuery, marker string) error {
	if marker == "" {
		return nil
	}
	where := strings.Join(append(append([]string{}, vq.page.Where...), "s.id = ?"), " AND ")
	args := append(append([]any{}, vq.page.Args...), marker)
	notFound := api.NotFound("Marker %s could not be found.", marker)
	if vq.meta != nil {
		sn, err := scanSnap(s.db.QueryRow(ctx, "SELECT "+snapColumns+snapFrom+" WHERE "+where, args...))
		if store.IsNoRows(err) || (err == nil && !snapMatches(vq, sn)) {
			return notFound
		} else if err != nil {
			return err
		}
	}
	vals, err := vq.page.Keys.MarkerValues(ctx, s.db, strings.TrimPrefix(snapFrom, " FROM "), where, args...)
	if errors.Is(err, store.ErrNotFound) {
		return notFound
	} else if err != nil {
		return err
	}
	vq.page.AfterMarker(vals)
	return nil
}

// ---- Volumes made from a snapshot or another volume ----

// nullID is an id for a view: null when empty.
func nullID(id string) any {
	if id == "" {
		return nil
	}
	return id
}

// volumeSource reads a create's snapshot or source volume: v is to
// be made from that snapshot or volume, of its size at least, of its type
// unless another is asked for, bootable and with its image metadata as
// Cinder carries them over (cinder/volume/flows/api/create_volume.py). It
// answers the size and type reference to use.
func (s *Service) volumeSource(ctx context.Context, c *api.Caller, spec VolumeSpec, v *volRow, size int64, haveSize bool) (int64, bool, *string, error) {
	snapID, srcID, imageRef, typeRef := spec.SnapshotID, spec.SourceVolID, spec.ImageRef, spec.Type
	if snapID != nil && *snapID == "" {
		snapID = nil
	}
	if srcID != nil && *srcID == "" {
		srcID = nil
	}
	if snapID == nil && srcID == nil {
		return size, haveSize, typeRef, nil
	}
	if (snapID != nil && srcID != nil) || (imageRef != nil && *imageRef != "") {
		return 0, false, nil, invalidInput("May specify only one of snapshot, imageRef or source volume")
	}
	if snapID != nil {
		v.SnapshotID = *snapID
	} else {
		v.SourceVolID = *srcID
	}
	src, err := s.sourceOf(ctx, s.db, c, v)
	if err != nil {
		return 0, false, nil, err
	}
	if !haveSize {
		size, haveSize = src.size, true
	}
	if size < src.size {
		if snapID != nil {
			return 0, false, nil, invalidInput("Volume size '%d'GB cannot be smaller than the snapshot size %dGB. They must be >= original snapshot size.", size, src.size)
		}
		return 0, false, nil, invalidInput("Volume size '%d'GB cannot be smaller than original volume size %dGB. They must be >= original volume size.", size, src.size)
	}
	if typeRef == nil || *typeRef == "" {
		typeRef = &src.typeID
	}
	v.Bootable, v.SourceImageID = src.bootable, src.imageID
	v.ImageMetadata = map[string]string{}
	for k, x := range src.imageMeta {
		v.ImageMetadata[k] = x
	}
	return size, haveSize, typeRef, nil
}

// source is what a volume is copied from.
type source struct {
	size      int64
	typeID    string
	bootable  bool
	imageMeta map[string]string
	imageID   string // the SourceImageID it passes on
}

// sourceOf finds v's snapshot or source volume as the caller sees it and
// checks it can be copied now: available. Called again in the create's
// transaction.
func (s *Service) sourceOf(ctx context.Context, q store.Querier, c *api.Caller, v *volRow) (*source, error) {
	if v.SnapshotID != "" {
		sn, err := ownedSnap(ctx, q, c, v.SnapshotID)
		if err != nil {
			return nil, err
		}
		if sn.Status != SnapAvailable {
			return nil, invalidSnapshot("Originating snapshot status must be one of 'available' values")
		}
		return &source{size: sn.Size, typeID: sn.TypeID, bootable: sn.Bootable, imageMeta: sn.ImageMetadata, imageID: sn.SourceImageID}, nil
	}
	if v.SourceVolID == "" {
		return nil, nil
	}
	src, err := ownedVol(ctx, q, c, v.SourceVolID)
	if err != nil {
		return nil, err
	}
	if src.Status != StatusAvailable {
		return nil, invalidVolume("Volume %s status must be available to be cloned, but current status is: %s.", src.ID, src.Status)
	}
	return &source{size: src.Size, typeID: src.TypeID, bootable: src.Bootable, imageMeta: src.ImageMetadata, imageID: src.SourceImageID}, nil
}

// sourcePath is the file volume v is copied from, "" when it is made from
// neither a snapshot nor a volume.
func (s *Service) sourcePath(v *volRow) string {
	switch {
	case v.SnapshotID != "":
		return s.snapPath(v.SnapshotID)
	case v.SourceVolID != "":
		return s.dataPath(v.SourceVolID)
	}
	return ""
}

// ---- Deleting a volume with snapshots ----

// snapshotsOnVolumeDelete refuses to delete a volume that has snapshots,
// unless cascade, which deletes them with it: then every one must be
// available or error (cinder/volume/api.py delete,
// volume_has_undeletable_snapshots_filter). A clone still being made also
// holds the volume. Called in the delete's transaction; the volume's
// worker removes the snapshots before the volume.
func (s *Service) snapshotsOnVolumeDelete(ctx context.Context, tx *store.Tx, v *volRow, cascade bool) error {
	// A clone still being made reads the volume's file.
	var clones int
	if err := tx.QueryRow(ctx, "SELECT COUNT(*) FROM volumes WHERE source_volid = ? AND status = ?", v.ID, StatusCreating).Scan(&clones); err != nil {
		return err
	}
	if clones > 0 {
		return invalidVolume("Volume %s has clones being created from it.", v.ID)
	}
	snaps, err := loadSnaps(ctx, tx, "s.volume_id = ?", v.ID)
	if err != nil || len(snaps) == 0 {
		return err
	}
	refuse := invalidVolume("Volume status must be available or error or error_restoring or error_extending or error_managing " +
		"and must not be migrating, attached, belong to a group, have snapshots, awaiting a transfer, or be disassociated from snapshots after volume transfer.")
	if !cascade {
		return refuse
	}
	for _, sn := range snaps {
		if sn.Status != SnapAvailable && sn.Status != SnapError && sn.Status != SnapDeleting {
			return refuse
		}
	}
	for _, sn := range snaps {
		if _, err := s.setSnapStatus(ctx, tx, sn, SnapDeleting, ""); err != nil {
			return err
		}
	}
	return nil
}

// removeSnapshotsOf removes every snapshot of a volume being deleted (a
// cascade put them in deleting): their files, then their rows.
func (s *Service) removeSnapshotsOf(ctx context.Context, volID string) error {
	snaps, err := loadSnaps(ctx, s.db, "s.volume_id = ?", volID)
	if err != nil {
		return err
	}
	for _, sn := range snaps {
		if err := s.removeSnapshot(ctx, sn); err != nil {
			return err
		}
	}
	return nil
}
