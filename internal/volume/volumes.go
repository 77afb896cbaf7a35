package volume

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"math"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/image"
	"nimbus/internal/metering"
	"nimbus/internal/store"
)

func caller(r *http.Request) *api.Caller { return api.CallerFrom(r.Context()) }

// links are a volume's self and bookmark links, with the project id when
// the client used one (cinder/api/common.py ViewBuilder._get_links).
func links(r *http.Request, coll, id string) []map[string]string {
	base := api.BaseURL(r)
	p := ""
	if pid := projectInURL(r); pid != "" {
		p = "/" + pid
	}
	return []map[string]string{
		{"rel": "self", "href": base + "/v3" + p + "/" + coll + "/" + id},
		{"rel": "bookmark", "href": base + p + "/" + coll + "/" + id},
	}
}

// extensionAttrs are the attributes Cinder's API extensions add to show
// and list (os-vol-image-meta, the os-vol-* attributes); its create and
// update answer without them.
var extensionAttrs = []string{"volume_image_metadata", "os-vol-tenant-attr:tenant_id", "os-vol-host-attr:host",
	"os-vol-mig-status-attr:migstat", "os-vol-mig-status-attr:name_id"}

// writeView is the view create and update answer with.
func writeView(r *http.Request, v *volRow) map[string]any {
	out := view(r, v)
	for _, k := range extensionAttrs {
		delete(out, k)
	}
	return out
}

// view is a volume's detail view at the request's microversion
// (cinder/api/v2/views/volumes.py detail, v3/views/volumes.py, and the
// os-vol-* extension attributes).
func view(r *http.Request, v *volRow) map[string]any {
	c := caller(r)
	admin := c.IsAdmin()
	typ := any(v.TypeName)
	if v.TypeName == "" {
		typ = v.TypeID
	}
	out := map[string]any{
		"id": v.ID, "status": v.Status, "size": v.Size, "availability_zone": v.Zone,
		"created_at": cinderTime(v.CreatedAt), "updated_at": cinderTime(v.UpdatedAt),
		"name": v.Name, "description": v.Description, "volume_type": typ,
		"snapshot_id": nullID(v.SnapshotID), "source_volid": nullID(v.SourceVolID), "metadata": visibleMetadata(v),
		"links": links(r, "volumes", v.ID), "user_id": v.UserID,
		"bootable": strconv.FormatBool(v.Bootable), "encrypted": false,
		"replication_status": nil, "consistencygroup_id": nil, "multiattach": false,
		"attachments": attachmentsView(v, admin),
	}
	if len(v.ImageMetadata) > 0 {
		out["volume_image_metadata"] = v.ImageMetadata
	}
	// Cinder's policy shows the project to its readers
	// (volume_extension:volume_tenant_attribute, admin or owner: Tempest's
	// transfer test reads it as the new owner), the host and migration
	// attributes to admins only.
	out["os-vol-tenant-attr:tenant_id"] = v.ProjectID
	if admin {
		out["migration_status"] = nil
		out["os-vol-host-attr:host"] = volumeHost
		out["os-vol-mig-status-attr:migstat"] = nil
		out["os-vol-mig-status-attr:name_id"] = nil
	}
	mv := minor(r)
	if mv >= 13 {
		out["group_id"] = nil
	}
	if mv >= 21 && admin {
		out["provider_id"] = nil
	}
	if mv >= 48 {
		out["shared_targets"] = false
		out["service_uuid"] = nil
	}
	return out
}

func summaryView(r *http.Request, v *volRow) map[string]any {
	return map[string]any{"id": v.ID, "name": v.Name, "links": links(r, "volumes", v.ID)}
}

// ownedVol is a volume the caller may see: its project's, or any for an
// admin; anything else is Cinder's 404.
func ownedVol(ctx context.Context, q store.Querier, c *api.Caller, id string) (*volRow, error) {
	v, err := getVol(ctx, q, id)
	if errors.Is(err, store.ErrNotFound) || (err == nil && !c.IsAdmin() && v.ProjectID != c.ProjectID) {
		return nil, errVolumeNotFound(id)
	}
	return v, err
}

