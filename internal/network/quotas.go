package network

import (
	"context"
	"encoding/json"
	"net/http"
	"sort"

	"nimbus/internal/api"
	"nimbus/internal/quota"
	"nimbus/internal/store"
)

// quotaDefaults are neutron's default per-project limits
// (neutron/conf/quota.py); -1 means unlimited.
var quotaDefaults = map[string]int64{
	"network": 100, "subnet": 100, "port": 500, "floatingip": 50, "router": 10,
	"security_group": 10, "security_group_rule": 100,
}

// quotaTables says where each resource is counted.
var quotaTables = map[string]string{
	"network": "networks", "subnet": "subnets", "port": "ports", "floatingip": "floatingips", "router": "routers",
	"security_group": "security_groups", "security_group_rule": "security_group_rules",
}

func quotaOf(ctx context.Context, q store.Querier, projectID string) (map[string]int64, error) {
	return quota.Limits(ctx, q, "network_quotas", projectID, quotaDefaults)
}

func usage(ctx context.Context, q store.Querier, projectID, resource string) (int64, error) {
	var n int64
	err := q.QueryRow(ctx, "SELECT COUNT(*) FROM "+quotaTables[resource]+" WHERE project_id = ?", projectID).Scan(&n)
	return n, err
}

// checkQuota answers neutron's OverQuota (neutron_lib/exceptions OverQuota)
// when the project already holds its limit of resource.
func checkQuota(ctx context.Context, q store.Querier, projectID, resource string) error {
	lim, err := quotaOf(ctx, q, projectID)
	if err != nil {
		return err
	}
	if lim[resource] < 0 {
		return nil
	}
	used, err := usage(ctx, q, projectID, resource)
	if err != nil {
		return err
	}
	if used >= lim[resource] {
		return nerr(409, "OverQuota", "Quota exceeded for resources: ['%s'].", resource)
	}
	return nil
}

func quotaRoutes(s *Service) []api.Route {
	return []api.Route{
		{Pattern: "GET /v2.0/quotas", Handler: adminOnly("get_quota", s.listQuotas)},
		{Pattern: "GET /v2.0/quotas/{project}", Handler: s.showQuota},
		{Pattern: "GET /v2.0/quotas/{project}/default", Handler: s.showQuotaDefault},
		{Pattern: "GET /v2.0/quotas/{project}/details", Handler: s.showQuotaDetails},
		{Pattern: "PUT /v2.0/quotas/{project}", Handler: adminOnly("update_quota", s.updateQuota)},
		{Pattern: "DELETE /v2.0/quotas/{project}", Handler: adminOnly("delete_quota", s.deleteQuota)},
	}
}

// adminOnly answers neutron's PolicyNotAuthorized to non-admins.
func adminOnly(rule string, h api.HandlerFunc) api.HandlerFunc {
	return func(r *http.Request) (*api.Response, error) {
		if !caller(r).IsAdmin() {
			return nil, policyDenied(rule)
		}
		return h(r)
	}
}

// quotaProject checks that a non-admin asks only about its own project
// (neutron/extensions/quotasv2.py QuotaSetsController.show).
func quotaProject(r *http.Request) (string, error) {
	c := caller(r)
	p := pathID(r, "project")
	if !c.IsAdmin() && p != c.ProjectID {
		return "", nerr(403, "HTTPForbidden", "Non-admin is not authorized to access quotas for another project")
	}
	return p, nil
}

func (s *Service) listQuotas(r *http.Request) (*api.Response, error) {
	rows, err := s.db.Query(r.Context(), "SELECT DISTINCT project_id FROM network_quotas")
	if err != nil {
		return nil, err
	}
	var projects []string
	for rows.Next() {
		var p string
		if err := rows.Scan(&p); err != nil {
			rows.Close()
			return nil, err
		}
		projects = append(projects, p)
	}
	rows.Close()
	sort.Strings(projects)
	out := []any{}
	for _, p := range projects {
		q, err := quotaOf(r.Context(), s.db, p)
		if err != nil {
			return nil, err
		}
		m := map[string]any{"project_id": p, "tenant_id": p}
		for k, v := range q {
			m[k] = v
		}
		out = append(out, m)
	}
	return api.JSON(200, map[string]any{"quotas": out}), nil
}

// askedQuota is the project of a quota path, which the caller may see,
// and its limits.
func (s *Service) askedQuota(r *http.Request) (string, map[string]int64, error) {
	p, err := quotaProject(r)
	if err != nil {
		return "", nil, err
	}
	q, err := quotaOf(r.Context(), s.db, p)
	return p, q, err
}

func (s *Service) showQuota(r *http.Request) (*api.Response, error) {
	_, q, err := s.askedQuota(r)
	if err != nil {
		return nil, err
	}
	return api.JSON(200, map[string]any{"quota": q}), nil
}

func (s *Service) showQuotaDefault(r *http.Request) (*api.Response, error) {
	if _, err := quotaProject(r); err != nil {
		return nil, err
	}
	return api.JSON(200, map[string]any{"quota": quotaDefaults}), nil
}

func (s *Service) showQuotaDetails(r *http.Request) (*api.Response, error) {
	p, q, err := s.askedQuota(r)
	if err != nil {
		return nil, err
	}
	out := map[string]any{}
	for k, lim := range q {
		used, err := usage(r.Context(), s.db, p, k)
		if err != nil {
			return nil, err
		}
		out[k] = map[string]int64{"limit": lim, "used": used, "reserved": 0}
	}
	return api.JSON(200, map[string]any{"quota": out}), nil
}

func (s *Service) updateQuota(r *http.Request) (*api.Response, error) {
	p := pathID(r, "project")
	var in struct {
		Quota map[string]json.RawMessage `json:"quota"`
	}
	if err := api.DecodeJSON(r, &in); err != nil {
		return nil, nerr(400, "HTTPBadRequest", "%s", api.AsError(err).Message)
	}
	if in.Quota == nil {
		return nil, nerr(400, "HTTPBadRequest", "Unable to find 'quota' in request body")
	}
	b := body(in.Quota)
	set := map[string]int64{}
	for k := range in.Quota {
		if k == "force" || k == "check_limit" {
			continue
		}
		if _, ok := quotaDefaults[k]; !ok {
			return nil, nerr(400, "HTTPBadRequest", "Unrecognized attribute(s) '%s'", k)
		}
		v, _, err := b.integer(k)
		if err != nil {
			return nil, err
		}
		if v == nil || *v < -1 {
			return nil, nerr(400, "HTTPBadRequest", "Invalid input for %s. Reason: '%s' is too small - must be at least '-1'.", k, string(in.Quota[k]))
		}
		set[k] = int64(*v)
	}
	var q map[string]int64
	err := s.db.Tx(r.Context(), func(tx *store.Tx) error {
		for k, v := range set {
			if err := quota.Set(r.Context(), tx, "network_quotas", p, k, &v); err != nil {
				return err
			}
		}
		var err error
		q, err = quotaOf(r.Context(), tx, p)
		return err
	})
	if err != nil {
		return nil, err
	}
	return api.JSON(200, map[string]any{"quota": q}), nil
}

func (s *Service) deleteQuota(r *http.Request) (*api.Response, error) {
	p := pathID(r, "project")
	err := s.db.Tx(r.Context(), func(tx *store.Tx) error {
		_, err := tx.Exec(r.Context(), "DELETE FROM network_quotas WHERE project_id = ?", p)
		return err
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(204), nil
}
