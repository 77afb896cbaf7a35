package billing

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"nimbus/internal/store"
)

// Top-up statuses. A top-up is pending from the moment it is recorded until
// its provider answers, at once (test, manual) or later by webhook.
const (
	TopupPending   = "pending"
	TopupSucceeded = "succeeded"
	TopupFailed    = "failed"
)

// Topup is one payment into a project's account. Only a succeeded top-up
// has a ledger row (LedgerID).
type Topup struct {
	ID            string     `json:"id"`
	ProjectID     string     `json:"project_id"`
	Provider      string     `json:"provider"`
	Amount        int64      `json:"amount"`
	Currency      string     `json:"currency"`
	Status        string     `json:"status"`
	Reference     string     `json:"reference"`
	FailureReason string     `json:"failure_reason"`
	LedgerID      *string    `json:"ledger_id"`
	CreatedAt     time.Time  `json:"created_at"`
	CompletedAt   *time.Time `json:"completed_at"`
}

// PayRequest is what a provider is asked to take.
type PayRequest struct {
	// TopupID is Nimbus's id of the top-up: a provider's idempotency key
	// and what its webhook names to complete the top-up.
	TopupID  string
	Project  string
	Amount   int64 // minor units of Currency
	Currency string
	// Card is the simulated card number for the test provider.
	Card string
	// Reference is the operator's reference for the manual provider.
	Reference string
}

// Payment is a provider's answer to Pay.
type Payment struct {
	// Status is TopupSucceeded (credited at once) or TopupPending (the
	// provider confirms later through its webhook).
	Status string
	// Reference is the provider's id of the payment.
	Reference string
}

// PaymentProvider takes a customer's payment for a top-up. A provider may
// complete synchronously (Payment.Status succeeded) or asynchronously
// (pending, then a signed webhook: see WebhookProvider). A refused payment
// is an error from Declined; any other error leaves the top-up pending, since
// the provider may have taken the money after all.
type PaymentProvider interface {
	// Name is what POST /v1/topups names in "provider".
	Name() string
	// Pay asks for req.Amount from the customer of req.Project.
	Pay(ctx context.Context, req PayRequest) (Payment, error)
}

// WebhookProvider is a provider whose payments are confirmed by a webhook
// on POST /v1/webhooks/{name}.
type WebhookProvider interface {
	PaymentProvider
	// Webhook authenticates a webhook (its headers and raw body) with secret,
	// Config.WebhookSecrets[Name()], and answers the event it carries. A
	// failed authentication wraps ErrBadSignature.
	Webhook(header http.Header, body []byte, secret string, now time.Time) (WebhookEvent, error)
}

// WebhookEvent is a provider's word on one top-up.
type WebhookEvent struct {
	TopupID   string
	Status    string // TopupSucceeded or TopupFailed
	Amount    int64  // 0 when the provider does not restate it
	Reference string // "" keeps the reference Pay answered
	Reason    string // why it failed
}

// Errors of the payment path.
var (
	// ErrDeclined is wrapped by a provider's refusal (see Declined).
	ErrDeclined = errors.New("payment declined")
	// ErrUnknownProvider is a top-up naming no configured provider.
	ErrUnknownProvider = errors.New("unknown payment provider")
	// ErrOperatorOnly is a customer's top-up through an operator's provider.
	ErrOperatorOnly = errors.New("payment provider for operators only")
	// ErrProviderFailed is a provider error other than a refusal; the
	// top-up stays pending.
	ErrProviderFailed = errors.New("payment provider failed")
	// ErrBadSignature is a webhook that fails authentication.
	ErrBadSignature = errors.New("invalid webhook signature")
	// ErrBadWebhook wraps a provider's complaint about a webhook's body.
	ErrBadWebhook = errors.New("invalid webhook")
	// ErrTopupSettled is a webhook contradicting a top-up's final status.
	ErrTopupSettled = errors.New("top-up already settled")
	// ErrAmountMismatch is a webhook whose amount is not the top-up's.
	ErrAmountMismatch = errors.New("webhook amount does not match the top-up")
)

