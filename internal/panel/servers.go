package panel

import (
	"encoding/json"
	"fmt"
	"html"
	"html/template"
	"net/http"
	"net/url"
	"nimbus/internal/compute"
	"nimbus/internal/flavorspec"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// serverRoutes are the servers' list, page, live status and actions.
func (p *Panel) serverRoutes() []route {
	return []route{
		{"GET /servers", member, p.serverList},
		{"GET /servers/status.json", member, p.serverStatus},
		{"GET /servers/{id}", member, p.serverPage},
		{"GET /servers/{id}/delete", member, p.serverDeletePage},
		{"POST /servers/{id}/delete", member, p.serverDelete},
		{"POST /servers/{id}/console", member, p.serverConsole},
		{"POST /servers/{id}/{action}", member, p.serverAction},
	}
}

// apiServer is the part of Nova's server body (2.47+, the flavor
// embedded) the panel shows.
type apiServer struct {
	ID        string  `json:"id"`
	Name      string  `json:"name"`
	Status    string  `json:"status"`
	VMState   string  `json:"OS-EXT-STS:vm_state"`
	Task      *string `json:"OS-EXT-STS:task_state"`
	Launched  *string `json:"OS-SRV-USG:launched_at"`
	Locked    bool    `json:"locked"`
	Addresses map[string][]struct {
		Addr    string `json:"addr"`
		Version int    `json:"version"`
		Type    string `json:"OS-EXT-IPS:type"`
	} `json:"addresses"`
	AccessIPv4 string    `json:"accessIPv4"`
	Image      imageRef  `json:"image"`
	Flavor     apiFlavor `json:"flavor"`
	Created    time.Time `json:"created"`
	KeyName    *string   `json:"key_name"`
	Fault      *struct {
		Message string `json:"message"`
	} `json:"fault"`
}

// memo remembers f's answers: a list repeats a few flavors and prices.
func memo[K comparable](f func(K) string) func(K) string {
	seen := map[K]string{}
	return func(k K) string {
		v, ok := seen[k]
		if !ok {
			v = f(k)
			seen[k] = v
		}
		return v
	}
}

// ipText is a server's addresses on one line, the public ones marked.
func (q *req) ipText(s *apiServer) string {
	fixed, public := s.ips()
	for _, a := range public {
		fixed = append(fixed, a+" ("+q.T("public")+")")
	}
	return strings.Join(fixed, ", ")
}

// apiFlavor is a flavor as embedded in a server or listed.
type apiFlavor struct {
	ID         string            `json:"id"`
	Name       string            `json:"name"`
	Original   string            `json:"original_name"`
	VCPUs      int               `json:"vcpus"`
	RAM        int               `json:"ram"`
	Disk       int               `json:"disk"`
	ExtraSpecs map[string]string `json:"extra_specs"`
}

// name is the flavor's name whether listed or embedded.
func (f apiFlavor) name() string {
	if f.Original != "" {
		return f.Original
	}
	return f.Name
}

// imageRef is a server's image: {"id": …}, or "" when it booted from a
// volume.
type imageRef struct{ ID string }

func (r *imageRef) UnmarshalJSON(b []byte) error {
	if len(b) == 0 || b[0] != '{' {
		return nil
	}
	var v struct {
		ID string `json:"id"`
	}
	err := json.Unmarshal(b, &v)
	r.ID = v.ID
	return err
}

// imageID is the server's image id ("" when booted from a volume).
func (s *apiServer) imageID() string { return s.Image.ID }

func (s *apiServer) task() string {
	if s.Task == nil {
		return ""
	}
	return *s.Task
}

// ips are the server's fixed and public addresses.
func (s *apiServer) ips() (fixed, public []string) {
	nets := make([]string, 0, len(s.Addresses))
	for n := range s.Addresses {
		nets = append(nets, n)
	}
	sort.Strings(nets)
	seen := map[string]bool{}
	for _, n := range nets {
		for _, a := range s.Addresses[n] {
			seen[a.Addr] = true
			if a.Type == "floating" {
				public = append(public, a.Addr)
			} else {
				fixed = append(fixed, a.Addr)
			}
		}
	}
	if s.AccessIPv4 != "" && !seen[s.AccessIPv4] {
		public = append(public, s.AccessIPv4)
	}
	return fixed, public
}

// config describes a flavor in words: "2 vCPU · 4 GB RAM · 40 GB network
// disk · 1 × A100 · public IPv4".
func (q *req) config(f apiFlavor) string {
	parts := []string{q.T("%d vCPU", f.VCPUs), q.T("%s GB RAM", strconv.FormatFloat(float64(f.RAM)/1024, 'f', -1, 64))}
	disk := q.T("%d GB disk", f.Disk)
	if t := f.ExtraSpecs["nimbus:disk_type"]; t != "" {
		disk = q.T("%d GB "+t+" disk", f.Disk)
	}
	parts = append(parts, disk)
	if g, err := flavorspec.GPUsOf(f.ExtraSpecs); err == nil && g.Count > 0 {
		parts = append(parts, fmt.Sprintf("%d × %s", g.Count, g.Model))
	}
	if f.ExtraSpecs["nimbus:public_ipv4"] == "true" {
		parts = append(parts, q.T("public IPv4"))
	}
	return strings.Join(parts, " · ")
}

// statusText is a server's status in the page's language, with its task.
func (q *req) statusText(status, task string) string {
	s := q.T(status)
	if task != "" {
		s += " (" + q.T(strings.ReplaceAll(task, "_", " ")) + ")"
	}
	return s
}

// serverRow is one line of the list, its text made ahead so that 1,000
// rows render quickly.
type serverRow struct {
	ID, Name, Status, StatusText string
	IPs, Config, Hourly, Cost    string
}

// rowsHTML writes the list's rows. A thousand rows through html/template
// cost more than the rest of the page; each value here is escaped for
// where it goes (text, a quoted attribute, a URL path), which is all the
// template's escaping would do.
func rowsHTML(rows []serverRow) template.HTML {
	var b strings.Builder
	b.Grow(len(rows) * 400)
	esc := html.EscapeString
	for _, r := range rows {
		id := esc(r.ID)
		b.WriteString(`<tr data-id="` + id + `"><th scope="row"><a href="/servers/` + esc(url.PathEscape(r.ID)) + `">` + esc(r.Name) +
			`</a></th><td class="status ` + esc(r.Status) + `">` + esc(r.StatusText) + `</td><td>` + esc(r.IPs) +
			`</td><td>` + esc(r.Config) + `</td><td class="num">` + esc(r.Hourly) + `</td><td class="num">` + esc(r.Cost) + "</td></tr>\n")
	}
	return template.HTML(b.String())
}

type serverListData struct {
	Rows []serverRow
	// RowsHTML is Rows written out.
	RowsHTML template.HTML
	// Since is when the list was read, for the live status's changes-since.
	Since string
	// Next is the marker of the next page when there is one, of Limit
	// servers.
	Next  string
	Limit int
	// CostFrom is the first month the costs count.
	CostFrom string
}

// serverPage is how many servers a list page shows unless ?limit= (up to
// Nova's 1,000) asks for more.
const serverPage = 100

// serverList is GET /servers: one page of servers (?limit=, 100 unless
// asked, up to 1,000), read with
// one list call, at once with the image list (for each image's OS, which
// its price depends on) and this month's usage; then one quote per
// distinct flavor and OS, and the usage of earlier months since the oldest
// server was created (none for servers made this month).
func (p *Panel) serverList(q *req) error {
	ctx := q.r.Context()
	since := p.cfg.Now().Add(-2 * time.Second).UTC().Format(time.RFC3339)
	limit := serverPage
	if v, err := strconv.Atoi(q.r.URL.Query().Get("limit")); err == nil && v >= 1 && v <= 1000 {
		limit = v
	}
	path := "/servers/detail?limit=" + strconv.Itoa(limit)
	if m := q.r.URL.Query().Get("marker"); m != "" {
		path += "&marker=" + url.QueryEscape(m)
	}
	var list struct {
		Servers []apiServer `json:"servers"`
		Links   []struct {
			Rel string `json:"rel"`
		} `json:"servers_links"`
	}
	var osOf map[string]string
	var mu sync.Mutex
	costs := map[string]int64{}
	err := parallel(
		func() error { return q.api.Get(ctx, Compute, path, &list) },
		func() (err error) { osOf, err = p.imageOS(q); return err },
		func() error { return p.costs(q, monthStart(p.cfg.Now()), &mu, costs) },
	)
	if err != nil {
		return err
	}
	d := serverListData{Since: since, Limit: limit, Rows: make([]serverRow, 0, len(list.Servers))}
	if len(list.Links) > 0 && len(list.Servers) > 0 {
		d.Next = list.Servers[len(list.Servers)-1].ID
	}
	var prices map[priceKey]int64
	var from time.Time
	err = parallel(
		func() (err error) { prices = p.hourlyPrices(q, list.Servers, osOf); return nil },
		func() (err error) { from, err = p.earlierCosts(q, list.Servers, &mu, costs); return err },
	)
	d.CostFrom = from.Format("2006-01")
	if err != nil {
		return err
	}
	money, configs := memo(p.cfg.Money.Format), map[string]string{}
	for i := range list.Servers {
		s := &list.Servers[i]
		if _, ok := configs[s.Flavor.name()]; !ok {
			configs[s.Flavor.name()] = q.config(s.Flavor)
		}
		r := serverRow{ID: s.ID, Name: s.Name, Status: s.Status, StatusText: q.statusText(s.Status, s.task()),
			IPs: q.ipText(s), Config: configs[s.Flavor.name()], Hourly: "—", Cost: money(costs[s.ID])}
		if h, ok := prices[priceKey{s.Flavor.name(), osOf[s.imageID()]}]; ok {
			r.Hourly = money(h)
		}
		d.Rows = append(d.Rows, r)
	}
	d.RowsHTML = rowsHTML(d.Rows)
	return q.render("servers", q.T("Servers"), d)
}

// imageOS maps the images the user sees to their OS type ("windows" costs
// a licence).
func (p *Panel) imageOS(q *req) (map[string]string, error) {
	imgs, err := p.images(q)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(imgs))
	for _, im := range imgs {
		out[im.ID] = im.OSType
	}
	return out, nil
}

