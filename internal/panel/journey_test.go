package panel_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"nimbus/internal/testenv"
)

// TestCustomerJourney is the whole path in one browser: a visitor
// signs up, verifies the e-mail a real SMTP receiver takes, signs in, tops
// up 100.00, configures a server whose price is the API's quote to the
// minor unit, orders it, watches it go ACTIVE without a reload, reads its
// SSH command (with its key), and stops, starts, shelves and deletes it.
func TestCustomerJourney(t *testing.T) {
	mail := newSMTPReceiver(t)
	c := startCloud(t, withSMTP(mail), slowFake(500*time.Millisecond))
	b := newBrowser(t, c)

	const email, pw = "journey@example.com", "a-long-password-1"
	b.open("/signup")
	b.do("fill sign-up", chromedp.SendKeys(chromedp.CSS("#email"), email), chromedp.SendKeys(chromedp.CSS("#password"), pw),
		chromedp.SendKeys(chromedp.CSS("#password2"), pw))
	b.navigate("sign up", chromedp.Submit(chromedp.CSS("#password2")))
	b.navigate("open the mailed link", chromedp.Navigate(mailedLink(t, mail.next(t))))
	b.navigate("go to sign in", chromedp.Click(chromedp.CSS("#signin-link")))
	b.do("fill sign-in", chromedp.SendKeys(chromedp.CSS("#email"), email), chromedp.SendKeys(chromedp.CSS("#password"), pw))
	b.navigate("sign in", chromedp.Submit(chromedp.CSS("#password")))
	if loc := b.location(); loc != "/servers" {
		t.Fatalf("after signing in at %s", loc)
	}

	b.open("/billing")
	b.do("top up 100.00", chromedp.Clear(chromedp.CSS("#amount")), chromedp.SendKeys(chromedp.CSS("#amount"), "100.00"))
	b.navigate("pay", chromedp.Submit(chromedp.CSS("#amount")))
	if got := b.text("#balance"); !strings.HasPrefix(got, "100.00 RUB") {
		t.Fatalf("balance after the top-up: %q", got)
	}

	b.open("/configure")
	b.do("a key of my own", chromedp.SetValue(chromedp.CSS("#c-key-mode"), "generate"), chromedp.SetValue(chromedp.CSS("#c-name"), "journey"),
		chromedp.SendKeys(chromedp.CSS("#c-qty"), "\t"))
	hourly, _ := apiQuote(t, c, `{"quote":{"vcpus":2,"ram_gb":4,"disk_type":"local","disk_gb":40,"public_ipv4":false,"quantity":1}}`)
	waitText(b, "#p-hourly", minorText(hourly))
	b.navigate("order", chromedp.Click(chromedp.CSS("#order")))
	if !strings.Contains(b.text("#private-key"), "OPENSSH PRIVATE KEY") {
		t.Fatal("no private key after ordering")
	}
	b.navigate("to the servers", chromedp.Click(chromedp.CSS("main a.button.primary")))

	// The new server goes ACTIVE in the list without the page reloading.
	get(b, "mark the page", chromedp.Evaluate[bool](`window.samePage = true`))
	waitJS(b, "live ACTIVE", `(() => { const e = document.querySelector("tr[data-id] .status"); return !!e && e.textContent === "ACTIVE" })()`)
	if !get(b, "same page", chromedp.Evaluate[bool](`window.samePage === true`)) {
		t.Fatal("the list reloaded to show ACTIVE")
	}
	id := get(b, "the server's id", chromedp.Evaluate[string](`document.querySelector("tr[data-id]").dataset.id`))
	srvClick(b, "open the server", fmt.Sprintf(`a[href="/servers/%s"]`, id))

	s, err := c.Identity.Login(context.Background(), "", email, pw)
	if err != nil {
		t.Fatal(err)
	}
	var access struct {
		Access []struct {
			Host, User string
			Port       int
		}
	}
	resp, body := testenv.Do(t, testenv.HTTPClient(t, c), "GET", c.ComputeURL+"/servers/"+id+"/access", s.Token, "",
		"OpenStack-API-Version", "compute 2.96")
	testenv.MustStatus(t, resp, body, http.StatusOK)
	if err := json.Unmarshal([]byte(body), &access); err != nil || len(access.Access) == 0 {
		t.Fatalf("/access: %s (%v)", body, err)
	}
	var one struct {
		Server struct {
			KeyName string `json:"key_name"`
		}
	}
	resp, body = testenv.Do(t, testenv.HTTPClient(t, c), "GET", c.ComputeURL+"/servers/"+id, s.Token, "")
	testenv.MustStatus(t, resp, body, http.StatusOK)
	if err := json.Unmarshal([]byte(body), &one); err != nil || one.Server.KeyName == "" {
		t.Fatalf("the server's key: %s (%v)", body, err)
	}
	a := access.Access[0]
	want := fmt.Sprintf("ssh -i ~/.ssh/%s -p %d %s@%s", one.Server.KeyName, a.Port, a.User, a.Host)
	if a.Port == 22 {
		want = fmt.Sprintf("ssh -i ~/.ssh/%s %s@%s", one.Server.KeyName, a.User, a.Host)
	}
	if got := b.text(".login-cmd"); got != want {
		t.Fatalf("the page's SSH command is %q, want /access's address with the key: %q", got, want)
	}

	for _, step := range []struct{ button, want string }{{"stop", "SHUTOFF"}, {"start", "ACTIVE"}, {"shelve", "SHELVED"}} {
		srvClick(b, step.button, fmt.Sprintf(`form[action="/servers/%s/%s"] button`, id, step.button))
		statusIs(b, step.want)
	}
	b.do("tick", chromedp.Click(chromedp.CSS("#delete-confirm")))
	get(b, "accept the confirmation", chromedp.Evaluate[bool](`window.confirm = () => true; true`))
	srvClick(b, "delete", fmt.Sprintf(`form[action="/servers/%s/delete"] button`, id))
	waitJS(b, "gone from the list", fmt.Sprintf(`!document.querySelector('tr[data-id=%q]') || document.querySelector('tr[data-id=%q] .status').textContent === "DELETED"`, id, id))
}
