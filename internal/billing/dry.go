package billing

import (
	"context"
	"fmt"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// Suspender shelves servers when billing says so: compute implements it
// (compute.Service.ShelveServers). servers nil means every server of the
// project.
type Suspender interface {
	ShelveServers(ctx context.Context, project string, servers []string) (int, error)
}

// SetSuspender connects the service that shelves servers of accounts that
// ran dry and of terms that ended so.
func (s *Service) SetSuspender(sp Suspender) { s.suspender = sp }

// funds is an account's balance and credit limit, read with q.
type funds struct{ Balance, CreditLimit int64 }

func (s *Service) funds(ctx context.Context, q store.Querier, project string) (funds, error) {
	f := funds{CreditLimit: s.cfg.DefaultCreditLimit}
	err := q.QueryRow(ctx, "SELECT credit_limit FROM billing_accounts WHERE project_id = ?", project).Scan(&f.CreditLimit)
	if err != nil && !store.IsNoRows(err) {
		return f, err
	}
	err = q.QueryRow(ctx, "SELECT COALESCE(SUM(amount), 0) FROM billing_ledger WHERE project_id = ?", project).Scan(&f.Balance)
	return f, err
}

// lockAccount creates project's account if needed and, on PostgreSQL,
// locks it for the rest of tx, so that two spends of one account (a term
// bought while another renews) are judged one after the other. SQLite
// transactions are serial already.
func (s *Service) lockAccount(ctx context.Context, tx *store.Tx, project string) error {
	if err := s.ensureAccount(ctx, tx, project); err != nil {
		return err
	}
	if tx.Dialect() != store.Postgres {
		return nil
	}
	_, err := tx.Exec(ctx, "SELECT project_id FROM billing_accounts WHERE project_id = ? FOR UPDATE", project)
	return err
}

// CanSpend refuses (403, with the reason) a project whose balance is below
// minus its credit limit: it may not create or unshelve servers until a
// top-up brings it back. Compute asks it (compute.SpendGate).
func (s *Service) CanSpend(ctx context.Context, project string) error {
	f, err := s.funds(ctx, s.db, project)
	if err != nil {
		return err
	}
	if f.Balance < -f.CreditLimit {
		return api.Forbidden("The billing account of project %s is below its credit limit (balance %s %s, credit limit %s %s): top up to create or unshelve servers.",
			project, major(f.Balance), s.cfg.Currency, major(f.CreditLimit), s.cfg.Currency)
	}
	return nil
}

// Notice levels: the balance will last less than 72, 24 or 1 hours at the
// current spend, or ran out and the servers were shelved.
const (
	Notice72h      = "72h"
	Notice24h      = "24h"
	Notice1h       = "1h"
	NoticeSuspends = "suspended"
)

var warnLevels = []struct {
	level string
	hours int64
}{{Notice72h, 72}, {Notice24h, 24}, {Notice1h, 1}}

// Notice is one message billing gave a customer about their account.
type Notice struct {
	ID        string    `json:"id"`
	Level     string    `json:"level"`
	Message   string    `json:"message"`
	CreatedAt time.Time `json:"created_at"`
}

// checkAccounts looks at each project that spends (spend: minor units per
// hour of what it runs now): one whose balance fell below minus its credit
// limit gets its servers shelved, never deleted, so nothing is lost and
// charging stops; one whose balance lasts less than 72, 24 or 1 hours is
// warned, once per level until its next payment.
func (s *Service) checkAccounts(ctx context.Context, now time.Time, spend map[string]int64) error {
	if len(spend) == 0 {
		return nil
	}
	books, err := s.allFunds(ctx)
	if err != nil {
		return err
	}
	told, err := s.toldAlready(ctx)
	if err != nil {
		return err
	}
	for project, rate := range spend {
		if rate <= 0 {
			continue
		}
		f := books[project]
		if f == nil {
			f = &book{funds: funds{CreditLimit: s.cfg.DefaultCreditLimit}}
		}
		// The epoch is the sum of every credit ever made: it grows with
		// each payment, so a payment re-arms every warning.
		epoch := itoa(f.credits)
		notify := func(level, msg string) error {
			if told[project+"/"+level+"/"+epoch] {
				return nil
			}
			return s.notify(ctx, project, level, epoch, msg, now)
		}
		if f.Balance < -f.CreditLimit {
			msg := fmt.Sprintf("The balance (%s %s) is below the credit limit (%s %s): the servers are shelved and kept; top up to unshelve them.",
				major(f.Balance), s.cfg.Currency, major(f.CreditLimit), s.cfg.Currency)
			if err := notify(NoticeSuspends, msg); err != nil {
				return err
			}
			if s.suspender != nil {
				if _, err := s.suspender.ShelveServers(ctx, project, nil); err != nil {
					s.cfg.Log.Error("billing: shelving an account that ran dry failed", "project", project, "error", err)
				}
			}
			continue
		}
		for _, w := range warnLevels {
			if f.Balance+f.CreditLimit < rate*w.hours {
				msg := fmt.Sprintf("At the current spend of %s %s per hour the balance of %s %s lasts less than %d hours.",
					major(rate), s.cfg.Currency, major(f.Balance), s.cfg.Currency, w.hours)
				if err := notify(w.level, msg); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// book is an account's funds and the sum of its credits.
type book struct {
	funds
	credits int64
}

// allFunds reads every account's balance, credits and limit: one scan of
// the ledger's balance index and one of the accounts.
func (s *Service) allFunds(ctx context.Context) (map[string]*book, error) {
	out := map[string]*book{}
	rows, err := s.db.Query(ctx, "SELECT project_id, credit_limit FROM billing_accounts")
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		b := &book{}
		var p string
		if err := rows.Scan(&p, &b.CreditLimit); err != nil {
			rows.Close()
			return nil, err
		}
		out[p] = b
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	rows, err = s.db.Query(ctx, `SELECT project_id, SUM(amount), SUM(CASE WHEN amount > 0 THEN amount ELSE 0 END)
 FROM billing_ledger GROUP BY project_id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var p string
		var bal, cred int64
		if err := rows.Scan(&p, &bal, &cred); err != nil {
			return nil, err
		}
		b := out[p]
		if b == nil {
			b = &book{funds: funds{CreditLimit: s.cfg.DefaultCreditLimit}}
			out[p] = b
		}
		b.Balance, b.credits = bal, cred
	}
	return out, rows.Err()
}

// toldAlready is the set of notices given, as "project/level/epoch".
func (s *Service) toldAlready(ctx context.Context) (map[string]bool, error) {
	rows, err := s.db.Query(ctx, "SELECT project_id, level, epoch FROM billing_notices")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]bool{}
	for rows.Next() {
		var p, l, e string
		if err := rows.Scan(&p, &l, &e); err != nil {
			return nil, err
		}
		out[p+"/"+l+"/"+e] = true
	}
	return out, rows.Err()
}

// notify records a notice once per account, level and epoch (unique, so
// two controllers tell the customer once).
func (s *Service) notify(ctx context.Context, project, level, epoch, msg string, now time.Time) error {
	res, err := s.db.Exec(ctx, `INSERT INTO billing_notices (id, project_id, level, epoch, message, created_at)
 VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING`, newID(), project, level, epoch, msg, store.FormatTime(now))
	if err != nil {
		return err
	}
	if k, _ := res.RowsAffected(); k == 1 {
		s.cfg.Log.Info("billing: customer notified", "project", project, "level", level, "message", msg)
	}
	return nil
}

// Notices lists what project was told, newest first (at most limit).
func (s *Service) Notices(ctx context.Context, project string, limit int) ([]Notice, error) {
	rows, err := s.db.Query(ctx, `SELECT id, level, message, created_at FROM billing_notices WHERE project_id = ?
 ORDER BY created_at DESC, id DESC LIMIT ?`, project, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []Notice{}
	for rows.Next() {
		var n Notice
		var at string
		if err := rows.Scan(&n.ID, &n.Level, &n.Message, &at); err != nil {
			return nil, err
		}
		n.CreatedAt = store.ParseTime(at)
		out = append(out, n)
	}
	return out, rows.Err()
}
