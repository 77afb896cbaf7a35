package compute

import (
	"context"
	"encoding/json"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// aggregateRoutes are os-aggregates (nova/api/openstack/compute/aggregates.py),
// admin only. The action route checks the policy of the action it is asked
// for.
func (s *Service) aggregateRoutes() []api.Route {
	admin := func(pattern string, h api.HandlerFunc, rule string) api.Route {
		return api.Route{Pattern: pattern, Handler: h, AdminOnly: true, Policy: "os_compute_api:os-aggregates:" + rule}
	}
	return []api.Route{
		admin("GET /v2.1/os-aggregates", s.listAggregates, "index"),
		admin("POST /v2.1/os-aggregates", s.createAggregate, "create"),
		admin("GET /v2.1/os-aggregates/{id}", s.showAggregate, "show"),
		admin("PUT /v2.1/os-aggregates/{id}", s.updateAggregate, "update"),
		admin("DELETE /v2.1/os-aggregates/{id}", s.deleteAggregate, "delete"),
		{Pattern: "POST /v2.1/os-aggregates/{id}/action", Handler: s.aggregateAction},
		{Pattern: "POST /v2.1/os-aggregates/{id}/images", Handler: s.aggregateImages, AdminOnly: true,
			Policy: "compute:aggregates:images"},
	}
}

// azKey is the aggregate metadata key that makes its hosts an availability
// zone.
const azKey = "availability_zone"

// aggregate is one compute_aggregates row with its hosts and metadata.
type aggregate struct {
	ID        int64
	UUID      string
	Name      string
	CreatedAt time.Time
	UpdatedAt *time.Time
	Hosts     []string
	Metadata  map[string]string
}

// zone is the aggregate's availability zone, "" for none.
func (a *aggregate) zone() string { return a.Metadata[azKey] }

// aggregateView is aggregates.py _marshall_aggregate: timestamps without a
// zone (the object's naive datetimes), uuid from 2.41. Create leaves out
// hosts and metadata.
func aggregateView(v Version, a *aggregate, full bool) map[string]any {
	m := map[string]any{
		"id": a.ID, "name": a.Name, "availability_zone": strOrNil(a.zone()),
		"created_at": usgTime(a.CreatedAt), "updated_at": usgTimePtr(a.UpdatedAt),
		"deleted": false, "deleted_at": nil,
	}
	if full {
		hosts, meta := a.Hosts, a.Metadata
		if hosts == nil {
			hosts = []string{}
		}
		if meta == nil {
			meta = map[string]string{}
		}
		m["hosts"], m["metadata"] = hosts, meta
	}
	if v.AtLeast(41) {
		m["uuid"] = a.UUID
	}
	return m
}

// aggregateLock is the PostgreSQL advisory lock that serialises aggregate
// changes, so that two admins cannot put one host into two zones at once
// or take the same name or id. SQLite transactions are already serial.
const aggregateLock = 7_316_284_203

func lockAggregates(ctx context.Context, tx *store.Tx) error {
	if tx.Dialect() != store.Postgres {
		return nil
	}
	_, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(?)", int64(aggregateLock))
	return err
}

// lockedAggregate takes the aggregates lock in tx and loads aggregate id:
// Nova's 404 when there is none.
func lockedAggregate(ctx context.Context, tx *store.Tx, id int64) (*aggregate, error) {
	if err := lockAggregates(ctx, tx); err != nil {
		return nil, err
	}
	a, err := loadAggregate(ctx, tx, id)
	if err != nil {
		return nil, notFoundAs(err, aggregateNotFound(id))
	}
	return a, nil
}

// aggregateID reads the {id} of a request (utils.validate_integer).
func aggregateID(r *http.Request) (int64, error) {
	id, err := strconv.ParseInt(strings.TrimSpace(r.PathValue("id")), 10, 64)
	if err != nil {
		return 0, api.BadRequest("Invalid input received: id must be an integer")
	}
	return id, nil
}

func aggregateNotFound(id int64) *api.Error {
	return api.NotFound("Aggregate %d could not be found.", id)
}

// loadAggregates reads aggregates (all when ids is empty) with their hosts
// and metadata, by id.
func loadAggregates(ctx context.Context, q store.Querier, ids ...int64) ([]*aggregate, error) {
	where, args := "", []any{}
	if len(ids) > 0 {
		where = " WHERE id IN (" + api.Placeholders(len(ids)) + ")"
		for _, id := range ids {
			args = append(args, id)
		}
	}
	rows, err := q.Query(ctx, "SELECT id, uuid, name, created_at, updated_at FROM compute_aggregates"+where+" ORDER BY id", args...)
	if err != nil {
		return nil, err
	}
	var out []*aggregate
	byID := map[int64]*aggregate{}
	for rows.Next() {
		var a aggregate
		var created, updated string
		if err := rows.Scan(&a.ID, &a.UUID, &a.Name, &created, &updated); err != nil {
			rows.Close()
			return nil, err
		}
		a.CreatedAt = store.ParseTime(created)
		if updated != "" {
			t := store.ParseTime(updated)
			a.UpdatedAt = &t
		}
		a.Hosts, a.Metadata = []string{}, map[string]string{}
		out = append(out, &a)
		byID[a.ID] = &a
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return out, nil
	}
	hrows, err := q.Query(ctx, "SELECT aggregate_id, host FROM compute_aggregate_hosts"+strings.Replace(where, "id IN", "aggregate_id IN", 1)+
		" ORDER BY created_at, host", args...)
	if err != nil {
		return nil, err
	}
	for hrows.Next() {
		var id int64
		var h string
		if err := hrows.Scan(&id, &h); err != nil {
			hrows.Close()
			return nil, err
		}
		if a := byID[id]; a != nil {
			a.Hosts = append(a.Hosts, h)
		}
	}
	hrows.Close()
	if err := hrows.Err(); err != nil {
		return nil, err
	}
	mrows, err := q.Query(ctx, "SELECT aggregate_id, meta_key, value FROM compute_aggregate_metadata"+strings.Replace(where, "id IN", "aggregate_id IN", 1), args...)
	if err != nil {
		return nil, err
	}
	defer mrows.Close()
	for mrows.Next() {
		var id int64
		var k, v string
		if err := mrows.Scan(&id, &k, &v); err != nil {
			return nil, err
		}
		if a := byID[id]; a != nil {
			a.Metadata[k] = v
		}
	}
	return out, mrows.Err()
}

// loadAggregate reads one aggregate: store.ErrNotFound when there is none.
func loadAggregate(ctx context.Context, q store.Querier, id int64) (*aggregate, error) {
	as, err := loadAggregates(ctx, q, id)
	if err != nil {
		return nil, err
	}
	if len(as) == 0 {
		return nil, store.ErrNotFound
	}
	return as[0], nil
}

// aggregateHostsChanged runs, once tx commits, what must follow any
// aggregate change: the cached host zones are dropped and
// s.onAggregatesChanged (the scheduler's hook; nil for none) is called.
func (s *Service) aggregateHostsChanged(tx *store.Tx) {
	tx.AfterCommit(func() {
		s.zones.invalidate()
		if f := s.onAggregatesChanged; f != nil {
			f()
		}
	})
}

func (s *Service) listAggregates(r *http.Request) (*api.Response, error) {
	as, err := loadAggregates(r.Context(), s.db)
	if err != nil {
		return nil, err
	}
	v := VersionFrom(r.Context())
	out := make([]any, 0, len(as))
	for _, a := range as {
		out = append(out, aggregateView(v, a, true))
	}
	return api.JSON(http.StatusOK, map[string]any{"aggregates": out}), nil
}

func (s *Service) showAggregate(r *http.Request) (*api.Response, error) {
	id, err := aggregateID(r)
	if err != nil {
		return nil, err
	}
	a, err := loadAggregate(r.Context(), s.db, id)
	if err != nil {
		return nil, notFoundAs(err, aggregateNotFound(id))
	}
	return api.JSON(http.StatusOK, map[string]any{"aggregate": aggregateView(VersionFrom(r.Context()), a, true)}), nil
}

// validAZName is parameter_types.az_name: a name without ':' (which
// separates zone, host and node in a create's availability_zone).
func validAZName(s string) bool { return validName(s) && !strings.Contains(s, ":") }

// aggregateName reads the name of a create (parameter_types.name) or, with
// spaces, of an update (name_with_leading_trailing_spaces, then stripped
// as common.normalize_name does).
func aggregateName(raw json.RawMessage, spaces bool) (string, error) {
	name, ok := jsonString(raw)
	if !ok {
		return "", api.SchemaError("name", raw, "%s is not of type 'string'", pyQuote(raw))
	}
	if spaces {
		name = strings.TrimSpace(name)
	}
	if !validName(name) {
		return "", api.SchemaError("name", raw, "%s", nameProblem(name))
	}
	return name, nil
}

// aggregateZone reads availability_zone: an az_name or null (nil).
func aggregateZone(raw json.RawMessage) (*string, error) {
	if string(raw) == "null" {
		return nil, nil
	}
	z, ok := jsonString(raw)
	if !ok || !validAZName(z) {
		return nil, api.SchemaError(azKey, raw, "%s is not valid under any of the given schemas", pyQuote(raw))
	}
	return &z, nil
}

// createAggregate is POST /os-aggregates: 200 with the aggregate, without
// hosts and metadata; 409 "Aggregate <name> already exists.".
func (s *Service) createAggregate(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	body, err := decodeWrapped(r, "aggregate")
	if err != nil {
		return nil, err
	}
	a := &aggregate{UUID: uuid.NewString(), CreatedAt: s.now(), Hosts: []string{}, Metadata: map[string]string{}}
	if raw, ok := body["name"]; ok {
		if a.Name, err = aggregateName(raw, false); err != nil {
			return nil, err
		}
	}
	if raw, ok := body[azKey]; ok {
		z, err := aggregateZone(raw)
		if err != nil {
			return nil, err
		}
		if z != nil && *z != "" {
			a.Metadata[azKey] = *z
		}
	}
	if _, ok := body["name"]; !ok {
		return nil, api.SchemaError("aggregate", json.RawMessage(pyMap(body)), "'name' is a required property")
	}
	if err := extraProperties("aggregate", body, "name", azKey); err != nil {
		return nil, err
	}
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		if err := lockAggregates(ctx, tx); err != nil {
			return err
		}
		if err := nameFree(ctx, tx, a.Name, 0); err != nil {
			return err
		}
		if a.ID, err = nextAggregateID(ctx, tx); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "INSERT INTO compute_aggregates (id, uuid, name, created_at) VALUES (?, ?, ?, ?)",
			a.ID, a.UUID, a.Name, store.FormatTime(a.CreatedAt)); err != nil {
			return err
		}
		s.aggregateHostsChanged(tx)
		return setAggregateMetadata(ctx, tx, a.ID, map[string]*string{azKey: strPtrOrNil(a.Metadata[azKey])})
	})
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, map[string]any{"aggregate": aggregateView(VersionFrom(ctx), a, false)}), nil
}

