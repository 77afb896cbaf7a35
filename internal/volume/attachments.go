package volume

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/google/uuid"

	"nimbus/internal/api"
	"nimbus/internal/driver"
	"nimbus/internal/store"
)

// Cinder's attachments API (cinder/api/v3/attachments.py, 3.27+) and the
// legacy attach actions (cinder/api/contrib/volume_actions.py) on the
// same rows as compute's attachments.
//
// Who may connect. Cinder lets a volume's owner call
// os-initialize_connection and PUT /attachments with any connector. Here
// a connection is either the storage node's file path or an NBD export
// with a pre-shared key reachable from the hypervisors' network: neither
// is for a customer. Only Nimbus's hypervisors open volumes, and compute
// connects them itself. So a connector is taken from admins only (an
// operator wiring a host by hand); a customer's is refused with 403, as
// Cinder's policy answers when an operator restricts
// volume_extension:volume_actions:initialize_connection. Without a
// connector the owner may still reserve, attach (a record only: the
// server named gets nothing, and nothing is learnt of it), complete and
// delete as Cinder allows.
//
// Attachments compute made are compute's to change: deleting or
// detaching one through this API is Cinder's 409
// ConflictNovaUsingAttachment (OSSA-2023-003), whoever asks.

// attachmentsMinor is the microversion the attachments API came in;
// completeMinor os-complete's, modeMinor the create body's mode.
const (
	attachmentsMinor = 27
	completeMinor    = 44
	modeMinor        = 54
	extendInUseMinor = 42
)

func errAttachmentNotFound(id string) *api.Error {
	return api.NotFound("Volume attachment could not be found with filter: attachment_id = %s.", id)
}

// errComputeOwned is cinder/exception.py ConflictNovaUsingAttachment.
func errComputeOwned(serverID string) *api.Error {
	return api.Conflict("Detach volume from instance %s using the Compute API", serverID)
}

func errNoVersion(r *http.Request) *api.Error {
	return api.NotFound("API version 3.%d is not supported on this method.", minor(r))
}

// ownedAtt is an attachment the caller may see: of a volume of their
// project, or any for an admin; 404 otherwise.
func ownedAtt(ctx context.Context, q store.Querier, c *api.Caller, id string) (*attRow, error) {
	a, err := getAtt(ctx, q, id)
	if errors.Is(err, store.ErrNotFound) || (err == nil && !c.IsAdmin() && a.ProjectID != c.ProjectID) {
		return nil, errAttachmentNotFound(id)
	}
	return a, err
}

func attTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return cinderTime(t)
}

// attachmentView is cinder/api/v3/views/attachments.py: summary, or
// detail with the times, mode and connection_info (given only by the
// call that made the connection: its keys are not kept).
func attachmentView(a *attRow, detail bool, conn map[string]any) map[string]any {
	out := map[string]any{"id": a.ID, "status": a.Status, "instance": nullID(a.ServerID), "volume_id": a.VolumeID}
	if detail {
		out["attached_at"] = attTime(a.AttachedAt)
		out["detached_at"] = attTime(a.DetachedAt)
		out["attach_mode"] = a.Mode
		if conn != nil {
			out["connection_info"] = conn
		} else {
			out["connection_info"] = nil
		}
	}
	return out
}

// connectionInfo is Cinder's connection_info: driver_volume_type and
// data (what a hypervisor needs to open the volume).
func connectionInfo(a *attRow, vol driver.Volume) map[string]any {
	data := map[string]any{}
	raw, _ := json.Marshal(vol.Conn)
	_ = json.Unmarshal(raw, &data)
	delete(data, "driver_volume_type")
	data["volume_id"], data["attachment_id"] = vol.ID, a.ID
	data["access_mode"] = map[bool]string{true: "ro", false: "rw"}[vol.ReadOnly]
	if vol.Throttle != (driver.Throttle{}) {
		data["qos_specs"] = vol.Throttle
	}
	return map[string]any{"driver_volume_type": vol.Conn.Driver, "data": data}
}

// readConnector reads a connector object; a non-admin's is refused (see
// the top of this file). The host is required.
func readConnector(c *api.Caller, raw json.RawMessage, policy string) (map[string]any, string, error) {
	var conn map[string]any
	if err := json.Unmarshal(raw, &conn); err != nil || conn == nil {
		return nil, "", api.BadRequest("Invalid input for field/attribute connector. Value: %s. %s is not of type 'object'", raw, raw)
	}
	if !c.IsAdmin() {
		return nil, "", api.PolicyForbidden(policy)
	}
	host, _ := conn["host"].(string)
	if host == "" {
		return nil, "", invalidInput("Connector doesn't have required information: host")
	}
	return conn, host, nil
}

