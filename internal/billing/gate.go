package billing

import (
	"context"
	"fmt"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/metering"
)

// The spending gate: prepaid means the money comes first. A request that
// starts a charge (server create and unshelve, volume, snapshot and backup
// create, a floating IP) is accepted only when the project's funds cover
// the first hour of what it starts; one that raises a charge (a resize to
// a dearer flavor, a volume extend) only when they cover the first hour of
// the raise. The funds are the balance plus the credit limit, less what
// the hour now running already owes and the ledger does not show yet (the
// charging pass records an hour after it starts; without this, one order
// after another would each see the whole balance). A prepaid term is paid
// whole and up front (canPayUpFront). Compute, volume and network ask
// through SpendGate interfaces of their own; the panel asks through the
// quote API (Coverage), so every front end applies this one rule.

// CanSpend refuses (403, with the reason) a project whose funds are
// already spent: it may start nothing, not even what costs nothing now
// (attaching a floating IP it pays for anyway, a server snapshot whose
// size is not known until it is taken, an image upload).
func (s *Service) CanSpend(ctx context.Context, project string) error {
	_, err := s.cover(ctx, project, 0, nil)
	return err
}

// CanStart refuses (403, with the reason) a request that starts charging
// count resources of kind and spec whose first hour project's funds do not
// cover.
func (s *Service) CanStart(ctx context.Context, project, kind string, spec metering.Spec, count int64) error {
	_, err := s.Cover(ctx, project, kind, spec, count, count)
	return err
}

// Cover answers how many resources of kind and spec, up to want, project's
// funds cover the first hour of, or a 403 saying why when that is fewer
// than least: a multiple create starts as many as are paid for, as it
// starts as many as fit the quota.
func (s *Service) Cover(ctx context.Context, project, kind string, spec metering.Spec, least, want int64) (int64, error) {
	p, err := loadPrices(ctx, s.db)
	if err != nil {
		return 0, err
	}
	each, err := p.HourlyOf(kind, spec, s.cfg.Currency, s.cfg.HoursPerMonth)
	if err != nil {
		return 0, api.BadRequest("This cannot be ordered: %v.", err)
	}
	need, err := mulMoney(each, least)
	if err != nil {
		return 0, api.BadRequest("The price of %d resources is out of range.", least)
	}
	left, err := s.cover(ctx, project, need, p)
	if err != nil || each == 0 {
		return want, err
	}
	return min(want, least+left/each), nil
}

// CanChange refuses (403) a change of a resource of kind from one spec to
// another (a resize, an extend) that raises its hourly price by more than
// project's funds cover. A spec the price list cannot price counts as a
// raise by its whole price.
func (s *Service) CanChange(ctx context.Context, project, kind string, from, to metering.Spec) error {
	p, err := loadPrices(ctx, s.db)
	if err != nil {
		return err
	}
	before, errFrom := p.HourlyOf(kind, from, s.cfg.Currency, s.cfg.HoursPerMonth)
	after, errTo := p.HourlyOf(kind, to, s.cfg.Currency, s.cfg.HoursPerMonth)
	if errFrom != nil {
		before = 0
	}
	if errTo == nil && after <= before {
		return nil
	}
	_, err = s.cover(ctx, project, max(after-before, 0), p)
	return err
}

// Funds is what a project may still start: its balance plus credit limit,
// less what the hour now running owes and the ledger does not show yet.
type Funds struct {
	Available int64 `json:"available"`
	Balance   int64 `json:"balance"`
	Credit    int64 `json:"credit_limit"`
	Accruing  int64 `json:"accruing"`
}

// Funds reads project's funds.
func (s *Service) Funds(ctx context.Context, project string) (Funds, error) {
	f, err := s.funds(ctx, s.db, project)
	if err != nil {
		return Funds{}, err
	}
	acc, err := s.Accruing(ctx, project)
	if err != nil {
		return Funds{}, err
	}
	return fundsOf(f, acc.Amount), nil
}

// fundsOf is an account's funds with what the hour now running owes.
// Balance and credit limit are bounded by MaxBalance and MaxAmount, the
// accrual by the prices: their sum fits.
func fundsOf(f funds, owed int64) Funds {
	return Funds{Available: f.Balance + f.CreditLimit - owed, Balance: f.Balance, Credit: f.CreditLimit, Accruing: owed}
}

// cover answers what is left of project's funds after need, or a 403
// saying what is missing. It first bounds what the hour now running owes
// from above — every period touching it at its full price, none netted
// out for charges or terms, from the project's counts of open periods
// (metering.Touching) — and prices the hour exactly (Accruing, which
// reads each period) only when that bound would refuse: a create in a
// busy account reads a few rows, not a pass. p is the price list when the
// caller has read it already, nil otherwise.
func (s *Service) cover(ctx context.Context, project string, need int64, p *PriceList) (int64, error) {
	f, err := s.funds(ctx, s.db, project)
	if err != nil {
		return 0, err
	}
	if bound, err := s.owedAtMost(ctx, project, p); err != nil {
		return 0, err
	} else if fb := fundsOf(f, bound); fb.Available >= need {
		return fb.Available - need, nil
	}
	acc, err := s.Accruing(ctx, project)
	if err != nil {
		return 0, err
	}
	fe := fundsOf(f, acc.Amount)
	if fe.Available < need {
		return 0, s.refusal(project, fe, need)
	}
	return fe.Available - need, nil
}

// owedAtMost is an upper bound of what project's hour now running owes:
// the price of every period touching it, summed (Accruing charges each
// resource once, at its dearest period, less terms and what the ledger
// has). Overflow answers the largest amount, so the exact price decides.
func (s *Service) owedAtMost(ctx context.Context, project string, p *PriceList) (int64, error) {
	groups, err := metering.Touching(ctx, s.db, project, s.cfg.Now().UTC().Truncate(time.Hour))
	if err != nil || len(groups) == 0 {
		return 0, err
	}
	if p == nil {
		if p, err = loadPrices(ctx, s.db); err != nil {
			return 0, err
		}
	}
	var sum int64
	for _, g := range groups {
		each, _ := p.HourlyOf(g.Kind, g.Spec, s.cfg.Currency, s.cfg.HoursPerMonth)
		part, err := mulMoney(each, g.Count)
		if err == nil {
			sum, err = addMoney(sum, part)
		}
		if err != nil {
			return MaxAmount, nil
		}
	}
	return sum, nil
}

// refusal is the gate's 403: what the request's first hour costs, what
// the project has, and what to do.
func (s *Service) refusal(project string, f Funds, need int64) error {
	cur := s.cfg.Currency
	msg := fmt.Sprintf("The funds of project %s are spent: the balance %s %s", project, major(f.Balance), cur)
	if need > 0 {
		msg = fmt.Sprintf("The funds of project %s do not cover this request: its first hour costs %s %s, and the balance %s %s",
			project, major(need), cur, major(f.Balance), cur)
	}
	if f.Credit > 0 {
		msg += fmt.Sprintf(" with the credit limit of %s %s", major(f.Credit), cur)
	}
	if f.Accruing > 0 {
		msg += fmt.Sprintf(", less %s %s the current hour owes,", major(f.Accruing), cur)
	}
	return api.Forbidden("%s leaves %s %s. Please top up first: the service is prepaid.", msg, major(f.Available), cur)
}
