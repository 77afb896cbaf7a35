package panel_test

import (
	"encoding/json"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"nimbus/internal/cloud"
	"nimbus/internal/testenv"
)

// priceRows reads the price list's table as text, a row per item.
func (b *browser) priceRows() [][]string {
	b.t.Helper()
	return get(b, "price rows", chromedp.Evaluate[[][]string](
		`Array.from(document.querySelectorAll("main table tbody tr")).map(tr => Array.from(tr.cells).map(c => c.textContent.trim()))`))
}

// TestBrowserPricesSignedIn (issue 27): a signed-in customer sees the
// visitor's price list, every row of it and no rate of zero, and rates
// at their real precision (local disk 0.005 an hour, 3.60 a month).
func TestBrowserPricesSignedIn(t *testing.T) {
	c := startCloud(t)
	b := newBrowser(t, c)
	b.open("/prices")
	visitor := b.priceRows()
	b.login(demoLogin(c))
	b.open("/prices")
	member := b.priceRows()
	b.axe()
	if !slices.EqualFunc(member, visitor, slices.Equal[[]string]) {
		t.Errorf("signed in, the price list is\n%q\nas a visitor\n%q", member, visitor)
	}
	items := map[string][]string{}
	for _, r := range member {
		if len(r) != 4 {
			t.Fatalf("row %q", r)
		}
		items[r[0]] = r
		if strings.HasPrefix(r[2], "0.00 ") || strings.HasPrefix(r[3], "0.00 ") {
			t.Errorf("row %q shows a rate of zero", r)
		}
	}
	for _, want := range []string{"vCPU (dedicated)", "RAM", "Boot disk: local", "Boot disk: network", "GPU A100 80GB", "GPU L4",
		"Public IPv4 address", "Volume", "Backup", "Image"} {
		if items[want] == nil {
			t.Errorf("no row %q in %q", want, member)
		}
	}
	if r := items["Boot disk: local"]; r != nil && (!strings.HasPrefix(r[2], "0.005 RUB") || !strings.HasPrefix(r[3], "3.60 RUB")) {
		t.Errorf("local disk reads %q, want 0.005 an hour and 3.60 a month", r)
	}
	if r := items["vCPU (dedicated)"]; r != nil && (!strings.HasPrefix(r[2], "0.50 RUB") || !strings.HasPrefix(r[3], "360.00 RUB")) {
		t.Errorf("a vCPU reads %q, want 0.50 an hour and 360.00 a month", r)
	}
}

// TestBrowserOrderPrepaid (issue 27): a signed-in customer chooses a
// prepaid term in the configurator, sees billing's price of it, and the
// order rents the server for the term.
func TestBrowserOrderPrepaid(t *testing.T) {
	c := startCloud(t)
	b := newBrowser(t, c)
	b.login(demoLogin(c))
	b.open("/configure")
	b.do("prepaid for 3 months", chromedp.SetValue(chromedp.CSS("#c-tariff"), "prepaid"), chromedp.SetValue(chromedp.CSS("#c-term"), "3"),
		chromedp.SetValue(chromedp.CSS("#c-key-mode"), "generate"), chromedp.SetValue(chromedp.CSS("#c-name"), "rented"),
		chromedp.SendKeys(chromedp.CSS("#c-qty"), "\t"))
	_, total := apiQuote(t, c, `{"quote":{"vcpus":2,"ram_gb":4,"disk_type":"local","disk_gb":40,"public_ipv4":false,"quantity":1,"tariff":"prepaid","term_months":3}}`)
	waitText(b, "#p-total", minorText(total))
	b.navigate("order", chromedp.Click(chromedp.CSS("#order")))
	if !strings.Contains(b.text("#private-key"), "OPENSSH PRIVATE KEY") {
		t.Fatal("no private key after ordering")
	}
	resp, raw := testenv.Do(t, testenv.HTTPClient(t, c), "GET", c.BillingURL+"/v1/terms", testenv.Token(t, c, cloud.DemoUser), "")
	testenv.MustStatus(t, resp, raw, http.StatusOK)
	var terms struct {
		Terms []struct {
			Months int   `json:"months"`
			Amount int64 `json:"amount"`
		} `json:"terms"`
	}
	if err := json.Unmarshal([]byte(raw), &terms); err != nil || len(terms.Terms) != 1 || terms.Terms[0].Months != 3 || terms.Terms[0].Amount != total {
		t.Fatalf("terms after a prepaid order of %d: %s", total, snippet(raw))
	}
}