// ---- /v3/attachments ----

func (s *Service) listAttachments(detail bool) api.HandlerFunc {
	return func(r *http.Request) (*api.Response, error) {
		if minor(r) < attachmentsMinor {
			return nil, errNoVersion(r)
		}
		c := caller(r)
		q := r.URL.Query()
		where, args := "1 = 1", []any{}
		allTenants, _ := api.ParseBool(q.Get("all_tenants"))
		if !c.IsAdmin() || !allTenants {
			where, args = where+" AND project_id = ?", append(args, c.ProjectID)
		}
		if c.IsAdmin() && allTenants && q.Get("project_id") != "" {
			where, args = where+" AND project_id = ?", append(args, q.Get("project_id"))
		}
		for param, col := range map[string]string{"volume_id": "volume_id", "instance_id": "instance_uuid", "status": "attach_status", "attach_status": "attach_status"} {
			if v := q.Get(param); v != "" {
				where, args = where+" AND "+col+" = ?", append(args, v)
			}
		}
		atts, err := loadAtts(r.Context(), s.db, where, args...)
		if err != nil {
			return nil, err
		}
		// Newest first (Cinder's default sort, created_at desc).
		for i, j := 0, len(atts)-1; i < j; i, j = i+1, j-1 {
			atts[i], atts[j] = atts[j], atts[i]
		}
		if m := q.Get("marker"); m != "" {
			i := 0
			for i < len(atts) && atts[i].ID != m {
				i++
			}
			if i == len(atts) {
				return nil, api.NotFound("Marker %s could not be found.", m)
			}
			atts = atts[i+1:]
		}
		if o := q.Get("offset"); o != "" {
			n, err := strconv.Atoi(o)
			if err != nil || n < 0 {
				return nil, invalidInput("offset param must be an integer")
			}
			atts = atts[min(n, len(atts)):]
		}
		if l := q.Get("limit"); l != "" {
			n, err := strconv.Atoi(l)
			if err != nil || n < 0 {
				return nil, invalidInput("limit param must be an integer")
			}
			atts = atts[:min(n, len(atts), maxLimit)]
		}
		items := make([]map[string]any, 0, len(atts))
		for _, a := range atts {
			items = append(items, attachmentView(a, detail, nil))
		}
		return api.JSON(200, map[string]any{"attachments": items}), nil
	}
}

func (s *Service) showAttachment(r *http.Request) (*api.Response, error) {
	if minor(r) < attachmentsMinor {
		return nil, errNoVersion(r)
	}
	a, err := ownedAtt(r.Context(), s.db, caller(r), r.PathValue("id"))
	if err != nil {
		return nil, err
	}
	return api.JSON(200, map[string]any{"attachment": attachmentView(a, true, nil)}), nil
}

func uuidField(b body, key string) (string, error) {
	v, err := b.optString(key, 0)
	if err != nil || v == nil {
		return "", err
	}
	if _, err := uuid.Parse(*v); err != nil {
		return "", api.BadRequest("Invalid input for field/attribute %s. Value: %s. '%s' is not a 'uuid'", key, *v, *v)
	}
	return *v, nil
}

