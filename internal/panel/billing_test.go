package panel_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"nimbus/internal/billing"
	"nimbus/internal/cloud"
	"nimbus/internal/testenv"
)

// bilMinor reads "1 234.50 RUB (≈ …)" as minor units.
func bilMinor(t testing.TB, s string) int64 {
	t.Helper()
	f := strings.Fields(s)
	if len(f) == 0 {
		t.Fatalf("no amount in %q", s)
	}
	v, err := strconv.ParseFloat(strings.TrimPrefix(f[0], "+"), 64)
	if err != nil {
		t.Fatalf("amount %q: %v", s, err)
	}
	if v < 0 {
		return int64(v*100 - 0.5)
	}
	return int64(v*100 + 0.5)
}

// bilFill sets a field's value (chromedp's SetValue cannot set "").
func bilFill(sel, v string) chromedp.Action[chromedp.Void] {
	if v == "" {
		return chromedp.Clear(chromedp.CSS(sel))
	}
	return chromedp.SetValue(chromedp.CSS(sel), v)
}

// bilProject is the project of user's token, from the billing API.
func bilProject(t testing.TB, c *cloud.Cloud, user string) string {
	t.Helper()
	resp, raw := testenv.Do(t, testenv.HTTPClient(t, c), "GET", c.BillingURL+"/v1/account", testenv.Token(t, c, user), "")
	testenv.MustStatus(t, resp, raw, http.StatusOK)
	var body struct {
		Account struct {
			ProjectID string `json:"project_id"`
		}
	}
	json.Unmarshal([]byte(raw), &body)
	return body.Account.ProjectID
}

// TestBrowserBilling: the demo customer tops up with the test card and
// sees it in the balance and the ledger; a declined card and an amount
// under the minimum are refused in the API's words; the customer asks for
// free test access, the operator approves it on the trials page, and the
// credit shows on the customer's billing page.
func TestBrowserBilling(t *testing.T) {
	c := startCloud(t)
	b := newBrowser(t, c)
	user, pw := demoLogin(c)
	b.login(user, pw)
	b.open("/billing")
	b.axe()
	before := bilMinor(t, b.text("#balance"))

	topup := func(amount, card string) {
		t.Helper()
		b.do("fill the top-up", bilFill("#amount", amount), bilFill("#card", card))
		b.navigate("top up "+amount, chromedp.Submit(chromedp.CSS("#amount")))
	}
	topup("100.00", "4242424242424242")
	if got := b.text(".flash.ok"); !strings.Contains(got, "100.00") {
		t.Fatalf("after the top-up the message says %q", got)
	}
	if got := bilMinor(t, b.text("#balance")); got-before != 10000 {
		t.Fatalf("the balance went from %d to %d, want +10000", before, got)
	}
	if row := b.text("#ledger-table tbody tr"); !strings.Contains(row, "Top-up") || !strings.Contains(row, "+100.00") {
		t.Fatalf("the ledger's newest row is %q", row)
	}
	b.shot("billing")

	for _, tt := range []struct{ amount, card, want string }{
		{"100", "4000000000000002", "declined"},
		{"100", "4000000000009995", "insufficient funds"},
		{"50", "", "under the minimum of 10000 minor units (100.00 RUB)"},
		{"ten", "", "Write the amount as a number"},
	} {
		topup(tt.amount, tt.card)
		if got := b.text(".flash.bad"); !strings.Contains(got, tt.want) {
			t.Errorf("top-up %s with %q: the message says %q, want %q", tt.amount, tt.card, got, tt.want)
		}
	}
	if got := bilMinor(t, b.text("#balance")); got-before != 10000 {
		t.Fatalf("refused top-ups changed the balance: %d → %d", before, got)
	}

	b.do("describe the trial", chromedp.SetValue(chromedp.CSS("#trial-description"), "Benchmark a GPU training job for a week"))
	b.navigate("request a trial", chromedp.Submit(chromedp.CSS("#trial-description")))
	if got := b.text("#trial .trial-status"); got != "pending" {
		t.Fatalf("the trial is %q after the request", got)
	}

	signOut := func() {
		t.Helper()
		b.navigate("sign out", chromedp.Click(chromedp.CSS(".who form button")))
	}
	signOut()
	b.login(adminLogin(c))
	b.open("/admin/trials")
	b.axe()
	if got := b.text("article.bil-trial .bil-desc"); !strings.Contains(got, "GPU training job") {
		t.Fatalf("the pending request reads %q", got)
	}
	b.do("fill the credit", chromedp.SetValue(chromedp.CSS("article.bil-trial input[name=credit]"), "500"))
	b.navigate("approve", chromedp.Submit(chromedp.CSS("article.bil-trial input[name=credit]")))
	if got := b.text(".flash.ok"); !strings.Contains(got, "approved") {
		t.Fatalf("approving says %q", got)
	}
	b.open("/admin/customers")
	b.axe()
	b.shot("admin-customers")
	b.open("/admin/customers/" + bilProject(t, c, cloud.DemoUser))
	b.axe()
	signOut()

	b.login(user, pw)
	b.open("/billing")
	if got := bilMinor(t, b.text("#trial-credit")); got != 50000 {
		t.Fatalf("the free test credit shows %d, want 50000", got)
	}
	if got := bilMinor(t, b.text("#balance")); got-before != 60000 {
		t.Fatalf("the balance went from %d to %d, want +60000 (top-up and trial)", before, got)
	}
	if got := b.text("#trial .trial-status"); got != "approved" {
		t.Fatalf("the trial is %q after approval", got)
	}
	b.open("/support")
	b.axe()
}