// apiImage is the part of a Glance image the panel uses.
type apiImage struct {
	ID     string `json:"id"`
	Name   string `json:"name"`
	Status string `json:"status"`
	OSType string `json:"os_type"`
}

// images are the images the user may boot, by name.
func (p *Panel) images(q *req) ([]apiImage, error) {
	var out struct {
		Images []apiImage `json:"images"`
	}
	if err := q.api.Get(q.r.Context(), Image, "/v2/images?limit=1000&status=active&sort_key=name&sort_dir=asc", &out); err != nil {
		return nil, err
	}
	return out.Images, nil
}

// priceKey is what a server's hourly price depends on.
type priceKey struct{ flavor, os string }

// hourlyPrices quotes each distinct flavor and OS once, at once. A flavor
// that cannot be quoted (deleted since) is left unpriced.
func (p *Panel) hourlyPrices(q *req, servers []apiServer, osOf map[string]string) map[priceKey]int64 {
	keys := map[priceKey]bool{}
	for i := range servers {
		keys[priceKey{servers[i].Flavor.name(), osOf[servers[i].imageID()]}] = true
	}
	var mu sync.Mutex
	out := make(map[priceKey]int64, len(keys))
	fns := make([]func() error, 0, len(keys))
	for k := range keys {
		fns = append(fns, func() error {
			h, err := p.quote(q, k)
			if err == nil {
				mu.Lock()
				out[k] = h
				mu.Unlock()
			}
			return nil
		})
	}
	parallel(fns...)
	return out
}

