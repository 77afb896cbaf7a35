package image

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// Formats Glance accepts by default (glance/common/config.py image_format).
var (
	diskFormats      = []string{"ami", "ari", "aki", "vhd", "vhdx", "vmdk", "raw", "qcow2", "vdi", "iso", "ploop"}
	containerFormats = []string{"ami", "ari", "aki", "bare", "ovf", "ova", "docker", "compressed"}
	visibilities     = []string{Community, Public, Private, Shared}
	badEscape        = regexp.MustCompile(`~[^01]`)
	uuidPattern      = regexp.MustCompile(`^([0-9a-fA-F]){8}-([0-9a-fA-F]){4}-([0-9a-fA-F]){4}-([0-9a-fA-F]){4}-([0-9a-fA-F]){12}$`)
)

// Attribute classes of glance/api/v2/images.py RequestDeserializer and
// glance/domain ImageFactory.
var (
	disallowedAttrs = []string{"direct_url", "self", "file", "schema", "stores"}
	readonlyAttrs   = []string{"created_at", "updated_at", "status", "checksum", "size", "virtual_size",
		"direct_url", "self", "file", "schema", "id", "os_hash_algo", "os_hash_value", "stores"}
	reservedAttrs = []string{"location", "deleted", "deleted_at"}
	baseAttrs     = []string{"checksum", "created_at", "container_format", "disk_format", "id", "min_disk",
		"min_ram", "name", "size", "virtual_size", "status", "tags", "owner", "updated_at", "visibility",
		"protected", "os_hidden", "os_hash_algo", "os_hash_value", "locations"}
)

const (
	maxTags       = 128 // glance image_tag_quota
	maxProperties = 128 // glance image_property_quota
	maxMembers    = 128 // glance image_member_quota
	// maxPatchOps bounds one PATCH: Glance sets no count, and enough
	// operations to set every tag and property is plenty.
	maxPatchOps  = 256
	defaultLimit = 25 // glance limit_param_default
	maxLimit     = 1000
)

func reserved(key string) bool {
	return slices.Contains(reservedAttrs, key) || strings.HasPrefix(key, "os_glance") || key == shelvedProperty
}

// --- discovery (glance/api/versions.py) ---

const (
	http200 = http.StatusOK
	http300 = http.StatusMultipleChoices
)

// versionIDs are the versions a Glance of the captured release lists
// (wire/54-glance-get-root-versions.txt): v2.14 is only listed when the
// cache API is enabled.
var versionIDs = []string{"v2.15", "v2.13", "v2.12", "v2.11", "v2.10", "v2.9", "v2.8", "v2.7", "v2.6",
	"v2.5", "v2.4", "v2.3", "v2.2", "v2.1", "v2.0"}

func (s *Service) versions(status int) api.HandlerFunc {
	return func(r *http.Request) (*api.Response, error) {
		href := api.BaseURL(r) + "/v2/"
		vs := make([]map[string]any, 0, len(versionIDs))
		for i, id := range versionIDs {
			st := "SUPPORTED"
			if i == 0 {
				st = "CURRENT"
			}
			vs = append(vs, map[string]any{"id": id, "status": st,
				"links": []map[string]string{{"rel": "self", "href": href}}})
		}
		return api.JSON(status, map[string]any{"versions": vs}), nil
	}
}

func importInfo(r *http.Request) (*api.Response, error) {
	// No interoperable import methods: data is uploaded with PUT /file.
	return api.JSON(http.StatusOK, map[string]any{"import-methods": map[string]any{
		"description": "Import methods available.", "type": "array", "value": []string{}}}), nil
}

// --- rendering (glance/api/v2/images.py ResponseSerializer._format_image) ---

func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