// bilClock is billing's injected clock, moved by the test.
type bilClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *bilClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *bilClock) add(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
	return c.t
}

// TestBanners: an account whose balance lasts less than 24 hours at its
// spend is warned on every page; one below its credit limit is told its
// servers are shelved; a top-up ends the warning.
func TestBanners(t *testing.T) {
	clk := &bilClock{t: time.Now().UTC()}
	c := startCloud(t, func(cfg *cloud.Config) {
		cfg.Billing.Now = clk.now
		cfg.Billing.DefaultCreditLimit = 0
	})
	ctx := context.Background()
	hc := testenv.HTTPClient(t, c)
	demo := testenv.Token(t, c, cloud.DemoUser)
	project := bilProject(t, c, cloud.DemoUser)
	do := func(method, url, body string, want int, hdr ...string) string {
		t.Helper()
		resp, raw := testenv.Do(t, hc, method, url, demo, body, hdr...)
		testenv.MustStatus(t, resp, raw, want)
		return raw
	}
	do("POST", c.BillingURL+"/v1/topups", `{"topup": {"amount": 10000, "provider": "test"}}`, http.StatusCreated)
	image, flavor := bilServer(t, c, hc, demo)
	raw := do("POST", c.ComputeURL+"/servers", `{"server": {"name": "dry", "imageRef": "`+image+`", "flavorRef": "`+flavor+`", "networks": "none"}}`,
		http.StatusAccepted, "OpenStack-API-Version", "compute 2.79")
	var created struct{ Server struct{ ID string } }
	json.Unmarshal([]byte(raw), &created)
	bilWaitActive(t, c, hc, demo, created.Server.ID)

	banner := func() string {
		t.Helper()
		// A new session each time: a session reuses its banners for a
		// few seconds.
		w := newWeb(t, c)
		w.login(demoLogin(c))
		status, _, body := w.get("/servers")
		if status != http.StatusOK {
			t.Fatalf("/servers: %d", status)
		}
		i := strings.Index(body, `class="banner`)
		if i < 0 {
			return ""
		}
		j := strings.Index(body[i:], "</div>")
		return body[i : i+j]
	}
	if got := banner(); got != "" {
		t.Fatalf("a funded account has a banner: %s", got)
	}

	// The whole balance but a few hours' spend goes: billing's pass warns.
	acc, err := c.Billing.Account(ctx, project)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Billing.Adjust(ctx, project, -(acc.Balance - 300), "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Billing.ChargeUntil(ctx, clk.add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if got := banner(); !strings.Contains(got, "less than 24 hours") || !strings.Contains(got, "banner warn") {
		t.Fatalf("the running-dry banner is %q", got)
	}

	// The billing page shows the server's usage, and a chart whose days
	// add up to the month's total.
	w := newWeb(t, c)
	w.login(demoLogin(c))
	status, _, page := w.get("/billing")
	if status != http.StatusOK || !strings.Contains(page, `<th scope="row">dry</th>`) {
		t.Fatalf("the usage does not name the server: %d %s", status, snippet(page))
	}
	total := regexp.MustCompile(`id="usage-total">([^<]+)<`).FindStringSubmatch(page)
	title := regexp.MustCompile(`Daily spend in \d{4}-\d\d: ([^<]+?) in all`).FindStringSubmatch(page)
	if total == nil || title == nil || total[1] != title[1] || bilMinor(t, total[1]) <= 0 {
		t.Fatalf("the month's total %q and the chart's %q differ", total, title)
	}
	if !regexp.MustCompile(`<rect x="\d+" y="\d+" width="\d+" height="[1-9]\d*"`).MatchString(page) {
		t.Fatal("the chart has no bar")
	}

	// A payment that lasts past 72 hours ends the warning at once, before
	// billing's next pass.
	do("POST", c.BillingURL+"/v1/topups", `{"topup": {"amount": 10000, "provider": "test"}}`, http.StatusCreated)
	if got := banner(); got != "" {
		t.Fatalf("after a top-up the warning is %q", got)
	}

	// Below the credit limit: the pass shelves, the banner says so.
	if acc, err = c.Billing.Account(ctx, project); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Billing.Adjust(ctx, project, -(acc.Balance + 100), "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Billing.ChargeUntil(ctx, clk.add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if got := banner(); !strings.Contains(got, "shelved") || !strings.Contains(got, "banner danger") {
		t.Fatalf("the suspended banner is %q", got)
	}

	// A top-up past the limit ends it.
	do("POST", c.BillingURL+"/v1/topups", `{"topup": {"amount": 1000000, "provider": "test"}}`, http.StatusCreated)
	if got := banner(); got != "" {
		t.Fatalf("after a top-up the banner is %q", got)
	}
}

