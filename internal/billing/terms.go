package billing

import (
	"context"
	"errors"
	"fmt"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/metering"
	"nimbus/internal/store"
)

// Term statuses.
const (
	TermActive  = "active"
	TermRenewed = "renewed" // ended and followed by its renewal
	TermEnded   = "ended"
)

// What a server does when its term ends and is not renewed.
const (
	OnEndHourly = "hourly" // falls back to pay-as-you-go
	OnEndShelve = "shelve" // is shelved: kept, no longer charged
)

// Term is a prepaid rental of one server for a number of months.
type Term struct {
	ID         string    `json:"id"`
	ProjectID  string    `json:"project_id"`
	ResourceID string    `json:"server_id"`
	Months     int       `json:"months"`
	StartsAt   time.Time `json:"starts_at"`
	EndsAt     time.Time `json:"ends_at"`
	Amount     int64     `json:"amount"`
	AutoRenew  bool      `json:"auto_renew"`
	OnEnd      string    `json:"on_end"`
	Status     string    `json:"status"`
	CreatedAt  time.Time `json:"created_at"`
}

// span is the stretch of hours a term covers, [start, end), and the spec
// it was bought for (specText "" for terms from before specs were kept).
type span struct {
	start, end time.Time
	specText   string
	spec       metering.Spec
}

// coveringTerm is the term of spans that covers hour h, or nil.
func coveringTerm(spans []span, h time.Time) *span {
	for i := range spans {
		if !h.Before(spans[i].start) && h.Before(spans[i].end) {
			return &spans[i]
		}
	}
	return nil
}

// termSpans reads the terms touching hours [from, to], by resource.
func (s *Service) termSpans(ctx context.Context, from, to time.Time) (map[string][]span, error) {
	rows, err := s.db.Query(ctx, "SELECT resource_id, starts_at, ends_at, spec FROM billing_terms WHERE starts_at < ? AND ends_at > ?",
		store.FormatTime(to.Add(time.Hour)), store.FormatTime(from))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string][]span{}
	for rows.Next() {
		var id, a, b string
		var sp span
		if err := rows.Scan(&id, &a, &b, &sp.specText); err != nil {
			return nil, err
		}
		if sp.specText != "" {
			if err := store.FromJSON(sp.specText, &sp.spec); err != nil {
				return nil, err
			}
		}
		sp.start, sp.end = store.ParseTime(a), store.ParseTime(b)
		out[id] = append(out[id], sp)
	}
	return out, rows.Err()
}

const termCols = "id, project_id, resource_id, months, starts_at, ends_at, amount, auto_renew, on_end, status, created_at"

func scanTerm(sc interface{ Scan(...any) error }) (*Term, error) {
	var t Term
	var starts, ends, created string
	var renew int
	if err := sc.Scan(&t.ID, &t.ProjectID, &t.ResourceID, &t.Months, &starts, &ends, &t.Amount, &renew, &t.OnEnd, &t.Status, &created); err != nil {
		return nil, err
	}
	t.StartsAt, t.EndsAt, t.CreatedAt = store.ParseTime(starts), store.ParseTime(ends), store.ParseTime(created)
	t.AutoRenew = renew != 0
	return &t, nil
}

// TermRequest is a customer's order of a prepaid term for a server.
type TermRequest struct {
	ServerID  string
	Months    int
	AutoRenew bool
	OnEnd     string // OnEndHourly (default) or OnEndShelve
}

// Term errors, answered to the customer as they are.
var (
	ErrNotRunning   = errors.New("the server is not running on a host (shelved, deleted or not placed), so it cannot be rented for a term")
	ErrTermExists   = errors.New("the server already has a prepaid term running")
	ErrInsufficient = errors.New("insufficient balance")
)

