package panel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"nimbus/internal/api"
	"nimbus/internal/billing"
	"nimbus/internal/compute"
	"nimbus/internal/imagecatalog"
)

// configuratorRoutes are the price list and the configurator: choose a
// server, see its price (billing's quote, so the price shown is the one
// charged) and what stands in the way (quota, money, capacity), order it.
func (p *Panel) configuratorRoutes() []route {
	return []route{
		{"GET /prices", public, p.prices},
		{"GET /configure", public, p.configure},
		{"POST /configure/quote", public, p.configureQuote},
		{"POST /configure/order", public, p.configureOrder},
	}
}

// priceSheet is the price list and how many hours make a month.
type priceSheet struct {
	*billing.PriceList
	HoursPerMonth int
}

// priceList reads the price list: through the API for a member, in-process
// for a visitor (the same numbers; the price list is public).
func (p *Panel) priceList(q *req) (priceSheet, error) {
	if q.s == nil {
		pl, err := p.cfg.Billing.Prices(q.r.Context())
		return priceSheet{pl, p.cfg.Billing.HoursPerMonth()}, err
	}
	var out struct {
		Prices struct {
			Hourly        billing.PriceList `json:"hourly"`
			HoursPerMonth int               `json:"hours_per_month"`
		} `json:"prices"`
	}
	if err := q.api.Get(q.r.Context(), Billing, "/v1/prices", &out); err != nil {
		return priceSheet{}, err
	}
	return priceSheet{&out.Prices.Hourly, out.Prices.HoursPerMonth}, nil
}

// priceRow is one line of the price list: the rate per hour and per month,
// exact (billing.RateScale to a minor unit), as charges add them up.
type priceRow struct {
	Item, Unit      string
	Hourly, Monthly string
}

type pricesPage struct {
	Rows          []priceRow
	Terms         []termOption
	HoursPerMonth int
}

// termOption is a prepaid term on sale and its discount in percent.
type termOption struct {
	Months  int
	Percent string
}

func (p *Panel) prices(q *req) error {
	pl, err := p.priceList(q)
	if err != nil {
		return err
	}
	var rows []priceRow
	row := func(item, unit string, rate int64) {
		if rate != 0 { // nothing is charged for it
			rows = append(rows, priceRow{Item: item, Unit: unit, Hourly: p.cfg.Money.Exact(rate),
				Monthly: p.cfg.Money.Exact(perMonth(rate, int64(pl.HoursPerMonth)))})
		}
	}
	row(q.T("vCPU (dedicated)"), q.T("per vCPU"), pl.VCPU)
	row(q.T("RAM"), q.T("per GB"), pl.RAMGB)
	for _, t := range sortedKeys(pl.DiskGB) {
		row(q.T("Boot disk: %s", q.T(t)), q.T("per GB"), pl.DiskGB[t])
	}
	for _, m := range sortedKeys(pl.GPU) {
		row(q.T("GPU %s", m), q.T("per GPU"), pl.GPU[m])
	}
	row(q.T("Public IPv4 address"), q.T("per address"), pl.PublicIPv4)
	row(q.T("Windows licence"), q.T("per vCPU"), pl.WindowsVCPU)
	row(q.T("Windows licence"), q.T("per server"), pl.WindowsServer)
	row(q.T("Volume"), q.T("per GB"), pl.VolumeGB)
	row(q.T("Volume snapshot"), q.T("per GB"), pl.SnapshotGB)
	row(q.T("Backup"), q.T("per GB"), pl.BackupGB)
	row(q.T("Image"), q.T("per GB"), pl.ImageGB)
	return q.render("prices", q.T("Prices"), pricesPage{Rows: rows, Terms: terms(pl.PriceList), HoursPerMonth: pl.HoursPerMonth})
}

// perMonth is a rate times the hours of a month, in rate units: exact, as
// the month's charges add up (at MaxInt64 past any real price).
func perMonth(rate, hours int64) int64 {
	if hours > 0 && rate > math.MaxInt64/hours {
		return math.MaxInt64
	}
	return rate * hours
}

