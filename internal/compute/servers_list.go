package compute

import (
	"math"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// maxLimit is Nova's [api]max_limit.
const maxLimit = 1000

// maxServerTags is Nova's per-server tag limit; maxSortKeys bounds a list's
// sort keys (a server list has fewer columns to sort on).
const (
	maxServerTags = 50
	maxSortKeys   = 10
)

// limitRule is nova/api/openstack/common.py get_pagination_params: limit=0
// is an empty page, past max_limit is max_limit.
var limitRule = api.IntRule{
	Default: maxLimit, Min: 0, Max: maxLimit,
	NotInt:   func(string) error { return api.BadRequest("limit param must be an integer") },
	TooSmall: func(string) error { return api.BadRequest("limit param must be positive") },
}

func parseLimit(s string) (int, error) { return limitRule.Parse(s, s != "") }

// parseISOTime reads the timestamps Nova's query schemas accept.
func parseISOTime(s string) (time.Time, error) {
	for _, l := range []string{time.RFC3339Nano, "2006-01-02T15:04:05", "2006-01-02T15:04:05.999999", "2006-01-02 15:04:05.999999",
		"2006-01-02 15:04:05", "2006-01-02T15:04:05.999999Z07:00", "2006-01-02T15:04Z07:00", "2006-01-02"} {
		if t, err := time.Parse(l, s); err == nil {
			return t.UTC(), nil
		}
	}
	return time.Time{}, api.BadRequest("Invalid timestamp %s", s)
}

// onlyParams rejects query parameters outside allowed (2.75+ behaviour).
func onlyParams(q url.Values, allowed ...string) error {
	for k := range q {
		ok := false
		for _, a := range allowed {
			if k == a {
				ok = true
				break
			}
		}
		if !ok {
			return api.BadRequest("Invalid input for query parameters %s. Value: %s. Additional properties are not allowed ('%s' was unexpected)", k, q.Get(k), k)
		}
	}
	return nil
}

var userFilters = []string{"reservation_id", "name", "status", "image", "flavor", "ip", "changes-since",
	"ip6", "tags", "tags-any", "not-tags", "not-tags-any", "changes-before", "locked",
	"availability_zone", "config_drive", "key_name", "created_at", "launched_at", "terminated_at",
	"power_state", "task_state", "vm_state", "progress", "user_id", "hostname"}

var adminFilters = []string{"all_tenants", "deleted", "host", "node", "project_id", "tenant_id", "soft_deleted",
	"uuid", "access_ip_v4", "access_ip_v6", "auto_disk_config", "display_description", "display_name",
	"image_ref", "instance_type_id", "kernel_id", "launch_index", "locked_by", "ramdisk_id",
	"root_device_name", "vm_mode", "description", "hidden", "pinned_availability_zone"}

var pageParams = []string{"limit", "marker", "sort_key", "sort_dir"}

// sortColumns maps Nova's sort keys (schemas/servers.py SERVER_LIST_IGNORE_SORT_KEY
// and VALID_SORT_KEYS) to columns; keys Nimbus has no column for sort by creation.
var sortColumns = map[string]string{
	"created_at": "created_at", "display_name": "name", "host": "host", "hostname": "hostname",
	"image_ref": "image_ref", "key_name": "key_name", "launch_index": "launch_index", "launched_at": "launched_at",
	"locked": "locked", "power_state": "power_state", "project_id": "project_id", "task_state": "task_state",
	"terminated_at": "terminated_at", "updated_at": "updated_at", "user_id": "user_id", "uuid": "id",
	"vm_state": "vm_state", "availability_zone": "availability_zone", "node": "host", "instance_type_id": "flavor_id",
	"access_ip_v4": "created_at", "access_ip_v6": "created_at", "auto_disk_config": "created_at",
	"config_drive": "created_at", "display_description": "created_at", "kernel_id": "created_at",
	"locked_by": "locked", "progress": "created_at", "ramdisk_id": "created_at", "root_device_name": "created_at",
	"vm_mode": "created_at",
}

func likeEscape(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`)
	return r.Replace(s)
}

// serverList is one GET /servers request being read: its query, the SQL
// page it becomes, and the filters SQL cannot apply (Nova's name and ip
// filters are Python regular expressions).
type serverList struct {
	r              *http.Request
	q              url.Values
	v              Version
	c              *api.Caller
	page           api.Page
	includeDeleted bool
	name, ip, ip6  *regexp.Regexp
}

func (l *serverList) get(k string) (string, bool) {
	if _, ok := l.q[k]; !ok {
		return "", false
	}
	return l.q.Get(k), true
}

// postFiltered reports whether rows are filtered after SQL, so that SQL
// cannot stop at the page's limit.
func (l *serverList) postFiltered() bool { return l.name != nil || l.ip != nil || l.ip6 != nil }

// serverFilters read the query in Nova's order of checks
// (servers.py _get_servers): the first bad parameter is the one reported.
var serverFilters = []func(l *serverList) error{
	(*serverList).tenantFilter,
	(*serverList).deletedFilters,
	(*serverList).statusFilter,
	(*serverList).equalityFilters,
	(*serverList).powerStateFilter,
	(*serverList).lockedFilter,
	(*serverList).tagFilters,
	(*serverList).sortAndPage,
	(*serverList).regexFilters,
}

// handleList is GET /servers and /servers/detail (servers.py _get_servers).
func (s *Service) handleList(detail bool) api.HandlerFunc {
	return func(r *http.Request) (*api.Response, error) {
		ctx := r.Context()
		l := &serverList{r: r, q: r.URL.Query(), v: VersionFrom(ctx), c: api.CallerFrom(ctx)}
		if l.v.AtLeast(75) {
			allowed := append(append(append([]string{}, userFilters...), adminFilters...), pageParams...)
			if err := onlyParams(l.q, allowed...); err != nil {
				return nil, err
			}
		}
		for _, f := range serverFilters {
			if err := f(l); err != nil {
				return nil, err
			}
		}
		if err := s.afterMarker(l); err != nil {
			return nil, err
		}
		if !detail && l.ip == nil && l.ip6 == nil {
			// The index view needs only ids and names: no documents, no
			// addresses (clients poll it, e.g. ?status=ACTIVE).
			return s.listIndex(l)
		}
		return s.listDetail(l, detail)
	}
}

// tenantFilter is all_tenants (admins only) and the project it narrows to.
func (l *serverList) tenantFilter() error {
	allTenants := false
	if at, ok := l.get("all_tenants"); ok {
		if !l.c.IsAdmin() {
			return api.PolicyForbidden("os_compute_api:servers:index:get_all_tenants")
		}
		b, valid := api.ParseBool(at)
		allTenants = at == "" || !valid || b
	}
	if !allTenants {
		l.page.Add("project_id = ?", l.c.ProjectID)
	} else if p, ok := l.get("project_id"); ok {
		l.page.Add("project_id = ?", p)
	} else if p, ok := l.get("tenant_id"); ok {
		l.page.Add("project_id = ?", p)
	}
	return nil
}

// deletedFilters is deleted (admins), changes-since and changes-before
// (2.66): each shows deleted servers too.
func (l *serverList) deletedFilters() error {
	if d, ok := l.get("deleted"); ok && l.c.IsAdmin() {
		if b, _ := api.ParseBool(d); b {
			l.page.Add("deleted = 1")
		} else {
			l.page.Add("deleted = 0")
		}
		l.includeDeleted = true
	}
	for _, tf := range []struct {
		param, cond string
		minV        int
	}{{"changes-since", "updated_at >= ?", 0}, {"changes-before", "updated_at <= ?", 66}} {
		raw, ok := l.get(tf.param)
		if !ok || !l.v.AtLeast(tf.minV) {
			continue
		}
		t, err := parseISOTime(raw)
		if err != nil {
			return api.BadRequest("Invalid input for query parameters %s. Value: %s. '%s' is not a 'date-time'", tf.param, raw, raw)
		}
		l.page.Add(tf.cond, store.FormatTime(t))
		l.includeDeleted = true
	}
	if !l.includeDeleted {
		l.page.Add("deleted = 0")
	}
	return nil
}

// statusFilter maps each status to its vm and task states; an unknown one
// is 400 from 2.38 and matches nothing before.
func (l *serverList) statusFilter() error {
	sts, ok := l.q["status"]
	if !ok {
		return nil
	}
	var ors []string
	var args []any
	for _, st := range sts {
		fs, known := statusFilters(st)
		if !known {
			if l.v.AtLeast(38) {
				return api.BadRequest("Invalid status value")
			}
			ors = append(ors, "1=0")
			continue
		}
		for _, f := range fs {
			if f.tasks == nil {
				ors, args = append(ors, "vm_state = ?"), append(args, f.vm)
				continue
			}
			in, tasks := api.InList(f.tasks)
			ors, args = append(ors, "(vm_state = ? AND task_state "+in+")"), append(append(args, f.vm), tasks...)
		}
	}
	l.page.Add("("+strings.Join(ors, " OR ")+")", args...)
	return nil
}

// equalityFilter is a query parameter that selects one column value.
type equalityFilter struct {
	param, col string
	adminOnly  bool
	// minV is the microversion from which non-admins may use it (0: any).
	minV int
}

var equalityFilters = []equalityFilter{
	{"reservation_id", "reservation_id", false, 0},
	{"image", "image_ref", false, 0},
	{"flavor", "flavor_id", false, 0},
	{"availability_zone", "availability_zone", false, 83},
	{"key_name", "key_name", false, 83},
	{"task_state", "task_state", false, 83},
	{"vm_state", "vm_state", false, 83},
	{"user_id", "user_id", false, 83},
	{"hostname", "hostname", false, 90},
	{"host", "host", true, 0},
	{"node", "host", true, 0},
	{"uuid", "id", true, 0},
}

func (l *serverList) equalityFilters() error {
	admin := l.c.IsAdmin()
	for _, f := range equalityFilters {
		val, ok := l.get(f.param)
		if !ok || (f.adminOnly && !admin) || (f.minV != 0 && !l.v.AtLeast(f.minV) && !admin) {
			continue
		}
		if i := strings.LastIndexByte(val, '/'); i >= 0 && (f.param == "image" || f.param == "flavor") {
			val = val[i+1:] // an image or flavor link names it by its last segment
		}
		l.page.Add(f.col+" = ?", val)
	}
	return nil
}

var powerStateRule = api.IntRule{Min: math.MinInt, NotInt: func(raw string) error {
	return api.BadRequest("Invalid input for query parameters power_state. Value: %s.", raw)
}}

func (l *serverList) powerStateFilter() error {
	ps, ok := l.get("power_state")
	if !ok || (!l.v.AtLeast(83) && !l.c.IsAdmin()) {
		return nil
	}
	n, err := powerStateRule.Parse(ps, true)
	if err != nil {
		return err
	}
	if n != int(int32(n)) {
		// No server has it, and PostgreSQL refuses it for an INTEGER.
		l.page.Add("1 = 0")
		return nil
	}
	l.page.Add("power_state = ?", n)
	return nil
}

func (l *serverList) lockedFilter() error {
	raw, ok := l.get("locked")
	if !ok || !l.v.AtLeast(73) {
		return nil
	}
	b, valid := api.ParseBool(raw)
	if !valid {
		return api.BadRequest("Unrecognized value '%s', acceptable values are: '0', '1', 'f', 'false', 'n', 'no', 'off', 'on', 't', 'true', 'y', 'yes'", raw)
	}
	l.page.Add("locked = ?", b2i(b))
	return nil
}

// tagFilters are tags, tags-any, not-tags and not-tags-any (2.26); tags
// are stored as ",a,b," so that LIKE finds whole tags.
func (l *serverList) tagFilters() error {
	if !l.v.AtLeast(26) {
		return nil
	}
	for _, tf := range []struct {
		param, join string
		negate      bool
	}{{"tags", " AND ", false}, {"tags-any", " OR ", false}, {"not-tags", " AND ", true}, {"not-tags-any", " OR ", true}} {
		val, ok := l.get(tf.param)
		if !ok || val == "" {
			continue
		}
		tags := strings.Split(val, ",")
		if len(tags) > maxServerTags {
			// A server holds at most that many: a longer filter only makes
			// a longer query.
			return api.BadRequest("Invalid input for query parameters %s: at most %d tags.", tf.param, maxServerTags)
		}
		conds, args := make([]string, len(tags)), make([]any, len(tags))
		for i, t := range tags {
			conds[i], args[i] = `tags LIKE ? ESCAPE '\'`, "%,"+likeEscape(t)+",%"
		}
		cond := "(" + strings.Join(conds, tf.join) + ")"
		if tf.negate {
			cond = "NOT " + cond
		}
		l.page.Add(cond, args...)
	}
	return nil
}

