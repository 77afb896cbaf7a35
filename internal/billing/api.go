package billing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"

	"nimbus/internal/api"
	"nimbus/internal/metering"
	"nimbus/internal/store"
)

// Routes is the billing API (served with api.RenderKeystone errors):
//
//	GET  /v1/account                           the caller's project account
//	GET  /v1/ledger?limit=&marker=             its ledger, newest first
//	POST /v1/topups                            {"topup": {"amount": N, "provider": "test"}}
//	POST /v1/quotes                            {"quote": {flavor or configurator choice}}
//	GET  /v1/prices                            the price list
//	PUT  /v1/prices                            admin: change rates
//	GET  /v1/accounts/{project}                admin: any account
//	PUT  /v1/accounts/{project}/credit_limit   admin: {"credit_limit": N}
//	POST /v1/accounts/{project}/adjustments    admin: {"adjustment": {"amount": N, "reference": "…"}}
func (s *Service) Routes() []api.Route {
	routes := []api.Route{
		{Pattern: "GET /v1/account", Handler: s.getAccount},
		{Pattern: "GET /v1/ledger", Handler: s.listLedger},
		{Pattern: "POST /v1/topups", Handler: s.createTopup},
		{Pattern: "POST /v1/quotes", Handler: s.createQuote},
		{Pattern: "GET /v1/prices", Handler: s.getPrices},
		{Pattern: "PUT /v1/prices", Handler: s.putPrices, AdminOnly: true, Policy: "billing:prices:update"},
		{Pattern: "GET /v1/accounts/{project}", Handler: s.adminGetAccount, AdminOnly: true, Policy: "billing:accounts:get"},
		{Pattern: "PUT /v1/accounts/{project}/credit_limit", Handler: s.putCreditLimit, AdminOnly: true, Policy: "billing:accounts:credit_limit"},
		{Pattern: "POST /v1/accounts/{project}/adjustments", Handler: s.createAdjustment, AdminOnly: true, Policy: "billing:accounts:adjust"},
	}
	routes = append(routes, s.paymentRoutes()...)
	routes = append(routes, s.trialRoutes()...)
	routes = append(routes, s.termRoutes()...)
	return append(routes, s.usageRoutes()...)
}

// project is the caller's project; billing needs a project-scoped token.
func project(r *http.Request) (string, error) {
	c := api.CallerFrom(r.Context())
	if c == nil || c.ProjectID == "" {
		return "", api.Forbidden("The billing API needs a project-scoped token.")
	}
	return c.ProjectID, nil
}

func (s *Service) getAccount(r *http.Request) (*api.Response, error) {
	p, err := project(r)
	if err != nil {
		return nil, err
	}
	return s.accountResponse(r, p)
}

func (s *Service) adminGetAccount(r *http.Request) (*api.Response, error) {
	p, err := pathProject(r)
	if err != nil {
		return nil, err
	}
	return s.accountResponse(r, p)
}

func pathProject(r *http.Request) (string, error) {
	p := r.PathValue("project")
	if p == "" || len(p) > 64 || !api.ValidText(p) {
		return "", api.BadRequest("Invalid project id.")
	}
	return p, nil
}

// ledgerLimit is a ledger page's size: 100 unless asked, at most 1000.
var ledgerLimit = api.IntRule{Default: 100, Min: 1, Max: 1000, NotInt: func(raw string) error {
	return api.BadRequest("Invalid limit %q: must be a positive integer.", raw)
}}

func (s *Service) listLedger(r *http.Request) (*api.Response, error) {
	p, err := project(r)
	if err != nil {
		return nil, err
	}
	q := r.URL.Query()
	limit, err := ledgerLimit.Parse(q.Get("limit"), q.Get("limit") != "")
	if err != nil {
		return nil, err
	}
	marker := q.Get("marker")
	entries, err := s.Ledger(r.Context(), p, limit, marker)
	if errors.Is(err, store.ErrNotFound) {
		return nil, api.BadRequest("Marker %s could not be found.", marker)
	}
	if err != nil {
		return nil, err
	}
	body := map[string]any{"ledger": entries}
	if len(entries) == limit {
		next := api.NextQuery(nil, map[string]string{"limit": strconv.Itoa(limit), "marker": entries[len(entries)-1].ID})
		body["ledger_links"] = []map[string]string{{"rel": "next", "href": api.BaseURL(r) + "/v1/ledger?" + next}}
	}
	return api.JSON(http.StatusOK, body), nil
}