// BuyTerm rents a server of project for req.Months, from the next hour on
// (the hour now is in stays hourly), paying the whole term now as one
// charge. The term covers the server as it is now (its spec): resized
// larger, it pays the difference hourly. The paid balance (the balance
// less open trial credit, which pays only for hours used inside the trial)
// must cover it within the credit limit.
func (s *Service) BuyTerm(ctx context.Context, project string, req TermRequest) (*Term, error) {
	if req.OnEnd == "" {
		req.OnEnd = OnEndHourly
	}
	if req.OnEnd != OnEndHourly && req.OnEnd != OnEndShelve {
		return nil, fmt.Errorf("%w: on_end must be %q or %q", ErrInvalid, OnEndHourly, OnEndShelve)
	}
	now := s.cfg.Now().UTC()
	start := now.Truncate(time.Hour).Add(time.Hour)
	var out *Term
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		if err := s.lockAccount(ctx, tx, project); err != nil {
			return err
		}
		var n int
		if err := tx.QueryRow(ctx, "SELECT COUNT(*) FROM billing_terms WHERE resource_id = ? AND status = ? AND ends_at > ?",
			req.ServerID, TermActive, store.FormatTime(now)).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			return ErrTermExists
		}
		t, err := s.newTerm(ctx, tx, project, req.ServerID, req.Months, req.AutoRenew, req.OnEnd, start, now)
		if err != nil {
			return err
		}
		out = t
		return nil
	})
	return out, err
}