// DeclineError is a refused payment; it wraps ErrDeclined.
type DeclineError struct{ Reason string }

func (e *DeclineError) Error() string { return "payment declined: " + e.Reason }

// Unwrap makes errors.Is(err, ErrDeclined) hold.
func (e *DeclineError) Unwrap() error { return ErrDeclined }

// Declined is what a provider answers for a refused payment.
func Declined(reason string) error { return &DeclineError{Reason: reason} }

// TopupError is a top-up under the minimum or over the maximum.
type TopupError struct {
	Min, Max, Amount int64
	Currency         string
}

func (e *TopupError) Error() string {
	if e.Amount > e.Max {
		return "Top-up amount " + itoa(e.Amount) + " is over the maximum of " + itoa(e.Max) +
			" minor units (" + major(e.Max) + " " + e.Currency + ")."
	}
	return "Top-up amount " + itoa(e.Amount) + " is under the minimum of " + itoa(e.Min) +
		" minor units (" + major(e.Min) + " " + e.Currency + ")."
}

// TestProvider simulates a card payment that completes at once, for tests
// and trial installations. It succeeds unless PayRequest.Card is one of
// Stripe's declining test cards: 4000000000000002 (generic decline) or
// 4000000000009995 (insufficient funds).
type TestProvider struct{}

// Name is "test".
func (TestProvider) Name() string { return "test" }

// Pay succeeds with a fresh reference, or declines the test cards above.
func (TestProvider) Pay(_ context.Context, req PayRequest) (Payment, error) {
	switch req.Card {
	case "4000000000000002":
		return Payment{}, Declined("your card was declined")
	case "4000000000009995":
		return Payment{}, Declined("your card has insufficient funds")
	}
	return Payment{Status: TopupSucceeded, Reference: "test-" + uuid.NewString()}, nil
}

// ManualProvider records money the operator received outside Nimbus, such
// as a bank transfer, under the operator's reference. Only the admin route
// POST /v1/accounts/{project}/topups uses it, and Config.MinTopup does not
// apply.
type ManualProvider struct{}

// Name is "manual".
func (ManualProvider) Name() string { return "manual" }

// Pay succeeds with the operator's reference.
func (ManualProvider) Pay(_ context.Context, req PayRequest) (Payment, error) {
	return Payment{Status: TopupSucceeded, Reference: req.Reference}, nil
}

func (ManualProvider) operatorOnly() {}

// operatorOnly marks providers customers may not use.
type operatorOnly interface{ operatorOnly() }

const webhookTestName = "webhook-test"

// WebhookTestProvider simulates a provider that confirms payments later:
// Pay leaves the top-up pending, and a webhook signed with SignWebhook
// completes it. Its body is
//
//	{"event": {"topup_id": "…", "status": "succeeded"|"failed", "amount": N, "reason": "…"}}
//
// where amount (checked against the top-up when given) and reason are
// optional.
type WebhookTestProvider struct{}

// Name is "webhook-test".
func (WebhookTestProvider) Name() string { return webhookTestName }

// Pay leaves the payment pending.
func (WebhookTestProvider) Pay(context.Context, PayRequest) (Payment, error) {
	return Payment{Status: TopupPending, Reference: "whtest-" + uuid.NewString()}, nil
}

// Webhook checks the X-Nimbus-Signature header and reads the event.
func (WebhookTestProvider) Webhook(header http.Header, body []byte, secret string, now time.Time) (WebhookEvent, error) {
	if err := VerifyWebhook(secret, header.Get(SignatureHeader), body, now); err != nil {
		return WebhookEvent{}, err
	}
	var in struct {
		Event *struct {
			TopupID string `json:"topup_id"`
			Status  string `json:"status"`
			Amount  int64  `json:"amount"`
			Reason  string `json:"reason"`
		} `json:"event"`
	}
	if err := json.Unmarshal(body, &in); err != nil || in.Event == nil {
		return WebhookEvent{}, errors.New(`the body must be {"event": {"topup_id": …, "status": …}}`)
	}
	e := in.Event
	if e.Status != TopupSucceeded && e.Status != TopupFailed {
		return WebhookEvent{}, fmt.Errorf("event status %q is not succeeded or failed", e.Status)
	}
	return WebhookEvent{TopupID: e.TopupID, Status: e.Status, Amount: e.Amount, Reason: e.Reason}, nil
}

