package billing

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"nimbus/internal/store"
)

// Trial statuses: a customer's request is pending until an operator
// approves it (with a credit and an end date) or declines it (with a
// reason); an approved trial expires at its end date.
const (
	TrialPending  = "pending"
	TrialApproved = "approved"
	TrialDeclined = "declined"
	TrialExpired  = "expired"
)

// Limits on a trial request and decision.
const (
	maxTrialDescription = 4000
	maxTrialReason      = 1000
	// maxTrialCredit (10^12 minor units) keeps every sum of credits far
	// inside int64.
	maxTrialCredit = 1_000_000_000_000
)

// Trial is a project's request for free test access and its decision.
//
// The money is in the ledger only: approval writes a "trial" row of
// +Credit (resource_id = the trial id, period_start NULL), and expiry a
// "trial" row of minus what is left (period_start = EndsAt). What is left
// is Credit minus the charges recorded from approval to EndsAt, so trial
// credit is spent before the rest of the balance.
type Trial struct {
	ID          string     `json:"id"`
	ProjectID   string     `json:"project_id"`
	Description string     `json:"description"`
	Status      string     `json:"status"`
	Credit      int64      `json:"credit"`
	EndsAt      *time.Time `json:"ends_at"`
	Reason      string     `json:"reason"`
	CreatedAt   time.Time  `json:"created_at"`
	DecidedAt   *time.Time `json:"decided_at"`
}

// Trial errors.
var (
	// ErrTrialOpen is a request from a project that has a pending or
	// approved trial already.
	ErrTrialOpen = errors.New("the project already has a pending or approved trial")
	// ErrTrialNotPending is a decision on a trial already decided.
	ErrTrialNotPending = errors.New("the trial is not pending")
	// ErrTrialInvalid is wrapped by a request or decision out of range.
	ErrTrialInvalid = errors.New("invalid trial")
)

// RequestTrial records project's request for free test access, described
// in its own words.
func (s *Service) RequestTrial(ctx context.Context, project, description string) (*Trial, error) {
	description = strings.TrimSpace(description)
	if description == "" || len(description) > maxTrialDescription {
		return nil, fmt.Errorf("%w: the description must be 1 to %d characters", ErrTrialInvalid, maxTrialDescription)
	}
	t := &Trial{ID: newID(), ProjectID: project, Description: description, Status: TrialPending, CreatedAt: s.cfg.Now().UTC()}
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		// The partial unique index billing_trials_open refuses a second
		// open trial, also from a concurrent request.
		_, err := tx.Exec(ctx, `INSERT INTO billing_trials (id, project_id, description, status, credit, ends_at, reason, created_at, decided_at)
 VALUES (?, ?, ?, ?, 0, NULL, '', ?, NULL)`, t.ID, project, description, TrialPending, store.FormatTime(t.CreatedAt))
		return err
	})
	if errors.Is(err, store.ErrConflict) {
		return nil, ErrTrialOpen
	}
	if err != nil {
		return nil, err
	}
	return t, nil
}

