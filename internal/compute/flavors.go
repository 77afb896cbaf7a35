package compute

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/google/uuid"

	"nimbus/internal/api"
	"nimbus/internal/flavorspec"
	"nimbus/internal/store"
)

const flavorColumns = `id, name, vcpus, ram, disk, ephemeral, swap, rxtx_factor, is_public, disabled,
	has_description, description, created_at`

func scanFlavor(row interface{ Scan(...any) error }) (*Flavor, error) {
	var f Flavor
	var public, disabled, hasDesc int
	var desc, created string
	if err := row.Scan(&f.ID, &f.Name, &f.VCPUs, &f.RAM, &f.Disk, &f.Ephemeral, &f.Swap, &f.RxTxFactor,
		&public, &disabled, &hasDesc, &desc, &created); err != nil {
		if store.IsNoRows(err) {
			return nil, store.ErrNotFound
		}
		return nil, err
	}
	f.IsPublic, f.Disabled = public != 0, disabled != 0
	if hasDesc != 0 {
		f.Description = &desc
	}
	f.CreatedAt = store.ParseTime(created)
	f.ExtraSpecs = map[string]string{}
	return &f, nil
}

// getFlavor loads a flavor by id with its extra specs; store.ErrNotFound
// when there is none.
func (s *Service) getFlavor(ctx context.Context, q store.Querier, id string) (*Flavor, error) {
	if !validText(id) {
		return nil, store.ErrNotFound // PostgreSQL would refuse to compare it
	}
	f, err := scanFlavor(q.QueryRow(ctx, "SELECT "+flavorColumns+" FROM compute_flavors WHERE id = ?", id))
	if err != nil {
		return nil, err
	}
	rows, err := q.Query(ctx, "SELECT spec_key, value FROM compute_flavor_extra_specs WHERE flavor_id = ?", id)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			return nil, err
		}
		f.ExtraSpecs[k] = v
	}
	return f, rows.Err()
}

// flavorAccessible reports whether a project may use a flavor (public, or
// private with the project on its access list).
func (s *Service) flavorAccessible(ctx context.Context, q store.Querier, f *Flavor, projectID string) (bool, error) {
	if f.IsPublic {
		return true, nil
	}
	var n int
	err := q.QueryRow(ctx, "SELECT COUNT(*) FROM compute_flavor_projects WHERE flavor_id = ? AND project_id = ?",
		f.ID, projectID).Scan(&n)
	return n > 0, err
}

// flavorNotFound is Nova's FlavorNotFound.
func flavorNotFound(id string) error { return api.NotFound("Flavor %s could not be found.", id) }

// visibleFlavor loads a flavor the caller may see: admins see every
// flavor, others public ones and private ones shared with their project.
func (s *Service) visibleFlavor(r *http.Request, id string) (*Flavor, error) {
	ctx := r.Context()
	f, err := s.getFlavor(ctx, s.db, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, flavorNotFound(id)
	}
	if err != nil {
		return nil, err
	}
	if !callerAdmin(r) {
		ok, err := s.flavorAccessible(ctx, s.db, f, api.CallerFrom(ctx).ProjectID)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, flavorNotFound(id)
		}
	}
	return f, nil
}

// flavorView renders a flavor as views/flavors.py does for the request's
// microversion.
func flavorView(r *http.Request, f *Flavor, detail bool) map[string]any {
	v := VersionFrom(r.Context())
	m := map[string]any{"id": f.ID, "name": f.Name, "links": resLinks(r, "flavors", f.ID)}
	if v.AtLeast(55) {
		if f.Description != nil {
			m["description"] = *f.Description
		} else {
			m["description"] = nil
		}
	}
	if !detail {
		return m
	}
	m["ram"] = f.RAM
	m["disk"] = f.Disk
	m["vcpus"] = f.VCPUs
	m["OS-FLV-EXT-DATA:ephemeral"] = f.Ephemeral
	m["os-flavor-access:is_public"] = f.IsPublic
	// Swap is "" when 0 before 2.75 (views/flavors.py _build_detail).
	if f.Swap == 0 && !v.AtLeast(75) {
		m["swap"] = ""
	} else {
		m["swap"] = f.Swap
	}
	if !v.AtLeast(102) {
		m["OS-FLV-DISABLED:disabled"] = f.Disabled
		m["rxtx_factor"] = f.RxTxFactor
	}
	if v.AtLeast(61) {
		specs := f.ExtraSpecs
		if specs == nil {
			specs = map[string]string{}
		}
		m["extra_specs"] = specs
	}
	return m
}