// createAttachment is POST /attachments: a reserved attachment of an
// available volume to instance_uuid (a record: see the top of the file),
// connected at once when an admin gives a connector. 200 with its detail.
func (s *Service) createAttachment(r *http.Request) (*api.Response, error) {
	if minor(r) < attachmentsMinor {
		return nil, errNoVersion(r)
	}
	ctx := r.Context()
	c := caller(r)
	b, err := decodeBody(r, "attachment")
	if err != nil {
		return nil, err
	}
	keys := []string{"instance_uuid", "volume_uuid", "connector"}
	if minor(r) >= modeMinor {
		keys = append(keys, "mode")
	}
	if err := api.UnknownFields(b, keys...); err != nil {
		return nil, err
	}
	volID, err := uuidField(b, "volume_uuid")
	if err != nil {
		return nil, err
	}
	if volID == "" {
		return nil, api.BadRequest("Invalid input for field/attribute attachment. 'volume_uuid' is a required property")
	}
	serverID, err := uuidField(b, "instance_uuid")
	if err != nil {
		return nil, err
	}
	mode := ""
	if m, err := b.optString("mode", 0); err != nil {
		return nil, err
	} else if m != nil {
		if *m != "rw" && *m != "ro" {
			return nil, api.BadRequest("Invalid input for field/attribute mode. Value: %s. '%s' is not one of ['rw', 'ro']", *m, *m)
		}
		mode = *m
	}
	var connector map[string]any
	host := ""
	if raw, ok := b["connector"]; ok && !isNull(raw) {
		if connector, host, err = readConnector(c, raw, "volume:attachment_create"); err != nil {
			return nil, err
		}
		if m, _ := connector["mode"].(string); mode == "" && (m == "rw" || m == "ro") {
			mode = m
		}
	}
	var a *attRow
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		v, err := ownedVol(ctx, tx, c, volID)
		if err != nil {
			return err
		}
		if mode, err = attachMode(v, mode); err != nil {
			return err
		}
		if ok, err := s.setStatus(ctx, tx, v, StatusReserved, "", StatusAvailable); err != nil {
			return err
		} else if !ok {
			return invalidVolume("Volume %s status must be available or downloading", v.ID)
		}
		now := s.now()
		if connector == nil {
			connector = map[string]any{}
		}
		a = &attRow{Attachment: Attachment{ID: newID(), VolumeID: v.ID, ServerID: serverID, Status: AttachReserved, Mode: mode, CreatedAt: now},
			ProjectID: v.ProjectID, Origin: originAPI, Connector: connector, UpdatedAt: now}
		return insertAtt(ctx, tx, a)
	})
	if err != nil {
		return nil, err
	}
	var info map[string]any
	if host != "" {
		vol, err := s.connect(ctx, a, host)
		if err != nil {
			// The reservation goes with the failed connection.
			if rerr := s.db.Tx(ctx, func(tx *store.Tx) error { return s.remove(ctx, tx, a) }); rerr != nil {
				s.log.Error("volume: removing a failed attachment", "attachment", a.ID, "error", rerr)
			}
			return nil, err
		}
		info = connectionInfo(a, vol)
	}
	return api.JSON(200, map[string]any{"attachment": attachmentView(a, true, info)}), nil
}

// apiAtt is an attachment the API may change: the caller's, and not
// compute's.
func apiAtt(ctx context.Context, q store.Querier, c *api.Caller, id string) (*attRow, error) {
	a, err := ownedAtt(ctx, q, c, id)
	if err != nil {
		return nil, err
	}
	if a.Origin == originCompute {
		return nil, errComputeOwned(a.ServerID)
	}
	return a, nil
}

// updateAttachment is PUT /attachments/{id} {"connector": …}: the
// connection for the connector's host, admins only. 200 with the detail
// and connection_info.
func (s *Service) updateAttachment(r *http.Request) (*api.Response, error) {
	if minor(r) < attachmentsMinor {
		return nil, errNoVersion(r)
	}
	ctx := r.Context()
	c := caller(r)
	b, err := decodeBody(r, "attachment")
	if err != nil {
		return nil, err
	}
	if err := api.UnknownFields(b, "connector"); err != nil {
		return nil, err
	}
	a, err := apiAtt(ctx, s.db, c, r.PathValue("id"))
	if err != nil {
		return nil, err
	}
	raw, ok := b["connector"]
	if !ok || isNull(raw) {
		return nil, api.BadRequest("Must specify 'connector' to update attachment.")
	}
	connector, host, err := readConnector(c, raw, "volume:attachment_update")
	if err != nil {
		return nil, err
	}
	if _, err := s.db.Exec(ctx, "UPDATE volume_attachments SET connector = ? WHERE id = ?", store.JSON(connector), a.ID); err != nil {
		return nil, err
	}
	vol, err := s.connect(ctx, a, host)
	if err != nil {
		return nil, err
	}
	return api.JSON(200, map[string]any{"attachment": attachmentView(a, true, connectionInfo(a, vol))}), nil
}