// bilServer is the public image needing the least RAM and the smallest
// flavor without a GPU that fits it.
func bilServer(t *testing.T, c *cloud.Cloud, hc *http.Client, token string) (string, string) {
	t.Helper()
	resp, raw := testenv.Do(t, hc, "GET", c.ImageURL+"/v2/images?visibility=public", token, "")
	testenv.MustStatus(t, resp, raw, http.StatusOK)
	var images struct {
		Images []struct {
			ID      string
			MinRAM  int `json:"min_ram"`
			MinDisk int `json:"min_disk"`
		}
	}
	if err := json.Unmarshal([]byte(raw), &images); err != nil || len(images.Images) == 0 {
		t.Fatalf("images: %s", raw)
	}
	im := images.Images[0]
	for _, x := range images.Images {
		if x.MinRAM < im.MinRAM {
			im = x
		}
	}
	resp, raw = testenv.Do(t, hc, "GET", c.ComputeURL+"/flavors/detail", token, "", "OpenStack-API-Version", "compute 2.79")
	testenv.MustStatus(t, resp, raw, http.StatusOK)
	var flavors struct {
		Flavors []struct {
			ID         string
			RAM, Disk  int
			VCPUs      int
			ExtraSpecs map[string]string `json:"extra_specs"`
		}
	}
	json.Unmarshal([]byte(raw), &flavors)
	best := -1
	for i, f := range flavors.Flavors {
		if f.RAM < im.MinRAM || f.Disk < im.MinDisk || f.ExtraSpecs["nimbus:gpu_model"] != "" {
			continue
		}
		if best < 0 || f.RAM < flavors.Flavors[best].RAM || (f.RAM == flavors.Flavors[best].RAM && f.VCPUs < flavors.Flavors[best].VCPUs) {
			best = i
		}
	}
	if best < 0 {
		t.Fatal("no flavor fits the image")
	}
	return im.ID, flavors.Flavors[best].ID
}

func bilWaitActive(t *testing.T, c *cloud.Cloud, hc *http.Client, token, id string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		_, raw := testenv.Do(t, hc, "GET", c.ComputeURL+"/servers/"+id, token, "")
		if strings.Contains(raw, `"status": "ACTIVE"`) || strings.Contains(raw, `"status":"ACTIVE"`) {
			return
		}
	}
	t.Fatalf("server %s never ACTIVE", id)
}