// nextAggregateID hands out the next aggregate id, never one used before
// (under lockAggregates).
func nextAggregateID(ctx context.Context, tx *store.Tx) (int64, error) {
	var last int64
	err := tx.QueryRow(ctx, "SELECT last_id FROM compute_aggregate_ids WHERE one = 1").Scan(&last)
	if err != nil && !store.IsNoRows(err) {
		return 0, err
	}
	next, err := nextIntID(ctx, tx, "compute_aggregates", "id")
	if err != nil {
		return 0, err
	}
	next = max(next, last+1)
	_, err = tx.Exec(ctx, `INSERT INTO compute_aggregate_ids (one, last_id) VALUES (1, ?)
		ON CONFLICT (one) DO UPDATE SET last_id = excluded.last_id`, next)
	return next, err
}

func strPtrOrNil(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// nameFree answers 409 when another aggregate than id has name
// (exception.AggregateNameExists).
func nameFree(ctx context.Context, tx *store.Tx, name string, id int64) error {
	var other int64
	err := tx.QueryRow(ctx, "SELECT id FROM compute_aggregates WHERE name = ?", name).Scan(&other)
	if err == nil && other != id {
		return api.Conflict("Aggregate %s already exists.", name)
	}
	if err != nil && !store.IsNoRows(err) {
		return err
	}
	return nil
}

// setAggregateMetadata applies updates as Aggregate.update_metadata does:
// a nil value removes the key, others are set; keys not named stay.
func setAggregateMetadata(ctx context.Context, tx *store.Tx, id int64, updates map[string]*string) error {
	for k, v := range updates {
		if _, err := tx.Exec(ctx, "DELETE FROM compute_aggregate_metadata WHERE aggregate_id = ? AND meta_key = ?", id, k); err != nil {
			return err
		}
		if v == nil {
			continue
		}
		if _, err := tx.Exec(ctx, "INSERT INTO compute_aggregate_metadata (aggregate_id, meta_key, value) VALUES (?, ?, ?)", id, k, *v); err != nil {
			return err
		}
	}
	return nil
}

// checkZoneChange is compute/api.py AggregateAPI.is_safe_to_update_az for
// a change that sets availability_zone to *zone on aggregate a (hosts: the
// hosts to check, a's own when nil): an empty zone is refused, no host may
// be in another aggregate of another zone, and with checkServers (update
// and set_metadata) a zone that changes must have no servers on a's
// hosts. fail words the refusal for the action.
func checkZoneChange(ctx context.Context, tx *store.Tx, a *aggregate, zone *string, hosts []string, checkServers bool, fail func(reason string) error) error {
	if zone == nil || *zone == "" {
		return fail("Aggregate " + a.Name + " does not support empty named availability zone")
	}
	if hosts == nil {
		hosts = a.Hosts
	}
	if len(hosts) == 0 {
		return nil
	}
	args := []any{azKey, a.ID}
	for _, h := range hosts {
		args = append(args, h)
	}
	rows, err := tx.Query(ctx, `SELECT DISTINCT h.aggregate_id, m.value FROM compute_aggregate_hosts h
		JOIN compute_aggregate_metadata m ON m.aggregate_id = h.aggregate_id AND m.meta_key = ?
		WHERE h.aggregate_id <> ? AND h.host IN (`+api.Placeholders(len(hosts))+`) ORDER BY h.aggregate_id`, args...)
	if err != nil {
		return err
	}
	var conflicts []string
	for rows.Next() {
		var id int64
		var z string
		if err := rows.Scan(&id, &z); err != nil {
			rows.Close()
			return err
		}
		if z != *zone {
			conflicts = append(conflicts, z)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	if len(conflicts) > 0 {
		return fail("One or more hosts already in availability zone(s) " + pyStrings(conflicts))
	}
	if checkServers && a.zone() != *zone {
		var n int
		if err := tx.QueryRow(ctx, "SELECT COUNT(*) FROM compute_servers WHERE deleted = 0 AND host IN ("+api.Placeholders(len(hosts))+")",
			args[2:]...).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			return fail("One or more hosts contain instances in this zone")
		}
	}
	return nil
}

// updateAggregate is PUT /os-aggregates/{id}: name and/or
// availability_zone; 409 for a taken name, 400 for a zone change Nova
// refuses ("Cannot update aggregate <id>. Reason: …").
func (s *Service) updateAggregate(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	body, err := decodeWrapped(r, "aggregate")
	if err != nil {
		return nil, err
	}
	var name *string
	if raw, ok := body["name"]; ok {
		n, err := aggregateName(raw, true)
		if err != nil {
			return nil, err
		}
		name = &n
	}
	var zone *string
	_, setZone := body[azKey]
	if setZone {
		if zone, err = aggregateZone(body[azKey]); err != nil {
			return nil, err
		}
	}
	if err := extraProperties("aggregate", body, "name", azKey); err != nil {
		return nil, err
	}
	if name == nil && !setZone {
		return nil, api.SchemaError("aggregate", json.RawMessage(pyMap(body)), "%s is not valid under any of the given schemas", pyMapRepr(body))
	}
	id, err := aggregateID(r)
	if err != nil {
		return nil, err
	}
	var a *aggregate
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		if a, err = lockedAggregate(ctx, tx, id); err != nil {
			return err
		}
		now := s.now()
		if name != nil {
			if err := nameFree(ctx, tx, *name, id); err != nil {
				return err
			}
			a.Name = *name
		}
		if setZone {
			fail := func(reason string) error {
				return api.BadRequest("Cannot update aggregate %d. Reason: %s.", id, reason)
			}
			if err := checkZoneChange(ctx, tx, a, zone, nil, true, fail); err != nil {
				return err
			}
			if err := setAggregateMetadata(ctx, tx, id, map[string]*string{azKey: zone}); err != nil {
				return err
			}
			a.Metadata[azKey] = *zone
		}
		a.UpdatedAt = &now
		s.aggregateHostsChanged(tx)
		_, err := tx.Exec(ctx, "UPDATE compute_aggregates SET name = ?, updated_at = ? WHERE id = ?", a.Name, store.FormatTime(now), id)
		return err
	})
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, map[string]any{"aggregate": aggregateView(VersionFrom(ctx), a, true)}), nil
}