// newTerm prices and records a term starting at start, with its charge,
// inside tx (after lockAccount). The server must have an open usage period
// of project: its price is that period's.
func (s *Service) newTerm(ctx context.Context, tx *store.Tx, project, server string, months int, renew bool, onEnd string,
	start, now time.Time) (*Term, error) {
	p, err := metering.Current(ctx, tx, server)
	if store.IsNoRows(err) || (err == nil && (p.ProjectID != project || p.Kind != metering.KindServer)) {
		return nil, ErrNotRunning
	}
	if err != nil {
		return nil, err
	}
	prices, err := loadPrices(ctx, tx)
	if err != nil {
		return nil, err
	}
	hourly, err := prices.HourlyOf(p.Kind, p.Spec, s.cfg.Currency, s.cfg.HoursPerMonth)
	if err != nil {
		return nil, err
	}
	amount, err := prices.TermPrice(hourly, months, s.cfg.HoursPerMonth)
	if err != nil {
		return nil, err
	}
	if err := s.canPayUpFront(ctx, tx, project, amount, now); err != nil {
		return nil, err
	}
	t := &Term{ID: newID(), ProjectID: project, ResourceID: server, Months: months, StartsAt: start,
		EndsAt: start.AddDate(0, months, 0), Amount: amount, AutoRenew: renew, OnEnd: onEnd, Status: TermActive, CreatedAt: now}
	if _, err := tx.Exec(ctx, `INSERT INTO billing_terms (`+termCols+`, spec) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		t.ID, project, server, months, store.FormatTime(t.StartsAt), store.FormatTime(t.EndsAt), amount, b2i(renew), onEnd,
		TermActive, store.FormatTime(now), p.SpecText); err != nil {
		return nil, err
	}
	// The term's charge sits at its first hour; an hourly charge already
	// there (a pass that ran ahead on another controller's clock) would
	// double it, so that is refused and the whole order rolled back.
	res, err := tx.Exec(ctx, `INSERT INTO billing_ledger (id, project_id, kind, amount, resource_id, period_start, created_at, reference, resource_name)
 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING`, newID(), project, KindCharge, -amount, server,
		store.FormatTime(start), store.FormatTime(now), fmt.Sprintf("term:%s:%dm", t.ID, months), p.Spec.Name)
	if err != nil {
		return nil, err
	}
	if k, err := res.RowsAffected(); err != nil {
		return nil, err
	} else if k != 1 {
		return nil, api.Conflict("The hour %s of server %s is charged already; order the term again.", store.FormatTime(start), server)
	}
	return t, nil
}

// canPayUpFront refuses (ErrInsufficient) an up-front payment of amount
// that the paid balance cannot cover within the credit limit: open trial
// credit is left out, since it pays only for hours used inside the trial.
func (s *Service) canPayUpFront(ctx context.Context, q store.Querier, project string, amount int64, now time.Time) error {
	a, err := s.funds(ctx, q, project)
	if err != nil {
		return err
	}
	trial, err := s.TrialRemaining(ctx, q, project, now)
	if err != nil {
		return err
	}
	paid := a.Balance - trial // trial ≤ its credit, and both are bounded
	left, err := addMoney(paid, a.CreditLimit)
	if err == nil && left >= amount {
		return nil
	}
	msg := fmt.Sprintf("the term costs %s %s and the paid balance is %s %s (credit limit %s", major(amount), s.cfg.Currency,
		major(paid), s.cfg.Currency, major(a.CreditLimit))
	if trial > 0 {
		msg += fmt.Sprintf("; trial credit of %s pays only for hours used inside the trial", major(trial))
	}
	return fmt.Errorf("%w: %s)", ErrInsufficient, msg)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// Terms lists project's terms, newest first.
func (s *Service) Terms(ctx context.Context, project string) ([]Term, error) {
	rows, err := s.db.Query(ctx, "SELECT "+termCols+" FROM billing_terms WHERE project_id = ? ORDER BY starts_at DESC, id DESC", project)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []Term{}
	for rows.Next() {
		t, err := scanTerm(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, *t)
	}
	return out, rows.Err()
}

// UpdateTerm changes what happens at the end of a running term.
func (s *Service) UpdateTerm(ctx context.Context, project, id string, renew *bool, onEnd *string) (*Term, error) {
	if onEnd != nil && *onEnd != OnEndHourly && *onEnd != OnEndShelve {
		return nil, fmt.Errorf("%w: on_end must be %q or %q", ErrInvalid, OnEndHourly, OnEndShelve)
	}
	var out *Term
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		t, err := scanTerm(tx.QueryRow(ctx, "SELECT "+termCols+" FROM billing_terms WHERE id = ? AND project_id = ?", id, project))
		if store.IsNoRows(err) {
			return store.ErrNotFound
		}
		if err != nil {
			return err
		}
		if renew != nil {
			t.AutoRenew = *renew
		}
		if onEnd != nil {
			t.OnEnd = *onEnd
		}
		out = t
		_, err = tx.Exec(ctx, "UPDATE billing_terms SET auto_renew = ?, on_end = ? WHERE id = ?", b2i(t.AutoRenew), t.OnEnd, id)
		return err
	})
	return out, err
}

// endTerms settles every active term that ended by now: it renews those
// set to renew when the balance allows, and otherwise ends them, shelving
// the server when the customer chose so. Each term is settled once: the
// status change is conditional, so two controllers cannot both settle it.
func (s *Service) endTerms(ctx context.Context, now time.Time) error {
	rows, err := s.db.Query(ctx, "SELECT "+termCols+" FROM billing_terms WHERE status = ? AND ends_at <= ? ORDER BY ends_at, id",
		TermActive, store.FormatTime(now))
	if err != nil {
		return err
	}
	var due []*Term
	for rows.Next() {
		t, err := scanTerm(rows)
		if err != nil {
			rows.Close()
			return err
		}
		due = append(due, t)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for _, t := range due {
		shelve := false
		err := s.db.Tx(ctx, func(tx *store.Tx) error {
			shelve = false
			if err := s.lockAccount(ctx, tx, t.ProjectID); err != nil {
				return err
			}
			status := TermEnded
			if t.AutoRenew {
				_, err := s.newTerm(ctx, tx, t.ProjectID, t.ResourceID, t.Months, true, t.OnEnd, t.EndsAt, now)
				switch {
				case err == nil:
					status = TermRenewed
				case errors.Is(err, ErrInsufficient), errors.Is(err, ErrNotRunning), errors.Is(err, ErrUnpriced):
					s.cfg.Log.Info("billing: term not renewed", "term", t.ID, "reason", err)
				default:
					return err
				}
			}
			res, err := tx.Exec(ctx, "UPDATE billing_terms SET status = ? WHERE id = ? AND status = ?", status, t.ID, TermActive)
			if err != nil {
				return err
			}
			if k, err := res.RowsAffected(); err != nil {
				return err
			} else if k != 1 {
				return errSettled
			}
			shelve = status == TermEnded && t.OnEnd == OnEndShelve
			return nil
		})
		if errors.Is(err, errSettled) {
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			// One term's failure must not keep the others from settling.
			s.cfg.Log.Error("billing: settling a term failed", "term", t.ID, "project", t.ProjectID, "error", err)
			continue
		}
		if shelve && s.suspender != nil {
			if _, err := s.suspender.ShelveServers(ctx, t.ProjectID, []string{t.ResourceID}); err != nil {
				s.cfg.Log.Error("billing: shelving at the end of a term failed", "term", t.ID, "error", err)
			}
		}
	}
	return nil
}

// errSettled rolls back a term another process settled first.
var errSettled = errors.New("term settled by another pass")
