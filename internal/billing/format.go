package billing

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"strconv"
	"strings"
)

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// major renders minor units as a decimal with two places (e.g. 10000 →
// "100.00"), for messages only; amounts on the wire stay integers.
func major(n int64) string {
	sign := ""
	if n < 0 {
		sign, n = "-", -n
	}
	return sign + strconv.FormatInt(n/100, 10) + "." + strconv.FormatInt(100+n%100, 10)[1:]
}

// maxRate bounds a presentation rate, far above any real exchange rate.
var maxRate = big.NewRat(1_000_000_000, 1)

// ParseRate reads a presentation rate exactly: a positive decimal ("0.011")
// or fraction ("11/1000") of at most 40 characters and at most 10^9. It is
// how many major units of the presentation currency one major unit of the
// ledger currency is worth. No float is involved, so 100.00 at "0.011" is
// exactly 1.10.
func ParseRate(s string) (*big.Rat, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, errors.New("billing: the presentation rate is empty")
	}
	if len(s) > 40 {
		return nil, fmt.Errorf("billing: presentation rate %.40q… is too long", s)
	}
	r, ok := new(big.Rat).SetString(s)
	if !ok {
		return nil, fmt.Errorf("billing: presentation rate %q is not a decimal or fraction", s)
	}
	if r.Sign() <= 0 || r.Cmp(maxRate) > 0 {
		return nil, fmt.Errorf("billing: presentation rate %q must be above 0 and at most 1000000000", s)
	}
	return r, nil
}

// convert restates amount (minor units) at rate, rounded half away from zero
// (half up in magnitude, so a debt rounds like the same credit). Both
// currencies have two decimal places, so minor units convert at the rate of
// major units.
func convert(amount int64, rate *big.Rat) (int64, error) {
	n := new(big.Int).Mul(big.NewInt(amount), rate.Num())
	neg := n.Sign() < 0
	n.Abs(n)
	q, r := new(big.Int).QuoRem(n, rate.Denom(), new(big.Int))
	if r.Lsh(r, 1).Cmp(rate.Denom()) >= 0 {
		q.Add(q, big.NewInt(1))
	}
	if neg {
		q.Neg(q)
	}
	if !q.IsInt64() {
		return 0, fmt.Errorf("billing: %d at rate %s overflows", amount, rate.RatString())
	}
	return q.Int64(), nil
}

// Presentation is a response's amounts restated in the presentation
// currency's minor units. On the wire it is one object:
// {"currency": "USD", "rate": "0.011", "<amount name>": N, …}.
type Presentation struct {
	Currency string
	Rate     string
	Amounts  map[string]int64
}

// MarshalJSON flattens Amounts beside currency and rate.
func (p *Presentation) MarshalJSON() ([]byte, error) {
	m := make(map[string]any, len(p.Amounts)+2)
	for k, v := range p.Amounts {
		m[k] = v
	}
	m["currency"], m["rate"] = p.Currency, p.Rate
	return json.Marshal(m)
}

// present restates amounts in the presentation currency; nil when none is
// configured.
func (s *Service) present(amounts map[string]int64) (*Presentation, error) {
	if s.cfg.PresentationCurrency == "" {
		return nil, nil
	}
	rate, err := s.presentationRate()
	if err != nil {
		return nil, err
	}
	p := &Presentation{Currency: s.cfg.PresentationCurrency, Rate: strings.TrimSpace(s.cfg.PresentationRate),
		Amounts: make(map[string]int64, len(amounts))}
	for k, v := range amounts {
		if p.Amounts[k], err = convert(v, rate); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// presentationRate is Config.PresentationRate parsed, once per service.
func (s *Service) presentationRate() (*big.Rat, error) {
	s.rateOnce.Do(func() { s.rate, s.rateErr = ParseRate(s.cfg.PresentationRate) })
	return s.rate, s.rateErr
}