// sortAndPage reads sort_key/sort_dir (a key without a direction takes the
// last one given, else desc; the default is created_at) and limit. The id
// ends the keys so that a marker is exact.
func (l *serverList) sortAndPage() error {
	keys, dirs := l.q["sort_key"], l.q["sort_dir"]
	if len(keys) > maxSortKeys || len(dirs) > maxSortKeys {
		return api.BadRequest("Invalid input for query parameters sort_key: at most %d sort keys.", maxSortKeys)
	}
	for _, d := range dirs {
		if d != "asc" && d != "desc" {
			return api.BadRequest("Invalid input for query parameters sort_dir. Value: %s. '%s' is not one of ['asc', 'desc']", d, d)
		}
	}
	for i, k := range keys {
		col, ok := sortColumns[k]
		if !ok || (k == "locked" && !l.v.AtLeast(73)) {
			return api.BadRequest("Invalid input for query parameters sort_key. Value: %s.", k)
		}
		d := "desc"
		if i < len(dirs) {
			d = dirs[i]
		} else if len(dirs) > 0 {
			d = dirs[len(dirs)-1]
		}
		l.page.Keys = append(l.page.Keys, api.SortKey{Col: col, Desc: d == "desc"})
	}
	if len(l.page.Keys) == 0 {
		l.page.Keys = api.Keyset{{Col: "created_at", Desc: len(dirs) == 0 || dirs[0] != "asc"}}
	}
	l.page.Keys = append(l.page.Keys, api.SortKey{Col: "id", Desc: l.page.Keys[len(l.page.Keys)-1].Desc})
	var err error
	l.page.Limit, err = parseLimit(l.q.Get("limit"))
	return err
}