// quote is one server's price per hour from billing's quotes, the price
// that is charged.
func (p *Panel) quote(q *req, k priceKey) (int64, error) {
	body := map[string]any{"flavor": k.flavor}
	if k.os == "windows" {
		body["os_type"] = "windows"
	}
	var out struct {
		Quote struct {
			HourlyEach int64 `json:"hourly_each"`
		} `json:"quote"`
	}
	if err := q.api.Post(q.r.Context(), Billing, "/v1/quotes", map[string]any{"quote": body}, &out); err != nil {
		return 0, err
	}
	return out.Quote.HourlyEach, nil
}

// maxCostMonths bounds the months of usage the list reads.
const maxCostMonths = 12

// monthStart is the first instant of t's month.
func monthStart(t time.Time) time.Time {
	t = t.UTC()
	return time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
}

// costs adds what each resource was charged in month (billing's usage,
// which sums the ledger) to out.
func (p *Panel) costs(q *req, month time.Time, mu *sync.Mutex, out map[string]int64) error {
	var u struct {
		Usage struct {
			Resources []struct {
				ID     string `json:"resource_id"`
				Amount int64  `json:"amount"`
			} `json:"resources"`
		} `json:"usage"`
	}
	if err := q.api.Get(q.r.Context(), Billing, "/v1/usage?month="+month.Format("2006-01"), &u); err != nil {
		return err
	}
	mu.Lock()
	defer mu.Unlock()
	for _, r := range u.Usage.Resources {
		out[r.ID] += r.Amount
	}
	return nil
}

