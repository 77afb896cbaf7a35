package compute

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// serverGroupRoutes are os-server-groups
// (nova/api/openstack/compute/server_groups.py). Any project member may
// use them; a project sees its own groups, an admin every group.
func (s *Service) serverGroupRoutes() []api.Route {
	return []api.Route{
		{Pattern: "GET /v2.1/os-server-groups", Handler: s.listServerGroups},
		{Pattern: "POST /v2.1/os-server-groups", Handler: s.createServerGroup},
		{Pattern: "GET /v2.1/os-server-groups/{id}", Handler: s.showServerGroup},
		{Pattern: "DELETE /v2.1/os-server-groups/{id}", Handler: s.deleteServerGroup},
	}
}

// The policies a group may be created with (schemas/server_groups.py
// create, create_v215 and create_v264), in the order Nova's messages list
// them.
var (
	groupPolicies    = []string{"anti-affinity", "affinity"}
	groupPoliciesSft = []string{"anti-affinity", "affinity", "soft-anti-affinity", "soft-affinity"}
)

// serverGroup is one compute_server_groups row (Nova's InstanceGroup: one
// policy, and for anti-affinity from 2.64 a max_server_per_host rule).
type serverGroup struct {
	ID, Name, ProjectID, UserID, Policy string
	MaxPerHost                          int // 0: no rule
	CreatedAt                           time.Time
	Members                             []string // servers not deleted
}

const groupColumns = "id, name, project_id, user_id, policy, max_per_host, created_at"

func scanGroup(row interface{ Scan(...any) error }) (*serverGroup, error) {
	var g serverGroup
	var created string
	if err := row.Scan(&g.ID, &g.Name, &g.ProjectID, &g.UserID, &g.Policy, &g.MaxPerHost, &created); err != nil {
		if store.IsNoRows(err) {
			return nil, store.ErrNotFound
		}
		return nil, err
	}
	g.CreatedAt = store.ParseTime(created)
	return &g, nil
}

// loadGroup reads group id; with projectID set, only that project's
// (instance_group.py _instance_group_get_query filters by the caller's
// project unless the caller is an admin).
func loadGroup(ctx context.Context, q store.Querier, id, projectID string) (*serverGroup, error) {
	id = canonicalUUID(id)
	if projectID != "" {
		return scanGroup(q.QueryRow(ctx, "SELECT "+groupColumns+" FROM compute_server_groups WHERE id = ? AND project_id = ?", id, projectID))
	}
	return scanGroup(q.QueryRow(ctx, "SELECT "+groupColumns+" FROM compute_server_groups WHERE id = ?", id))
}

// groupNotFound is exception.InstanceGroupNotFound.
func groupNotFound(id string) *api.Error {
	return api.NotFound("Instance group %s could not be found.", id)
}

// visibleGroup reads the group a request names: 404 for one the caller's
// project does not own, unless the caller is an admin.
func (s *Service) visibleGroup(r *http.Request, q store.Querier) (*serverGroup, error) {
	id := r.PathValue("id")
	project := ""
	if c := api.CallerFrom(r.Context()); !c.IsAdmin() {
		project = c.ProjectID
	}
	g, err := loadGroup(r.Context(), q, id, project)
	if err != nil {
		return nil, notFoundAs(err, groupNotFound(id))
	}
	return g, nil
}

// fillMembers sets the members of groups: their servers not deleted, in
// the order they joined (server_groups.py _get_not_deleted).
func fillMembers(ctx context.Context, q store.Querier, groups []*serverGroup) error {
	if len(groups) == 0 {
		return nil
	}
	byID := make(map[string]*serverGroup, len(groups))
	args := make([]any, 0, len(groups))
	for _, g := range groups {
		g.Members = []string{}
		byID[g.ID] = g
		args = append(args, g.ID)
	}
	rows, err := q.Query(ctx, `SELECT m.group_id, m.server_id FROM compute_server_group_members m
		JOIN compute_servers s ON s.id = m.server_id AND s.deleted = 0
		WHERE m.group_id IN (`+api.Placeholders(len(args))+`) ORDER BY m.created_at, m.server_id`, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var gid, sid string
		if err := rows.Scan(&gid, &sid); err != nil {
			return err
		}
		byID[gid].Members = append(byID[gid].Members, sid)
	}
	return rows.Err()
}

