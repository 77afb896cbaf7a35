package compute

import (
	"net/http"

	"nimbus/internal/api"
)

// showLimits is GET /limits (limits.py, views/limits.py): the caller's
// project, or an admin's ?tenant_id. The absolute set shrinks at 2.36
// (network limits) and 2.57 (image metadata and personality).
func (s *Service) showLimits(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	if err := strictQuery(r, "tenant_id"); err != nil {
		return nil, err
	}
	c := api.CallerFrom(ctx)
	project := c.ProjectID
	if t := r.URL.Query().Get("tenant_id"); t != "" && t != project {
		if !c.IsAdmin() {
			return nil, api.PolicyForbidden("os_compute_api:limits:other_project")
		}
		project = t
	}
	v := VersionFrom(ctx)
	q, err := projectQuotas(ctx, s.db, project)
	if err != nil {
		return nil, err
	}
	inst, cores, ram, err := s.projectUsage(ctx, s.db, project)
	if err != nil {
		return nil, err
	}
	var groups int
	if err := s.db.QueryRow(ctx, `SELECT COUNT(*) FROM compute_server_groups WHERE project_id = ?`, project).Scan(&groups); err != nil {
		return nil, err
	}
	abs := map[string]any{
		"maxServerMeta":         q["metadata_items"],
		"maxTotalCores":         q["cores"],
		"maxTotalInstances":     q["instances"],
		"maxTotalKeypairs":      q["key_pairs"],
		"maxTotalRAMSize":       q["ram"],
		"maxServerGroups":       q["server_groups"],
		"maxServerGroupMembers": q["server_group_members"],
		"totalCoresUsed":        cores,
		"totalInstancesUsed":    inst,
		"totalRAMUsed":          ram,
		"totalServerGroupsUsed": groups,
	}
	if !v.AtLeast(57) {
		abs["maxImageMeta"] = q["metadata_items"]
		abs["maxPersonality"] = q["injected_files"]
		abs["maxPersonalitySize"] = q["injected_file_content_bytes"]
	}
	if !v.AtLeast(36) {
		abs["maxSecurityGroups"] = q["security_groups"]
		abs["maxSecurityGroupRules"] = q["security_group_rules"]
		abs["maxTotalFloatingIps"] = q["floating_ips"]
		abs["totalFloatingIpsUsed"] = 0
		abs["totalSecurityGroupsUsed"] = 0
	}
	return api.JSON(http.StatusOK, map[string]any{"limits": map[string]any{"rate": []any{}, "absolute": abs}}), nil
}
