package panel

import (
	"context"
	"math"
	"net/http"
	"net/url"
	"nimbus/internal/billing"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// billingRoutes are the customer's balance, payments, usage, prepaid terms
// and free test access.
func (p *Panel) billingRoutes() []route {
	return []route{
		{"GET /billing", member, p.billingPage},
		{"POST /billing/topups", member, p.topup},
		{"POST /billing/terms/{id}", member, p.updateTerm},
		{"POST /billing/trials", member, p.requestTrial},
	}
}

// The billing API's bodies, as much of them as the pages show.
type (
	account struct {
		ProjectID   string     `json:"project_id"`
		Balance     int64      `json:"balance"`
		PaidBalance int64      `json:"paid_balance"`
		CreditLimit int64      `json:"credit_limit"`
		TrialCredit int64      `json:"trial_credit"`
		TrialEndsAt *time.Time `json:"trial_ends_at"`
		Accruing    int64      `json:"accruing"`
	}
	ledgerEntry struct {
		ID          string    `json:"id"`
		Kind        string    `json:"kind"`
		Amount      int64     `json:"amount"`
		ResourceID  *string   `json:"resource_id"`
		PeriodStart *string   `json:"period_start"`
		CreatedAt   time.Time `json:"created_at"`
		Reference   string    `json:"reference"`
		// ResourceName is what a charge was for, by name (an address
		// for an address), as it was charged.
		ResourceName string `json:"resource_name"`
	}
	ledgerPage struct {
		Ledger []ledgerEntry `json:"ledger"`
		Links  []struct {
			Rel string `json:"rel"`
		} `json:"ledger_links"`
	}
	resourceUsage struct {
		ResourceID   string `json:"resource_id"`
		Kind         string `json:"kind"`
		Name         string `json:"name"`
		ResourceName string `json:"resource_name"`
		Hours        int    `json:"hours"`
		Hourly       int64  `json:"hourly_amount"`
		Terms        int64  `json:"term_amount"`
		Amount       int64  `json:"amount"`
		// Label is the server's name, when it still exists; PerHour is
		// the rate its hourly charges came to (perHour).
		Label, PerHour string `json:"-"`
	}
	usage struct {
		Month     string          `json:"month"`
		Total     int64           `json:"total"`
		Resources []resourceUsage `json:"resources"`
		Accruing  int64           `json:"accruing"`
	}
	topupBody struct {
		ID            string `json:"id"`
		Provider      string `json:"provider"`
		Amount        int64  `json:"amount"`
		Status        string `json:"status"`
		FailureReason string `json:"failure_reason"`
	}
)

// KindText names a ledger entry's kind (translated by the page).
func (e ledgerEntry) KindText() string {
	switch e.Kind {
	case "topup":
		return "Top-up"
	case "charge":
		return "Charge"
	case "refund":
		return "Refund"
	case "adjustment":
		return "Adjustment"
	case "trial":
		return "Free test credit"
	}
	return e.Kind
}

// KindText names a resource's kind (translated by the page).
func (u resourceUsage) KindText() string { return resourceKindText(u.Kind) }

// resourceKindText names a metered kind (translated by the page).
func resourceKindText(kind string) string {
	switch kind {
	case "server":
		return "Server"
	case "public_ipv4":
		return "Public IPv4 address"
	case "volume":
		return "Volume"
	case "volume_snapshot":
		return "Volume snapshot"
	case "backup":
		return "Backup"
	case "image":
		return "Image"
	}
	return kind
}

// Charged says, for a charge, what it was for (its kind of resource,
// translated by the page) and how: an hour, the rest of a dearer hour
// after a resize, or a prepaid term; nil for other entries.
func (e ledgerEntry) Charged() *chargeText {
	if e.Kind != "charge" || e.ResourceID == nil {
		return nil
	}
	c := &chargeText{}
	c.ID, c.Name = *e.ResourceID, e.ResourceName
	if e.PeriodStart != nil {
		c.Hour = stamp(*e.PeriodStart)
	}
	how, rest, _ := strings.Cut(e.Reference, ":")
	kind, _, _ := strings.Cut(rest, ":")
	switch how {
	case "hour":
		c.What, c.How = resourceKindText(kind), "the hour from %s"
	case "resize":
		c.What, c.How = resourceKindText(kind), "the rest of the hour from %s, resized"
	case "term":
		c.What, c.How = resourceKindText("server"), "a prepaid term from %s"
	default:
		c.What, c.How = e.Reference, "%s"
	}
	return c
}

// chargeText is a charge's line in the ledger.
type chargeText struct{ What, Name, ID, How, Hour string }

// perHour is the rate a resource's hourly charges came to in the month:
// their sum over its hours, exact in billing's rate units, marked "≈"
// when a resize within the month made it an average that does not divide
// evenly; "" when it was charged no hours.
func (u resourceUsage) perHour(m Money) string {
	if u.Hours <= 0 || u.Hourly > math.MaxInt64/billing.RateScale {
		return ""
	}
	units := u.Hourly * billing.RateScale
	s := m.Exact(units / int64(u.Hours))
	if units%int64(u.Hours) != 0 {
		s = "≈ " + s
	}
	return s
}

// ledgerPageSize is how many ledger rows the billing page shows at once.
const ledgerPageSize = 20

// maxLedgerDepth bounds how many pages back the ledger's previous links
// remember (each marker is in the URL).
const maxLedgerDepth = 40

type billingData struct {
	Account  account
	Currency string
	MinTopup int64
	// MinTopupMajor fills the amount field.
	MinTopupMajor string
	// ServerNames name the servers of usage rows and terms.
	ServerNames map[string]string
	Topup       *topupBody // the top-up just made, while it is pending
	Ledger      []ledgerEntry
	// LedgerNext and LedgerPrev are the query strings of the ledger's
	// neighbouring pages ("" when there is none); LedgerFirst is whether
	// this is the newest page.
	LedgerNext, LedgerPrev string
	LedgerFirst            bool
	Usage                  usage
	PrevMonth, NextMonth   string
	Chart                  chart
	Terms                  []billing.Term
	Trials                 []billing.Trial
	// TrialOpen is a pending or approved trial: no new request then.
	TrialOpen bool
	// TestPayments is whether the simulated card and webhook providers
	// exist; without them top-ups are the operator's.
	TestPayments bool
}

// billingPage shows the account: its calls to the billing API run at
// once, each a page's worth.
func (p *Panel) billingPage(q *req) error {
	ctx := q.r.Context()
	qs := q.r.URL.Query()
	month, err := pageMonth(qs.Get("month"), p.cfg.Now())
	if err != nil {
		return err
	}
	markers := ledgerMarkers(qs.Get("ledger"))
	d := billingData{LedgerFirst: len(markers) == 0, TestPayments: p.cfg.TestPayments}
	var prices struct {
		Prices struct {
			MinTopup int64 `json:"min_topup"`
		} `json:"prices"`
	}
	var acc struct {
		Account account `json:"account"`
	}
	var led ledgerPage
	var use struct {
		Usage usage `json:"usage"`
	}
	var terms struct {
		Terms []billing.Term `json:"terms"`
	}
	var trials struct {
		Trials []billing.Trial `json:"trials"`
	}
	var names map[string]string
	ledgerPath := "/v1/ledger?limit=" + strconv.Itoa(ledgerPageSize)
	if len(markers) > 0 {
		ledgerPath += "&marker=" + url.QueryEscape(markers[len(markers)-1])
	}
	calls := []func() error{
		func() error { return q.api.Get(ctx, Billing, "/v1/account", &acc) },
		func() error { return q.api.Get(ctx, Billing, "/v1/prices", &prices) },
		func() error { return q.api.Get(ctx, Billing, ledgerPath, &led) },
		func() error {
			return q.api.Get(ctx, Billing, "/v1/usage?month="+month.Format("2006-01"), &use)
		},
		func() error { return q.api.Get(ctx, Billing, "/v1/terms", &terms) },
		func() error { return q.api.Get(ctx, Billing, "/v1/trials", &trials) },
		func() (err error) { d.Chart, err = p.dailyChart(ctx, q, month); return err },
		func() error { names = p.serverNames(ctx, q); return nil },
	}
	if id := qs.Get("topup"); id != "" {
		calls = append(calls, func() error { return p.pendingTopup(ctx, q, id, &d) })
	}
	if err := parallel(calls...); err != nil {
		return err
	}
	d.Account, d.MinTopup, d.Usage, d.Terms, d.Trials = acc.Account, prices.Prices.MinTopup, use.Usage, terms.Terms, trials.Trials
	d.Ledger, d.ServerNames, d.Currency = led.Ledger, names, p.cfg.Money.Currency
	d.MinTopupMajor = p.cfg.Money.major(d.MinTopup)
	for i, u := range d.Usage.Resources {
		d.Usage.Resources[i].Label, d.Usage.Resources[i].PerHour = names[u.ResourceID], u.perHour(p.cfg.Money)
	}
	d.navigation(markers, len(led.Links) > 0, month, p.cfg.Now())
	for _, t := range d.Trials {
		d.TrialOpen = d.TrialOpen || t.Status == "pending" || t.Status == "approved"
	}
	return q.render("billing", q.T("Billing"), d)
}

// navigation sets the links to the ledger's neighbouring pages (more:
// the API has older entries) and to the months around month.
func (d *billingData) navigation(markers []string, more bool, month, now time.Time) {
	if more && len(d.Ledger) > 0 && len(markers) < maxLedgerDepth {
		d.LedgerNext = ledgerQuery(append(slices.Clip(markers), d.Ledger[len(d.Ledger)-1].ID))
	}
	if len(markers) > 0 {
		d.LedgerPrev = ledgerQuery(markers[:len(markers)-1])
	}
	d.PrevMonth = month.AddDate(0, -1, 0).Format("2006-01")
	if next := month.AddDate(0, 1, 0); !next.After(now) {
		d.NextMonth = next.Format("2006-01")
	}
}

// pageMonth is the month the page shows: ?month=YYYY-MM, else now's.
func pageMonth(v string, now time.Time) (time.Time, error) {
	if v == "" {
		now = now.UTC()
		return time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC), nil
	}
	m, err := time.Parse("2006-01", v)
	if err != nil {
		return m, BadRequest("The month must be written as YYYY-MM.")
	}
	return m, nil
}