// SignatureHeader carries a webhook's signature in Nimbus's scheme.
const SignatureHeader = "X-Nimbus-Signature"

// SignatureTolerance is how far a signature's timestamp may be from now; it
// bounds how long a captured webhook can be replayed (a replay inside it
// changes nothing anyway: a settled top-up is never credited again).
const SignatureTolerance = 5 * time.Minute

// SignWebhook is the X-Nimbus-Signature value for body sent at t:
// "t=<unix seconds>,sha256=<hex HMAC-SHA256 of "<t>.<body>" under secret>".
// Signing the timestamp with the body stops an old body being re-dated.
func SignWebhook(secret string, body []byte, t time.Time) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	return "t=" + ts + ",sha256=" + hex.EncodeToString(webhookMAC(secret, ts, body))
}

func webhookMAC(secret, ts string, body []byte) []byte {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(ts))
	m.Write([]byte("."))
	m.Write(body)
	return m.Sum(nil)
}

// VerifyWebhook checks a SignWebhook header against body at now; failures
// wrap ErrBadSignature.
func VerifyWebhook(secret, header string, body []byte, now time.Time) error {
	if secret == "" {
		return fmt.Errorf("%w: no secret configured", ErrBadSignature)
	}
	var ts, sig string
	for _, part := range strings.Split(header, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(part), "=")
		switch k {
		case "t":
			ts = v
		case "sha256":
			sig = v
		}
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || sig == "" {
		return fmt.Errorf("%w: %s must be t=<unix time>,sha256=<hex>", ErrBadSignature, SignatureHeader)
	}
	if d := now.Sub(time.Unix(sec, 0)); d > SignatureTolerance || d < -SignatureTolerance {
		return fmt.Errorf("%w: timestamp outside %s of now", ErrBadSignature, SignatureTolerance)
	}
	got, err := hex.DecodeString(sig)
	if err != nil || !hmac.Equal(got, webhookMAC(secret, ts, body)) {
		return fmt.Errorf("%w: signature mismatch", ErrBadSignature)
	}
	return nil
}

func randomSecret() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails on supported platforms
	return hex.EncodeToString(b)
}

// provider finds a provider by name: those added with AddProvider, then
// the built-in manual and webhook-test.
func (s *Service) provider(name string) (PaymentProvider, bool) {
	if p, ok := s.providers[name]; ok {
		return p, true
	}
	switch name {
	case "manual":
		return ManualProvider{}, true
	case webhookTestName:
		return WebhookTestProvider{}, s.cfg.TestPayments
	}
	return nil, false
}

// Topup takes req.Amount from the customer of req.Project through the named
// provider. Amounts under Config.MinTopup are refused before anything is
// recorded. Otherwise the top-up is recorded as pending, the provider is
// asked, and the answer settles it: succeeded (credited), failed (with a
// *DeclineError, nothing credited) or still pending (a webhook will
// settle it; also after ErrProviderFailed). The top-up is returned with
// every outcome it was recorded for.
func (s *Service) Topup(ctx context.Context, provider string, req PayRequest) (*Topup, error) {
	return s.topup(ctx, provider, req, false)
}

// CreditManual records money the operator received for project (a bank
// transfer, say) through the manual provider; reference is required.
func (s *Service) CreditManual(ctx context.Context, project string, amount int64, reference string) (*Topup, error) {
	if strings.TrimSpace(reference) == "" {
		return nil, errors.New("billing: a manual top-up needs a reference")
	}
	return s.topup(ctx, "manual", PayRequest{Project: project, Amount: amount, Reference: reference}, true)
}

