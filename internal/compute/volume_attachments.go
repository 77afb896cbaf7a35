package compute

import (
	"context"
	"crypto/sha1"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"

	"github.com/google/uuid"

	"nimbus/internal/api"
	"nimbus/internal/store"
	"nimbus/internal/volume"
)

// Nova's os-volume_attachments (nova/api/openstack/compute/
// volume_attachments.py): block storage volumes given to a server. The
// volume service keeps the attachments (Cinder's, carrying Nova's block
// device mapping fields); the API reserves or begins detaching one in the
// transaction that checks the server and records the instance action, and
// leaves a volumeOp in the server's document. The reconcile worker of the
// server does the work (volume_attachments_work.go), so that it is
// serialised with the server's other steps and resumed after a restart.

// volumeAttachmentRoutes are the os-volume_attachments endpoints.
func (s *Service) volumeAttachmentRoutes() []api.Route {
	return []api.Route{
		{Pattern: "GET /v2.1/servers/{id}/os-volume_attachments", Handler: s.handleVolumeAttachmentList},
		{Pattern: "POST /v2.1/servers/{id}/os-volume_attachments", Handler: s.handleVolumeAttach},
		{Pattern: "GET /v2.1/servers/{id}/os-volume_attachments/{volume}", Handler: s.handleVolumeAttachmentShow},
		{Pattern: "PUT /v2.1/servers/{id}/os-volume_attachments/{volume}", Handler: s.handleVolumeAttachmentUpdate},
		{Pattern: "DELETE /v2.1/servers/{id}/os-volume_attachments/{volume}", Handler: s.handleVolumeDetach},
	}
}

// swapPolicy is Nova's rule for swapping a server's volume: admin only by
// default (Cinder's volume migration calls it).
const swapPolicy = "os_compute_api:os-volumes-attachments:swap"

// bdmUUID is the block device mapping uuid Nova shows from 2.89: Nimbus
// keeps no mappings apart from the attachments, so it is a name-based
// uuid of the attachment's, stable for the attachment's life.
func bdmUUID(attachmentID string) string {
	return uuid.NewHash(sha1.New(), uuid.NameSpaceOID, []byte("nimbus-bdm:"+attachmentID), 5).String()
}

// volumeAttachmentView is _translate_attachment_detail_view.
func volumeAttachmentView(a volume.Attachment, v Version) obj {
	m := obj{}
	if !v.AtLeast(89) {
		m.set("id", a.VolumeID)
	}
	m.set("volumeId", a.VolumeID)
	m.set("serverId", a.ServerID)
	if a.Device != "" {
		m.set("device", a.Device)
	}
	if v.AtLeast(70) {
		m.set("tag", strOrNil(a.Tag))
	}
	if v.AtLeast(79) {
		m.set("delete_on_termination", a.DeleteOnTermination)
	}
	if v.AtLeast(89) {
		m.set("attachment_id", a.ID)
		m.set("bdm_uuid", bdmUUID(a.ID))
	}
	return m
}

// serverAttachments are sv's volume attachments in the order they were made.
func (s *Service) serverAttachments(ctx context.Context, q store.Querier, serverID string) ([]volume.Attachment, error) {
	if s.volumes == nil {
		return nil, nil
	}
	m, err := s.volumes.Attachments(ctx, q, serverID)
	if err != nil {
		return nil, err
	}
	return m[serverID], nil
}

// attachmentOf is sv's attachment of volumeID, if any.
func attachmentOf(atts []volume.Attachment, volumeID string) (volume.Attachment, bool) {
	k := slices.IndexFunc(atts, func(a volume.Attachment) bool { return a.VolumeID == volumeID })
	if k < 0 {
		return volume.Attachment{}, false
	}
	return atts[k], true
}

func notAttached(serverID, volumeID string) error {
	return api.NotFound("Instance %s is not attached to volume %s", serverID, volumeID)
}