func (s *Service) showVolume(r *http.Request) (*api.Response, error) {
	v, err := ownedVol(r.Context(), s.db, caller(r), r.PathValue("id"))
	if err != nil {
		return nil, err
	}
	if err := withAttachments(r.Context(), s.db, v); err != nil {
		return nil, err
	}
	return api.JSON(200, map[string]any{"volume": view(r, v)}), nil
}

// createKeys are the attributes of a create body
// (cinder/api/schemas/volumes.py create, create_volume_v313/v347). From
// 3.53 others are refused.
var createKeys = []string{"name", "description", "display_name", "display_description", "volume_type", "metadata",
	"snapshot_id", "source_volid", "consistencygroup_id", "size", "availability_zone", "multiattach", "image_id",
	"imageRef", "group_id", "backup_id"}

// createVolume is POST /volumes (cinder/api/v3/volumes.py create): 202
// with the new volume in status creating; its data is made after commit.
func (s *Service) createVolume(r *http.Request) (*api.Response, error) {
	spec, err := decodeVolumeSpec(r)
	if err != nil {
		return nil, err
	}
	v, err := s.createVol(r.Context(), caller(r), spec)
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusAccepted, map[string]any{"volume": writeView(r, v)}), nil
}

// VolumeSpec is a volume to create as its caller asks for it; nil fields
// are not given.
type VolumeSpec struct {
	Name, Description *string
	Size              *int64
	Type, Zone        *string
	// At most one source: a snapshot, a volume, an image.
	SnapshotID, SourceVolID, ImageRef *string
	Metadata                          map[string]string
}

// decodeVolumeSpec reads a create body in Cinder's words
// (cinder/api/schemas/volumes.py create, create_volume_v313/v347): from
// 3.53 unknown attributes are refused.
func decodeVolumeSpec(r *http.Request) (VolumeSpec, error) {
	var spec VolumeSpec
	var outer map[string]json.RawMessage
	if err := api.DecodeJSON(r, &outer); err != nil {
		return spec, err
	}
	if err := api.UnknownFields(outer, "volume", "OS-SCH-HNT:scheduler_hints"); err != nil {
		return spec, err
	}
	b, err := inner(outer, "volume")
	if err != nil {
		return spec, err
	}
	if minor(r) >= 53 {
		if err := api.UnknownFields(b, createKeys...); err != nil {
			return spec, err
		}
	}
	for _, k := range [][2]string{{"name", "display_name"}, {"description", "display_description"}} {
		val, err := b.optString(k[0], 255)
		if err != nil {
			return spec, err
		}
		if val == nil {
			if val, err = b.optString(k[1], 255); err != nil {
				return spec, err
			}
		}
		if k[0] == "name" {
			spec.Name = val
		} else {
			spec.Description = val
		}
	}
	for key, what := range map[string]string{"backup_id": "a backup", "consistencygroup_id": "a consistency group", "group_id": "a group"} {
		if raw, ok := b[key]; ok && !isNull(raw) {
			return spec, api.BadRequest("Creating a volume from %s is not supported yet.", what)
		}
	}
	if multi, _, err := b.boolean("multiattach"); err != nil {
		return spec, err
	} else if multi {
		return spec, api.BadRequest("Multiattach volumes are not supported yet.")
	}
	if spec.Zone, err = b.optString("availability_zone", 255); err != nil {
		return spec, err
	}
	if err := checkZone(spec.Zone); err != nil {
		return spec, err
	}
	if raw, ok := b["metadata"]; ok {
		if spec.Metadata, err = parseMetadata("metadata", raw); err != nil {
			return spec, err
		}
	}
	if size, ok, err := b.size("size"); err != nil {
		return spec, err
	} else if ok {
		spec.Size = &size
	}
	if spec.Type, err = b.optString("volume_type", 255); err != nil {
		return spec, err
	}
	if spec.ImageRef, err = b.optString("imageRef", 255); err != nil {
		return spec, err
	}
	if spec.ImageRef == nil {
		if spec.ImageRef, err = b.optString("image_id", 255); err != nil {
			return spec, err
		}
	}
	if spec.SnapshotID, err = b.optString("snapshot_id", 255); err != nil {
		return spec, err
	}
	if spec.SourceVolID, err = b.optString("source_volid", 255); err != nil {
		return spec, err
	}
	return spec, nil
}

