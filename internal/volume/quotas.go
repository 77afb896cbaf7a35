package volume

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"

	"nimbus/internal/api"
	"nimbus/internal/quota"
	"nimbus/internal/store"
)

// quotaDefaults are Cinder's default per-project limits
// (cinder/quota.py quota_volumes, quota_gigabytes, …); -1 is unlimited.
// Nimbus enforces volumes, gigabytes (snapshots counted in) and
// per_volume_gigabytes, snapshots (snapshots.go), backups and
// backup_gigabytes (backups.go), and the per-type volumes_, gigabytes_ and
// snapshots_<type> (retype.go); groups is kept and shown.
var quotaDefaults = map[string]int64{
	"volumes": 10, "gigabytes": 1000, "snapshots": 10, "backups": 10, "backup_gigabytes": 1000,
	"per_volume_gigabytes": -1, "groups": 10,
}

// perType are the per-volume-type quota prefixes (volumes_<type>, …),
// unlimited by default.
var perType = []string{"volumes_", "gigabytes_", "snapshots_"}

// quotaOf is a project's limits: defaults, per-type keys, the default
// quota class and what an admin set for the project.
func quotaOf(ctx context.Context, q store.Querier, project string) (map[string]int64, error) {
	defaults := map[string]int64{}
	for k, v := range quotaDefaults {
		defaults[k] = v
	}
	names, err := typeNames(ctx, q)
	if err != nil {
		return nil, err
	}
	for _, n := range names {
		for _, p := range perType {
			defaults[p+n] = -1
		}
	}
	// The default quota class's limits (stored under project ''): an
	// admin's change of every project's defaults.
	defaults, err = quota.Limits(ctx, q, "volume_quotas", defaultClass, defaults)
	if err != nil || project == defaultClass {
		return defaults, err
	}
	return quota.Limits(ctx, q, "volume_quotas", project, defaults)
}

// defaultClass is the project id the default quota class's limits are
// stored under: no project has it.
const defaultClass = ""

// usage is what a project's volumes take: their count and gigabytes, an
// extend in progress counted at its new size, and its snapshots'
// gigabytes, which count in the same quota as in Cinder.
func usage(ctx context.Context, q store.Querier, project string) (volumes, gigabytes int64, err error) {
	err = q.QueryRow(ctx, `SELECT COUNT(*), COALESCE(SUM(CASE WHEN new_size > size THEN new_size ELSE size END), 0)
		+ (SELECT COALESCE(SUM(size), 0) FROM volume_snapshots WHERE project_id = ?)
		FROM volumes WHERE project_id = ?`, project, project).Scan(&volumes, &gigabytes)
	return
}

// reserve checks, in tx, that project may add volumes more volumes and gb
// more gigabytes, the largest volume being size, with Cinder's 413s
// (cinder/quota_utils.py process_reserve_over_quota). It first takes the
// project's quota lock row, so concurrent creates count one after another.
func (s *Service) reserve(ctx context.Context, tx *store.Tx, project string, volumes, gb, size int64) error {
	if err := quota.Lock(ctx, tx, "volume_quota_locks", project); err != nil {
		return err
	}
	lim, err := quotaOf(ctx, tx, project)
	if err != nil {
		return err
	}
	if l := lim["per_volume_gigabytes"]; l >= 0 && size > l {
		// cinder/exception.py VolumeSizeExceedsLimit
		return api.OverLimit("Requested volume size %dG is larger than maximum allowed limit %dG.", size, l)
	}
	usedVols, usedGB, err := usage(ctx, tx, project)
	if err != nil {
		return err
	}
	if l := lim["volumes"]; volumes > 0 && l >= 0 && usedVols+volumes > l {
		// cinder/exception.py VolumeLimitExceeded
		return api.OverLimit("Maximum number of volumes allowed (%d) exceeded for quota 'volumes'.", l)
	}
	if l := lim["gigabytes"]; l >= 0 && usedGB+gb > l {
		// cinder/exception.py VolumeSizeExceedsAvailableQuota
		return api.OverLimit("Requested volume or snapshot exceeds allowed gigabytes quota. Requested %dG, quota is %dG and %dG has been consumed.",
			gb, l, usedGB)
	}
	return nil
}

