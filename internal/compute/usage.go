package compute

import (
	"net/http"
	"sort"
	"strconv"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/metering"
	"nimbus/internal/store"
)

// os-simple-tenant-usage (nova/api/openstack/compute/simple_tenant_usage.py):
// hours each server ran within [start, end), from launched_at to
// terminated_at, with its flavor's size.

// parseUsageTime accepts the three formats Nova's _parse_datetime does; an
// absent value means now.
func (s *Service) parseUsageTime(v string) (time.Time, error) {
	if v == "" {
		return s.now(), nil
	}
	for _, l := range []string{"2006-01-02T15:04:05", "2006-01-02T15:04:05.999999", "2006-01-02 15:04:05.999999"} {
		if t, err := time.Parse(l, v); err == nil {
			return t.UTC(), nil
		}
	}
	return time.Time{}, api.BadRequest("Invalid input for query parameters start. Value: %s. The datetime format is invalid", v)
}

func (s *Service) usageWindow(r *http.Request) (time.Time, time.Time, bool, error) {
	q := r.URL.Query()
	start, err := s.parseUsageTime(q.Get("start"))
	if err != nil {
		return start, start, false, err
	}
	end, err := s.parseUsageTime(q.Get("end"))
	if err != nil {
		return start, end, false, err
	}
	if start.After(end) {
		return start, end, false, api.BadRequest("Invalid start time. The start time cannot occur after the end time.")
	}
	d, _ := api.ParseBool(q.Get("detailed"))
	return start, end, d, nil
}

type tenantUsage struct {
	tenant                     string
	hours, vcpuH, memH, localH float64
	servers                    []map[string]any
}

// usagePage is 2.40's paging over servers: limit and the last server id seen.
type usagePage struct {
	limit  int
	marker string
	last   string // id of the last server counted, when the page is full
}

// parseUsagePage reads limit/marker from 2.40 on; nil means no paging.
func parseUsagePage(r *http.Request) (*usagePage, error) {
	if !VersionFrom(r.Context()).AtLeast(40) {
		return nil, nil
	}
	q := r.URL.Query()
	if q.Get("limit") == "" && q.Get("marker") == "" {
		return nil, nil
	}
	limit, err := parseLimit(q.Get("limit"))
	if err != nil {
		return nil, err
	}
	return &usagePage{limit: limit, marker: q.Get("marker")}, nil
}

// usage computes per-project usage over [start, end) for project ("" = all).
func (s *Service) usage(r *http.Request, project string, start, end time.Time, page *usagePage) (map[string]*tenantUsage, []string, error) {
	q := `SELECT ` + serverCols + ` FROM compute_servers WHERE launched_at<>'' AND launched_at < ?
 AND (terminated_at='' OR terminated_at > ?)`
	args := []any{store.FormatTime(end), store.FormatTime(start)}
	if project != "" {
		q += " AND project_id = ?"
		args = append(args, project)
	}
	if page != nil && page.marker != "" {
		var created string
		if err := s.db.QueryRow(r.Context(), "SELECT created_at FROM compute_servers WHERE id = ?", page.marker).Scan(&created); err != nil {
			if store.IsNoRows(err) {
				return nil, nil, api.BadRequest("marker [%s] not found", page.marker)
			}
			return nil, nil, err
		}
		q += " AND (created_at > ? OR (created_at = ? AND id > ?))"
		args = append(args, created, created, page.marker)
	}
	q += " ORDER BY created_at, id"
	if page != nil {
		q += " LIMIT " + strconv.Itoa(page.limit)
	}
	rows, err := s.db.Query(r.Context(), q, args...)
	if err != nil {
		return nil, nil, err
	}
	defer rows.Close()
	out := map[string]*tenantUsage{}
	var order []string
	now := s.now()
	charged, err := s.chargedHours(r, project, start, end, now)
	if err != nil {
		return nil, nil, err
	}
	n := 0
	for rows.Next() {
		sv, err := scanServer(rows)
		if err != nil {
			return nil, nil, err
		}
		n++
		if page != nil && n == page.limit {
			page.last = sv.ID
		}
		// The hours billing charges: each started hour the server was on
		// a host and not shelved (internal/metering).
		hours := float64(charged[sv.ID])
		f := sv.Doc.Flavor
		local := f.Disk + f.Ephemeral
		tu := out[sv.ProjectID]
		if tu == nil {
			tu = &tenantUsage{tenant: sv.ProjectID}
			out[sv.ProjectID] = tu
			order = append(order, sv.ProjectID)
		}
		tu.hours += hours
		tu.vcpuH += hours * float64(f.VCPUs)
		tu.memH += hours * float64(f.RAM)
		tu.localH += hours * float64(local)
		state := sv.VMState
		var ended any
		upTo := now
		if sv.TerminatedAt != nil {
			state = "terminated"
			ended = usgTime(*sv.TerminatedAt)
			upTo = *sv.TerminatedAt
		}
		tu.servers = append(tu.servers, map[string]any{
			"instance_id": sv.ID, "name": sv.Name, "flavor": f.Name, "hours": hours, "vcpus": f.VCPUs,
			"memory_mb": f.RAM, "local_gb": local, "started_at": usgTime(*sv.LaunchedAt), "ended_at": ended,
			"state": state, "uptime": int(upTo.Sub(*sv.LaunchedAt).Seconds()), "tenant_id": sv.ProjectID,
		})
	}
	sort.Strings(order)
	return out, order, rows.Err()
}

