package compute

import (
	"context"
	"net/http"
	"strconv"
	"strings"

	"nimbus/internal/api"
	"nimbus/internal/quota"
	"nimbus/internal/store"
)

// quotaResource is one row of Nova's quota table with its default
// (nova/conf/quota.py) and the microversion that stopped showing it
// (quota_sets.py FILTERED_QUOTAS_2_36 and _2_57); 0 means never.
type quotaResource struct {
	name    string
	def     int
	removed int
}

var quotaResources = []quotaResource{
	{"instances", 10, 0},
	{"cores", 20, 0},
	{"ram", 51200, 0},
	{"metadata_items", 128, 0},
	{"key_pairs", 100, 0},
	{"server_groups", 10, 0},
	{"server_group_members", 10, 0},
	{"injected_files", 5, 57},
	{"injected_file_content_bytes", 10240, 57},
	{"injected_file_path_bytes", 255, 57},
	{"fixed_ips", -1, 36},
	{"floating_ips", 10, 36},
	{"security_groups", 10, 36},
	{"security_group_rules", 20, 36},
}

// quotaVisible lists the resources shown at microversion v.
func quotaVisible(v Version) []quotaResource {
	var out []quotaResource
	for _, q := range quotaResources {
		if q.removed == 0 || !v.AtLeast(q.removed) {
			out = append(out, q)
		}
	}
	return out
}

// projectQuotas returns every resource's limit for a project: its own
// values over the defaults.
func projectQuotas(ctx context.Context, q store.Querier, projectID string) (map[string]int, error) {
	defaults := make(map[string]int64, len(quotaResources))
	for _, r := range quotaResources {
		defaults[r.name] = int64(r.def)
	}
	lim, err := quota.Limits(ctx, q, "compute_quotas", projectID, defaults)
	out := make(map[string]int, len(lim))
	for k, v := range lim {
		out[k] = int(v)
	}
	return out, err
}

// quotaFor returns a project's quota (its own values over the defaults).
func (s *Service) quotaFor(ctx context.Context, q store.Querier, projectID string) (Quota, error) {
	m, err := projectQuotas(ctx, q, projectID)
	if err != nil {
		return Quota{}, err
	}
	return Quota{Instances: m["instances"], Cores: m["cores"], RAM: m["ram"], KeyPairs: m["key_pairs"],
		MetadataItems: m["metadata_items"], ServerGroups: m["server_groups"],
		ServerGroupMembers: m["server_group_members"]}, nil
}

// quotaTarget checks that the caller may read the project's quotas (its own
// project, or any as admin; defaults are open to anyone, as
// policies/quota_sets.py says) and that the project exists
// (api/openstack/identity.py verify_project_id).
func (s *Service) quotaTarget(r *http.Request, policy string) (string, error) {
	p := r.PathValue("project")
	c := api.CallerFrom(r.Context())
	if policy != "defaults" && !c.IsAdmin() && p != c.ProjectID {
		return "", api.PolicyForbidden("os_compute_api:os-quota-sets:" + policy)
	}
	if err := s.verifyProject(r.Context(), p); err != nil {
		return "", err
	}
	return p, nil
}

// verifyProject answers Nova's 400 for a project Keystone does not know.
func (s *Service) verifyProject(ctx context.Context, id string) error {
	if s.identity == nil {
		return nil
	}
	ok, err := s.identity.ProjectExists(ctx, id)
	if err != nil {
		return err
	}
	if !ok {
		return api.BadRequest("Project ID %s is not a valid project.", id)
	}
	return nil
}

func (s *Service) showQuotaSet(r *http.Request) (*api.Response, error) {
	p, err := s.quotaTarget(r, "show")
	if err != nil {
		return nil, err
	}
	m, err := projectQuotas(r.Context(), s.db, p)
	if err != nil {
		return nil, err
	}
	body := map[string]any{"id": p}
	for _, q := range quotaVisible(VersionFrom(r.Context())) {
		body[q.name] = m[q.name]
	}
	return api.JSON(http.StatusOK, map[string]any{"quota_set": body}), nil
}

func (s *Service) showQuotaDefaults(r *http.Request) (*api.Response, error) {
	p, err := s.quotaTarget(r, "defaults")
	if err != nil {
		return nil, err
	}
	body := map[string]any{"id": p}
	for _, q := range quotaVisible(VersionFrom(r.Context())) {
		body[q.name] = q.def
	}
	return api.JSON(http.StatusOK, map[string]any{"quota_set": body}), nil
}