// ApproveTrial grants a pending trial credit minor units until endsAt, and
// writes the credit to the ledger in the same transaction.
func (s *Service) ApproveTrial(ctx context.Context, id string, credit int64, endsAt time.Time) (*Trial, error) {
	now := s.cfg.Now().UTC()
	if credit <= 0 || credit > maxTrialCredit {
		return nil, fmt.Errorf("%w: the credit must be 1 to %d minor units", ErrTrialInvalid, int64(maxTrialCredit))
	}
	if !endsAt.After(now) {
		return nil, fmt.Errorf("%w: the end date must be in the future", ErrTrialInvalid)
	}
	var out *Trial
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		t, err := s.decide(ctx, tx, id, `UPDATE billing_trials SET status = ?, credit = ?, ends_at = ?, decided_at = ?
 WHERE id = ? AND status = ?`, TrialApproved, credit, store.FormatTime(endsAt), store.FormatTime(now), id, TrialPending)
		out = t
		if err != nil {
			return err
		}
		if err := s.lockAccount(ctx, tx, t.ProjectID); err != nil {
			return err
		}
		if err := s.checkCredit(ctx, tx, t.ProjectID, credit); err != nil {
			return fmt.Errorf("%w: %v", ErrTrialInvalid, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO billing_ledger (id, project_id, kind, amount, resource_id, period_start, created_at, reference)
 VALUES (?, ?, ?, ?, ?, NULL, ?, ?)`, newID(), t.ProjectID, KindTrial, credit, id, store.FormatTime(now),
			"trial credit until "+endsAt.UTC().Format(time.RFC3339)); err != nil {
			return err
		}
		return nil
	})
	return out, err
}

// DeclineTrial refuses a pending trial, telling the customer why.
func (s *Service) DeclineTrial(ctx context.Context, id, reason string) (*Trial, error) {
	reason = strings.TrimSpace(reason)
	if reason == "" || len(reason) > maxTrialReason {
		return nil, fmt.Errorf("%w: the reason must be 1 to %d characters", ErrTrialInvalid, maxTrialReason)
	}
	var out *Trial
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		t, err := s.decide(ctx, tx, id, `UPDATE billing_trials SET status = ?, reason = ?, decided_at = ? WHERE id = ? AND status = ?`,
			TrialDeclined, reason, store.FormatTime(s.cfg.Now()), id, TrialPending)
		out = t
		return err
	})
	return out, err
}

// decide runs update, which moves trial id out of pending, and answers the
// trial as it then is. Only one decision wins: a trial no longer pending is
// ErrTrialNotPending (and an unknown one store.ErrNotFound).
func (s *Service) decide(ctx context.Context, tx *store.Tx, id, update string, args ...any) (*Trial, error) {
	res, err := tx.Exec(ctx, update, args...)
	if err != nil {
		return nil, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return nil, err
	}
	t, err := loadTrial(ctx, tx, id)
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return t, ErrTrialNotPending
	}
	return t, nil
}

// GetTrial reads one trial; store.ErrNotFound when there is none.
func (s *Service) GetTrial(ctx context.Context, id string) (*Trial, error) {
	return loadTrial(ctx, s.db, id)
}

const trialColumns = "id, project_id, description, status, credit, ends_at, reason, created_at, decided_at"

func loadTrial(ctx context.Context, q store.Querier, id string) (*Trial, error) {
	rows, err := q.Query(ctx, "SELECT "+trialColumns+" FROM billing_trials WHERE id = ?", id)
	if err != nil {
		return nil, err
	}
	ts, err := scanTrials(rows)
	if err != nil {
		return nil, err
	}
	if len(ts) == 0 {
		return nil, store.ErrNotFound
	}
	return &ts[0], nil
}

// ListTrials lists trials newest first: project's, or every project's when
// project is "", optionally only those in status.
func (s *Service) ListTrials(ctx context.Context, project, status string) ([]Trial, error) {
	q := "SELECT " + trialColumns + " FROM billing_trials WHERE 1 = 1"
	var args []any
	if project != "" {
		q += " AND project_id = ?"
		args = append(args, project)
	}
	if status != "" {
		q += " AND status = ?"
		args = append(args, status)
	}
	rows, err := s.db.Query(ctx, q+" ORDER BY created_at DESC, id DESC", args...)
	if err != nil {
		return nil, err
	}
	return scanTrials(rows)
}

func scanTrials(rows interface {
	Next() bool
	Scan(...any) error
	Close() error
	Err() error
}) ([]Trial, error) {
	defer rows.Close()
	out := []Trial{}
	for rows.Next() {
		var t Trial
		var created string
		var ends, decided *string
		if err := rows.Scan(&t.ID, &t.ProjectID, &t.Description, &t.Status, &t.Credit, &ends, &t.Reason, &created, &decided); err != nil {
			return nil, err
		}
		t.CreatedAt = store.ParseTime(created)
		t.EndsAt, t.DecidedAt = timePtr(ends), timePtr(decided)
		out = append(out, t)
	}
	return out, rows.Err()
}

func timePtr(s *string) *time.Time {
	if s == nil {
		return nil
	}
	t := store.ParseTime(*s)
	return &t
}

// openTrial is an approved, unexpired trial and what is left of it.
type openTrial struct {
	id        string
	remaining int64
	endsAt    time.Time
}

// openTrial finds project's approved trial that has not ended at now; nil
// when there is none.
func (s *Service) openTrial(ctx context.Context, q store.Querier, project string, now time.Time) (*openTrial, error) {
	var id, ends, decided string
	var credit int64
	err := q.QueryRow(ctx, "SELECT id, credit, ends_at, decided_at FROM billing_trials WHERE project_id = ? AND status = ?",
		project, TrialApproved).Scan(&id, &credit, &ends, &decided)
	if store.IsNoRows(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	endsAt := store.ParseTime(ends)
	if !now.Before(endsAt) {
		return nil, nil // ended; ExpireTrials has yet to write it off
	}
	left, err := trialLeft(ctx, q, project, credit, decided, ends)
	if err != nil {
		return nil, err
	}
	return &openTrial{id: id, remaining: left, endsAt: endsAt}, nil
}

// trialLeft is credit minus the charges recorded in [from, to), never
// below 0. Only the ledger is read: no spent total is kept beside it.
// Prepaid terms are paid from the paid balance alone (newTerm), so their
// charges spend no trial credit: trial credit pays for hours used inside
// the trial, not for months bought ahead.
func trialLeft(ctx context.Context, q store.Querier, project string, credit int64, from, to string) (int64, error) {
	var hi, lo int64
	if err := q.QueryRow(ctx, `SELECT `+splitSum("-amount")+` FROM billing_ledger
 WHERE project_id = ? AND kind = ? AND created_at >= ? AND created_at < ? AND reference NOT LIKE 'term:%'`,
		project, KindCharge, from, to).Scan(&hi, &lo); err != nil {
		return 0, err
	}
	spent, err := joinSum(hi, lo)
	if err != nil {
		return 0, err
	}
	return credit - min(max(spent, 0), credit), nil
}

// TrialRemaining is what is left at now of project's approved trial
// credit: 0 without one, or once it has ended. It is part of the balance
// and spent first.
func (s *Service) TrialRemaining(ctx context.Context, q store.Querier, project string, now time.Time) (int64, error) {
	t, err := s.openTrial(ctx, q, project, now)
	if err != nil || t == nil {
		return 0, err
	}
	return t.remaining, nil
}

// ExpireTrials writes off every approved trial that ended by now: a
// "trial" ledger row of minus what was left at its end (charges up to
// ends_at), and the trial marked expired, in one transaction per trial.
// The row's (kind, resource_id = trial id, period_start = ends_at) is
// unique, so two processes running this at once write it once. Nothing is
// written for a trial spent in full.
func (s *Service) ExpireTrials(ctx context.Context, now time.Time) error {
	type due struct {
		id, project, ends, decided string
		credit                     int64
	}
	rows, err := s.db.Query(ctx, `SELECT id, project_id, credit, ends_at, decided_at FROM billing_trials
 WHERE status = ? AND ends_at <= ? ORDER BY ends_at, id`, TrialApproved, store.FormatTime(now))
	if err != nil {
		return err
	}
	var list []due
	for rows.Next() {
		var d due
		if err := rows.Scan(&d.id, &d.project, &d.credit, &d.ends, &d.decided); err != nil {
			rows.Close()
			return err
		}
		list = append(list, d)
	}
	if err := rows.Close(); err != nil {
		return err
	}
	if err := rows.Err(); err != nil {
		return err
	}
	created := store.FormatTime(now)
	for _, d := range list {
		err := s.db.Tx(ctx, func(tx *store.Tx) error {
			left, err := trialLeft(ctx, tx, d.project, d.credit, d.decided, d.ends)
			if err != nil {
				return err
			}
			if left > 0 {
				if _, err := tx.Exec(ctx, `INSERT INTO billing_ledger (id, project_id, kind, amount, resource_id, period_start, created_at, reference)
 VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING`, newID(), d.project, KindTrial, -left, d.id, d.ends, created,
					"trial credit expired"); err != nil {
					return err
				}
			}
			_, err = tx.Exec(ctx, "UPDATE billing_trials SET status = ? WHERE id = ? AND status = ?", TrialExpired, d.id, TrialApproved)
			return err
		})
		if err != nil {
			// One trial's failure must not keep the others from expiring.
			s.cfg.Log.Error("billing: expiring a trial failed", "trial", d.id, "project", d.project, "error", err)
		}
	}
	return nil
}