// regexFilters are name, ip and ip6 (2.5): Nova matches them as regular
// expressions, or as text when they do not compile.
func (l *serverList) regexFilters() error {
	l.name = l.regexParam("name", 0)
	l.ip = l.regexParam("ip", 0)
	l.ip6 = l.regexParam("ip6", 5)
	return nil
}

func (l *serverList) regexParam(param string, minV int) *regexp.Regexp {
	val, ok := l.get(param)
	if !ok || !l.v.AtLeast(minV) {
		return nil
	}
	re, err := regexp.Compile(val)
	if err != nil {
		re = regexp.MustCompile(regexp.QuoteMeta(val))
	}
	return re
}

// afterMarker narrows the page to the servers after the marker's sort
// values.
func (s *Service) afterMarker(l *serverList) error {
	marker, ok := l.get("marker")
	if !ok {
		return nil
	}
	vals, err := l.page.Keys.MarkerValues(l.r.Context(), s.db, "compute_servers", "id = ?", marker)
	if err == store.ErrNotFound {
		return api.BadRequest("marker [%s] not found", marker)
	} else if err != nil {
		return err
	}
	l.page.AfterMarker(vals)
	return nil
}

// sqlPage is the page's SQL: without a limit when rows are filtered after
// it (the scan then stops at the limit itself).
func (l *serverList) sqlPage() string {
	p := l.page
	if l.postFiltered() {
		p.Limit = -1
	}
	return p.SQL()
}