// ledgerMarkers are the markers of the ledger pages before this one, the
// last being this page's; the ledger parameter holds them dot-separated.
func ledgerMarkers(v string) []string {
	if v == "" {
		return nil
	}
	ms := strings.Split(v, ".")
	if len(ms) > maxLedgerDepth {
		ms = ms[len(ms)-maxLedgerDepth:]
	}
	return ms
}

// ledgerQuery is the billing page's query for the ledger page after the
// markers ("ledger" alone for the first page).
func ledgerQuery(markers []string) string {
	if len(markers) == 0 {
		return "?#ledger"
	}
	return "?ledger=" + url.QueryEscape(strings.Join(markers, ".")) + "#ledger"
}

// serverNames are the project's servers' names by id, with one list call,
// to name the usage's servers; a server deleted since keeps its id.
func (p *Panel) serverNames(ctx context.Context, q *req) map[string]string {
	var out struct {
		Servers []struct {
			ID   string `json:"id"`
			Name string `json:"name"`
		} `json:"servers"`
	}
	if err := q.api.Get(ctx, Compute, "/servers?limit=1000", &out); err != nil {
		p.cfg.Log.Warn("panel: server names for usage", "error", err)
		return nil // the ids still say which resource it was
	}
	names := make(map[string]string, len(out.Servers))
	for _, s := range out.Servers {
		names[s.ID] = s.Name
	}
	return names
}

