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
	"nimbus/internal/testenv"
)

// apiQuote asks POST /v1/quotes as the demo customer: the price the panel
// must show.
func apiQuote(t *testing.T, c *cloud.Cloud, body string) (hourly, total int64) {
	t.Helper()
	tok := testenv.Token(t, c, cloud.DemoUser)
	resp, raw := testenv.Do(t, testenv.HTTPClient(t, c), "POST", c.BillingURL+"/v1/quotes", tok, body)
	testenv.MustStatus(t, resp, raw, http.StatusOK)
	var out struct {
		Quote struct{ Hourly, Total int64 } `json:"quote"`
	}
	if err := json.Unmarshal([]byte(raw), &out); err != nil {
		t.Fatal(err)
	}
	return out.Quote.Hourly, out.Quote.Total
}

type quoteAnswer struct {
	Hourly      string   `json:"hourly"`
	HourlyMinor int64    `json:"hourly_minor"`
	TotalMinor  int64    `json:"total_minor"`
	Problems    []string `json:"problems"`
}

func (w *web) quote(form url.Values) quoteAnswer {
	w.t.Helper()
	status, _, body := w.post("/configure", "/configure/quote", form, true)
	var a quoteAnswer
	if status != http.StatusOK || json.Unmarshal([]byte(body), &a) != nil {
		w.t.Fatalf("quote %v: %d %s", form, status, snippet(body))
	}
	return a
}

// choiceForm is a configurator form: 2 vCPU, 4 GB, 40 GB local disk,
// public IPv4, Ubuntu, changed by kv pairs.
func choiceForm(kv ...string) url.Values {
	f := url.Values{"vcpus": {"2"}, "ram_gb": {"4"}, "disk_type": {"local"}, "disk_gb": {"40"}, "ipv4": {"yes"},
		"image": {"Ubuntu 24.04"}, "quantity": {"1"}, "tariff": {"hourly"}, "name": {"web"}, "key_mode": {"generate"}}
	for i := 0; i+1 < len(kv); i += 2 {
		f.Set(kv[i], kv[i+1])
	}
	return f
}