func sortedKeys(m map[string]int64) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// terms are the prepaid terms on sale, shortest first.
func terms(pl *billing.PriceList) []termOption {
	var out []termOption
	for k, bp := range pl.TermDiscounts {
		if n, err := strconv.Atoi(k); err == nil {
			out = append(out, termOption{Months: n, Percent: strconv.FormatFloat(float64(bp)/100, 'f', -1, 64)})
		}
	}
	slices.SortFunc(out, func(a, b termOption) int { return a.Months - b.Months })
	return out
}

// choice is what the configurator's form says.
type choice struct {
	VCPUs, RAMGB, DiskGB int
	DiskType             string
	GPUModel             string // "" for none
	GPUCount             int
	IPv4                 bool
	Image                string // a catalog image's name
	Quantity             int
	Tariff               string // hourly or prepaid
	TermMonths           int
	DurationHours        int
	Name                 string
	KeyMode              string // existing, paste, generate
	KeyName, PublicKey   string
	AdminPass            string
}

// parseChoice reads a choice from a form or a query, with the defaults of a
// first visit for what is missing.
func parseChoice(v url.Values) choice {
	num := func(k string, def int) int {
		if n, err := strconv.Atoi(strings.TrimSpace(v.Get(k))); err == nil {
			return n
		}
		return def
	}
	str := func(k, def string) string {
		if s := strings.TrimSpace(v.Get(k)); s != "" {
			return s
		}
		return def
	}
	c := choice{VCPUs: num("vcpus", 2), RAMGB: num("ram_gb", 4), DiskGB: num("disk_gb", 40),
		DiskType: str("disk_type", compute.DiskLocal), GPUModel: v.Get("gpu_model"), GPUCount: num("gpu_count", 0),
		IPv4: v.Get("ipv4") == "yes", Image: str("image", "Ubuntu 24.04"), Quantity: num("quantity", 1),
		Tariff: str("tariff", billing.TariffHourly), TermMonths: num("term_months", 0), DurationHours: num("duration_hours", 0),
		Name: str("name", "server"), KeyMode: str("key_mode", "existing"), KeyName: v.Get("key_name"),
		PublicKey: strings.TrimSpace(v.Get("public_key")), AdminPass: v.Get("admin_pass")}
	if c.GPUModel != "" && c.GPUCount == 0 {
		c.GPUCount = 1
	}
	if c.GPUModel == "" {
		c.GPUCount = 0
	}
	if c.Tariff != billing.TariffPrepaid {
		c.TermMonths = 0
	}
	return c
}

// query is the choice as a query string, so that it survives signing in
// (secrets — a pasted key, a password — are left out).
func (c choice) query() string {
	v := url.Values{}
	for k, n := range map[string]int{"vcpus": c.VCPUs, "ram_gb": c.RAMGB, "disk_gb": c.DiskGB, "gpu_count": c.GPUCount,
		"quantity": c.Quantity, "term_months": c.TermMonths, "duration_hours": c.DurationHours} {
		v.Set(k, strconv.Itoa(n))
	}
	v.Set("disk_type", c.DiskType)
	v.Set("gpu_model", c.GPUModel)
	v.Set("image", c.Image)
	v.Set("tariff", c.Tariff)
	v.Set("name", c.Name)
	if c.IPv4 {
		v.Set("ipv4", "yes")
	}
	return v.Encode()
}

func (c choice) shape() compute.Shape {
	return compute.Shape{VCPUs: c.VCPUs, RAMGB: c.RAMGB, DiskGB: c.DiskGB, DiskType: c.DiskType,
		GPUModel: c.GPUModel, GPUCount: c.GPUCount, PublicIPv4: c.IPv4}
}

// catalogImage finds the chosen image of the public catalog.
func (c choice) catalogImage() (imagecatalog.Image, bool) {
	i := slices.IndexFunc(imagecatalog.Images, func(ci imagecatalog.Image) bool { return ci.Name == c.Image })
	if i < 0 {
		return imagecatalog.Image{}, false
	}
	return imagecatalog.Images[i], true
}