// pyMapRepr renders a JSON object as Python prints a dict.
func pyMapRepr(m map[string]json.RawMessage) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, "'"+k+"': "+pyQuote(m[k]))
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

// deleteAggregate is DELETE /os-aggregates/{id}: 200 with no body; an
// aggregate that still has hosts is Nova's 400 (InvalidAggregateActionDelete).
func (s *Service) deleteAggregate(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	id, err := aggregateID(r)
	if err != nil {
		return nil, err
	}
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		a, err := lockedAggregate(ctx, tx, id)
		if err != nil {
			return err
		}
		if len(a.Hosts) > 0 {
			return api.BadRequest("Cannot remove host from aggregate %d. Reason: Host aggregate is not empty.", id)
		}
		s.aggregateHostsChanged(tx)
		if _, err := tx.Exec(ctx, "DELETE FROM compute_aggregate_metadata WHERE aggregate_id = ?", id); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, "DELETE FROM compute_aggregates WHERE id = ?", id)
		return err
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(http.StatusOK), nil
}

// aggregateAction is POST /os-aggregates/{id}/action: add_host,
// remove_host or set_metadata, each answering 200 with the aggregate.
func (s *Service) aggregateAction(r *http.Request) (*api.Response, error) {
	var top map[string]json.RawMessage
	if err := api.DecodeJSON(r, &top); err != nil {
		return nil, err
	}
	// wsgi.py action_peek: exactly one key, naming a known action.
	if len(top) != 1 {
		return nil, api.BadRequest("Malformed request body: too many body keys")
	}
	var action string
	for k := range top {
		action = k
	}
	if action != "add_host" && action != "remove_host" && action != "set_metadata" {
		return nil, api.BadRequest("There is no such action: %s", action)
	}
	if !callerAdmin(r) {
		return nil, api.PolicyForbidden("os_compute_api:os-aggregates:" + action)
	}
	var args map[string]json.RawMessage
	if err := json.Unmarshal(top[action], &args); err != nil || args == nil {
		return nil, api.SchemaError(action, top[action], "%s is not of type 'object'", pyQuote(top[action]))
	}
	if action == "set_metadata" {
		return s.setMetadataAction(r, args)
	}
	return s.hostAction(r, action, args)
}