// TestConfigureNeedsKey (issue 27): a Linux server ordered with "One of
// my keys" and none chosen is refused with the reason, and nothing is
// made.
func TestConfigureNeedsKey(t *testing.T) {
	c := startCloud(t)
	member := newWeb(t, c)
	member.login(demoLogin(c))
	msg := member.refused(choiceForm("key_mode", "existing", "key_name", "", "name", "keyless"))
	if !strings.Contains(msg, "SSH key") {
		t.Errorf("an order without a key is refused with %q", msg)
	}
	resp, raw := testenv.Do(t, testenv.HTTPClient(t, c), "GET", c.ComputeURL+"/servers?name=keyless", testenv.Token(t, c, cloud.DemoUser), "")
	testenv.MustStatus(t, resp, raw, http.StatusOK)
	if strings.Contains(raw, `"keyless"`) {
		t.Errorf("a server without a key was made: %s", raw)
	}
	// The live check says so before the order.
	if a := member.quote(choiceForm("key_mode", "existing", "key_name", "")); !slices.ContainsFunc(a.Problems, func(p string) bool { return strings.Contains(p, "SSH key") }) {
		t.Errorf("the live check of a keyless Linux server says %q", a.Problems)
	}
	// Windows takes a password instead.
	if a := member.quote(choiceForm("key_mode", "existing", "key_name", "", "image", "Windows Server 2022")); len(a.Problems) != 0 {
		t.Errorf("a Windows server without a key: %q", a.Problems)
	}
}

// TestServerLoginText (issue 27): "How to log in" names the public
// address of a server that has one and the key to log in with.
func TestServerLoginText(t *testing.T) {
	c := startCloud(t)
	member := newWeb(t, c)
	member.login(demoLogin(c))
	status, _, body := member.post("/configure", "/configure/order", choiceForm("name", "reach", "key_name", "reach-key"), true)
	if status != http.StatusOK {
		t.Fatalf("order: %d %s", status, snippet(body))
	}
	tok := testenv.Token(t, c, cloud.DemoUser)
	var s struct {
		ID        string `json:"id"`
		Status    string `json:"status"`
		Addresses map[string][]struct {
			Addr string `json:"addr"`
			Type string `json:"OS-EXT-IPS:type"`
		} `json:"addresses"`
	}
	public := ""
	testenv.Eventually(t, 30*time.Second, "server reach ACTIVE with a public address", func() bool {
		resp, raw := testenv.Do(t, testenv.HTTPClient(t, c), "GET", c.ComputeURL+"/servers/detail?name=reach", tok, "")
		testenv.MustStatus(t, resp, raw, http.StatusOK)
		var list struct {
			Servers []json.RawMessage `json:"servers"`
		}
		if json.Unmarshal([]byte(raw), &list) != nil || len(list.Servers) != 1 || json.Unmarshal(list.Servers[0], &s) != nil {
			t.Fatalf("servers named reach: %s", snippet(raw))
		}
		for _, as := range s.Addresses {
			for _, a := range as {
				if a.Type == "floating" {
					public = a.Addr
				}
			}
		}
		return s.Status == "ACTIVE" && public != ""
	})
	var access struct {
		Access []struct{ User string } `json:"access"`
	}
	resp, raw := testenv.Do(t, testenv.HTTPClient(t, c), "GET", c.ComputeURL+"/servers/"+s.ID+"/access", tok, "")
	testenv.MustStatus(t, resp, raw, http.StatusOK)
	if json.Unmarshal([]byte(raw), &access) != nil || len(access.Access) == 0 {
		t.Fatalf("access: %s", raw)
	}
	_, _, page := member.get("/servers/" + s.ID)
	cmd := regexp.MustCompile(`<code id="login-0"[^>]*>([^<]*)</code>`).FindStringSubmatch(page)
	want := "ssh -i ~/.ssh/reach-key " + access.Access[0].User + "@" + public
	if cmd == nil || cmd[1] != want {
		t.Errorf("the first way in reads %q, want %q", cmd, want)
	}
}
