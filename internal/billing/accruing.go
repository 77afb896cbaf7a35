package billing

import (
	"context"
	"time"

	"nimbus/internal/metering"
	"nimbus/internal/store"
)

// Accrual is what the hour now running costs a project and is not in its
// ledger yet: the charging pass charges a started hour when it next runs,
// up to an hour later, so without it a new server would show no spend.
type Accrual struct {
	Amount int64     `json:"accruing"`       // minor units, not yet in the balance
	Hour   time.Time `json:"accruing_since"` // the hour's start
}

// Accruing prices project's current hour exactly as the charging pass
// will (the same rules, prices and terms) and leaves out the charges the
// ledger has already.
func (s *Service) Accruing(ctx context.Context, project string) (Accrual, error) {
	hour := s.cfg.Now().UTC().Truncate(time.Hour)
	out := Accrual{Hour: hour}
	periods, err := metering.Overlapping(ctx, s.db, "", project, hour, hour)
	if err != nil || len(periods) == 0 {
		return out, err
	}
	prices, err := loadPrices(ctx, s.db)
	if err != nil {
		return out, err
	}
	terms, err := s.termSpans(ctx, hour, hour)
	if err != nil {
		return out, err
	}
	p := &pass{s: s, prices: prices, from: hour, to: hour, quotes: map[string]int64{}, terms: terms, spend: map[string]int64{}}
	w := &work{projects: map[string]bool{}}
	for len(periods) > 0 {
		n := 1
		for n < len(periods) && periods[n].ResourceID == periods[0].ResourceID {
			n++
		}
		p.price(periods[:n], w)
		periods = periods[n:]
	}
	charged, err := s.chargedSince(ctx, project, hour)
	if err != nil {
		return out, err
	}
	for _, c := range w.charges {
		if charged[chargeKey{c.resource, store.FormatTime(c.hour)}] {
			continue
		}
		if out.Amount, err = addMoney(out.Amount, c.amount); err != nil {
			return out, err
		}
	}
	return out, nil
}

// chargeKey is what makes a charge unique in the ledger, with its kind.
type chargeKey struct{ resource, periodStart string }

// chargedSince is the set of project's charges for hours from hour on. A
// pass records an hour's charges after the hour starts, so created_at
// bounds the scan of the project's ledger index.
func (s *Service) chargedSince(ctx context.Context, project string, hour time.Time) (map[chargeKey]bool, error) {
	at := store.FormatTime(hour)
	rows, err := s.db.Query(ctx, `SELECT resource_id, period_start FROM billing_ledger
 WHERE project_id = ? AND created_at >= ? AND kind = ? AND period_start >= ?`, project, at, KindCharge, at)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[chargeKey]bool{}
	for rows.Next() {
		var k chargeKey
		if err := rows.Scan(&k.resource, &k.periodStart); err != nil {
			return nil, err
		}
		out[k] = true
	}
	return out, rows.Err()
}
