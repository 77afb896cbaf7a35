package panel_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"nimbus/internal/cloud"
	"nimbus/internal/driver"
	"nimbus/internal/driver/fake"
	"nimbus/internal/testenv"
)

// opsAPI calls the cloud's APIs as one user in a test.
type opsAPI struct {
	t     *testing.T
	hc    *http.Client
	token string
}

func newOpsAPI(t *testing.T, c *cloud.Cloud, user string) *opsAPI {
	return &opsAPI{t: t, hc: testenv.HTTPClient(t, c), token: testenv.Token(t, c, user)}
}

// call sends body to url, wants status want, and decodes the answer into
// out (when not nil).
func (a *opsAPI) call(method, url, body string, want int, out any, hdr ...string) {
	a.t.Helper()
	resp, raw := testenv.Do(a.t, a.hc, method, url, a.token, body, hdr...)
	testenv.MustStatus(a.t, resp, raw, want)
	if out != nil {
		if err := json.Unmarshal([]byte(raw), out); err != nil {
			a.t.Fatalf("%s %s: %v: %s", method, url, err, raw)
		}
	}
}

// opsGPUServer creates a server of flavor as the demo customer and waits
// until it is ACTIVE.
func opsGPUServer(t *testing.T, c *cloud.Cloud, flavor string) {
	t.Helper()
	a := newOpsAPI(t, c, cloud.DemoUser)
	var images struct {
		Images []struct{ ID, Status string }
	}
	a.call("GET", c.ImageURL+"/v2/images", "", http.StatusOK, &images)
	if len(images.Images) == 0 {
		t.Fatal("no images")
	}
	var created struct{ Server struct{ ID string } }
	a.call("POST", c.ComputeURL+"/servers", `{"server": {"name": "gpu-1", "imageRef": "`+images.Images[0].ID+
		`", "flavorRef": "`+flavor+`", "networks": "none"}}`, http.StatusAccepted, &created, "OpenStack-API-Version", "compute 2.79")
	deadline := time.Now().Add(30 * time.Second)
	for {
		var s struct{ Server struct{ Status string } }
		a.call("GET", c.ComputeURL+"/servers/"+created.Server.ID, "", http.StatusOK, &s)
		if s.Server.Status == "ACTIVE" {
			return
		}
		if s.Server.Status == "ERROR" || time.Now().After(deadline) {
			t.Fatalf("server %s is %s", created.Server.ID, s.Server.Status)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestOperatorPagesAreAdminOnly: every operator page and form is 404 to a
// customer, and the pages open for the admin.
func TestOperatorPagesAreAdminOnly(t *testing.T) {
	c := startCloud(t)
	customer, operator := newWeb(t, c), newWeb(t, c)
	customer.login(demoLogin(c))
	operator.login(adminLogin(c))
	for _, tt := range []struct {
		method, path string
	}{
		{"GET", "/admin"}, {"GET", "/admin/hosts"}, {"GET", "/admin/prices"}, {"GET", "/admin/support"},
		{"POST", "/admin/prices"}, {"POST", "/admin/support"}, {"POST", "/admin/hosts/00000000-0000-0000-0000-000000000000/status"},
	} {
		t.Run(tt.method+" "+tt.path, func(t *testing.T) {
			var status int
			var body string
			if tt.method == "GET" {
				status, _, body = customer.get(tt.path)
			} else {
				status, _, body = customer.post("/servers", tt.path, url.Values{"status": {"disabled"}, "email": {"x@example.com"}}, true)
			}
			if status != http.StatusNotFound {
				t.Fatalf("customer %s %s: %d, want 404: %s", tt.method, tt.path, status, snippet(body))
			}
			if tt.method == "GET" {
				if status, _, body := operator.get(tt.path); status != http.StatusOK {
					t.Fatalf("admin %s: %d: %s", tt.path, status, snippet(body))
				}
			}
		})
	}
}

// TestOperatorPricesForm: rates are typed in money per hour and reach
// billing exactly in rate units; what is not a price, or what billing
// refuses, comes back as a message and changes nothing.
func TestOperatorPricesForm(t *testing.T) {
	c := startCloud(t)
	w := newWeb(t, c)
	w.login(adminLogin(c))
	a := newOpsAPI(t, c, cloud.AdminUser)
	vcpu := func() int64 {
		var p struct {
			Prices struct{ Hourly struct{ VCPU int64 } }
		}
		a.call("GET", c.BillingURL+"/v1/prices", "", http.StatusOK, &p)
		return p.Prices.Hourly.VCPU
	}
	for _, tt := range []struct {
		value   string
		want    int64  // the rate after, 0 for unchanged
		wantErr string // in the flash
	}{
		{"0.75", 750000, ""},
		{"0,5", 500000, ""},
		{"0.005", 5000, ""},
		{"1.0000001", 0, "at most 6 decimal places"},
		{"-1", 0, "write a price per hour"},
		{"one", 0, "write a price per hour"},
		{"20000", 0, "must be between 0 and 10000000000"}, // billing's own check
	} {
		t.Run(tt.value, func(t *testing.T) {
			before := vcpu()
			status, loc, body := w.post("/admin/prices", "/admin/prices", url.Values{"rate.vcpu": {tt.value}, "orig.vcpu": {"x"}}, true)
			if status != http.StatusSeeOther || loc != "/admin/prices" {
				t.Fatalf("post: %d %q %s", status, loc, snippet(body))
			}
			_, _, page := w.get("/admin/prices")
			got := vcpu()
			if tt.wantErr != "" {
				if got != before || !strings.Contains(page, "flash bad") || !strings.Contains(page, tt.wantErr) {
					t.Fatalf("rate %d (was %d), page lacks the error %q", got, before, tt.wantErr)
				}
				return
			}
			if got != tt.want || !strings.Contains(page, "The price list is saved.") {
				t.Fatalf("rate %d, want %d", got, tt.want)
			}
		})
	}

	// GPU models come and go: one is removed, a new one needs a price.
	gpus := func() map[string]int64 {
		var p struct {
			Prices struct {
				Hourly struct{ GPU map[string]int64 }
			}
		}
		a.call("GET", c.BillingURL+"/v1/prices", "", http.StatusOK, &p)
		return p.Prices.Hourly.GPU
	}
	for _, tt := range []struct {
		name    string
		form    url.Values
		check   func(map[string]int64) bool
		wantMsg string
	}{
		{"new without a price", url.Values{"new.gpu.name": {"H200"}}, func(g map[string]int64) bool { _, ok := g["H200"]; return !ok },
			"New rate: write a price per hour"},
		{"new", url.Values{"new.gpu.name": {"H200"}, "new.gpu.rate": {"300"}}, func(g map[string]int64) bool { return g["H200"] == 300_000_000 },
			"The price list is saved."},
		{"remove", url.Values{"remove.gpu:L4": {"1"}, "rate.gpu:L4": {"4.00"}, "orig.gpu:L4": {"4.00"}},
			func(g map[string]int64) bool { _, ok := g["L4"]; return !ok && g["H200"] != 0 }, "The price list is saved."},
		{"untouched", url.Values{"rate.vcpu": {"1.00"}, "orig.vcpu": {"1.00"}}, func(g map[string]int64) bool { return true }, "Nothing was changed."},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if status, _, body := w.post("/admin/prices", "/admin/prices", tt.form, true); status != http.StatusSeeOther {
				t.Fatalf("post: %d %s", status, snippet(body))
			}
			_, _, page := w.get("/admin/prices")
			if g := gpus(); !tt.check(g) || !strings.Contains(page, tt.wantMsg) {
				t.Fatalf("GPU rates %v; page lacks %q", g, tt.wantMsg)
			}
		})
	}
}

// TestOperatorSupportForm: contacts the panel refuses come back as a
// message in the operator's language and change nothing; those it takes
// are on /support for everyone.
func TestOperatorSupportForm(t *testing.T) {
	c := startCloud(t)
	w := newWeb(t, c)
	w.login(adminLogin(c))
	visitor := newWeb(t, c)
	for _, tt := range []struct {
		name, lang, email string
		wantFlash         string
	}{
		{"saved", "en", "help@example.net", "The support contacts are saved"},
		{"two lines", "en", "a@example.net\r\nb@example.net", "Each contact must be one line"},
		{"two lines in Russian", "ru", "a@example.net\nb@example.net", "Каждый контакт — одна строка"},
		{"too long", "en", strings.Repeat("x", 201) + "@example.net", "at most 200 characters"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			u, _ := url.Parse(c.PanelURL)
			w.hc.Jar.SetCookies(u, []*http.Cookie{{Name: "lang", Value: tt.lang, Path: "/"}})
			form := url.Values{"messenger": {"@nimbus"}, "email": {tt.email}, "phone": {"+1 555 0100"}, "hours": {"9-18"}}
			if status, loc, body := w.post("/admin/support", "/admin/support", form, true); status != http.StatusSeeOther || loc != "/admin/support" {
				t.Fatalf("post: %d %q %s", status, loc, snippet(body))
			}
			_, _, page := w.get("/admin/support")
			if !strings.Contains(page, tt.wantFlash) {
				t.Fatalf("/admin/support lacks %q: %s", tt.wantFlash, snippet(page[strings.Index(page, "<main"):]))
			}
			// Only the first, valid, set is on the public page.
			if _, _, support := visitor.get("/support"); !strings.Contains(support, "help@example.net") || strings.Contains(support, "a@example.net") {
				t.Fatalf("/support after %s: %s", tt.name, snippet(support[strings.Index(support, "<main"):]))
			}
		})
	}
}

