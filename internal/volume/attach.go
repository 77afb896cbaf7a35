package volume

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/driver"
	"nimbus/internal/store"
)

// Attachments: a volume given to a server (Cinder's volume_attachment,
// carrying Nova's block device mapping fields: device, tag,
// delete_on_termination). Compute drives them through the methods below;
// Cinder's attachments API and its legacy os-reserve/os-attach/…
// actions drive the same rows.

// Attach statuses (cinder/objects/fields.py VolumeAttachStatus).
const (
	AttachReserved  = "reserved"
	AttachAttaching = "attaching"
	AttachAttached  = "attached"
	AttachDetaching = "detaching"
)

// Volume statuses that come with attachments.
const (
	StatusReserved  = "reserved"
	StatusAttaching = "attaching"
	StatusInUse     = "in-use"
	StatusDetaching = "detaching"
)

// Attachment is one volume's attachment to a server.
type Attachment struct {
	ID       string
	VolumeID string
	ServerID string // Cinder's instance_uuid
	// Host is the host the connection was made for ("" before Connect,
	// and after Disconnect).
	Host string
	// Status is one of the Attach* statuses.
	Status string
	// Mode is "rw" or "ro" (the volume's readonly flag when connected).
	Mode                string
	Device              string // Nova's device name, e.g. /dev/vdb
	Tag                 string
	DeleteOnTermination bool
	AttachedAt          time.Time
	CreatedAt           time.Time
}

// ReserveRequest asks for an attachment of a volume to a server.
type ReserveRequest struct {
	// ProjectID and Admin are the caller's: the volume must be one they
	// may see (404 otherwise).
	ProjectID string
	Admin     bool
	VolumeID  string
	ServerID  string
	// Device is the name to answer ("" : the next free /dev/vdX after
	// the server's boot disk and its other attachments).
	Device              string
	Tag                 string
	DeleteOnTermination bool
}

// Who made an attachment: compute's are the ones a server's disks follow;
// the attachments API's and the legacy os-attach's are records only, so
// that a customer naming someone else's server in one gives that server
// nothing (and gets nothing of it).
const (
	originCompute = "compute"
	originAPI     = "api"
)

// Exporter serves volumes to hosts other than the storage node's own
// (internal/blockexport: qemu-storage-daemon, NBD over TLS with a
// pre-shared key). Names are per attachment.
type Exporter interface {
	// Export serves the file at path under name and answers how a host
	// connects; exporting a name already served gives its connection again.
	Export(ctx context.Context, name, path string, readOnly bool) (driver.VolumeConn, error)
	// Unexport stops serving name; an unknown name is not an error.
	Unexport(ctx context.Context, name string) error
	// Exports are the names served now.
	Exports() []string
}

// exportName is the export of one attachment.
func exportName(attachmentID string) string { return "att-" + attachmentID }

// attRow is one row of volume_attachments.
type attRow struct {
	Attachment
	ProjectID, HostName, Origin string
	Connector                   map[string]any
	DetachedAt, UpdatedAt       time.Time
}

const attColumns = `id, volume_id, project_id, instance_uuid, host, host_name, connector, attach_status, attach_mode,
	mountpoint, tag, delete_on_termination, origin, COALESCE(attached_at, ''), COALESCE(detached_at, ''), created_at, updated_at`

func scanAtt(sc interface{ Scan(...any) error }) (*attRow, error) {
	a := &attRow{}
	var conn, attached, detached, created, updated string
	var dot int
	if err := sc.Scan(&a.ID, &a.VolumeID, &a.ProjectID, &a.ServerID, &a.Host, &a.HostName, &conn, &a.Status, &a.Mode,
		&a.Device, &a.Tag, &dot, &a.Origin, &attached, &detached, &created, &updated); err != nil {
		return nil, err
	}
	a.DeleteOnTermination = dot != 0
	a.Connector = map[string]any{}
	if err := store.FromJSON(conn, &a.Connector); err != nil {
		return nil, err
	}
	if attached != "" {
		a.AttachedAt = store.ParseTime(attached)
	}
	if detached != "" {
		a.DetachedAt = store.ParseTime(detached)
	}
	a.CreatedAt, a.UpdatedAt = store.ParseTime(created), store.ParseTime(updated)
	return a, nil
}