// checkZone refuses a zone other than the one volumes live in
// (cinder/exception.py InvalidAvailabilityZone); none, or "", is that one.
func checkZone(az *string) error {
	if az != nil && *az != "" && *az != AvailabilityZone {
		return api.BadRequest("Availability zone '%s' is invalid.", *az)
	}
	return nil
}

// check holds a spec from any caller to the bounds the API's decoding
// holds a request to: an in-process caller gets no more than a client.
func (spec VolumeSpec) check() error {
	for _, f := range []struct {
		name string
		val  *string
	}{{"name", spec.Name}, {"description", spec.Description}, {"volume_type", spec.Type},
		{"snapshot_id", spec.SnapshotID}, {"source_volid", spec.SourceVolID}, {"imageRef", spec.ImageRef}} {
		if err := checkLength(f.name, f.val, 255); err != nil {
			return err
		}
	}
	if n := spec.Size; n != nil && *n < 1 {
		return api.BadRequest("Invalid input for field/attribute size. Value: %d. %d is less than the minimum of 1", *n, *n)
	} else if n != nil && *n > math.MaxInt32 {
		return api.BadRequest("Invalid input for field/attribute size. Value: %d. %d is greater than the maximum of %d", *n, *n, math.MaxInt32)
	}
	if err := checkMetadata("metadata", spec.Metadata); err != nil {
		return err
	}
	return checkZone(spec.Zone)
}

// trimmed is s without leading and trailing space, as Cinder keeps names
// and descriptions; nil stays nil.
func trimmed(s *string) *string {
	if s == nil {
		return nil
	}
	t := strings.TrimSpace(*s)
	return &t
}

// createVol creates the volume spec asks for, for c, with Cinder's rules
// (cinder/volume/api.py API.create): its source, size, type, quota and
// funds. The volume is in status creating; its data is made after commit.
func (s *Service) createVol(ctx context.Context, c *api.Caller, spec VolumeSpec) (*volRow, error) {
	if err := spec.check(); err != nil {
		return nil, err
	}
	v := &volRow{ID: newID(), ProjectID: c.ProjectID, UserID: c.UserID, Status: StatusCreating, Zone: AvailabilityZone,
		Name: trimmed(spec.Name), Description: trimmed(spec.Description), Metadata: map[string]string{}, ImageMetadata: map[string]string{}}
	maps.Copy(v.Metadata, spec.Metadata)
	var size int64
	haveSize := spec.Size != nil
	if haveSize {
		size = *spec.Size
	}
	size, haveSize, typeRef, err := s.volumeSource(ctx, c, spec, v, size, haveSize)
	if err != nil {
		return nil, err
	}
	if imageRef := spec.ImageRef; imageRef != nil && *imageRef != "" {
		img, err := s.volumeImage(ctx, c, *imageRef)
		if err != nil {
			return nil, err
		}
		if !haveSize {
			size = 0
		}
		if size, err = fromImage(v, img, size); err != nil {
			return nil, err
		}
		haveSize = true
	}
	if !haveSize {
		// cinder/volume/flows/api/create_volume.py _extract_size
		return nil, invalidInput("Volume size '%s' must be an integer and greater than 0", "None")
	}
	v.Size = size
	if err := s.checkStart(ctx, v.ProjectID, metering.KindVolume, size); err != nil {
		return nil, err
	}
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		t, err := s.findType(ctx, tx, c, typeRef)
		if err != nil {
			return err
		}
		v.TypeID, v.TypeName = t.ID, t.Name
		if _, err := s.sourceOf(ctx, tx, c, v); err != nil {
			return err // the snapshot or volume changed since
		}
		if err := s.reserve(ctx, tx, v.ProjectID, 1, v.Size, v.Size); err != nil {
			return err
		}
		if err := s.reserveType(ctx, tx, v.ProjectID, t, 1, v.Size); err != nil {
			return err
		}
		now := s.now()
		v.CreatedAt, v.UpdatedAt = now, now
		noBackend := !s.backendFits(t.ExtraSpecs)
		if noBackend {
			// Cinder's scheduler finds no backend for the type: the
			// volume is made in error, with a message saying why.
			v.Status, v.Error = StatusError, "No valid backend was found. No weighed backends available"
		}
		if err := insertVol(ctx, tx, v); err != nil {
			return err
		}
		if err := s.meter(ctx, tx, v, now); err != nil {
			return err
		}
		if noBackend {
			return s.addMessage(ctx, tx, v.ProjectID, api.RequestID(ctx), v.ID, actionSchedule, detailNoBackend)
		}
		tx.AfterCommit(func() { s.kick(v.ID) })
		return nil
	})
	if err != nil {
		return nil, err
	}
	return v, nil
}