// pendingTopup shows a top-up the customer just made, while the provider
// has not confirmed it.
func (p *Panel) pendingTopup(ctx context.Context, q *req, id string, d *billingData) error {
	var out struct {
		Topup topupBody `json:"topup"`
	}
	if err := q.api.Get(ctx, Billing, "/v1/topups/"+url.PathEscape(id), &out); err != nil {
		if StatusOf(err) == http.StatusNotFound {
			return nil
		}
		return err
	}
	d.Topup = &out.Topup
	return nil
}

// topup pays into the account through the provider chosen.
func (p *Panel) topup(q *req) error {
	f := q.r.PostForm
	amount, ok := parseMinor(f.Get("amount"))
	if !ok {
		return q.back("/billing#topup", BadRequest(q.T("Write the amount as a number, such as 100 or 100.50.")))
	}
	provider := f.Get("provider")
	if provider != "webhook-test" {
		provider = "test"
	}
	body := map[string]any{"amount": amount, "provider": provider}
	if card := strings.ReplaceAll(strings.TrimSpace(f.Get("card")), " ", ""); card != "" && provider == "test" {
		body["card"] = card
	}
	var out struct {
		Topup topupBody `json:"topup"`
	}
	if err := q.api.Post(q.r.Context(), Billing, "/v1/topups", map[string]any{"topup": body}, &out); err != nil {
		// A declined card (402), an amount out of bounds (400): the API's
		// words say why, and that nothing was taken.
		return q.back("/billing#topup", err)
	}
	p.forgetBanners(q)
	if out.Topup.Status == "pending" {
		return q.redirect("/billing?topup="+url.QueryEscape(out.Topup.ID)+"#topup",
			q.T("Your payment of %s is pending: it is credited when the payment provider confirms it.", p.cfg.Money.Format(amount)))
	}
	return q.redirect("/billing", q.T("%s is credited to your account.", p.cfg.Money.Format(amount)))
}