// flavorSortKeys maps Nova's flavor sort keys onto Flavor fields.
var flavorSortKeys = map[string]func(a, b *Flavor) int{
	"flavorid":     func(a, b *Flavor) int { return strings.Compare(a.ID, b.ID) },
	"id":           func(a, b *Flavor) int { return a.CreatedAt.Compare(b.CreatedAt) },
	"name":         func(a, b *Flavor) int { return strings.Compare(a.Name, b.Name) },
	"memory_mb":    func(a, b *Flavor) int { return cmp.Compare(a.RAM, b.RAM) },
	"vcpus":        func(a, b *Flavor) int { return cmp.Compare(a.VCPUs, b.VCPUs) },
	"root_gb":      func(a, b *Flavor) int { return cmp.Compare(a.Disk, b.Disk) },
	"ephemeral_gb": func(a, b *Flavor) int { return cmp.Compare(a.Ephemeral, b.Ephemeral) },
	"swap":         func(a, b *Flavor) int { return cmp.Compare(a.Swap, b.Swap) },
	"rxtx_factor":  func(a, b *Flavor) int { return cmp.Compare(a.RxTxFactor, b.RxTxFactor) },
	"created_at":   func(a, b *Flavor) int { return a.CreatedAt.Compare(b.CreatedAt) },
	"updated_at":   func(a, b *Flavor) int { return a.CreatedAt.Compare(b.CreatedAt) },
	"is_public":    func(a, b *Flavor) int { return cmp.Compare(b2int(a.IsPublic), b2int(b.IsPublic)) },
	"disabled":     func(a, b *Flavor) int { return cmp.Compare(b2int(a.Disabled), b2int(b.Disabled)) },
	"vcpu_weight":  func(a, b *Flavor) int { return 0 },
	"description": func(a, b *Flavor) int {
		return strings.Compare(derefStr(a.Description), derefStr(b.Description))
	},
}

func b2int(b bool) int {
	if b {
		return 1
	}
	return 0
}

func derefStr(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

var flavorQueryParams = []string{"is_public", "minRam", "minDisk", "limit", "marker", "sort_key", "sort_dir"}

func (s *Service) listFlavors(r *http.Request) (*api.Response, error) { return s.flavorList(r, false) }

func (s *Service) listFlavorsDetail(r *http.Request) (*api.Response, error) {
	return s.flavorList(r, true)
}

// flavorQuery is a flavor list's filters and order (flavors.py
// _get_flavors): is_public (nil for all), minRam, minDisk, sort_key and
// sort_dir.
type flavorQuery struct {
	isPublic        *bool
	minRAM, minDisk int
	less            func(a, b *Flavor) int
	sortDir         string
}

// parseFlavorQuery reads a flavor list's query: is_public absent means
// public (plus shared), "none" means all, for admins only
// (flavors.py _parse_is_public).
func parseFlavorQuery(q url.Values, admin bool) (flavorQuery, error) {
	var fq flavorQuery
	t := true
	fq.isPublic = &t
	if admin {
		if raw, ok := q["is_public"]; ok {
			switch {
			case strings.EqualFold(raw[0], "none"):
				fq.isPublic = nil
			default:
				b, ok := api.ParseBool(raw[0])
				if !ok {
					return fq, api.BadRequest("Invalid is_public filter [%s]", raw[0])
				}
				fq.isPublic = &b
			}
		}
	}
	for _, p := range []struct {
		name string
		dst  *int
	}{{"minRam", &fq.minRAM}, {"minDisk", &fq.minDisk}} {
		if raw, ok := q[p.name]; ok {
			n, err := atoiStrict(raw[0])
			if err != nil || n < 0 {
				return fq, api.BadRequest("Invalid %s filter [%s]", p.name, raw[0])
			}
			*p.dst = n
		}
	}
	var sortKey string
	sortKey, fq.sortDir = cmp.Or(q.Get("sort_key"), "flavorid"), cmp.Or(q.Get("sort_dir"), "asc")
	var ok bool
	if fq.less, ok = flavorSortKeys[sortKey]; !ok {
		return fq, api.BadRequest("Invalid input for query parameters sort_key. Value: %s. '%s' is not one of ['created_at', 'description', 'disabled', 'ephemeral_gb', 'flavorid', 'id', 'is_public', 'memory_mb', 'name', 'root_gb', 'rxtx_factor', 'swap', 'updated_at', 'vcpu_weight', 'vcpus']", sortKey, sortKey)
	}
	if fq.sortDir != "asc" && fq.sortDir != "desc" {
		return fq, api.BadRequest("Invalid input for query parameters sort_dir. Value: %s. '%s' is not one of ['asc', 'desc']", fq.sortDir, fq.sortDir)
	}
	return fq, nil
}

// sharedFlavors are the private flavors shared with c's project, by id.
func (s *Service) sharedFlavors(ctx context.Context, c *api.Caller) (map[string]bool, error) {
	shared := map[string]bool{}
	if c == nil || c.ProjectID == "" {
		return shared, nil
	}
	rows, err := s.db.Query(ctx, "SELECT flavor_id FROM compute_flavor_projects WHERE project_id = ?", c.ProjectID)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return nil, err
		}
		shared[id] = true
	}
	rows.Close()
	return shared, rows.Err()
}