// groupView is server_groups.py _format_server_group at microversion v:
// policies and an always-empty metadata before 2.64, policy and rules from
// 2.64, project_id and user_id from 2.13.
func groupView(v Version, g *serverGroup) map[string]any {
	m := map[string]any{"id": g.ID, "name": g.Name, "members": g.Members}
	if g.Members == nil {
		m["members"] = []string{}
	}
	if v.AtLeast(64) {
		rules := map[string]any{}
		if g.MaxPerHost > 0 {
			rules["max_server_per_host"] = g.MaxPerHost
		}
		m["policy"], m["rules"] = g.Policy, rules
	} else {
		m["policies"], m["metadata"] = []string{g.Policy}, map[string]any{}
	}
	if v.AtLeast(13) {
		m["project_id"], m["user_id"] = g.ProjectID, g.UserID
	}
	return m
}

// parseGroupCreate validates a create body as schemas/server_groups.py
// create (2.1), create_v215 and create_v264 do. late is Nova's check made
// after the quota check ("Only anti-affinity policy supports rules.").
func parseGroupCreate(body map[string]json.RawMessage, v Version) (g *serverGroup, late error, err error) {
	g = &serverGroup{}
	policyKey := "policies"
	allowed := []string{"name", "policies"}
	if v.AtLeast(64) {
		policyKey = "policy"
		allowed = []string{"name", "policy", "rules"}
	}
	enum := groupPolicies
	if v.AtLeast(15) {
		enum = groupPoliciesSft
	}
	// jsonschema reports properties, then required ones, then extra ones.
	if raw, ok := body["name"]; ok {
		name, isStr := jsonString(raw)
		if !isStr {
			return nil, nil, api.SchemaError("name", raw, "%s is not of type 'string'", pyQuote(raw))
		}
		if !validName(name) {
			return nil, nil, api.SchemaError("name", raw, "%s", nameProblem(name))
		}
		g.Name = name
	}
	if raw, ok := body[policyKey]; ok {
		var err error
		if v.AtLeast(64) {
			g.Policy, err = parsePolicy(raw, enum)
		} else {
			g.Policy, err = parsePolicies(raw, enum)
		}
		if err != nil {
			return nil, nil, err
		}
	}
	if raw, ok := body["rules"]; ok && v.AtLeast(64) {
		n, present, err := parseRules(raw)
		if err != nil {
			return nil, nil, err
		}
		g.MaxPerHost = n
		if present && g.Policy != "anti-affinity" {
			late = api.BadRequest("Only anti-affinity policy supports rules.")
		}
	}
	for _, req := range []string{"name", policyKey} {
		if _, ok := body[req]; !ok {
			return nil, nil, api.SchemaError("server_group", json.RawMessage(pyMap(body)), "'%s' is a required property", req)
		}
	}
	if err := extraProperties("server_group", body, allowed...); err != nil {
		return nil, nil, err
	}
	return g, late, nil
}

// nameProblem is jsonschema's reason for a value parameter_types.name
// refuses (minLength 1, maxLength 255, format "name": printable, no
// leading or trailing whitespace).
func nameProblem(name string) string {
	switch {
	case name == "":
		return "'' is too short"
	case len([]rune(name)) > 255:
		return fmt.Sprintf("'%s' is too long", name)
	}
	return fmt.Sprintf("'%s' is not a 'name'", name)
}

// parsePolicies reads the policies list of 2.1–2.63: exactly one known
// policy.
func parsePolicies(raw json.RawMessage, enum []string) (string, error) {
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil || items == nil {
		return "", api.SchemaError("policies", raw, "%s is not of type 'array'", pyQuote(raw))
	}
	if len(items) > 0 {
		p, isStr := jsonString(items[0])
		if !isStr {
			return "", api.SchemaError("0", items[0], "%s is not of type 'string'", pyQuote(items[0]))
		}
		if !slices.Contains(enum, p) {
			return "", api.SchemaError("0", items[0], "'%s' is not one of %s", p, pyStrings(enum))
		}
	}
	seen := map[string]bool{}
	for _, it := range items {
		if seen[string(it)] {
			return "", api.SchemaError("policies", raw, "%s has non-unique elements", pyList(items))
		}
		seen[string(it)] = true
	}
	switch {
	case len(items) == 0:
		return "", api.SchemaError("policies", raw, "[] is too short")
	case len(items) > 1:
		return "", api.SchemaError("policies", raw, "%s is too long", pyList(items))
	}
	p, _ := jsonString(items[0])
	return p, nil
}