// hostRE is parameter_types.fqdn's pattern.
var hostRE = regexp.MustCompile(`^[a-zA-Z0-9-._]*$`)

// hostAction is add_host and remove_host. add_host: 404 "Compute host <h>
// could not be found." for a host without a nova-compute service, 404 for
// the aggregate, 409 when the host would be in two zones or is already in
// the aggregate. remove_host: every refusal is 404 "Cannot remove host <h>
// in aggregate <id>".
func (s *Service) hostAction(r *http.Request, action string, args map[string]json.RawMessage) (*api.Response, error) {
	ctx := r.Context()
	raw, ok := args["host"]
	if ok {
		h, isStr := jsonString(raw)
		switch {
		case !isStr:
			return nil, api.SchemaError("host", raw, "%s is not of type 'string'", pyQuote(raw))
		case h == "":
			return nil, api.SchemaError("host", raw, "'' is too short")
		case len(h) > 255:
			return nil, api.SchemaError("host", raw, "'%s' is too long", h)
		case !hostRE.MatchString(h):
			return nil, api.SchemaError("host", raw, "'%s' does not match '^[a-zA-Z0-9-._]*$'", h)
		}
	} else {
		return nil, api.SchemaError(action, json.RawMessage(pyMap(args)), "'host' is a required property")
	}
	if err := extraProperties(action, args, "host"); err != nil {
		return nil, err
	}
	host, _ := jsonString(raw)
	id, err := aggregateID(r)
	if err != nil {
		return nil, err
	}
	if err := s.ensureServices(ctx, false); err != nil {
		return nil, err
	}
	var a *aggregate
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		if err := lockAggregates(ctx, tx); err != nil {
			return err
		}
		var n int
		if err := tx.QueryRow(ctx, "SELECT COUNT(*) FROM compute_services WHERE host = ? AND binary_name = ? AND deleted = 0",
			host, binCompute).Scan(&n); err != nil {
			return err
		}
		if action == "remove_host" {
			removeFail := api.NotFound("Cannot remove host %s in aggregate %d", host, id)
			if n == 0 {
				return removeFail
			}
			if a, err = loadAggregate(ctx, tx, id); err != nil {
				return notFoundAs(err, removeFail)
			}
			i := slices.Index(a.Hosts, host)
			if i < 0 {
				return removeFail
			}
			a.Hosts = slices.Delete(a.Hosts, i, i+1)
			s.aggregateHostsChanged(tx)
			_, err := tx.Exec(ctx, "DELETE FROM compute_aggregate_hosts WHERE aggregate_id = ? AND host = ?", id, host)
			return err
		}
		if n == 0 {
			return api.NotFound("Compute host %s could not be found.", host)
		}
		if a, err = loadAggregate(ctx, tx, id); err != nil {
			return notFoundAs(err, aggregateNotFound(id))
		}
		if z := a.zone(); z != "" {
			fail := func(reason string) error {
				return api.Conflict("Cannot add host to aggregate %d. Reason: %s.", id, reason)
			}
			if err := checkZoneChange(ctx, tx, a, &z, []string{host}, false, fail); err != nil {
				return err
			}
		}
		if slices.Contains(a.Hosts, host) {
			return api.Conflict("Aggregate %d already has host %s.", id, host)
		}
		a.Hosts = append(a.Hosts, host)
		s.aggregateHostsChanged(tx)
		_, err := tx.Exec(ctx, "INSERT INTO compute_aggregate_hosts (aggregate_id, host, created_at) VALUES (?, ?, ?)",
			id, host, store.FormatTime(s.now()))
		return err
	})
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, map[string]any{"aggregate": aggregateView(VersionFrom(ctx), a, true)}), nil
}

