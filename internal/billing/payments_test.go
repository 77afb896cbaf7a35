package billing

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"nimbus/internal/store"
	"nimbus/internal/store/storetest"
)

// postWebhook sends body to the provider's webhook with sig as
// X-Nimbus-Signature ("" for none) and no token.
func postWebhook(t *testing.T, srv *httptest.Server, provider, body, sig string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest("POST", srv.URL+"/v1/webhooks/"+provider, bytes.NewReader([]byte(body)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if sig != "" {
		req.Header.Set(SignatureHeader, sig)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("webhook: body %q not JSON", raw)
	}
	return resp.StatusCode, out
}

func balanceOf(t *testing.T, srv *httptest.Server, token string) float64 {
	t.Helper()
	st, body := call(t, srv, "GET", "/v1/account", token, "")
	if st != 200 {
		t.Fatalf("account %d %v", st, body)
	}
	return body["account"].(map[string]any)["balance"].(float64)
}

// topupRow is a billing_topups row's status, failure reason and whether it
// has a ledger row.
func topupRow(t *testing.T, db *store.DB, id string) (status, reason string, credited bool) {
	t.Helper()
	var ledger *string
	if err := db.QueryRow(context.Background(), "SELECT status, failure_reason, ledger_id FROM billing_topups WHERE id = ?", id).
		Scan(&status, &reason, &ledger); err != nil {
		t.Fatal(err)
	}
	return status, reason, ledger != nil
}

func ledgerCount(t *testing.T, db *store.DB, project, kind string) int {
	t.Helper()
	var n int
	if err := db.QueryRow(context.Background(), "SELECT COUNT(*) FROM billing_ledger WHERE project_id = ? AND kind = ?", project, kind).
		Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func errMessage(body map[string]any) string {
	e, _ := body["error"].(map[string]any)
	m, _ := e["message"].(string)
	return m
}

// TestTopupProviders: the test provider's card success and declines, the
// default minimum, a customer refused the manual provider, and top-up
// status by id.
func TestTopupProviders(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, url string) {
		db := openDB(t, url)
		srv := startAPI(t, New(db, Config{TestPayments: true}))
		tests := []struct {
			name, body string
			status     int
			credit     float64 // what the balance gains
			message    string  // part of the error message
			topup      string  // the recorded status ("" none)
		}{
			{"99 under the minimum", `{"topup": {"amount": 99}}`, 400, 0, "minimum of 10000", ""},
			{"100.00 accepted", `{"topup": {"amount": 10000, "provider": "test"}}`, 201, 10000, "", TopupSucceeded},
			{"test card success", `{"topup": {"amount": 20000, "provider": "test", "card": "4242424242424242"}}`, 201, 20000, "", TopupSucceeded},
			{"declined card", `{"topup": {"amount": 20000, "provider": "test", "card": "4000000000000002"}}`, 402, 0, "declined", TopupFailed},
			{"insufficient funds", `{"topup": {"amount": 20000, "card": "4000000000009995"}}`, 402, 0, "insufficient funds", TopupFailed},
			{"malformed card", `{"topup": {"amount": 20000, "card": "4000-0000"}}`, 400, 0, "card", ""},
			{"manual is for operators", `{"topup": {"amount": 20000, "provider": "manual"}}`, 403, 0, "/v1/accounts/{project}/topups", ""},
			{"unknown field", `{"topup": {"amount": 20000, "simulate": "decline"}}`, 400, 0, "simulate", ""},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				before := balanceOf(t, srv, "demo")
				var topups int
				db.QueryRow(context.Background(), "SELECT COUNT(*) FROM billing_topups").Scan(&topups)
				st, body := call(t, srv, "POST", "/v1/topups", "demo", tt.body)
				if st != tt.status {
					t.Fatalf("status %d, want %d (%v)", st, tt.status, body)
				}
				if got := balanceOf(t, srv, "demo") - before; got != tt.credit {
					t.Fatalf("credited %v, want %v", got, tt.credit)
				}
				if tt.message != "" && !strings.Contains(errMessage(body), tt.message) {
					t.Fatalf("message %q lacks %q", errMessage(body), tt.message)
				}
				var n int
				db.QueryRow(context.Background(), "SELECT COUNT(*) FROM billing_topups").Scan(&n)
				want := topups
				if tt.topup != "" {
					want++
				}
				if n != want {
					t.Fatalf("%d top-ups recorded, want %d", n, want)
				}
				if tt.topup == "" {
					return
				}
				var id string
				db.QueryRow(context.Background(), "SELECT id FROM billing_topups ORDER BY created_at DESC, id DESC LIMIT 1").Scan(&id)
				status, reason, credited := topupRow(t, db, id)
				if status != tt.topup || credited != (tt.topup == TopupSucceeded) || (status == TopupFailed) != (reason != "") {
					t.Fatalf("top-up %s %q credited %v", status, reason, credited)
				}
				if st == 201 {
					tp := body["topup"].(map[string]any)
					if tp["id"] != id || tp["status"] != TopupSucceeded || tp["amount"] == nil || tp["currency"] != "RUB" ||
						tp["provider"] != "test" || !strings.HasPrefix(tp["reference"].(string), "test-") || tp["created_at"] == nil {
						t.Fatalf("topup body %v", tp)
					}
				} else if !strings.Contains(errMessage(body), id) {
					t.Fatalf("402 message %q does not name top-up %s", errMessage(body), id)
				}
			})
		}
		// Status by id: the project's own, an admin's, nobody else's.
		_, body := call(t, srv, "POST", "/v1/topups", "demo", `{"topup": {"amount": 10000}}`)
		id := body["topup"].(map[string]any)["id"].(string)
		for _, tt := range []struct {
			token, id string
			status    int
		}{{"demo", id, 200}, {"admin", id, 200}, {"other", id, 404}, {"demo", "nope", 404}, {"", id, 401}} {
			st, body := call(t, srv, "GET", "/v1/topups/"+tt.id, tt.token, "")
			if st != tt.status {
				t.Fatalf("GET %s as %q: %d, want %d (%v)", tt.id, tt.token, st, tt.status, body)
			}
			if st == 200 && body["topup"].(map[string]any)["status"] != TopupSucceeded {
				t.Fatalf("topup %v", body)
			}
		}
	})
}

