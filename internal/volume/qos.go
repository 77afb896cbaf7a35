package volume

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// QoS specs (cinder/api/contrib/qos_specs_manage.py, cinder/volume/qos_specs.py):
// named sets of throttle limits an admin associates with volume types; a
// volume gets its type's limits, which QEMU enforces as a throttle group
// when the volume is attached. As in Cinder a spec may hold any key (Tempest
// sets one of its own); the throttle keys QEMU's groups take are the ones
// enforced, and their values and combinations are checked so that a spec
// never holds a limit QEMU would refuse.

// qosConsumers are Cinder's QoSConsumerValues; back-end is its default.
var qosConsumers = []string{"front-end", "back-end", "both"}

const defaultConsumer = "back-end"

// Rate is one throttle: Avg per second sustained, bursts up to Max per
// second lasting at most MaxLength seconds (QEMU's throttle bucket avg, max
// and burst_length; 0: none).
type Rate struct {
	Avg, Max, MaxLength int64
}

// Throttle is the QoS of a volume, every limit 0 when unlimited. QEMU takes
// total limits or read and write ones of the same unit, never both.
type Throttle struct {
	ReadIOPS, WriteIOPS, TotalIOPS    Rate
	ReadBytes, WriteBytes, TotalBytes Rate
}

// IsZero reports whether the throttle limits nothing.
func (t Throttle) IsZero() bool { return t == Throttle{} }

// rates maps the spec keys' stems to the throttle's rates.
func (t *Throttle) rates() map[string]*Rate {
	return map[string]*Rate{
		"read_iops_sec": &t.ReadIOPS, "write_iops_sec": &t.WriteIOPS, "total_iops_sec": &t.TotalIOPS,
		"read_bytes_sec": &t.ReadBytes, "write_bytes_sec": &t.WriteBytes, "total_bytes_sec": &t.TotalBytes,
	}
}

// qosStems are the throttle keys' stems, in a fixed order for the checks.
var qosStems = []string{"read_iops_sec", "write_iops_sec", "total_iops_sec", "read_bytes_sec", "write_bytes_sec", "total_bytes_sec"}

// maxThrottle is QEMU's THROTTLE_VALUE_MAX.
const maxThrottle = 1_000_000_000_000_000

func invalidQoS(format string, args ...any) *api.Error {
	return api.BadRequest("Invalid qos specs: "+format, args...)
}

func errQoSNotFound(id string) *api.Error { return api.NotFound("No such QoS spec %s.", id) }

// parseThrottle reads and checks a spec's throttle keys: each a positive
// integer, combined as QEMU allows. Other keys are left alone.
func parseThrottle(specs map[string]string) (Throttle, error) {
	var t Throttle
	rates := t.rates()
	for k, v := range specs {
		stem, suffix := k, ""
		for _, s := range []string{"_max_length", "_max"} {
			if strings.HasSuffix(k, s) {
				stem, suffix = strings.TrimSuffix(k, s), s
				break
			}
		}
		r, ok := rates[stem]
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 || n > maxThrottle {
			return t, invalidQoS("%s must be a positive integer of at most %d, not '%s'.", k, int64(maxThrottle), v)
		}
		switch suffix {
		case "":
			r.Avg = n
		case "_max":
			r.Max = n
		default:
			r.MaxLength = n
		}
	}
	for _, stem := range qosStems {
		r := rates[stem]
		if r.Max > 0 && r.Avg == 0 {
			return t, invalidQoS("%s_max needs %s.", stem, stem)
		}
		if r.Max > 0 && r.Max < r.Avg {
			return t, invalidQoS("%s_max cannot be lower than %s.", stem, stem)
		}
		if r.MaxLength > 0 && r.Max == 0 {
			return t, invalidQoS("%s_max_length needs %s_max.", stem, stem)
		}
	}
	for _, unit := range []string{"iops", "bytes"} {
		total := rates["total_"+unit+"_sec"]
		if *total != (Rate{}) && (*rates["read_"+unit+"_sec"] != (Rate{}) || *rates["write_"+unit+"_sec"] != (Rate{})) {
			return t, invalidQoS("total_%s_sec cannot be set together with read_%s_sec or write_%s_sec.", unit, unit, unit)
		}
	}
	return t, nil
}