// chargedHours counts, per server, the hours billing charges in [start,
// end) up to now: the same usage periods and the same rule
// (metering.Assign), so this report and the ledger agree hour for hour.
func (s *Service) chargedHours(r *http.Request, project string, start, end, now time.Time) (map[string]int, error) {
	last := end.Add(-time.Nanosecond)
	if now.Before(last) {
		last = now
	}
	from, to := start.Truncate(time.Hour), last.Truncate(time.Hour)
	out := map[string]int{}
	if to.Before(from) {
		return out, nil
	}
	ps, err := metering.Overlapping(r.Context(), s.db, metering.KindServer, project, from, to)
	if err != nil {
		return nil, err
	}
	metering.Assign(ps, from, to, func(h metering.Hour) bool {
		out[h.Period.ResourceID]++
		return true
	})
	return out, nil
}

func usageView(tu *tenantUsage, start, end time.Time, detailed bool) map[string]any {
	m := map[string]any{"tenant_id": tu.tenant, "total_hours": tu.hours, "total_vcpus_usage": tu.vcpuH,
		"total_memory_mb_usage": tu.memH, "total_local_gb_usage": tu.localH,
		"start": usgTime(start), "stop": usgTime(end)}
	if detailed {
		m["server_usages"] = tu.servers
	}
	return m
}

// handleUsageList is GET /os-simple-tenant-usage (admin).
func (s *Service) handleUsageList(r *http.Request) (*api.Response, error) {
	start, end, detailed, err := s.usageWindow(r)
	if err != nil {
		return nil, err
	}
	page, err := parseUsagePage(r)
	if err != nil {
		return nil, err
	}
	all, order, err := s.usage(r, "", start, end, page)
	if err != nil {
		return nil, err
	}
	out := []any{}
	for _, p := range order {
		out = append(out, usageView(all[p], start, end, detailed))
	}
	body := map[string]any{"tenant_usages": out}
	if page != nil && page.last != "" {
		body["tenant_usages_links"] = usageLinks(r, "os-simple-tenant-usage", page)
	}
	return api.JSON(http.StatusOK, body), nil
}

// handleUsageShow is GET /os-simple-tenant-usage/{project}: the caller's own
// project, or any for admins.
func (s *Service) handleUsageShow(r *http.Request) (*api.Response, error) {
	c := api.CallerFrom(r.Context())
	p := r.PathValue("project")
	if !c.IsAdmin() && p != c.ProjectID {
		return nil, api.PolicyForbidden("os_compute_api:os-simple-tenant-usage:show")
	}
	start, end, _, err := s.usageWindow(r)
	if err != nil {
		return nil, err
	}
	page, err := parseUsagePage(r)
	if err != nil {
		return nil, err
	}
	all, _, err := s.usage(r, p, start, end, page)
	if err != nil {
		return nil, err
	}
	tu := all[p]
	if tu == nil {
		return api.JSON(http.StatusOK, map[string]any{"tenant_usage": map[string]any{}}), nil
	}
	body := map[string]any{"tenant_usage": usageView(tu, start, end, true)}
	if page != nil && page.last != "" {
		body["tenant_usage_links"] = usageLinks(r, "os-simple-tenant-usage/"+p, page)
	}
	return api.JSON(http.StatusOK, body), nil
}

// usageLinks is the next link of a full usage page (simple_tenant_usage.py
// _get_instances_all_cells with the view builder's collection links).
func usageLinks(r *http.Request, path string, page *usagePage) []map[string]string {
	q := r.URL.Query()
	q.Set("limit", strconv.Itoa(page.limit))
	q.Set("marker", page.last)
	return []map[string]string{{"rel": "next", "href": links(r, path)[0]["href"] + "?" + q.Encode()}}
}