func (c choice) windows() bool {
	ci, _ := c.catalogImage()
	return ci.OSType == "windows"
}

// quoteBody is POST /v1/quotes's body for the choice.
func (c choice) quoteBody() map[string]any {
	q := map[string]any{"vcpus": c.VCPUs, "ram_gb": c.RAMGB, "disk_type": c.DiskType, "disk_gb": c.DiskGB,
		"public_ipv4": c.IPv4, "quantity": c.Quantity, "tariff": c.Tariff}
	if c.GPUModel != "" {
		q["gpu_model"], q["gpu_count"] = c.GPUModel, c.GPUCount
	}
	if c.windows() {
		q["os_type"] = "windows"
	}
	if c.Tariff == billing.TariffPrepaid {
		q["term_months"] = c.TermMonths
	} else if c.DurationHours > 0 {
		q["duration_hours"] = c.DurationHours
	}
	return map[string]any{"quote": q}
}

// estimate is the price of a choice and what will not work.
type estimate struct {
	Quote    *billing.Quote
	Problems []string
}

// estimate prices the choice and checks it: the shape against the fleet
// and live capacity, a member's quota and money.
func (p *Panel) estimate(q *req, c choice) estimate {
	ctx := q.r.Context()
	var e estimate
	if _, ok := c.catalogImage(); !ok {
		e.Problems = append(e.Problems, q.T("Choose an operating system."))
	}
	if q.s != nil && c.keyless() {
		e.Problems = append(e.Problems, q.T(noKey))
	}
	if c.Quantity < 1 || c.Quantity > compute.MaxQuantity {
		e.Problems = append(e.Problems, q.T("The quantity must be 1 to %d.", compute.MaxQuantity))
		return e
	}
	quote, err := p.configQuote(q, c)
	if err != nil {
		e.Problems = append(e.Problems, message(err))
	} else {
		e.Quote = quote
	}
	if a, err := p.cfg.Compute.Capacity(ctx, c.shape(), c.Quantity); err != nil {
		e.Problems = append(e.Problems, message(err))
	} else if a.Fits < c.Quantity {
		e.Problems = append(e.Problems, a.Reason)
	}
	if q.s != nil {
		e.Problems = append(e.Problems, p.memberProblems(q, c, e.Quote)...)
	}
	return e
}

// message is an error's text for the page: the API's or compute's words.
func message(err error) string {
	var ae *APIError
	if errors.As(err, &ae) {
		return ae.Message
	}
	var ce *api.Error
	if errors.As(err, &ce) {
		return ce.Message
	}
	return err.Error()
}

// configQuote asks billing: through the API as the member, in-process for a
// visitor, with the same price list and rounding.
func (p *Panel) configQuote(q *req, c choice) (*billing.Quote, error) {
	if q.s != nil {
		var out struct {
			Quote billing.Quote `json:"quote"`
		}
		if err := q.api.Post(q.r.Context(), Billing, "/v1/quotes", c.quoteBody(), &out); err != nil {
			return nil, err
		}
		return &out.Quote, nil
	}
	ch := billing.Choice{VCPUs: int64(c.VCPUs), RAMMB: int64(c.RAMGB) * 1024, DiskType: c.DiskType, DiskGB: int64(c.DiskGB),
		GPUModel: c.GPUModel, GPUCount: int64(c.GPUCount), PublicIPv4: c.IPv4, Quantity: int64(c.Quantity)}
	if c.windows() {
		ch.OSType = "windows"
	}
	qt, err := p.cfg.Billing.Quote(q.r.Context(), ch, c.Tariff, c.TermMonths, int64(c.DurationHours))
	if err != nil {
		return nil, BadRequest(err.Error())
	}
	return &qt, nil
}