// quotaInUse counts what a project (and, for key pairs, the caller) uses.
func (s *Service) quotaInUse(ctx context.Context, q store.Querier, projectID, userID string) (map[string]int, error) {
	inst, cores, ram, err := s.projectUsage(ctx, q, projectID)
	if err != nil {
		return nil, err
	}
	var kp int
	if err := q.QueryRow(ctx, "SELECT COUNT(*) FROM compute_keypairs WHERE user_id = ?", userID).Scan(&kp); err != nil {
		return nil, err
	}
	return map[string]int{"instances": inst, "cores": cores, "ram": ram, "key_pairs": kp}, nil
}

func (s *Service) showQuotaSetDetail(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	p, err := s.quotaTarget(r, "detail")
	if err != nil {
		return nil, err
	}
	m, err := projectQuotas(ctx, s.db, p)
	if err != nil {
		return nil, err
	}
	used, err := s.quotaInUse(ctx, s.db, p, api.CallerFrom(ctx).UserID)
	if err != nil {
		return nil, err
	}
	body := map[string]any{"id": p}
	for _, q := range quotaVisible(VersionFrom(ctx)) {
		body[q.name] = map[string]int{"limit": m[q.name], "in_use": used[q.name], "reserved": 0}
	}
	return api.JSON(http.StatusOK, map[string]any{"quota_set": body}), nil
}

// updateQuotaSet is PUT /os-quota-sets/{project}: values from -1 up, not
// below what is in use unless "force" (quota_sets.py update).
func (s *Service) updateQuotaSet(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	p := r.PathValue("project")
	v := VersionFrom(ctx)
	body, err := decodeWrapped(r, "quota_set")
	if err != nil {
		return nil, err
	}
	visible := quotaVisible(v)
	allowed := []string{"force"}
	for _, q := range visible {
		allowed = append(allowed, q.name)
	}
	if err := api.UnknownFields(body, allowed...); err != nil {
		return nil, err
	}
	force := false
	if raw, ok := body["force"]; ok {
		if force, err = rawBool("force", raw); err != nil {
			return nil, err
		}
	}
	values := map[string]int{}
	for k, raw := range body {
		if k == "force" {
			continue
		}
		n, err := quotaValue(k, raw)
		if err != nil {
			return nil, err
		}
		values[k] = n
	}
	if err := s.verifyProject(ctx, p); err != nil {
		return nil, err
	}
	var result map[string]int
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		if !force {
			used, err := s.quotaInUse(ctx, tx, p, "")
			if err != nil {
				return err
			}
			for _, k := range []string{"instances", "cores", "ram"} {
				if n, ok := values[k]; ok && n != -1 && n < used[k] {
					return api.BadRequest("Quota limit %d for %s must be greater than or equal to already used and reserved %d.", n, k, used[k])
				}
			}
		}
		for k, n := range values {
			limit := int64(n)
			if err := quota.Set(ctx, tx, "compute_quotas", p, k, &limit); err != nil {
				return err
			}
		}
		var err error
		result, err = projectQuotas(ctx, tx, p)
		return err
	})
	if err != nil {
		return nil, err
	}
	out := map[string]any{}
	for _, q := range visible {
		out[q.name] = result[q.name]
	}
	return api.JSON(http.StatusOK, map[string]any{"quota_set": out}), nil
}

// quotaValue reads parameter_types.quota_set: an integer or digit string
// from -1 to 2^31-1.
func quotaValue(field string, raw []byte) (int, error) {
	str := strings.TrimSpace(string(raw))
	if s, ok := rawString(raw); ok {
		str = s
	}
	n, err := strconv.ParseInt(str, 10, 64)
	if err != nil {
		return 0, api.SchemaError(field, raw, "%s is not of type 'integer', 'string'", api.PyRepr(raw))
	}
	if n < -1 {
		return 0, api.SchemaError(field, raw, "%d is less than the minimum of -1", n)
	}
	if n > 2147483647 {
		return 0, api.SchemaError(field, raw, "%d is greater than the maximum of 2147483647", n)
	}
	return int(n), nil
}

// deleteQuotaSet puts a project back on the defaults: 202.
func (s *Service) deleteQuotaSet(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	p := r.PathValue("project")
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		_, err := tx.Exec(ctx, "DELETE FROM compute_quotas WHERE project_id = ?", p)
		return err
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(http.StatusAccepted), nil
}