// wrapped decodes {"<key>": {...}} into v, refusing other top-level keys.
func wrapped(r *http.Request, key string, v any) error {
	var outer map[string]json.RawMessage
	if err := api.DecodeJSON(r, &outer); err != nil {
		return err
	}
	if err := api.UnknownFields(outer, key); err != nil {
		return err
	}
	inner, ok := outer[key]
	if !ok {
		return api.BadRequest("'%s' is a required property", key)
	}
	return api.Unmarshal(inner, v)
}

// createTopup takes a customer's payment: {"topup": {"amount": N,
// "provider": "test", "card": "…"}}. It answers 201 with the top-up, whose
// status is succeeded, or pending when the provider confirms by webhook; a
// declined payment is 402 and recorded as failed.
func (s *Service) createTopup(r *http.Request) (*api.Response, error) {
	p, err := project(r)
	if err != nil {
		return nil, err
	}
	var raw json.RawMessage
	if err := wrapped(r, "topup", &raw); err != nil {
		return nil, err
	}
	var fields map[string]json.RawMessage
	if err := api.Unmarshal(raw, &fields); err != nil {
		return nil, err
	}
	if err := api.UnknownFields(fields, "amount", "provider", "card"); err != nil {
		return nil, err
	}
	var body struct {
		Amount   *int64 `json:"amount"`
		Provider string `json:"provider"`
		Card     string `json:"card"`
	}
	if err := api.Unmarshal(raw, &body); err != nil {
		return nil, err
	}
	if body.Amount == nil {
		return nil, api.BadRequest("'amount' is a required property")
	}
	if body.Provider == "" {
		body.Provider = "test"
	}
	if body.Card != "" && !isCardNumber(body.Card) {
		return nil, api.BadRequest("'card' must be a card number of 12 to 19 digits.")
	}
	t, err := s.Topup(r.Context(), body.Provider, PayRequest{Project: p, Amount: *body.Amount, Card: body.Card})
	if err != nil {
		return nil, topupError(err, body.Provider, t)
	}
	return api.JSON(http.StatusCreated, map[string]any{"topup": t}), nil
}

// topupError maps Topup's errors to client answers.
func topupError(err error, provider string, t *Topup) error {
	var te *TopupError
	switch {
	case errors.As(err, &te):
		return api.BadRequest("%s", te.Error())
	case errors.Is(err, ErrBalanceLimit):
		return balanceLimitError(err)
	case errors.Is(err, ErrUnknownProvider):
		return api.BadRequest("Unknown payment provider %q.", provider)
	case errors.Is(err, ErrOperatorOnly):
		return api.Forbidden("Payment provider %q is for operators: they credit an account with "+
			"POST /v1/accounts/{project}/topups.", provider)
	case errors.Is(err, ErrDeclined) && t != nil:
		return api.Errorf(http.StatusPaymentRequired, "The payment was declined (%s); top-up %s is recorded as failed and nothing was credited.",
			t.FailureReason, t.ID)
	case errors.Is(err, ErrProviderFailed) && t != nil:
		return api.Errorf(http.StatusBadGateway, "The payment provider %q did not answer; top-up %s is pending until it does.", provider, t.ID)
	}
	return err
}

// balanceLimitError is the 400 for a credit over Config.MaxBalance.
func balanceLimitError(err error) error {
	return api.BadRequest("%s.", upperFirst(strings.TrimPrefix(err.Error(), ErrBalanceLimit.Error()+": ")))
}

