package billing

import (
	"context"

	"nimbus/internal/store"
)

// Welcome credits project with amount once in its life (an adjustment
// keyed on the project, so a restart or a second controller credits
// nothing more): the demo project's starting balance, so that the cloud
// one command starts can run servers before anyone tops up.
func (s *Service) Welcome(ctx context.Context, project string, amount int64) error {
	if amount <= 0 {
		return nil
	}
	return s.db.Tx(ctx, func(tx *store.Tx) error {
		if err := s.ensureAccount(ctx, tx, project); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO billing_ledger (id, project_id, kind, amount, resource_id, period_start, created_at, reference)
 VALUES (?, ?, ?, ?, ?, 'welcome', ?, 'welcome credit') ON CONFLICT DO NOTHING`,
			newID(), project, KindAdjustment, amount, project, store.FormatTime(s.cfg.Now()))
		return err
	})
}