// TestWebhookTopup: a webhook-test top-up stays pending, bad signatures
// change nothing, a signed webhook credits it once however often it is
// delivered, and contradicting or foreign webhooks are refused.
func TestWebhookTopup(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, url string) {
		db := openDB(t, url)
		clk := &clock{}
		clk.set("2025-03-01T10:00:00Z")
		b := New(db, Config{Now: clk.now, TestPayments: true})
		secret := b.cfg.WebhookSecrets[webhookTestName]
		srv := startAPI(t, b)
		pending := func(amount int) string {
			t.Helper()
			st, body := call(t, srv, "POST", "/v1/topups", "demo", fmt.Sprintf(`{"topup": {"amount": %d, "provider": "webhook-test"}}`, amount))
			tp := body["topup"].(map[string]any)
			if st != 201 || tp["status"] != TopupPending || !strings.HasPrefix(tp["reference"].(string), "whtest-") {
				t.Fatalf("async top-up %d %v", st, body)
			}
			return tp["id"].(string)
		}
		id := pending(30000)
		if bal := balanceOf(t, srv, "demo"); bal != 0 {
			t.Fatalf("pending top-up credited: %v", bal)
		}
		event := fmt.Sprintf(`{"event": {"topup_id": %q, "status": "succeeded", "amount": 30000}}`, id)
		now := clk.now()
		bad := []struct{ name, body, sig string }{
			{"no signature", event, ""},
			{"wrong secret", event, SignWebhook("not the secret", []byte(event), now)},
			{"tampered body", strings.Replace(event, "30000", "90000", 1), SignWebhook(secret, []byte(event), now)},
			{"stale timestamp", event, SignWebhook(secret, []byte(event), now.Add(-10*time.Minute))},
			{"garbage", event, "t=x,sha256=zz"},
		}
		for _, tt := range bad {
			if st, body := postWebhook(t, srv, webhookTestName, tt.body, tt.sig); st != 401 {
				t.Fatalf("%s: %d %v", tt.name, st, body)
			}
		}
		if status, _, credited := topupRow(t, db, id); status != TopupPending || credited || balanceOf(t, srv, "demo") != 0 {
			t.Fatalf("bad signatures changed the top-up: %s %v", status, credited)
		}
		// The good webhook, delivered many times at once and again later.
		sig := SignWebhook(secret, []byte(event), now)
		var wg sync.WaitGroup
		codes := make([]int, 8)
		for i := range codes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				codes[i], _ = postWebhook(t, srv, webhookTestName, event, sig)
			}()
		}
		wg.Wait()
		for _, c := range codes {
			if c != 200 {
				t.Fatalf("concurrent deliveries answered %v", codes)
			}
		}
		st, body := postWebhook(t, srv, webhookTestName, event, sig)
		if st != 200 || body["topup"].(map[string]any)["status"] != TopupSucceeded {
			t.Fatalf("replay %d %v", st, body)
		}
		if bal, n := balanceOf(t, srv, "demo"), ledgerCount(t, db, "p-demo", KindTopup); bal != 30000 || n != 1 {
			t.Fatalf("balance %v with %d top-up rows, want 30000 once", bal, n)
		}
		if st, body := call(t, srv, "GET", "/v1/topups/"+id, "demo", ""); st != 200 || body["topup"].(map[string]any)["completed_at"] == nil {
			t.Fatalf("status %d %v", st, body)
		}
		// Refusals that change nothing.
		failedEvent := fmt.Sprintf(`{"event": {"topup_id": %q, "status": "failed"}}`, id)
		other := pending(40000)
		_, body = call(t, srv, "POST", "/v1/topups", "demo", `{"topup": {"amount": 10000, "provider": "test"}}`)
		syncID := body["topup"].(map[string]any)["id"].(string)
		refused := []struct {
			name, provider, body string
			status               int
		}{
			{"contradicts a settled top-up", webhookTestName, failedEvent, 409},
			{"wrong amount", webhookTestName, fmt.Sprintf(`{"event": {"topup_id": %q, "status": "succeeded", "amount": 1}}`, other), 400},
			{"another provider's top-up", webhookTestName, fmt.Sprintf(`{"event": {"topup_id": %q, "status": "succeeded"}}`, syncID), 404},
			{"unknown top-up", webhookTestName, `{"event": {"topup_id": "nope", "status": "succeeded"}}`, 404},
			{"bad status", webhookTestName, fmt.Sprintf(`{"event": {"topup_id": %q, "status": "maybe"}}`, other), 400},
			{"not an event", webhookTestName, `[1]`, 400},
			{"provider without webhook", "test", event, 404},
			{"unknown provider", "nope", event, 404},
		}
		before := balanceOf(t, srv, "demo")
		for _, tt := range refused {
			st, body := postWebhook(t, srv, tt.provider, tt.body, SignWebhook(secret, []byte(tt.body), now))
			if st != tt.status || body["error"] == nil {
				t.Fatalf("%s: %d, want %d (%v)", tt.name, st, tt.status, body)
			}
		}
		if bal := balanceOf(t, srv, "demo"); bal != before {
			t.Fatalf("refused webhooks moved the balance %v → %v", before, bal)
		}
		// A provider's failure settles the pending top-up with nothing credited.
		fail := fmt.Sprintf(`{"event": {"topup_id": %q, "status": "failed", "reason": "3-D Secure not completed"}}`, other)
		if st, body := postWebhook(t, srv, webhookTestName, fail, SignWebhook(secret, []byte(fail), now)); st != 200 ||
			body["topup"].(map[string]any)["failure_reason"] != "3-D Secure not completed" {
			t.Fatalf("failed webhook %d %v", st, body)
		}
		if status, _, credited := topupRow(t, db, other); status != TopupFailed || credited || balanceOf(t, srv, "demo") != before {
			t.Fatalf("failed top-up %s credited %v", status, credited)
		}
	})
}