// earlierCosts adds the months before this one since the oldest server's
// creation (at most maxCostMonths in all), at once, and returns the first
// month counted.
func (p *Panel) earlierCosts(q *req, servers []apiServer, mu *sync.Mutex, out map[string]int64) (time.Time, error) {
	this := monthStart(p.cfg.Now())
	first := this
	for i := range servers {
		if m := monthStart(servers[i].Created); m.Before(first) {
			first = m
		}
	}
	if oldest := this.AddDate(0, 1-maxCostMonths, 0); first.Before(oldest) {
		first = oldest
	}
	var fns []func() error
	for m := first; m.Before(this); m = m.AddDate(0, 1, 0) {
		fns = append(fns, func() error { return p.costs(q, m, mu, out) })
	}
	return first, parallel(fns...)
}

// statusEntry is one server's live status.
type statusEntry struct {
	Status string `json:"status"`
	Task   string `json:"task"`
	Text   string `json:"text"`
}

// serverStatus is GET /servers/status.json?since=…: the servers that
// changed since then (Nova's changes-since, so a poll of a long list reads
// only what moved), or ?id=… for one server. A deleted server reads
// DELETED.
func (p *Panel) serverStatus(q *req) error {
	ctx := q.r.Context()
	now := p.cfg.Now().Add(-2 * time.Second).UTC().Format(time.RFC3339)
	qs := q.r.URL.Query()
	out := map[string]statusEntry{}
	if id := qs.Get("id"); id != "" {
		var one struct {
			Server apiServer `json:"server"`
		}
		if err := q.api.Get(ctx, Compute, "/servers/"+url.PathEscape(id), &one); err != nil {
			if StatusOf(err) != http.StatusNotFound {
				return jsonError(q, err)
			}
			one.Server = apiServer{ID: id, Status: "DELETED"}
		}
		s := one.Server
		out[id] = statusEntry{s.Status, s.task(), q.statusText(s.Status, s.task())}
	} else {
		since := qs.Get("since")
		if _, err := time.Parse(time.RFC3339, since); err != nil {
			return jsonError(q, BadRequest("since must be a time (RFC 3339)."))
		}
		var list struct {
			Servers []apiServer `json:"servers"`
		}
		if err := q.api.Get(ctx, Compute, "/servers/detail?limit=1000&changes-since="+url.QueryEscape(since), &list); err != nil {
			return jsonError(q, err)
		}
		for _, s := range list.Servers {
			out[s.ID] = statusEntry{s.Status, s.task(), q.statusText(s.Status, s.task())}
		}
	}
	return writeJSON(q, http.StatusOK, map[string]any{"since": now, "servers": out})
}

func writeJSON(q *req, status int, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	q.w.Header().Set("Content-Type", "application/json")
	q.w.WriteHeader(status)
	_, err = q.w.Write(b)
	return err
}

// jsonError answers the poller with the API's status and message.
func jsonError(q *req, err error) error {
	ae, ok := err.(*APIError)
	if !ok {
		return err
	}
	if ae.Status == http.StatusUnauthorized {
		return err // the wrapper sends the browser to sign in again
	}
	return writeJSON(q, ae.Status, map[string]string{"message": ae.Message})
}

// loginInfo is one way in from GET /servers/{id}/access.
type loginInfo struct {
	Protocol string `json:"protocol"`
	Host     string `json:"host"`
	Port     int    `json:"port"`
	User     string `json:"user"`
}

