package volume

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"net/http"
	"regexp"
	"sort"
	"strings"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// DefaultType is the volume type volumes get when none is asked for: the
// network disk of the product (PRODUCT.md "Disk types").
const DefaultType = "network"

// userVisibleSpecs are the extra specs a non-admin sees
// (cinder/api/v2/views/types.py, cinder/volume/volume_types.py
// USER_VISIBLE_EXTRA_SPECS).
var userVisibleSpecs = map[string]bool{"multiattach": true, "RESKEY:availability_zones": true, "replication_enabled": true}

type typeRow struct {
	ID, Name    string
	Description *string
	IsPublic    bool
	IsDefault   bool
	ExtraSpecs  map[string]string
	QoSSpecsID  *string // qos.go
}

const typeColumns = "id, name, description, is_public, is_default, extra_specs, qos_specs_id"

func scanType(sc interface{ Scan(...any) error }) (*typeRow, error) {
	t := &typeRow{ExtraSpecs: map[string]string{}}
	var pub, def int
	var specs string
	if err := sc.Scan(&t.ID, &t.Name, &t.Description, &pub, &def, &specs, &t.QoSSpecsID); err != nil {
		return nil, err
	}
	t.IsPublic, t.IsDefault = pub != 0, def != 0
	return t, store.FromJSON(specs, &t.ExtraSpecs)
}