// memberProblems are the member's quota and money for the choice.
func (p *Panel) memberProblems(q *req, c choice, quote *billing.Quote) []string {
	ctx := q.r.Context()
	var out []string
	var lim struct {
		Limits struct {
			Absolute map[string]int `json:"absolute"`
		} `json:"limits"`
	}
	if err := q.api.Get(ctx, Compute, "/limits", &lim); err == nil {
		a := lim.Limits.Absolute
		over := func(maxKey, usedKey string, want int, what string) {
			if m := a[maxKey]; m >= 0 && a[usedKey]+want > m {
				out = append(out, q.T("Over quota: %d %s wanted, %d of %d in use.", want, q.T(what), a[usedKey], m))
			}
		}
		over("maxTotalInstances", "totalInstancesUsed", c.Quantity, "servers")
		over("maxTotalCores", "totalCoresUsed", c.Quantity*c.VCPUs, "vCPUs")
		over("maxTotalRAMSize", "totalRAMUsed", c.Quantity*c.RAMGB*1024, "MB of RAM")
		if len(out) > 0 {
			// Quotas are Nova's defaults until the operator raises them:
			// say how to ask.
			out = append(out, q.T("Your quota can be raised: ask on the Support page, saying what you want to run."))
		}
	}
	// Money: billing's own rule, the one the API applies to the order
	// (its coverage of the quote), shown in the panel's words.
	var cov struct {
		Quote struct {
			Coverage *billing.Coverage `json:"coverage"`
		} `json:"quote"`
	}
	if quote != nil {
		if err := q.api.Post(ctx, Billing, "/v1/quotes", c.quoteBody(), &cov); err == nil && cov.Quote.Coverage != nil && !cov.Quote.Coverage.Covered {
			cv := cov.Quote.Coverage
			out = append(out, q.T("Your balance and credit, less what the hour now running owes (%s), do not cover %s: top up first.",
				p.cfg.Money.Format(cv.Available), p.cfg.Money.Format(cv.Needed)))
		}
	}
	return out
}

// configurePage is the configurator's page.
type configurePage struct {
	C       choice
	Opts    compute.ConfiguratorOptions
	Images  []imageGroup
	Terms   []termOption
	Keys    []string
	Est     estimate
	Query   string
	Windows bool
}

// imageGroup is the operating systems, or the marketplace.
type imageGroup struct {
	Label string
	Names []string
}

func (p *Panel) configure(q *req) error {
	return p.renderConfigure(q, parseChoice(q.r.URL.Query()))
}

func (p *Panel) renderConfigure(q *req, c choice) error {
	ctx := q.r.Context()
	opts, err := p.cfg.Compute.Options(ctx)
	if err != nil {
		return err
	}
	pl, err := p.priceList(q)
	if err != nil {
		return err
	}
	var keys []string
	if q.s != nil {
		if keys, err = memberKeys(q); err != nil {
			return err
		}
		if len(keys) == 0 && c.keyless() {
			c.KeyMode = "generate" // a member with no key can only make one
		}
	}
	page := configurePage{C: c, Opts: opts, Terms: terms(pl.PriceList), Keys: keys, Est: p.estimate(q, c), Query: c.query(), Windows: c.windows()}
	base, market := imageGroup{Label: q.T("Operating systems")}, imageGroup{Label: q.T("Marketplace")}
	for _, ci := range imagecatalog.Images {
		if ci.MarketplaceOf != "" {
			market.Names = append(market.Names, ci.Name)
		} else {
			base.Names = append(base.Names, ci.Name)
		}
	}
	page.Images = []imageGroup{base, market}
	return q.render("configure", q.T("Configure a server"), page)
}

// memberKeys are the names of the member's key pairs.
func memberKeys(q *req) ([]string, error) {
	var kp struct {
		Keypairs []struct {
			Keypair struct {
				Name string `json:"name"`
			} `json:"keypair"`
		} `json:"keypairs"`
	}
	if err := q.api.Get(q.r.Context(), Compute, "/os-keypairs", &kp); err != nil {
		return nil, err
	}
	keys := make([]string, 0, len(kp.Keypairs))
	for _, k := range kp.Keypairs {
		keys = append(keys, k.Keypair.Name)
	}
	return keys, nil
}

