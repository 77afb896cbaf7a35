package billing_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"nimbus/internal/cloud"
	"nimbus/internal/store"
	"nimbus/internal/testenv"
)

// TestMoneyBounds drives a real cloud: the two huge top-ups are
// refused with 400 and leave the account readable; a credit past the
// maximum balance is refused; and an account whose ledger sum is out of
// int64 (written before the bounds existed) stops nobody else's pass: the
// other projects are still charged, and one that ran dry is shelved.
func TestMoneyBounds(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, url string) {
		c, clk, hc, demo := startClocked(t, url, noCredit, func(cfg *cloud.Config) { cfg.Billing.MaxBalance = 150_000_000 })
		ctx := context.Background()
		admin := testenv.Token(t, c, cloud.AdminUser)
		call := func(method, path, token, body string, want int) string {
			t.Helper()
			resp, raw := testenv.Do(t, hc, method, c.BillingURL+path, token, body)
			testenv.MustStatus(t, resp, raw, want)
			return raw
		}
		balance := func() int64 {
			t.Helper()
			var out struct{ Account struct{ Balance int64 } }
			if err := json.Unmarshal([]byte(call("GET", "/v1/account", demo, "", 200)), &out); err != nil {
				t.Fatal(err)
			}
			return out.Account.Balance
		}
		for _, tc := range []struct {
			amount, want string
		}{
			{"9223372036854775000", "over the maximum of 100000000 minor units"},
			{"9223372036854775000", "over the maximum of 100000000 minor units"},
			{"100000000", ""},
			{"100000000", "over the maximum of 1500000.00 RUB"},
		} {
			body := `{"topup": {"amount": ` + tc.amount + `, "provider": "test"}}`
			if tc.want == "" {
				call("POST", "/v1/topups", demo, body, 201)
				continue
			}
			if msg := messageOf(t, call("POST", "/v1/topups", demo, body, 400)); !strings.Contains(msg, tc.want) {
				t.Fatalf("top-up of %s refused with %q, want %q", tc.amount, msg, tc.want)
			}
		}
		if b := balance(); b != 100_000_000 {
			t.Fatalf("balance %d after the refusals, want 100000000", b)
		}

		// A server of demo's, and an account poisoned before the bounds.
		sc := testenv.Compute(t, testenv.Provider(t, c, cloud.DemoUser), "2.79")
		image, minRAM, minDisk := baseImage(t, c, hc, demo)
		resp, raw := testenv.Do(t, hc, "POST", c.ComputeURL+"/servers", demo,
			`{"server": {"name": "bounded", "imageRef": "`+image+`", "flavorRef": "`+smallest(t, sc, minRAM, minDisk)+`", "networks": "none"}}`,
			"OpenStack-API-Version", "compute 2.79")
		testenv.MustStatus(t, resp, raw, 202)
		id := idOf(t, raw, "server")
		waitStatus(t, sc, id, "ACTIVE")
		for range 2 {
			if _, err := c.DB.Exec(ctx, `INSERT INTO billing_ledger (id, project_id, kind, amount, resource_id, period_start, created_at, reference)
 VALUES (?, 'p-poisoned', 'topup', 9223372036854775000, NULL, NULL, ?, 'test:from before the bounds')`,
				uuid.NewString(), store.FormatTime(clk.now())); err != nil {
				t.Fatal(err)
			}
		}
		// Demo runs dry: the pass must still charge and shelve it.
		project := projectOf(t, c, hc, demo)
		call("POST", "/v1/accounts/"+project+"/adjustments", admin, `{"adjustment": {"amount": -100000001, "reference": "test"}}`, 201)
		if _, err := c.Billing.ChargeUntil(ctx, clk.add(time.Hour)); err != nil {
			t.Fatalf("one poisoned account failed the pass: %v", err)
		}
		var charges int
		if err := c.DB.QueryRow(ctx, "SELECT COUNT(*) FROM billing_ledger WHERE kind = 'charge' AND resource_id = ?", id).Scan(&charges); err != nil {
			t.Fatal(err)
		}
		if charges == 0 {
			t.Fatal("the server was not charged")
		}
		waitStatus(t, sc, id, "SHELVED_OFFLOADED")
		if b := balance(); b >= -1 {
			t.Fatalf("balance %d: the charges are not in it", b)
		}
		accounts, err := c.Billing.Accounts(ctx, nil)
		if err != nil {
			t.Fatalf("the operator's account list: %v", err)
		}
		listed := false
		for _, a := range accounts {
			listed = listed || a.ProjectID == project
		}
		if !listed {
			t.Fatalf("demo's account is not listed: %+v", accounts)
		}
	})
}