// flavorList is flavors.py _get_flavors: filters, sorting and paging.
func (s *Service) flavorList(r *http.Request, detail bool) (*api.Response, error) {
	ctx := r.Context()
	q := r.URL.Query()
	if err := strictQuery(r, flavorQueryParams...); err != nil {
		return nil, err
	}
	limit, marker, err := resPage(r)
	if err != nil {
		return nil, err
	}
	admin := callerAdmin(r)
	fq, err := parseFlavorQuery(q, admin)
	if err != nil {
		return nil, err
	}
	isPublic, minRAM, minDisk, less, sortDir := fq.isPublic, fq.minRAM, fq.minDisk, fq.less, fq.sortDir
	all, err := s.allFlavors(ctx, s.db)
	if err != nil {
		return nil, err
	}
	shared, err := s.sharedFlavors(ctx, api.CallerFrom(ctx))
	if err != nil {
		return nil, err
	}
	var list []*Flavor
	for _, f := range all {
		if isPublic != nil {
			// A true filter also takes private flavors shared with the
			// caller's project (db/api/api.py _flavor_get_all_from_db).
			if f.IsPublic != *isPublic && !(*isPublic && shared[f.ID]) {
				continue
			}
		}
		if !admin && f.Disabled {
			continue
		}
		if f.RAM < minRAM || f.Disk < minDisk {
			continue
		}
		list = append(list, f)
	}
	slices.SortStableFunc(list, func(a, b *Flavor) int {
		c := less(a, b)
		if c == 0 {
			c = strings.Compare(a.ID, b.ID)
		}
		if sortDir == "desc" {
			c = -c
		}
		return c
	})
	if marker != "" {
		i := slices.IndexFunc(list, func(f *Flavor) bool { return f.ID == marker })
		if i < 0 {
			return nil, api.BadRequest("marker [%s] not found", marker)
		}
		list = list[i+1:]
	}
	if len(list) > limit {
		list = list[:limit]
	}
	out := make([]any, 0, len(list))
	for _, f := range list {
		out = append(out, flavorView(r, f, detail))
	}
	body := map[string]any{"flavors": out}
	if limit > 0 && len(list) == limit {
		body["flavors_links"] = resNextLink(r, list[len(list)-1].ID)
	}
	return api.JSON(http.StatusOK, body), nil
}

// atoiStrict parses a base-10 integer with an optional sign.
func atoiStrict(s string) (int, error) {
	var n int
	_, err := fmt.Sscanf(s, "%d", &n)
	if err != nil || fmt.Sprint(n) != strings.TrimPrefix(s, "+") {
		return 0, errors.New("not an integer")
	}
	return n, nil
}

// allFlavors loads every flavor with its extra specs.
func (s *Service) allFlavors(ctx context.Context, q store.Querier) ([]*Flavor, error) {
	rows, err := q.Query(ctx, "SELECT "+flavorColumns+" FROM compute_flavors")
	if err != nil {
		return nil, err
	}
	byID := map[string]*Flavor{}
	var list []*Flavor
	for rows.Next() {
		f, err := scanFlavor(rows)
		if err != nil {
			rows.Close()
			return nil, err
		}
		byID[f.ID] = f
		list = append(list, f)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	rows, err = q.Query(ctx, "SELECT flavor_id, spec_key, value FROM compute_flavor_extra_specs")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var id, k, v string
		if err := rows.Scan(&id, &k, &v); err != nil {
			return nil, err
		}
		if f := byID[id]; f != nil {
			f.ExtraSpecs[k] = v
		}
	}
	return list, rows.Err()
}

func (s *Service) showFlavor(r *http.Request) (*api.Response, error) {
	f, err := s.visibleFlavor(r, r.PathValue("id"))
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, map[string]any{"flavor": flavorView(r, f, true)}), nil
}

var flavorIDPattern = regexp.MustCompile(`^[a-zA-Z0-9. _-]+$`)

// validName is parameter_types.name: printable, no leading or trailing
// whitespace, 1 to 255 characters.
func validName(s string) bool {
	if s == "" || len([]rune(s)) > 255 || strings.TrimSpace(s) != s {
		return false
	}
	for _, c := range s {
		if !unicode.IsPrint(c) {
			return false
		}
	}
	return true
}