// volumeImage checks that an image can become a volume: visible, active,
// in a format qemu-img reads, and qemu-img present.
// fromImage makes v a volume of image img's data: bootable, with img as
// its source image and Cinder's volume_image_metadata. A size of 0 takes
// the image's own; a size the image does not fit is refused
// (cinder/volume/flows/api/create_volume.py _check_image_metadata). It
// answers the size.
func fromImage(v *volRow, img *image.Image, size int64) (int64, error) {
	imgGB := gib(img.VirtualSize)
	if imgGB == 0 {
		imgGB = gib(img.Size)
	}
	if size == 0 {
		size = max(imgGB, int64(img.MinDisk), 1)
	}
	if imgGB > size {
		return 0, invalidInput("Size of specified image %dGB is larger than volume size %dGB.", imgGB, size)
	}
	if int64(img.MinDisk) > size {
		return 0, invalidInput("Volume size %dGB cannot be smaller than the image minDisk size %dGB.", size, img.MinDisk)
	}
	v.ImageID, v.Bootable, v.SourceImageID = img.ID, true, img.ID
	v.ImageMetadata = map[string]string{"image_id": img.ID, "image_name": img.Name, "container_format": img.ContainerFormat,
		"disk_format": img.DiskFormat, "checksum": img.Checksum, "size": strconv.FormatInt(img.Size, 10),
		"min_disk": strconv.Itoa(img.MinDisk), "min_ram": strconv.Itoa(img.MinRAM)}
	return size, nil
}

func (s *Service) volumeImage(ctx context.Context, c *api.Caller, ref string) (*image.Image, error) {
	if s.images == nil {
		return nil, api.BadRequest("Creating a volume from an image is not supported by this cloud.")
	}
	img, err := s.images.Get(ctx, c.ProjectID, c.IsAdmin(), ref)
	if errors.Is(err, store.ErrNotFound) {
		// cinder/api/v2/volumes.py _image_uuid_from_ref
		return nil, api.BadRequest("Invalid image identifier or unable to access requested image.")
	}
	if err != nil {
		return nil, err
	}
	if img.Status != image.StatusActive || !img.HasData() {
		return nil, invalidInput("Image %s is not active.", img.ID)
	}
	if qemuFormat(img.DiskFormat) == "" {
		return nil, invalidInput("Image %s has disk format %s, which cannot be copied to a volume.", img.ID, img.DiskFormat)
	}
	if _, err := s.qemuImgPath(); err != nil {
		return nil, api.BadRequest("Creating a volume from an image needs qemu-img, which this controller does not have.")
	}
	return img, nil
}

func (s *Service) qemuImgPath() (string, error) {
	if s.qemuImg != "" {
		return exec.LookPath(s.qemuImg)
	}
	return exec.LookPath("qemu-img")
}

