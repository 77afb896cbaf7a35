package billing

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"

	"nimbus/internal/store"
)

// The operator's methods that have no HTTP route of their own: nimbus admin
// calls them directly on the controller's database.

// Accounts lists every account by project id, with its balance, credit
// limit and open trial credit (Presentation is left out: it is for
// customers). Balances come from allFunds: one scan of the ledger index.
// Each of the projects given that nothing billed yet is listed too, as the
// account it has from its creation: nothing paid, the default credit limit.
func (s *Service) Accounts(ctx context.Context, projects []string) ([]Account, error) {
	books, err := s.allFunds(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]Account, 0, len(books))
	for _, p := range projects {
		if _, ok := books[p]; !ok {
			out = append(out, Account{ProjectID: p, CreditLimit: s.cfg.DefaultCreditLimit, Currency: s.cfg.Currency})
		}
	}
	for p, b := range books {
		if b.err != nil {
			// One unreadable account must not hide every other.
			s.cfg.Log.Error("billing: account left out of the list", "project", p, "error", b.err)
			continue
		}
		out = append(out, Account{ProjectID: p, Balance: b.Balance, PaidBalance: b.Balance, CreditLimit: b.CreditLimit, Currency: s.cfg.Currency})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ProjectID < out[j].ProjectID })
	// Few projects have an approved trial: read only theirs, after the
	// rows above are closed (SQLite's pool may be one connection short).
	trials, err := s.ListTrials(ctx, "", TrialApproved)
	if err != nil {
		return nil, err
	}
	with := map[string]bool{}
	for _, t := range trials {
		with[t.ProjectID] = true
	}
	now := s.cfg.Now()
	for i := range out {
		if !with[out[i].ProjectID] {
			continue
		}
		tr, err := s.openTrial(ctx, s.db, out[i].ProjectID, now)
		if err != nil {
			return nil, err
		}
		out[i].setTrial(tr)
	}
	return out, nil
}

// Adjust appends an operator's correction of amount minor units (signed,
// not 0) to project's ledger, as POST /v1/accounts/{project}/adjustments
// does.
func (s *Service) Adjust(ctx context.Context, project string, amount int64, reference string) (*Entry, error) {
	if amount == 0 {
		return nil, errors.New("billing: an adjustment must not be 0")
	}
	if len(reference) > 255 {
		return nil, errors.New("billing: the reference must be at most 255 characters")
	}
	return s.addEntry(ctx, project, KindAdjustment, amount, reference)
}

// Prices reads the price list (rates in rate units, see RateScale).
func (s *Service) Prices(ctx context.Context) (*PriceList, error) {
	return loadPrices(ctx, s.db)
}

// SetPrices changes the named rates, keyed as billing_prices keys them:
// vcpu, ram_gb, public_ipv4, windows_vcpu, windows_server, volume_gb, snapshot_gb,
// backup_gb, image_gb, disk_gb:<type>, gpu:<model> (rate units per hour) and
// term:<months> (discount in basis points). Unknown keys and rates out of
// range change nothing. It answers the list as saved.
func (s *Service) SetPrices(ctx context.Context, rates map[string]int64) (*PriceList, error) {
	for k := range rates {
		if !priceKey(k) {
			return nil, fmt.Errorf("billing: unknown price key %q", k)
		}
	}
	var out *PriceList
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		p, err := loadPrices(ctx, tx)
		if err != nil {
			return err
		}
		for k, v := range rates {
			p.set(k, v)
		}
		if err := p.validate(); err != nil {
			return fmt.Errorf("billing: %w", err)
		}
		out = p
		return savePrices(ctx, tx, p)
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// priceKey reports whether k names a rate PriceList.set knows; set itself
// ignores other keys, which would make a typo a silent no-op.
func priceKey(k string) bool {
	switch k {
	case "vcpu", "ram_gb", "public_ipv4", "windows_vcpu", "windows_server", "volume_gb", "snapshot_gb", "backup_gb", "image_gb":
		return true
	}
	for _, prefix := range []string{"disk_gb:", "gpu:", "term:"} {
		if name, ok := strings.CutPrefix(k, prefix); ok {
			return name != ""
		}
	}
	return false
}