// limits is GET /limits (cinder/api/views/limits.py): the absolute
// limits and what is used.
func (s *Service) limits(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	project := caller(r).ProjectID
	if p := r.URL.Query().Get("project_id"); p != "" && minor(r) >= 39 && caller(r).IsAdmin() {
		project = p
	}
	lim, err := quotaOf(ctx, s.db, project)
	if err != nil {
		return nil, err
	}
	vols, gb, err := usage(ctx, s.db, project)
	if err != nil {
		return nil, err
	}
	bks, bkGB, err := backupUsage(ctx, s.db, project)
	if err != nil {
		return nil, err
	}
	snaps, _, err := snapshotUsage(ctx, s.db, project)
	if err != nil {
		return nil, err
	}
	return api.JSON(200, map[string]any{"limits": map[string]any{"rate": []any{}, "absolute": map[string]any{
		"maxTotalVolumes": lim["volumes"], "maxTotalVolumeGigabytes": lim["gigabytes"],
		"maxTotalSnapshots": lim["snapshots"], "maxTotalBackups": lim["backups"], "maxTotalBackupGigabytes": lim["backup_gigabytes"],
		"totalVolumesUsed": vols, "totalGigabytesUsed": gb,
		"totalSnapshotsUsed": snaps, "totalBackupsUsed": bks, "totalBackupGigabytesUsed": bkGB,
	}}}), nil
}

// quotaProject is the project of a quota-set path; a non-admin may ask
// only about its own (cinder/policies/quotas.py SHOW_POLICY).
func quotaProject(r *http.Request) (string, error) {
	c := caller(r)
	p := r.PathValue("project")
	if !c.IsAdmin() && p != c.ProjectID {
		return "", api.PolicyForbidden("volume_extension:quotas:show")
	}
	return p, nil
}

// quotaSetView is a quota set, with usage as {limit, in_use, reserved,
// allocated} per resource when asked (cinder/api/contrib/quotas.py
// _format_quota_set).
func quotaSetView(ctx context.Context, q store.Querier, project string, lim map[string]int64, withUsage bool) (map[string]any, error) {
	out := map[string]any{"id": project}
	var vols, gb, bks, bkGB, snaps int64
	if withUsage {
		var err error
		if vols, gb, err = usage(ctx, q, project); err != nil {
			return nil, err
		}
		if bks, bkGB, err = backupUsage(ctx, q, project); err != nil {
			return nil, err
		}
		if snaps, _, err = snapshotUsage(ctx, q, project); err != nil {
			return nil, err
		}
	}
	for k, v := range lim {
		if !withUsage {
			out[k] = v
			continue
		}
		used := int64(0)
		switch k {
		case "volumes":
			used = vols
		case "gigabytes":
			used = gb
		case "backups":
			used = bks
		case "snapshots":
			used = snaps
		case "backup_gigabytes":
			used = bkGB
		}
		out[k] = map[string]int64{"limit": v, "in_use": used, "reserved": 0, "allocated": 0}
	}
	return out, nil
}

func (s *Service) showQuota(r *http.Request) (*api.Response, error) {
	p, err := quotaProject(r)
	if err != nil {
		return nil, err
	}
	lim, err := quotaOf(r.Context(), s.db, p)
	if err != nil {
		return nil, err
	}
	withUsage, _ := parseBool(r.URL.Query().Get("usage"))
	v, err := quotaSetView(r.Context(), s.db, p, lim, withUsage)
	if err != nil {
		return nil, err
	}
	return api.JSON(200, map[string]any{"quota_set": v}), nil
}

