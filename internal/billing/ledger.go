package billing

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// Ledger entry kinds.
const (
	KindTopup      = "topup"
	KindCharge     = "charge"
	KindRefund     = "refund"
	KindAdjustment = "adjustment"
	KindTrial      = "trial"
)

// Account is a project's billing account. Balance is the sum of its ledger
// entries, computed when read: PaidBalance plus TrialCredit.
type Account struct {
	ProjectID string `json:"project_id"`
	Balance   int64  `json:"balance"`
	// PaidBalance is Balance without the trial credit: the customer's own
	// money (top-ups, credits, adjustments, less charges).
	PaidBalance int64  `json:"paid_balance"`
	CreditLimit int64  `json:"credit_limit"`
	Currency    string `json:"currency"`
	// TrialCredit is what is left of an approved trial's credit (part of
	// Balance, spent first), until TrialEndsAt; 0 and nil without one.
	TrialCredit int64      `json:"trial_credit"`
	TrialEndsAt *time.Time `json:"trial_ends_at"`
	// Presentation restates the amounts in Config.PresentationCurrency.
	Presentation *Presentation `json:"presentation,omitempty"`
}

// Entry is one ledger row.
type Entry struct {
	ID         string  `json:"id"`
	ProjectID  string  `json:"project_id"`
	Kind       string  `json:"kind"`
	Amount     int64   `json:"amount"`
	ResourceID *string `json:"resource_id"`
	// ResourceName is the name of what a charge was for when it was
	// charged (a server's, a volume's, an address itself), "" for others.
	ResourceName string    `json:"resource_name"`
	PeriodStart  *string   `json:"period_start,omitempty"`
	CreatedAt    time.Time `json:"created_at"`
	Reference    string    `json:"reference"`
}

func newID() string { return uuid.Must(uuid.NewV7()).String() }

// ensureAccount creates project's account on first use.
func (s *Service) ensureAccount(ctx context.Context, q store.Querier, project string) error {
	_, err := q.Exec(ctx, `INSERT INTO billing_accounts (project_id, credit_limit, created_at) VALUES (?, ?, ?)
 ON CONFLICT (project_id) DO NOTHING`, project, s.cfg.DefaultCreditLimit, store.FormatTime(s.cfg.Now()))
	return err
}

// Account reads project's account; a project never billed has a zero
// balance and the default credit limit.
func (s *Service) Account(ctx context.Context, project string) (*Account, error) {
	f, err := s.funds(ctx, s.db, project)
	if err != nil {
		return nil, err
	}
	a := &Account{ProjectID: project, Balance: f.Balance, CreditLimit: f.CreditLimit, Currency: s.cfg.Currency}
	tr, err := s.openTrial(ctx, s.db, project, s.cfg.Now())
	if err != nil {
		return nil, err
	}
	a.setTrial(tr)
	a.Presentation, err = s.present(map[string]int64{"balance": a.Balance, "paid_balance": a.PaidBalance,
		"credit_limit": a.CreditLimit, "trial_credit": a.TrialCredit})
	if err != nil {
		return nil, err
	}
	return a, nil
}

// setTrial shows tr's credit (nil: none) apart from the paid balance.
func (a *Account) setTrial(tr *openTrial) {
	a.PaidBalance = a.Balance
	if tr == nil {
		return
	}
	a.TrialCredit, a.TrialEndsAt = tr.remaining, &tr.endsAt
	// Both are sums of ledger rows within MaxAmount: the difference fits.
	a.PaidBalance = a.Balance - tr.remaining
}

// addEntry appends one non-charge entry in its own transaction, creating
// the account if needed. Its size is at most Config.MaxBalance either way,
// and a credit may not take the balance over it.
func (s *Service) addEntry(ctx context.Context, project, kind string, amount int64, reference string) (*Entry, error) {
	if amount > s.cfg.MaxBalance || amount < -s.cfg.MaxBalance {
		return nil, fmt.Errorf("%w: an entry of %s %s is larger than the maximum balance of %s %s", ErrBalanceLimit,
			major(amount), s.cfg.Currency, major(s.cfg.MaxBalance), s.cfg.Currency)
	}
	e := &Entry{ID: newID(), ProjectID: project, Kind: kind, Amount: amount, CreatedAt: s.cfg.Now().UTC(), Reference: reference}
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		if err := s.lockAccount(ctx, tx, project); err != nil {
			return err
		}
		if amount > 0 {
			if err := s.checkCredit(ctx, tx, project, amount); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO billing_ledger (id, project_id, kind, amount, resource_id, period_start, created_at, reference)
 VALUES (?, ?, ?, ?, NULL, NULL, ?, ?)`, e.ID, project, kind, amount, store.FormatTime(e.CreatedAt), reference)
		return err
	})
	if err != nil {
		return nil, err
	}
	return e, nil
}

// ErrCreditLimit is a credit limit out of range.
var ErrCreditLimit = fmt.Errorf("the credit limit must be between 0 and %d minor units", int64(MaxAmount))

// SetCreditLimit sets project's credit limit (minor units, 0 to MaxAmount).
func (s *Service) SetCreditLimit(ctx context.Context, project string, limit int64) error {
	if limit < 0 || limit > MaxAmount {
		return ErrCreditLimit
	}
	return s.db.Tx(ctx, func(tx *store.Tx) error {
		if err := s.ensureAccount(ctx, tx, project); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "UPDATE billing_accounts SET credit_limit = ? WHERE project_id = ?", limit, project)
		return err
	})
}

// ledgerOrder is the ledger's order, newest first; the id breaks ties so
// that a marker is exact.
var ledgerOrder = api.Keyset{{Col: "created_at", Desc: true}, {Col: "id", Desc: true}}

// Ledger lists project's entries newest first, at most limit after the
// entry marker (exclusive; "" for the first page). A marker not in the
// project's ledger gives store.ErrNotFound.
func (s *Service) Ledger(ctx context.Context, project string, limit int, marker string) ([]Entry, error) {
	page := api.Page{Keys: ledgerOrder, Limit: limit}
	page.Add("project_id = ?", project)
	if marker != "" {
		vals, err := ledgerOrder.MarkerValues(ctx, s.db, "billing_ledger", "id = ? AND project_id = ?", marker, project)
		if err != nil {
			return nil, err
		}
		page.AfterMarker(vals)
	}
	q := "SELECT id, project_id, kind, amount, resource_id, period_start, created_at, reference, resource_name FROM billing_ledger " + page.SQL()
	args := page.Args
	rows, err := s.db.Query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []Entry{}
	for rows.Next() {
		var e Entry
		var at string
		if err := rows.Scan(&e.ID, &e.ProjectID, &e.Kind, &e.Amount, &e.ResourceID, &e.PeriodStart, &at, &e.Reference, &e.ResourceName); err != nil {
			return nil, err
		}
		e.CreatedAt = store.ParseTime(at)
		if e.Kind != KindCharge {
			// The contract shows period_start for charges only; other rows
			// use the column as their once-only key (a trial's expiry, the
			// welcome credit).
			e.PeriodStart = nil
		}
		out = append(out, e)
	}
	return out, rows.Err()
}