// TestOperatorBrowser walks the operator's pages as the admin: the
// overview, the hosts with a GPU server's pCPUs and GPU, disabling and
// enabling a host, a price change seen by the API and a quote, and the
// support contacts shown on /support.
func TestOperatorBrowser(t *testing.T) {
	c := startCloud(t)
	opsGPUServer(t, c, "g.l4.x1")
	a := newOpsAPI(t, c, cloud.AdminUser)
	b := newBrowser(t, c)
	b.login(adminLogin(c))

	b.open("/admin")
	b.axe()
	for _, link := range []string{"/admin/hosts", "/admin/customers", "/admin/trials", "/admin/prices", "/admin/support"} {
		if n := get(b, "links", chromedp.Evaluate[int](`document.querySelectorAll('main a[href="`+link+`"]').length`)); n != 1 {
			t.Errorf("/admin links %s %d times", link, n)
		}
	}

	// Hosts: the GPU host holds the server's 8 pCPUs and its L4, of the
	// GPUs its agent reports.
	b.open("/admin/hosts")
	b.axe()
	b.shot("admin-hosts")
	gpuRow := `#hosts tr[data-host="fake-gpu-host-1"]`
	if got := b.text(gpuRow + ` td[data-col="pcpus"]`); got != "8 / 96" {
		t.Errorf("GPU host pCPUs %q, want 8 / 96", got)
	}
	if got := b.text(gpuRow + ` td[data-col="gpus"]`); got != "A100 80GB: 0 / 4 L4: 1 / 2" {
		t.Errorf("GPU host GPUs %q, want A100 80GB: 0 / 4 L4: 1 / 2", got)
	}
	if got := b.text(`#hosts tr[data-host="fake-host-1"] td[data-col="pcpus"]`); got != "0 / 64" {
		t.Errorf("fake-host-1 pCPUs %q, want 0 / 64", got)
	}
	if got := b.text("#fleet"); !strings.Contains(got, "8 / 352") || !strings.Contains(got, "L4: 1 / 2") || !strings.Contains(got, "5 / 5") {
		t.Errorf("fleet totals %q", got)
	}

	// Disable a host with a reason: the API says so; enable it again.
	row := `#hosts tr[data-host="fake-host-2"]`
	b.do("reason", chromedp.SendKeys(chromedp.CSS(row+` input[name="reason"]`), "memory test"))
	b.navigate("disable", chromedp.Submit(chromedp.CSS(row+` input[name="reason"]`)))
	if got := b.text(".flash.ok"); !strings.Contains(got, "fake-host-2 is disabled") {
		t.Fatalf("after disable the flash says %q", got)
	}
	service := func() (status, reason string) {
		var out struct {
			Services []struct {
				Status         string
				DisabledReason *string `json:"disabled_reason"`
			}
		}
		a.call("GET", c.ComputeURL+"/os-services?host=fake-host-2&binary=nova-compute", "", http.StatusOK, &out)
		if len(out.Services) != 1 {
			t.Fatalf("services of fake-host-2: %+v", out)
		}
		if r := out.Services[0].DisabledReason; r != nil {
			reason = *r
		}
		return out.Services[0].Status, reason
	}
	if st, reason := service(); st != "disabled" || reason != "memory test" {
		t.Fatalf("fake-host-2 after disable: %s %q", st, reason)
	}
	if got := b.text(row + " td:last-child"); !strings.Contains(got, "memory test") {
		t.Errorf("the disabled host's row says %q", got)
	}
	b.navigate("enable", chromedp.Submit(chromedp.CSS(row+` button`)))
	if st, _ := service(); st != "enabled" {
		t.Fatalf("fake-host-2 after enable: %s", st)
	}

	// Prices: a vCPU at 0.80 per hour is billing's rate and a quote's.
	b.open("/admin/prices")
	b.axe()
	b.shot("admin-prices")
	b.do("vcpu rate", chromedp.SetValue(chromedp.CSS(`input[name="rate.vcpu"]`), "0.80"),
		chromedp.SendKeys(chromedp.CSS(`input[name="new.gpu.name"]`), "H100"),
		chromedp.SendKeys(chromedp.CSS(`input[name="new.gpu.rate"]`), "250"))
	b.navigate("save prices", chromedp.Submit(chromedp.CSS(`input[name="rate.vcpu"]`)))
	if got := b.text(".flash.ok"); got != "The price list is saved." {
		t.Fatalf("after saving the flash says %q", got)
	}
	var prices struct {
		Prices struct {
			Hourly struct {
				VCPU int64
				GPU  map[string]int64
			}
		}
	}
	a.call("GET", c.BillingURL+"/v1/prices", "", http.StatusOK, &prices)
	if h := prices.Prices.Hourly; h.VCPU != 800000 || h.GPU["H100"] != 250_000_000 || h.GPU["L4"] == 0 {
		t.Fatalf("prices after saving: %+v", h)
	}
	var quote struct{ Quote struct{ Hourly int64 } }
	a.call("POST", c.BillingURL+"/v1/quotes", `{"quote": {"vcpus": 4}}`, http.StatusOK, &quote)
	if quote.Quote.Hourly != 320 {
		t.Fatalf("quote of 4 vCPU: %d minor units per hour, want 320", quote.Quote.Hourly)
	}
	if got := get(b, "vcpu field", chromedp.Value(chromedp.CSS(`input[name="rate.vcpu"]`))); got != "0.80" {
		t.Fatalf("the form shows vCPU at %q after saving", got)
	}

	// Support: the contacts saved here are the public page's; a
	// customer's request is listed.
	customer := newWeb(t, c)
	customer.login(demoLogin(c))
	if status, _, body := customer.post("/support", "/support/requests", url.Values{"body": {"Eight H100 in one server, please."}}, true); status != http.StatusSeeOther {
		t.Fatalf("config request: %d %s", status, snippet(body))
	}
	b.open("/admin/support")
	b.axe()
	for id, v := range map[string]string{"messenger": "https://t.me/nimbus_help", "email": "help@example.net", "phone": "+7 495 000-00-00", "hours": "24/7"} {
		b.do("fill "+id, chromedp.SetValue(chromedp.CSS("#"+id), v))
	}
	b.navigate("save support", chromedp.Submit(chromedp.CSS("#hours")))
	if got := b.text("#requests-h + p"); !strings.Contains(got, "1 open requests from 1 customers") {
		t.Fatalf("requests on /admin/support: %q", got)
	}
	b.open("/admin/support/customers")
	b.axe()
	b.shot("admin-support-customers")
	b.navigate("a customer's requests", chromedp.Click(chromedp.CSS(".support-groups tbody a")))
	b.axe()
	b.shot("admin-support-requests")
	if got := b.text("#support-requests"); !strings.Contains(got, "Eight H100 in one server, please.") {
		t.Fatalf("the customer's requests: %q", got)
	}
	b.navigate("close the request", chromedp.Click(chromedp.CSS("#support-requests button")))
	if loc := b.location(); !strings.HasPrefix(loc, "/admin/support/requests?") || !strings.Contains(loc, "project=") {
		t.Fatalf("closing went to %s, not back to the page", loc)
	}
	if got := b.text("#support-requests"); strings.Contains(got, "Eight H100") {
		t.Fatalf("a closed request is still in the open queue: %q", got)
	}
	b.open("/support")
	got := b.text("#contacts")
	for _, want := range []string{"https://t.me/nimbus_help", "help@example.net", "+7 495 000-00-00", "24/7"} {
		if !strings.Contains(got, want) {
			t.Errorf("/support shows %q, lacking %q", got, want)
		}
	}
}