func isCardNumber(s string) bool {
	if len(s) < 12 || len(s) > 19 {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// quoteRequest is a configurator choice on the wire: RAM in whole GB, or a
// flavor (by id or name) in place of the server's parts.
type quoteRequest struct {
	Flavor     string `json:"flavor"`
	VCPUs      int64  `json:"vcpus"`
	RAMGB      int64  `json:"ram_gb"`
	DiskType   string `json:"disk_type"`
	DiskGB     int64  `json:"disk_gb"`
	GPUModel   string `json:"gpu_model"`
	GPUCount   int64  `json:"gpu_count"`
	PublicIPv4 bool   `json:"public_ipv4"`
	OSType     string `json:"os_type"`
	// Storage and addresses beside (or without) a server: volumes,
	// snapshots, backups and images per GB, a floating IP by public_ipv4.
	VolumeGB   int64 `json:"volume_gb"`
	SnapshotGB int64 `json:"snapshot_gb"`
	BackupGB   int64 `json:"backup_gb"`
	ImageGB    int64 `json:"image_gb"`
	Quantity   int64 `json:"quantity"`
	// Tariff: "hourly" (default), for DurationHours (default one month),
	// or "prepaid" for TermMonths.
	Tariff        string `json:"tariff"`
	TermMonths    int    `json:"term_months"`
	DurationHours int64  `json:"duration_hours"`
}

// quoteParts are the fields that describe a server part by part; a flavor
// replaces them all.
var quoteParts = []string{"vcpus", "ram_gb", "disk_type", "disk_gb", "gpu_model", "gpu_count", "public_ipv4"}

// quoteFields are all the fields of a quote.
var quoteFields = append([]string{"flavor"}, append(quoteParts, "os_type", "volume_gb", "snapshot_gb", "backup_gb", "image_gb",
	"quantity", "tariff", "term_months", "duration_hours")...)

// FlavorSource finds a compute flavor for quotes: compute implements it.
type FlavorSource interface {
	// FlavorSpec is the metered spec of the flavor ref (an id or a name)
	// that project may use; store.ErrNotFound when there is none.
	FlavorSpec(ctx context.Context, project, ref string) (metering.Spec, error)
}

// SetFlavors connects the service that knows flavors; without it a quote
// naming a flavor is refused.
func (s *Service) SetFlavors(f FlavorSource) { s.flavors = f }

func (s *Service) createQuote(r *http.Request) (*api.Response, error) {
	var raw json.RawMessage
	if err := wrapped(r, "quote", &raw); err != nil {
		return nil, err
	}
	var fields map[string]json.RawMessage
	if err := api.Unmarshal(raw, &fields); err != nil {
		return nil, err
	}
	if err := checkQuoteFields(fields); err != nil {
		return nil, err
	}
	var qr quoteRequest
	if err := api.Unmarshal(raw, &qr); err != nil {
		return nil, err
	}
	c, err := s.quoteChoice(r, fields, qr)
	if err != nil {
		return nil, err
	}
	prices, err := loadPrices(r.Context(), s.db)
	if err != nil {
		return nil, err
	}
	q, err := prices.Quote(c, s.cfg.Currency, s.cfg.HoursPerMonth)
	if err == nil && len(q.Items) == 0 {
		err = fmt.Errorf("%w: the quote prices nothing: give a flavor, or vcpus, ram_gb, disk_gb, gpu_model, public_ipv4, volume_gb, snapshot_gb, backup_gb or image_gb", ErrInvalid)
	}
	if err == nil {
		q, err = prices.WithTariff(q, qr.Tariff, qr.TermMonths, qr.DurationHours)
	}
	if errors.Is(err, ErrInvalid) || errors.Is(err, ErrUnpriced) {
		return nil, api.BadRequest("%s", err.Error())
	}
	if err != nil {
		return nil, err
	}
	pr, err := s.present(map[string]int64{"hourly_each": q.HourlyEach, "hourly": q.Hourly, "monthly": q.Monthly, "total": q.Total})
	if err != nil {
		return nil, err
	}
	cov, err := s.coverage(r, q)
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, map[string]any{"quote": struct {
		Quote
		Presentation *Presentation `json:"presentation,omitempty"`
		Coverage     *Coverage     `json:"coverage,omitempty"`
	}{q, pr, cov}}), nil
}

// Coverage says whether the caller's project may order a quote now, by
// the gate's rule: its funds must cover the first hour, and a prepaid
// term's whole price besides. The panel's configurator shows it as is.
type Coverage struct {
	Funds
	Needed  int64  `json:"needed"`
	Covered bool   `json:"covered"`
	Message string `json:"message,omitempty"` // the refusal the order would get
}

func (s *Service) coverage(r *http.Request, q Quote) (*Coverage, error) {
	p, err := project(r)
	if err != nil {
		return nil, nil // a quote needs no project; its coverage does
	}
	need := q.Hourly
	if q.Tariff == TariffPrepaid {
		if need, err = addMoney(q.Hourly, q.Total); err != nil {
			return nil, api.BadRequest("The price is out of range.")
		}
	}
	f, err := s.Funds(r.Context(), p)
	if err != nil {
		return nil, err
	}
	c := &Coverage{Funds: f, Needed: need, Covered: f.Available >= need}
	if !c.Covered {
		var ae *api.Error
		if errors.As(s.refusal(p, f, need), &ae) {
			c.Message = ae.Message
		}
	}
	return c, nil
}

// checkQuoteFields refuses an unknown field naming the allowed ones, and a
// flavor given together with the parts it replaces.
func checkQuoteFields(fields map[string]json.RawMessage) error {
	var unknown []string
	for k := range fields {
		if !slices.Contains(quoteFields, k) {
			unknown = append(unknown, "'"+k+"'")
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return api.BadRequest("Unknown field %s in quote; the fields are %s.", strings.Join(unknown, ", "), strings.Join(quoteFields, ", "))
	}
	if _, ok := fields["flavor"]; !ok {
		return nil
	}
	for _, k := range quoteParts {
		if _, ok := fields[k]; ok {
			return api.BadRequest("A quote takes a flavor or its parts, not both: %s comes from the flavor.", k)
		}
	}
	return nil
}

// quoteChoice is the configurator choice a quote asks about: the parts it
// gives, or those of its flavor.
func (s *Service) quoteChoice(r *http.Request, fields map[string]json.RawMessage, qr quoteRequest) (Choice, error) {
	if _, ok := fields["flavor"]; !ok {
		if qr.RAMGB < 0 || qr.RAMGB > maxRAMMB/1024 {
			return Choice{}, api.BadRequest("ram_gb must be between 0 and %d", maxRAMMB/1024)
		}
		c := Choice{VCPUs: qr.VCPUs, RAMMB: qr.RAMGB * 1024, DiskType: qr.DiskType, DiskGB: qr.DiskGB,
			GPUModel: qr.GPUModel, GPUCount: qr.GPUCount, PublicIPv4: qr.PublicIPv4, OSType: qr.OSType, Quantity: qr.Quantity,
			VolumeGB: qr.VolumeGB, SnapshotGB: qr.SnapshotGB, BackupGB: qr.BackupGB, ImageGB: qr.ImageGB}
		if c.GPUModel != "" && c.GPUCount == 0 {
			c.GPUCount = 1
		}
		return c, nil
	}
	if qr.Flavor == "" || len(qr.Flavor) > 255 {
		return Choice{}, api.BadRequest("flavor must be a flavor's id or name.")
	}
	if s.flavors == nil {
		return Choice{}, api.BadRequest("Flavors cannot be quoted here: give vcpus, ram_gb and disk_gb.")
	}
	p, err := project(r) // flavors are open to projects
	if err != nil {
		return Choice{}, err
	}
	sp, err := s.flavors.FlavorSpec(r.Context(), p, qr.Flavor)
	if errors.Is(err, store.ErrNotFound) {
		return Choice{}, api.BadRequest("No flavor '%s': give the id or name of a flavor your project may use.", qr.Flavor)
	}
	if err != nil {
		return Choice{}, err
	}
	c := ChoiceOf(metering.KindServer, sp)
	c.OSType, c.Quantity = qr.OSType, qr.Quantity
	c.VolumeGB, c.SnapshotGB, c.BackupGB, c.ImageGB = qr.VolumeGB, qr.SnapshotGB, qr.BackupGB, qr.ImageGB
	return c, nil
}

// pricesBody is the price list; with a presentation currency it also names
// that currency, its rate and the minimum top-up in it (rates stay in the
// ledger currency: converting 1/10000 of a minor unit would round them away).
func (s *Service) pricesBody(p *PriceList) (map[string]any, error) {
	body := map[string]any{
		"currency": s.cfg.Currency, "rate_scale": RateScale, "hours_per_month": s.cfg.HoursPerMonth,
		"min_topup": s.cfg.MinTopup, "hourly": p}
	pr, err := s.present(map[string]int64{"min_topup": s.cfg.MinTopup})
	if err != nil {
		return nil, err
	}
	if pr != nil {
		body["presentation"] = pr
	}
	return map[string]any{"prices": body}, nil
}

func (s *Service) getPrices(r *http.Request) (*api.Response, error) {
	p, err := loadPrices(r.Context(), s.db)
	if err != nil {
		return nil, err
	}
	body, err := s.pricesBody(p)
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, body), nil
}

// putPrices changes the rates named in {"prices": {"hourly": {...}}}: a
// scalar rate is replaced, a disk_gb or gpu map entry is set, and an entry
// set to null is removed (a GPU model no longer sold).
func (s *Service) putPrices(r *http.Request) (*api.Response, error) {
	var body struct {
		Hourly map[string]json.RawMessage `json:"hourly"`
	}
	if err := wrapped(r, "prices", &body); err != nil {
		return nil, err
	}
	if body.Hourly == nil {
		return nil, api.BadRequest("'hourly' is a required property")
	}
	if err := api.UnknownFields(body.Hourly, "vcpu", "ram_gb", "disk_gb", "gpu", "public_ipv4", "windows_vcpu",
		"windows_server", "volume_gb", "snapshot_gb", "backup_gb", "image_gb"); err != nil {
		return nil, err
	}
	var out *PriceList
	err := s.db.Tx(r.Context(), func(tx *store.Tx) error {
		p, err := loadPrices(r.Context(), tx)
		if err != nil {
			return err
		}
		for k, v := range body.Hourly {
			switch k {
			case "disk_gb", "gpu":
				var m map[string]*int64
				if err := api.Unmarshal(v, &m); err != nil {
					return err
				}
				target := p.DiskGB
				if k == "gpu" {
					target = p.GPU
				}
				for name, rate := range m {
					if rate == nil {
						delete(target, name)
					} else {
						target[name] = *rate
					}
				}
			default:
				var rate int64
				if err := api.Unmarshal(v, &rate); err != nil {
					return err
				}
				p.set(k, rate)
			}
		}
		if err := p.validate(); err != nil {
			return api.BadRequest("%s", err.Error())
		}
		out = p
		return savePrices(r.Context(), tx, p)
	})
	if err != nil {
		return nil, err
	}
	resp, err := s.pricesBody(out)
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, resp), nil
}