// ---- Rows ----

type qosRow struct {
	ID, Name, Consumer   string
	Specs                map[string]string
	CreatedAt, UpdatedAt string
}

const qosColumns = "id, name, consumer, specs, created_at, updated_at"

func scanQoS(sc interface{ Scan(...any) error }) (*qosRow, error) {
	q := &qosRow{Specs: map[string]string{}}
	var specs string
	if err := sc.Scan(&q.ID, &q.Name, &q.Consumer, &specs, &q.CreatedAt, &q.UpdatedAt); err != nil {
		return nil, err
	}
	return q, store.FromJSON(specs, &q.Specs)
}

func getQoS(ctx context.Context, q store.Querier, id string) (*qosRow, error) {
	row, err := scanQoS(q.QueryRow(ctx, "SELECT "+qosColumns+" FROM volume_qos_specs WHERE id = ?", id))
	if store.IsNoRows(err) {
		return nil, errQoSNotFound(id)
	}
	return row, err
}

func saveQoS(ctx context.Context, q store.Querier, row *qosRow) error {
	_, err := q.Exec(ctx, "UPDATE volume_qos_specs SET consumer = ?, specs = ?, updated_at = ? WHERE id = ?",
		row.Consumer, store.JSON(row.Specs), row.UpdatedAt, row.ID)
	return err
}

// insertQoS adds a spec, Cinder's QoSSpecsExists (409) when the name is taken.
func insertQoS(ctx context.Context, q store.Querier, row *qosRow) error {
	_, err := q.Exec(ctx, "INSERT INTO volume_qos_specs ("+qosColumns+") VALUES (?, ?, ?, ?, ?, ?)",
		row.ID, row.Name, row.Consumer, store.JSON(row.Specs), row.CreatedAt, row.UpdatedAt)
	if errors.Is(err, store.ErrConflict) {
		return api.Conflict("QoS Specs %s already exists.", row.Name)
	}
	return err
}

// qosView is cinder/api/views/qos_specs.py detail.
func qosView(r *http.Request, q *qosRow) map[string]any {
	return map[string]any{"qos_specs": qosItem(q), "links": links(r, "qos-specs", q.ID)}
}

func qosItem(q *qosRow) map[string]any {
	return map[string]any{"id": q.ID, "name": q.Name, "consumer": q.Consumer, "specs": q.Specs}
}

// ---- Request values ----

// specValue reads a spec value: a string, or a number kept as written.
func specValue(key string, raw json.RawMessage) (string, error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var n json.Number
	if json.Unmarshal(raw, &n) == nil {
		return n.String(), nil
	}
	return "", invalidQoS("%s must be a positive integer of at most %d, not '%s'.", key, int64(maxThrottle), raw)
}

// consumerValue checks a consumer (cinder/objects/qos_specs.py __setattr__).
func consumerValue(raw json.RawMessage) (string, error) {
	var c string
	if json.Unmarshal(raw, &c) == nil {
		for _, ok := range qosConsumers {
			if c == ok {
				return c, nil
			}
		}
	}
	return "", invalidQoS("Valid consumer of QoS specs are: ['front-end', 'back-end', 'both']")
}

// readSpecs splits a body's keys into the consumer (nil when absent) and
// the spec's other keys, skipping skip (the name of a create).
func readSpecs(b body, skip string) (*string, map[string]string, error) {
	var consumer *string
	specs := map[string]string{}
	for k, raw := range b {
		switch k {
		case skip:
		case "consumer":
			c, err := consumerValue(raw)
			if err != nil {
				return nil, nil, err
			}
			consumer = &c
		default:
			if n := len([]rune(k)); n < 1 || n > 255 {
				return nil, nil, invalidQoS("keys must be 1 to 255 characters.")
			}
			v, err := specValue(k, raw)
			if err != nil {
				return nil, nil, err
			}
			specs[k] = v
		}
	}
	return consumer, specs, nil
}

