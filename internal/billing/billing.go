// Package billing is Nimbus's ledger of record: the price list, quotes, one
// prepaid account per project, an append-only ledger whose sum is the
// balance, and the hourly charging pass that records each resource's hour
// exactly once.
//
// Money is int64 minor units of one currency (Config.Currency); no float
// ever touches an amount. Hourly rates in the price list are in rate units,
// 1/RateScale of a minor unit, so that small per-GB rates stay exact; a
// quote's line items are rounded up to whole minor units, and a quote is
// exactly what the charging pass records for one hour.
//
// Wiring (done by internal/cloud):
//
//	b := billing.New(db, cfg)
//	svc := api.NewService("billing", api.RenderKeystone, auth)
//	svc.Handle(b.Routes()...)
//	go b.Run(ctx) // the hourly charging job
package billing

import (
	"context"
	"fmt"
	"log/slog"
	"math/big"
	"sync"
	"time"

	"nimbus/internal/lease"
	"nimbus/internal/store"
)

// Config is the operator's billing settings. Zero fields take the defaults
// documented on each field.
type Config struct {
	// Currency is the ISO 4217 code of all amounts (default "RUB").
	Currency string
	// MinTopup is the smallest top-up in minor units (default 10000, i.e.
	// 100.00 of the currency).
	MinTopup int64
	// DefaultCreditLimit is the credit limit of a new account (default 0).
	DefaultCreditLimit int64
	// HoursPerMonth turns an hourly price into a monthly one (default 720).
	HoursPerMonth int
	// MaxCatchUpHours bounds the hours one charging pass processes after a
	// late run (default 168); the rest is charged by the next pass.
	MaxCatchUpHours int
	// Grace is how long after an hour ends the pass still re-reads it, so a
	// server committed just after the hour turned is not missed (default 10m).
	Grace time.Duration
	// BatchSize is how many servers one charging transaction covers
	// (default 5000).
	BatchSize int
	// WebhookSecrets holds each payment provider's webhook signing secret,
	// by provider name. "webhook-test" gets a random one per process when
	// unset.
	WebhookSecrets map[string]string
	// PresentationCurrency is an optional second currency (ISO 4217, e.g.
	// "USD") in which account, quote and price responses also show their
	// amounts; it is display only, the ledger stays in Currency.
	PresentationCurrency string
	// PresentationRate is how many major units of PresentationCurrency one
	// major unit of Currency is worth, as an exact decimal or fraction
	// ("0.011" or "11/1000"; see ParseRate). Both currencies are taken to
	// have two decimal places. An invalid rate disables the presentation
	// currency with a logged error.
	PresentationRate string
	// MaxTopup is the largest top-up a customer may make, in minor units
	// (default 100,000,000, i.e. 1,000,000.00).
	MaxTopup int64
	// MaxBalance is the largest balance a credit (a top-up, an operator's
	// credit or adjustment, trial credit) may bring an account to, in
	// minor units (default 10,000,000,000, i.e. 100,000,000.00); pending
	// top-ups count. Together with MaxTopup it keeps every sum of amounts
	// inside int64. At most 10^15.
	MaxBalance int64
	// TestPayments offers the simulated providers (test and webhook-test),
	// which credit accounts without taking money: for demos and tests
	// only, never in production.
	TestPayments bool
	// Now is the clock (default time.Now); tests inject theirs.
	Now func() time.Time
	// BeforeCommit, when set, runs inside each charging transaction after
	// its inserts and before its commit: fault tests pause or kill the
	// process there (nimbus serve sets it only from
	// NIMBUS_FAULT_CHARGE_PAUSE, which --production refuses). Never set
	// in production.
	BeforeCommit func()
	// Log gets the charging job's lines (default slog.Default()).
	Log *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.Currency == "" {
		c.Currency = "RUB"
	}
	if c.MinTopup <= 0 {
		c.MinTopup = 10000
	}
	if c.MaxTopup <= 0 {
		c.MaxTopup = 100_000_000
	}
	if c.MaxBalance <= 0 {
		c.MaxBalance = 10_000_000_000
	}
	c.MaxBalance = min(c.MaxBalance, MaxAmount)
	if c.HoursPerMonth <= 0 {
		c.HoursPerMonth = 720
	}
	if c.MaxCatchUpHours <= 0 {
		c.MaxCatchUpHours = 168
	}
	if c.Grace <= 0 {
		c.Grace = 10 * time.Minute
	}
	if c.BatchSize <= 0 {
		c.BatchSize = 5000
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Log == nil {
		c.Log = slog.Default()
	}
	if c.WebhookSecrets[webhookTestName] == "" {
		m := map[string]string{webhookTestName: randomSecret()}
		for k, v := range c.WebhookSecrets {
			if k != webhookTestName {
				m[k] = v
			}
		}
		c.WebhookSecrets = m
	}
	if c.PresentationCurrency != "" {
		if _, err := ParseRate(c.PresentationRate); err != nil {
			c.Log.Error("billing: presentation currency disabled", "currency", c.PresentationCurrency, "error", err)
			c.PresentationCurrency = ""
		}
	}
	return c
}

// Service is the billing service over one database.
type Service struct {
	db        *store.DB
	cfg       Config
	providers map[string]PaymentProvider
	suspender Suspender    // shelves servers; nil: nothing is shelved
	detacher  Detacher     // detaches public addresses; nil: nothing is detached
	flavors   FlavorSource // prices flavors in quotes; nil: quotes take parts only
	// leases runs the charging pass on one controller at a time; made
	// here (ownLeases) unless the region's are shared (SetLeases).
	leases    *lease.Manager
	ownLeases bool
	// rate is the parsed presentation rate (presentationRate).
	rateOnce sync.Once
	rate     *big.Rat
	rateErr  error
}

// New makes the billing service. The tables come from migration 0008.
func New(db *store.DB, cfg Config) *Service {
	s := &Service{db: db, cfg: cfg.withDefaults(), providers: map[string]PaymentProvider{}}
	s.leases = lease.New(db, lease.Config{Now: s.cfg.Now, Log: s.cfg.Log})
	s.ownLeases = true
	if s.cfg.TestPayments {
		s.AddProvider(TestProvider{})
	}
	return s
}

// AddProvider makes a payment provider available to POST /v1/topups.
func (s *Service) AddProvider(p PaymentProvider) { s.providers[p.Name()] = p }

// Run charges every hour until ctx ends, on one controller of the region
// at a time (chargeJob): a pass is due at start when none ran since the
// hour turned, then a few seconds after each hour turns. A failed pass is
// logged and tried again within a minute, on whichever controller looks
// first; nothing is lost since each pass catches up from where the last
// stopped, and nothing is charged twice (ChargeUntil).
func (s *Service) Run(ctx context.Context) {
	if s.ownLeases {
		go s.leases.Run(ctx)
	}
	s.leases.Loop(ctx, s.chargeJob())
}

// SetLeases shares the region's leases (internal/lease) with billing; by
// default billing makes its own under a random holder name.
func (s *Service) SetLeases(m *lease.Manager) { s.leases, s.ownLeases = m, false }

// chargeJob is the hourly charging pass as a region's job: its trial
// expiry and running-dry checks go with it.
func (s *Service) chargeJob() lease.Job {
	return lease.Job{Name: "billing-charge", Check: time.Minute,
		Next: func(last time.Time) time.Time {
			if last.IsZero() {
				return last
			}
			return last.Truncate(time.Hour).Add(time.Hour + 5*time.Second)
		},
		Run: func(ctx context.Context) error {
			for {
				res, err := s.ChargeUntil(ctx, s.cfg.Now())
				if err != nil {
					return fmt.Errorf("charging pass: %w", err)
				}
				s.cfg.Log.Info("billing: charging pass", "hours", res.Hours, "charges", res.Charges, "amount", res.Amount)
				if res.CaughtUp {
					return nil
				}
			}
		}}
}
