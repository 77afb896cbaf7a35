package billing_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"nimbus/internal/cloud"
	"nimbus/internal/testenv"
)

// TestAccruing drives a real cloud: a new server's started hour shows as
// "accruing" in GET /v1/account and GET /v1/usage at once, at the price its
// flavor is quoted, outside the balance until the charging pass records it;
// then nothing accrues until the next hour starts. The paid balance and
// trial credit are shown apart.
func TestAccruing(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, url string) {
		c, clk, hc, demo := startClocked(t, url)
		ctx := context.Background()
		call := func(method, url, body string, want int, v any) {
			t.Helper()
			resp, raw := testenv.Do(t, hc, method, url, demo, body, "OpenStack-API-Version", "compute 2.79")
			testenv.MustStatus(t, resp, raw, want)
			if v != nil {
				if err := json.Unmarshal([]byte(raw), v); err != nil {
					t.Fatal(err)
				}
			}
		}
		type account struct {
			Account struct {
				Balance       int64
				PaidBalance   int64 `json:"paid_balance"`
				TrialCredit   int64 `json:"trial_credit"`
				Accruing      int64
				AccruingSince time.Time `json:"accruing_since"`
			}
		}
		type usage struct {
			Usage struct{ Total, Accruing int64 }
		}
		check := func(wantAccruing, wantBalance int64) {
			t.Helper()
			var a account
			var u usage
			call("GET", c.BillingURL+"/v1/account", "", 200, &a)
			call("GET", c.BillingURL+"/v1/usage", "", 200, &u)
			if a.Account.Accruing != wantAccruing || u.Usage.Accruing != wantAccruing || a.Account.Balance != wantBalance ||
				!a.Account.AccruingSince.Equal(clk.now().Truncate(time.Hour)) {
				t.Fatalf("account %+v, usage %+v; want accruing %d, balance %d", a.Account, u.Usage, wantAccruing, wantBalance)
			}
		}
		var raw map[string]map[string]any
		call("GET", c.BillingURL+"/v1/account", "", 200, &raw)
		if raw["account"]["paid_balance"] != raw["account"]["balance"] || raw["account"]["trial_credit"] != float64(0) {
			t.Fatalf("account without a trial: %v", raw["account"])
		}
		balance := int64(raw["account"]["balance"].(float64))
		check(0, balance)

		sc := testenv.Compute(t, testenv.Provider(t, c, cloud.DemoUser), "2.79")
		image, minRAM, minDisk := baseImage(t, c, hc, demo)
		flavor := smallest(t, sc, minRAM, minDisk)
		var created struct{ Server struct{ ID string } }
		call("POST", c.ComputeURL+"/servers", `{"server": {"name": "accrue", "imageRef": "`+image+`", "flavorRef": "`+flavor+`", "networks": "none"}}`, 202, &created)
		waitStatus(t, sc, created.Server.ID, "ACTIVE")
		clk.add(time.Now().UTC().Sub(clk.now())) // the hour the server started in
		var q struct{ Quote struct{ Hourly int64 } }
		call("POST", c.BillingURL+"/v1/quotes", `{"quote": {"flavor": "`+flavor+`"}}`, 200, &q)
		if q.Quote.Hourly <= 0 {
			t.Fatalf("quote %+v", q)
		}
		check(q.Quote.Hourly, balance)

		if _, err := c.Billing.ChargeUntil(ctx, clk.now()); err != nil {
			t.Fatal(err)
		}
		balance -= q.Quote.Hourly
		check(0, balance)

		now := clk.now()
		clk.add(now.Truncate(time.Hour).Add(time.Hour + time.Minute).Sub(now))
		check(q.Quote.Hourly, balance)
	})
}