func getAtt(ctx context.Context, q store.Querier, id string) (*attRow, error) {
	a, err := scanAtt(q.QueryRow(ctx, "SELECT "+attColumns+" FROM volume_attachments WHERE id = ?", id))
	if store.IsNoRows(err) {
		return nil, store.ErrNotFound
	}
	return a, err
}

func loadAtts(ctx context.Context, q store.Querier, where string, args ...any) ([]*attRow, error) {
	rows, err := q.Query(ctx, "SELECT "+attColumns+" FROM volume_attachments WHERE "+where+" ORDER BY created_at, id", args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*attRow
	for rows.Next() {
		a, err := scanAtt(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, rows.Err()
}

func nullTime(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return store.FormatTime(t)
}

func insertAtt(ctx context.Context, q store.Querier, a *attRow) error {
	_, err := q.Exec(ctx, `INSERT INTO volume_attachments (id, volume_id, project_id, instance_uuid, host, host_name, connector,
		attach_status, attach_mode, mountpoint, tag, delete_on_termination, origin, attached_at, detached_at, created_at, updated_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, NULL, ?, ?)`,
		a.ID, a.VolumeID, a.ProjectID, a.ServerID, a.Host, a.HostName, store.JSON(a.Connector), a.Status, a.Mode, a.Device,
		a.Tag, b2i(a.DeleteOnTermination), a.Origin, nullTime(a.AttachedAt), store.FormatTime(a.CreatedAt), store.FormatTime(a.UpdatedAt))
	return err
}

// setAttStatus moves an attachment to status when it is in one of from;
// it reports whether it did.
func (s *Service) setAttStatus(ctx context.Context, q store.Querier, a *attRow, status string, from ...string) (bool, error) {
	t := s.now()
	query := "UPDATE volume_attachments SET attach_status = ?, updated_at = ?"
	args := []any{status, store.FormatTime(t)}
	if status == AttachAttached && a.AttachedAt.IsZero() {
		a.AttachedAt = t
		query += ", attached_at = ?"
		args = append(args, store.FormatTime(t))
	}
	query += " WHERE id = ? AND attach_status IN (" + api.Placeholders(len(from)) + ")"
	args = append(args, a.ID)
	for _, f := range from {
		args = append(args, f)
	}
	res, err := q.Exec(ctx, query, args...)
	if err != nil {
		return false, err
	}
	n, _ := res.RowsAffected()
	if n > 0 {
		a.Status, a.UpdatedAt = status, t
	}
	return n > 0, nil
}

// setAttachedMode keeps the mode of the volume's attachment in its admin
// metadata (Cinder's attached_mode, shown in the volume's metadata), or
// removes it ("").
func (s *Service) setAttachedMode(ctx context.Context, q store.Querier, v *volRow, mode string) error {
	if v.AdminMetadata["attached_mode"] == mode {
		return nil
	}
	if mode == "" {
		delete(v.AdminMetadata, "attached_mode")
	} else {
		v.AdminMetadata["attached_mode"] = mode
	}
	_, err := q.Exec(ctx, "UPDATE volumes SET admin_metadata = ? WHERE id = ?", store.JSON(v.AdminMetadata), v.ID)
	return err
}

var devicePattern = regexp.MustCompile(`^/dev/[a-z]+[0-9]*$`)

// deviceName is the n-th disk's name: vda, …, vdz, vdaa, … (Nova's
// get_dev_name_for_instance letters).
func deviceName(n int) string {
	suffix := ""
	for n++; n > 0; n = (n - 1) / 26 {
		suffix = string(rune('a'+(n-1)%26)) + suffix
	}
	return "/dev/vd" + suffix
}

// pickDevice checks a requested device name against the server's other
// attachments, or picks the next free one after the boot disk.
func pickDevice(want string, others []*attRow) (string, error) {
	used := map[string]bool{"/dev/vda": true}
	for _, o := range others {
		used[o.Device] = true
	}
	if want != "" {
		if !devicePattern.MatchString(want) {
			return "", api.BadRequest("The supplied device path (%s) is invalid.", want)
		}
		if used[want] {
			return "", api.BadRequest("The supplied device path (%s) is in use.", want)
		}
		return want, nil
	}
	for n := 1; ; n++ {
		if d := deviceName(n); !used[d] {
			return d, nil
		}
	}
}

// attachMode is the mode a new attachment gets: ro for a read-only volume,
// and rw refused on one (cinder/exception.py InvalidVolumeAttachMode).
func attachMode(v *volRow, want string) (string, error) {
	ro := v.AdminMetadata["readonly"] == "True"
	switch {
	case want == "" && ro:
		return "ro", nil
	case want == "":
		return "rw", nil
	case want == "rw" && ro:
		return "", api.BadRequest("Invalid attaching mode '%s' for volume %s.", want, v.ID)
	}
	return want, nil
}

// Reserve makes an attachment in tx: the volume must be available (or
// multiattach) and not attached to the server already; it becomes
// reserved. The answer is an *api.Error with Nova's and Cinder's text
// (404 for a volume the caller cannot see, 400 "Invalid volume: …" for
// one in the wrong status or already attached).
func (s *Service) Reserve(ctx context.Context, tx *store.Tx, req ReserveRequest) (Attachment, error) {
	v, err := getVol(ctx, tx, req.VolumeID)
	if errors.Is(err, store.ErrNotFound) || (err == nil && !req.Admin && v.ProjectID != req.ProjectID) {
		return Attachment{}, errVolumeNotFound(req.VolumeID)
	}
	if err != nil {
		return Attachment{}, err
	}
	others, err := loadAtts(ctx, tx, "instance_uuid = ? AND origin = ?", req.ServerID, originCompute)
	if err != nil {
		return Attachment{}, err
	}
	for _, o := range others {
		if o.VolumeID == v.ID {
			return Attachment{}, invalidVolume("Volume %s is already attached to server %s.", v.ID, req.ServerID)
		}
	}
	device, err := pickDevice(req.Device, others)
	if err != nil {
		return Attachment{}, err
	}
	mode, _ := attachMode(v, "")
	// cinder/volume/api.py _attachment_reserve: a conditional update, so
	// that two reserves of one volume never both win.
	if ok, err := s.setStatus(ctx, tx, v, StatusReserved, "", StatusAvailable); err != nil {
		return Attachment{}, err
	} else if !ok {
		return Attachment{}, invalidVolume("Volume %s status must be available or downloading", v.ID)
	}
	now := s.now()
	a := &attRow{Attachment: Attachment{ID: newID(), VolumeID: v.ID, ServerID: req.ServerID, Status: AttachReserved, Mode: mode,
		Device: device, Tag: req.Tag, DeleteOnTermination: req.DeleteOnTermination, CreatedAt: now},
		ProjectID: v.ProjectID, Origin: originCompute, Connector: map[string]any{}, UpdatedAt: now}
	if err := insertAtt(ctx, tx, a); err != nil {
		return Attachment{}, err
	}
	return a.Attachment, nil
}

// connectable are the attachment statuses a connection may be made in: a
// new attachment's, and an attached one's when its server starts on a
// host (spawn, unshelve, a moved server).
var connectable = []string{AttachReserved, AttachAttaching, AttachAttached}

// Connect is Cinder's initialize_connection for the host a server runs
// on: how that host opens the volume (the file itself on the storage
// node's own host, an NBD export over TLS elsewhere, the RBD image on
// Ceph), with the volume type's QoS and the read-only flag. It records
// the host on the attachment (attaching) and may start an export; asking
// again for the same host gives the same connection.
func (s *Service) Connect(ctx context.Context, attachmentID, host string) (driver.Volume, error) {
	a, err := getAtt(ctx, s.db, attachmentID)
	if err != nil {
		return driver.Volume{}, err
	}
	return s.connect(ctx, a, host)
}

func (s *Service) connect(ctx context.Context, a *attRow, host string) (driver.Volume, error) {
	if host == "" {
		return driver.Volume{}, invalidInput("a connection needs a host")
	}
	if !contains(connectable, a.Status) {
		return driver.Volume{}, invalidVolume("Attachment %s is %s and cannot be connected.", a.ID, a.Status)
	}
	v, err := getVol(ctx, s.db, a.VolumeID)
	if err != nil {
		return driver.Volume{}, err
	}
	// A server that moved: its old host's export goes first.
	if a.Host != "" && a.Host != host {
		if err := s.unexport(ctx, a); err != nil {
			return driver.Volume{}, err
		}
	}
	qos, err := s.QoS(ctx, v.ID)
	if err != nil {
		return driver.Volume{}, err
	}
	ro := a.Mode == "ro" || v.AdminMetadata["readonly"] == "True"
	vol := driver.Volume{ID: v.ID, Device: a.Device, ReadOnly: ro, Throttle: driverThrottle(qos)}
	var exported bool
	if vol.Conn, exported, err = s.backend.conn(ctx, a, v, host, ro); err != nil {
		return driver.Volume{}, err
	}
	vol.Conn.SizeBytes = v.Size << 30
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		res, err := tx.Exec(ctx, "UPDATE volume_attachments SET host = ?, updated_at = ? WHERE id = ? AND attach_status IN (?, ?, ?)",
			host, store.FormatTime(s.now()), a.ID, AttachReserved, AttachAttaching, AttachAttached)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return invalidVolume("Attachment %s was removed or detached while it was being connected.", a.ID)
		}
		a.Host = host
		if ok, err := s.setAttStatus(ctx, tx, a, AttachAttaching, AttachReserved); err != nil || !ok {
			return err
		}
		v, err := getVol(ctx, tx, a.VolumeID)
		if err != nil {
			return err
		}
		_, err = s.setStatus(ctx, tx, v, StatusAttaching, "", StatusReserved)
		return err
	})
	if err != nil {
		if exported {
			// Nothing recorded, nothing served.
			if uerr := s.exporter.Unexport(context.WithoutCancel(ctx), exportName(a.ID)); uerr != nil {
				s.log.Warn("volume: unexporting after a failed connect", "attachment", a.ID, "error", uerr)
			}
		}
		return driver.Volume{}, err
	}
	return vol, nil
}