func (s *Service) handleVolumeAttachmentList(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	if err := strictQuery(r, "limit", "offset"); err != nil {
		return nil, err
	}
	q := r.URL.Query()
	limit, err := queryNonNegative(q, "limit")
	if err != nil {
		return nil, err
	}
	offset, err := queryNonNegative(q, "offset")
	if err != nil {
		return nil, err
	}
	sv, err := s.visibleServer(ctx, s.db, r.PathValue("id"), false)
	if err != nil {
		return nil, err
	}
	atts, err := s.serverAttachments(ctx, s.db, sv.ID)
	if err != nil {
		return nil, err
	}
	// common.limited: offset first, then at most limit (max 1000).
	if offset > 0 {
		atts = atts[min(offset, len(atts)):]
	}
	if limit <= 0 || limit > resMaxLimit {
		limit = resMaxLimit
	}
	atts = atts[:min(limit, len(atts))]
	v := VersionFrom(ctx)
	out := make([]any, 0, len(atts))
	for _, a := range atts {
		out = append(out, volumeAttachmentView(a, v))
	}
	return api.JSON(http.StatusOK, map[string]any{"volumeAttachments": out}), nil
}

func (s *Service) handleVolumeAttachmentShow(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	sv, err := s.visibleServer(ctx, s.db, r.PathValue("id"), false)
	if err != nil {
		return nil, err
	}
	atts, err := s.serverAttachments(ctx, s.db, sv.ID)
	if err != nil {
		return nil, err
	}
	volumeID := r.PathValue("volume")
	a, ok := attachmentOf(atts, volumeID)
	if !ok {
		return nil, notAttached(sv.ID, volumeID)
	}
	return api.JSON(http.StatusOK, map[string]any{"volumeAttachment": volumeAttachmentView(a, VersionFrom(ctx))}), nil
}

// devicePattern is the schema's device pattern (nova/block_device.py
// match_device).
var devicePattern = regexp.MustCompile(`^/dev/x?[a-z]?d?[a-z]+[0-9]*$`)

const devicePatternText = `(^/dev/x{0,1}[a-z]{0,1}d{0,1})([a-z]+)[0-9]*$`

// volumeAttachBody is a create or update body.
type volumeAttachBody struct {
	VolumeID string
	Device   *string
	Tag      *string
	// DeleteOnTermination is nil when not given.
	DeleteOnTermination *bool
	ID, ServerID        *string // 2.85 update: shown fields, not mutable
}

