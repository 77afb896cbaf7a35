package panel

import (
	"context"
	"encoding/json"
	"errors"
	"math/big"
	"net/http"
	"net/url"
	"nimbus/internal/flavorspec"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// operatorRoutes are the operator's overview, hosts, price list and
// support settings pages.
func (p *Panel) operatorRoutes() []route {
	return []route{
		{"GET /admin", admin, p.adminHome},
		{"GET /admin/hosts", admin, p.hostsPage},
		{"POST /admin/hosts/{service}/status", admin, p.setHostStatus},
		{"GET /admin/prices", admin, p.pricesEditor},
		{"POST /admin/prices", admin, p.savePrices},
		{"GET /admin/support", admin, p.supportSettingsPage},
		{"POST /admin/support", admin, p.saveSupportSettings},
	}
}

// adminHome links the operator's pages.
func (p *Panel) adminHome(q *req) error {
	return q.render("admin_home", q.T("Operator"), nil)
}

// ---- Hosts ----

// capacityMicroversion is the last compute microversion whose hypervisor
// detail has vcpus, memory_mb and their use: 2.88 moved them to Placement,
// which Nimbus does not serve, so the hosts page asks at 2.87 (still with
// UUIDs, 2.53, for os-services).
const capacityMicroversion = "2.87"

// hostPage is the most items one compute list call returns (Nova's
// [api]max_limit).
const hostPage = 1000

// gpuCalls is how many server list calls the GPU count runs at once.
const gpuCalls = 4

type hypervisorBody struct {
	ID       string `json:"id"`
	Name     string `json:"hypervisor_hostname"`
	State    string `json:"state"`
	Status   string `json:"status"`
	IP       string `json:"host_ip"`
	Type     string `json:"hypervisor_type"`
	VCPUs    int    `json:"vcpus"`
	VCPUsUse int    `json:"vcpus_used"`
	MemoryMB int    `json:"memory_mb"`
	MemUse   int    `json:"memory_mb_used"`
	DiskGB   int    `json:"local_gb"`
	DiskUse  int    `json:"local_gb_used"`
	Servers  int    `json:"running_vms"`
	Service  struct {
		ID     string  `json:"id"`
		Host   string  `json:"host"`
		Reason *string `json:"disabled_reason"`
	} `json:"service"`
}

type serviceBody struct {
	Host       string  `json:"host"`
	Zone       string  `json:"zone"`
	UpdatedAt  *string `json:"updated_at"`
	ForcedDown bool    `json:"forced_down"`
}

// gpuUse is a GPU model, how many of its devices servers hold, and how
// many there are.
type gpuUse struct {
	Model       string
	Used, Total int
}

// hostRow is one hypervisor as the hosts page shows it.
type hostRow struct {
	hypervisorBody
	Zone, LastSeen string
	Up, Enabled    bool
	Reason         string
	GPUs           []gpuUse
}

// fleetTotals sum the hosts.
type fleetTotals struct {
	Hosts, Up, Enabled, VCPUs, VCPUsUsed, MemoryMB, MemoryMBUsed, Servers int
	GPUs                                                                  []gpuUse
}

type hostsData struct {
	Hosts  []hostRow
	Totals fleetTotals
}

// hostsPage lists every hypervisor with its capacity and use: one
// hypervisor list, one service list, and the servers of GPU flavors.
func (p *Panel) hostsPage(q *req) error {
	ctx := q.r.Context()
	var hvs []hypervisorBody
	var svcs map[string]serviceBody
	var gpus, inventory map[string]map[string]int
	err := parallel(
		// The GPU inventory is compute's, read in-process: the operator's
		// page sees devices, not any customer's data.
		func() (err error) { inventory, err = p.cfg.Compute.HostGPUs(ctx); return err },
		func() (err error) { hvs, err = listHypervisors(ctx, q.api.atCompute(capacityMicroversion)); return err },
		func() (err error) { svcs, err = computeServices(ctx, q.api); return err },
		func() (err error) { gpus, err = gpusInUse(ctx, q.api); return err },
	)
	if err != nil {
		return err
	}
	d := hostsData{}
	fleetGPUs, fleetTotal := map[string]int{}, map[string]int{}
	for _, h := range hvs {
		row := hostRow{hypervisorBody: h, Up: h.State == "up", Enabled: h.Status == "enabled"}
		if h.Service.Reason != nil {
			row.Reason = *h.Service.Reason
		}
		if s, ok := svcs[h.Service.Host]; ok {
			row.Zone = s.Zone
			if s.UpdatedAt != nil {
				row.LastSeen = p.seen(q, *s.UpdatedAt)
			}
		}
		row.GPUs = sortedGPUs(gpus[h.Service.Host], inventory[h.Service.Host])
		for _, g := range row.GPUs {
			fleetGPUs[g.Model] += g.Used
			fleetTotal[g.Model] += g.Total
		}
		d.Hosts = append(d.Hosts, row)
		t := &d.Totals
		t.Hosts++
		t.Up += b2i(row.Up)
		t.Enabled += b2i(row.Enabled)
		t.VCPUs += h.VCPUs
		t.VCPUsUsed += h.VCPUsUse
		t.MemoryMB += h.MemoryMB
		t.MemoryMBUsed += h.MemUse
		t.Servers += h.Servers
	}
	d.Totals.GPUs = sortedGPUs(fleetGPUs, fleetTotal)
	sort.Slice(d.Hosts, func(i, j int) bool { return d.Hosts[i].Name < d.Hosts[j].Name })
	return q.render("admin_hosts", q.T("Hosts"), d)
}

// seen says how long ago a service's heartbeat was (Nova's updated_at,
// UTC without a zone).
func (p *Panel) seen(q *req, at string) string {
	t, err := time.Parse("2006-01-02T15:04:05.999999", at)
	if err != nil {
		return ""
	}
	d := p.cfg.Now().Sub(t)
	switch {
	case d < time.Minute:
		return q.T("seen %d s ago", max(int(d.Seconds()), 0))
	case d < time.Hour:
		return q.T("seen %d min ago", int(d.Minutes()))
	case d < 48*time.Hour:
		return q.T("seen %d h ago", int(d.Hours()))
	}
	return q.T("seen %s", timeText(t))
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// sortedGPUs joins the devices in use and those there are, by model.
func sortedGPUs(used, total map[string]int) []gpuUse {
	out := make([]gpuUse, 0, len(total))
	for model, n := range total {
		out = append(out, gpuUse{Model: model, Used: used[model], Total: n})
	}
	for model, n := range used {
		if _, ok := total[model]; !ok {
			out = append(out, gpuUse{Model: model, Used: n})
		}
	}
	slices.SortFunc(out, func(a, b gpuUse) int { return strings.Compare(a.Model, b.Model) })
	return out
}

// listAll reads a compute list a page at a time (limit and marker, 2.33
// for hypervisors): path's answer holds the items under key; id is an
// item's marker.
func listAll[T any](ctx context.Context, c *Client, path string, v url.Values, key string, id func(T) string) ([]T, error) {
	var all []T
	v.Set("limit", strconv.Itoa(hostPage))
	for {
		var out map[string]json.RawMessage
		if err := c.Get(ctx, Compute, path+"?"+v.Encode(), &out); err != nil {
			return nil, err
		}
		var page []T
		if err := json.Unmarshal(out[key], &page); err != nil {
			return nil, err
		}
		all = append(all, page...)
		if len(page) < hostPage {
			return all, nil
		}
		v.Set("marker", id(page[len(page)-1]))
	}
}

// listHypervisors reads every hypervisor.
func listHypervisors(ctx context.Context, c *Client) ([]hypervisorBody, error) {
	return listAll(ctx, c, "/os-hypervisors/detail", url.Values{}, "hypervisors", func(h hypervisorBody) string { return h.ID })
}

// computeServices are the nova-compute services by host.
func computeServices(ctx context.Context, c *Client) (map[string]serviceBody, error) {
	var out struct {
		Services []serviceBody `json:"services"`
	}
	if err := c.Get(ctx, Compute, "/os-services?binary=nova-compute", &out); err != nil {
		return nil, err
	}
	m := make(map[string]serviceBody, len(out.Services))
	for _, s := range out.Services {
		m[s.Host] = s
	}
	return m, nil
}

type flavorSpecs struct {
	ID         string            `json:"id"`
	ExtraSpecs map[string]string `json:"extra_specs"`
}

// gpusInUse counts the GPUs servers hold, by host and model. The compute
// API has no GPU inventory; a GPU server's flavor names its model and
// count (nimbus:gpu_model, pci_passthrough:alias), so it lists the servers
// of the GPU flavors only, not every server.
func gpusInUse(ctx context.Context, c *Client) (map[string]map[string]int, error) {
	flavors, err := gpuFlavors(ctx, c)
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex
	out := map[string]map[string]int{}
	sem := make(chan struct{}, gpuCalls)
	var calls []func() error
	for _, f := range flavors {
		calls = append(calls, func() error {
			sem <- struct{}{}
			defer func() { <-sem }()
			servers, err := flavorServers(ctx, c, f.ID)
			if err != nil {
				return err
			}
			mu.Lock()
			defer mu.Unlock()
			for _, s := range servers {
				g, err := flavorspec.GPUsOf(s.Flavor.ExtraSpecs)
				if err != nil || g.Count == 0 || s.Host == nil || *s.Host == "" {
					continue // shelved or never placed: no device held
				}
				if out[*s.Host] == nil {
					out[*s.Host] = map[string]int{}
				}
				out[*s.Host][g.Model] += g.Count
			}
			return nil
		})
	}
	return out, parallel(calls...)
}

// gpuFlavors are the flavors, public or not, that ask for GPUs (the
// configurator makes a flavor per shape ordered, so there may be many).
func gpuFlavors(ctx context.Context, c *Client) ([]flavorSpecs, error) {
	all, err := listAll(ctx, c, "/flavors/detail", url.Values{"is_public": {"none"}}, "flavors", func(f flavorSpecs) string { return f.ID })
	return slices.DeleteFunc(all, func(f flavorSpecs) bool { return f.ExtraSpecs["nimbus:gpu_model"] == "" }), err
}

// gpuServer is what the GPU count reads of a server.
type gpuServer struct {
	ID     string  `json:"id"`
	Host   *string `json:"OS-EXT-SRV-ATTR:host"`
	Flavor struct {
		ExtraSpecs map[string]string `json:"extra_specs"`
	} `json:"flavor"`
}

// flavorServers are the servers of flavor, in every project.
func flavorServers(ctx context.Context, c *Client, flavor string) ([]gpuServer, error) {
	return listAll(ctx, c, "/servers/detail", url.Values{"all_tenants": {"1"}, "flavor": {flavor}}, "servers",
		func(s gpuServer) string { return s.ID })
}

// setHostStatus enables or disables a host's compute service.
func (p *Panel) setHostStatus(q *req) error {
	f := q.r.PostForm
	status, host := f.Get("status"), f.Get("host")
	if status != "enabled" && status != "disabled" {
		return q.back("/admin/hosts", BadRequest(q.T("Choose to enable or disable the host.")))
	}
	body := map[string]any{"status": status}
	if reason := strings.TrimSpace(f.Get("reason")); status == "disabled" && reason != "" {
		body["disabled_reason"] = reason
	}
	err := q.api.Do(q.r.Context(), http.MethodPut, Compute, "/os-services/"+url.PathEscape(q.r.PathValue("service")), body, nil)
	if err != nil {
		return q.back("/admin/hosts", err)
	}
	if status == "disabled" {
		return q.redirect("/admin/hosts", q.T("%s is disabled: it takes no new servers; those it has keep running.", host))
	}
	return q.redirect("/admin/hosts", q.T("%s is enabled: it takes new servers again.", host))
}

// atCompute is c asking the compute API at microversion v instead of
// ComputeMicroversion.
func (c *Client) atCompute(v string) *Client {
	hc := *c.hc
	hc.Transport = versionTransport{base: c.hc.Transport, value: "compute " + v}
	return &Client{hc: &hc, urls: c.urls, token: c.token}
}

type versionTransport struct {
	base  http.RoundTripper
	value string
}

func (t versionTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("OpenStack-API-Version", t.value)
	base := t.base
	if base == nil {
		base = http.DefaultTransport
	}
	return base.RoundTrip(r)
}

// ---- Price list ----

// pricesAnswer is billing's GET and PUT /v1/prices. Hourly is kept raw so
// that every key billing has is edited, whatever it is.
type pricesAnswer struct {
	Prices struct {
		Currency      string                     `json:"currency"`
		RateScale     int64                      `json:"rate_scale"`
		HoursPerMonth int64                      `json:"hours_per_month"`
		Hourly        map[string]json.RawMessage `json:"hourly"`
	} `json:"prices"`
}

// rateList is the price list flattened: "vcpu", "disk_gb:local",
// "gpu:L4" → rate units per hour; maps are the keys that hold named
// rates (disk_gb, gpu); terms are the term discounts in basis points.
type rateList struct {
	scale, hoursPerMonth int64
	rates                map[string]int64
	maps                 []string
	terms                map[string]int64
}

// termKey is the price list's key that is not an hourly rate.
const termKey = "term_discounts"

func (a pricesAnswer) rateList() (rateList, error) {
	pr := a.Prices
	l := rateList{scale: pr.RateScale, hoursPerMonth: pr.HoursPerMonth, rates: map[string]int64{}, terms: map[string]int64{}}
	if l.scale <= 0 {
		l.scale = 1
	}
	for k, raw := range pr.Hourly {
		var n int64
		if json.Unmarshal(raw, &n) == nil {
			l.rates[k] = n
			continue
		}
		var m map[string]int64
		if err := json.Unmarshal(raw, &m); err != nil {
			return l, err
		}
		if k == termKey {
			l.terms = m
			continue
		}
		l.maps = append(l.maps, k)
		for name, v := range m {
			l.rates[k+":"+name] = v
		}
	}
	sort.Strings(l.maps)
	return l, nil
}

// unitsPerMajor is how many rate units make one major unit.
func (l rateList) unitsPerMajor() int64 { return l.scale * 100 }

// decimals is how many decimal places a rate in major units has.
func (l rateList) decimals() int {
	d := 0
	for n := l.unitsPerMajor(); n > 1; n /= 10 {
		d++
	}
	return d
}

// major writes a rate in major units, exactly, with at least two places:
// 5000 rate units (0.5 of a minor unit) is "0.005".
func (l rateList) major(rate int64) string { return rateText(rate, l.scale) }

var decimalRE = regexp.MustCompile(`^[0-9]{1,15}([.,][0-9]+)?$`)

// parseRate reads a price per hour in major units into rate units; ok is
// false for anything but a plain non-negative decimal that rate units hold
// exactly.
func (l rateList) parseRate(s string) (int64, bool) {
	s = strings.ReplaceAll(strings.TrimSpace(s), " ", "")
	if !decimalRE.MatchString(s) {
		return 0, false
	}
	r, ok := new(big.Rat).SetString(strings.Replace(s, ",", ".", 1))
	if !ok {
		return 0, false
	}
	r.Mul(r, new(big.Rat).SetInt64(l.unitsPerMajor()))
	if !r.IsInt() || !r.Num().IsInt64() {
		return 0, false
	}
	return r.Num().Int64(), true
}

// rateRow is one field of the editor.
type rateRow struct {
	Key, ID, Label, Value, Monthly string
	// Named rates (a disk type, a GPU model) may be removed.
	Named bool
}

type rateGroup struct {
	Title string
	Rows  []rateRow
	// Map is the price list key new named rates of the group go under;
	// "" when the group takes none.
	Map string
}

// namedRates are the price list's maps whose names the operator adds and
// removes: GPU models come and go with the fleet, while disk types are
// compute's own.
var namedRates = []string{"gpu"}

type termRow struct {
	Months   int
	Discount string
}

type pricesData struct {
	Currency string
	Groups   []rateGroup
	Terms    []termRow
	Decimals int
}

// rateGroups are the editor's sections, by the keys they hold; a key no
// section names goes in the last.
var rateGroups = []struct {
	title string
	keys  []string
}{
	{"Server", []string{"vcpu", "ram_gb", "public_ipv4"}},
	{"Boot disks", []string{"disk_gb"}},
	{"GPUs", []string{"gpu"}},
	{"Licences", []string{"windows_vcpu", "windows_server"}},
	{"Storage", []string{"volume_gb", "snapshot_gb", "backup_gb", "image_gb"}},
	{"Other", nil},
}

// rateLabel is what a key is priced per.
func rateLabel(q *req, key string) string {
	m, name, named := strings.Cut(key, ":")
	switch {
	case named && m == "disk_gb" && (name == "local" || name == "network"):
		return q.T("GB of " + name + " disk")
	case named && m == "disk_gb":
		return q.T("GB of %s disk", name)
	case named && m == "gpu":
		return q.T("GPU %s", name)
	case named:
		return key
	}
	labels := map[string]string{"vcpu": "vCPU", "ram_gb": "GB of RAM", "public_ipv4": "Public IPv4 address",
		"windows_vcpu": "Windows licence per vCPU", "windows_server": "Windows licence per server",
		"volume_gb": "GB of volume", "snapshot_gb": "GB of volume snapshot", "backup_gb": "GB of backup", "image_gb": "GB of image"}
	if l, ok := labels[key]; ok {
		return q.T(l)
	}
	return key
}

// groupOf is the index of the section key belongs in.
func groupOf(key string) int {
	base, _, _ := strings.Cut(key, ":")
	for i, g := range rateGroups {
		if slices.Contains(g.keys, base) {
			return i
		}
	}
	return len(rateGroups) - 1
}

// pricesEditor shows the price list as a form of hourly rates in money.
func (p *Panel) pricesEditor(q *req) error {
	var a pricesAnswer
	if err := q.api.Get(q.r.Context(), Billing, "/v1/prices", &a); err != nil {
		return err
	}
	l, err := a.rateList()
	if err != nil {
		return err
	}
	d := pricesData{Currency: a.Prices.Currency, Decimals: l.decimals()}
	groups := make([]rateGroup, len(rateGroups))
	for i, g := range rateGroups {
		groups[i].Title = q.T(g.title)
		for _, k := range g.keys {
			if slices.Contains(l.maps, k) && slices.Contains(namedRates, k) {
				groups[i].Map = k
			}
		}
	}
	keys := make([]string, 0, len(l.rates))
	for k := range l.rates {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return rateOrder(keys[i]) < rateOrder(keys[j]) })
	for i, k := range keys {
		v := l.rates[k]
		g := groupOf(k)
		groups[g].Rows = append(groups[g].Rows, rateRow{Key: k, ID: "rate-" + strconv.Itoa(i), Label: rateLabel(q, k),
			Value: l.major(v), Monthly: p.cfg.Money.Exact(perMonth(v, l.hoursPerMonth)), Named: isNamed(k)})
	}
	for _, g := range groups {
		if len(g.Rows) > 0 || g.Map != "" {
			d.Groups = append(d.Groups, g)
		}
	}
	for m, v := range l.terms {
		n, _ := strconv.Atoi(m)
		d.Terms = append(d.Terms, termRow{Months: n, Discount: p.cfg.Money.major(v)})
	}
	sort.Slice(d.Terms, func(i, j int) bool { return d.Terms[i].Months < d.Terms[j].Months })
	return q.render("admin_prices", q.T("Price list"), d)
}

// isNamed is whether key is a named rate the operator may remove.
func isNamed(key string) bool {
	m, _, named := strings.Cut(key, ":")
	return named && slices.Contains(namedRates, m)
}

// rateOrder sorts keys as the sections list them, then by name.
func rateOrder(key string) string {
	base, name, _ := strings.Cut(key, ":")
	g := groupOf(key)
	i := slices.Index(rateGroups[g].keys, base)
	return strconv.Itoa(g) + "/" + strconv.Itoa(100+i) + "/" + name
}

// savePrices sends billing the rates the form changed: a field whose
// value differs from the one the page showed (orig.<key>), a named rate
// ticked for removal (null), and a new named rate. Rates nobody touched
// are not sent, so two operators editing different rates do not undo
// each other.
func (p *Panel) savePrices(q *req) error {
	ctx := q.r.Context()
	var a pricesAnswer
	if err := q.api.Get(ctx, Billing, "/v1/prices", &a); err != nil {
		return err
	}
	l, err := a.rateList()
	if err != nil {
		return err
	}
	hourly, err := p.changedRates(q, l)
	if err != nil {
		return q.back("/admin/prices", err)
	}
	if len(hourly) == 0 {
		return q.redirect("/admin/prices", q.T("Nothing was changed."))
	}
	body := map[string]any{"prices": map[string]any{"hourly": hourly}}
	if err := q.api.Do(ctx, http.MethodPut, Billing, "/v1/prices", body, nil); err != nil {
		return q.back("/admin/prices", err)
	}
	return q.redirect("/admin/prices", q.T("The price list is saved."))
}

// changedRates is the PUT /v1/prices "hourly" object of the form's
// changes.
func (p *Panel) changedRates(q *req, l rateList) (map[string]any, error) {
	f := q.r.PostForm
	out := map[string]any{}
	set := func(key string, v any) {
		m, name, named := strings.Cut(key, ":")
		if !named {
			out[key] = v
			return
		}
		sub, _ := out[m].(map[string]any)
		if sub == nil {
			sub = map[string]any{}
			out[m] = sub
		}
		sub[name] = v
	}
	bad := func(label string) error {
		return BadRequest(q.T("%s: write a price per hour such as 0.75, with at most %d decimal places.", label, l.decimals()))
	}
	for key := range l.rates {
		if isNamed(key) && f.Get("remove."+key) != "" {
			set(key, nil)
			continue
		}
		raw, ok := f["rate."+key]
		if !ok {
			continue
		}
		v, ok := l.parseRate(raw[0])
		if !ok {
			return nil, bad(rateLabel(q, key))
		}
		if was, ok := l.parseRate(f.Get("orig." + key)); !ok || was != v {
			set(key, v)
		}
	}
	for _, m := range namedRates {
		name := strings.TrimSpace(f.Get("new." + m + ".name"))
		raw := strings.TrimSpace(f.Get("new." + m + ".rate"))
		if name == "" && raw == "" {
			continue
		}
		v, ok := l.parseRate(raw)
		if name == "" || !ok {
			return nil, bad(q.T("New rate"))
		}
		set(m+":"+name, v)
	}
	return out, nil
}

// ---- Support settings ----

type supportSettingsData struct {
	Support Support
	// Open and Customers count the open requests and who sent them; the
	// queue has them.
	Open, Customers int
}

// supportSettingsPage edits the contacts on /support and links the
// customers' requests.
func (p *Panel) supportSettingsPage(q *req) error {
	ctx := q.r.Context()
	var d supportSettingsData
	err := parallel(
		func() (err error) { d.Support, err = p.SupportSettings(ctx); return err },
		func() (err error) { d.Open, d.Customers, err = p.openRequests(ctx); return err },
	)
	if err != nil {
		return err
	}
	return q.render("admin_support", q.T("Support settings"), d)
}

func (p *Panel) saveSupportSettings(q *req) error {
	f := q.r.PostForm
	s := Support{Messenger: f.Get("messenger"), Email: f.Get("email"), Phone: f.Get("phone"), Hours: f.Get("hours")}
	if err := p.SetSupportSettings(q.r.Context(), s); err != nil {
		var ae *APIError
		if errors.As(err, &ae) && ae.Status == http.StatusBadRequest {
			err = BadRequest(q.T(ae.Message)) // the settings' own words, translated
		}
		return q.back("/admin/support", err)
	}
	return q.redirect("/admin/support", q.T("The support contacts are saved and shown on the support page."))
}