// driverThrottle is the QoS as the driver takes it (sustained rates).
func driverThrottle(t Throttle) driver.Throttle {
	return driver.Throttle{ReadIOPS: t.ReadIOPS.Avg, WriteIOPS: t.WriteIOPS.Avg, TotalIOPS: t.TotalIOPS.Avg,
		ReadBytes: t.ReadBytes.Avg, WriteBytes: t.WriteBytes.Avg, TotalBytes: t.TotalBytes.Avg}
}

// unexport stops the export made for an attachment's host, when it has
// one elsewhere than the storage node.
func (s *Service) unexport(ctx context.Context, a *attRow) error {
	if a.Host == "" || s.isLocal(a.Host) || s.exporter == nil {
		return nil
	}
	if err := s.exporter.Unexport(ctx, exportName(a.ID)); err != nil {
		return fmt.Errorf("volume: unexporting attachment %s: %w", a.ID, err)
	}
	return nil
}

// Disconnect is terminate_connection: the export made for the
// attachment's host stops and the attachment keeps no host (a shelved
// server's). One not connected is not an error.
func (s *Service) Disconnect(ctx context.Context, attachmentID string) error {
	a, err := getAtt(ctx, s.db, attachmentID)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	return s.disconnect(ctx, a)
}

func (s *Service) disconnect(ctx context.Context, a *attRow) error {
	if a.Host == "" {
		return nil
	}
	// The export stops first: a host kept on a failure is retried, never
	// an export left that no row explains (Run would remove it anyway).
	if err := s.unexport(ctx, a); err != nil {
		return err
	}
	_, err := s.db.Exec(ctx, "UPDATE volume_attachments SET host = '', updated_at = ? WHERE id = ? AND host = ?",
		store.FormatTime(s.now()), a.ID, a.Host)
	a.Host = ""
	return err
}