// attachmentAction is POST /attachments/{id}/action {"os-complete": …}
// (3.44): the attachment attached and its volume in-use. 204.
func (s *Service) attachmentAction(r *http.Request) (*api.Response, error) {
	if minor(r) < completeMinor {
		return nil, errNoVersion(r)
	}
	ctx := r.Context()
	var outer map[string]json.RawMessage
	if err := api.DecodeJSON(r, &outer); err != nil {
		return nil, err
	}
	if _, ok := outer["os-complete"]; !ok || len(outer) != 1 {
		return nil, api.BadRequest("There is no such action: %s", firstKey(outer))
	}
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		a, err := apiAtt(ctx, tx, caller(r), r.PathValue("id"))
		if err != nil {
			return err
		}
		return s.complete(ctx, tx, a)
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(http.StatusNoContent), nil
}

func firstKey(m map[string]json.RawMessage) string {
	for k := range m {
		return k
	}
	return ""
}

// deleteAttachment is DELETE /attachments/{id}: its connection ends and
// the volume is available again when nothing else holds it. 200 with the
// attachments left sharing its connection (none: no multiattach).
func (s *Service) deleteAttachment(r *http.Request) (*api.Response, error) {
	if minor(r) < attachmentsMinor {
		return nil, errNoVersion(r)
	}
	ctx := r.Context()
	c := caller(r)
	a, err := apiAtt(ctx, s.db, c, r.PathValue("id"))
	if err != nil {
		return nil, err
	}
	if err := s.disconnect(ctx, a); err != nil {
		return nil, err
	}
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		a, err := apiAtt(ctx, tx, c, a.ID)
		if err != nil {
			return err
		}
		return s.remove(ctx, tx, a)
	})
	if err != nil {
		return nil, err
	}
	return api.JSON(200, map[string]any{"attachments": []any{}}), nil
}

// ---- Legacy actions (POST /volumes/{id}/action) ----

// legacyAction runs f in one transaction on the path's volume, which the
// caller must own, with its attachments: the shape of the legacy actions
// that only move states. 202.
func (s *Service) legacyAction(r *http.Request, f func(ctx context.Context, tx *store.Tx, v *volRow, atts []*attRow) error) (*api.Response, error) {
	ctx := r.Context()
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		v, err := ownedVol(ctx, tx, caller(r), r.PathValue("id"))
		if err != nil {
			return err
		}
		atts, err := attachmentsOf(ctx, tx, v.ID)
		if err != nil {
			return err
		}
		return f(ctx, tx, v, atts)
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(http.StatusAccepted), nil
}

// reserveVolume is os-reserve: an available volume becomes attaching,
// with no attachment yet (cinder/volume/api.py reserve_volume). 202.
func (s *Service) reserveVolume(r *http.Request) (*api.Response, error) {
	return s.legacyAction(r, func(ctx context.Context, tx *store.Tx, v *volRow, _ []*attRow) error {
		if ok, err := s.setStatus(ctx, tx, v, StatusAttaching, "", StatusAvailable); err != nil {
			return err
		} else if !ok {
			return invalidVolume("Volume status must be available to reserve, but the status is %s.", v.Status)
		}
		return nil
	})
}

// unreserveVolume is os-unreserve: an os-reserve undone; a volume not
// reserved so, or one an attachment holds, is left as it is. 202.
func (s *Service) unreserveVolume(r *http.Request) (*api.Response, error) {
	return s.legacyAction(r, func(ctx context.Context, tx *store.Tx, v *volRow, atts []*attRow) error {
		if len(atts) > 0 {
			return nil
		}
		_, err := s.setStatus(ctx, tx, v, StatusAvailable, "", StatusAttaching)
		return err
	})
}

// legacyAtt is the volume's one attachment the legacy actions act on:
// attachment_id's when given, else the only one. Compute's are refused.
func legacyAtt(atts []*attRow, id string) (*attRow, error) {
	var pick *attRow
	for _, a := range atts {
		if id != "" && a.ID == id {
			pick = a
		}
	}
	if id != "" && pick == nil {
		return nil, errAttachmentNotFound(id)
	}
	if id == "" {
		if len(atts) > 1 {
			return nil, invalidVolume("Detach volume failed: More than one attachment, but no attachment_id provided.")
		}
		if len(atts) == 0 {
			return nil, nil
		}
		pick = atts[0]
	}
	if pick.Origin == originCompute {
		return nil, errComputeOwned(pick.ServerID)
	}
	return pick, nil
}