// updateVolume is PUT /volumes/{id}: name, description and metadata (which
// replaces the whole set), 200 with the volume.
func (s *Service) updateVolume(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	c := caller(r)
	b, err := decodeBody(r, "volume")
	if err != nil {
		return nil, err
	}
	if err := api.UnknownFields(b, "name", "description", "display_name", "display_description", "metadata"); err != nil {
		return nil, err
	}
	if minor(r) >= 53 && len(b) == 0 {
		return nil, api.BadRequest("Invalid input for field/attribute volume. Value: {}. {} is not valid under any of the given schemas")
	}
	type change struct {
		col string
		val *string
	}
	var changes []change
	for _, k := range [][3]string{{"name", "display_name", "name"}, {"description", "display_description", "description"}} {
		for _, key := range k[:2] {
			if _, ok := b[key]; !ok {
				continue
			}
			val, err := b.optString(key, 255)
			if err != nil {
				return nil, err
			}
			if val != nil {
				t := strings.TrimSpace(*val)
				val = &t
			}
			changes = append(changes, change{k[2], val})
			break
		}
	}
	var meta map[string]string
	if raw, ok := b["metadata"]; ok {
		if meta, err = parseMetadata("metadata", raw); err != nil {
			return nil, err
		}
	}
	var v *volRow
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		var err error
		if v, err = ownedVol(ctx, tx, c, r.PathValue("id")); err != nil {
			return err
		}
		for _, ch := range changes {
			if ch.col == "name" {
				v.Name = ch.val
			} else {
				v.Description = ch.val
			}
		}
		if meta != nil {
			v.Metadata = meta
		}
		v.UpdatedAt = s.now()
		_, err = tx.Exec(ctx, "UPDATE volumes SET name = ?, description = ?, metadata = ?, updated_at = ? WHERE id = ?",
			v.Name, v.Description, store.JSON(v.Metadata), store.FormatTime(v.UpdatedAt), v.ID)
		if err != nil {
			return err
		}
		return withAttachments(ctx, tx, v)
	})
	if err != nil {
		return nil, err
	}
	return api.JSON(200, map[string]any{"volume": writeView(r, v)}), nil
}

// deleteVolume is DELETE /volumes/{id}: 202, the volume goes to deleting
// (and stops being charged) at once, and is gone once its file is.
func (s *Service) deleteVolume(r *http.Request) (*api.Response, error) {
	c := caller(r)
	q := r.URL.Query()
	for _, k := range []string{"cascade", "force"} {
		if v := q.Get(k); v != "" {
			if b, ok := api.ParseBool(v); !ok {
				return nil, invalidInput("Invalid value '%s' for %s: must be a boolean.", v, k)
			} else if b && k == "force" && minor(r) >= 23 && !c.IsAdmin() {
				return nil, api.PolicyForbidden("volume_extension:volume_admin_actions:force_delete")
			}
		}
	}
	force := minor(r) >= 23 && q.Get("force") != "" && func() bool { b, _ := api.ParseBool(q.Get("force")); return b }()
	cascade, _ := api.ParseBool(q.Get("cascade"))
	if err := s.deleteVol(r.Context(), c, r.PathValue("id"), cascade, force); err != nil {
		return nil, err
	}
	return api.Empty(http.StatusAccepted), nil
}

// deleteVol deletes volume id for c (cinder/volume/api.py API.delete):
// its snapshots with it when cascade, whatever its status when force (an
// admin's), but never while attached or reserved.
func (s *Service) deleteVol(ctx context.Context, c *api.Caller, id string, cascade, force bool) error {
	return s.db.Tx(ctx, func(tx *store.Tx) error {
		v, err := ownedVol(ctx, tx, c, id)
		if err != nil {
			return err
		}
		if v.Status == StatusDeleting {
			return nil // already on its way (cinder answers 202 again)
		}
		atts, err := attachmentsOf(ctx, tx, v.ID)
		if err != nil {
			return err
		}
		// Not even force deletes an attached or reserved volume
		// (cinder/volume/api.py API.delete: attach_status != attached).
		if len(atts) > 0 || (!deletable[v.Status] && !(force && v.Status != StatusCreating)) {
			// cinder/volume/api.py API.delete
			return invalidVolume("Volume status must be available or error or error_restoring or error_extending or error_managing " +
				"and must not be migrating, attached, belong to a group, have snapshots, awaiting a transfer, or be disassociated from snapshots after volume transfer.")
		}
		return s.beginDelete(ctx, tx, v, cascade)
	})
}