// parseVolumeAttachBody is Nova's create (create_v249 adds tag,
// create_v279 delete_on_termination) and update (update_v285) schemas.
func parseVolumeAttachBody(r *http.Request, update bool) (volumeAttachBody, error) {
	var out volumeAttachBody
	v := VersionFrom(r.Context())
	var body map[string]json.RawMessage
	if err := api.DecodeJSON(r, &body); err != nil {
		return out, err
	}
	if body == nil {
		return out, api.BadRequest("Invalid input for field/attribute body. Value: null. None is not of type 'object'")
	}
	if err := api.UnknownFields(body, "volumeAttachment"); err != nil {
		return out, err
	}
	raw, ok := body["volumeAttachment"]
	if !ok {
		return out, api.BadRequest("Invalid input for field/attribute volumeAttachment. Value: %s. 'volumeAttachment' is a required property", mustJSON(body))
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil || obj == nil {
		return out, badField("volumeAttachment", raw, fmt.Sprintf("%s is not of type 'object'", raw))
	}
	var allowed []string
	switch {
	case update && v.AtLeast(85):
		allowed = []string{"volumeId", "device", "tag", "delete_on_termination", "serverId", "id"}
	case update:
		allowed = []string{"volumeId"}
	default:
		allowed = []string{"volumeId", "device"}
		if v.AtLeast(49) {
			allowed = append(allowed, "tag")
		}
		if v.AtLeast(79) {
			allowed = append(allowed, "delete_on_termination")
		}
	}
	if err := api.UnknownFields(obj, allowed...); err != nil {
		return out, err
	}
	id, err := strField(obj, "volumeId")
	if err != nil {
		return out, err
	}
	if id == nil {
		return out, badField("volumeAttachment", raw, "'volumeId' is a required property")
	}
	if !uuidRE.MatchString(*id) {
		return out, api.BadRequest("Invalid input for field/attribute volumeId. Value: %s. '%s' is not a 'uuid'", *id, *id)
	}
	out.VolumeID = *id
	if rawDev, ok := obj["device"]; ok && string(rawDev) != "null" {
		dev, err := strField(obj, "device")
		if err != nil {
			return out, badField("device", rawDev, fmt.Sprintf("%s is not of type 'string', 'null'", rawDev))
		}
		if !devicePattern.MatchString(*dev) {
			return out, api.BadRequest("Invalid input for field/attribute device. Value: %s. '%s' does not match '%s'", *dev, *dev, devicePatternText)
		}
		out.Device = dev
	}
	if out.Tag, err = strField(obj, "tag"); err != nil {
		return out, err
	} else if t := out.Tag; t != nil && (*t == "" || len(*t) > 60 || strings.ContainsAny(*t, "/,")) {
		return out, api.BadRequest("Invalid input for field/attribute tag. Value: %s. '%s' does not match '^[^,/]*$'", *t, *t)
	}
	if raw, ok := obj["delete_on_termination"]; ok {
		b, err := rawBool("delete_on_termination", raw)
		if err != nil {
			return out, err
		}
		out.DeleteOnTermination = &b
	}
	for _, f := range []struct {
		name string
		dst  **string
	}{{"id", &out.ID}, {"serverId", &out.ServerID}} {
		p, err := strField(obj, f.name)
		if err != nil {
			return out, err
		}
		if p != nil && !uuidRE.MatchString(*p) {
			return out, api.BadRequest("Invalid input for field/attribute %s. Value: %s. '%s' is not a 'uuid'", f.name, *p, *p)
		}
		*f.dst = p
	}
	return out, nil
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// checkShelvedVersion is _check_request_version: before 2.20 a shelved
// server takes no volume change.
func checkShelvedVersion(ctx context.Context, sv *server, method string) error {
	if (sv.VMState == vmShelved || sv.VMState == vmShelvedOffloaded) && !VersionFrom(ctx).AtLeast(20) {
		return api.Conflict("Cannot '%s' instance %s while it is in vm_state %s", method, sv.ID, sv.VMState)
	}
	return nil
}

// errNoBlockStorage answers a volume call on a cloud without block storage:
// no volume can be found.
func errNoBlockStorage(volumeID string) error {
	return api.NotFound("Volume %s could not be found.", volumeID)
}

// handleVolumeAttach is POST /servers/{id}/os-volume_attachments: 200 with
// the attachment as reserved; the disk is hot-plugged after the answer.
func (s *Service) handleVolumeAttach(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	body, err := parseVolumeAttachBody(r, false)
	if err != nil {
		return nil, err
	}
	c := api.CallerFrom(ctx)
	var att volume.Attachment
	var sv *server
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		if sv, err = s.visibleServer(ctx, tx, r.PathValue("id"), true); err != nil {
			return err
		}
		if err := checkShelvedVersion(ctx, sv, "attach_volume"); err != nil {
			return err
		}
		if err := checkState(sv, "attach_volume", c); err != nil {
			return err
		}
		if s.volumes == nil {
			return errNoBlockStorage(body.VolumeID)
		}
		req := volume.ReserveRequest{ProjectID: c.ProjectID, Admin: c.IsAdmin(), VolumeID: body.VolumeID, ServerID: sv.ID}
		if body.Device != nil {
			if err := s.checkDeviceFree(ctx, tx, sv, *body.Device); err != nil {
				return err
			}
			req.Device = *body.Device
		}
		if body.Tag != nil {
			req.Tag = *body.Tag
		}
		if body.DeleteOnTermination != nil {
			req.DeleteOnTermination = *body.DeleteOnTermination
		}
		if att, err = s.volumes.Reserve(ctx, tx, req); err != nil {
			return err
		}
		if err := s.recordAction(ctx, tx, sv.ID, "attach_volume"); err != nil {
			return err
		}
		return s.addVolumeOp(ctx, tx, sv, volumeOp{Kind: opAttach, AttachmentID: att.ID, VolumeID: att.VolumeID})
	})
	if err != nil {
		return nil, err
	}
	s.enqueue(sv.ID)
	// The create answer always has device (null when none), and neither
	// attachment_id nor bdm_uuid (Nova forgot 2.89 here).
	v := VersionFrom(ctx)
	out := obj{{"id", att.VolumeID}, {"serverId", sv.ID}, {"volumeId", att.VolumeID}, {"device", strOrNil(att.Device)}}
	if v.AtLeast(70) {
		out.set("tag", strOrNil(att.Tag))
	}
	if v.AtLeast(79) {
		out.set("delete_on_termination", att.DeleteOnTermination)
	}
	return api.JSON(http.StatusOK, map[string]any{"volumeAttachment": out}), nil
}