// beginDetaching is os-begin_detaching: an in-use volume (and its
// attachment) becomes detaching. 202.
func (s *Service) beginDetaching(r *http.Request) (*api.Response, error) {
	return s.legacyAction(r, func(ctx context.Context, tx *store.Tx, _ *volRow, atts []*attRow) error {
		a, err := legacyAtt(atts, "")
		if err != nil {
			return err
		}
		if a == nil {
			return errNotDetachable()
		}
		return s.beginDetach(ctx, tx, a)
	})
}

// rollDetaching is os-roll_detaching: a detaching volume back to in-use;
// nothing for one not detaching. 202.
func (s *Service) rollDetaching(r *http.Request) (*api.Response, error) {
	return s.legacyAction(r, func(ctx context.Context, tx *store.Tx, _ *volRow, atts []*attRow) error {
		a, err := legacyAtt(atts, "")
		if err != nil || a == nil {
			return err
		}
		return s.rollDetach(ctx, tx, a)
	})
}

// attachVolume is os-attach {"instance_uuid" or "host_name",
// "mountpoint", "mode"}: the volume in-use with an attached record (no
// connection; the server named gets nothing). 202.
func (s *Service) attachVolume(r *http.Request, raw json.RawMessage) (*api.Response, error) {
	ctx := r.Context()
	b, err := actionBody("os-attach", raw)
	if err != nil {
		return nil, err
	}
	if err := api.UnknownFields(b, "instance_uuid", "mountpoint", "mode", "host_name"); err != nil {
		return nil, err
	}
	serverID, err := uuidField(b, "instance_uuid")
	if err != nil {
		return nil, err
	}
	hostName, err := b.optString("host_name", 255)
	if err != nil {
		return nil, err
	}
	mount, err := b.optString("mountpoint", 255)
	if err != nil {
		return nil, err
	}
	if mount == nil {
		return nil, api.BadRequest("Invalid input for field/attribute os-attach. 'mountpoint' is a required property")
	}
	if serverID == "" && (hostName == nil || *hostName == "") {
		return nil, api.BadRequest("Invalid request to attach volume to an invalid target")
	}
	mode, err := b.optString("mode", 0)
	if err != nil {
		return nil, err
	}
	want := "rw"
	if mode != nil {
		if *mode != "rw" && *mode != "ro" {
			return nil, api.BadRequest("Invalid request to attach volume with an invalid mode. Attaching mode should be 'rw' or 'ro'")
		}
		want = *mode
	}
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		v, err := ownedVol(ctx, tx, caller(r), r.PathValue("id"))
		if err != nil {
			return err
		}
		m, err := attachMode(v, want)
		if err != nil {
			return err
		}
		// After os-reserve (attaching) or at once from available; after
		// os-initialize_connection its attachment is the one attached.
		atts, err := attachmentsOf(ctx, tx, v.ID)
		if err != nil {
			return err
		}
		if len(atts) == 1 && atts[0].Origin == originAPI && atts[0].Status == AttachAttaching && atts[0].ServerID == "" {
			a := atts[0]
			a.ServerID, a.Device, a.HostName = serverID, *mount, deref(hostName)
			if _, err := tx.Exec(ctx, "UPDATE volume_attachments SET instance_uuid = ?, mountpoint = ?, host_name = ? WHERE id = ?",
				a.ServerID, a.Device, a.HostName, a.ID); err != nil {
				return err
			}
			return s.complete(ctx, tx, a)
		}
		if len(atts) > 0 || (v.Status != StatusAvailable && v.Status != StatusAttaching) {
			return invalidVolume("Volume %s status must be available or attaching to attach, but the current status is: %s.", v.ID, v.Status)
		}
		now := s.now()
		a := &attRow{Attachment: Attachment{ID: newID(), VolumeID: v.ID, ServerID: serverID, Status: AttachAttaching, Mode: m,
			Device: *mount, CreatedAt: now}, ProjectID: v.ProjectID, Origin: originAPI, Connector: map[string]any{}, UpdatedAt: now}
		if hostName != nil {
			a.HostName = *hostName
		}
		if err := insertAtt(ctx, tx, a); err != nil {
			return err
		}
		return s.complete(ctx, tx, a)
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(http.StatusAccepted), nil
}

