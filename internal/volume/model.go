package volume

import (
	"context"
	"encoding/json"
	"math"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"nimbus/internal/api"
	"nimbus/internal/metering"
	"nimbus/internal/store"
)

// Volume statuses served (cinder/objects/fields.py VolumeStatus). in-use,
// attaching and detaching come with attachments.
const (
	StatusCreating       = "creating"
	StatusAvailable      = "available"
	StatusExtending      = "extending"
	StatusDeleting       = "deleting"
	StatusError          = "error"
	StatusErrorDeleting  = "error_deleting"
	StatusErrorExtending = "error_extending"
)

// resettable are the statuses os-reset_status may set
// (cinder/api/contrib/admin_actions.py VolumeAdminController.valid_status).
var resettable = map[string]bool{
	"creating": true, "available": true, "deleting": true, "error": true, "error_deleting": true,
	"error_managing": true, "managing": true, "attaching": true, "in-use": true, "detaching": true,
	"maintenance": true, "reserved": true, "extending": true, "error_extending": true,
	"backing-up": true, "restoring-backup": true, "error_backing-up": true, "error_restoring": true,
	"downloading": true, "uploading": true, "retyping": true, "awaiting-transfer": true,
}

// deletable are the statuses a volume may be deleted in
// (cinder/volume/api.py API.delete expected status).
var deletable = map[string]bool{
	"available": true, "error": true, "error_restoring": true, "error_extending": true, "error_managing": true,
}

// billable reports whether a volume in status takes space that is charged:
// from creation until delete, but not after a failed create.
func billable(status string) bool {
	return status != StatusError && status != StatusDeleting && status != StatusErrorDeleting
}

// volRow is one row of the volumes table, with its type's name.
type volRow struct {
	ID, ProjectID, UserID          string
	Name, Description              *string
	Size, NewSize                  int64
	Status, TypeID, TypeName, Zone string
	Bootable                       bool
	ImageID                        string
	Metadata, ImageMetadata        map[string]string
	Error                          string
	CreatedAt, UpdatedAt           time.Time
	SnapshotID, SourceVolID        string // what it was made from (snapshots.go)
	// SourceImageID is the image its data came from, through any clones
	// and snapshots (service-written: upload.go's licence comes from it).
	SourceImageID string

	// AdminMetadata is kept by the service, never the owner (readonly, retype.go).
	AdminMetadata map[string]string

	// Attachments are loaded for views only (withAttachments).
	Attachments []*attRow
}

const volColumns = `v.id, v.project_id, v.user_id, v.name, v.description, v.size, v.new_size, v.status, v.volume_type_id,
	COALESCE(t.name, ''), v.availability_zone, v.bootable, v.image_id, v.metadata, v.image_metadata, v.error, v.created_at, v.updated_at,
	v.snapshot_id, v.source_volid, v.admin_metadata, v.source_image_id`

const volFrom = ` FROM volumes v LEFT JOIN volume_types t ON t.id = v.volume_type_id`

func scanVol(sc interface{ Scan(...any) error }) (*volRow, error) {
	v := &volRow{}
	var boot int
	var meta, imeta, admeta, created, updated string
	if err := sc.Scan(&v.ID, &v.ProjectID, &v.UserID, &v.Name, &v.Description, &v.Size, &v.NewSize, &v.Status, &v.TypeID,
		&v.TypeName, &v.Zone, &boot, &v.ImageID, &meta, &imeta, &v.Error, &created, &updated,
		&v.SnapshotID, &v.SourceVolID, &admeta, &v.SourceImageID); err != nil {
		return nil, err
	}
	v.Bootable = boot != 0
	v.Metadata, v.ImageMetadata = map[string]string{}, map[string]string{}
	if err := store.FromJSON(meta, &v.Metadata); err != nil {
		return nil, err
	}
	if err := store.FromJSON(imeta, &v.ImageMetadata); err != nil {
		return nil, err
	}
	v.AdminMetadata = map[string]string{}
	if err := store.FromJSON(admeta, &v.AdminMetadata); err != nil {
		return nil, err
	}
	v.CreatedAt, v.UpdatedAt = store.ParseTime(created), store.ParseTime(updated)
	return v, nil
}

func getVol(ctx context.Context, q store.Querier, id string) (*volRow, error) {
	v, err := scanVol(q.QueryRow(ctx, "SELECT "+volColumns+volFrom+" WHERE v.id = ?", id))
	if store.IsNoRows(err) {
		return nil, store.ErrNotFound
	}
	return v, err
}