// parsePolicy reads the policy string of 2.64.
func parsePolicy(raw json.RawMessage, enum []string) (string, error) {
	p, isStr := jsonString(raw)
	if !isStr {
		return "", api.SchemaError("policy", raw, "%s is not of type 'string'", pyQuote(raw))
	}
	if !slices.Contains(enum, p) {
		return "", api.SchemaError("policy", raw, "'%s' is not one of %s", p, pyStrings(enum))
	}
	return p, nil
}

// parseRules reads the rules object of 2.64: only max_server_per_host, a
// positive integer (or digit string). present is false for {}.
func parseRules(raw json.RawMessage) (n int, present bool, err error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil || m == nil {
		return 0, false, api.SchemaError("rules", raw, "%s is not of type 'object'", pyQuote(raw))
	}
	if v, ok := m["max_server_per_host"]; ok {
		if n, err = rawInt("max_server_per_host", v, 1); err != nil {
			return 0, false, err
		}
	}
	if err := extraProperties("rules", m, "max_server_per_host"); err != nil {
		return 0, false, err
	}
	return n, len(m) > 0, nil
}

// extraProperties is jsonschema's additionalProperties: false, as Nova
// words it for the object at field.
func extraProperties(field string, obj map[string]json.RawMessage, allowed ...string) error {
	var extra []string
	for k := range obj {
		if !slices.Contains(allowed, k) {
			extra = append(extra, "'"+k+"'")
		}
	}
	if len(extra) == 0 {
		return nil
	}
	slices.Sort(extra)
	verb := "was"
	if len(extra) > 1 {
		verb = "were"
	}
	return api.SchemaError(field, json.RawMessage(pyMap(obj)), "Additional properties are not allowed (%s %s unexpected)", strings.Join(extra, ", "), verb)
}

// pyStrings renders a list of strings as Python prints it.
func pyStrings(l []string) string {
	q := make([]string, len(l))
	for i, s := range l {
		q[i] = "'" + s + "'"
	}
	return "[" + strings.Join(q, ", ") + "]"
}

// pyList renders a JSON list as Python prints it.
func pyList(items []json.RawMessage) string {
	q := make([]string, len(items))
	for i, it := range items {
		q[i] = pyQuote(it)
	}
	return "[" + strings.Join(q, ", ") + "]"
}

// pyQuote renders a JSON value as Python's repr does in jsonschema's
// reasons: strings quoted ("'x' is not of type 'object'").
func pyQuote(raw json.RawMessage) string {
	if s, ok := jsonString(raw); ok {
		return "'" + s + "'"
	}
	return api.PyRepr(raw)
}

// createServerGroup is POST /os-server-groups: 200 with the group. The
// project's server_groups quota is checked first (403 "Quota exceeded, too
// many server groups.").
func (s *Service) createServerGroup(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	v := VersionFrom(ctx)
	c := api.CallerFrom(ctx)
	body, err := decodeWrapped(r, "server_group")
	if err != nil {
		return nil, err
	}
	g, late, err := parseGroupCreate(body, v)
	if err != nil {
		return nil, err
	}
	g.ID, g.ProjectID, g.UserID, g.CreatedAt, g.Members = newUUID(), c.ProjectID, c.UserID, s.now(), []string{}
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		if err := lockProjectQuota(ctx, tx, c.ProjectID); err != nil {
			return err
		}
		q, err := projectQuotas(ctx, tx, c.ProjectID)
		if err != nil {
			return err
		}
		var n int
		if err := tx.QueryRow(ctx, "SELECT COUNT(*) FROM compute_server_groups WHERE project_id = ?", c.ProjectID).Scan(&n); err != nil {
			return err
		}
		if limit := q["server_groups"]; limit >= 0 && n+1 > limit {
			return api.Forbidden("Quota exceeded, too many server groups.")
		}
		if late != nil {
			return late
		}
		_, err = tx.Exec(ctx, "INSERT INTO compute_server_groups ("+groupColumns+") VALUES (?, ?, ?, ?, ?, ?, ?)",
			g.ID, g.Name, g.ProjectID, g.UserID, g.Policy, g.MaxPerHost, store.FormatTime(g.CreatedAt))
		return err
	})
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, map[string]any{"server_group": groupView(v, g)}), nil
}

// showServerGroup is GET /os-server-groups/{id}.
func (s *Service) showServerGroup(r *http.Request) (*api.Response, error) {
	g, err := s.visibleGroup(r, s.db)
	if err != nil {
		return nil, err
	}
	if err := fillMembers(r.Context(), s.db, []*serverGroup{g}); err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, map[string]any{"server_group": groupView(VersionFrom(r.Context()), g)}), nil
}