// checkDeviceFree is DevicePathInUse: a device name the server's boot
// disk or another attachment has is a 409.
func (s *Service) checkDeviceFree(ctx context.Context, tx store.Querier, sv *server, device string) error {
	inUse := device == "/dev/vda" || device == "/dev/sda"
	if !inUse {
		atts, err := s.serverAttachments(ctx, tx, sv.ID)
		if err != nil {
			return err
		}
		inUse = slices.ContainsFunc(atts, func(a volume.Attachment) bool { return a.Device == device })
	}
	if inUse {
		return api.Conflict("The supplied device path (%s) is in use.", device)
	}
	return nil
}

// handleVolumeDetach is DELETE /servers/{id}/os-volume_attachments/{volume}:
// 202 once the detach is begun; the disk leaves the VM after the answer.
func (s *Service) handleVolumeDetach(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	c := api.CallerFrom(ctx)
	volumeID := r.PathValue("volume")
	var sv *server
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		var err error
		if sv, err = s.visibleServer(ctx, tx, r.PathValue("id"), true); err != nil {
			return err
		}
		if err := checkShelvedVersion(ctx, sv, "detach_volume"); err != nil {
			return err
		}
		if s.volumes == nil {
			return errNoBlockStorage(volumeID)
		}
		atts, err := s.serverAttachments(ctx, tx, sv.ID)
		if err != nil {
			return err
		}
		att, ok := attachmentOf(atts, volumeID)
		if !ok {
			return notAttached(sv.ID, volumeID)
		}
		// nova/api/openstack/compute/volume_attachments.py delete
		if bd := sv.bootDevice(); bd != nil && bd.VolumeID == volumeID {
			return api.BadRequest("Can't detach root device volume")
		}
		if err := checkState(sv, "detach_volume", c); err != nil {
			return err
		}
		if err := s.volumes.BeginDetach(ctx, tx, att.ID); err != nil {
			return err
		}
		if err := s.recordAction(ctx, tx, sv.ID, "detach_volume"); err != nil {
			return err
		}
		return s.addVolumeOp(ctx, tx, sv, volumeOp{Kind: opDetach, AttachmentID: att.ID, VolumeID: att.VolumeID})
	})
	if err != nil {
		return nil, err
	}
	s.enqueue(sv.ID)
	return api.Empty(http.StatusAccepted), nil
}

// handleVolumeAttachmentUpdate is PUT /servers/{id}/os-volume_attachments/
// {volume}: before 2.85 always a swap to the body's volume (admin only);
// from 2.85 an update of delete_on_termination (the other shown fields
// may be given but not changed), then a swap when volumeId differs.
func (s *Service) handleVolumeAttachmentUpdate(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	body, err := parseVolumeAttachBody(r, true)
	if err != nil {
		return nil, err
	}
	c := api.CallerFrom(ctx)
	oldID := r.PathValue("volume")
	sv, err := s.visibleServer(ctx, s.db, r.PathValue("id"), false)
	if err != nil {
		return nil, err
	}
	onlySwap := !VersionFrom(ctx).AtLeast(85)
	swap := onlySwap || body.VolumeID != oldID
	if swap && !c.IsAdmin() {
		return nil, api.PolicyForbidden(swapPolicy)
	}
	if s.volumes == nil {
		return nil, errNoBlockStorage(oldID)
	}
	if !onlySwap {
		if err := s.updateVolumeAttachment(ctx, sv, oldID, body); err != nil {
			return nil, err
		}
	}
	if swap {
		if err := s.beginSwap(ctx, c, sv.ID, oldID, body.VolumeID); err != nil {
			return nil, err
		}
		s.enqueue(sv.ID)
	}
	return api.Empty(http.StatusAccepted), nil
}

// updateVolumeAttachment is _update_volume_regular.
func (s *Service) updateVolumeAttachment(ctx context.Context, sv *server, volumeID string, body volumeAttachBody) error {
	return s.db.Tx(ctx, func(tx *store.Tx) error {
		atts, err := s.serverAttachments(ctx, tx, sv.ID)
		if err != nil {
			return err
		}
		att, ok := attachmentOf(atts, volumeID)
		if !ok {
			return api.NotFound("No volume Block Device Mapping with id %s.", volumeID)
		}
		switch {
		case body.ID != nil && *body.ID != volumeID:
			return api.BadRequest("The id property is not mutable")
		case body.ServerID != nil && *body.ServerID != sv.ID:
			return api.BadRequest("The serverId property is not mutable")
		case body.Device != nil && *body.Device != att.Device:
			return api.BadRequest("The device property is not mutable")
		case body.Tag != nil && *body.Tag != att.Tag:
			return api.BadRequest("The tag property is not mutable")
		}
		if body.DeleteOnTermination != nil && *body.DeleteOnTermination != att.DeleteOnTermination {
			return s.volumes.SetDeleteOnTermination(ctx, tx, att.ID, *body.DeleteOnTermination)
		}
		return nil
	})
}