func (s *Service) topup(ctx context.Context, name string, req PayRequest, operator bool) (*Topup, error) {
	// The operator's manual credits have no minimum and no per-top-up
	// maximum; every credit is bounded by MaxBalance.
	minimum, maximum := s.cfg.MinTopup, s.cfg.MaxTopup
	if operator {
		minimum, maximum = 1, s.cfg.MaxBalance
	}
	if req.Amount < minimum || req.Amount > maximum {
		return nil, &TopupError{Min: minimum, Max: maximum, Currency: s.cfg.Currency, Amount: req.Amount}
	}
	p, ok := s.provider(name)
	if !ok {
		return nil, ErrUnknownProvider
	}
	if _, only := p.(operatorOnly); only && !operator {
		return nil, ErrOperatorOnly
	}
	t := &Topup{ID: newID(), ProjectID: req.Project, Provider: name, Amount: req.Amount, Currency: s.cfg.Currency,
		Status: TopupPending, CreatedAt: s.cfg.Now().UTC()}
	req.TopupID, req.Currency = t.ID, s.cfg.Currency
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		if err := s.lockAccount(ctx, tx, req.Project); err != nil {
			return err
		}
		if err := s.checkCredit(ctx, tx, req.Project, req.Amount); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO billing_topups (id, project_id, provider, amount, status, reference, failure_reason,
 ledger_id, created_at, completed_at) VALUES (?, ?, ?, ?, ?, '', '', NULL, ?, NULL)`,
			t.ID, t.ProjectID, name, t.Amount, TopupPending, store.FormatTime(t.CreatedAt))
		return err
	})
	if err != nil {
		return nil, err
	}
	// The provider is asked outside any transaction: it may take seconds.
	pay, err := p.Pay(ctx, req)
	switch {
	case errors.Is(err, ErrDeclined):
		reason := err.Error()
		if d := (*DeclineError)(nil); errors.As(err, &d) {
			reason = d.Reason
		}
		done, _, ferr := s.settleTopup(ctx, name, WebhookEvent{TopupID: t.ID, Status: TopupFailed, Reason: reason})
		if ferr != nil {
			return nil, ferr
		}
		return done, err
	case err != nil:
		s.cfg.Log.Error("billing: payment provider failed; top-up left pending", "provider", name, "topup", t.ID, "error", err)
		return t, fmt.Errorf("%w: %v", ErrProviderFailed, err)
	case pay.Status == TopupPending:
		// Only while pending: a webhook may have settled it already.
		err := s.db.Tx(ctx, func(tx *store.Tx) error {
			_, err := tx.Exec(ctx, "UPDATE billing_topups SET reference = ? WHERE id = ? AND status = ? AND reference = ''",
				pay.Reference, t.ID, TopupPending)
			return err
		})
		if err != nil {
			return nil, err
		}
		return s.GetTopup(ctx, t.ID)
	case pay.Status == TopupSucceeded:
		done, _, err := s.settleTopup(ctx, name, WebhookEvent{TopupID: t.ID, Status: TopupSucceeded, Reference: pay.Reference})
		return done, err
	}
	return t, fmt.Errorf("%w: unknown payment status %q", ErrProviderFailed, pay.Status)
}

// settleTopup moves a pending top-up of provider to ev.Status, and when it
// succeeded writes its ledger row in the same transaction. The conditional
// UPDATE is what makes the credit exactly once: a replayed or concurrent
// webhook finds the top-up no longer pending and changes nothing (changed
// false). A webhook contradicting the settled status is ErrTopupSettled.
func (s *Service) settleTopup(ctx context.Context, provider string, ev WebhookEvent) (*Topup, bool, error) {
	var out *Topup
	var changed bool
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		changed = false
		t, err := loadTopup(ctx, tx, ev.TopupID)
		if err != nil {
			return err
		}
		if t.Provider != provider {
			return store.ErrNotFound // one provider's webhook never settles another's top-up
		}
		if t.Status != TopupPending {
			out = t
			if t.Status != ev.Status {
				return ErrTopupSettled
			}
			return nil // a replay
		}
		if ev.Amount != 0 && ev.Amount != t.Amount {
			return ErrAmountMismatch
		}
		now := s.cfg.Now().UTC()
		ref := t.Reference
		if ev.Reference != "" {
			ref = ev.Reference
		}
		var ledgerID *string
		reason := ""
		if ev.Status == TopupSucceeded {
			id := newID()
			ledgerID = &id
		} else {
			reason = ev.Reason
			if reason == "" {
				reason = "the payment failed"
			}
		}
		res, err := tx.Exec(ctx, `UPDATE billing_topups SET status = ?, reference = ?, failure_reason = ?, ledger_id = ?, completed_at = ?
 WHERE id = ? AND status = ?`, ev.Status, ref, reason, ledgerID, store.FormatTime(now), t.ID, TopupPending)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			// Settled by a concurrent call since we read it: answer as a replay.
			t, err := loadTopup(ctx, tx, ev.TopupID)
			if err != nil {
				return err
			}
			out = t
			if t.Status != ev.Status {
				return ErrTopupSettled
			}
			return nil
		}
		if ledgerID != nil {
			if _, err := tx.Exec(ctx, `INSERT INTO billing_ledger (id, project_id, kind, amount, resource_id, period_start, created_at, reference)
 VALUES (?, ?, ?, ?, NULL, NULL, ?, ?)`, *ledgerID, t.ProjectID, KindTopup, t.Amount, store.FormatTime(now), provider+":"+ref); err != nil {
				return err
			}
		}
		changed = true
		out, err = loadTopup(ctx, tx, ev.TopupID)
		return err
	})
	if err != nil {
		return out, false, err
	}
	out.Currency = s.cfg.Currency
	return out, changed, nil
}

// GetTopup reads one top-up; store.ErrNotFound when there is none.
func (s *Service) GetTopup(ctx context.Context, id string) (*Topup, error) {
	t, err := loadTopup(ctx, s.db, id)
	if err != nil {
		return nil, err
	}
	t.Currency = s.cfg.Currency
	return t, nil
}

func loadTopup(ctx context.Context, q store.Querier, id string) (*Topup, error) {
	t := &Topup{}
	var created string
	var completed *string
	err := q.QueryRow(ctx, `SELECT id, project_id, provider, amount, status, reference, failure_reason, ledger_id, created_at, completed_at
 FROM billing_topups WHERE id = ?`, id).Scan(&t.ID, &t.ProjectID, &t.Provider, &t.Amount, &t.Status, &t.Reference,
		&t.FailureReason, &t.LedgerID, &created, &completed)
	if store.IsNoRows(err) {
		return nil, store.ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	t.CreatedAt = store.ParseTime(created)
	if completed != nil {
		c := store.ParseTime(*completed)
		t.CompletedAt = &c
	}
	return t, nil
}

// webhook authenticates a webhook for provider and settles the top-up it
// names.
func (s *Service) webhook(ctx context.Context, provider string, header http.Header, body []byte) (*Topup, bool, error) {
	p, ok := s.provider(provider)
	wp, hooks := p.(WebhookProvider)
	secret := s.cfg.WebhookSecrets[provider]
	if !ok || !hooks || secret == "" {
		return nil, false, ErrUnknownProvider
	}
	ev, err := wp.Webhook(header, body, secret, s.cfg.Now())
	if errors.Is(err, ErrBadSignature) {
		return nil, false, err
	}
	if err != nil {
		return nil, false, fmt.Errorf("%w: %v", ErrBadWebhook, err)
	}
	if ev.TopupID == "" || (ev.Status != TopupSucceeded && ev.Status != TopupFailed) {
		return nil, false, fmt.Errorf("%w: the event names no top-up or no final status", ErrBadWebhook)
	}
	return s.settleTopup(ctx, provider, ev)
}