// beginDelete is the one sequence that deletes a volume, in tx, for every
// way there is to ask (DELETE, os-force_delete, delete_on_termination):
// its snapshots go with it (cascade) or keep it (Cinder's 400), an offer
// of it is withdrawn (transfers.go), and it turns deleting, no longer
// charged; its worker removes the data once tx commits.
func (s *Service) beginDelete(ctx context.Context, tx *store.Tx, v *volRow, cascade bool) error {
	if err := s.snapshotsOnVolumeDelete(ctx, tx, v, cascade); err != nil {
		return err
	}
	if _, err := dropTransfers(ctx, tx, v.ID, s.now()); err != nil {
		return err
	}
	if _, err := s.setStatus(ctx, tx, v, StatusDeleting, ""); err != nil {
		return err
	}
	tx.AfterCommit(func() { s.kick(v.ID) })
	return nil
}

// ---- Listing ----

// volumeQuery is a volume list's filters: SQL conditions, and the metadata
// filter, which is checked on the decoded column.
type volumeQuery struct {
	page api.Page
	meta map[string]string
}

func (vq *volumeQuery) matches(v *volRow) bool {
	for k, x := range vq.meta {
		if v.Metadata[k] != x {
			return false
		}
	}
	return true
}

// volumeFilters reads the scope and the filters of
// cinder/api/v3/volumes.py _get_volumes: the caller's project's volumes,
// or with all_tenants every project's (admin; project_id narrows it).
func volumeFilters(r *http.Request) (*volumeQuery, error) {
	c, q, mv := caller(r), r.URL.Query(), minor(r)
	vq := &volumeQuery{}
	if all, _ := api.ParseBool(q.Get("all_tenants")); !all || !c.IsAdmin() {
		vq.page.Add("v.project_id = ?", c.ProjectID)
	} else if p := q.Get("project_id"); p != "" {
		vq.page.Add("v.project_id = ?", p)
	}
	for _, f := range volumeFilterTable {
		val, ok := q[f.param]
		if !ok || mv < f.minMinor {
			continue
		}
		if err := f.add(vq, f.param, val[0]); err != nil {
			return nil, err
		}
	}
	return vq, nil
}

// volumeFilter is one query filter: its parameter, the microversion it
// came in, and how it narrows the query.
type volumeFilter struct {
	param    string
	minMinor int
	add      func(vq *volumeQuery, param, val string) error
}

var volumeFilterTable = []volumeFilter{
	{"name", 0, equal("COALESCE(v.name, '')")},
	{"display_name", 0, equal("COALESCE(v.name, '')")},
	{"name~", 34, nameContains},
	{"status", 0, equal("v.status")},
	{"availability_zone", 0, equal("v.availability_zone")},
	{"bootable", 0, bootable},
	{"volume_type", 0, volumeType},
	{"volume_type_id", 0, volumeType},
	{"metadata", 0, metadataFilter},
	{"created_at", 60, timeFilter("v.created_at")},
	{"updated_at", 60, timeFilter("v.updated_at")},
}

func equal(col string) func(vq *volumeQuery, param, val string) error {
	return func(vq *volumeQuery, _, val string) error {
		vq.page.Add(col+" = ?", val)
		return nil
	}
}

// nameContains is name~ (3.34), a substring match. replace() finds it the
// same way on both engines, where LIKE's case rules differ.
func nameContains(vq *volumeQuery, _, val string) error {
	if val != "" {
		vq.page.Add("COALESCE(v.name, '') <> replace(COALESCE(v.name, ''), ?, '')", val)
	}
	return nil
}

func bootable(vq *volumeQuery, _, val string) error {
	b, ok := api.ParseBool(val)
	if !ok {
		return invalidInput("Invalid value '%s' for bootable: must be a boolean.", val)
	}
	vq.page.Add("v.bootable = ?", b2i(b))
	return nil
}

// volumeType matches a type by id or by name.
func volumeType(vq *volumeQuery, _, val string) error {
	vq.page.Add("(v.volume_type_id = ? OR COALESCE(t.name, '') = ?)", val, val)
	return nil
}