// onAtt runs f on attachment id, read in tx: the exported calls compute
// makes by id over the ones the API handlers make on a row they hold.
func onAtt(ctx context.Context, tx *store.Tx, id string, f func(context.Context, *store.Tx, *attRow) error) error {
	a, err := getAtt(ctx, tx, id)
	if err != nil {
		return err
	}
	return f(ctx, tx, a)
}

// Complete marks a connected attachment attached, its volume in-use, in
// tx.
func (s *Service) Complete(ctx context.Context, tx *store.Tx, attachmentID string) error {
	return onAtt(ctx, tx, attachmentID, s.complete)
}

func (s *Service) complete(ctx context.Context, tx *store.Tx, a *attRow) error {
	if a.Status == AttachAttached {
		return nil
	}
	if ok, err := s.setAttStatus(ctx, tx, a, AttachAttached, AttachReserved, AttachAttaching); err != nil {
		return err
	} else if !ok {
		return invalidVolume("Attachment %s is %s and cannot be completed.", a.ID, a.Status)
	}
	v, err := getVol(ctx, tx, a.VolumeID)
	if err != nil {
		return err
	}
	if _, err := s.setStatus(ctx, tx, v, StatusInUse, "", StatusReserved, StatusAttaching, StatusAvailable); err != nil {
		return err
	}
	return s.setAttachedMode(ctx, tx, v, a.Mode)
}