// keyName is the server's key pair, "" for none.
func (s *apiServer) keyName() string {
	if s.KeyName == nil {
		return ""
	}
	return *s.KeyName
}

// loginWay is one way into a server as its page shows it.
type loginWay struct {
	Protocol, User, Command string
	// Private is an address of the project's network, which only its
	// other servers reach.
	Private bool
}

// loginWays are the ways into a server from GET /servers/{id}/access,
// those the customer reaches first: an entry at a private address of a
// server that has a public one is shown at the public one (compute lists
// the public one itself only where the host routes it), and ssh names the
// server's key with -i.
func loginWays(access []loginInfo, fixed, public []string, key string) []loginWay {
	var out []loginWay
	seen := map[loginInfo]bool{}
	for _, a := range access {
		if slices.Contains(fixed, a.Host) && len(public) > 0 {
			a.Host = public[0]
		}
		if seen[a] {
			continue
		}
		seen[a] = true
		out = append(out, loginWay{Protocol: a.Protocol, User: a.User, Command: a.command(key), Private: slices.Contains(fixed, a.Host)})
	}
	slices.SortStableFunc(out, func(x, y loginWay) int { return b2i(x.Private) - b2i(y.Private) })
	return out
}

// command is how to log in from a terminal with key (none when ""), or
// the RDP address.
func (l loginInfo) command(key string) string {
	if l.Protocol == "rdp" {
		if l.Port == 3389 || l.Port == 0 {
			return l.Host
		}
		return l.Host + ":" + strconv.Itoa(l.Port)
	}
	cmd := "ssh"
	if key != "" {
		cmd += " -i " + keyFile(key)
	}
	if l.Port != 22 && l.Port != 0 {
		cmd += " -p " + strconv.Itoa(l.Port)
	}
	return cmd + " " + l.User + "@" + l.Host
}

var plainName = regexp.MustCompile(`^[A-Za-z0-9_.@+-]+$`)

// keyFile is where the private key of key pair name is taken to be saved,
// for the shell: ~/.ssh/<name>, the name quoted when it needs it.
func keyFile(name string) string {
	if plainName.MatchString(name) {
		return "~/.ssh/" + name
	}
	return "~/.ssh/" + shellQuote(name)
}

type instanceAction struct {
	Action    string `json:"action"`
	RequestID string `json:"request_id"`
	Start     string `json:"start_time"`
	Message   string `json:"message"`
}

// serverPageData is the server's page.
type serverPageData struct {
	S                         apiServer
	StatusText, Task, Config  string
	Fixed, Public             []string
	ImageID, ImageName        string
	Hourly                    int64
	Priced                    bool
	Access                    []loginWay
	Key                       string // the server's key pair, "" for none
	Windows                   bool
	Password                  string
	ConsoleURL, ConsoleOutput string
	// ConsoleError is why the API gives no console now.
	ConsoleError string
	Actions      []instanceAction
	Images       []apiImage
	Flavors      []apiFlavor
	// Can is which actions the server's state allows.
	Can map[string]bool
}