func isoTime(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05Z") }

func view(img *Image) map[string]any {
	m := make(map[string]any, len(img.Properties)+22)
	for k, v := range img.Properties {
		m[k] = v
	}
	var size, vsize any
	if img.HasData() {
		size = img.Size
	}
	if img.VirtualSize > 0 {
		vsize = img.VirtualSize
	}
	tags := img.Tags
	if tags == nil {
		tags = []string{}
	}
	m["id"] = img.ID
	m["name"] = nullable(img.Name)
	m["status"] = img.Status
	m["visibility"] = img.Visibility
	m["protected"] = img.Protected
	m["os_hidden"] = img.OSHidden
	m["owner"] = nullable(img.Owner)
	m["disk_format"] = nullable(img.DiskFormat)
	m["container_format"] = nullable(img.ContainerFormat)
	m["size"] = size
	m["virtual_size"] = vsize
	m["checksum"] = nullable(img.Checksum)
	m["os_hash_algo"] = nullable(img.OSHashAlgo)
	m["os_hash_value"] = nullable(img.OSHashValue)
	m["min_disk"] = img.MinDisk
	m["min_ram"] = img.MinRAM
	m["tags"] = tags
	m["created_at"] = isoTime(img.CreatedAt)
	m["updated_at"] = isoTime(img.UpdatedAt)
	m["self"] = "/v2/images/" + img.ID
	m["file"] = "/v2/images/" + img.ID + "/file"
	m["schema"] = "/v2/schemas/image"
	return m
}

// --- request bodies ---

// readJSON reads a JSON body as Glance's JSONRequestDeserializer does.
func readJSON(r *http.Request) (any, error) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, api.OverLimit("Request is too large.")
		}
		return nil, api.BadRequest("Malformed JSON in request body.")
	}
	if len(strings.TrimSpace(string(body))) == 0 {
		return nil, api.BadRequest("Body expected in request.")
	}
	var v any
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil || dec.More() {
		return nil, api.BadRequest("Malformed JSON in request body.")
	}
	return v, nil
}

func schemaError(format string, args ...any) error {
	return api.BadRequest("Provided object does not match schema 'image': "+format, args...)
}

// setBase validates one base attribute value against Glance's image schema
// and stores it in img. Read-only and reserved keys are refused by callers.
func setBase(img *Image, key string, v any) error {
	str := func(null bool, maxLen int, enum []string) (string, error) {
		if v == nil && null {
			return "", nil
		}
		s, ok := v.(string)
		if !ok {
			return "", schemaError("%s is not of type 'string'", jsonText(v))
		}
		if maxLen > 0 && len([]rune(s)) > maxLen {
			return "", schemaError("'%s' is too long", s)
		}
		if enum != nil && !slices.Contains(enum, s) {
			return "", schemaError("'%s' is not one of %s", s, pyList(enum, null))
		}
		return s, nil
	}
	integer := func() (int, error) {
		n, ok := v.(json.Number)
		if !ok {
			return 0, schemaError("%s is not of type 'integer'", jsonText(v))
		}
		i, err := strconv.ParseInt(string(n), 10, 64)
		if err != nil || i > math.MaxInt32 {
			return 0, schemaError("%s is not of type 'integer'", n)
		}
		if i < 0 {
			return 0, schemaError("%s is less than the minimum of 0", n)
		}
		return int(i), nil
	}
	boolean := func() (bool, error) {
		b, ok := v.(bool)
		if !ok {
			return false, schemaError("%s is not of type 'boolean'", jsonText(v))
		}
		return b, nil
	}
	var err error
	switch key {
	case "name":
		img.Name, err = str(true, 255, nil)
	case "visibility":
		img.Visibility, err = str(false, 0, visibilities)
	case "owner":
		img.Owner, err = str(true, 255, nil)
	case "disk_format":
		img.DiskFormat, err = str(true, 0, diskFormats)
	case "container_format":
		img.ContainerFormat, err = str(true, 0, containerFormats)
	case "min_disk":
		img.MinDisk, err = integer()
	case "min_ram":
		img.MinRAM, err = integer()
	case "protected":
		img.Protected, err = boolean()
	case "os_hidden":
		img.OSHidden, err = boolean()
	case "tags":
		list, ok := v.([]any)
		if !ok {
			return schemaError("%s is not of type 'array'", jsonText(v))
		}
		tags := []string{}
		seen := map[string]bool{}
		for _, t := range list {
			s, ok := t.(string)
			if !ok {
				return schemaError("%s is not of type 'string'", jsonText(t))
			}
			if len([]rune(s)) > 255 {
				return schemaError("'%s' is too long", s)
			}
			if !seen[s] {
				seen[s] = true
				tags = append(tags, s)
			}
			if len(tags) > maxTags {
				return api.OverLimit("Maximum number of tags exceeded: %d", maxTags)
			}
		}
		img.Tags = tags
	case "locations":
		// show_multiple_locations is off, as in a default Glance.
		return api.Forbidden("It's not allowed to update locations if locations are invisible.")
	default:
		return api.Forbidden("Attribute '%s' is read-only.", key)
	}
	return err
}

