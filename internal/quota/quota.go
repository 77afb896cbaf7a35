// Package quota is what the services' per-project limit tables share. Each
// service owns its tables (compute_quotas, network_quotas, image_quotas,
// volume_quotas and the lock tables) and names them here; quota only knows
// their common shape: (project_id, resource, hard_limit) rows of what an
// admin set over the service's defaults, and (project_id, serial) lock rows.
package quota

import (
	"context"

	"nimbus/internal/store"
)

// Limits is project's limits in table: defaults, under the limits an admin
// set. A stored resource the defaults do not name is left out.
func Limits(ctx context.Context, q store.Querier, table, project string, defaults map[string]int64) (map[string]int64, error) {
	out := make(map[string]int64, len(defaults))
	for k, v := range defaults {
		out[k] = v
	}
	rows, err := q.Query(ctx, "SELECT resource, hard_limit FROM "+table+" WHERE project_id = ?", project)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var k string
		var n int64
		if err := rows.Scan(&k, &n); err != nil {
			return nil, err
		}
		if _, ok := out[k]; ok {
			out[k] = n
		}
	}
	return out, rows.Err()
}

// Set stores project's limit of resource in table; nil removes it, so the
// default applies again. Call it inside the update's transaction.
func Set(ctx context.Context, q store.Querier, table, project, resource string, limit *int64) error {
	if _, err := q.Exec(ctx, "DELETE FROM "+table+" WHERE project_id = ? AND resource = ?", project, resource); err != nil {
		return err
	}
	if limit == nil {
		return nil
	}
	_, err := q.Exec(ctx, "INSERT INTO "+table+" (project_id, resource, hard_limit) VALUES (?, ?, ?)", project, resource, *limit)
	return err
}

// Lock bumps project's row in the lock table, so that on PostgreSQL
// concurrent checks of one project's quota count one after another until
// tx ends (SQLite has one writer anyway).
func Lock(ctx context.Context, tx *store.Tx, table, project string) error {
	_, err := tx.Exec(ctx, "INSERT INTO "+table+" (project_id, serial) VALUES (?, 1) ON CONFLICT (project_id) DO UPDATE SET serial = "+
		table+".serial + 1", project)
	return err
}
