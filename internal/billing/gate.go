package billing

import (
	"context"

	"nimbus/internal/api"
	"nimbus/internal/metering"
)

// CanSpend refuses (403, with the reason) a project whose balance is below
// minus its credit limit: until a top-up brings it back it may start or
// raise no charge — create or unshelve servers, resize them to a higher
// price, snapshot or back them up, create or extend volumes, allocate or
// attach public addresses. Each service asks it through an interface of
// its own (compute.SpendGate, volume.SpendGate, network.SpendGate).
func (s *Service) CanSpend(ctx context.Context, project string) error {
	f, err := s.funds(ctx, s.db, project)
	if err != nil {
		return err
	}
	if f.Balance < -f.CreditLimit {
		return api.Forbidden("The billing account of project %s is below its credit limit (balance %s %s, credit limit %s %s): top up to create, grow or unshelve resources.",
			project, major(f.Balance), s.cfg.Currency, major(f.CreditLimit), s.cfg.Currency)
	}
	return nil
}

// CanChange is CanSpend for a resource of kind that changes from one spec
// to another (a resize): a change that does not raise its hourly price
// is always allowed. A spec the price list cannot price counts as a raise.
func (s *Service) CanChange(ctx context.Context, project, kind string, from, to metering.Spec) error {
	p, err := loadPrices(ctx, s.db)
	if err != nil {
		return err
	}
	before, errFrom := p.HourlyOf(kind, from, s.cfg.Currency, s.cfg.HoursPerMonth)
	after, errTo := p.HourlyOf(kind, to, s.cfg.Currency, s.cfg.HoursPerMonth)
	if errFrom == nil && errTo == nil && after <= before {
		return nil
	}
	return s.CanSpend(ctx, project)
}