// metaKeyRE is parameter_types.metadata_with_null's key pattern.
var metaKeyRE = regexp.MustCompile(`^[a-zA-Z0-9-_:. ]{1,255}$`)

// setMetadataAction is set_metadata: keys set to a string are set, keys
// set to null removed, others kept (Aggregate.update_metadata). Setting
// availability_zone is checked as update does ("Cannot update metadata of
// aggregate <id>. Reason: …", 400).
func (s *Service) setMetadataAction(r *http.Request, args map[string]json.RawMessage) (*api.Response, error) {
	ctx := r.Context()
	raw, ok := args["metadata"]
	if !ok {
		return nil, api.SchemaError("set_metadata", json.RawMessage(pyMap(args)), "'metadata' is a required property")
	}
	var meta map[string]json.RawMessage
	if err := json.Unmarshal(raw, &meta); err != nil || meta == nil {
		return nil, api.SchemaError("metadata", raw, "%s is not of type 'object'", pyQuote(raw))
	}
	updates := map[string]*string{}
	for k, v := range meta {
		if !metaKeyRE.MatchString(k) {
			return nil, api.SchemaError("metadata", raw, "Additional properties are not allowed ('%s' was unexpected)", k)
		}
		if string(v) == "null" {
			updates[k] = nil
			continue
		}
		str, ok := jsonString(v)
		if !ok {
			return nil, api.SchemaError(k, v, "%s is not of type 'string', 'null'", pyQuote(v))
		}
		if len([]rune(str)) > 255 {
			return nil, api.SchemaError(k, v, "'%s' is too long", str)
		}
		updates[k] = &str
	}
	if err := extraProperties("set_metadata", args, "metadata"); err != nil {
		return nil, err
	}
	id, err := aggregateID(r)
	if err != nil {
		return nil, err
	}
	var a *aggregate
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		if a, err = lockedAggregate(ctx, tx, id); err != nil {
			return err
		}
		if z, ok := updates[azKey]; ok {
			fail := func(reason string) error {
				return api.BadRequest("Cannot update metadata of aggregate %d. Reason: %s.", id, reason)
			}
			if err := checkZoneChange(ctx, tx, a, z, nil, true, fail); err != nil {
				return err
			}
		}
		if err := setAggregateMetadata(ctx, tx, id, updates); err != nil {
			return err
		}
		for k, v := range updates {
			if v == nil {
				delete(a.Metadata, k)
			} else {
				a.Metadata[k] = *v
			}
		}
		now := s.now()
		a.UpdatedAt = &now
		s.aggregateHostsChanged(tx)
		_, err := tx.Exec(ctx, "UPDATE compute_aggregates SET updated_at = ? WHERE id = ?", store.FormatTime(now), id)
		return err
	})
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, map[string]any{"aggregate": aggregateView(VersionFrom(ctx), a, true)}), nil
}