// serverPage is GET /servers/{id}: the server read first (the API's 404
// for anyone else's), then what the page shows, read at once.
func (p *Panel) serverPage(q *req) error {
	ctx := q.r.Context()
	id := q.r.PathValue("id")
	base := "/servers/" + url.PathEscape(id)
	var one struct {
		Server apiServer `json:"server"`
	}
	if err := q.api.Get(ctx, Compute, base, &one); err != nil {
		return err
	}
	s := one.Server
	d := serverPageData{S: s, Task: s.task(), StatusText: q.statusText(s.Status, s.task()), Config: q.config(s.Flavor),
		Can: allowed(&s), ImageID: s.imageID()}
	d.Fixed, d.Public = s.ips()
	running := s.Status == "ACTIVE" || s.Status == "SHUTOFF" || s.Status == "VERIFY_RESIZE" || s.Status == "PAUSED" || s.Status == "SUSPENDED"
	var access struct {
		Access []loginInfo `json:"access"`
	}
	var pw struct {
		Password string `json:"password"`
	}
	var acts struct {
		Actions []instanceAction `json:"instanceActions"`
	}
	var flavors struct {
		Flavors []apiFlavor `json:"flavors"`
	}
	err := parallel(
		func() error { return optional(q.api.Get(ctx, Compute, base+"/access", &access)) },
		func() error { return optional(q.api.Get(ctx, Compute, base+"/os-server-password", &pw)) },
		func() error { return optional(q.api.Get(ctx, Compute, base+"/os-instance-actions?limit=20", &acts)) },
		func() error {
			return optional(q.api.Get(ctx, Compute, "/flavors/detail?sort_key=vcpus&sort_dir=asc", &flavors))
		},
		func() (err error) { d.Images, err = p.images(q); return optional(err) },
		func() error {
			if !running {
				return nil
			}
			var out struct {
				Output string `json:"output"`
			}
			err := q.api.Post(ctx, Compute, base+"/action", map[string]any{"os-getConsoleOutput": map[string]any{"length": 100}}, &out)
			d.ConsoleOutput = out.Output
			return optional(err)
		},
		func() error {
			if s.Status != "ACTIVE" {
				return nil
			}
			var err error
			d.ConsoleURL, err = q.consoleURL(base)
			if ae, ok := err.(*APIError); ok && ae.Status < 500 {
				d.ConsoleError = ae.Message
			}
			return optional(err)
		},
	)
	if err != nil {
		return err
	}
	d.Key = s.keyName()
	d.Access, d.Password, d.Actions, d.Flavors = loginWays(access.Access, d.Fixed, d.Public, d.Key), pw.Password, acts.Actions, flavors.Flavors
	osType := ""
	for _, im := range d.Images {
		if im.ID == s.imageID() {
			d.ImageName, osType = im.Name, im.OSType
		}
	}
	for _, a := range d.Access {
		if a.Protocol == "rdp" {
			d.Windows = true
		}
	}
	d.Windows = d.Windows || osType == "windows" || d.Password != ""
	if h, err := p.quote(q, priceKey{s.Flavor.name(), osType}); err == nil {
		d.Hourly, d.Priced = h, true
	}
	return q.render("servers_detail", s.Name, d)
}

// optional keeps a part of a page that the API refuses for the server's
// state (409) or does not have from failing the whole page.
func optional(err error) error {
	if st := StatusOf(err); err != nil && st >= 400 && st < 500 && st != http.StatusUnauthorized {
		return nil
	}
	return err
}

// allowed is which of the page's actions compute's state rules let the
// server take now, for its owner (the API has the last word still: an
// action refused meanwhile comes back with its message).
func allowed(s *apiServer) map[string]bool {
	st := compute.ServerState{VMState: s.VMState, TaskState: s.task(), Launched: s.Launched != nil, Locked: s.Locked}
	can := map[string]bool{}
	for action, rules := range map[string][]string{
		"start": {"start"}, "stop": {"stop"}, "shelve": {"shelve"}, "unshelve": {"unshelve"},
		"rebuild": {"rebuild"}, "resize": {"resize"}, "delete": {"delete"},
		"reboot":         {"reboot", "reboot_hard"},
		"confirm-resize": {"confirmResize"}, "revert-resize": {"revertResize"},
	} {
		for _, rule := range rules {
			can[action] = can[action] || compute.Allows(rule, st, false)
		}
	}
	return can
}

// serverActions are the page's action forms: the Nova action each posts,
// and the message on success.
var serverActions = map[string]struct {
	body func(f url.Values) (map[string]any, error)
	done string
}{
	"start":          {fixed("os-start"), "Starting the server."},
	"stop":           {fixed("os-stop"), "Stopping the server."},
	"shelve":         {fixed("shelve"), "Shelving the server."},
	"unshelve":       {fixed("unshelve"), "Unshelving the server."},
	"confirm-resize": {fixed("confirmResize"), "The new size is confirmed."},
	"revert-resize":  {fixed("revertResize"), "Going back to the old size."},
	"reboot": {func(f url.Values) (map[string]any, error) {
		t := strings.ToUpper(f.Get("type"))
		if t != "SOFT" && t != "HARD" {
			return nil, BadRequest("Choose a soft or a hard reboot.")
		}
		return map[string]any{"reboot": map[string]string{"type": t}}, nil
	}, "Rebooting the server."},
	"rebuild": {func(f url.Values) (map[string]any, error) {
		if f.Get("image") == "" {
			return nil, BadRequest("Choose an image to rebuild from.")
		}
		return map[string]any{"rebuild": map[string]string{"imageRef": f.Get("image")}}, nil
	}, "Rebuilding the server."},
	"resize": {func(f url.Values) (map[string]any, error) {
		if f.Get("flavor") == "" {
			return nil, BadRequest("Choose a new size.")
		}
		return map[string]any{"resize": map[string]string{"flavorRef": f.Get("flavor")}}, nil
	}, "Resizing the server: confirm the new size when it is ready."},
}

