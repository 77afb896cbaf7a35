package panel_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"nimbus/internal/cloud"
	"nimbus/internal/testenv"
)

// TestConfigureFunds: the configurator asks billing's spending rule, the
// one the API applies to the order: at a balance of zero without credit a
// member is told to top up and the order is refused, and the API refuses
// the same server; once the balance covers the first hour, neither does.
func TestConfigureFunds(t *testing.T) {
	c := startCloud(t, func(cfg *cloud.Config) { cfg.Billing.DefaultCreditLimit = 0 })
	user, pw := demoLogin(c)
	member := newWeb(t, c)
	member.login(user, pw)
	hc := testenv.HTTPClient(t, c)
	demo := testenv.Token(t, c, cloud.DemoUser)
	admin := testenv.Token(t, c, cloud.AdminUser)
	var acct struct {
		Account struct {
			ProjectID string `json:"project_id"`
			Balance   int64
		}
	}
	resp, raw := testenv.Do(t, hc, "GET", c.BillingURL+"/v1/account", demo, "")
	testenv.MustStatus(t, resp, raw, http.StatusOK)
	json.Unmarshal([]byte(raw), &acct)
	adjust := func(amount int64) {
		t.Helper()
		resp, raw := testenv.Do(t, hc, "POST", c.BillingURL+"/v1/accounts/"+acct.Account.ProjectID+"/adjustments", admin,
			testenv.Sprintf(`{"adjustment": {"amount": %d, "reference": "test"}}`, amount))
		testenv.MustStatus(t, resp, raw, http.StatusCreated)
	}
	if acct.Account.Balance != 0 {
		adjust(-acct.Account.Balance)
	}

	form := choiceForm("gpu_model", "L4", "gpu_count", "1", "vcpus", "8", "ram_gb", "16")
	money := func(problems []string) string {
		for _, p := range problems {
			if strings.Contains(p, "top up first") {
				return p
			}
		}
		return ""
	}
	a := member.quote(form)
	if money(a.Problems) == "" {
		t.Fatalf("at zero the configurator says %q; want it to ask for a top-up", a.Problems)
	}
	if status, _, body := member.post("/configure", "/configure/order", form, true); status == http.StatusOK && strings.Contains(body, "OPENSSH PRIVATE KEY") {
		t.Fatalf("an order at zero was taken")
	}
	resp, raw = testenv.Do(t, hc, "POST", c.ComputeURL+"/servers", demo,
		`{"server": {"name": "x", "imageRef": "`+imageID(t, c, testenv.Provider(t, c, cloud.DemoUser), "Ubuntu 24.04")+`", "flavorRef": "g.l4.x1", "networks": "none"}}`, "OpenStack-API-Version", "compute 2.79")
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(raw, "top up first") {
		t.Fatalf("the API at zero: %d %s", resp.StatusCode, raw)
	}

	adjust(a.HourlyMinor)
	if a := member.quote(form); money(a.Problems) != "" {
		t.Fatalf("with the first hour paid the configurator says %q", a.Problems)
	}
}