func jsonText(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func pyList(enum []string, null bool) string {
	parts := make([]string, 0, len(enum)+1)
	if null {
		parts = append(parts, "None")
	}
	for _, e := range enum {
		parts = append(parts, "'"+e+"'")
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

func setProperty(img *Image, key string, v any) error {
	if len(key) > 255 {
		return api.BadRequest("Custom property should not be greater than 255 characters.")
	}
	s, ok := v.(string)
	if !ok {
		return schemaError("%s is not of type 'string'", jsonText(v))
	}
	if _, exists := img.Properties[key]; !exists && len(img.Properties) >= maxProperties {
		return api.OverLimit("Maximum number of image properties exceeded: %d", maxProperties)
	}
	img.Properties[key] = s
	return nil
}

// --- handlers ---

func (s *Service) createImage(r *http.Request) (*api.Response, error) {
	c := api.CallerFrom(r.Context())
	raw, err := readJSON(r)
	if err != nil {
		return nil, err
	}
	body, ok := raw.(map[string]any)
	if !ok {
		return nil, schemaError("%s is not of type 'object'", jsonText(raw))
	}
	for _, k := range disallowedAttrs {
		if _, ok := body[k]; ok {
			return nil, api.Forbidden("Attribute '%s' is read-only.", k)
		}
	}
	now := time.Now().UTC().Truncate(time.Second)
	img := &Image{
		ID: uuid.NewString(), Status: StatusQueued, Visibility: Shared, Owner: c.ProjectID,
		Tags: []string{}, Properties: map[string]string{}, CreatedAt: now, UpdatedAt: now,
	}
	keys := make([]string, 0, len(body))
	for k := range body {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	// Validate types first (400) before policy (403), as Glance's schema
	// check runs in the deserializer.
	for _, k := range keys {
		v := body[k]
		switch {
		case k == "id":
			id, ok := v.(string)
			if !ok || !uuidPattern.MatchString(id) {
				return nil, schemaError("%s does not match '%s'", jsonText(v), uuidPattern.String())
			}
			img.ID = strings.ToLower(id)
		case slices.Contains(readonlyAttrs, k):
			return nil, api.Forbidden("Attribute '%s' is read-only.", k)
		case reserved(k):
			return nil, api.Forbidden("Attribute '%s' is reserved.", k)
		case slices.Contains(baseAttrs, k):
			if err := setBase(img, k, v); err != nil {
				return nil, err
			}
		default:
			if err := setProperty(img, k, v); err != nil {
				return nil, err
			}
		}
	}
	if _, given := body["owner"]; given && img.Owner != c.ProjectID && !c.IsAdmin() {
		return nil, api.Forbidden("You are not permitted to create images owned by '%s'.", img.Owner)
	}
	if img.Visibility == Public && !c.IsAdmin() {
		return nil, api.PolicyForbidden("publicize_image")
	}
	if !canWrite(c) {
		return nil, api.PolicyForbidden("add_image")
	}
	err = s.db.Tx(r.Context(), func(tx *store.Tx) error {
		if err := checkCount(r.Context(), tx, img); err != nil {
			return err
		}
		return insertImage(r.Context(), tx, img)
	})
	if errors.Is(err, store.ErrConflict) {
		return nil, api.Conflict("Image with identifier %s already exists!", img.ID)
	}
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusCreated, view(img)).
		WithHeader("Location", api.BaseURL(r)+"/v2/images/"+img.ID), nil
}

// lookup loads the image named in the path as the caller sees it: 404 when
// it is invisible or the id is not a UUID.
func (s *Service) lookup(ctx context.Context, q store.Querier, r *http.Request) (*Image, error) {
	c := api.CallerFrom(r.Context())
	id := r.PathValue("id")
	img, err := s.visibleImage(ctx, q, c.ProjectID, c.IsAdmin(), id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, api.NotFound("No image found with ID %s", id)
	}
	return img, err
}

func (s *Service) showImage(r *http.Request) (*api.Response, error) {
	img, err := s.lookup(r.Context(), s.db, r)
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, view(img)), nil
}

// mutate runs f on a visible image the caller owns, in one transaction, and
// saves the result.
func (s *Service) mutate(r *http.Request, deny string, f func(c *api.Caller, img *Image) error) (*Image, error) {
	c := api.CallerFrom(r.Context())
	var out *Image
	err := s.db.Tx(r.Context(), func(tx *store.Tx) error {
		img, err := s.lookup(r.Context(), tx, r)
		if err != nil {
			return err
		}
		if !owns(c, img) {
			return api.Forbidden("%s", deny)
		}
		if err := f(c, img); err != nil {
			return err
		}
		img.UpdatedAt = time.Now().UTC().Truncate(time.Second)
		out = img
		return updateImage(r.Context(), tx, img)
	})
	return out, err
}

type patchOp struct {
	op    string
	path  string
	value any
}

var patchTypes = map[string]int{
	"application/openstack-images-v2.0-json-patch": 4,
	"application/openstack-images-v2.1-json-patch": 10,
}

// parsePatch follows glance/api/v2/images.py RequestDeserializer.update.
func parsePatch(r *http.Request) ([]patchOp, error) {
	ct := r.Header.Get("Content-Type")
	if i := strings.IndexByte(ct, ';'); i >= 0 {
		ct = ct[:i]
	}
	draft, ok := patchTypes[strings.TrimSpace(strings.ToLower(ct))]
	if !ok {
		e := api.Errorf(http.StatusUnsupportedMediaType, "The request media type %s is not supported by this server.", ct)
		e.Header = http.Header{"Accept-Patch": {"application/openstack-images-v2.0-json-patch, application/openstack-images-v2.1-json-patch"}}
		return nil, e
	}
	raw, err := readJSON(r)
	if err != nil {
		return nil, err
	}
	list, ok := raw.([]any)
	if !ok {
		return nil, api.BadRequest("Request body must be a JSON array of operation objects.")
	}
	if len(list) > maxPatchOps {
		return nil, api.BadRequest("Too many operations in the request: at most %d are allowed.", maxPatchOps)
	}
	ops := make([]patchOp, 0, len(list))
	for _, item := range list {
		obj, ok := item.(map[string]any)
		if !ok {
			return nil, api.BadRequest("Operations must be JSON objects.")
		}
		var op, path string
		if draft == 10 {
			o, has := obj["op"]
			if !has {
				return nil, api.BadRequest("Unable to find `op` in JSON Schema change. It must be one of the following: add, remove, replace.")
			}
			op, _ = o.(string)
			if op != "add" && op != "remove" && op != "replace" {
				return nil, api.BadRequest("Invalid operation: `%v`. It must be one of the following: add, remove, replace.", o)
			}
			p, has := obj["path"]
			if !has {
				return nil, api.BadRequest("Unable to find 'path' in JSON Schema change")
			}
			if path, ok = p.(string); !ok {
				return nil, api.BadRequest("Pointer `%v` does not start with \"/\".", p)
			}
		} else {
			for _, k := range []string{"add", "remove", "replace"} {
				if p, has := obj[k]; has {
					if op != "" {
						return nil, api.BadRequest("Operation objects must contain only one member named \"add\", \"remove\", or \"replace\".")
					}
					op = k
					path, _ = p.(string)
				}
			}
			if op == "" {
				return nil, api.BadRequest("Operation objects must contain exactly one member named \"add\", \"remove\", or \"replace\".")
			}
		}
		key, err := decodePointer(path)
		if err != nil {
			return nil, err
		}
		po := patchOp{op: op, path: key}
		if op != "remove" {
			v, has := obj["value"]
			if !has {
				return nil, api.BadRequest("Operation \"%s\" requires a member named \"value\".", op)
			}
			po.value = v
		}
		switch {
		case slices.Contains(readonlyAttrs, key):
			return nil, api.Forbidden("Attribute '%s' is read-only.", key)
		case reserved(key):
			return nil, api.Forbidden("Attribute '%s' is reserved.", key)
		}
		ops = append(ops, po)
	}
	return ops, nil
}

// decodePointer accepts the one-level JSON pointers Glance accepts and
// returns the attribute name.
func decodePointer(p string) (string, error) {
	if !strings.HasPrefix(p, "/") {
		return "", api.BadRequest("Pointer `%s` does not start with \"/\".", p)
	}
	if len(p) > 1 && strings.HasSuffix(p, "/") {
		return "", api.BadRequest("Pointer `%s` end with \"/\".", p)
	}
	if badEscape.MatchString(p) || strings.HasSuffix(p, "~") {
		return "", api.BadRequest("Pointer `%s` contains \"~\" not part of a recognized escape sequence.", p)
	}
	parts := strings.Split(p[1:], "/")
	if len(parts) != 1 || strings.TrimSpace(parts[0]) == "" {
		return "", api.BadRequest("Invalid JSON pointer for this resource: '%s'", p)
	}
	return strings.TrimSpace(strings.ReplaceAll(strings.ReplaceAll(parts[0], "~1", "/"), "~0", "~")), nil
}

func (s *Service) updateImage(r *http.Request) (*api.Response, error) {
	ops, err := parsePatch(r)
	if err != nil {
		return nil, err
	}
	img, err := s.mutate(r, "You are not permitted to modify this image.", func(c *api.Caller, img *Image) error {
		for _, op := range ops {
			if err := applyPatch(c, img, op); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, view(img)), nil
}

// applyPatch follows ImagesController._do_add/_do_replace/_do_remove and the
// domain's rules for formats and visibility.
func applyPatch(c *api.Caller, img *Image, op patchOp) error {
	key := op.path
	base := slices.Contains(baseAttrs, key)
	if op.op == "remove" {
		if base {
			return api.Forbidden("Property %s may not be removed.", key)
		}
		if _, ok := img.Properties[key]; !ok {
			return api.Conflict("Property %s does not exist.", key)
		}
		delete(img.Properties, key)
		return nil
	}
	if !base {
		if _, ok := img.Properties[key]; !ok && op.op == "replace" {
			return api.Conflict("Property %s does not exist.", key)
		}
		return setProperty(img, key, op.value)
	}
	switch key {
	case "owner":
		if !c.IsAdmin() {
			return api.Forbidden("Owner can't be updated by non admin.")
		}
	case "container_format", "disk_format":
		if img.Status != StatusQueued {
			return api.Forbidden("Attribute %s can be only replaced for a queued image.", key)
		}
	}
	old := img.Visibility
	if err := setBase(img, key, op.value); err != nil {
		return err
	}
	if key == "visibility" && img.Visibility != old && img.Visibility == Public && !c.IsAdmin() {
		return api.PolicyForbidden("publicize_image")
	}
	return nil
}

func (s *Service) deleteImage(r *http.Request) (*api.Response, error) {
	c := api.CallerFrom(r.Context())
	err := s.db.Tx(r.Context(), func(tx *store.Tx) error {
		img, err := s.lookup(r.Context(), tx, r)
		if err != nil {
			return err
		}
		if !owns(c, img) {
			return api.Forbidden("You are not permitted to delete this image.")
		}
		if img.Protected {
			return api.Forbidden("Image %s is protected and cannot be deleted.", img.ID)
		}
		return s.deleteRow(r.Context(), tx, img.ID)
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(http.StatusNoContent), nil
}

func (s *Service) addTag(r *http.Request) (*api.Response, error) {
	tag := r.PathValue("tag")
	if len([]rune(tag)) > 255 {
		return nil, api.BadRequest("Provided object does not match schema 'image': '%s' is too long", tag)
	}
	_, err := s.mutate(r, "You are not permitted to modify tags on this image.", func(_ *api.Caller, img *Image) error {
		if slices.Contains(img.Tags, tag) {
			return nil
		}
		if len(img.Tags) >= maxTags {
			return api.OverLimit("Maximum number of tags exceeded: %d", maxTags)
		}
		img.Tags = append(img.Tags, tag)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(http.StatusNoContent), nil
}

func (s *Service) deleteTag(r *http.Request) (*api.Response, error) {
	tag := r.PathValue("tag")
	_, err := s.mutate(r, "You are not permitted to modify tags on this image.", func(_ *api.Caller, img *Image) error {
		i := slices.Index(img.Tags, tag)
		if i < 0 {
			return api.NotFound("Tag %s not found", tag)
		}
		img.Tags = slices.Delete(img.Tags, i, i+1)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(http.StatusNoContent), nil
}

// deactivate and reactivate follow glance/domain Image.deactivate/reactivate.
func (s *Service) deactivate(r *http.Request) (*api.Response, error) {
	_, err := s.mutate(r, "You are not permitted to deactivate this image.", func(_ *api.Caller, img *Image) error {
		switch img.Status {
		case StatusDeactivated:
		case StatusActive:
			img.Status = StatusDeactivated
		default:
			return api.Forbidden("Not allowed to deactivate image in status '%s'", img.Status)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(http.StatusNoContent), nil
}

func (s *Service) reactivate(r *http.Request) (*api.Response, error) {
	_, err := s.mutate(r, "You are not permitted to reactivate this image.", func(_ *api.Caller, img *Image) error {
		switch img.Status {
		case StatusActive:
		case StatusDeactivated:
			img.Status = StatusActive
		default:
			return api.Forbidden("Not allowed to reactivate image in status '%s'", img.Status)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(http.StatusNoContent), nil
}

// --- list (ImagesController.index and glance/db/sqlalchemy/api.py) ---

var sortKeys = []string{"name", "status", "container_format", "disk_format", "size", "id", "created_at", "updated_at"}

type sortSpec struct {
	keys []string
	dirs []string
}

func parseSort(q url.Values) (sortSpec, error) {
	var sp sortSpec
	validKey := func(k string) error {
		if !slices.Contains(sortKeys, k) {
			return api.BadRequest("Invalid sort key: %s. It must be one of the following: %s.", k, strings.Join(sortKeys, ", "))
		}
		return nil
	}
	validDir := func(d string) error {
		if d != "asc" && d != "desc" {
			return api.BadRequest("Invalid sort direction: %s", d)
		}
		return nil
	}
	if q.Has("sort") {
		if q.Has("sort_key") || q.Has("sort_dir") {
			return sp, api.BadRequest("Old and new sorting syntax cannot be combined")
		}
		for _, part := range strings.Split(strings.TrimSpace(q.Get("sort")), ",") {
			k, d, _ := strings.Cut(part, ":")
			k, d = strings.TrimSpace(k), strings.TrimSpace(d)
			if d == "" {
				d = "desc"
			}
			if err := validKey(k); err != nil {
				return sp, err
			}
			if err := validDir(d); err != nil {
				return sp, err
			}
			sp.keys, sp.dirs = append(sp.keys, k), append(sp.dirs, d)
		}
	} else {
		for _, k := range q["sort_key"] {
			k = strings.TrimSpace(k)
			if err := validKey(k); err != nil {
				return sp, err
			}
			sp.keys = append(sp.keys, k)
		}
		for _, d := range q["sort_dir"] {
			d = strings.TrimSpace(d)
			if err := validDir(d); err != nil {
				return sp, err
			}
			sp.dirs = append(sp.dirs, d)
		}
		if len(sp.dirs) > 1 && len(sp.dirs) != len(sp.keys) {
			return sp, api.BadRequest("Number of sort dirs does not match the number of sort keys")
		}
	}
	if len(sp.keys) == 0 {
		sp.keys = []string{"created_at"}
	}
	if len(sp.dirs) == 0 {
		sp.dirs = []string{"desc"}
	}
	for len(sp.dirs) < len(sp.keys) {
		sp.dirs = append(sp.dirs, sp.dirs[0])
	}
	// Glance always ends with created_at and id so that markers are exact.
	for _, k := range []string{"created_at", "id"} {
		if !slices.Contains(sp.keys, k) {
			sp.keys, sp.dirs = append(sp.keys, k), append(sp.dirs, sp.dirs[len(sp.dirs)-1])
		}
	}
	return sp, nil
}

// keyset is the SQL order of the sort; the keys are column names.
func (sp sortSpec) keyset() api.Keyset {
	ks := make(api.Keyset, len(sp.keys))
	for i, k := range sp.keys {
		ks[i] = api.SortKey{Col: k, Desc: sp.dirs[i] == "desc"}
	}
	return ks
}

// filter is a query filter SQL cannot apply: tags and custom properties
// live in JSON columns.
type filter func(img *Image) bool

func boolParam(q url.Values, name, def string) (*bool, error) {
	v := q.Get(name)
	if !q.Has(name) {
		v = def
	}
	if v == "" {
		return nil, nil
	}
	v = strings.ToLower(v)
	if v != "true" && v != "false" {
		return nil, api.BadRequest("Invalid value '%s' for '%s' filter. Valid values are 'true' or 'false'.", v, name)
	}
	b := v == "true"
	return &b, nil
}

// imageQuery is an image list being read: its SQL page and the filters
// applied to the rows it reads.
type imageQuery struct {
	page api.Page
	post []filter
}

func (iq *imageQuery) matches(img *Image) bool {
	for _, f := range iq.post {
		if !f(img) {
			return false
		}
	}
	return true
}

// limitRule is Glance's limit: 25 unless asked, at most 1000.
var limitRule = api.IntRule{
	Default: defaultLimit, Min: 0, Max: maxLimit,
	NotInt:   func(string) error { return api.BadRequest("limit param must be an integer") },
	TooSmall: func(string) error { return api.BadRequest("limit param must be positive") },
}

// specialParams are the list parameters that are not plain attribute
// filters.
var specialParams = []string{"limit", "marker", "member_status", "visibility", "sort", "sort_key", "sort_dir",
	"os_hidden", "protected", "tag", "size_min", "size_max"}

// flagFilters reads os_hidden (false unless asked), protected, tag,
// size_min and size_max.
func flagFilters(iq *imageQuery, q url.Values) error {
	for _, f := range []struct{ param, col, def string }{{"os_hidden", "os_hidden", "false"}, {"protected", "protected", ""}} {
		b, err := boolParam(q, f.param, f.def)
		if err != nil {
			return err
		}
		if b != nil {
			iq.page.Add(f.col+" = ?", b2i(*b))
		}
	}
	if tags := q["tag"]; len(tags) > 0 {
		iq.post = append(iq.post, func(img *Image) bool {
			for _, t := range tags {
				if !slices.Contains(img.Tags, strings.TrimSpace(t)) {
					return false
				}
			}
			return true
		})
	}
	for _, f := range []struct{ param, op string }{{"size_min", ">="}, {"size_max", "<="}} {
		if !q.Has(f.param) {
			continue
		}
		n, err := strconv.ParseInt(q.Get(f.param), 10, 64)
		if err != nil {
			return api.BadRequest("Unable to filter on a range with a non-numeric value.")
		}
		// An image without data has no size to compare.
		iq.page.Add("checksum <> '' AND size "+f.op+" ?", n)
	}
	return nil
}

// attributeFilters reads the other parameters: Glance's attribute filters,
// and any other name filters on a custom property.
func attributeFilters(iq *imageQuery, q url.Values) error {
	for key, vals := range q {
		if slices.Contains(specialParams, key) || len(vals) == 0 {
			continue
		}
		if err := attributeFilter(iq, key, vals[0]); err != nil {
			return err
		}
	}
	return nil
}

func attributeFilter(iq *imageQuery, key, v string) error {
	switch key {
	case "id", "name", "checksum":
		inOrEqual(iq, key, v)
	case "status", "owner", "disk_format", "container_format", "os_hash_value":
		iq.page.Add(key+" = ?", v)
	case "min_disk", "min_ram", "size", "virtual_size":
		return numberFilter(iq, key, v)
	case "created_at", "updated_at":
		return timeFilter(iq, key, v)
	default:
		iq.post = append(iq.post, func(img *Image) bool { p, ok := img.Properties[key]; return ok && p == v })
	}
	return nil
}

// inOrEqual handles Glance's "in:a,b" operator on id, name and checksum.
func inOrEqual(iq *imageQuery, col, v string) {
	if rest, ok := strings.CutPrefix(v, "in:"); ok {
		in, args := api.InList(strings.Split(rest, ","))
		iq.page.Add(col+" "+in, args...)
		return
	}
	iq.page.Add(col+" = ?", v)
}

// numberFilter is an exact integer attribute; size only counts with data.
// min_disk and min_ram are 32-bit columns: no image has a larger value.
func numberFilter(iq *imageQuery, key, v string) error {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return api.BadRequest("Invalid value '%s' for '%s' filter.", v, key)
	}
	switch {
	case key == "size":
		iq.page.Add("checksum <> '' AND size = ?", n)
	case (key == "min_disk" || key == "min_ram") && n != int64(int32(n)):
		iq.page.Add("1 = 0")
	default:
		iq.page.Add(key+" = ?", n)
	}
	return nil
}

// timeOps are the operators of Glance's time filters, "op:timestamp".
var timeOps = map[string]string{"gt": ">", "gte": ">=", "lt": "<", "lte": "<=", "eq": "=", "neq": "<>"}

// timeFilter handles created_at/updated_at filters "op:timestamp", which
// compare to the second: the stored text's first 19 characters.
func timeFilter(iq *imageQuery, col, v string) error {
	op, val, ok := strings.Cut(v, ":")
	if _, known := timeOps[op]; !ok || !known {
		op, val = "eq", v
	}
	t, err := time.Parse(time.RFC3339, val)
	if err != nil {
		if t, err = time.Parse("2006-01-02T15:04:05", val); err != nil {
			return api.BadRequest("Invalid filter value %s. The date and time is not in the ISO 8601 format.", v)
		}
	}
	iq.page.Add("substr("+col+", 1, 19) "+timeOps[op]+" ?", store.FormatTime(t)[:19])
	return nil
}

// visibilityScope narrows a list to the images the caller may list under a
// visibility filter (glance/db/sqlalchemy/api.py _select_images_query and
// _make_conditions_from_filters): admins see every image; others see public
// and community images, their own, and shared images they are a member of
// in memberStatus. Without a visibility filter, other projects' community
// images are left out.
func visibilityScope(iq *imageQuery, c *api.Caller, visibility, memberStatus string) {
	project := c.ProjectID
	if project == "" {
		project = "\x00" // an unscoped caller owns nothing, not the owner-less images
	}
	if !c.IsAdmin() {
		memberCond, args := "member = ?", []any{project, project}
		if memberStatus != "all" {
			memberCond += " AND status = ?"
			args = append(args, memberStatus)
		}
		iq.page.Add(`(visibility IN ('public', 'community') OR owner = ? OR
			(visibility = 'shared' AND id IN (SELECT image_id FROM image_members WHERE `+memberCond+`)))`, args...)
	}
	switch visibility {
	case "all":
	case "":
		iq.page.Add("(visibility <> 'community' OR owner = ?)", project)
	default:
		iq.page.Add("visibility = ?", visibility)
	}
}

func (s *Service) listImages(r *http.Request) (*api.Response, error) {
	c := api.CallerFrom(r.Context())
	q := r.URL.Query()
	limit, err := limitRule.Parse(q.Get("limit"), q.Has("limit"))
	if err != nil {
		return nil, err
	}
	memberStatus := "accepted"
	if q.Has("member_status") {
		memberStatus = q.Get("member_status")
		if !slices.Contains([]string{"pending", "accepted", "rejected", "all"}, memberStatus) {
			return nil, api.BadRequest("Invalid status: %s", memberStatus)
		}
	}
	visibility := q.Get("visibility")
	if visibility != "" && !slices.Contains([]string{"community", "public", "private", "shared", "all"}, visibility) {
		return nil, api.BadRequest("Invalid visibility value: %s", visibility)
	}
	if q.Has("changes-since") {
		return nil, api.BadRequest("The \"changes-since\" filter is no longer available on v2.")
	}
	sp, err := parseSort(q)
	if err != nil {
		return nil, err
	}
	iq := &imageQuery{}
	if err := flagFilters(iq, q); err != nil {
		return nil, err
	}
	if err := attributeFilters(iq, q); err != nil {
		return nil, err
	}
	visibilityScope(iq, c, visibility, memberStatus)
	iq.page.Keys = sp.keyset()
	if err := s.afterMarker(r.Context(), c, iq, q); err != nil {
		return nil, err
	}
	page, err := s.scanImages(r.Context(), iq, limit)
	if err != nil {
		return nil, err
	}
	return imagesPage(q, page, limit), nil
}

// afterMarker narrows the list to the images after the marker, which must
// be one the caller sees (not necessarily one the filters keep).
func (s *Service) afterMarker(ctx context.Context, c *api.Caller, iq *imageQuery, q url.Values) error {
	if !q.Has("marker") {
		return nil
	}
	marker := q.Get("marker")
	_, err := s.visibleImage(ctx, s.db, c.ProjectID, c.IsAdmin(), marker)
	if err == nil {
		var vals []any
		if vals, err = iq.page.Keys.MarkerValues(ctx, s.db, "images", "id = ?", marker); err == nil {
			iq.page.AfterMarker(vals)
			return nil
		}
	}
	if errors.Is(err, store.ErrNotFound) {
		return api.BadRequest("Marker %s could not be found.", marker)
	}
	return err
}

// scanImages reads at most limit images of the page that pass the filters
// SQL cannot apply; without such filters SQL stops at the limit.
func (s *Service) scanImages(ctx context.Context, iq *imageQuery, limit int) ([]*Image, error) {
	iq.page.Limit = limit
	if len(iq.post) > 0 {
		iq.page.Limit = -1
	}
	rows, err := s.db.Query(ctx, "SELECT "+imageCols+" FROM images "+iq.page.SQL(), iq.page.Args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*Image
	for (limit < 0 || len(out) < limit) && rows.Next() {
		img, err := scanImage(rows)
		if err != nil {
			return nil, err
		}
		if iq.matches(img) {
			out = append(out, img)
		}
	}
	return out, rows.Err()
}

// imagesPage is the list's answer, with Glance's first and next links (the
// next one when the page is full).
func imagesPage(q url.Values, page []*Image, limit int) *api.Response {
	out := make([]map[string]any, 0, len(page))
	for _, img := range page {
		out = append(out, view(img))
	}
	body := map[string]any{"images": out, "first": "/v2/images", "schema": "/v2/schemas/images"}
	if first := api.NextQuery(q, nil, "marker"); first != "" {
		body["first"] = "/v2/images?" + first
	}
	if len(page) > 0 && len(page) == limit {
		body["next"] = "/v2/images?" + api.NextQuery(q, map[string]string{"marker": page[len(page)-1].ID})
	}
	return api.JSON(http.StatusOK, body)
}

// candidates loads the images the caller may list under a visibility
// filter (see visibilityScope).
func (s *Service) candidates(ctx context.Context, c *api.Caller, visibility, memberStatus string) ([]*Image, error) {
	iq := &imageQuery{page: api.Page{Keys: api.Keyset{{Col: "id"}}}}
	visibilityScope(iq, c, visibility, memberStatus)
	return s.scanImages(ctx, iq, -1)
}