// listIndex answers GET /servers from ids and names alone.
func (s *Service) listIndex(l *serverList) (*api.Response, error) {
	rows, err := s.db.Query(l.r.Context(), "SELECT id, name FROM compute_servers "+l.sqlPage(), l.page.Args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	b := make([]byte, 0, 4096)
	b = append(b, `{"servers":[`...)
	n, last := 0, ""
	for n < l.page.Limit && rows.Next() {
		var id, name string
		if err := rows.Scan(&id, &name); err != nil {
			return nil, err
		}
		if l.name != nil && !l.name.MatchString(name) {
			continue
		}
		if n > 0 {
			b = append(b, ',')
		}
		b = obj{{"id", id}, {"name", name}, {"links", links(l.r, "servers/"+id)}}.appendJSON(b)
		n, last = n+1, id
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return serversPage(l, b, "servers", n, last), nil
}

// listDetail answers GET /servers/detail, and GET /servers with an ip
// filter, which needs the servers' addresses.
func (s *Service) listDetail(l *serverList, detail bool) (*api.Response, error) {
	svs, err := s.loadPage(l)
	if err != nil {
		return nil, err
	}
	vc, err := s.newViewCtx(l.r, svs)
	if err != nil {
		return nil, err
	}
	if l.ip != nil || l.ip6 != nil {
		svs = matchAddresses(svs, vc, l.ip, l.ip6)
	}
	if len(svs) > l.page.Limit {
		svs = svs[:l.page.Limit]
	}
	// The page is encoded by hand (views_json.go): with 1000 servers,
	// reflection-based encoding would dominate the answer time.
	b := make([]byte, 0, 256+len(svs)*1800)
	b = append(b, `{"servers":[`...)
	for i, sv := range svs {
		if i > 0 {
			b = append(b, ',')
		}
		if detail {
			b = vc.serverView(sv, false).appendJSON(b)
		} else {
			b = obj{{"id", sv.ID}, {"name", sv.Name}, {"links", links(l.r, "servers/"+sv.ID)}}.appendJSON(b)
		}
	}
	path, last := "servers", ""
	if detail {
		path = "servers/detail"
	}
	if len(svs) > 0 {
		last = svs[len(svs)-1].ID
	}
	return serversPage(l, b, path, len(svs), last), nil
}

// loadPage reads the page's servers that match the name filter; without an
// address filter it stops at the limit.
func (s *Service) loadPage(l *serverList) ([]*server, error) {
	rows, err := s.db.Query(l.r.Context(), "SELECT "+serverCols+" FROM compute_servers "+l.sqlPage(), l.page.Args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var svs []*server
	for (l.ip != nil || l.ip6 != nil || len(svs) < l.page.Limit) && rows.Next() {
		sv, err := s.scanServerCached(rows)
		if err != nil {
			return nil, err
		}
		if l.name == nil || l.name.MatchString(sv.Name) {
			svs = append(svs, sv)
		}
	}
	return svs, rows.Err()
}

// matchAddresses keeps the servers with an IPv4 address matching ip or an
// IPv6 one matching ip6.
func matchAddresses(svs []*server, vc *viewCtx, ip, ip6 *regexp.Regexp) []*server {
	kept := svs[:0]
	for _, sv := range svs {
		match := false
		for _, addrs := range vc.addresses[sv.ID] {
			for _, a := range addrs {
				if (ip != nil && a.Version == 4 && ip.MatchString(a.Addr)) || (ip6 != nil && a.Version == 6 && ip6.MatchString(a.Addr)) {
					match = true
				}
			}
		}
		if match {
			kept = append(kept, sv)
		}
	}
	return kept
}

// serversPage closes the servers array and, when the page is full, adds
// servers_links with the next page's URL, keeping the request's other
// parameters (nova/api/openstack/common.py _get_next_link).
func serversPage(l *serverList, b []byte, path string, n int, last string) *api.Response {
	b = append(b, ']')
	if n == l.page.Limit && n > 0 {
		href := links(l.r, path)[0]["href"] + "?" +
			api.NextQuery(l.q, map[string]string{"limit": strconv.Itoa(l.page.Limit), "marker": last})
		b = append(b, `,"servers_links":`...)
		b = appendJSONValue(b, []any{obj{{"rel", "next"}, {"href", href}}})
	}
	b = append(b, '}')
	return (&api.Response{Status: http.StatusOK, Body: b}).WithHeader("Content-Type", "application/json")
}