// aggregateImages is POST /os-aggregates/{id}/images (2.81): a request to
// pre-cache images on the aggregate's hosts. Nimbus has nothing to
// pre-cache, so after Nova's checks (schema, duplicates, the aggregate,
// each image) it answers 202.
func (s *Service) aggregateImages(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	if !VersionFrom(ctx).AtLeast(81) {
		return nil, api.NotFound("The resource could not be found.")
	}
	body, err := decodeTop(r)
	if err != nil {
		return nil, err
	}
	raw, ok := body["cache"]
	if !ok {
		return nil, api.SchemaError("body", json.RawMessage(pyMap(body)), "'cache' is a required property")
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil || items == nil {
		return nil, api.SchemaError("cache", raw, "%s is not of type 'array'", pyQuote(raw))
	}
	if len(items) == 0 {
		return nil, api.SchemaError("cache", raw, "[] is too short")
	}
	var ids []string
	for i, it := range items {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(it, &m); err != nil || m == nil {
			return nil, api.SchemaError(strconv.Itoa(i), it, "%s is not of type 'object'", pyQuote(it))
		}
		idRaw, ok := m["id"]
		if !ok {
			return nil, api.SchemaError(strconv.Itoa(i), it, "'id' is a required property")
		}
		imageID, isStr := jsonString(idRaw)
		if !isStr || !uuidRE.MatchString(imageID) {
			return nil, api.SchemaError("id", idRaw, "%s is not a 'uuid'", pyQuote(idRaw))
		}
		if err := extraProperties(strconv.Itoa(i), m, "id"); err != nil {
			return nil, err
		}
		ids = append(ids, imageID)
	}
	if err := extraProperties("body", body, "cache"); err != nil {
		return nil, err
	}
	id, err := aggregateID(r)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for _, i := range ids {
		if seen[i] {
			return nil, api.BadRequest("Duplicate images in request")
		}
		seen[i] = true
	}
	if _, err := loadAggregate(ctx, s.db, id); err != nil {
		return nil, notFoundAs(err, aggregateNotFound(id))
	}
	c := api.CallerFrom(ctx)
	for _, i := range ids {
		if _, err := s.images.Get(ctx, c.ProjectID, c.IsAdmin(), i); err != nil {
			return nil, notFoundAs(err, api.BadRequest("Image %s could not be found.", i))
		}
	}
	return api.Empty(http.StatusAccepted), nil
}

// decodeTop decodes a request body that must be a JSON object.
func decodeTop(r *http.Request) (map[string]json.RawMessage, error) {
	var top map[string]json.RawMessage
	if err := api.DecodeJSON(r, &top); err != nil {
		return nil, err
	}
	if top == nil {
		return nil, api.BadRequest("Invalid input for field/attribute body. Value: None. None is not of type 'object'")
	}
	return top, nil
}

// hostZones returns each host's availability zone as aggregates set it
// (the "availability_zone" metadata of the aggregates holding it; two
// zones, which Nova's checks prevent, are joined with "," as Nova's
// set_availability_zones does). Hosts in no zoned aggregate are absent:
// their own zone applies. The map is shared: callers must not change it.
//
// It is cached like enabledHosts: a change through this controller drops
// the cache when it commits (aggregateHostsChanged), one through another
// controller on the same database is seen within hostCacheTTL.
func (s *Service) hostZones(ctx context.Context) (map[string]string, error) {
	if z, ok := s.zones.get(s.now()); ok {
		return z, nil
	}
	gen := s.zones.gen.Load()
	rows, err := s.db.Query(ctx, `SELECT DISTINCT h.host, m.value FROM compute_aggregate_hosts h
		JOIN compute_aggregate_metadata m ON m.aggregate_id = h.aggregate_id AND m.meta_key = ?
		ORDER BY h.host, m.value`, azKey)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	zones := map[string]string{}
	for rows.Next() {
		var h, z string
		if err := rows.Scan(&h, &z); err != nil {
			return nil, err
		}
		if prev, ok := zones[h]; ok {
			z = prev + "," + z
		}
		zones[h] = z
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	s.zones.put(zones, gen, s.now())
	return zones, nil
}

// zoneCache holds the last answer of hostZones (see hostCache).
type zoneCache struct {
	mu    sync.Mutex
	zones map[string]string
	until time.Time
	valid uint64
	gen   atomic.Uint64
}

func (c *zoneCache) get(now time.Time) (map[string]string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.valid == 0 || c.valid != c.gen.Load()+1 || now.After(c.until) {
		return nil, false
	}
	return c.zones, true
}

// put stores zones read at generation gen; a change since then leaves the
// cache empty.
func (c *zoneCache) put(zones map[string]string, gen uint64, now time.Time) {
	c.mu.Lock()
	c.zones, c.until, c.valid = zones, now.Add(hostCacheTTL), gen+1
	c.mu.Unlock()
}

// invalidate forgets the cached zones after an aggregate change.
func (c *zoneCache) invalidate() { c.gen.Add(1) }