// ---- Handlers ----

// qosSortKeys are the list's sort keys (cinder/api/common.py get_sort_params).
var qosSortKeys = map[string]func(a, b *qosRow) int{
	"id":         func(a, b *qosRow) int { return strings.Compare(a.ID, b.ID) },
	"name":       func(a, b *qosRow) int { return strings.Compare(a.Name, b.Name) },
	"consumer":   func(a, b *qosRow) int { return strings.Compare(a.Consumer, b.Consumer) },
	"created_at": func(a, b *qosRow) int { return strings.Compare(a.CreatedAt, b.CreatedAt) },
	"updated_at": func(a, b *qosRow) int { return strings.Compare(a.UpdatedAt, b.UpdatedAt) },
}

// listQoS is GET /qos-specs (admin): filters id, name and consumer, sort,
// limit, marker and offset, with qos_specs_links when more follow. There
// are few specs, so the page is cut from all of them.
func (s *Service) listQoS(r *http.Request) (*api.Response, error) {
	q := r.URL.Query()
	limit, offset, err := pageSize(q)
	if err != nil {
		return nil, err
	}
	rows, err := s.db.Query(r.Context(), "SELECT "+qosColumns+" FROM volume_qos_specs")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var all []*qosRow
	for rows.Next() {
		row, err := scanQoS(rows)
		if err != nil {
			return nil, err
		}
		if qosMatches(q, row) {
			all = append(all, row)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if err := sortQoS(all, q); err != nil {
		return nil, err
	}
	if m := q.Get("marker"); m != "" {
		i := 0
		for i < len(all) && all[i].ID != m {
			i++
		}
		if i == len(all) {
			return nil, api.NotFound("Marker %s could not be found.", m)
		}
		all = all[i+1:]
	}
	all = all[min(offset, len(all)):]
	page := all[:min(limit, len(all))]
	items := make([]map[string]any, 0, len(page))
	for _, row := range page {
		items = append(items, qosItem(row))
	}
	out := map[string]any{"qos_specs": items}
	if len(page) > 0 && len(all) > len(page) {
		out["qos_specs_links"] = nextLink(r, q, "/qos-specs", limit, page[len(page)-1].ID)
	}
	return api.JSON(200, out), nil
}

func qosMatches(q url.Values, row *qosRow) bool {
	for k, v := range map[string]string{"id": row.ID, "name": row.Name, "consumer": row.Consumer} {
		if want, ok := q[k]; ok && want[0] != v {
			return false
		}
	}
	return true
}

// sortQoS orders specs by sort=key[:dir],… or sort_key/sort_dir
// (cinder/api/common.py get_sort_params), created_at desc by default, the
// id desc last.
func sortQoS(all []*qosRow, q url.Values) error {
	var keys, dirs []string
	if s := q.Get("sort"); s != "" {
		for _, part := range strings.Split(s, ",") {
			k, d, _ := strings.Cut(strings.TrimSpace(part), ":")
			keys, dirs = append(keys, k), append(dirs, d)
		}
	} else if keys, dirs = q["sort_key"], q["sort_dir"]; len(keys) == 0 {
		keys = []string{"created_at"}
	}
	desc := make([]bool, len(keys))
	for i, k := range keys {
		if qosSortKeys[k] == nil {
			return invalidInput("Invalid sort key %s", k)
		}
		d := "desc"
		if i < len(dirs) && dirs[i] != "" {
			d = strings.ToLower(dirs[i])
		}
		if d != "asc" && d != "desc" {
			return invalidInput("Unknown sort direction, must be 'desc' or 'asc'")
		}
		desc[i] = d == "desc"
	}
	sort.SliceStable(all, func(i, j int) bool {
		for k, n := range keys {
			c := qosSortKeys[n](all[i], all[j])
			if desc[k] {
				c = -c
			}
			if c != 0 {
				return c < 0
			}
		}
		return all[i].ID > all[j].ID
	})
	return nil
}

// createQoS is POST /qos-specs (admin): {"qos_specs": {"name", "consumer",
// key: value, …}}, 200 with the spec.
func (s *Service) createQoS(r *http.Request) (*api.Response, error) {
	var outer map[string]json.RawMessage
	if err := api.DecodeJSON(r, &outer); err != nil {
		return nil, err
	}
	if err := api.UnknownFields(outer, "qos_specs"); err != nil {
		return nil, err
	}
	b, err := inner(outer, "qos_specs")
	if err != nil {
		return nil, err
	}
	if _, ok := b["name"]; !ok {
		return nil, api.BadRequest("Invalid input for field/attribute qos_specs. 'name' is a required property")
	}
	name, err := b.optString("name", 0)
	if err != nil {
		return nil, err
	}
	if name == nil || strings.TrimSpace(*name) == "" || len([]rune(strings.TrimSpace(*name))) > 255 {
		return nil, api.BadRequest("Invalid input for field/attribute name. The 'name' can not be empty or greater than 255 characters.")
	}
	consumer, specs, err := readSpecs(b, "name")
	if err != nil {
		return nil, err
	}
	if _, err := parseThrottle(specs); err != nil {
		return nil, err
	}
	now := store.FormatTime(s.now())
	row := &qosRow{ID: newID(), Name: strings.TrimSpace(*name), Consumer: defaultConsumer, Specs: specs, CreatedAt: now, UpdatedAt: now}
	if consumer != nil {
		row.Consumer = *consumer
	}
	if err := s.db.Tx(r.Context(), func(tx *store.Tx) error { return insertQoS(r.Context(), tx, row) }); err != nil {
		return nil, err
	}
	return api.JSON(200, qosView(r, row)), nil
}

func (s *Service) showQoS(r *http.Request) (*api.Response, error) {
	row, err := getQoS(r.Context(), s.db, r.PathValue("id"))
	if err != nil {
		return nil, err
	}
	return api.JSON(200, qosView(r, row)), nil
}

// updateQoS is PUT /qos-specs/{id} (admin): sets the keys given (and the
// consumer), answering the request's body as Cinder does.
func (s *Service) updateQoS(r *http.Request) (*api.Response, error) {
	var outer map[string]json.RawMessage
	if err := api.DecodeJSON(r, &outer); err != nil {
		return nil, err
	}
	if err := api.UnknownFields(outer, "qos_specs"); err != nil {
		return nil, err
	}
	b, err := inner(outer, "qos_specs")
	if err != nil {
		return nil, err
	}
	consumer, specs, err := readSpecs(b, "")
	if err != nil {
		return nil, err
	}
	err = s.changeQoS(r, func(row *qosRow) error {
		if consumer != nil {
			row.Consumer = *consumer
		}
		for k, v := range specs {
			row.Specs[k] = v
		}
		_, err := parseThrottle(row.Specs)
		return err
	})
	if err != nil {
		return nil, err
	}
	return api.JSON(200, map[string]any{"qos_specs": b}), nil
}

// changeQoS applies change to the spec of the path in one transaction.
func (s *Service) changeQoS(r *http.Request, change func(*qosRow) error) error {
	ctx := r.Context()
	return s.db.Tx(ctx, func(tx *store.Tx) error {
		row, err := getQoS(ctx, tx, r.PathValue("id"))
		if err != nil {
			return err
		}
		if err := change(row); err != nil {
			return err
		}
		row.UpdatedAt = store.FormatTime(s.now())
		return saveQoS(ctx, tx, row)
	})
}

// deleteQoSKeys is PUT /qos-specs/{id}/delete_keys {"keys": [...]}: 202;
// a key the spec lacks is Cinder's QoSSpecsKeyNotFound (404) and nothing
// is deleted.
func (s *Service) deleteQoSKeys(r *http.Request) (*api.Response, error) {
	var outer map[string]json.RawMessage
	if err := api.DecodeJSON(r, &outer); err != nil {
		return nil, err
	}
	if err := api.UnknownFields(outer, "keys"); err != nil {
		return nil, err
	}
	raw, ok := outer["keys"]
	if !ok {
		return nil, api.BadRequest("Invalid input for field/attribute body. 'keys' is a required property")
	}
	var keys []string
	if err := json.Unmarshal(raw, &keys); err != nil {
		return nil, api.BadRequest("Invalid input for field/attribute keys. Value: %s. %s is not of type 'array' of strings", raw, raw)
	}
	err := s.changeQoS(r, func(row *qosRow) error {
		for _, k := range keys {
			if _, ok := row.Specs[k]; !ok {
				return api.NotFound("QoS spec %s has no spec with key %s.", row.ID, k)
			}
			delete(row.Specs, k)
		}
		_, err := parseThrottle(row.Specs)
		return err
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(http.StatusAccepted), nil
}

// deleteQoS is DELETE /qos-specs/{id}[?force=bool] (admin): 202; a spec
// types still use needs force, which disassociates them.
func (s *Service) deleteQoS(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	force := false
	if v := r.URL.Query().Get("force"); v != "" {
		var ok bool
		if force, ok = api.ParseBool(v); !ok {
			return nil, api.BadRequest("Value '%s' for 'force' is not a boolean.", v)
		}
	}
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		row, err := getQoS(ctx, tx, r.PathValue("id"))
		if err != nil {
			return err
		}
		var n int
		if err := tx.QueryRow(ctx, "SELECT COUNT(*) FROM volume_types WHERE qos_specs_id = ?", row.ID).Scan(&n); err != nil {
			return err
		}
		if n > 0 && !force {
			return api.BadRequest("Qos specs still in use.")
		}
		if _, err := tx.Exec(ctx, "UPDATE volume_types SET qos_specs_id = NULL WHERE qos_specs_id = ?", row.ID); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, "DELETE FROM volume_qos_specs WHERE id = ?", row.ID)
		return err
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(http.StatusAccepted), nil
}

// qosAssociations is GET /qos-specs/{id}/associations: the types using it.
func (s *Service) qosAssociations(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	row, err := getQoS(ctx, s.db, r.PathValue("id"))
	if err != nil {
		return nil, err
	}
	ts, err := loadTypes(ctx, s.db, "qos_specs_id = ?", row.ID)
	if err != nil {
		return nil, err
	}
	out := make([]map[string]string, 0, len(ts))
	for _, t := range ts {
		out = append(out, map[string]string{"association_type": "volume_type", "name": t.Name, "id": t.ID})
	}
	return api.JSON(200, map[string]any{"qos_associations": out}), nil
}

// associateQoS is GET /qos-specs/{id}/associate?vol_type_id=: 202; a type
// has at most one spec (cinder/volume/qos_specs.py associate_qos_with_type).
func (s *Service) associateQoS(r *http.Request) (*api.Response, error) {
	return s.association(r, func(ctx context.Context, tx *store.Tx, row *qosRow, t *typeRow) error {
		if t.QoSSpecsID != nil && *t.QoSSpecsID != row.ID {
			return api.BadRequest("Invalid volume type: Type %s is already associated with another qos specs: %s", t.ID, *t.QoSSpecsID)
		}
		_, err := tx.Exec(ctx, "UPDATE volume_types SET qos_specs_id = ? WHERE id = ?", row.ID, t.ID)
		return err
	})
}

// disassociateQoS is GET /qos-specs/{id}/disassociate?vol_type_id=: 202.
func (s *Service) disassociateQoS(r *http.Request) (*api.Response, error) {
	return s.association(r, func(ctx context.Context, tx *store.Tx, row *qosRow, t *typeRow) error {
		_, err := tx.Exec(ctx, "UPDATE volume_types SET qos_specs_id = NULL WHERE id = ? AND qos_specs_id = ?", t.ID, row.ID)
		return err
	})
}

// association checks the spec and the type of an (dis)associate call and
// changes them in one transaction.
func (s *Service) association(r *http.Request, change func(context.Context, *store.Tx, *qosRow, *typeRow) error) (*api.Response, error) {
	ctx := r.Context()
	typeID := r.URL.Query().Get("vol_type_id")
	if typeID == "" {
		return nil, api.BadRequest("Volume Type id must not be None.")
	}
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		row, err := getQoS(ctx, tx, r.PathValue("id"))
		if err != nil {
			return err
		}
		t, err := getType(ctx, tx, caller(r), typeID, false)
		if err != nil {
			return err
		}
		return change(ctx, tx, row, t)
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(http.StatusAccepted), nil
}

// disassociateAllQoS is GET /qos-specs/{id}/disassociate_all: 202.
func (s *Service) disassociateAllQoS(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		row, err := getQoS(ctx, tx, r.PathValue("id"))
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, "UPDATE volume_types SET qos_specs_id = NULL WHERE qos_specs_id = ?", row.ID)
		return err
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(http.StatusAccepted), nil
}

// ---- The network type's default, and what attach asks ----

// networkQoS is the default type's spec (PRODUCT.md "Disk types": network
// disks read 70,000 and write 60,000 IOPS), enforced by QEMU in the guest's
// front end.
var networkQoS = map[string]string{"read_iops_sec": "70000", "write_iops_sec": "60000"}

const networkQoSSetting = "network_qos_bootstrapped"

// bootstrapQoS gives the default type its spec once: an operator who then
// changes, disassociates or deletes it keeps that choice across restarts,
// and one who already has a spec of that name keeps it as it is.
func (s *Service) bootstrapQoS(ctx context.Context) error {
	return s.db.Tx(ctx, func(tx *store.Tx) error {
		var done string
		err := tx.QueryRow(ctx, "SELECT value FROM volume_settings WHERE name = ?", networkQoSSetting).Scan(&done)
		if err == nil || !store.IsNoRows(err) {
			return err
		}
		now := store.FormatTime(s.now())
		var n int
		if err := tx.QueryRow(ctx, "SELECT COUNT(*) FROM volume_qos_specs WHERE name = ?", DefaultType).Scan(&n); err != nil {
			return err
		}
		if n == 0 {
			row := &qosRow{ID: newID(), Name: DefaultType, Consumer: "front-end", Specs: networkQoS, CreatedAt: now, UpdatedAt: now}
			if err := insertQoS(ctx, tx, row); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "UPDATE volume_types SET qos_specs_id = ? WHERE name = ? AND qos_specs_id IS NULL", row.ID, DefaultType); err != nil {
				return err
			}
		}
		_, err = tx.Exec(ctx, "INSERT INTO volume_settings (name, value) VALUES (?, ?)", networkQoSSetting, now)
		return err
	})
}

// QoS is the throttle volume id gets from its type's QoS spec, whatever
// the spec's consumer: Nimbus's back end and front end are both QEMU, so a
// back-end spec is enforced where a front-end one is. A type without a spec
// gives the zero Throttle; an unknown volume store.ErrNotFound.
func (s *Service) QoS(ctx context.Context, volumeID string) (Throttle, error) {
	var specs string
	err := s.db.QueryRow(ctx, `SELECT COALESCE(q.specs, '{}') FROM volumes v
		JOIN volume_types t ON t.id = v.volume_type_id LEFT JOIN volume_qos_specs q ON q.id = t.qos_specs_id
		WHERE v.id = ?`, volumeID).Scan(&specs)
	if store.IsNoRows(err) {
		return Throttle{}, store.ErrNotFound
	}
	if err != nil {
		return Throttle{}, err
	}
	m := map[string]string{}
	if err := store.FromJSON(specs, &m); err != nil {
		return Throttle{}, err
	}
	return parseThrottle(m)
}
