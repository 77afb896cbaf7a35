package billing

import (
	"context"
	"fmt"

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
	if amount > s.cfg.MaxBalance {
		return fmt.Errorf("billing: the welcome credit %s %s is over the maximum balance of %s %s",
			major(amount), s.cfg.Currency, major(s.cfg.MaxBalance), s.cfg.Currency)
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

// OpenAccount creates project's account with creditLimit unless it exists
// already (an operator's later change stays): the operator's own admin
// project is opened with a limit no spend reaches, so that the cloud does
// not shelve the operator's servers.
func (s *Service) OpenAccount(ctx context.Context, project string, creditLimit int64) error {
	_, err := s.db.Exec(ctx, `INSERT INTO billing_accounts (project_id, credit_limit, created_at) VALUES (?, ?, ?)
 ON CONFLICT (project_id) DO NOTHING`, project, creditLimit, store.FormatTime(s.cfg.Now()))
	return err
}
