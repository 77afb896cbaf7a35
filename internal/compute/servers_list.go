package compute

import (
	"net/http"
	"net/url"
	"regexp"
	"sort"
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

func parseLimit(s string) (int, error) {
	if s == "" {
		return maxLimit, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, api.BadRequest("limit param must be an integer")
	}
	if n < 0 {
		return 0, api.BadRequest("limit param must be positive")
	}
	// limit=0 is an empty page, as nova's get_limit_and_marker gives.
	if n > maxLimit {
		n = maxLimit
	}
	return n, nil
}

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

func boolParam(s string) (bool, bool) {
	switch strings.ToLower(s) {
	case "1", "t", "true", "on", "y", "yes":
		return true, true
	case "0", "f", "false", "off", "n", "no":
		return false, true
	}
	return false, false
}

func likeEscape(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`)
	return r.Replace(s)
}

type sortSpec struct {
	col  string
	desc bool
}

// handleList is GET /servers and /servers/detail (servers.py _get_servers).
func (s *Service) handleList(detail bool) api.HandlerFunc {
	return func(r *http.Request) (*api.Response, error) {
		ctx := r.Context()
		v := VersionFrom(ctx)
		c := api.CallerFrom(ctx)
		q := r.URL.Query()
		if v.AtLeast(75) {
			allowed := append(append(append([]string{}, userFilters...), adminFilters...), pageParams...)
			if err := onlyParams(q, allowed...); err != nil {
				return nil, err
			}
		}
		get := func(k string) (string, bool) {
			if _, ok := q[k]; !ok {
				return "", false
			}
			return q.Get(k), true
		}
		where := []string{}
		args := []any{}
		add := func(cond string, a ...any) { where = append(where, cond); args = append(args, a...) }

		allTenants := false
		if at, ok := get("all_tenants"); ok {
			if !c.IsAdmin() {
				return nil, api.PolicyForbidden("os_compute_api:servers:index:get_all_tenants")
			}
			b, valid := boolParam(at)
			allTenants = at == "" || !valid || b
		}
		if !allTenants {
			add("project_id = ?", c.ProjectID)
		} else if p, ok := get("project_id"); ok {
			add("project_id = ?", p)
		} else if p, ok := get("tenant_id"); ok {
			add("project_id = ?", p)
		}
		includeDeleted := false
		if d, ok := get("deleted"); ok && c.IsAdmin() {
			b, _ := boolParam(d)
			if b {
				add("deleted = 1")
			} else {
				add("deleted = 0")
			}
			includeDeleted = true
		}
		if cs, ok := get("changes-since"); ok {
			t, err := parseISOTime(cs)
			if err != nil {
				return nil, api.BadRequest("Invalid input for query parameters changes-since. Value: %s. '%s' is not a 'date-time'", cs, cs)
			}
			add("updated_at >= ?", store.FormatTime(t))
			includeDeleted = true
		}
		if cb, ok := get("changes-before"); ok && v.AtLeast(66) {
			t, err := parseISOTime(cb)
			if err != nil {
				return nil, api.BadRequest("Invalid input for query parameters changes-before. Value: %s. '%s' is not a 'date-time'", cb, cb)
			}
			add("updated_at <= ?", store.FormatTime(t))
			includeDeleted = true
		}
		if !includeDeleted {
			add("deleted = 0")
		}
		if sts, ok := q["status"]; ok {
			var ors []string
			for _, st := range sts {
				fs, known := statusFilters(st)
				if !known {
					if v.AtLeast(38) {
						return nil, api.BadRequest("Invalid status value")
					}
					ors = append(ors, "1=0")
					continue
				}
				for _, f := range fs {
					if f.tasks == nil {
						ors = append(ors, "vm_state = ?")
						args = append(args, f.vm)
					} else {
						ors = append(ors, "(vm_state = ? AND task_state IN ("+placeholders(len(f.tasks))+"))")
						args = append(args, f.vm)
						for _, t := range f.tasks {
							args = append(args, t)
						}
					}
				}
			}
			where = append(where, "("+strings.Join(ors, " OR ")+")")
		}
		eq := func(param, col string, admin bool, minV int) {
			if val, ok := get(param); ok && (!admin || c.IsAdmin()) && (minV == 0 || v.AtLeast(minV) || c.IsAdmin()) {
				if i := strings.LastIndexByte(val, '/'); i >= 0 && (param == "image" || param == "flavor") {
					val = val[i+1:]
				}
				add(col+" = ?", val)
			}
		}
		eq("reservation_id", "reservation_id", false, 0)
		eq("image", "image_ref", false, 0)
		eq("flavor", "flavor_id", false, 0)
		eq("availability_zone", "availability_zone", false, 83)
		eq("key_name", "key_name", false, 83)
		eq("task_state", "task_state", false, 83)
		eq("vm_state", "vm_state", false, 83)
		eq("user_id", "user_id", false, 83)
		eq("hostname", "hostname", false, 90)
		eq("host", "host", true, 0)
		eq("node", "host", true, 0)
		eq("uuid", "id", true, 0)
		if ps, ok := get("power_state"); ok && (v.AtLeast(83) || c.IsAdmin()) {
			n, err := strconv.Atoi(ps)
			if err != nil {
				return nil, api.BadRequest("Invalid input for query parameters power_state. Value: %s.", ps)
			}
			add("power_state = ?", n)
		}
		if l, ok := get("locked"); ok && v.AtLeast(73) {
			b, valid := boolParam(l)
			if !valid {
				return nil, api.BadRequest("Unrecognized value '%s', acceptable values are: '0', '1', 'f', 'false', 'n', 'no', 'off', 'on', 't', 'true', 'y', 'yes'", l)
			}
			add("locked = ?", b2i(b))
		}
		if v.AtLeast(26) {
			var tagErr error
			tagConds := func(param string, join string, negate bool) {
				val, ok := get(param)
				if !ok || val == "" {
					return
				}
				tags := strings.Split(val, ",")
				if len(tags) > maxServerTags {
					// A server holds at most that many: a longer filter
					// only makes a longer query.
					tagErr = api.BadRequest("Invalid input for query parameters %s: at most %d tags.", param, maxServerTags)
					return
				}
				var cs []string
				for _, t := range tags {
					cs = append(cs, `tags LIKE ? ESCAPE '\'`)
					args = append(args, "%,"+likeEscape(t)+",%")
				}
				cond := "(" + strings.Join(cs, join) + ")"
				if negate {
					cond = "NOT " + cond
				}
				where = append(where, cond)
			}
			tagConds("tags", " AND ", false)
			tagConds("tags-any", " OR ", false)
			tagConds("not-tags", " AND ", true)
			tagConds("not-tags-any", " OR ", true)
			if tagErr != nil {
				return nil, tagErr
			}
		}
		// Sorting.
		keys, dirs := q["sort_key"], q["sort_dir"]
		if len(keys) > maxSortKeys || len(dirs) > maxSortKeys {
			return nil, api.BadRequest("Invalid input for query parameters sort_key: at most %d sort keys.", maxSortKeys)
		}
		for _, d := range dirs {
			if d != "asc" && d != "desc" {
				return nil, api.BadRequest("Invalid input for query parameters sort_dir. Value: %s. '%s' is not one of ['asc', 'desc']", d, d)
			}
		}
		var sorts []sortSpec
		for i, k := range keys {
			col, ok := sortColumns[k]
			if !ok || (k == "locked" && !v.AtLeast(73)) {
				return nil, api.BadRequest("Invalid input for query parameters sort_key. Value: %s.", k)
			}
			d := "desc"
			if i < len(dirs) {
				d = dirs[i]
			} else if len(dirs) > 0 {
				d = dirs[len(dirs)-1]
			}
			if d != "asc" && d != "desc" {
				return nil, api.BadRequest("Invalid input for query parameters sort_dir. Value: %s.", d)
			}
			sorts = append(sorts, sortSpec{col, d == "desc"})
		}
		if len(sorts) == 0 {
			d := true
			if len(dirs) > 0 {
				d = dirs[0] != "asc"
			}
			sorts = []sortSpec{{"created_at", d}}
		}
		sorts = append(sorts, sortSpec{"id", sorts[len(sorts)-1].desc})
		limit, err := parseLimit(q.Get("limit"))
		if err != nil {
			return nil, err
		}
		if marker, ok := get("marker"); ok {
			cols := make([]string, len(sorts))
			for i, sp := range sorts {
				cols[i] = sp.col
			}
			vals := make([]any, len(sorts))
			ptrs := make([]any, len(sorts))
			for i := range vals {
				ptrs[i] = &vals[i]
			}
			err := s.db.QueryRow(ctx, "SELECT "+strings.Join(cols, ", ")+" FROM compute_servers WHERE id = ?", marker).Scan(ptrs...)
			if err != nil {
				if store.IsNoRows(err) {
					return nil, api.BadRequest("marker [%s] not found", marker)
				}
				return nil, err
			}
			var ors []string
			for i, sp := range sorts {
				var ands []string
				for j := 0; j < i; j++ {
					ands = append(ands, sorts[j].col+" = ?")
					args = append(args, vals[j])
				}
				op := " > ?"
				if sp.desc {
					op = " < ?"
				}
				ands = append(ands, sp.col+op)
				args = append(args, vals[i])
				ors = append(ors, "("+strings.Join(ands, " AND ")+")")
			}
			where = append(where, "("+strings.Join(ors, " OR ")+")")
		}
		var order []string
		for _, sp := range sorts {
			d := " ASC"
			if sp.desc {
				d = " DESC"
			}
			order = append(order, sp.col+d)
		}
		var nameRE *regexp.Regexp
		if n, ok := get("name"); ok {
			if nameRE, err = regexp.Compile(n); err != nil {
				nameRE = regexp.MustCompile(regexp.QuoteMeta(n))
			}
		}
		var ipRE, ip6RE *regexp.Regexp
		if ip, ok := get("ip"); ok {
			if ipRE, err = regexp.Compile(ip); err != nil {
				ipRE = regexp.MustCompile(regexp.QuoteMeta(ip))
			}
		}
		if ip, ok := get("ip6"); ok && v.AtLeast(5) {
			if ip6RE, err = regexp.Compile(ip); err != nil {
				ip6RE = regexp.MustCompile(regexp.QuoteMeta(ip))
			}
		}
		postFilter := nameRE != nil || ipRE != nil || ip6RE != nil
		where2 := strings.Join(where, " AND ") + " ORDER BY " + strings.Join(order, ", ")
		if !postFilter {
			where2 += " LIMIT " + strconv.Itoa(limit)
		}
		if !detail && ipRE == nil && ip6RE == nil {
			// The index view needs only ids and names: no documents, no
			// addresses (clients poll it, e.g. ?status=ACTIVE).
			return s.listIndex(r, q, where2, args, nameRE, limit)
		}
		query := "SELECT " + serverCols + " FROM compute_servers WHERE " + where2
		rows, err := s.db.Query(ctx, query, args...)
		if err != nil {
			return nil, err
		}
		var svs []*server
		for rows.Next() {
			sv, err := s.scanServerCached(rows)
			if err != nil {
				rows.Close()
				return nil, err
			}
			if nameRE != nil && !nameRE.MatchString(sv.Name) {
				continue
			}
			svs = append(svs, sv)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
		vc, err := s.newViewCtx(r, svs)
		if err != nil {
			return nil, err
		}
		if ipRE != nil || ip6RE != nil {
			kept := svs[:0]
			for _, sv := range svs {
				match := false
				for _, addrs := range vc.addresses[sv.ID] {
					for _, a := range addrs {
						if (ipRE != nil && a.Version == 4 && ipRE.MatchString(a.Addr)) || (ip6RE != nil && a.Version == 6 && ip6RE.MatchString(a.Addr)) {
							match = true
						}
					}
				}
				if match {
					kept = append(kept, sv)
				}
			}
			svs = kept
		}
		if len(svs) > limit {
			svs = svs[:limit]
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
				b = obj{{"id", sv.ID}, {"name", sv.Name}, {"links", links(r, "servers/"+sv.ID)}}.appendJSON(b)
			}
		}
		b = append(b, ']')
		if len(svs) == limit && limit > 0 {
			path := "servers"
			if detail {
				path = "servers/detail"
			}
			b = appendNextLink(r, b, q, path, limit, svs[len(svs)-1].ID)
		}
		b = append(b, '}')
		return (&api.Response{Status: http.StatusOK, Body: b}).WithHeader("Content-Type", "application/json"), nil
	}
}