// TestConfigurePrices: the price the configurator shows is billing's quote
// of the same choice, for visitors and members; what will not work is
// said; a visitor's order goes to sign-up with the choice kept; a member's
// order makes the project its own flavor of the size, and the servers.
func TestConfigurePrices(t *testing.T) {
	c := startCloud(t)
	user, pw := demoLogin(c)
	visitor, member := newWeb(t, c), newWeb(t, c)
	member.login(user, pw)

	for _, page := range []string{"/prices", "/configure"} {
		if status, _, body := visitor.get(page); status != http.StatusOK || !strings.Contains(body, "A100 80GB") {
			t.Fatalf("%s: %d %s", page, status, snippet(body))
		}
	}
	tests := []struct {
		name     string
		form     url.Values
		api      string // the same choice for POST /v1/quotes
		problems []string
		quota    []string // a member's besides: the demo quota is Nova's default
	}{
		{"catalogue size", choiceForm(), `{"quote":{"vcpus":2,"ram_gb":4,"disk_type":"local","disk_gb":40,"public_ipv4":true,"quantity":1,"tariff":"hourly"}}`, nil, nil},
		{"GPUs, three", choiceForm("gpu_model", "L4", "gpu_count", "2", "quantity", "3", "vcpus", "8", "ram_gb", "32"),
			`{"quote":{"vcpus":8,"ram_gb":32,"disk_type":"local","disk_gb":40,"gpu_model":"L4","gpu_count":2,"public_ipv4":true,"quantity":3,"tariff":"hourly"}}`,
			[]string{"Only 1 of 3 fit right now: then no host has 2 free L4 GPUs."},
			[]string{"Over quota: 24 vCPUs wanted, 0 of 20 in use.", "Over quota: 98304 MB of RAM wanted, 0 of 51200 in use.", raiseQuota}},
		{"windows prepaid", choiceForm("image", "Windows Server 2022", "tariff", "prepaid", "term_months", "3", "disk_type", "network"),
			`{"quote":{"vcpus":2,"ram_gb":4,"disk_type":"network","disk_gb":40,"public_ipv4":true,"os_type":"windows","quantity":1,"tariff":"prepaid","term_months":3}}`, nil, nil},
		{"more vCPUs than any host", choiceForm("vcpus", "500"), `{"quote":{"vcpus":500,"ram_gb":4,"disk_type":"local","disk_gb":40,"public_ipv4":true,"quantity":1}}`,
			[]string{"Invalid vCPU count 500: it must be 1 to 96."}, []string{"Over quota: 500 vCPUs wanted, 0 of 20 in use.", raiseQuota}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hourly, total := apiQuote(t, c, tt.api)
			for who, w := range map[string]*web{"visitor": visitor, "member": member} {
				a := member.quote(tt.form)
				if who == "visitor" {
					a = w.quote(tt.form)
				}
				if a.HourlyMinor != hourly || a.TotalMinor != total || a.Hourly == "" {
					t.Errorf("%s: panel quote %+v, API %d/%d", who, a, hourly, total)
				}
				want := tt.problems
				if who == "member" {
					want = append(append([]string{}, want...), tt.quota...)
				}
				if strings.Join(a.Problems, "|") != strings.Join(want, "|") {
					t.Errorf("%s: problems %q, want %q", who, a.Problems, want)
				}
			}
		})
	}

	// A visitor's order goes to sign-up and keeps the choice.
	status, loc, _ := visitor.post("/configure", "/configure/order", choiceForm("vcpus", "4", "ram_gb", "8"), true)
	next, _ := url.Parse(loc)
	back, _ := url.Parse(next.Query().Get("next"))
	if status != http.StatusSeeOther || next.Path != "/signup" || back.Path != "/configure" || back.Query().Get("vcpus") != "4" || back.Query().Get("ram_gb") != "8" {
		t.Fatalf("visitor order: %d %s", status, loc)
	}
	if status, _, body := visitor.get(next.Query().Get("next")); status != http.StatusOK || !strings.Contains(body, `name="vcpus" type="number" min="1" max="96" value="4"`) {
		t.Fatalf("the kept choice: %d %s", status, snippet(body))
	}

	// A member orders two servers of a new size with a generated key.
	status, _, body := member.post("/configure", "/configure/order", choiceForm("vcpus", "3", "ram_gb", "6", "disk_gb", "60", "quantity", "2"), true)
	if status != http.StatusOK || !strings.Contains(body, "OPENSSH PRIVATE KEY") {
		t.Fatalf("order: %d %s", status, snippet(body))
	}
	tok := testenv.Token(t, c, cloud.DemoUser)
	resp, raw := testenv.Do(t, testenv.HTTPClient(t, c), "GET", c.ComputeURL+"/servers/detail?name=web", tok, "")
	testenv.MustStatus(t, resp, raw, http.StatusOK)
	var list struct {
		Servers []struct {
			Name   string `json:"name"`
			Flavor struct {
				ID string `json:"id"`
			} `json:"flavor"`
			KeyName string `json:"key_name"`
		} `json:"servers"`
	}
	if err := json.Unmarshal([]byte(raw), &list); err != nil {
		t.Fatal(err)
	}
	// The size is no catalogue flavor's: the project got its own.
	if len(list.Servers) != 2 || list.Servers[0].Flavor.ID != "d3.6g.local.ipv4."+bilProject(t, c, cloud.DemoUser) || list.Servers[0].KeyName == "" {
		t.Fatalf("servers after the order: %+v", list.Servers)
	}

	// A prepaid Windows server: its term is bought with it.
	status, loc, body = member.post("/configure", "/configure/order", choiceForm("image", "Windows Server 2022", "name", "win",
		"tariff", "prepaid", "term_months", "3", "admin_pass", "Sup3r-secret-pass"), true)
	if status != http.StatusSeeOther || loc != "/servers" {
		t.Fatalf("prepaid order: %d %s %s", status, loc, snippet(body))
	}
	resp, raw = testenv.Do(t, testenv.HTTPClient(t, c), "GET", c.BillingURL+"/v1/terms", tok, "")
	testenv.MustStatus(t, resp, raw, http.StatusOK)
	var terms struct {
		Terms []struct {
			Months int `json:"months"`
		} `json:"terms"`
	}
	if err := json.Unmarshal([]byte(raw), &terms); err != nil || len(terms.Terms) != 1 || terms.Terms[0].Months != 3 {
		t.Fatalf("terms after a prepaid order: %s", snippet(raw))
	}
}