// errNotDetachable is cinder/volume/api.py begin_detaching's refusal.
func errNotDetachable() *api.Error {
	return invalidVolume("Unable to detach volume. Volume status must be 'in-use' and attach_status must be 'attached' to detach.")
}

// BeginDetach marks an attached attachment detaching (its volume
// detaching), in tx; 400 "Invalid volume: …" when it is not attached.
func (s *Service) BeginDetach(ctx context.Context, tx *store.Tx, attachmentID string) error {
	return onAtt(ctx, tx, attachmentID, s.beginDetach)
}

func (s *Service) beginDetach(ctx context.Context, tx *store.Tx, a *attRow) error {
	v, err := getVol(ctx, tx, a.VolumeID)
	if err != nil {
		return err
	}
	if v.Status != StatusInUse {
		return errNotDetachable()
	}
	if ok, err := s.setAttStatus(ctx, tx, a, AttachDetaching, AttachAttached); err != nil {
		return err
	} else if !ok {
		return errNotDetachable()
	}
	_, err = s.setStatus(ctx, tx, v, StatusDetaching, "", StatusInUse)
	return err
}

// RollDetach takes a detaching attachment back to attached (the driver
// could not detach), in tx.
func (s *Service) RollDetach(ctx context.Context, tx *store.Tx, attachmentID string) error {
	return onAtt(ctx, tx, attachmentID, s.rollDetach)
}

func (s *Service) rollDetach(ctx context.Context, tx *store.Tx, a *attRow) error {
	if _, err := s.setAttStatus(ctx, tx, a, AttachAttached, AttachDetaching); err != nil {
		return err
	}
	v, err := getVol(ctx, tx, a.VolumeID)
	if err != nil {
		return err
	}
	_, err = s.setStatus(ctx, tx, v, StatusInUse, "", StatusDetaching)
	return err
}

// Remove deletes an attachment in tx, after its disk is out of the VM
// (or after an attach that failed) and Disconnect; its volume is
// available again when no other attachment holds it. A removed
// attachment is not an error.
func (s *Service) Remove(ctx context.Context, tx *store.Tx, attachmentID string) error {
	a, err := getAtt(ctx, tx, attachmentID)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	return s.remove(ctx, tx, a)
}

func (s *Service) remove(ctx context.Context, tx *store.Tx, a *attRow) error {
	if _, err := tx.Exec(ctx, "DELETE FROM volume_attachments WHERE id = ?", a.ID); err != nil {
		return err
	}
	if a.Host != "" {
		// Not disconnected first: its export must not outlive the row.
		tx.AfterCommit(func() {
			if err := s.unexport(context.WithoutCancel(ctx), a); err != nil {
				s.log.Warn("volume: unexporting a removed attachment", "attachment", a.ID, "error", err)
			}
		})
	}
	v, err := getVol(ctx, tx, a.VolumeID)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	var n int
	if err := tx.QueryRow(ctx, "SELECT COUNT(*) FROM volume_attachments WHERE volume_id = ?", v.ID).Scan(&n); err != nil {
		return err
	}
	if n > 0 {
		return nil
	}
	if _, err := s.setStatus(ctx, tx, v, StatusAvailable, "", StatusReserved, StatusAttaching, StatusInUse, StatusDetaching); err != nil {
		return err
	}
	return s.setAttachedMode(ctx, tx, v, "")
}