// TestManualTopup: an operator credits an account with a reference; a
// customer cannot.
func TestManualTopup(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, url string) {
		db := openDB(t, url)
		srv := startAPI(t, New(db, Config{TestPayments: true}))
		tests := []struct {
			name, token, body string
			status            int
		}{
			{"customer", "demo", `{"topup": {"amount": 50000, "reference": "bank transfer 123"}}`, 403},
			{"no reference", "admin", `{"topup": {"amount": 50000}}`, 400},
			{"blank reference", "admin", `{"topup": {"amount": 50000, "reference": "  "}}`, 400},
			{"zero", "admin", `{"topup": {"amount": 0, "reference": "x"}}`, 400},
			{"no amount", "admin", `{"topup": {"reference": "x"}}`, 400},
			{"credited", "admin", `{"topup": {"amount": 50000, "reference": "bank transfer 123"}}`, 201},
			// The customer minimum is for card payments, not the operator.
			{"under the customer minimum", "admin", `{"topup": {"amount": 500, "reference": "bank transfer 124"}}`, 201},
		}
		for _, tt := range tests {
			st, body := call(t, srv, "POST", "/v1/accounts/p-demo/topups", tt.token, tt.body)
			if st != tt.status {
				t.Fatalf("%s: %d, want %d (%v)", tt.name, st, tt.status, body)
			}
			if st == 201 {
				tp := body["topup"].(map[string]any)
				if tp["provider"] != "manual" || tp["status"] != TopupSucceeded || tp["project_id"] != "p-demo" ||
					!strings.HasPrefix(tp["reference"].(string), "bank transfer 12") {
					t.Fatalf("%s: %v", tt.name, tp)
				}
			}
		}
		if bal := balanceOf(t, srv, "demo"); bal != 50500 {
			t.Fatalf("balance %v", bal)
		}
		var ref string
		db.QueryRow(context.Background(), "SELECT reference FROM billing_ledger WHERE project_id = 'p-demo' AND amount = 50000").Scan(&ref)
		if ref != "manual:bank transfer 123" {
			t.Fatalf("ledger reference %q", ref)
		}
	})
}