func loadVols(ctx context.Context, q store.Querier, where string, args ...any) ([]*volRow, error) {
	rows, err := q.Query(ctx, "SELECT "+volColumns+volFrom+" WHERE "+where, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*volRow
	for rows.Next() {
		v, err := scanVol(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

func insertVol(ctx context.Context, q store.Querier, v *volRow) error {
	_, err := q.Exec(ctx, `INSERT INTO volumes (id, project_id, user_id, name, description, size, new_size, status,
		volume_type_id, availability_zone, bootable, image_id, metadata, image_metadata, error, created_at, updated_at,
		snapshot_id, source_volid, source_image_id)
		VALUES (?, ?, ?, ?, ?, ?, 0, ?, ?, ?, ?, ?, ?, ?, '', ?, ?, ?, ?, ?)`,
		v.ID, v.ProjectID, v.UserID, v.Name, v.Description, v.Size, v.Status, v.TypeID, v.Zone, b2i(v.Bootable),
		v.ImageID, store.JSON(v.Metadata), store.JSON(v.ImageMetadata), store.FormatTime(v.CreatedAt), store.FormatTime(v.UpdatedAt),
		v.SnapshotID, v.SourceVolID, v.SourceImageID)
	return err
}

// meter writes the volume's usage period as its status and size say, in
// the transaction that changed them (internal/metering): open from
// creation, a new period when the size changes, closed on delete.
func (s *Service) meter(ctx context.Context, q store.Querier, v *volRow, at time.Time) error {
	// A server's root volume that its flavor pays for is charged for what
	// it grew past the flavor's disk only (servers.go FlavorDiskKey).
	size := v.Size - flavorDiskGB(v)
	if !billable(v.Status) || size <= 0 {
		return metering.Set(ctx, q, metering.KindVolume, v.ID, v.ProjectID, nil, at)
	}
	return metering.Set(ctx, q, metering.KindVolume, v.ID, v.ProjectID, &metering.Spec{SizeGB: size, Name: deref(v.Name)}, at)
}

// setStatus moves a volume to status in q and meters it, when its status
// is still one of from (any when from is empty); it reports whether it did.
func (s *Service) setStatus(ctx context.Context, q store.Querier, v *volRow, status, reason string, from ...string) (bool, error) {
	query := "UPDATE volumes SET status = ?, error = ?, size = ?, new_size = ?, updated_at = ? WHERE id = ?"
	t := s.now()
	args := []any{status, reason, v.Size, v.NewSize, store.FormatTime(t), v.ID}
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
	v.Status, v.Error, v.UpdatedAt = status, reason, t
	return true, s.meter(ctx, q, v, t)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func newID() string { return uuid.NewString() }

// cinderTime is how Cinder shows created_at and updated_at: microseconds
// and no zone (api-ref samples "2018-11-29T06:50:07.770785"; gophercloud
// reads them with RFC3339MilliNoZ).
func cinderTime(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000000") }

// ---- Errors, in Cinder's words (cinder/exception.py) ----

func errVolumeNotFound(id string) *api.Error {
	return api.NotFound("Volume %s could not be found.", id)
}

func invalidInput(format string, args ...any) *api.Error {
	return api.BadRequest("Invalid input received: "+format, args...)
}

func invalidVolume(format string, args ...any) *api.Error {
	return api.BadRequest("Invalid volume: "+format, args...)
}

// ---- Request bodies ----

// body is the inner object of a request body ({"volume": {...}}).
type body map[string]json.RawMessage

// decodeBody reads {"<key>": {...}}; a missing or non-object key is
// Cinder's assert_valid_body 400.
func decodeBody(r *http.Request, key string) (body, error) {
	var outer map[string]json.RawMessage
	if err := api.DecodeJSON(r, &outer); err != nil {
		return nil, err
	}
	return inner(outer, key)
}

func inner(outer map[string]json.RawMessage, key string) (body, error) {
	raw, ok := outer[key]
	if !ok {
		return nil, api.BadRequest("Missing required element '%s' in request body.", key)
	}
	var b body
	if err := json.Unmarshal(raw, &b); err != nil || b == nil {
		return nil, api.BadRequest("Invalid input for field/attribute %s. Value: %s. %s is not of type 'object'", key, raw, raw)
	}
	return b, nil
}

func isNull(raw json.RawMessage) bool { return strings.TrimSpace(string(raw)) == "null" }

// optString reads a string or null attribute of at most max characters
// (0: no limit). It returns nil for null or absent.
func (b body) optString(key string, max int) (*string, error) {
	raw, ok := b[key]
	if !ok || isNull(raw) {
		return nil, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, api.BadRequest("Invalid input for field/attribute %s. Value: %s. %s is not of type 'string', 'null'", key, raw, raw)
	}
	if max > 0 {
		if err := checkLength(key, &s, max); err != nil {
			return nil, err
		}
	}
	return &s, nil
}

// checkLength is Cinder's schema bound on a string field: at most max
// characters. A nil s is not given.
func checkLength(key string, s *string, max int) error {
	if s != nil && len([]rune(*s)) > max {
		return api.BadRequest("Invalid input for field/attribute %s. Value: %s. '%s' is too long", key, *s, *s)
	}
	return nil
}

var digits = regexp.MustCompile(`^[0-9]+$`)

// size reads a volume size: an integer or a string of digits, at least 1
// (cinder/api/validation/parameter_types.py volume_size). ok is false when
// absent or null.
func (b body) size(key string) (int64, bool, error) {
	raw, ok := b[key]
	if !ok || isNull(raw) {
		return 0, false, nil
	}
	s := strings.TrimSpace(string(raw))
	var str string
	if json.Unmarshal(raw, &str) == nil {
		s = str
		if !digits.MatchString(s) {
			return 0, false, api.BadRequest("Invalid input for field/attribute %s. Value: %s. '%s' does not match '^[0-9]+$'", key, s, s)
		}
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f != math.Trunc(f) {
		return 0, false, api.BadRequest("Invalid input for field/attribute %s. Value: %s. %s is not of type 'integer', 'string'", key, s, s)
	}
	if f < 1 {
		return 0, false, api.BadRequest("Invalid input for field/attribute %s. Value: %s. %s is less than the minimum of 1", key, s, s)
	}
	if f > math.MaxInt32 {
		return 0, false, api.BadRequest("Invalid input for field/attribute %s. Value: %s. %s is greater than the maximum of %d", key, s, s, math.MaxInt32)
	}
	return int64(f), true, nil
}

// boolean reads a JSON boolean or one of the strings oslo's strutils
// accepts; ok is false when absent or null.
func (b body) boolean(key string) (bool, bool, error) {
	raw, ok := b[key]
	if !ok || isNull(raw) {
		return false, false, nil
	}
	var v bool
	if json.Unmarshal(raw, &v) == nil {
		return v, true, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		if v, ok := api.ParseBool(s); ok {
			return v, true, nil
		}
	}
	return false, false, api.BadRequest("Invalid input for field/attribute %s. Value: %s. %s is not of type 'boolean'", key, raw, raw)
}

// parseBool is api.ParseBool under the name quotas.go still uses.
var parseBool = api.ParseBool

// maxMetadata bounds a volume's metadata items. Cinder sets no count, so
// this is Nova's and Glance's default (metadata_items, image_property_quota).
const maxMetadata = 128

// errTooMuchMetadata is Cinder's InvalidMetadata (400) for too many items.
func errTooMuchMetadata() *api.Error {
	return api.BadRequest("Invalid metadata: Maximum number of metadata items exceeds %d", maxMetadata)
}

// parseMetadata reads a map of strings: at most maxMetadata items, keys 1
// to 255 characters, values at most 255
// (parameter_types.metadata_allows_null / extra_specs).
func parseMetadata(key string, raw json.RawMessage) (map[string]string, error) {
	out := map[string]string{}
	if isNull(raw) {
		return out, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil || m == nil {
		return nil, api.BadRequest("Invalid input for field/attribute %s. Value: %s. %s is not of type 'object'", key, raw, raw)
	}
	if len(m) > maxMetadata {
		return nil, errTooMuchMetadata()
	}
	for k, v := range m {
		var s string
		if err := json.Unmarshal(v, &s); err != nil {
			return nil, api.BadRequest("Invalid input for field/attribute %s. Value: %s. %s is not of type 'string'", k, v, v)
		}
		if err := checkMetadataItem(key, k, s); err != nil {
			return nil, err
		}
		out[k] = s
	}
	return out, nil
}

// checkMetadata holds metadata given in process to parseMetadata's bounds.
func checkMetadata(key string, m map[string]string) error {
	if len(m) > maxMetadata {
		return errTooMuchMetadata()
	}
	for k, v := range m {
		if err := checkMetadataItem(key, k, v); err != nil {
			return err
		}
	}
	return nil
}

// checkMetadataItem is Cinder's bound on one metadata item: a key of 1 to
// 255 characters, a value of at most 255.
func checkMetadataItem(key, k, v string) error {
	if n := len([]rune(k)); n < 1 || n > 255 {
		return api.BadRequest("Invalid input for field/attribute %s. Metadata property key must be 1 to 255 characters.", key)
	}
	if len([]rune(v)) > 255 {
		return api.BadRequest("Invalid input for field/attribute %s. Metadata property value for %s is greater than 255 characters.", key, k)
	}
	return nil
}

// gib is bytes in started GiB, with no overflow however near MaxInt64.
func gib(bytes int64) int64 { return bytes>>30 + min(bytes&(1<<30-1), 1) }

// fullPage is whether a list page of n items for limit gets a next link:
// Cinder gives one whenever the page is full, even when nothing follows
// (cinder/api/common.py ViewBuilder._get_collection_links), and clients
// page until a page has none.
func fullPage(n, limit int) bool { return n > 0 && n >= limit }
