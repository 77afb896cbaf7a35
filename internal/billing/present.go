package billing

import (
	"context"
	"math/big"
)

// Convert restates minor units of the billing currency in minor units of
// the presentation currency at rate, rounding half away from zero, as
// every API answer does; the panel shows the same figures with it.
func Convert(amount int64, rate *big.Rat) (int64, error) { return convert(amount, rate) }

// Quote prices a choice on a tariff as POST /v1/quotes does, for the
// panel's visitors who have no token yet: the same price list, currency,
// hours per month and rounding.
func (s *Service) Quote(ctx context.Context, c Choice, tariff string, termMonths int, durationHours int64) (Quote, error) {
	pl, err := s.Prices(ctx)
	if err != nil {
		return Quote{}, err
	}
	q, err := pl.Quote(c, s.cfg.Currency, s.cfg.HoursPerMonth)
	if err != nil {
		return Quote{}, err
	}
	return pl.WithTariff(q, tariff, termMonths, durationHours)
}

// HoursPerMonth is how many hours a monthly price is.
func (s *Service) HoursPerMonth() int { return s.cfg.HoursPerMonth }
