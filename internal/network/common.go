package network

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// neutronTime renders a standard-attr timestamp the way neutron's
// timestamp helper does (neutron/db/standard_attr.py: "%Y-%m-%dT%H:%M:%SZ").
func neutronTime(s string) string {
	t := store.ParseTime(s)
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format("2006-01-02T15:04:05Z")
}

func now() string { return store.FormatTime(time.Now()) }

func newID() string { return uuid.NewString() }

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// nerr is an error in Neutron's shape with its exception name.
func nerr(status int, typ, format string, args ...any) *api.Error {
	return &api.Error{Status: status, Type: typ, Message: fmt.Sprintf(format, args...)}
}

func badInput(format string, args ...any) *api.Error {
	return nerr(http.StatusBadRequest, "InvalidInput", "Invalid input for operation: "+format, args...)
}

func errNetworkNotFound(id string) *api.Error {
	return nerr(404, "NetworkNotFound", "Network %s could not be found.", id)
}
func errSubnetNotFound(id string) *api.Error {
	return nerr(404, "SubnetNotFound", "Subnet %s could not be found.", id)
}
func errPortNotFound(id string) *api.Error {
	return nerr(404, "PortNotFound", "Port %s could not be found.", id)
}
func errSGNotFound(id string) *api.Error {
	return nerr(404, "SecurityGroupNotFound", "Security group %s does not exist", id)
}
func errRuleNotFound(id string) *api.Error {
	return nerr(404, "SecurityGroupRuleNotFound", "Security group rule %s does not exist", id)
}
func errFIPNotFound(id string) *api.Error {
	return nerr(404, "FloatingIPNotFound", "Floating IP %s could not be found", id)
}

// body is a decoded resource body: {"network": {...}} gives the inner map.
type body map[string]json.RawMessage

// decodeBody reads {"<resource>": {...}} and rejects attributes that are
// not in allowed, as neutron/api/v2/base.py prepare_request_body does.
func decodeBody(r *http.Request, resource string, allowed ...string) (body, error) {
	var outer map[string]json.RawMessage
	if err := api.DecodeJSON(r, &outer); err != nil {
		return nil, nerr(400, "HTTPBadRequest", "%s", api.AsError(err).Message)
	}
	raw, ok := outer[resource]
	if !ok {
		return nil, nerr(400, "HTTPBadRequest", "Unable to find '%s' in request body", resource)
	}
	var b body
	if err := json.Unmarshal(raw, &b); err != nil || b == nil {
		return nil, nerr(400, "HTTPBadRequest", "Unable to find '%s' in request body", resource)
	}
	return b, checkAttrs(b, allowed)
}

// checkAttrs rejects attributes a resource does not have.
func checkAttrs(b body, allowed []string) error {
	var extra []string
	for k := range b {
		found := false
		for _, a := range allowed {
			if a == k {
				found = true
				break
			}
		}
		if !found {
			extra = append(extra, k)
		}
	}
	if len(extra) > 0 {
		sort.Strings(extra)
		return nerr(400, "HTTPBadRequest", "Unrecognized attribute(s) '%s'", strings.Join(extra, ", "))
	}
	return nil
}

// prepared is one resource of a create request, validated: insert stores
// it inside the request's transaction and view renders it afterwards.
type prepared struct {
	insert func(tx *store.Tx) error
	view   func() map[string]any
}

// preparer validates the body of one resource to create.
type preparer func(r *http.Request, c *api.Caller, b body) (*prepared, error)