func loadTypes(ctx context.Context, q store.Querier, where string, args ...any) ([]*typeRow, error) {
	rows, err := q.Query(ctx, "SELECT "+typeColumns+" FROM volume_types WHERE ("+where+") ORDER BY name", args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*typeRow
	for rows.Next() {
		t, err := scanType(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

var uuidRE = regexp.MustCompile(`^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{12}$`)

// getType finds a type by id, or by name when ref does not look like a
// UUID (cinder/volume/volume_types.py get_by_name_or_id), with Cinder's
// two 404s. A private type is an admin's and its access list's.
func getType(ctx context.Context, q store.Querier, c *api.Caller, ref string, byName bool) (*typeRow, error) {
	col := "id"
	if byName && !uuidRE.MatchString(ref) {
		col = "name"
	}
	t, err := scanType(q.QueryRow(ctx, "SELECT "+typeColumns+" FROM volume_types WHERE "+col+" = ?", ref))
	if err == nil && !t.IsPublic && !c.IsAdmin() {
		var ok bool
		if ok, err = hasTypeAccess(ctx, q, t.ID, c.ProjectID); err == nil && !ok {
			err = sql.ErrNoRows
		}
	}
	if store.IsNoRows(err) {
		if col == "name" {
			return nil, api.NotFound("Volume type with name %s could not be found.", ref)
		}
		return nil, api.NotFound("Volume type %s could not be found.", ref)
	}
	return t, err
}

// findType is the type a new volume gets: the one named (by name or id),
// else the default.
func (s *Service) findType(ctx context.Context, q store.Querier, c *api.Caller, ref *string) (*typeRow, error) {
	if ref != nil && *ref != "" {
		return getType(ctx, q, c, *ref, true)
	}
	ts, err := loadTypes(ctx, q, "is_default = 1")
	if err != nil {
		return nil, err
	}
	if len(ts) == 0 {
		// cinder/exception.py VolumeTypeDefaultMisconfiguredError
		return nil, api.Errorf(http.StatusInternalServerError, "The request cannot be fulfilled as the default volume type %s cannot be found.", DefaultType)
	}
	return ts[0], nil
}

// Bootstrap makes the default volume type and its QoS spec once.
func (s *Service) Bootstrap(ctx context.Context) error {
	if err := s.bootstrapType(ctx); err != nil {
		return err
	}
	return s.bootstrapQoS(ctx)
}

func (s *Service) bootstrapType(ctx context.Context) error {
	return s.db.Tx(ctx, func(tx *store.Tx) error {
		var n int
		if err := tx.QueryRow(ctx, "SELECT COUNT(*) FROM volume_types WHERE is_default = 1").Scan(&n); err != nil || n > 0 {
			return err
		}
		now := store.FormatTime(s.now())
		desc := "Network disks from the block storage pool"
		_, err := tx.Exec(ctx, `INSERT INTO volume_types (id, name, description, is_public, is_default, extra_specs, created_at, updated_at)
			VALUES (?, ?, ?, 1, 1, ?, ?, ?) ON CONFLICT DO NOTHING`, newID(), DefaultType, desc,
			store.JSON(map[string]string{"volume_backend_name": DefaultType}), now, now)
		return err
	})
}

// typeView is cinder/api/v2/views/types.py show, as GET answers it.
func typeView(r *http.Request, t *typeRow) map[string]any {
	specs := t.ExtraSpecs
	if !caller(r).IsAdmin() {
		specs = map[string]string{}
		for k, v := range t.ExtraSpecs {
			if userVisibleSpecs[k] {
				specs[k] = v
			}
		}
	}
	out := map[string]any{"id": t.ID, "name": t.Name, "description": t.Description, "is_public": t.IsPublic,
		"extra_specs": specs, "os-volume-type-access:is_public": t.IsPublic}
	if caller(r).IsAdmin() {
		out["qos_specs_id"] = t.QoSSpecsID
	}
	return out
}

// typeWriteView is the type as POST and PUT /types answer it: without
// qos_specs_id, and for PUT without the type-access attribute either (the
// response schemas Tempest checks Cinder against forbid both).
func typeWriteView(r *http.Request, t *typeRow, update bool) map[string]any {
	out := typeView(r, t)
	delete(out, "qos_specs_id")
	if update {
		delete(out, "os-volume-type-access:is_public")
	}
	return out
}

// listTypes is GET /types: public types and the private ones the
// caller's project has access to, and for an admin private ones too
// unless is_public says otherwise (cinder/api/v2/types.py index, and
// the db API's _volume_type_get_query).
func (s *Service) listTypes(r *http.Request) (*api.Response, error) {
	where, args := "is_public = 1 OR id IN (SELECT type_id FROM volume_type_projects WHERE project_id = ?)", []any{caller(r).ProjectID}
	if caller(r).IsAdmin() {
		args = nil
		where = "1 = 1"
		switch p := strings.ToLower(r.URL.Query().Get("is_public")); p {
		case "":
		case "none":
		default:
			b, ok := api.ParseBool(p)
			if !ok {
				return nil, invalidInput("Invalid is_public filter [%s]", p)
			}
			where = "is_public = " + map[bool]string{true: "1", false: "0"}[b]
		}
	}
	ts, err := loadTypes(r.Context(), s.db, where, args...)
	if err != nil {
		return nil, err
	}
	items := make([]map[string]any, 0, len(ts))
	for _, t := range ts {
		items = append(items, typeView(r, t))
	}
	return api.JSON(200, map[string]any{"volume_types": items}), nil
}

func (s *Service) showType(r *http.Request) (*api.Response, error) {
	t, err := getType(r.Context(), s.db, caller(r), r.PathValue("id"), false)
	if err != nil {
		return nil, err
	}
	return api.JSON(200, map[string]any{"volume_type": typeView(r, t)}), nil
}

func (s *Service) defaultType(r *http.Request) (*api.Response, error) {
	t, err := s.findType(r.Context(), s.db, caller(r), nil)
	if err != nil {
		return nil, err
	}
	return api.JSON(200, map[string]any{"volume_type": typeView(r, t)}), nil
}

// typeFields reads name, description and os-volume-type-access:is_public
// (or is_public) of a create or update body.
func typeFields(b body) (name, desc *string, pub *bool, err error) {
	if name, err = b.optString("name", 255); err != nil {
		return
	}
	if name != nil {
		t := strings.TrimSpace(*name)
		if t == "" {
			err = invalidInput("Volume type name can not be empty.")
			return
		}
		name = &t
	}
	if desc, err = b.optString("description", 255); err != nil {
		return
	}
	for _, k := range []string{"os-volume-type-access:is_public", "is_public"} {
		v, ok, e := b.boolean(k)
		if e != nil {
			err = invalidInput("Invalid value '%s' for is_public. Accepted values: True or False.", b[k])
			return
		}
		if ok {
			pub = &v
			break
		}
	}
	return
}

// createType is POST /types (admin): 200 with the type.
func (s *Service) createType(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	b, err := decodeBody(r, "volume_type")
	if err != nil {
		return nil, err
	}
	name, desc, pub, err := typeFields(b)
	if err != nil {
		return nil, err
	}
	if name == nil {
		return nil, invalidInput("Volume type name can not be empty.")
	}
	t := &typeRow{ID: newID(), Name: *name, Description: desc, IsPublic: pub == nil || *pub, ExtraSpecs: map[string]string{}}
	if raw, ok := b["extra_specs"]; ok {
		if t.ExtraSpecs, err = parseMetadata("extra_specs", raw); err != nil {
			return nil, err
		}
	}
	now := store.FormatTime(s.now())
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO volume_types (id, name, description, is_public, is_default, extra_specs, created_at, updated_at)
			VALUES (?, ?, ?, ?, 0, ?, ?, ?)`, t.ID, t.Name, t.Description, b2i(t.IsPublic), store.JSON(t.ExtraSpecs), now, now)
		if errors.Is(err, store.ErrConflict) {
			// cinder/exception.py VolumeTypeExists
			return api.Conflict("Volume Type %s already exists.", t.Name)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return api.JSON(200, map[string]any{"volume_type": typeWriteView(r, t, false)}), nil
}

// updateType is PUT /types/{id} (admin): name, description, is_public.
func (s *Service) updateType(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	b, err := decodeBody(r, "volume_type")
	if err != nil {
		return nil, err
	}
	name, desc, pub, err := typeFields(b)
	if err != nil {
		return nil, err
	}
	if name == nil && desc == nil && pub == nil {
		return nil, invalidInput("Specify volume type name, description, is_public or a combination thereof.")
	}
	var t *typeRow
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		var err error
		if t, err = getType(ctx, tx, caller(r), r.PathValue("id"), false); err != nil {
			return err
		}
		if name != nil {
			t.Name = *name
		}
		if desc != nil {
			t.Description = desc
		}
		if pub != nil {
			t.IsPublic = *pub
		}
		_, err = tx.Exec(ctx, "UPDATE volume_types SET name = ?, description = ?, is_public = ?, updated_at = ? WHERE id = ?",
			t.Name, t.Description, b2i(t.IsPublic), store.FormatTime(s.now()), t.ID)
		if errors.Is(err, store.ErrConflict) {
			return api.Conflict("Volume Type %s already exists.", t.Name)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return api.JSON(200, map[string]any{"volume_type": typeWriteView(r, t, true)}), nil
}

// deleteType is DELETE /types/{id} (admin): 202, unless it is the default
// or volumes use it.
func (s *Service) deleteType(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		t, err := getType(ctx, tx, caller(r), r.PathValue("id"), false)
		if err != nil {
			return err
		}
		if t.IsDefault {
			return api.BadRequest("Default volume type can not be deleted.")
		}
		var n int
		if err := tx.QueryRow(ctx, "SELECT COUNT(*) FROM volumes WHERE volume_type_id = ?", t.ID).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			// cinder/exception.py VolumeTypeInUse
			return api.BadRequest("Volume Type %s deletion is not allowed with volumes present with the type.", t.ID)
		}
		if _, err := tx.Exec(ctx, "DELETE FROM volume_type_projects WHERE type_id = ?", t.ID); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, "DELETE FROM volume_types WHERE id = ?", t.ID)
		return err
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(http.StatusAccepted), nil
}

// ---- Extra specs (cinder/api/contrib/types_extra_specs.py) ----

func (s *Service) visibleSpecs(r *http.Request) (*typeRow, map[string]string, error) {
	t, err := getType(r.Context(), s.db, caller(r), r.PathValue("id"), false)
	if err != nil {
		return nil, nil, err
	}
	return t, typeView(r, t)["extra_specs"].(map[string]string), nil
}

func (s *Service) listExtraSpecs(r *http.Request) (*api.Response, error) {
	_, specs, err := s.visibleSpecs(r)
	if err != nil {
		return nil, err
	}
	return api.JSON(200, map[string]any{"extra_specs": specs}), nil
}

func (s *Service) showExtraSpec(r *http.Request) (*api.Response, error) {
	t, specs, err := s.visibleSpecs(r)
	if err != nil {
		return nil, err
	}
	key := r.PathValue("key")
	v, ok := specs[key]
	if !ok {
		// cinder/exception.py VolumeTypeExtraSpecsNotFound
		return nil, api.NotFound("Volume Type %s has no extra specs with key %s.", t.ID, key)
	}
	return api.JSON(200, map[string]string{key: v}), nil
}

func (s *Service) changeSpecs(r *http.Request, f func(t *typeRow) error) error {
	ctx := r.Context()
	return s.db.Tx(ctx, func(tx *store.Tx) error {
		t, err := getType(ctx, tx, caller(r), r.PathValue("id"), false)
		if err != nil {
			return err
		}
		if err := f(t); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, "UPDATE volume_types SET extra_specs = ?, updated_at = ? WHERE id = ?",
			store.JSON(t.ExtraSpecs), store.FormatTime(s.now()), t.ID)
		return err
	})
}

func (s *Service) createExtraSpecs(r *http.Request) (*api.Response, error) {
	var outer map[string]json.RawMessage
	if err := api.DecodeJSON(r, &outer); err != nil {
		return nil, err
	}
	raw, ok := outer["extra_specs"]
	if !ok {
		return nil, api.BadRequest("Missing required element 'extra_specs' in request body.")
	}
	if isNull(raw) {
		return nil, api.BadRequest("Invalid input for field/attribute extra_specs. Value: None. None is not of type 'object'")
	}
	specs, err := parseMetadata("extra_specs", raw)
	if err != nil {
		return nil, err
	}
	if err := s.changeSpecs(r, func(t *typeRow) error {
		for k, v := range specs {
			t.ExtraSpecs[k] = v
		}
		return nil
	}); err != nil {
		return nil, err
	}
	return api.JSON(200, map[string]any{"extra_specs": specs}), nil
}

func (s *Service) updateExtraSpec(r *http.Request) (*api.Response, error) {
	var raw json.RawMessage
	if err := api.DecodeJSON(r, &raw); err != nil {
		return nil, err
	}
	specs, err := parseMetadata("extra_specs", raw)
	if err != nil {
		return nil, err
	}
	key := r.PathValue("key")
	if _, ok := specs[key]; !ok {
		return nil, api.BadRequest("Request body and URI mismatch")
	}
	if len(specs) > 1 {
		return nil, api.BadRequest("Request body contains too many items")
	}
	if err := s.changeSpecs(r, func(t *typeRow) error { t.ExtraSpecs[key] = specs[key]; return nil }); err != nil {
		return nil, err
	}
	return api.JSON(200, specs), nil
}

func (s *Service) deleteExtraSpec(r *http.Request) (*api.Response, error) {
	key := r.PathValue("key")
	if err := s.changeSpecs(r, func(t *typeRow) error {
		if _, ok := t.ExtraSpecs[key]; !ok {
			return api.NotFound("Volume Type %s has no extra specs with key %s.", t.ID, key)
		}
		delete(t.ExtraSpecs, key)
		return nil
	}); err != nil {
		return nil, err
	}
	return api.Empty(http.StatusAccepted), nil
}

// typeNames lists type names, for per-type quota keys.
func typeNames(ctx context.Context, q store.Querier) ([]string, error) {
	ts, err := loadTypes(ctx, q, "1 = 1")
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(ts))
	for _, t := range ts {
		out = append(out, t.Name)
	}
	sort.Strings(out)
	return out, nil
}