// TestBillingLedgerPages: the ledger shows 20 rows a page, older and newer
// pages by their links, and a month's usage by its link.
func TestBillingLedgerPages(t *testing.T) {
	c := startCloud(t)
	ctx := context.Background()
	project := bilProject(t, c, cloud.DemoUser)
	for i := 1; i <= 25; i++ {
		if _, err := c.Billing.Adjust(ctx, project, int64(i), fmt.Sprintf("adj-%02d", i)); err != nil {
			t.Fatal(err)
		}
	}
	w := newWeb(t, c)
	w.login(demoLogin(c))
	link := func(page, rel string) string {
		t.Helper()
		m := regexp.MustCompile(`href="([^"]*)" rel="` + rel + `"`).FindStringSubmatch(page)
		if m == nil {
			return ""
		}
		return "/billing" + html.UnescapeString(m[1])
	}
	refs := func(page string) []string { return regexp.MustCompile(`adj-\d\d`).FindAllString(page, -1) }
	_, _, first := w.get("/billing")
	if got := refs(first); len(got) != 20 || got[0] != "adj-25" || got[19] != "adj-06" {
		t.Fatalf("the first page holds %v", got)
	}
	if link(first, "prev") != "" {
		t.Fatal("the first page links to a newer one")
	}
	status, _, second := w.get(link(first, "next"))
	if got := refs(second); status != http.StatusOK || len(got) != 5 || got[0] != "adj-05" || got[4] != "adj-01" {
		t.Fatalf("the second page (%d) holds %v", status, got)
	}
	if link(second, "next") != "" {
		t.Fatal("the last page links to an older one")
	}
	if _, _, back := w.get(link(second, "prev")); !slices.Equal(refs(back), refs(first)) {
		t.Fatalf("newer from the second page holds %v", refs(back))
	}
	for path, want := range map[string]int{"/billing?month=2020-01": http.StatusOK, "/billing?month=jan": http.StatusBadRequest,
		"/billing?ledger=nope": http.StatusBadRequest} {
		if status, _, body := w.get(path); status != want {
			t.Errorf("GET %s: %d, want %d: %s", path, status, want, snippet(body))
		}
	}
}

// TestBillingWebhookTopup: a payment the provider confirms later is shown
// pending, and credited once its signed webhook arrives.
func TestBillingWebhookTopup(t *testing.T) {
	c := startCloud(t, func(cfg *cloud.Config) { cfg.Billing.WebhookSecrets = map[string]string{"webhook-test": "s3cret"} })
	w := newWeb(t, c)
	w.login(demoLogin(c))
	status, loc, body := w.post("/billing", "/billing/topups", url.Values{"amount": {"150"}, "provider": {"webhook-test"}}, true)
	if status != http.StatusSeeOther || !strings.HasPrefix(loc, "/billing?topup=") {
		t.Fatalf("top-up: %d %q %s", status, loc, snippet(body))
	}
	if got := flashOf(t, w); !strings.Contains(got, "pending") {
		t.Fatalf("the message is %q", got)
	}
	id := strings.TrimSuffix(strings.TrimPrefix(loc, "/billing?topup="), "#topup")
	if _, _, page := w.get(loc); !strings.Contains(page, `id="topup-status"`) || !strings.Contains(page, "150.00 RUB (≈ 1.65 USD): pending") {
		t.Fatalf("the pending top-up is not shown: %s", snippet(page))
	}
	hook := []byte(`{"event": {"topup_id": "` + id + `", "status": "succeeded"}}`)
	req, _ := http.NewRequest("POST", c.BillingURL+"/v1/webhooks/webhook-test", bytes.NewReader(hook))
	req.Header.Set(billing.SignatureHeader, billing.SignWebhook("s3cret", hook, time.Now()))
	resp, err := testenv.HTTPClient(t, c).Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("webhook: %v %v", resp, err)
	}
	resp.Body.Close()
	_, _, page := w.get(loc)
	if !strings.Contains(page, "150.00 RUB (≈ 1.65 USD): succeeded") || !strings.Contains(page, `id="balance" class="">150.00 RUB`) {
		t.Fatalf("the confirmed top-up is not credited: %s", snippet(page))
	}
}