// TestBrowserConfigure: the configurator in a browser: the price is the
// API's, it follows a change live, a GPU count no host has says so, and
// the order lands on the servers page.
func TestBrowserConfigure(t *testing.T) {
	c := startCloud(t)
	b := newBrowser(t, c)
	b.open("/prices")
	b.axe()
	b.shot("prices")
	// A visitor configures and orders: sign up (or in) first, and back to
	// the same choice.
	b.open("/configure")
	b.do("4 vCPU", chromedp.SetValue(chromedp.CSS("#c-vcpus"), "4"))
	b.navigate("order as a visitor", chromedp.Click(chromedp.CSS("#order")))
	loc, _ := url.Parse(b.location())
	next := loc.Query().Get("next")
	if loc.Path != "/signup" || !strings.HasPrefix(next, "/configure?") {
		t.Fatalf("a visitor's order went to %s", b.location())
	}
	user, pw := demoLogin(c)
	b.open("/login?next=" + url.QueryEscape(next))
	b.do("fill sign-in", chromedp.SendKeys(chromedp.CSS("#email"), user), chromedp.SendKeys(chromedp.CSS("#password"), pw))
	b.navigate("sign in", chromedp.Submit(chromedp.CSS("#password")))
	if got := get(b, "vCPUs kept", chromedp.Value(chromedp.CSS("#c-vcpus"))); got != "4" || !strings.HasPrefix(b.location(), "/configure?") {
		t.Fatalf("after signing in: %s with %s vCPUs", b.location(), got)
	}
	b.open("/configure")
	b.axe()
	b.shot("configure")
	hourly, _ := apiQuote(t, c, `{"quote":{"vcpus":2,"ram_gb":4,"disk_type":"local","disk_gb":40,"public_ipv4":false,"quantity":1}}`)
	first := b.text("#p-hourly")
	if !strings.Contains(first, minorText(hourly)) {
		t.Fatalf("shown %q, API hourly %d", first, hourly)
	}
	b.do("tick IPv4, 8 vCPU", chromedp.Click(chromedp.CSS(`input[name=ipv4]`)),
		chromedp.SetValue(chromedp.CSS("#c-vcpus"), "8"), chromedp.SendKeys(chromedp.CSS("#c-vcpus"), "\t"))
	want, _ := apiQuote(t, c, `{"quote":{"vcpus":8,"ram_gb":4,"disk_type":"local","disk_gb":40,"public_ipv4":true,"quantity":1}}`)
	waitText(b, "#p-hourly", minorText(want))
	b.do("choose 4 A100 twice", chromedp.SetValue(chromedp.CSS("#c-gpu"), "A100 80GB"), chromedp.SetValue(chromedp.CSS("#c-gpu-count"), "4"),
		chromedp.SetValue(chromedp.CSS("#c-qty"), "2"), chromedp.SendKeys(chromedp.CSS("#c-qty"), "\t"))
	waitText(b, "#problems", "no host has 4 free A100 80GB GPUs")
	b.do("one A100", chromedp.SetValue(chromedp.CSS("#c-gpu-count"), "1"), chromedp.SetValue(chromedp.CSS("#c-qty"), "1"),
		chromedp.SetValue(chromedp.CSS("#c-key-mode"), "generate"), chromedp.SendKeys(chromedp.CSS("#c-qty"), "\t"))
	b.navigate("order", chromedp.Click(chromedp.CSS("#order")))
	if !strings.Contains(b.text("#private-key"), "OPENSSH PRIVATE KEY") {
		t.Fatal("no private key after ordering")
	}
	b.navigate("to servers", chromedp.Click(chromedp.CSS("main a.button.primary")))
	if loc := b.location(); loc != "/servers" {
		t.Fatalf("after the order at %s", loc)
	}
}

// minorText is how money shows minor units: the major part and two
// digits.
func minorText(n int64) string { return fmt.Sprintf("%d.%02d", n/100, n%100) }

// waitText waits until the element's text contains want.
func waitText(b *browser, sel, want string) {
	b.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	got := ""
	for time.Now().Before(deadline) {
		if got = b.text(sel); strings.Contains(got, want) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	b.t.Fatalf("%s says %q, want %q", sel, got, want)
}

// raiseQuota is what the configurator adds to a quota problem.
const raiseQuota = "Your quota can be raised: ask on the Support page, saying what you want to run."