// metadataFilter is metadata={'k': 'v'}, Cinder's Python-dict spelling;
// several filters on one volume's metadata column are checked in Go.
func metadataFilter(vq *volumeQuery, _, val string) error {
	if err := json.Unmarshal([]byte(strings.ReplaceAll(val, "'", `"`)), &vq.meta); err != nil {
		return invalidInput("Invalid filter metadata: %s", val)
	}
	return nil
}

// timeFilter is one created_at/updated_at comparison (3.60):
// "gt:2020-01-01T00:00:00,lte:...", compared as stored: UTC text at
// microseconds.
func timeFilter(col string) func(vq *volumeQuery, param, val string) error {
	return func(vq *volumeQuery, name, spec string) error {
		for _, unit := range strings.Split(spec, ",") {
			op, ts, ok := strings.Cut(unit, ":")
			if !ok {
				return api.BadRequest("Invalid %s value", name)
			}
			at, err := parseFilterTime(ts)
			if err != nil {
				return api.BadRequest("Invalid %s value", ts)
			}
			cond, err := timeCond(col, op, at)
			if err != nil {
				return err
			}
			vq.page.Add(cond, store.FormatTime(at))
		}
		return nil
	}
}

func parseFilterTime(ts string) (at time.Time, err error) {
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05.999999", "2006-01-02T15:04:05", "2006-01-02"} {
		if at, err = time.Parse(layout, ts); err == nil {
			break
		}
	}
	return at, err
}

// timeCond compares col with at. Stored times are whole microseconds, so
// against a time between two of them "after" is after the one before it,
// and no stored time equals it.
func timeCond(col, op string, at time.Time) (string, error) {
	exact := at.Equal(at.Truncate(time.Microsecond))
	switch op {
	case "gt", "gte":
		if op == "gt" || !exact {
			return col + " > ?", nil
		}
		return col + " >= ?", nil
	case "lt", "lte":
		if op == "lte" || !exact {
			return col + " <= ?", nil
		}
		return col + " < ?", nil
	case "eq":
		if !exact {
			return "(" + col + " = ? AND 1 = 0)", nil
		}
		return col + " = ?", nil
	case "neq":
		if !exact {
			return "(" + col + " <> ? OR 1 = 1)", nil
		}
		return col + " <> ?", nil
	}
	return "", api.BadRequest("Invalid %s operator", op)
}

// visible loads every volume a list's filters keep, for the summary.
func (s *Service) visible(r *http.Request) ([]*volRow, error) {
	vq, err := volumeFilters(r)
	if err != nil {
		return nil, err
	}
	vq.page.Keys, vq.page.Limit = api.Keyset{{Col: "v.id"}}, -1
	return s.scanVols(r.Context(), vq, 0, -1)
}