func (s *Service) putCreditLimit(r *http.Request) (*api.Response, error) {
	p, err := pathProject(r)
	if err != nil {
		return nil, err
	}
	var body struct {
		CreditLimit *int64 `json:"credit_limit"`
	}
	if err := api.DecodeJSON(r, &body); err != nil {
		return nil, err
	}
	if body.CreditLimit == nil || *body.CreditLimit < 0 || *body.CreditLimit > MaxAmount {
		return nil, api.BadRequest("'credit_limit' must be an integer of minor units from 0 to %d.", int64(MaxAmount))
	}
	if err := s.SetCreditLimit(r.Context(), p, *body.CreditLimit); err != nil {
		return nil, err
	}
	return s.accountResponse(r, p)
}

func (s *Service) createAdjustment(r *http.Request) (*api.Response, error) {
	p, err := pathProject(r)
	if err != nil {
		return nil, err
	}
	var body struct {
		Amount    *int64 `json:"amount"`
		Reference string `json:"reference"`
	}
	if err := wrapped(r, "adjustment", &body); err != nil {
		return nil, err
	}
	if body.Amount == nil || *body.Amount == 0 {
		return nil, api.BadRequest("'amount' must be a non-zero integer of minor units.")
	}
	if len(body.Reference) > 255 {
		return nil, api.BadRequest("'reference' must be at most 255 characters.")
	}
	e, err := s.addEntry(r.Context(), p, KindAdjustment, *body.Amount, body.Reference)
	if errors.Is(err, ErrBalanceLimit) {
		return nil, balanceLimitError(err)
	}
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusCreated, map[string]any{"adjustment": e}), nil
}

// accountResponse answers with a project's account as it now stands.
func (s *Service) accountResponse(r *http.Request, project string) (*api.Response, error) {
	a, err := s.Account(r.Context(), project)
	if err != nil {
		return nil, err
	}
	acc, err := s.Accruing(r.Context(), project)
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, map[string]any{"account": struct {
		*Account
		Accrual
	}{a, acc}}), nil
}