func fixed(action string) func(url.Values) (map[string]any, error) {
	return func(url.Values) (map[string]any, error) { return map[string]any{action: nil}, nil }
}

// serverAction is POST /servers/{id}/{action}: the Nova action, then back
// to the server's page with the API's message when it refuses.
func (p *Panel) serverAction(q *req) error {
	a, ok := serverActions[q.r.PathValue("action")]
	if !ok {
		return errNotFound
	}
	id := q.r.PathValue("id")
	page := "/servers/" + url.PathEscape(id)
	body, err := a.body(q.r.PostForm)
	if err != nil {
		return q.back(page, BadRequest(q.T(err.(*APIError).Message)))
	}
	if err := q.api.Post(q.r.Context(), Compute, page+"/action", body, nil); err != nil {
		return actionError(q, page, err)
	}
	return q.redirect(page, q.T(a.done))
}

// consoleURL asks the API, as the user, for a noVNC URL of the server at
// base ("/servers/<id>"). A URL opens one session: the page's frame has
// its own, and "open in a new tab" asks for another (serverConsole).
func (q *req) consoleURL(base string) (string, error) {
	var out struct {
		Console struct {
			URL string `json:"url"`
		} `json:"remote_console"`
	}
	err := q.api.Post(q.r.Context(), Compute, base+"/remote-consoles",
		map[string]any{"remote_console": map[string]string{"protocol": "vnc", "type": "novnc"}}, &out)
	if err != nil {
		return "", err
	}
	// The panel sends browsers only to its own console proxy.
	if q.p.cfg.ConsoleURL == "" || !strings.HasPrefix(out.Console.URL, q.p.cfg.ConsoleURL+"/") {
		return "", fmt.Errorf("panel: console URL %q is not on the console proxy %q", out.Console.URL, q.p.cfg.ConsoleURL)
	}
	return out.Console.URL, nil
}

// serverConsole is POST /servers/{id}/console, the page's "open the
// console in a new tab": a fresh console URL, as the page's frame spent
// its own.
func (p *Panel) serverConsole(q *req) error {
	page := "/servers/" + url.PathEscape(q.r.PathValue("id"))
	u, err := q.consoleURL(page)
	if err != nil {
		return actionError(q, page, err)
	}
	http.Redirect(q.w, q.r, u, http.StatusSeeOther)
	return nil
}

// actionError goes back with the API's message, except that a server the
// user may not see is the API's 404, not a page of theirs to go back to.
func actionError(q *req, page string, err error) error {
	if StatusOf(err) == http.StatusNotFound {
		return err
	}
	return q.back(page, err)
}

// serverDeletePage is GET /servers/{id}/delete: the confirmation, for
// browsers without JavaScript and for a form sent without the tick.
func (p *Panel) serverDeletePage(q *req) error {
	var one struct {
		Server apiServer `json:"server"`
	}
	if err := q.api.Get(q.r.Context(), Compute, "/servers/"+url.PathEscape(q.r.PathValue("id")), &one); err != nil {
		return err
	}
	return q.render("servers_delete", q.T("Delete %s", one.Server.Name), one.Server)
}

// serverDelete is POST /servers/{id}/delete, with its confirmation ticked.
func (p *Panel) serverDelete(q *req) error {
	id := q.r.PathValue("id")
	page := "/servers/" + url.PathEscape(id)
	if q.r.PostForm.Get("confirm") != "yes" {
		http.Redirect(q.w, q.r, page+"/delete", http.StatusSeeOther)
		return nil
	}
	if err := q.api.Delete(q.r.Context(), Compute, page); err != nil {
		return actionError(q, page, err)
	}
	return q.redirect("/servers", q.T("The server is being deleted."))
}