// scanVols reads the page's volumes that match the metadata filter,
// skipping the first skip of them and stopping after n (-1: all).
func (s *Service) scanVols(ctx context.Context, vq *volumeQuery, skip, n int) ([]*volRow, error) {
	rows, err := s.db.Query(ctx, "SELECT "+volColumns+volFrom+" "+vq.page.SQL(), vq.page.Args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*volRow
	for (n < 0 || len(out) < n) && rows.Next() {
		v, err := scanVol(rows)
		if err != nil {
			return nil, err
		}
		if !vq.matches(v) {
			continue
		}
		if skip > 0 {
			skip--
			continue
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// listVolumes is GET /volumes and /volumes/detail with Cinder's paging
// (limit, marker, offset, sort) and volumes_links when the page is full (fullPage). The
// page is read in SQL after the marker's sort values; only the metadata
// filter is applied to the rows read.
func (s *Service) listVolumes(detail bool) api.HandlerFunc {
	return func(r *http.Request) (*api.Response, error) {
		q := r.URL.Query()
		keys, err := sortParams(q, sortColumns, "v.id")
		if err != nil {
			return nil, err
		}
		limit, offset, err := pageSize(q)
		if err != nil {
			return nil, err
		}
		vq, err := volumeFilters(r)
		if err != nil {
			return nil, err
		}
		out := map[string]any{}
		if wantCount(r) {
			if out["count"], err = s.countVols(r.Context(), vq); err != nil {
				return nil, err
			}
		}
		vq.page.Keys = keys
		if err := s.afterMarker(r.Context(), vq, q.Get("marker")); err != nil {
			return nil, err
		}
		vq.page.Limit = -1
		if vq.meta == nil {
			vq.page.Limit = offset + limit
		}
		vols, err := s.scanVols(r.Context(), vq, offset, limit)
		if err != nil {
			return nil, err
		}
		page := vols[:min(limit, len(vols))]
		if detail {
			if err := withAttachments(r.Context(), s.db, page...); err != nil {
				return nil, err
			}
		}
		out["volumes"] = volumeViews(r, page, detail)
		if fullPage(len(page), limit) {
			out["volumes_links"] = nextLink(r, q, listPath("/volumes", detail), limit, page[len(page)-1].ID)
		}
		return api.JSON(200, out), nil
	}
}

// countVols is with_count's total (3.45): every volume the filters keep,
// whatever the page.
func (s *Service) countVols(ctx context.Context, vq *volumeQuery) (int, error) {
	if vq.meta != nil {
		p := *vq
		p.page.Keys, p.page.Limit = api.Keyset{{Col: "v.id"}}, -1
		vols, err := s.scanVols(ctx, &p, 0, -1)
		return len(vols), err
	}
	where := ""
	if len(vq.page.Where) > 0 {
		where = " WHERE " + strings.Join(vq.page.Where, " AND ")
	}
	var n int
	err := s.db.QueryRow(ctx, "SELECT COUNT(*)"+volFrom+where, vq.page.Args...).Scan(&n)
	return n, err
}

// afterMarker narrows the page to the volumes after the marker's sort
// values; the marker must be one the filters keep
// (cinder/exception.py MarkerNotFound, 404).
func (s *Service) afterMarker(ctx context.Context, vq *volumeQuery, marker string) error {
	if marker == "" {
		return nil
	}
	where := strings.Join(append(append([]string{}, vq.page.Where...), "v.id = ?"), " AND ")
	args := append(append([]any{}, vq.page.Args...), marker)
	if vq.meta != nil {
		v, err := scanVol(s.db.QueryRow(ctx, "SELECT "+volColumns+volFrom+" WHERE "+where, args...))
		if store.IsNoRows(err) || (err == nil && !vq.matches(v)) {
			return api.NotFound("Marker %s could not be found.", marker)
		} else if err != nil {
			return err
		}
	}
	vals, err := vq.page.Keys.MarkerValues(ctx, s.db, strings.TrimPrefix(volFrom, " FROM "), where, args...)
	if errors.Is(err, store.ErrNotFound) {
		return api.NotFound("Marker %s could not be found.", marker)
	} else if err != nil {
		return err
	}
	vq.page.AfterMarker(vals)
	return nil
}

func volumeViews(r *http.Request, vols []*volRow, detail bool) []map[string]any {
	items := make([]map[string]any, 0, len(vols))
	for _, v := range vols {
		if detail {
			items = append(items, view(r, v))
		} else {
			items = append(items, summaryView(r, v))
		}
	}
	return items
}

// summary is GET /volumes/summary (3.12; metadata from 3.36).
func (s *Service) summary(r *http.Request) (*api.Response, error) {
	if minor(r) < 12 {
		return nil, api.NotFound("API version 3.%d is not supported on this method.", minor(r))
	}
	vols, err := s.visible(r)
	if err != nil {
		return nil, err
	}
	var size int64
	meta := map[string][]string{}
	for _, v := range vols {
		size += v.Size
		for k, x := range v.Metadata {
			meta[k] = append(meta[k], x)
		}
	}
	out := map[string]any{"total_count": len(vols), "total_size": size}
	if minor(r) >= 36 {
		out["metadata"] = meta
	}
	return api.JSON(200, map[string]any{"volume-summary": out}), nil
}