// quoteAnswer is what configure.js shows.
type quoteAnswer struct {
	HourlyEach string   `json:"hourly_each,omitempty"`
	Hourly     string   `json:"hourly,omitempty"`
	Monthly    string   `json:"monthly,omitempty"`
	Total      string   `json:"total,omitempty"`
	Problems   []string `json:"problems"`
	// HourlyMinor and TotalMinor are the same in minor units.
	HourlyMinor int64 `json:"hourly_minor"`
	TotalMinor  int64 `json:"total_minor"`
}

// configureQuote answers the live price and problems of the posted form.
func (p *Panel) configureQuote(q *req) error {
	e := p.estimate(q, parseChoice(q.r.PostForm))
	a := quoteAnswer{Problems: e.Problems}
	if a.Problems == nil {
		a.Problems = []string{}
	}
	if e.Quote != nil {
		m := p.cfg.Money
		a.HourlyEach, a.Hourly, a.Monthly, a.Total = m.Format(e.Quote.HourlyEach), m.Format(e.Quote.Hourly), m.Format(e.Quote.Monthly), m.Format(e.Quote.Total)
		a.HourlyMinor, a.TotalMinor = e.Quote.Hourly, e.Quote.Total
	}
	q.w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(q.w).Encode(a)
}

// configureOrder orders the choice: the key, the servers on the project's
// private network with the flavor of their size, and a prepaid term for
// each. A visitor is sent to sign up first, keeping the choice.
func (p *Panel) configureOrder(q *req) error {
	c := parseChoice(q.r.PostForm)
	if q.r.PostForm.Get("update") != "" {
		return p.renderConfigure(q, c) // "Update price" without JavaScript
	}
	if q.s == nil {
		return q.redirect("/signup?next="+url.QueryEscape("/configure?"+c.query()), "")
	}
	back := "/configure?" + c.query()
	if e := p.estimate(q, c); len(e.Problems) > 0 {
		return q.back(back, BadRequest(strings.Join(e.Problems, " ")))
	}
	key, private, err := p.order(q, c)
	if err != nil {
		return q.back(back, err)
	}
	if private != "" {
		return q.render("configure_done", q.T("Your servers are being built"), newKey{PrivateKey: private, File: keyFile(key)})
	}
	return q.redirect("/servers", q.T("Your servers are being built."))
}

// order does the order's steps as the member, the checks first: the
// estimate's (image, quota, money, capacity), then the network and the
// key. Only then is the flavor of the size taken, or made private to the
// member's project (compute.ProjectFlavor, acting for the member's
// validated token), and given back when the servers are refused. It
// answers the servers' key pair and a generated private key, to be shown
// once.
func (p *Panel) order(q *req, c choice) (key, private string, err error) {
	ctx := q.r.Context()
	netID, err := privateNetwork(ctx, q.api)
	if err != nil {
		return "", "", err
	}
	if key, private, err = p.orderKey(q, c); err != nil {
		return "", "", err
	}
	caller, err := p.cfg.Identity.Validate(ctx, q.s.Token)
	if err != nil {
		return "", "", asAPIError(err)
	}
	flavor, err := p.cfg.Compute.ProjectFlavor(ctx, caller, c.shape())
	if err != nil {
		return "", "", asAPIError(err)
	}
	sv := map[string]any{"name": c.Name, "imageRef": imagecatalog.ID(c.Image), "flavorRef": flavor.ID,
		"min_count": c.Quantity, "max_count": c.Quantity, "networks": []map[string]string{{"uuid": netID}},
		"return_reservation_id": true}
	if key != "" {
		sv["key_name"] = key
	}
	if c.windows() && c.AdminPass != "" {
		sv["adminPass"] = c.AdminPass
	}
	var res struct {
		ReservationID string `json:"reservation_id"`
	}
	if err := q.api.Post(ctx, Compute, "/servers", map[string]any{"server": sv}, &res); err != nil {
		if rerr := p.cfg.Compute.ReleaseFlavor(context.WithoutCancel(ctx), caller, flavor); rerr != nil {
			p.cfg.Log.Warn("panel: giving back an order's flavor", "flavor", flavor.ID, "error", rerr)
		}
		return "", "", err
	}
	if c.Tariff == billing.TariffPrepaid {
		if err := buyTerms(ctx, q.api, res.ReservationID, c.TermMonths); err != nil {
			return "", "", err
		}
	}
	return key, private, nil
}

