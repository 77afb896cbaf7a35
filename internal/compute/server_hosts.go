package compute

import (
	"context"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// serverHostsBatch bounds the ids of one query (SQLite and PostgreSQL
// limit bound parameters).
const serverHostsBatch = 500

// ServerHosts answers, for those of ids that are servers not deleted, the
// host compute placed each on ("" when on none, as when shelved
// offloaded). The fleet checks its agents' reports against it; q is the
// caller's transaction, so that the answer is read with what it writes.
func (s *Service) ServerHosts(ctx context.Context, q store.Querier, ids []string) (map[string]string, error) {
	out := make(map[string]string, len(ids))
	for len(ids) > 0 {
		n := min(len(ids), serverHostsBatch)
		if err := serverHosts(ctx, q, ids[:n], out); err != nil {
			return nil, err
		}
		ids = ids[n:]
	}
	return out, nil
}

func serverHosts(ctx context.Context, q store.Querier, ids []string, out map[string]string) error {
	in, args := api.InList(ids)
	rows, err := q.Query(ctx, "SELECT id, host FROM compute_servers WHERE deleted = 0 AND id "+in, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var id, host string
		if err := rows.Scan(&id, &host); err != nil {
			return err
		}
		out[id] = host
	}
	return rows.Err()
}