// deleteServerGroup is DELETE /os-server-groups/{id}: 204. Nova deletes a
// group that still has members; they simply stop being in a group.
func (s *Service) deleteServerGroup(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		g, err := s.visibleGroup(r, tx)
		if err != nil {
			return err
		}
		if err := lockGroup(ctx, tx, g.ID); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "DELETE FROM compute_server_group_members WHERE group_id = ?", g.ID); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, "DELETE FROM compute_server_groups WHERE id = ?", g.ID)
		return err
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(http.StatusNoContent), nil
}

// listServerGroups is GET /os-server-groups: the caller's project's groups
// or, for an admin asking all_projects (whatever its value, as Nova only
// looks for the key), every project's; limit and offset page them
// (common.get_limit_and_offset).
func (s *Service) listServerGroups(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	if err := strictQuery(r, "all_projects", "limit", "offset"); err != nil {
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
	if limit <= 0 || limit > resMaxLimit {
		limit = resMaxLimit
	}
	c := api.CallerFrom(ctx)
	where, args := " WHERE project_id = ?", []any{c.ProjectID}
	if _, all := q["all_projects"]; all && c.IsAdmin() {
		where, args = "", nil
	}
	args = append(args, limit, max(offset, 0))
	rows, err := s.db.Query(ctx, "SELECT "+groupColumns+" FROM compute_server_groups"+where+
		" ORDER BY created_at, id LIMIT ? OFFSET ?", args...)
	if err != nil {
		return nil, err
	}
	var groups []*serverGroup
	for rows.Next() {
		g, err := scanGroup(rows)
		if err != nil {
			rows.Close()
			return nil, err
		}
		groups = append(groups, g)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if err := fillMembers(ctx, s.db, groups); err != nil {
		return nil, err
	}
	v := VersionFrom(ctx)
	out := make([]any, 0, len(groups))
	for _, g := range groups {
		out = append(out, groupView(v, g))
	}
	return api.JSON(http.StatusOK, map[string]any{"server_groups": out}), nil
}

// queryNonNegative reads a parameter_types.non_negative_integer query
// parameter (the first value; -1 when absent).
func queryNonNegative(q map[string][]string, key string) (int, error) {
	vals, ok := q[key]
	if !ok || len(vals) == 0 {
		return -1, nil
	}
	val := vals[0]
	if val == "" {
		return 0, api.BadRequest("Invalid input for query parameters %s. Value: %s. '' is too short", key, val)
	}
	if strings.TrimLeft(val, "0123456789") != "" {
		return 0, api.BadRequest("Invalid input for query parameters %s. Value: %s. '%s' does not match '^[0-9]*$'", key, val, val)
	}
	n, err := strconv.Atoi(val)
	if err != nil {
		return resMaxLimit, nil // beyond any page: as good as the maximum
	}
	return n, nil
}

// groupLock is the PostgreSQL advisory lock class that serialises changes
// to one server group's members (lock key: this class and the group id's
// hash), so that concurrent creates cannot overfill its member quota and a
// delete does not race a new member. SQLite transactions are serial.
const groupLock = 7317

func lockGroup(ctx context.Context, tx *store.Tx, id string) error {
	if tx.Dialect() != store.Postgres {
		return nil
	}
	_, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(?, hashtext(?))", groupLock, id)
	return err
}

// liveMembers counts a group's members whose server is not deleted,
// counting members whose server row the current transaction has yet to
// write (Nova's server_group_members quota counts them).
func liveMembers(ctx context.Context, q store.Querier, id string) (int, error) {
	var n int
	err := q.QueryRow(ctx, `SELECT COUNT(*) FROM compute_server_group_members m WHERE m.group_id = ?
		AND NOT EXISTS (SELECT 1 FROM compute_servers s WHERE s.id = m.server_id AND s.deleted <> 0)`, id).Scan(&n)
	return n, err
}

// errGroupMembersQuota is Nova's 403 when a group is full
// (compute/api.py _provision_instances: QuotaError).
func errGroupMembersQuota() *api.Error {
	return api.Forbidden("Quota exceeded, too many servers in group")
}

// groupPlacement describes, for placing a new member of group id, the
// group's policy ("affinity", "anti-affinity", "soft-affinity",
// "soft-anti-affinity"), its max_server_per_host rule (0 = none; only
// anti-affinity groups created at 2.64+ have one), and how many of its
// current members sit on each host (members not deleted, with a host;
// servers the transaction q has placed count). q may be a transaction.
// A group that does not exist is Nova's 400 "Instance group <id> could not
// be found.".
func (s *Service) groupPlacement(ctx context.Context, q store.Querier, id string) (policy string, maxPerHost int, hosts map[string]int, err error) {
	g, err := loadGroup(ctx, q, id, "")
	if err != nil {
		return "", 0, nil, notFoundAs(err, api.BadRequest("%s", groupNotFound(id).Message))
	}
	rows, err := q.Query(ctx, `SELECT s.host, COUNT(*) FROM compute_server_group_members m
		JOIN compute_servers s ON s.id = m.server_id
		WHERE m.group_id = ? AND s.deleted = 0 AND s.host <> '' GROUP BY s.host`, g.ID)
	if err != nil {
		return "", 0, nil, err
	}
	defer rows.Close()
	hosts = map[string]int{}
	for rows.Next() {
		var h string
		var n int
		if err := rows.Scan(&h, &n); err != nil {
			return "", 0, nil, err
		}
		hosts[h] = n
	}
	if err := rows.Err(); err != nil {
		return "", 0, nil, err
	}
	if g.Policy == "anti-affinity" {
		maxPerHost = g.MaxPerHost
	}
	return g.Policy, maxPerHost, hosts, nil
}

// checkGroupForCreate checks, before a create, that group id exists and is
// visible to project (or the caller is an admin, as Nova's admin context
// sees every group); else Nova's 400 "Instance group <id> could not be
// found." (servers.py create maps InstanceGroupNotFound to 400). Then that
// count more members fit the project's server_group_members quota: else
// 403 "Quota exceeded, too many servers in group".
func (s *Service) checkGroupForCreate(ctx context.Context, projectID, id string, count int) error {
	owner := projectID
	if api.CallerFrom(ctx).IsAdmin() {
		owner = ""
	}
	g, err := loadGroup(ctx, s.db, id, owner)
	if err != nil {
		return notFoundAs(err, api.BadRequest("%s", groupNotFound(id).Message))
	}
	q, err := projectQuotas(ctx, s.db, projectID)
	if err != nil {
		return err
	}
	n, err := liveMembers(ctx, s.db, g.ID)
	if err != nil {
		return err
	}
	if limit := q["server_group_members"]; limit >= 0 && n+count > limit {
		return errGroupMembersQuota()
	}
	return nil
}

// addGroupMember records serverID as a member of group id, in tx (called
// in the create transaction, before or after the server row is written).
// It re-checks the member quota under the group's lock, as Nova rechecks
// ([quota]recheck_quota), so concurrent creates cannot overfill a group:
// 403 as checkGroupForCreate; a group deleted meanwhile is the same 400.
func (s *Service) addGroupMember(ctx context.Context, tx *store.Tx, id, serverID string) error {
	id = canonicalUUID(id)
	if err := lockGroup(ctx, tx, id); err != nil {
		return err
	}
	g, err := loadGroup(ctx, tx, id, "")
	if err != nil {
		return notFoundAs(err, api.BadRequest("%s", groupNotFound(id).Message))
	}
	if _, err := tx.Exec(ctx, "INSERT INTO compute_server_group_members (server_id, group_id, created_at) VALUES (?, ?, ?)",
		serverID, g.ID, store.FormatTime(s.now())); err != nil {
		return err
	}
	project := g.ProjectID
	if c := api.CallerFrom(ctx); c != nil && c.ProjectID != "" {
		project = c.ProjectID
	}
	q, err := projectQuotas(ctx, tx, project)
	if err != nil {
		return err
	}
	n, err := liveMembers(ctx, tx, g.ID)
	if err != nil {
		return err
	}
	if limit := q["server_group_members"]; limit >= 0 && n > limit {
		return errGroupMembersQuota()
	}
	return nil
}

// removeGroupMember drops serverID from whatever group holds it, in tx
// (called when a server is deleted).
func (s *Service) removeGroupMember(ctx context.Context, tx *store.Tx, serverID string) error {
	_, err := tx.Exec(ctx, "DELETE FROM compute_server_group_members WHERE server_id = ?", serverID)
	return err
}

// serverGroupsOf returns the ids of the groups serverID is a member of (for
// the 2.71 view; Nova's InstanceGroup.get_by_instance_uuid gives at most
// one).
func (s *Service) serverGroupsOf(ctx context.Context, q store.Querier, serverID string) ([]string, error) {
	rows, err := q.Query(ctx, "SELECT group_id FROM compute_server_group_members WHERE server_id = ?", serverID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []string{}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		out = append(out, id)
	}
	return out, rows.Err()
}