// detachVolume is os-detach {"attachment_id"}: the record removed, its
// connection ended, the volume available. 202.
func (s *Service) detachVolume(r *http.Request, raw json.RawMessage) (*api.Response, error) {
	ctx := r.Context()
	c := caller(r)
	b, err := actionBody("os-detach", raw)
	if err != nil {
		return nil, err
	}
	if err := api.UnknownFields(b, "attachment_id"); err != nil {
		return nil, err
	}
	id, err := b.optString("attachment_id", 255)
	if err != nil {
		return nil, err
	}
	pick := func(q store.Querier) (*attRow, error) {
		v, err := ownedVol(ctx, q, c, r.PathValue("id"))
		if err != nil {
			return nil, err
		}
		atts, err := attachmentsOf(ctx, q, v.ID)
		if err != nil {
			return nil, err
		}
		return legacyAtt(atts, deref(id))
	}
	a, err := pick(s.db)
	if err != nil || a == nil {
		if err != nil {
			return nil, err
		}
		return api.Empty(http.StatusAccepted), nil
	}
	if err := s.disconnect(ctx, a); err != nil {
		return nil, err
	}
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		a, err := pick(tx)
		if err != nil || a == nil {
			return err
		}
		return s.remove(ctx, tx, a)
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(http.StatusAccepted), nil
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// connectorBody reads {"connector": {...}} of os-initialize_connection
// and os-terminate_connection.
func connectorBody(c *api.Caller, name string, raw json.RawMessage) (map[string]any, string, error) {
	b, err := actionBody(name, raw)
	if err != nil {
		return nil, "", err
	}
	craw, ok := b["connector"]
	if !ok || isNull(craw) {
		return nil, "", api.BadRequest("Must specify 'connector'")
	}
	policy := "volume_extension:volume_actions:" + name[len("os-"):]
	return readConnector(c, craw, policy)
}

// initializeConnection is os-initialize_connection {"connector"}, admins
// only (see the top of the file): the connection for the connector's
// host, on the volume's API attachment (made, attaching, if it has none).
// 200 {"connection_info"}.
func (s *Service) initializeConnection(r *http.Request, raw json.RawMessage) (*api.Response, error) {
	ctx := r.Context()
	c := caller(r)
	// The volume first: 404 before any 403 about the connector.
	v, err := ownedVol(ctx, s.db, c, r.PathValue("id"))
	if err != nil {
		return nil, err
	}
	connector, host, err := connectorBody(c, "os-initialize_connection", raw)
	if err != nil {
		return nil, err
	}
	var a *attRow
	made := false
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		atts, err := attachmentsOf(ctx, tx, v.ID)
		if err != nil {
			return err
		}
		if a, err = legacyAtt(atts, ""); err != nil || a != nil {
			return err
		}
		v, err := getVol(ctx, tx, v.ID)
		if err != nil {
			return err
		}
		if v.Status != StatusAvailable && v.Status != StatusAttaching {
			return invalidVolume("Volume %s status must be available or attaching to connect, but the current status is: %s.", v.ID, v.Status)
		}
		mode, _ := attachMode(v, "")
		now := s.now()
		a = &attRow{Attachment: Attachment{ID: newID(), VolumeID: v.ID, Status: AttachAttaching, Mode: mode, CreatedAt: now},
			ProjectID: v.ProjectID, Origin: originAPI, Connector: connector, UpdatedAt: now}
		made = true
		return insertAtt(ctx, tx, a)
	})
	if err != nil {
		return nil, err
	}
	vol, err := s.connect(ctx, a, host)
	if err != nil {
		if made {
			if rerr := s.db.Tx(ctx, func(tx *store.Tx) error { return s.remove(ctx, tx, a) }); rerr != nil {
				s.log.Error("volume: removing a failed connection's attachment", "attachment", a.ID, "error", rerr)
			}
		}
		return nil, err
	}
	return api.JSON(200, map[string]any{"connection_info": connectionInfo(a, vol)}), nil
}

// terminateConnection is os-terminate_connection {"connector"}, admins
// only: the connection made for the connector's host ends; an attachment
// made only for it (never attached) goes with it. 202.
func (s *Service) terminateConnection(r *http.Request, raw json.RawMessage) (*api.Response, error) {
	ctx := r.Context()
	c := caller(r)
	v, err := ownedVol(ctx, s.db, c, r.PathValue("id"))
	if err != nil {
		return nil, err
	}
	_, host, err := connectorBody(c, "os-terminate_connection", raw)
	if err != nil {
		return nil, err
	}
	atts, err := attachmentsOf(ctx, s.db, v.ID)
	if err != nil {
		return nil, err
	}
	a, err := legacyAtt(atts, "")
	if err != nil || a == nil || a.Host != host {
		if err != nil {
			return nil, err
		}
		return api.Empty(http.StatusAccepted), nil
	}
	if err := s.disconnect(ctx, a); err != nil {
		return nil, err
	}
	if a.Status == AttachAttaching && a.ServerID == "" {
		err = s.db.Tx(ctx, func(tx *store.Tx) error {
			cur, err := getAtt(ctx, tx, a.ID)
			if errors.Is(err, store.ErrNotFound) {
				return nil
			}
			if err != nil || cur.Status != AttachAttaching {
				return err
			}
			return s.remove(ctx, tx, cur)
		})
		if err != nil {
			return nil, err
		}
	}
	return api.Empty(http.StatusAccepted), nil
}