// BenchmarkAdminHostsPage renders /admin/hosts for the default fleet and
// for 1,000 hosts (one in 20 with four GPUs), reporting the p95.
func BenchmarkAdminHostsPage(b *testing.B) {
	for _, n := range []int{5, 1000} {
		b.Run(fmt.Sprintf("hosts=%d", n), func(b *testing.B) {
			var opts []testenv.Options
			if n != 5 {
				opts = append(opts, func(cfg *cloud.Config) { cfg.Fleet = opsFleet(n) })
			}
			c := startCloud(b, opts...)
			w := newWeb(b, c)
			w.login(adminLogin(c))
			benchPage(b, w, c.PanelURL+"/admin/hosts", func(status int, body string) bool {
				return status == http.StatusOK && strings.Contains(body, `data-host=`)
			})
		})
	}
}

// opsFleet is n fake hosts, one in 20 with four L4 GPUs.
func opsFleet(n int) []driver.Host {
	var fleet []driver.Host
	for i := range n {
		h := driver.Host{Name: fmt.Sprintf("host-%04d", i), IP: fmt.Sprintf("10.%d.%d.1", i/250, i%250), MemoryMB: 256 * 1024,
			DiskGB: 4000, Zone: "nova", Hypervisor: "fake", Version: 1000, Up: true}
		fake.Topology(&h, 2, 17, 1)
		if i%20 == 0 {
			for g := range 4 {
				h.GPUs = append(h.GPUs, driver.GPU{Address: fmt.Sprintf("0000:%02x:00.0", 0x3b+g), Vendor: "NVIDIA", Model: "L4",
					VendorID: "10de", DeviceID: "27b8", IOMMUGroup: 30 + g, Driver: "vfio-pci"})
			}
		}
		fleet = append(fleet, h)
	}
	return fleet
}