// createFlavor is flavor_manage.py _create: 200 with the flavor.
func (s *Service) createFlavor(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	v := VersionFrom(ctx)
	body, err := decodeWrapped(r, "flavor")
	if err != nil {
		return nil, err
	}
	allowed := []string{"name", "id", "ram", "vcpus", "disk", "OS-FLV-EXT-DATA:ephemeral", "swap",
		"rxtx_factor", "os-flavor-access:is_public"}
	if v.AtLeast(55) {
		allowed = append(allowed, "description")
	}
	if err := api.UnknownFields(body, allowed...); err != nil {
		return nil, err
	}
	for _, req := range []string{"name", "ram", "vcpus", "disk"} {
		if _, ok := body[req]; !ok {
			return nil, api.SchemaError("flavor", body, "'%s' is a required property", req)
		}
	}
	f := &Flavor{RxTxFactor: 1, IsPublic: true, ExtraSpecs: map[string]string{}, CreatedAt: s.now()}
	name, ok := rawString(body["name"])
	if !ok || !validName(name) {
		return nil, api.SchemaError("name", body["name"], "%s is not a valid name: it must be 1 to 255 printable characters without leading or trailing whitespace", api.PyRepr(body["name"]))
	}
	f.Name = name
	if raw, ok := body["id"]; ok && string(raw) != "null" {
		id, ok := rawString(raw)
		if !ok {
			// Nova accepts a number for the id and stores it as text.
			var n json.Number
			if json.Unmarshal(raw, &n) != nil {
				return nil, api.SchemaError("id", raw, "%s is not of type 'string', 'number', 'null'", api.PyRepr(raw))
			}
			id = n.String()
		}
		if id == "" || len(id) > 255 || strings.TrimSpace(id) != id || !flavorIDPattern.MatchString(id) {
			return nil, api.SchemaError("id", raw, "%s does not match '^(?! )[a-zA-Z0-9. _-]+(?<! )$'", id)
		}
		f.ID = id
	} else {
		f.ID = uuid.NewString()
	}
	if f.RAM, err = rawInt("ram", body["ram"], 1); err != nil {
		return nil, err
	}
	if f.VCPUs, err = rawInt("vcpus", body["vcpus"], 1); err != nil {
		return nil, err
	}
	if f.Disk, err = rawInt("disk", body["disk"], 0); err != nil {
		return nil, err
	}
	if raw, ok := body["OS-FLV-EXT-DATA:ephemeral"]; ok {
		if f.Ephemeral, err = rawInt("OS-FLV-EXT-DATA:ephemeral", raw, 0); err != nil {
			return nil, err
		}
	}
	if raw, ok := body["swap"]; ok {
		if f.Swap, err = rawInt("swap", raw, 0); err != nil {
			return nil, err
		}
	}
	if raw, ok := body["rxtx_factor"]; ok {
		var x float64
		if err := json.Unmarshal(raw, &x); err != nil {
			str, ok := rawString(raw)
			if !ok || json.Unmarshal([]byte(str), &x) != nil {
				return nil, api.SchemaError("rxtx_factor", raw, "%s is not of type 'number', 'string'", api.PyRepr(raw))
			}
		}
		if x <= 0 || x > 3.40282e+38 {
			return nil, api.SchemaError("rxtx_factor", raw, "%s is less than or equal to the minimum of 0", api.PyRepr(raw))
		}
		f.RxTxFactor = x
	}
	if raw, ok := body["os-flavor-access:is_public"]; ok {
		if f.IsPublic, err = rawBool("os-flavor-access:is_public", raw); err != nil {
			return nil, err
		}
	}
	if raw, ok := body["description"]; ok && string(raw) != "null" {
		d, ok := rawString(raw)
		if !ok || len([]rune(d)) > 65535 {
			return nil, api.SchemaError("description", raw, "%s is not of type 'string', 'null'", api.PyRepr(raw))
		}
		f.Description = &d
	}
	err = s.db.Tx(ctx, func(tx *store.Tx) error { return insertFlavor(ctx, tx, f) })
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, map[string]any{"flavor": flavorView(r, f, true)}), nil
}