// beginSwap is compute/api.py swap_volume: the old volume begins
// detaching, the new one is reserved, and the work swaps them.
func (s *Service) beginSwap(ctx context.Context, c *api.Caller, serverID, oldID, newID string) error {
	return s.db.Tx(ctx, func(tx *store.Tx) error {
		sv, err := s.visibleServer(ctx, tx, serverID, true)
		if err != nil {
			return err
		}
		// An old volume that does not exist is the URI's: 404 (Nova's
		// _update_volume_swap), before any other check.
		oldVol, err := s.volumes.VolumeForServer(ctx, tx, c, oldID)
		if err != nil {
			return err
		}
		if err := checkState(sv, "swap_volume", c); err != nil {
			return err
		}
		atts, err := s.serverAttachments(ctx, tx, sv.ID)
		if err != nil {
			return err
		}
		old, ok := attachmentOf(atts, oldID)
		if !ok {
			return api.BadRequest("Invalid volume: Old volume is attached to a different instance.")
		}
		if old.Status != volume.AttachAttached {
			return api.BadRequest("Invalid volume: Old volume is not attached.")
		}
		if bd := sv.bootDevice(); bd != nil && bd.VolumeID == oldID {
			return api.BadRequest("Invalid volume: Swapping a server's root volume is not supported.")
		}
		// Nova's swap_volume: "New volume must be the same size or
		// larger." A new volume that cannot be found is left to Reserve.
		if neu, err := s.volumes.VolumeForServer(ctx, tx, c, newID); err == nil && neu.SizeGB < oldVol.SizeGB {
			return api.BadRequest("Invalid volume: New volume must be the same size or larger.")
		}
		if err := s.volumes.BeginDetach(ctx, tx, old.ID); err != nil {
			return err
		}
		// The old attachment holds the device name until the swap ends.
		neu, err := s.volumes.Reserve(ctx, tx, volume.ReserveRequest{ProjectID: c.ProjectID, Admin: c.IsAdmin(),
			VolumeID: newID, ServerID: sv.ID, Tag: old.Tag, DeleteOnTermination: old.DeleteOnTermination})
		if err != nil {
			// A new volume named in the body that cannot be found is a
			// 400, not a 404 (the API-WG rule Nova follows here).
			var ae *api.Error
			if errors.As(err, &ae) && ae.Status == http.StatusNotFound {
				return api.BadRequest("%s", ae.Message)
			}
			return err
		}
		if err := s.recordAction(ctx, tx, sv.ID, "swap_volume"); err != nil {
			return err
		}
		return s.addVolumeOp(ctx, tx, sv, volumeOp{Kind: opSwap, AttachmentID: old.ID, VolumeID: old.VolumeID,
			NewAttachmentID: neu.ID, NewVolumeID: neu.VolumeID})
	})
}

// volumesAttached is os-extended-volumes:volumes_attached of every server
// in svs, read in one call.
func (s *Service) volumesAttached(ctx context.Context, svs []*server) (map[string][]volume.Attachment, error) {
	if s.volumes == nil || len(svs) == 0 {
		return nil, nil
	}
	ids := make([]string, 0, len(svs))
	for _, sv := range svs {
		ids = append(ids, sv.ID)
	}
	return s.volumes.Attachments(ctx, s.db, ids...)
}

// volumesAttachedView is one server's os-extended-volumes:volumes_attached.
func volumesAttachedView(atts []volume.Attachment, v Version) []any {
	out := make([]any, 0, len(atts))
	for _, a := range atts {
		o := obj{{"id", a.VolumeID}}
		if v.AtLeast(3) {
			o.set("delete_on_termination", a.DeleteOnTermination)
		}
		out = append(out, o)
	}
	return out
}