// creator serves POST on a collection, for one resource
// ({"network": {...}}) or in bulk ({"networks": [{...}, ...]}), all in one
// transaction as neutron's native bulk support does
// (neutron/api/v2/base.py create with allow_bulk).
func (s *Service) creator(singular, plural string, allowed []string, prep preparer) api.HandlerFunc {
	return func(r *http.Request) (*api.Response, error) {
		c := caller(r)
		var outer map[string]json.RawMessage
		if err := api.DecodeJSON(r, &outer); err != nil {
			return nil, nerr(400, "HTTPBadRequest", "%s", api.AsError(err).Message)
		}
		var bodies []body
		bulk := false
		if raw, ok := outer[plural]; ok && len(outer) == 1 {
			bulk = true
			if err := json.Unmarshal(raw, &bodies); err != nil || len(bodies) == 0 {
				return nil, nerr(400, "HTTPBadRequest", "Resources required")
			}
		} else if raw, ok := outer[singular]; ok {
			var b body
			if err := json.Unmarshal(raw, &b); err != nil || b == nil {
				return nil, nerr(400, "HTTPBadRequest", "Unable to find '%s' in request body", singular)
			}
			bodies = []body{b}
		} else {
			return nil, nerr(400, "HTTPBadRequest", "Unable to find '%s' in request body", singular)
		}
		var items []*prepared
		for _, b := range bodies {
			if b == nil {
				return nil, nerr(400, "HTTPBadRequest", "Unable to find '%s' in request body", singular)
			}
			if err := checkAttrs(b, allowed); err != nil {
				return nil, err
			}
			p, err := prep(r, c, b)
			if err != nil {
				return nil, err
			}
			items = append(items, p)
		}
		err := s.db.Tx(r.Context(), func(tx *store.Tx) error {
			for _, p := range items {
				if err := p.insert(tx); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		if !bulk {
			return showOne(r, 201, singular, items[0].view()), nil
		}
		views := make([]map[string]any, 0, len(items))
		for _, p := range items {
			views = append(views, p.view())
		}
		return api.JSON(201, map[string]any{plural: selectFields(r.URL.Query(), views)}), nil
	}
}

func (b body) has(k string) bool { _, ok := b[k]; return ok }

func (b body) isNull(k string) bool {
	v, ok := b[k]
	return ok && strings.TrimSpace(string(v)) == "null"
}

func invalid(k string, v json.RawMessage, reason string) *api.Error {
	return nerr(400, "HTTPBadRequest", "Invalid input for %s. Reason: %s.", k, fmt.Sprintf(reason, string(v)))
}

// str reads a string attribute; ok is false when absent.
func (b body) str(k string, maxLen int) (string, bool, error) {
	v, ok := b[k]
	if !ok {
		return "", false, nil
	}
	var s string
	if err := json.Unmarshal(v, &s); err != nil {
		return "", true, invalid(k, v, "'%s' is not a valid string")
	}
	if maxLen > 0 && len(s) > maxLen {
		return "", true, nerr(400, "HTTPBadRequest", "Invalid input for %s. Reason: '%s' exceeds maximum length of %d.", k, s, maxLen)
	}
	return s, true, nil
}

// isUUID is oslo's is_uuid_like: a UUID with or without hyphens.
func isUUID(s string) bool {
	u, err := uuid.Parse(s)
	return err == nil && strings.ReplaceAll(u.String(), "-", "") == strings.ToLower(strings.ReplaceAll(s, "-", ""))
}

func errNotUUID(k, v string) *api.Error {
	return nerr(400, "HTTPBadRequest", "Invalid input for %s. Reason: '%s' is not a valid UUID.", k, v)
}

// uuidAttr reads a string attribute that must be a UUID (neutron's
// type:uuid validator).
func (b body) uuidAttr(k string) (string, bool, error) {
	s, ok, err := b.str(k, 64)
	if err == nil && ok && !isUUID(s) {
		err = errNotUUID(k, s)
	}
	return s, ok, err
}

// optUUID reads a UUID attribute that may be null (type:uuid_or_none).
func (b body) optUUID(k string) (*string, bool, error) {
	s, ok, err := b.optStr(k)
	if err == nil && s != nil && !isUUID(*s) {
		err = errNotUUID(k, *s)
	}
	return s, ok, err
}

// optStr reads a string attribute that may be null.
func (b body) optStr(k string) (*string, bool, error) {
	if b.isNull(k) {
		return nil, true, nil
	}
	s, ok, err := b.str(k, 255)
	if !ok || err != nil {
		return nil, ok, err
	}
	return &s, true, nil
}

// boolean reads a boolean attribute; neutron's convert_to_boolean also takes
// the strings "true"/"false" and 0/1.
func (b body) boolean(k string) (bool, bool, error) {
	v, ok := b[k]
	if !ok {
		return false, false, nil
	}
	var x any
	_ = json.Unmarshal(v, &x)
	switch t := x.(type) {
	case bool:
		return t, true, nil
	case string:
		if bv, ok := api.ParseBool(t); ok {
			return bv, true, nil
		}
	case float64:
		if t == 0 || t == 1 {
			return t == 1, true, nil
		}
	}
	return false, true, invalid(k, v, "'%s' cannot be converted to boolean")
}

func (b body) strList(k string) ([]string, bool, error) {
	v, ok := b[k]
	if !ok {
		return nil, false, nil
	}
	var l []string
	if err := json.Unmarshal(v, &l); err != nil {
		return nil, true, invalid(k, v, "'%s' is not a list")
	}
	if l == nil {
		l = []string{}
	}
	return l, true, nil
}

func (b body) integer(k string) (*int, bool, error) {
	v, ok := b[k]
	if !ok {
		return nil, false, nil
	}
	if b.isNull(k) {
		return nil, true, nil
	}
	var x any
	_ = json.Unmarshal(v, &x)
	switch t := x.(type) {
	case float64:
		if t == float64(int(t)) {
			n := int(t)
			return &n, true, nil
		}
	case string:
		if n, err := strconv.Atoi(t); err == nil {
			return &n, true, nil
		}
	}
	return nil, true, invalid(k, v, "'%s' is not an integer")
}

// projectFor is the project a new resource belongs to: the caller's, or
// for an admin the project_id/tenant_id given in the body.
func projectFor(c *api.Caller, b body, resource string) (string, error) {
	p := c.ProjectID
	for _, k := range []string{"project_id", "tenant_id"} {
		s, ok, err := b.str(k, 255)
		if err != nil {
			return "", err
		}
		if ok && s != p {
			if !c.IsAdmin() {
				return "", nerr(403, "PolicyNotAuthorized", "(rule:create_%s) is disallowed by policy", resource)
			}
			p = s
		}
	}
	return p, nil
}

func tagsOf(s string) []string {
	var t []string
	_ = store.FromJSON(s, &t)
	if t == nil {
		t = []string{}
	}
	return t
}

// reserved query parameters that are not attribute filters
// (neutron/api/api_common.py get_filters_from_dict).
var reservedParams = map[string]bool{
	"fields": true, "sort_key": true, "sort_dir": true, "limit": true, "marker": true,
	"page_reverse": true, "tags": true, "tags-any": true, "not-tags": true, "not-tags-any": true,
}

// render filters, sorts, pages and projects a list of resource views
// according to the query (neutron/api/v2/base.py _items), and wraps them
// as {"<collection>": [...], "<collection>_links": [...]}. It answers the
// lists whose query columnList.page cannot read in SQL.
func render(r *http.Request, collection string, items []map[string]any, filterable map[string]bool) (*api.Response, error) {
	q := r.URL.Query()
	var err error
	if items, err = filterItems(q, items, filterable); err != nil {
		return nil, err
	}
	keys, dirs := q["sort_key"], q["sort_dir"]
	if err := checkSort(keys, dirs, filterable); err != nil {
		return nil, err
	}
	sortItems(items, keys, dirs)
	reverse := false
	if pr := q.Get("page_reverse"); pr != "" {
		var ok bool
		if reverse, ok = api.ParseBool(pr); !ok {
			return nil, nerr(400, "HTTPBadRequest", "Invalid input for page_reverse. Reason: '%s' cannot be converted to boolean.", pr)
		}
	}
	limit, err := limitRule.Parse(q.Get("limit"), q.Get("limit") != "")
	if err != nil {
		return nil, err
	}
	marker := q.Get("marker")
	var links []map[string]string
	if limit > 0 || marker != "" {
		if items, links, err = pageItems(r, items, limit, marker, reverse); err != nil {
			return nil, err
		}
	}
	return listAnswer(q, collection, items, links), nil
}

// limitRule is neutron's limit: none unless asked (0 is none too).
var limitRule = api.IntRule{NotInt: func(raw string) error {
	return nerr(400, "HTTPBadRequest", "Limit must be an integer 0 or greater and not '%s'", raw)
}}

// checkSort validates sort_key and sort_dir, which may repeat, paired by
// position.
func checkSort(keys, dirs []string, filterable map[string]bool) error {
	for _, d := range dirs {
		if d != "asc" && d != "desc" {
			return nerr(400, "HTTPBadRequest", "Invalid input for sort_dir. Reason: '%s' is not a valid value. Valid values are ['asc', 'desc'].", d)
		}
	}
	if len(dirs) > len(keys) {
		return nerr(400, "HTTPBadRequest", "The number of sort_keys and sort_dirs must be same")
	}
	for _, k := range keys {
		if !filterable[k] {
			return nerr(400, "HTTPBadRequest", "%s is an invalid attribute for sort_keys", k)
		}
	}
	return nil
}

// sortItems orders by the keys, a key without a direction ascending, ties
// by id; without keys the load order (creation) stays.
func sortItems(items []map[string]any, keys, dirs []string) {
	sort.SliceStable(items, func(i, j int) bool {
		for n, k := range keys {
			c := compareValues(items[i][k], items[j][k])
			if c == 0 {
				continue
			}
			if n < len(dirs) && dirs[n] == "desc" {
				return c > 0
			}
			return c < 0
		}
		if len(keys) == 0 {
			return false
		}
		return fmt.Sprint(items[i]["id"]) < fmt.Sprint(items[j]["id"])
	})
}

// pageItems cuts the page after marker (before it with page_reverse) and
// gives its links.
func pageItems(r *http.Request, items []map[string]any, limit int, marker string, reverse bool) ([]map[string]any, []map[string]string, error) {
	if reverse {
		slices.Reverse(items)
	}
	start := 0
	if marker != "" {
		start = slices.IndexFunc(items, func(it map[string]any) bool { return it["id"] == marker }) + 1
		if start == 0 {
			return nil, nil, errMarkerNotFound(marker)
		}
	}
	items = items[start:]
	more := limit > 0 && len(items) > limit
	if more {
		items = items[:limit]
	}
	if reverse {
		slices.Reverse(items)
	}
	return items, pageLinks(r, items, more, marker != "", reverse), nil
}

func errMarkerNotFound(marker string) *api.Error {
	return nerr(404, "HTTPNotFound", "Marker %s could not be found.", marker)
}

// pageLinks are a page's next and previous links (neutron/api/api_common.py
// PaginationNativeHelper): next when more follow in the paging direction,
// previous when the page started at a marker.
func pageLinks(r *http.Request, items []map[string]any, more, afterMarker, reverse bool) []map[string]string {
	if len(items) == 0 {
		return nil
	}
	q := r.URL.Query()
	base := api.BaseURL(r) + r.URL.Path
	link := func(rel string, mk any, rev bool) map[string]string {
		set := map[string]string{"marker": fmt.Sprint(mk)}
		if rev {
			set["page_reverse"] = "True"
		}
		return map[string]string{"rel": rel, "href": base + "?" + api.NextQuery(q, set, "marker", "page_reverse")}
	}
	last, first := items[len(items)-1]["id"], items[0]["id"]
	var links []map[string]string
	if reverse {
		if afterMarker {
			links = append(links, link("next", last, false))
		}
		if more {
			links = append(links, link("previous", first, true))
		}
		return links
	}
	if more {
		links = append(links, link("next", last, false))
	}
	if afterMarker {
		links = append(links, link("previous", first, true))
	}
	return links
}

// listAnswer applies ?fields= and wraps the page with its links.
func listAnswer(q url.Values, collection string, items []map[string]any, links []map[string]string) *api.Response {
	items = selectFields(q, items)
	out := map[string]any{collection: items}
	if links != nil {
		out[collection+"_links"] = links
	}
	return api.JSON(200, out)
}

// columnList is how a resource's list is read in SQL when its query
// allows: the attributes whose view value is a column's own value (by
// column), and which of them are booleans.
type columnList struct {
	cols  map[string]string
	bools map[string]bool
}

// sqlPage is a list page read in SQL: its query, and what its links need.
type sqlPage struct {
	api.Page
	limit  int
	marker string
}

// page builds the SQL page of a list query whose filters and sort keys are
// all columns, paging forward; ok is false for any other query (tags,
// computed attributes, page_reverse, or a parameter to refuse), which
// render answers from the views. scope is the caller's visibility
// condition.
func (cl columnList) page(q url.Values, scope string, args ...any) (*sqlPage, bool) {
	if !cl.covers(q) {
		return nil, false
	}
	limit, err := limitRule.Parse(q.Get("limit"), q.Get("limit") != "")
	if err != nil {
		return nil, false
	}
	p := &sqlPage{limit: limit, marker: q.Get("marker"), Page: api.Page{Limit: -1}}
	p.Add(scope, args...)
	for k, vs := range q {
		if !reservedParams[k] {
			cl.filter(&p.Page, k, vs)
		}
	}
	keys, dirs := q["sort_key"], q["sort_dir"]
	for i, k := range keys {
		p.Keys = append(p.Keys, api.SortKey{Col: cl.cols[k], Desc: i < len(dirs) && dirs[i] == "desc"})
	}
	if len(keys) == 0 {
		p.Keys = api.Keyset{{Col: "created_at"}}
	}
	p.Keys = append(p.Keys, api.SortKey{Col: "id"})
	if limit > 0 {
		p.Limit = limit + 1 // one more tells whether another page follows
	}
	return p, true
}

// covers reports whether every parameter of q has its column and is valid.
func (cl columnList) covers(q url.Values) bool {
	for k := range q {
		switch {
		case k == "page_reverse" || strings.Contains(k, "tags"):
			return false
		case !reservedParams[k] && cl.cols[k] == "":
			return false
		}
	}
	keys, dirs := q["sort_key"], q["sort_dir"]
	if len(dirs) > len(keys) {
		return false
	}
	for _, d := range dirs {
		if d != "asc" && d != "desc" {
			return false
		}
	}
	for _, k := range keys {
		if cl.cols[k] == "" {
			return false
		}
	}
	return true
}

// filter adds one attribute filter: any of its values matches; a value
// that is not a boolean matches no boolean.
func (cl columnList) filter(p *api.Page, k string, vs []string) {
	col := cl.cols[k]
	if !cl.bools[k] {
		in, args := api.InList(vs)
		p.Add(col+" "+in, args...)
		return
	}
	var ors []string
	var args []any
	for _, v := range vs {
		if b, ok := api.ParseBool(v); ok {
			ors, args = append(ors, col+" = ?"), append(args, b2i(b))
		}
	}
	if len(ors) == 0 {
		ors = []string{"1 = 0"}
	}
	p.Add("("+strings.Join(ors, " OR ")+")", args...)
}

// afterMarker narrows the page to the rows after the marker, which must be
// one the page's filters keep.
func (p *sqlPage) afterMarker(ctx context.Context, db store.Querier, table string) error {
	if p.marker == "" {
		return nil
	}
	where := strings.Join(append(slices.Clone(p.Where), "id = ?"), " AND ")
	vals, err := p.Keys.MarkerValues(ctx, db, table, where, append(slices.Clone(p.Args), p.marker)...)
	if err == store.ErrNotFound {
		return errMarkerNotFound(p.marker)
	} else if err != nil {
		return err
	}
	p.AfterMarker(vals)
	return nil
}

// clauses is the page's "<conditions> ORDER BY … [LIMIT n]".
func (p *sqlPage) clauses() string { return strings.TrimPrefix(p.SQL(), "WHERE ") }

// answer wraps the views of the rows read (one more than the limit when
// another page follows).
func (p *sqlPage) answer(r *http.Request, collection string, items []map[string]any) *api.Response {
	var links []map[string]string
	if p.limit > 0 || p.marker != "" {
		more := p.limit > 0 && len(items) > p.limit
		if more {
			items = items[:p.limit]
		}
		links = pageLinks(r, items, more, p.marker != "", false)
	}
	return listAnswer(r.URL.Query(), collection, items, links)
}

func compareValues(a, b any) int {
	switch x := a.(type) {
	case int:
		if y, ok := b.(int); ok {
			return x - y
		}
	case int64:
		if y, ok := b.(int64); ok {
			switch {
			case x < y:
				return -1
			case x > y:
				return 1
			}
			return 0
		}
	}
	return strings.Compare(valueString(a), valueString(b))
}

func valueString(v any) string {
	switch t := v.(type) {
	case nil:
		return ""
	case string:
		return t
	case *string:
		if t == nil {
			return ""
		}
		return *t
	case bool:
		if t {
			return "true"
		}
		return "false"
	}
	return fmt.Sprint(v)
}

// filterItems keeps the items that match every attribute filter; several
// values of one filter are alternatives. Unknown filters answer 400 as with
// neutron's filter-validation extension.
func filterItems(q url.Values, items []map[string]any, filterable map[string]bool) ([]map[string]any, error) {
	type flt struct {
		key  string
		vals []string
	}
	var fs []flt
	for k, vs := range q {
		if reservedParams[k] {
			continue
		}
		if !filterable[k] {
			return nil, nerr(400, "HTTPBadRequest", "[%s] is invalid attribute for filtering", k)
		}
		fs = append(fs, flt{k, vs})
	}
	tagsAll := splitTags(q["tags"])
	tagsAny := splitTags(q["tags-any"])
	notAll := splitTags(q["not-tags"])
	notAny := splitTags(q["not-tags-any"])
	out := items[:0:0]
	for _, it := range items {
		ok := true
		for _, f := range fs {
			if !matches(it, f.key, f.vals) {
				ok = false
				break
			}
		}
		if ok && (tagsAll != nil || tagsAny != nil || notAll != nil || notAny != nil) {
			tags, _ := it["tags"].([]string)
			has := map[string]bool{}
			for _, t := range tags {
				has[t] = true
			}
			all := func(l []string) bool {
				for _, t := range l {
					if !has[t] {
						return false
					}
				}
				return true
			}
			anyOf := func(l []string) bool {
				for _, t := range l {
					if has[t] {
						return true
					}
				}
				return false
			}
			if tagsAll != nil && !all(tagsAll) || tagsAny != nil && !anyOf(tagsAny) ||
				notAll != nil && all(notAll) || notAny != nil && anyOf(notAny) {
				ok = false
			}
		}
		if ok {
			out = append(out, it)
		}
	}
	return out, nil
}

func splitTags(vs []string) []string {
	if vs == nil {
		return nil
	}
	out := []string{}
	for _, v := range vs {
		for _, t := range strings.Split(v, ",") {
			if t != "" {
				out = append(out, t)
			}
		}
	}
	return out
}

func matches(it map[string]any, key string, vals []string) bool {
	if key == "fixed_ips" {
		return matchFixedIPs(it, vals)
	}
	v := it[key]
	if key == "tenant_id" {
		v = it["project_id"]
	}
	for _, want := range vals {
		switch t := v.(type) {
		case bool:
			if b, ok := api.ParseBool(want); ok && b == t {
				return true
			}
		case []string:
			for _, e := range t {
				if e == want {
					return true
				}
			}
		default:
			if valueString(v) == want {
				return true
			}
		}
	}
	return false
}

// matchFixedIPs handles ?fixed_ips=ip_address=X&fixed_ips=subnet_id=Y
// (neutron/db/db_base_plugin_common.py _apply_filters_to_query for ports).
func matchFixedIPs(it map[string]any, vals []string) bool {
	ips, _ := it["fixed_ips"].([]map[string]any)
	for _, v := range vals {
		k, want, _ := strings.Cut(v, "=")
		found := false
		for _, ip := range ips {
			switch k {
			case "ip_address":
				found = ip["ip_address"] == want
			case "subnet_id":
				found = ip["subnet_id"] == want
			case "ip_address_substr":
				found = strings.Contains(fmt.Sprint(ip["ip_address"]), want)
			}
			if found {
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// selectFields applies ?fields=a&fields=b.
func selectFields(q url.Values, items []map[string]any) []map[string]any {
	fields := q["fields"]
	if len(fields) == 0 {
		return items
	}
	want := map[string]bool{}
	for _, f := range fields {
		for _, x := range strings.Split(f, ",") {
			want[x] = true
		}
	}
	for i, it := range items {
		m := map[string]any{}
		for k, v := range it {
			if want[k] {
				m[k] = v
			}
		}
		items[i] = m
	}
	return items
}

// showOne wraps one view and applies ?fields=.
func showOne(r *http.Request, status int, resource string, view map[string]any) *api.Response {
	v := selectFields(r.URL.Query(), []map[string]any{view})[0]
	return api.JSON(status, map[string]any{resource: v})
}

// checkRevision enforces an "If-Match: revision_number=N" precondition
// (neutron/services/revisions/revision_plugin.py).
func checkRevision(r *http.Request, current int64) error {
	h := r.Header.Get("If-Match")
	if h == "" {
		return nil
	}
	for _, part := range strings.Split(h, ",") {
		v, ok := strings.CutPrefix(strings.TrimSpace(part), "revision_number=")
		if !ok {
			continue
		}
		want, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return nerr(400, "HTTPBadRequest", "If-Match header without revision_number=<int> value.")
		}
		if want != current {
			return nerr(412, "RevisionNumberConstraintFailed", "Constrained to %d, but current revision is %d", want, current)
		}
	}
	return nil
}

// viewKeys lists the attributes of a resource view: each one may be used
// as a filter, as neutron allows for any attribute.
func viewKeys(v map[string]any) []string {
	out := make([]string, 0, len(v))
	for k := range v {
		out = append(out, k)
	}
	return out
}

// filterableOf makes the filter set of a resource from its view keys.
func filterableOf(keys ...string) map[string]bool {
	m := map[string]bool{"tenant_id": true, "project_id": true, "id": true, "name": true,
		"description": true, "created_at": true, "updated_at": true, "revision_number": true}
	for _, k := range keys {
		m[k] = true
	}
	return m
}