func encodeSorted(q url.Values) string {
	keys := make([]string, 0, len(q))
	for k := range q {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		for _, v := range q[k] {
			parts = append(parts, url.QueryEscape(k)+"="+url.QueryEscape(v))
		}
	}
	return strings.Join(parts, "&")
}

func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?,", n), ",")
}

// listIndex answers GET /servers from ids and names alone.
func (s *Service) listIndex(r *http.Request, q url.Values, where string, args []any, nameRE *regexp.Regexp, limit int) (*api.Response, error) {
	rows, err := s.db.Query(r.Context(), "SELECT id, name FROM compute_servers WHERE "+where, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	b := make([]byte, 0, 4096)
	b = append(b, `{"servers":[`...)
	n, last := 0, ""
	for rows.Next() && n < limit {
		var id, name string
		if err := rows.Scan(&id, &name); err != nil {
			return nil, err
		}
		if nameRE != nil && !nameRE.MatchString(name) {
			continue
		}
		if n > 0 {
			b = append(b, ',')
		}
		b = obj{{"id", id}, {"name", name}, {"links", links(r, "servers/"+id)}}.appendJSON(b)
		n, last = n+1, id
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	b = append(b, ']')
	if n == limit && limit > 0 {
		b = appendNextLink(r, b, q, "servers", limit, last)
	}
	b = append(b, '}')
	return (&api.Response{Status: http.StatusOK, Body: b}).WithHeader("Content-Type", "application/json"), nil
}

// appendNextLink adds servers_links with the next page's URL, keeping the
// request's other parameters (nova/api/openstack/common.py _get_next_link).
func appendNextLink(r *http.Request, b []byte, q url.Values, path string, limit int, last string) []byte {
	nq := url.Values{}
	for k, vs := range q {
		nq[k] = vs
	}
	nq.Set("limit", strconv.Itoa(limit))
	nq.Set("marker", last)
	href := links(r, path)[0]["href"] + "?" + encodeSorted(nq)
	b = append(b, `,"servers_links":`...)
	return appendJSONValue(b, []any{obj{{"rel", "next"}, {"href", href}}})
}
