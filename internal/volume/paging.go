package volume

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// Cinder's list plumbing, which every list of this API shares: its page
// size, sort keys, marker, with_count and next link
// (cinder/api/common.py).

// maxLimit is Cinder's osapi_max_limit.
const maxLimit = 1000

// sortColumns are the sort keys served, by API name: a volume without a
// name sorts as "".
var sortColumns = map[string]string{
	"id": "v.id", "name": "COALESCE(v.name, '')", "display_name": "COALESCE(v.name, '')", "status": "v.status",
	"size": "v.size", "availability_zone": "v.availability_zone", "bootable": "v.bootable",
	"volume_type_id": "v.volume_type_id", "created_at": "v.created_at", "updated_at": "v.updated_at",
	"user_id": "v.user_id", "project_id": "v.project_id",
}

// pastMarker moves p past marker's row of table (named by idCol) in its
// sort order; Cinder's 404 when the marker is not among p's rows.
func pastMarker(ctx context.Context, q store.Querier, p *api.Page, table, idCol, marker string) error {
	where := strings.Join(append(append([]string{}, p.Where...), idCol+" = ?"), " AND ")
	vals, err := p.Keys.MarkerValues(ctx, q, table, where, append(append([]any{}, p.Args...), marker)...)
	if errors.Is(err, store.ErrNotFound) {
		return api.NotFound("Marker %s could not be found.", marker)
	} else if err != nil {
		return err
	}
	p.AfterMarker(vals)
	return nil
}

// sortParams reads sort=key[:dir],... or the deprecated sort_key and
// sort_dir against cols (cinder/api/common.py get_sort_params; default
// created_at desc), then idCol for a total order.
func sortParams(q url.Values, cols map[string]string, idCol string) (api.Keyset, error) {
	keys, dirs := q["sort_key"], q["sort_dir"]
	if s := q.Get("sort"); s != "" {
		if q.Has("sort_key") || q.Has("sort_dir") {
			return nil, api.BadRequest("The 'sort_key' and 'sort_dir' parameters are deprecated and cannot be used with the 'sort' parameter.")
		}
		keys, dirs = nil, nil
		for _, part := range strings.Split(s, ",") {
			k, d, _ := strings.Cut(strings.TrimSpace(part), ":")
			keys, dirs = append(keys, k), append(dirs, d)
		}
	}
	if len(keys) == 0 {
		keys = []string{"created_at"}
	}
	var out api.Keyset
	for i, k := range keys {
		col, ok := cols[k]
		if !ok {
			return nil, invalidInput("Invalid sort key %s", k)
		}
		d := "desc"
		if i < len(dirs) && dirs[i] != "" {
			d = strings.ToLower(dirs[i])
		}
		if d != "asc" && d != "desc" {
			return nil, invalidInput("Unknown sort direction, must be 'desc' or 'asc'")
		}
		out = append(out, api.SortKey{Col: col, Desc: d == "desc"})
	}
	return append(out, api.SortKey{Col: idCol, Desc: true}), nil
}

// countRule reads limit and offset (cinder/api/api_utils.py
// validate_integer).
func countRule(name string, def int) api.IntRule {
	return api.IntRule{
		Default: def, Min: 0,
		NotInt:   func(string) error { return invalidInput("%s must be an integer.", name) },
		TooSmall: func(string) error { return invalidInput("%s must be >= 0", name) },
	}
}

// pageSize reads a list's limit (at most maxLimit, maxLimit when absent)
// and offset (cinder/api/common.py get_pagination_params).
func pageSize(q url.Values) (limit, offset int, err error) {
	if limit, err = countRule("limit", maxLimit).Parse(q.Get("limit"), q.Has("limit")); err != nil {
		return 0, 0, err
	}
	if offset, err = countRule("offset", 0).Parse(q.Get("offset"), q.Has("offset")); err != nil {
		return 0, 0, err
	}
	return min(limit, maxLimit), offset, nil
}

// wantCount is with_count (3.45): the list gives the count of every item
// its filters keep, whatever the page.
func wantCount(r *http.Request) bool {
	b, _ := api.ParseBool(r.URL.Query().Get("with_count"))
	return b && minor(r) >= 45
}

// nextLink is a full page's link to the next (Cinder's <collection>_links):
// path under /v3, with the project id when the client used one, the
// request's parameters but offset, and the page's limit and last id as
// its marker.
func nextLink(r *http.Request, q url.Values, path string, limit int, last string) []map[string]string {
	p := ""
	if pid := projectInURL(r); pid != "" {
		p = "/" + pid
	}
	nq := api.NextQuery(q, map[string]string{"limit": strconv.Itoa(limit), "marker": last}, "marker", "offset")
	return []map[string]string{{"rel": "next", "href": api.BaseURL(r) + "/v3" + p + path + "?" + nq}}
}

// listPath is a list's path, its /detail form when detail.
func listPath(path string, detail bool) string {
	if detail {
		return path + "/detail"
	}
	return path
}