// Swap ends a server's volume swap in tx, once its disk is on the new
// attachment's volume: the old attachment goes (its volume available
// again) and the new one, completed, takes its device name, as Cinder's
// migrate_volume_completion does for a swap Nova asked for.
func (s *Service) Swap(ctx context.Context, tx *store.Tx, oldAttachmentID, newAttachmentID string) error {
	old, err := getAtt(ctx, tx, oldAttachmentID)
	if err != nil {
		return err
	}
	if err := s.remove(ctx, tx, old); err != nil {
		return err
	}
	if err := s.SetDevice(ctx, tx, newAttachmentID, old.Device); err != nil {
		return err
	}
	return s.Complete(ctx, tx, newAttachmentID)
}

// SetDeleteOnTermination changes the flag of a server's attachment of a
// volume (Nova's PUT os-volume_attachments from 2.85), in tx.
func (s *Service) SetDeleteOnTermination(ctx context.Context, tx *store.Tx, attachmentID string, v bool) error {
	res, err := tx.Exec(ctx, "UPDATE volume_attachments SET delete_on_termination = ?, updated_at = ? WHERE id = ?",
		b2i(v), store.FormatTime(s.now()), attachmentID)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return store.ErrNotFound
	}
	return nil
}

// DeleteTerminated deletes a volume whose attachment said
// delete_on_termination once its server is gone and the attachment
// removed: the server's owner asked for it when attaching. It is
// deleted as DELETE /volumes/{id} would (deleting, then its data).
// A volume that cannot be deleted now (attached elsewhere, snapshots,
// being extended) is kept and logged, as Nova does when Cinder refuses,
// so that the server's deletion goes on.
func (s *Service) DeleteTerminated(ctx context.Context, tx *store.Tx, volumeID string) error {
	v, err := getVol(ctx, tx, volumeID)
	if errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	var n int
	if err := tx.QueryRow(ctx, "SELECT COUNT(*) FROM volume_attachments WHERE volume_id = ?", v.ID).Scan(&n); err != nil {
		return err
	}
	if v.Status == StatusDeleting {
		return nil
	}
	keep := func(why string) error {
		s.log.Warn("volume: not deleting a delete_on_termination volume", "volume", v.ID, "status", v.Status, "reason", why)
		return nil
	}
	if n > 0 || !deletable[v.Status] {
		return keep("attached or not in a deletable status")
	}
	if err := s.beginDelete(ctx, tx, v, false); err != nil {
		var aerr *api.Error
		if errors.As(err, &aerr) {
			return keep(aerr.Message)
		}
		return err
	}
	return nil
}

// Attachments lists the attachments of the given servers, each server's
// in the order they were made. Only compute's are listed: a record made
// through Cinder's API puts nothing into a server.
func (s *Service) Attachments(ctx context.Context, q store.Querier, serverIDs ...string) (map[string][]Attachment, error) {
	out := map[string][]Attachment{}
	if len(serverIDs) == 0 {
		return out, nil
	}
	in, args := api.InList(serverIDs)
	atts, err := loadAtts(ctx, q, "origin = ? AND instance_uuid "+in, append([]any{originCompute}, args...)...)
	if err != nil {
		return nil, err
	}
	for _, a := range atts {
		out[a.ServerID] = append(out[a.ServerID], a.Attachment)
	}
	return out, nil
}

// AttachmentByID is one attachment compute made; store.ErrNotFound when
// none.
func (s *Service) AttachmentByID(ctx context.Context, q store.Querier, id string) (Attachment, error) {
	a, err := getAtt(ctx, q, id)
	if err != nil {
		return Attachment{}, err
	}
	if a.Origin != originCompute {
		return Attachment{}, store.ErrNotFound
	}
	return a.Attachment, nil
}

