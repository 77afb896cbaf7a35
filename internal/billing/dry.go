package billing

import (
	"context"
	"errors"
	"fmt"
	"time"

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

// Detacher takes a suspended project's public addresses off its ports,
// keeping them allocated to the project: network implements it
// (network.Service.DetachFloatingIPs).
type Detacher interface {
	DetachFloatingIPs(ctx context.Context, project string) (int, error)
}

// SetDetacher connects the service that detaches the public addresses of
// accounts that ran dry.
func (s *Service) SetDetacher(d Detacher) { s.detacher = d }

// funds is an account's balance and credit limit, read with q.
type funds struct{ Balance, CreditLimit int64 }

func (s *Service) funds(ctx context.Context, q store.Querier, project string) (funds, error) {
	f := funds{CreditLimit: s.cfg.DefaultCreditLimit}
	err := q.QueryRow(ctx, "SELECT credit_limit FROM billing_accounts WHERE project_id = ?", project).Scan(&f.CreditLimit)
	if err != nil && !store.IsNoRows(err) {
		return f, err
	}
	var hi, lo int64
	if err := q.QueryRow(ctx, "SELECT "+splitSum("amount")+" FROM billing_ledger WHERE project_id = ?", project).Scan(&hi, &lo); err != nil {
		return f, err
	}
	if f.Balance, err = joinSum(hi, lo); err != nil {
		return f, fmt.Errorf("billing: the balance of project %s: %w", project, err)
	}
	return f, nil
}

// ErrBalanceLimit is wrapped by a credit refused because it would take the
// balance over Config.MaxBalance.
var ErrBalanceLimit = errors.New("balance limit")

// checkCredit refuses a credit of amount to project that would take its
// balance, with the top-ups still pending, over Config.MaxBalance. Call it
// inside the crediting transaction, after lockAccount.
func (s *Service) checkCredit(ctx context.Context, q store.Querier, project string, amount int64) error {
	f, err := s.funds(ctx, q, project)
	total := f.Balance
	if err == nil {
		var hi, lo, pending int64
		if err = q.QueryRow(ctx, "SELECT "+splitSum("amount")+" FROM billing_topups WHERE project_id = ? AND status = ?",
			project, TopupPending).Scan(&hi, &lo); err != nil {
			return err
		}
		pending, err = joinSum(hi, lo)
		if err == nil {
			total, err = addMoney(total, pending)
		}
		if err == nil {
			total, err = addMoney(total, amount)
		}
	}
	if errors.Is(err, ErrOverflow) || (err == nil && total > s.cfg.MaxBalance) {
		return fmt.Errorf("%w: a credit of %s %s would take the balance of project %s (with pending top-ups) over the maximum of %s %s",
			ErrBalanceLimit, major(amount), s.cfg.Currency, project, major(s.cfg.MaxBalance), s.cfg.Currency)
	}
	return err
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
// warned, once per level until its next payment. Each project is judged on
// its own: one whose account cannot be read or judged is logged and the
// others are still checked.
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
		if err := s.checkAccount(ctx, now, project, rate, f, told); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			s.cfg.Log.Error("billing: checking an account failed", "project", project, "error", err)
		}
	}
	return nil
}

// suspend takes what a project that ran dry holds out of use, keeping its
// data: its servers are shelved and its public addresses detached. Its
// volumes stay as they are (still charged: the provider still stores
// them); the gate refuses to create or grow any of these until a top-up.
// The next pass tries again what failed.
func (s *Service) suspend(ctx context.Context, project string) error {
	if s.suspender != nil {
		if _, err := s.suspender.ShelveServers(ctx, project, nil); err != nil {
			return fmt.Errorf("shelving an account that ran dry: %w", err)
		}
	}
	if s.detacher != nil {
		if _, err := s.detacher.DetachFloatingIPs(ctx, project); err != nil {
			return fmt.Errorf("detaching the addresses of an account that ran dry: %w", err)
		}
	}
	return nil
}

// checkAccount shelves or warns one project spending rate per hour.
func (s *Service) checkAccount(ctx context.Context, now time.Time, project string, rate int64, f *book, told map[string]bool) error {
	if f.err != nil {
		return f.err
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
	avail, err := addMoney(f.Balance, f.CreditLimit)
	if err != nil {
		return err
	}
	if avail < 0 {
		msg := fmt.Sprintf("The balance (%s %s) is below the credit limit (%s %s): the servers are shelved and kept, the public IP addresses detached and kept, the volumes kept; addresses and volumes are still charged. Top up to unshelve the servers and attach the addresses again.",
			major(f.Balance), s.cfg.Currency, major(f.CreditLimit), s.cfg.Currency)
		if err := notify(NoticeSuspends, msg); err != nil {
			return err
		}
		return s.suspend(ctx, project)
	}
	for _, w := range warnLevels {
		need, err := mulMoney(rate, w.hours)
		if err != nil {
			return err
		}
		if avail < need {
			msg := fmt.Sprintf("At the current spend of %s %s per hour the balance of %s %s lasts less than %d hours.",
				major(rate), s.cfg.Currency, major(f.Balance), s.cfg.Currency, w.hours)
			if err := notify(w.level, msg); err != nil {
				return err
			}
		}
	}
	return nil
}

// book is an account's funds and the sum of its credits, or why they
// could not be read (err: a ledger whose sums are out of range).
type book struct {
	funds
	credits int64
	err     error
}

// allFunds reads every account's balance, credits and limit: one scan of
// the ledger's balance index and one of the accounts. An account whose
// sums do not fit int64 gets its book's err, not an error for all.
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
	rows, err = s.db.Query(ctx, `SELECT project_id, `+splitSum("amount")+`, `+splitSum("CASE WHEN amount > 0 THEN amount ELSE 0 END")+`
 FROM billing_ledger GROUP BY project_id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var p string
		var balHi, balLo, credHi, credLo int64
		if err := rows.Scan(&p, &balHi, &balLo, &credHi, &credLo); err != nil {
			return nil, err
		}
		b := out[p]
		if b == nil {
			b = &book{funds: funds{CreditLimit: s.cfg.DefaultCreditLimit}}
			out[p] = b
		}
		b.Balance, b.err = joinSum(balHi, balLo)
		if b.err == nil {
			b.credits, b.err = joinSum(credHi, credLo)
		}
		if b.err != nil {
			b.err = fmt.Errorf("billing: the balance of project %s: %w", p, b.err)
		}
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