// forceDetach is the admin's os-force_detach {"attachment_id",
// "connector"} (cinder/api/contrib/admin_actions.py): the attachment
// removed whatever the volume's status (an admin resets a stuck one to
// error first), the volume available when nothing else holds it. 202.
func (s *Service) forceDetach(r *http.Request, raw json.RawMessage) (*api.Response, error) {
	ctx := r.Context()
	c := caller(r)
	if !c.IsAdmin() {
		return nil, api.PolicyForbidden("volume_extension:volume_admin_actions:force_detach")
	}
	b, err := actionBody("os-force_detach", raw)
	if err != nil {
		return nil, err
	}
	if err := api.UnknownFields(b, "attachment_id", "connector"); err != nil {
		return nil, err
	}
	id, err := b.optString("attachment_id", 255)
	if err != nil {
		return nil, err
	}
	pick := func(q store.Querier) (*attRow, *volRow, error) {
		v, err := ownedVol(ctx, q, c, r.PathValue("id"))
		if err != nil {
			return nil, nil, err
		}
		atts, err := attachmentsOf(ctx, q, v.ID)
		if err != nil {
			return nil, nil, err
		}
		a, err := legacyAtt(atts, deref(id))
		return a, v, err
	}
	a, _, err := pick(s.db)
	if err != nil {
		return nil, err
	}
	if a != nil {
		if err := s.disconnect(ctx, a); err != nil {
			return nil, err
		}
	}
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		a, v, err := pick(tx)
		if err != nil {
			return err
		}
		if a == nil {
			return nil
		}
		if err := s.remove(ctx, tx, a); err != nil {
			return err
		}
		var n int
		if err := tx.QueryRow(ctx, "SELECT COUNT(*) FROM volume_attachments WHERE volume_id = ?", v.ID).Scan(&n); err != nil || n > 0 {
			return err
		}
		if v, err = getVol(ctx, tx, v.ID); err != nil {
			return err
		}
		if v.Status == StatusDeleting || v.Status == StatusAvailable {
			return nil
		}
		if _, err := s.setStatus(ctx, tx, v, StatusAvailable, ""); err != nil {
			return err
		}
		return s.setAttachedMode(ctx, tx, v, "")
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(http.StatusAccepted), nil
}

// ---- The volume view's attachments ----

// withAttachments loads the volumes' attachments for their views.
func withAttachments(ctx context.Context, q store.Querier, vols ...*volRow) error {
	if len(vols) == 0 {
		return nil
	}
	ids := make([]string, len(vols))
	byID := map[string]*volRow{}
	for i, v := range vols {
		ids[i], byID[v.ID] = v.ID, v
		v.Attachments = nil
	}
	in, args := api.InList(ids)
	atts, err := loadAtts(ctx, q, "volume_id "+in, args...)
	if err != nil {
		return err
	}
	for _, a := range atts {
		byID[a.VolumeID].Attachments = append(byID[a.VolumeID].Attachments, a)
	}
	return nil
}

// attachmentsView is the volume view's attachments: the attached ones
// (cinder/api/v2/views/volumes.py _get_attachments), the host to admins
// only.
func attachmentsView(v *volRow, admin bool) []any {
	out := []any{}
	for _, a := range v.Attachments {
		if a.Status != AttachAttached {
			continue
		}
		var host any
		if admin {
			host = nullID(a.Host)
			if a.Host == "" {
				host = nullID(a.HostName)
			}
		}
		out = append(out, map[string]any{"id": v.ID, "attachment_id": a.ID, "volume_id": v.ID, "server_id": nullID(a.ServerID),
			"host_name": host, "device": a.Device, "attached_at": attTime(a.AttachedAt)})
	}
	return out
}