// updateTerm changes what happens when a prepaid term ends.
func (p *Panel) updateTerm(q *req) error {
	f := q.r.PostForm
	onEnd := f.Get("on_end")
	if onEnd != "hourly" && onEnd != "shelve" {
		return q.back("/billing#terms", BadRequest(q.T("Choose what happens when the term ends.")))
	}
	body := map[string]any{"term": map[string]any{"auto_renew": f.Get("auto_renew") == "on", "on_end": onEnd}}
	if err := q.api.Do(q.r.Context(), http.MethodPut, Billing, "/v1/terms/"+url.PathEscape(q.r.PathValue("id")), body, nil); err != nil {
		return q.back("/billing#terms", err)
	}
	return q.redirect("/billing#terms", q.T("The term's renewal is saved."))
}

// requestTrial asks the operator for free test access.
func (p *Panel) requestTrial(q *req) error {
	desc := strings.TrimSpace(q.r.PostForm.Get("description"))
	if desc == "" {
		return q.back("/billing#trial", BadRequest(q.T("Describe the task you want to test.")))
	}
	if err := q.api.Post(q.r.Context(), Billing, "/v1/trials", map[string]any{"trial": map[string]any{"description": desc}}, nil); err != nil {
		return q.back("/billing#trial", err)
	}
	return q.redirect("/billing#trial", q.T("Your request for free test access is sent to the operator."))
}

// parseMinor reads an amount in major units ("100", "100.5", "100,50")
// as minor units; ok is false for anything else or more than two decimals.
func parseMinor(s string) (int64, bool) {
	s = strings.ReplaceAll(strings.TrimSpace(s), " ", "")
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(strings.TrimPrefix(s, "-"), "+")
	whole, frac, _ := strings.Cut(strings.Replace(s, ",", ".", 1), ".")
	if whole == "" || len(whole) > 13 || len(frac) > 2 || !digits(whole) || !digits(frac) {
		return 0, false
	}
	for len(frac) < 2 {
		frac += "0"
	}
	n, err := strconv.ParseInt(whole+frac, 10, 64)
	if err != nil {
		return 0, false
	}
	if neg {
		n = -n
	}
	return n, true
}

