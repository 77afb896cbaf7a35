package doctor

import (
	"context"
	"fmt"
	"strings"
)

// openCounts: each project's counts of open usage periods by kind and
// spec (metering_open_counts, kept by internal/metering with every period
// it opens or ends) equal its open periods. Billing's spending gate bounds
// what the current hour owes from them: a count too low lets a project
// start what its funds do not cover; one too high only sends the gate to
// the exact price, more slowly.
func openCounts(ctx context.Context, r *run) error {
	rows, err := r.q.Query(ctx, `SELECT project_id, kind, spec, CAST(SUM(counted) AS BIGINT), CAST(SUM(kept) AS BIGINT) FROM (
 SELECT project_id, kind, spec, COUNT(*) AS counted, 0 AS kept FROM metering_periods WHERE ended_at = '' GROUP BY project_id, kind, spec
 UNION ALL
 SELECT project_id, kind, spec, 0, open_count FROM metering_open_counts) u
 GROUP BY project_id, kind, spec HAVING SUM(counted) <> SUM(kept) ORDER BY project_id, kind, spec`)
	if err != nil {
		return err
	}
	defer rows.Close()
	type off struct {
		kind, spec    string
		counted, kept int64
	}
	var projects []string
	offs := map[string][]off{}
	for rows.Next() {
		var p string
		var o off
		if err := rows.Scan(&p, &o.kind, &o.spec, &o.counted, &o.kept); err != nil {
			return err
		}
		if offs[p] == nil {
			projects = append(projects, p)
		}
		offs[p] = append(offs[p], o)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	for _, p := range projects {
		var parts []string
		low := false
		for _, o := range offs[p] {
			parts = append(parts, fmt.Sprintf("%s %s: %d kept, %d open", o.kind, o.spec, o.kept, o.counted))
			low = low || o.kept < o.counted
		}
		effect := "the spending gate prices its hour exactly, more slowly"
		if low {
			effect = "the spending gate may let it start what its funds do not cover"
		}
		r.emit("project "+p, fmt.Sprintf("its counts of open usage periods differ from its periods (%s): %s",
			strings.Join(parts, "; "), effect),
			fmt.Sprintf("count them again in one transaction (a conflict with a create meanwhile: run it again): "+
				"DELETE FROM metering_open_counts WHERE project_id = %[1]s; INSERT INTO metering_open_counts "+
				"(project_id, kind, spec, open_count) SELECT project_id, kind, spec, COUNT(*) FROM metering_periods "+
				"WHERE project_id = %[1]s AND ended_at = '' GROUP BY project_id, kind, spec", sqlString(p)))
	}
	return nil
}