// insertFlavor stores a new flavor; a taken id or name is Nova's 409.
func insertFlavor(ctx context.Context, tx *store.Tx, f *Flavor) error {
	var n int
	if err := tx.QueryRow(ctx, "SELECT COUNT(*) FROM compute_flavors WHERE id = ?", f.ID).Scan(&n); err != nil {
		return err
	}
	if n > 0 {
		return api.Conflict("Flavor with ID %s already exists.", f.ID)
	}
	if err := tx.QueryRow(ctx, "SELECT COUNT(*) FROM compute_flavors WHERE name = ?", f.Name).Scan(&n); err != nil {
		return err
	}
	if n > 0 {
		return api.Conflict("Flavor with name %s already exists.", f.Name)
	}
	now := store.FormatTime(f.CreatedAt)
	_, err := tx.Exec(ctx, `INSERT INTO compute_flavors (`+flavorColumns+`, updated_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		f.ID, f.Name, f.VCPUs, f.RAM, f.Disk, f.Ephemeral, f.Swap, f.RxTxFactor, b2int(f.IsPublic),
		b2int(f.Disabled), b2int(f.Description != nil), derefStr(f.Description), now, now)
	if errors.Is(err, store.ErrConflict) {
		return api.Conflict("Flavor with name %s already exists.", f.Name)
	}
	if err != nil {
		return err
	}
	for k, v := range f.ExtraSpecs {
		if _, err := tx.Exec(ctx, "INSERT INTO compute_flavor_extra_specs (flavor_id, spec_key, value) VALUES (?, ?, ?)",
			f.ID, k, v); err != nil {
			return err
		}
	}
	return nil
}

// updateFlavor is PUT /flavors/{id} (2.55): only the description changes.
func (s *Service) updateFlavor(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	if !VersionFrom(ctx).AtLeast(55) {
		return nil, api.NotFound("The resource could not be found.")
	}
	id := r.PathValue("id")
	body, err := decodeWrapped(r, "flavor")
	if err != nil {
		return nil, err
	}
	if err := api.UnknownFields(body, "description"); err != nil {
		return nil, err
	}
	raw, ok := body["description"]
	if !ok {
		return nil, api.SchemaError("flavor", body, "'description' is a required property")
	}
	var desc *string
	if string(raw) != "null" {
		d, ok := rawString(raw)
		if !ok || len([]rune(d)) > 65535 {
			return nil, api.SchemaError("description", raw, "%s is not of type 'string', 'null'", api.PyRepr(raw))
		}
		desc = &d
	}
	var f *Flavor
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		res, err := tx.Exec(ctx, "UPDATE compute_flavors SET has_description = ?, description = ?, updated_at = ? WHERE id = ?",
			b2int(desc != nil), derefStr(desc), store.FormatTime(s.now()), id)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return flavorNotFound(id)
		}
		f, err = s.getFlavor(ctx, tx, id)
		return err
	})
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, map[string]any{"flavor": flavorView(r, f, true)}), nil
}

// deleteFlavor answers 202 as flavor_manage.py does.
func (s *Service) deleteFlavor(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	id := r.PathValue("id")
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		found, err := deleteFlavorRows(ctx, tx, id)
		if err == nil && !found {
			return flavorNotFound(id)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(http.StatusAccepted), nil
}

// deleteFlavorRows deletes a flavor with its extra specs, access list and
// project-flavor row; found is false when there was no such flavor.
func deleteFlavorRows(ctx context.Context, tx *store.Tx, id string) (found bool, err error) {
	for _, q := range []string{"DELETE FROM compute_flavor_extra_specs WHERE flavor_id = ?",
		"DELETE FROM compute_flavor_projects WHERE flavor_id = ?", "DELETE FROM compute_project_flavors WHERE flavor_id = ?"} {
		if _, err := tx.Exec(ctx, q, id); err != nil {
			return false, err
		}
	}
	res, err := tx.Exec(ctx, "DELETE FROM compute_flavors WHERE id = ?", id)
	if err != nil {
		return false, err
	}
	n, _ := res.RowsAffected()
	return n > 0, nil
}

// Extra specs (flavors_extraspecs.py).

var specKeyPattern = regexp.MustCompile(`^[a-zA-Z0-9-_:. /]{1,255}$`)

// specValue reads an extra spec value: Nova takes strings, numbers and
// booleans and stores them as text.
func specValue(key string, raw json.RawMessage) (string, error) {
	if s, ok := rawString(raw); ok {
		if len([]rune(s)) > 255 {
			return "", api.SchemaError(key, raw, "'%s' is too long", s)
		}
		return s, nil
	}
	var b bool
	if json.Unmarshal(raw, &b) == nil {
		return map[bool]string{true: "True", false: "False"}[b], nil
	}
	var n json.Number
	if json.Unmarshal(raw, &n) == nil {
		return n.String(), nil
	}
	return "", api.SchemaError(key, raw, "%s is not of type 'string', 'number', 'boolean'", api.PyRepr(raw))
}

// validateSpecs checks keys and values and, from 2.86, the values of the
// extra specs Nimbus understands (nova/api/validation/extra_specs).
func validateSpecs(v Version, specs map[string]json.RawMessage) (map[string]string, error) {
	out := map[string]string{}
	for k, raw := range specs {
		if !specKeyPattern.MatchString(k) {
			return nil, api.BadRequest("Invalid input for field/attribute extra_specs. Value: %s. Additional properties are not allowed ('%s' was unexpected)", k, k)
		}
		val, err := specValue(k, raw)
		if err != nil {
			return nil, err
		}
		if v.AtLeast(86) {
			if err := validateKnownSpec(k, val); err != nil {
				return nil, err
			}
		}
		out[k] = val
	}
	return out, nil
}

func validateKnownSpec(k, val string) error {
	bad := func(detail string) error {
		return api.BadRequest("Validation failed; %s for %s.", detail, k)
	}
	switch k {
	case "hw:cpu_policy":
		if !slices.Contains([]string{"dedicated", "shared", "mixed"}, val) {
			return bad(fmt.Sprintf("'%s' is not one of ['dedicated', 'shared', 'mixed']", val))
		}
	case "pci_passthrough:alias":
		if _, err := flavorspec.ParseAlias(val); err != nil {
			return bad(fmt.Sprintf("'%s' is not a valid alias list: %v", val, err))
		}
	case "nimbus:disk_type":
		if val != "local" && val != "network" {
			return bad(fmt.Sprintf("'%s' is not one of ['local', 'network']", val))
		}
	case "nimbus:public_ipv4":
		if _, ok := api.ParseBool(val); !ok {
			return bad(fmt.Sprintf("'%s' is not a boolean", val))
		}
	}
	return nil
}

func (s *Service) listExtraSpecs(r *http.Request) (*api.Response, error) {
	f, err := s.visibleFlavor(r, r.PathValue("id"))
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, map[string]any{"extra_specs": f.ExtraSpecs}), nil
}

func (s *Service) showExtraSpec(r *http.Request) (*api.Response, error) {
	f, err := s.visibleFlavor(r, r.PathValue("id"))
	if err != nil {
		return nil, err
	}
	key := r.PathValue("key")
	val, ok := f.ExtraSpecs[key]
	if !ok {
		return nil, api.NotFound("Flavor %s has no extra specs with key %s.", f.ID, key)
	}
	return api.JSON(http.StatusOK, map[string]string{key: val}), nil
}

// createExtraSpecs adds or replaces the given specs and answers them.
func (s *Service) createExtraSpecs(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	id := r.PathValue("id")
	body, err := decodeWrapped(r, "extra_specs")
	if err != nil {
		return nil, err
	}
	specs, err := validateSpecs(VersionFrom(ctx), body)
	if err != nil {
		return nil, err
	}
	if err := s.putSpecs(ctx, id, specs); err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, map[string]any{"extra_specs": specs}), nil
}

// updateExtraSpec is PUT /os-extra_specs/{key} with {"<key>": "<value>"}.
func (s *Service) updateExtraSpec(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	id, key := r.PathValue("id"), r.PathValue("key")
	var body map[string]json.RawMessage
	if err := api.DecodeJSON(r, &body); err != nil {
		return nil, err
	}
	if len(body) > 1 {
		return nil, api.BadRequest("Request body contains too many items")
	}
	if _, ok := body[key]; !ok {
		return nil, api.BadRequest("Request body and URI mismatch")
	}
	specs, err := validateSpecs(VersionFrom(ctx), body)
	if err != nil {
		return nil, err
	}
	if err := s.putSpecs(ctx, id, specs); err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, specs), nil
}

func (s *Service) putSpecs(ctx context.Context, id string, specs map[string]string) error {
	return s.db.Tx(ctx, func(tx *store.Tx) error {
		var n int
		if err := tx.QueryRow(ctx, "SELECT COUNT(*) FROM compute_flavors WHERE id = ?", id).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return flavorNotFound(id)
		}
		for k, v := range specs {
			if _, err := tx.Exec(ctx, "DELETE FROM compute_flavor_extra_specs WHERE flavor_id = ? AND spec_key = ?", id, k); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "INSERT INTO compute_flavor_extra_specs (flavor_id, spec_key, value) VALUES (?, ?, ?)",
				id, k, v); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, "UPDATE compute_flavors SET updated_at = ? WHERE id = ?", store.FormatTime(time.Now()), id)
		return err
	})
}

// deleteExtraSpec answers 200 with no body, as flavors_extraspecs.py does.
func (s *Service) deleteExtraSpec(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	id, key := r.PathValue("id"), r.PathValue("key")
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		var n int
		if err := tx.QueryRow(ctx, "SELECT COUNT(*) FROM compute_flavors WHERE id = ?", id).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			return flavorNotFound(id)
		}
		res, err := tx.Exec(ctx, "DELETE FROM compute_flavor_extra_specs WHERE flavor_id = ? AND spec_key = ?", id, key)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return api.NotFound("Flavor %s has no extra specs with key %s.", id, key)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(http.StatusOK), nil
}

// Flavor access (flavor_access.py).

func (s *Service) flavorAccessList(ctx context.Context, q store.Querier, id string) ([]map[string]string, error) {
	rows, err := q.Query(ctx, "SELECT project_id FROM compute_flavor_projects WHERE flavor_id = ? ORDER BY project_id", id)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []map[string]string{}
	for rows.Next() {
		var p string
		if err := rows.Scan(&p); err != nil {
			return nil, err
		}
		out = append(out, map[string]string{"flavor_id": id, "tenant_id": p})
	}
	return out, rows.Err()
}

func (s *Service) listFlavorAccess(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	id := r.PathValue("id")
	f, err := s.getFlavor(ctx, s.db, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, flavorNotFound(id)
	}
	if err != nil {
		return nil, err
	}
	if f.IsPublic {
		return nil, api.NotFound("Access list not available for public flavors.")
	}
	list, err := s.flavorAccessList(ctx, s.db, id)
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, map[string]any{"flavor_access": list}), nil
}

// flavorAction is POST /flavors/{id}/action: addTenantAccess and
// removeTenantAccess, each answering the new access list with 200.
func (s *Service) flavorAction(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	id := r.PathValue("id")
	var top map[string]json.RawMessage
	if err := api.DecodeJSON(r, &top); err != nil {
		return nil, err
	}
	var action string
	var inner json.RawMessage
	for k, v := range top {
		if k == "addTenantAccess" || k == "removeTenantAccess" {
			action, inner = k, v
		}
	}
	if !callerAdmin(r) {
		rule := "add_tenant_access"
		if action == "removeTenantAccess" {
			rule = "remove_tenant_access"
		}
		return nil, api.PolicyForbidden("os_compute_api:os-flavor-access:" + rule)
	}
	if action == "" || len(top) != 1 {
		return nil, api.BadRequest("There is no such action: %s", strings.Join(mapKeys(top), ","))
	}
	var args map[string]json.RawMessage
	if err := json.Unmarshal(inner, &args); err != nil || args == nil {
		return nil, api.SchemaError(action, inner, "%s is not of type 'object'", api.PyRepr(inner))
	}
	if err := api.UnknownFields(args, "tenant"); err != nil {
		return nil, err
	}
	raw, ok := args["tenant"]
	if !ok {
		return nil, api.SchemaError(action, inner, "'tenant' is a required property")
	}
	tenant, ok := rawString(raw)
	if !ok || tenant == "" || len(tenant) > 255 {
		return nil, api.SchemaError("tenant", raw, "%s is not a valid project id", api.PyRepr(raw))
	}
	if action == "addTenantAccess" {
		if err := s.verifyProject(ctx, tenant); err != nil {
			return nil, err
		}
	}
	var list []map[string]string
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		f, err := s.getFlavor(ctx, tx, id)
		if errors.Is(err, store.ErrNotFound) {
			return flavorNotFound(id)
		}
		if err != nil {
			return err
		}
		if action == "addTenantAccess" {
			if f.IsPublic {
				return api.Conflict("Can not add access to a public flavor.")
			}
			_, err := tx.Exec(ctx, "INSERT INTO compute_flavor_projects (flavor_id, project_id) VALUES (?, ?)", id, tenant)
			if errors.Is(err, store.ErrConflict) {
				return api.Conflict("Flavor access already exists for flavor %s and project %s combination.", id, tenant)
			}
			if err != nil {
				return err
			}
		} else {
			res, err := tx.Exec(ctx, "DELETE FROM compute_flavor_projects WHERE flavor_id = ? AND project_id = ?", id, tenant)
			if err != nil {
				return err
			}
			if n, _ := res.RowsAffected(); n == 0 {
				return api.NotFound("Flavor access not found for %s / %s combination.", id, tenant)
			}
		}
		list, err = s.flavorAccessList(ctx, tx, id)
		return err
	})
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, map[string]any{"flavor_access": list}), nil
}

func mapKeys(m map[string]json.RawMessage) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// defaultFlavors is the catalogue a new install gets: Tempest's small m1
// flavors, then the configurator's dedicated-CPU sizes for each boot disk
// type with and without a public IPv4, then GPU flavors. The ids are stable
// so that scripts and Tempest configs can name them.
func defaultFlavors() []*Flavor {
	var out []*Flavor
	add := func(id string, vcpus, ramMB, disk int, specs map[string]string, desc string) {
		d := desc
		out = append(out, &Flavor{ID: id, Name: id, VCPUs: vcpus, RAM: ramMB, Disk: disk, RxTxFactor: 1,
			IsPublic: true, ExtraSpecs: specs, Description: &d})
	}
	for _, m := range []struct {
		id, name             string
		vcpus, ramMB, diskGB int
	}{{"1", "m1.tiny", 1, 512, 1}, {"2", "m1.small", 1, 2048, 20}, {"3", "m1.medium", 2, 4096, 40}} {
		d := "Small shared flavor for tests"
		out = append(out, &Flavor{ID: m.id, Name: m.name, VCPUs: m.vcpus, RAM: m.ramMB, Disk: m.diskGB,
			RxTxFactor: 1, IsPublic: true, ExtraSpecs: map[string]string{}, Description: &d})
	}
	for _, size := range []struct{ vcpus, ramGB, diskGB int }{
		{1, 2, 20}, {2, 4, 40}, {4, 8, 80}, {8, 16, 160}, {16, 32, 320}, {32, 64, 640},
	} {
		for _, disk := range []string{"local", "network"} {
			for _, ipv4 := range []bool{false, true} {
				id := fmt.Sprintf("d%d.%dg.%s", size.vcpus, size.ramGB, disk)
				desc := fmt.Sprintf("%d dedicated vCPU, %d GB RAM, %d GB %s disk", size.vcpus, size.ramGB, size.diskGB, disk)
				if ipv4 {
					id += ".ipv4"
					desc += ", public IPv4"
				}
				add(id, size.vcpus, size.ramGB*1024, size.diskGB, map[string]string{
					"hw:cpu_policy":      "dedicated",
					"nimbus:disk_type":   disk,
					"nimbus:public_ipv4": fmt.Sprint(ipv4),
				}, desc)
			}
		}
	}
	// GPU flavors: nimbus:gpu_model is the driver's GPU model string, the
	// alias is what pci_passthrough:alias names (nova pci-passthrough.rst).
	for _, g := range []struct {
		alias, model        string
		count, vcpus, ramGB int
		diskGB              int
	}{
		{"a100-80gb", "A100 80GB", 1, 16, 120, 200}, {"a100-80gb", "A100 80GB", 2, 32, 240, 400},
		{"a100-80gb", "A100 80GB", 4, 64, 480, 800}, {"l4", "L4", 1, 8, 48, 100}, {"l4", "L4", 2, 16, 96, 200},
	} {
		id := fmt.Sprintf("g.%s.x%d", g.alias, g.count)
		add(id, g.vcpus, g.ramGB*1024, g.diskGB, map[string]string{
			"hw:cpu_policy":         "dedicated",
			"nimbus:disk_type":      "local",
			"nimbus:public_ipv4":    "true",
			"nimbus:gpu_model":      g.model,
			"pci_passthrough:alias": fmt.Sprintf("%s:%d", g.alias, g.count),
		}, fmt.Sprintf("%d x NVIDIA %s, %d dedicated vCPU, %d GB RAM, %d GB local disk, public IPv4",
			g.count, g.model, g.vcpus, g.ramGB, g.diskGB))
	}
	return out
}

// ensureDefaultFlavors adds each default flavor once: compute_seeded
// remembers which were added, so a flavor the operator deleted or renamed
// stays as the operator left it across restarts.
func (s *Service) ensureDefaultFlavors(ctx context.Context) error {
	return s.db.Tx(ctx, func(tx *store.Tx) error {
		for _, f := range defaultFlavors() {
			var seeded, taken int
			if err := tx.QueryRow(ctx, "SELECT COUNT(*) FROM compute_seeded WHERE kind = 'flavor' AND name = ?", f.ID).Scan(&seeded); err != nil {
				return err
			}
			if seeded > 0 {
				continue
			}
			if err := tx.QueryRow(ctx, "SELECT COUNT(*) FROM compute_flavors WHERE id = ? OR name = ?", f.ID, f.Name).Scan(&taken); err != nil {
				return err
			}
			if taken == 0 {
				f.CreatedAt = s.now()
				if err := insertFlavor(ctx, tx, f); err != nil {
					var e *api.Error
					if errors.As(err, &e) && e.Status == http.StatusConflict {
						err = store.ErrConflict // another controller just added it
					}
					return fmt.Errorf("compute: default flavor %s: %w", f.ID, err)
				}
			}
			if _, err := tx.Exec(ctx, "INSERT INTO compute_seeded (kind, name) VALUES ('flavor', ?)", f.ID); err != nil {
				return err
			}
		}
		return nil
	})
}