func (s *Service) showQuotaDefaults(r *http.Request) (*api.Response, error) {
	p, err := quotaProject(r)
	if err != nil {
		return nil, err
	}
	lim, err := quotaOf(r.Context(), s.db, "")
	if err != nil {
		return nil, err
	}
	v, err := quotaSetView(r.Context(), s.db, p, lim, false)
	if err != nil {
		return nil, err
	}
	return api.JSON(200, map[string]any{"quota_set": v}), nil
}

// updateQuota is PUT /os-quota-sets/{project} (admin): each value an
// integer of at least -1 and, for volumes and gigabytes, not below what is
// used (cinder/api/contrib/quotas.py update, _validate_existing_resource).
func (s *Service) updateQuota(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	p := r.PathValue("project")
	b, err := decodeBody(r, "quota_set")
	if err != nil {
		return nil, err
	}
	var out map[string]any
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		lim, err := quotaOf(ctx, tx, p)
		if err != nil {
			return err
		}
		vols, gb, err := usage(ctx, tx, p)
		if err != nil {
			return err
		}
		bks, bkGB, err := backupUsage(ctx, tx, p)
		if err != nil {
			return err
		}
		snaps, _, err := snapshotUsage(ctx, tx, p)
		if err != nil {
			return err
		}
		set, err := quotaValues(b, lim)
		if err != nil {
			return err
		}
		for k, v := range set {
			used := map[string]int64{"volumes": vols, "gigabytes": gb, "backups": bks, "backup_gigabytes": bkGB, "snapshots": snaps}[k]
			if v >= 0 && v < used {
				return invalidInput("Quota %s limit must be equal or greater than existing resources. Current usage is %d and the requested limit is %d.", k, used, v)
			}
		}
		out, err = saveQuotas(ctx, tx, p, lim, set)
		return err
	})
	if err != nil {
		return nil, err
	}
	return api.JSON(200, map[string]any{"quota_set": out}), nil
}

// saveQuotas stores set over lim as project's limits (or the default
// class's) and answers the quota set's view without its id, as updates
// answer it.
func saveQuotas(ctx context.Context, tx *store.Tx, project string, lim, set map[string]int64) (map[string]any, error) {
	for k, v := range set {
		if err := quota.Set(ctx, tx, "volume_quotas", project, k, &v); err != nil {
			return nil, err
		}
		lim[k] = v
	}
	out, err := quotaSetView(ctx, tx, project, lim, false)
	delete(out, "id")
	return out, err
}

// quotaValues are the limits of a quota set's body: each key one of lim's,
// each value an integer (or a string of one) of at least -1.
func quotaValues(b body, lim map[string]int64) (map[string]int64, error) {
	set := map[string]int64{}
	for k, raw := range b {
		if k == "id" || k == "tenant_id" || k == "project_id" {
			continue
		}
		if _, ok := lim[k]; !ok {
			return nil, api.BadRequest("Bad key(s) in quota set: %s", k)
		}
		var n json.Number
		d := json.NewDecoder(strings.NewReader(string(raw)))
		d.UseNumber()
		var str string
		if err := d.Decode(&n); err != nil {
			if json.Unmarshal(raw, &str) != nil {
				return nil, invalidInput("Quota limit must be an integer: %s", string(raw))
			}
			n = json.Number(str)
		}
		v, err := n.Int64()
		if err != nil {
			return nil, invalidInput("Quota %s must be an integer: %s", k, n)
		}
		if v < -1 {
			return nil, invalidInput("Quota limit must be -1 or greater.")
		}
		set[k] = v
	}
	return set, nil
}

// deleteQuota is DELETE /os-quota-sets/{project} (admin): back to the
// defaults, 200.
func (s *Service) deleteQuota(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		_, err := tx.Exec(ctx, "DELETE FROM volume_quotas WHERE project_id = ?", r.PathValue("project"))
		return err
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(http.StatusOK), nil
}