func TestVerifyWebhook(t *testing.T) {
	now := at("2025-03-01T10:00:00Z")
	body := []byte(`{"a":1}`)
	good := SignWebhook("s3cret", body, now)
	tests := []struct {
		name, secret, header string
		body                 []byte
		ok                   bool
	}{
		{"good", "s3cret", good, body, true},
		{"within tolerance", "s3cret", SignWebhook("s3cret", body, now.Add(-4*time.Minute)), body, true},
		{"future beyond tolerance", "s3cret", SignWebhook("s3cret", body, now.Add(6*time.Minute)), body, false},
		{"other secret", "other", good, body, false},
		{"no secret configured", "", SignWebhook("", body, now), body, false},
		{"other body", "s3cret", good, []byte(`{"a":2}`), false},
		{"re-dated", "s3cret", strings.Replace(good, fmt.Sprint(now.Unix()), fmt.Sprint(now.Unix()+60), 1), body, false},
		{"empty", "s3cret", "", body, false},
	}
	for _, tt := range tests {
		err := VerifyWebhook(tt.secret, tt.header, tt.body, now)
		if (err == nil) != tt.ok {
			t.Errorf("%s: %v", tt.name, err)
		}
	}
}

func TestParseRate(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want string // RatString; "" for an error
	}{
		{"0.011", "11/1000"}, {" 11/1000 ", "11/1000"}, {"1", "1"}, {"1e-2", "1/100"}, {"1000000000", "1000000000"},
		{"", ""}, {"0", ""}, {"-0.011", ""}, {"abc", ""}, {"1/0", ""}, {"1000000001", ""}, {"0.0110000000000000000000000000000000000001", ""},
	} {
		r, err := ParseRate(tt.in)
		if tt.want == "" {
			if err == nil {
				t.Errorf("ParseRate(%q) = %v, want an error", tt.in, r)
			}
			continue
		}
		if err != nil || r.RatString() != tt.want {
			t.Errorf("ParseRate(%q) = %v, %v; want %s", tt.in, r, err, tt.want)
		}
	}
}

// TestConvert: exact conversion, rounded half away from zero.
func TestConvert(t *testing.T) {
	for _, tt := range []struct {
		amount int64
		rate   string
		want   int64
	}{
		{10000, "0.011", 110}, // the spec's 100 = 1.10 USD
		{0, "0.011", 0},
		{45, "0.011", 0},      // 0.495
		{46, "0.011", 1},      // 0.506
		{4500, "0.011", 50},   // 49.5: half rounds up
		{-4500, "0.011", -50}, // a debt rounds like the same credit
		{-45, "0.011", 0},
		{50, "0.01", 1}, // 0.5
		{49, "0.01", 0},
		{2, "1/3", 1}, // 0.667
		{1, "1/3", 0},
		{3, "1/2", 2},                    // 1.5
		{123456789, "90.5", 11172839405}, // 11172839404.5
	} {
		r, err := ParseRate(tt.rate)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := convert(tt.amount, r); err != nil || got != tt.want {
			t.Errorf("convert(%d, %s) = %d, %v; want %d", tt.amount, tt.rate, got, err, tt.want)
		}
	}
	r, _ := ParseRate("2")
	if _, err := convert(1<<62, r); err == nil {
		t.Error("overflow not reported")
	}
}