func digits(s string) bool {
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// bannerTTL is how long a session's banners are reused: the warnings
// change at most once per charging pass, so a few seconds cost nothing
// and keep the API calls per page at most one.
const bannerTTL = 15 * time.Second

// bannerCache holds each session's banners for bannerTTL, by session.
var bannerCache = struct {
	sync.Mutex
	m map[string]bannerEntry
}{m: map[string]bannerEntry{}}

type bannerEntry struct {
	at time.Time
	b  []Banner
}

// banners are the account's warnings for every page of a signed-in user:
// billing's latest notice (its charging pass judges every account that
// spends: less than 72, 24 or 1 hours of money left, or suspended), while
// it still holds. A page's banners never fail the page.
func (p *Panel) banners(q *req) []Banner {
	if q.s == nil || q.api == nil {
		return nil
	}
	now := p.cfg.Now()
	bannerCache.Lock()
	e, ok := bannerCache.m[q.s.idHash]
	bannerCache.Unlock()
	if ok && now.Sub(e.at) < bannerTTL && !e.at.After(now) {
		return e.b
	}
	ctx, cancel := context.WithTimeout(q.r.Context(), 3*time.Second)
	defer cancel()
	b, err := p.loadBanners(ctx, q, now)
	if err != nil {
		p.cfg.Log.Debug("panel: banners", "error", err)
		return nil
	}
	bannerCache.Lock()
	defer bannerCache.Unlock()
	if len(bannerCache.m) > 10000 {
		for k, v := range bannerCache.m {
			if now.Sub(v.at) >= bannerTTL {
				delete(bannerCache.m, k)
			}
		}
	}
	bannerCache.m[q.s.idHash] = bannerEntry{at: now, b: b}
	return b
}

// forgetBanners drops the session's banners after a payment, which may
// have ended them.
func (p *Panel) forgetBanners(q *req) {
	bannerCache.Lock()
	delete(bannerCache.m, q.s.idHash)
	bannerCache.Unlock()
}

type notice struct {
	Level     string    `json:"level"`
	Message   string    `json:"message"`
	CreatedAt time.Time `json:"created_at"`
}

// noticeHours are the warning levels' hours.
var noticeHours = map[string]int64{"72h": 72, "24h": 24, "1h": 1}

// loadBanners reads billing's latest notice (one indexed call). Only when
// it may still hold — a suspension, or a warning younger than its hours —
// is the account read too, since a payment since then may have ended it;
// the warning is then restated from the balance now at the spend billing
// measured.
func (p *Panel) loadBanners(ctx context.Context, q *req, now time.Time) ([]Banner, error) {
	var ns struct {
		Notices []notice `json:"notices"`
	}
	if err := q.api.Get(ctx, Billing, "/v1/notices?limit=1", &ns); err != nil || len(ns.Notices) == 0 {
		return nil, err
	}
	n := ns.Notices[0]
	hours, warn := noticeHours[n.Level]
	if (!warn && n.Level != "suspended") || (warn && now.Sub(n.CreatedAt) >= time.Duration(hours)*time.Hour) {
		return nil, nil
	}
	var acc struct {
		Account account `json:"account"`
	}
	if err := q.api.Get(ctx, Billing, "/v1/account", &acc); err != nil {
		return nil, err
	}
	avail := acc.Account.Balance + acc.Account.CreditLimit
	if avail < 0 {
		return []Banner{{Level: "danger", Link: "/billing#topup",
			Text: q.T("Your balance is below your credit limit: your servers are shelved and kept, your public addresses detached and kept. Top up to run them again.")}}, nil
	}
	if !warn {
		return nil, nil // paid since the suspension
	}
	if rate, ok := noticeRate(n.Message); ok {
		left := avail / rate
		switch {
		case left < 1:
			hours = 1
		case left < 24:
			hours = 24
		case left < 72:
			hours = 72
		default:
			return nil, nil // paid since the warning
		}
	}
	level := "warn"
	if hours == 1 {
		level = "danger"
	}
	return []Banner{{Level: level, Link: "/billing#topup",
		Text: q.T("At your current spend your balance runs out in less than %d hours. Top up to keep your servers running.", hours)}}, nil
}

// noticeRate is the hourly spend in minor units that billing's warning
// states ("At the current spend of 12.34 RUB per hour …").
func noticeRate(msg string) (int64, bool) {
	_, rest, ok := strings.Cut(msg, "spend of ")
	if !ok {
		return 0, false
	}
	v, _, _ := strings.Cut(rest, " ")
	rate, ok := parseMinor(v)
	return rate, ok && rate > 0
}