// newKey is a generated key pair's private key, shown once, and the file
// the server's page names for it.
type newKey struct {
	PrivateKey, File string
}

// asAPIError shows a service's own error (compute's, identity's) as the
// API's would be.
func asAPIError(err error) error {
	var ce *api.Error
	if errors.As(err, &ce) {
		return &APIError{Status: ce.Status, Message: ce.Message}
	}
	return err
}

// noKey is why a Linux server needs a key.
const noKey = "Choose one of your SSH keys, or paste or generate one: a Linux server without a key cannot be logged into."

// keyless is a Linux server ordered with "One of my keys" and none named.
func (c choice) keyless() bool {
	return !c.windows() && c.KeyMode == "existing" && c.KeyName == ""
}

// orderKey is the key pair the servers get: an existing one of the
// member's, or one imported now from a pasted or generated public key.
func (p *Panel) orderKey(q *req, c choice) (name, private string, err error) {
	if c.windows() {
		return "", "", nil
	}
	pub := c.PublicKey
	switch c.KeyMode {
	case "existing":
		if c.keyless() {
			return "", "", BadRequest(q.T(noKey))
		}
		err := q.api.Get(q.r.Context(), Compute, "/os-keypairs/"+url.PathEscape(c.KeyName), nil)
		if StatusOf(err) == http.StatusNotFound {
			return "", "", BadRequest(q.T("You have no SSH key named %s: choose one of your keys, or paste or generate one.", c.KeyName))
		}
		return c.KeyName, "", err
	case "generate":
		if pub, private, err = GenerateKey(c.Name); err != nil {
			return "", "", err
		}
	case "paste":
		if pub == "" {
			return "", "", BadRequest(q.T("Paste a public key, or choose to generate one."))
		}
	default:
		return "", "", BadRequest(q.T("Choose how to sign in to the server."))
	}
	name = c.KeyName
	if name == "" {
		name = fmt.Sprintf("%s-%s", c.Name, newSecret()[:6])
	}
	body := map[string]any{"keypair": map[string]any{"name": name, "public_key": pub}}
	if err := q.api.Post(q.r.Context(), Compute, "/os-keypairs", body, nil); err != nil {
		return "", "", err
	}
	return name, private, nil
}

// privateNetwork is the id of the project's network named private.
func privateNetwork(ctx context.Context, api *Client) (string, error) {
	var out struct {
		Networks []struct {
			ID string `json:"id"`
		} `json:"networks"`
	}
	if err := api.Get(ctx, Network, "/v2.0/networks?name=private", &out); err != nil {
		return "", err
	}
	if len(out.Networks) == 0 {
		return "", &APIError{Status: http.StatusConflict, Message: "The project has no network named private."}
	}
	return out.Networks[0].ID, nil
}

// buyTerms rents each server of a reservation for months.
func buyTerms(ctx context.Context, api *Client, reservation string, months int) error {
	var out struct {
		Servers []struct {
			ID string `json:"id"`
		} `json:"servers"`
	}
	if err := api.Get(ctx, Compute, "/servers?reservation_id="+url.QueryEscape(reservation), &out); err != nil {
		return err
	}
	for _, s := range out.Servers {
		body := map[string]any{"term": map[string]any{"server_id": s.ID, "months": months}}
		if err := api.Post(ctx, Billing, "/v1/terms", body, nil); err != nil {
			return err
		}
	}
	return nil
}