// TestPresentation: account, quote and prices restate amounts in the
// presentation currency when one is configured, and only then.
func TestPresentation(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, url string) {
		db := openDB(t, url)
		srv := startAPI(t, New(db, Config{PresentationCurrency: "USD", PresentationRate: "0.011", TestPayments: true}))
		if st, body := call(t, srv, "POST", "/v1/topups", "demo", `{"topup": {"amount": 10000}}`); st != 201 {
			t.Fatalf("topup %d %v", st, body)
		}
		if st, body := call(t, srv, "PUT", "/v1/accounts/p-demo/credit_limit", "admin", `{"credit_limit": 4500}`); st != 200 {
			t.Fatalf("credit limit %d %v", st, body)
		}
		a := accountOf(t, srv, "demo")
		p, _ := a["presentation"].(map[string]any)
		if a["balance"] != float64(10000) || a["currency"] != "RUB" || p["currency"] != "USD" || p["rate"] != "0.011" ||
			p["balance"] != float64(110) || p["credit_limit"] != float64(50) || p["trial_credit"] != float64(0) {
			t.Fatalf("account %v", a)
		}
		// 2 vCPU × 50 + 4 GB × 20 = 180 an hour: 1.98 USD; 129600 a month: 1425.60 USD.
		st, body := call(t, srv, "POST", "/v1/quotes", "demo", `{"quote": {"vcpus": 2, "ram_gb": 4}}`)
		q := body["quote"].(map[string]any)
		p, _ = q["presentation"].(map[string]any)
		if st != 200 || q["hourly"] != float64(180) || p["currency"] != "USD" || p["hourly"] != float64(2) ||
			p["hourly_each"] != float64(2) || p["monthly"] != float64(1426) {
			t.Fatalf("quote %d %v", st, body)
		}
		_, body = call(t, srv, "GET", "/v1/prices", "demo", "")
		p, _ = body["prices"].(map[string]any)["presentation"].(map[string]any)
		if p["currency"] != "USD" || p["rate"] != "0.011" || p["min_topup"] != float64(110) {
			t.Fatalf("prices %v", body)
		}
		// Without a presentation currency, or with an invalid rate, none.
		for _, cfg := range []Config{{}, {PresentationCurrency: "USD", PresentationRate: "one cent"}} {
			srv := startAPI(t, New(db, cfg))
			if a := accountOf(t, srv, "demo"); a["presentation"] != nil {
				t.Fatalf("%+v: account %v", cfg, a)
			}
			_, body := call(t, srv, "POST", "/v1/quotes", "demo", `{"quote": {"vcpus": 2}}`)
			_, body2 := call(t, srv, "GET", "/v1/prices", "demo", "")
			if body["quote"].(map[string]any)["presentation"] != nil || body2["prices"].(map[string]any)["presentation"] != nil {
				t.Fatalf("%+v: presentation in %v %v", cfg, body, body2)
			}
		}
	})
}

// TestNoTestPayments: by default a cloud offers no simulated provider,
// which would credit money never paid: a top-up through one is refused in
// OpenStack's shape and credits nothing.
func TestNoTestPayments(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, url string) {
		srv := startAPI(t, New(openDB(t, url), Config{}))
		for _, p := range []string{"test", "webhook-test"} {
			st, b := call(t, srv, "POST", "/v1/topups", "demo", `{"topup": {"amount": 10000, "provider": "`+p+`"}}`)
			e, _ := b["error"].(map[string]any)
			if st != 400 || e["code"] != float64(400) || !strings.Contains(e["message"].(string), p) {
				t.Fatalf("provider %s: %d %v", p, st, b)
			}
		}
		if a := accountOf(t, srv, "demo"); a["balance"] != float64(0) {
			t.Fatalf("refused top-ups credited: %v", a)
		}
	})
}