// attachmentsOf are a volume's attachments.
func attachmentsOf(ctx context.Context, q store.Querier, volumeID string) ([]*attRow, error) {
	return loadAtts(ctx, q, "volume_id = ?", volumeID)
}

// heldStatus is the status a volume goes back to after work that kept it
// busy (a backup, an extend): in-use while an attachment holds it,
// available otherwise.
func heldStatus(ctx context.Context, q store.Querier, volumeID string) (string, error) {
	var n int
	if err := q.QueryRow(ctx, "SELECT COUNT(*) FROM volume_attachments WHERE volume_id = ?", volumeID).Scan(&n); err != nil {
		return "", err
	}
	if n > 0 {
		return StatusInUse, nil
	}
	return StatusAvailable, nil
}

// resyncExports, at start, serves again every attachment connected to a
// host other than the storage node's (the exports died with the last
// controller) and stops exports no attachment explains.
func (s *Service) resyncExports(ctx context.Context) error {
	if s.exporter == nil {
		return nil
	}
	atts, err := loadAtts(ctx, s.db, "host <> ''")
	if err != nil {
		return err
	}
	want := map[string]bool{}
	for _, a := range atts {
		if s.isLocal(a.Host) {
			continue
		}
		v, err := getVol(ctx, s.db, a.VolumeID)
		if err != nil {
			s.log.Warn("volume: re-exporting", "attachment", a.ID, "error", err)
			continue
		}
		want[exportName(a.ID)] = true
		ro := a.Mode == "ro" || v.AdminMetadata["readonly"] == "True"
		if _, err := s.exporter.Export(ctx, exportName(a.ID), s.dataPath(v.ID), ro); err != nil {
			s.log.Error("volume: re-exporting failed", "attachment", a.ID, "volume", v.ID, "host", a.Host, "error", err)
		}
	}
	for _, n := range s.exporter.Exports() {
		if !want[n] {
			if err := s.exporter.Unexport(ctx, n); err != nil {
				s.log.Warn("volume: removing a stale export", "export", n, "error", err)
			}
		}
	}
	return nil
}

// finishExtend records a grown (or failed) volume: in-use again when it
// is attached, available otherwise; then tells the servers it is
// attached to about its new size.
func (s *Service) finishExtend(ctx context.Context, v *volRow, werr error) error {
	var servers []string
	err := s.record(ctx, v, func(q store.Querier) error {
		atts, err := attachmentsOf(ctx, q, v.ID)
		if err != nil {
			return err
		}
		status, reason := StatusAvailable, ""
		if len(atts) > 0 {
			status = StatusInUse
		}
		if werr != nil {
			s.log.Error("volume: data work failed", "volume", v.ID, "status", StatusExtending, "error", werr)
			status, reason, v.NewSize = StatusErrorExtending, werr.Error(), 0
		} else {
			v.Size, v.NewSize = max(v.Size, v.NewSize), 0
		}
		ok, err := s.setStatus(ctx, q, v, status, reason, StatusExtending)
		if err == nil && ok && werr != nil {
			err = s.addMessage(ctx, q, v.ProjectID, "", v.ID, actionExtend, detailExtend)
		}
		servers = servers[:0]
		if ok && werr == nil {
			for _, a := range atts {
				if a.Origin == originCompute && a.Status == AttachAttached {
					servers = append(servers, a.ServerID)
				}
			}
		}
		return err
	})
	if err != nil {
		return err
	}
	if ext := s.extender; ext != nil {
		for _, srv := range servers {
			if err := ext.VolumeExtended(ctx, srv, v.ID, v.Size<<30); err != nil {
				s.log.Warn("volume: telling the server about the new size failed", "volume", v.ID, "server", srv, "error", err)
			}
		}
	}
	return nil
}

// Extender is told when an attached volume grew (os-extend of an in-use
// volume), so that the server's guest sees the new size: compute's
// VolumeExtended, Nova's volume-extended external event.
type Extender interface {
	VolumeExtended(ctx context.Context, serverID, volumeID string, sizeBytes int64) error
}