// TestBillingTerms: a prepaid term is listed with its server's name, and
// its renewal choices are changed through the API.
func TestBillingTerms(t *testing.T) {
	c := startCloud(t)
	hc := testenv.HTTPClient(t, c)
	demo := testenv.Token(t, c, cloud.DemoUser)
	do := func(method, url, body string, want int, hdr ...string) string {
		t.Helper()
		resp, raw := testenv.Do(t, hc, method, url, demo, body, hdr...)
		testenv.MustStatus(t, resp, raw, want)
		return raw
	}
	do("POST", c.BillingURL+"/v1/topups", `{"topup": {"amount": 10000000, "provider": "test"}}`, http.StatusCreated)
	image, flavor := bilServer(t, c, hc, demo)
	raw := do("POST", c.ComputeURL+"/servers", `{"server": {"name": "rented", "imageRef": "`+image+`", "flavorRef": "`+flavor+`", "networks": "none"}}`,
		http.StatusAccepted, "OpenStack-API-Version", "compute 2.79")
	var created struct{ Server struct{ ID string } }
	json.Unmarshal([]byte(raw), &created)
	bilWaitActive(t, c, hc, demo, created.Server.ID)
	raw = do("POST", c.BillingURL+"/v1/terms", `{"term": {"server_id": "`+created.Server.ID+`", "months": 1}}`, http.StatusCreated)
	var term struct{ Term struct{ ID string } }
	json.Unmarshal([]byte(raw), &term)

	w := newWeb(t, c)
	w.login(demoLogin(c))
	if _, _, page := w.get("/billing"); !strings.Contains(page, `<th scope="row">rented</th>`) || !strings.Contains(page, `action="/billing/terms/`+term.Term.ID+`"`) {
		t.Fatalf("the term is not listed with its form: %s", snippet(page))
	}
	for _, tt := range []struct {
		form      url.Values
		wantFlash string
		renew     bool
		onEnd     string
	}{
		{url.Values{"auto_renew": {"on"}, "on_end": {"shelve"}}, "renewal is saved", true, "shelve"},
		{url.Values{"on_end": {"delete"}}, "Choose what happens", true, "shelve"},
		{url.Values{"on_end": {"hourly"}}, "renewal is saved", false, "hourly"},
	} {
		if status, _, body := w.post("/billing", "/billing/terms/"+term.Term.ID, tt.form, true); status != http.StatusSeeOther {
			t.Fatalf("%v: %d %s", tt.form, status, snippet(body))
		}
		if got := flashOf(t, w); !strings.Contains(got, tt.wantFlash) {
			t.Fatalf("%v: the message is %q", tt.form, got)
		}
		var terms struct {
			Terms []struct {
				AutoRenew bool   `json:"auto_renew"`
				OnEnd     string `json:"on_end"`
			}
		}
		json.Unmarshal([]byte(do("GET", c.BillingURL+"/v1/terms", "", http.StatusOK)), &terms)
		if len(terms.Terms) != 1 || terms.Terms[0].AutoRenew != tt.renew || terms.Terms[0].OnEnd != tt.onEnd {
			t.Fatalf("%v: terms %+v", tt.form, terms.Terms)
		}
	}
	if status, _, _ := w.post("/billing", "/billing/terms/no-such-term", url.Values{"on_end": {"hourly"}}, true); status != http.StatusSeeOther {
		t.Fatalf("an unknown term: %d", status)
	}
	if got := flashOf(t, w); !strings.Contains(got, "could not be found") {
		t.Fatalf("an unknown term: the message is %q", got)
	}
}

// TestBillingChargeLines: each charge in the ledger says what it was for —
// the kind of resource, its name and id, and the hour — and the usage
// table names a resource that is gone by the name it was charged under.
func TestBillingChargeLines(t *testing.T) {
	c := startCloud(t)
	ctx := context.Background()
	pc := testenv.Provider(t, c, cloud.DemoUser)
	hc := testenv.HTTPClient(t, c)
	tok := testenv.Token(t, c, cloud.DemoUser)
	resp, raw := testenv.Do(t, hc, "POST", c.ComputeURL+"/servers", tok, `{"server": {"name": "ledger-web", "imageRef": "`+
		imageID(t, c, pc, "Debian 12")+`", "flavorRef": "d1.2g.local", "networks": "none"}}`, "OpenStack-API-Version", "compute 2.79")
	testenv.MustStatus(t, resp, raw, http.StatusAccepted)
	var created struct{ Server struct{ ID string } }
	json.Unmarshal([]byte(raw), &created)
	id := created.Server.ID
	testenv.Eventually(t, 30*time.Second, "server placed", func() bool {
		resp, raw := testenv.Do(t, hc, "GET", c.ComputeURL+"/servers/"+id, tok, "")
		return resp.StatusCode == http.StatusOK && strings.Contains(raw, `"ACTIVE"`)
	})
	if _, err := c.Billing.ChargeUntil(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	w := newWeb(t, c)
	w.login(demoLogin(c))
	_, _, page := w.get("/billing")
	line := regexp.MustCompile(`Server «ledger-web» <code>` + id + `</code>, the hour from \d`)
	if !line.MatchString(page) {
		t.Fatalf("no charge line naming the server in the ledger: %s", snippet(page))
	}
	// Gone, it is still named in the month's usage.
	resp, raw = testenv.Do(t, hc, "DELETE", c.ComputeURL+"/servers/"+id, tok, "")
	testenv.MustStatus(t, resp, raw, http.StatusNoContent)
	testenv.Eventually(t, 30*time.Second, "server gone", func() bool {
		resp, _ := testenv.Do(t, hc, "GET", c.ComputeURL+"/servers/"+id, tok, "")
		return resp.StatusCode == http.StatusNotFound
	})
	_, _, page = w.get("/billing")
	if !strings.Contains(page, `ledger-web <code>`+id+`</code></th>`) {
		t.Fatalf("the usage table does not name the deleted server: %s", snippet(page))
	}
}
