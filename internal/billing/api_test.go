package billing

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"nimbus/internal/api"
	"nimbus/internal/store/storetest"
)

// tokens is a tiny Authenticator: a fixed caller per token.
type tokens map[string]*api.Caller

func (m tokens) Validate(_ context.Context, token string) (*api.Caller, error) {
	if c, ok := m[token]; ok {
		return c, nil
	}
	return nil, api.Unauthorized()
}

func startAPI(t *testing.T, b *Service) *httptest.Server {
	svc := api.NewService("billing", api.RenderKeystone, tokens{
		"demo":     {UserID: "u-demo", ProjectID: "p-demo", Roles: []string{"member"}},
		"other":    {UserID: "u-other", ProjectID: "p-other", Roles: []string{"member"}},
		"admin":    {UserID: "u-admin", ProjectID: "p-admin", Roles: []string{"admin", "member"}},
		"unscoped": {UserID: "u-demo"},
	})
	svc.Handle(b.Routes()...)
	srv := httptest.NewServer(svc)
	t.Cleanup(srv.Close)
	return srv
}

func call(t *testing.T, srv *httptest.Server, method, path, token, body string) (int, map[string]any) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = bytes.NewReader([]byte(body))
	}
	req, err := http.NewRequest(method, srv.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("X-Auth-Token", token)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &out); err != nil {
			t.Fatalf("%s %s: body %q not JSON", method, path, raw)
		}
	}
	return resp.StatusCode, out
}

// TestTopupMinimum: 99 refused, 100 accepted, at the configured minimum and
// at the default one (100.00 = 10000 minor units).
func TestTopupMinimum(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, url string) {
		db := openDB(t, url)
		small := startAPI(t, New(db, Config{MinTopup: 100, TestPayments: true}))
		tests := []struct {
			srv    *httptest.Server
			body   string
			status int
		}{
			{small, `{"topup": {"amount": 99, "provider": "test"}}`, 400},
			{small, `{"topup": {"amount": 100, "provider": "test"}}`, 201},
			{small, `{"topup": {"amount": -100, "provider": "test"}}`, 400},
			{small, `{"topup": {"amount": 100.5, "provider": "test"}}`, 400},
			{small, `{"topup": {"amount": "100", "provider": "test"}}`, 400},
			{small, `{"topup": {"provider": "test"}}`, 400},
			{small, `{"topup": {"amount": 100, "provider": "nope"}}`, 400},
			{small, `{"topup": {"amount": 100}, "x": 1}`, 400},
			{small, `not json`, 400},
		}
		for _, tt := range tests {
			st, body := call(t, tt.srv, "POST", "/v1/topups", "demo", tt.body)
			if st != tt.status {
				t.Fatalf("%s: status %d, want %d (%v)", tt.body, st, tt.status, body)
			}
			if st == 400 {
				if e, ok := body["error"].(map[string]any); !ok || e["code"] != float64(400) {
					t.Fatalf("%s: not a Keystone error: %v", tt.body, body)
				}
			}
		}
		st, body := call(t, small, "POST", "/v1/topups", "demo", `{"topup": {"amount": 99, "provider": "test"}}`)
		if msg := body["error"].(map[string]any)["message"].(string); st != 400 || !strings.Contains(msg, "minimum of 100") {
			t.Fatalf("message %q", msg)
		}
		def := startAPI(t, New(db, Config{TestPayments: true}))
		if st, _ := call(t, def, "POST", "/v1/topups", "other", `{"topup": {"amount": 9999, "provider": "test"}}`); st != 400 {
			t.Fatalf("9999 under the default minimum: %d", st)
		}
		if st, _ := call(t, def, "POST", "/v1/topups", "other", `{"topup": {"amount": 10000, "provider": "test"}}`); st != 201 {
			t.Fatalf("10000 at the default minimum: %d", st)
		}
		// Balances: each project sees only its own.
		for tok, want := range map[string]float64{"demo": 100, "other": 10000} {
			st, body := call(t, def, "GET", "/v1/account", tok, "")
			a := body["account"].(map[string]any)
			if st != 200 || a["balance"] != want || a["credit_limit"] != float64(0) || a["currency"] != "RUB" {
				t.Fatalf("%s account %d %v", tok, st, body)
			}
		}
	})
}

// TestAPI covers the ledger paging, quotes, prices and admin calls.
func TestAPI(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, url string) {
		db := openDB(t, url)
		srv := startAPI(t, New(db, Config{MinTopup: 100, TestPayments: true}))
		for i := 0; i < 5; i++ {
			if st, b := call(t, srv, "POST", "/v1/topups", "demo", `{"topup": {"amount": 1000, "provider": "test"}}`); st != 201 {
				t.Fatalf("topup %d %v", st, b)
			}
		}
		// Paging newest first, 2 per page.
		var ids []string
		path := "/v1/ledger?limit=2"
		for pages := 0; path != "" && pages < 10; pages++ {
			st, body := call(t, srv, "GET", path, "demo", "")
			if st != 200 {
				t.Fatalf("ledger %d %v", st, body)
			}
			for _, e := range body["ledger"].([]any) {
				m := e.(map[string]any)
				if _, shown := m["period_start"]; m["kind"] != "topup" || m["amount"] != float64(1000) || m["resource_id"] != nil || shown {
					t.Fatalf("entry %v", m)
				}
				ids = append(ids, m["id"].(string))
			}
			path = ""
			if links, ok := body["ledger_links"].([]any); ok {
				href := links[0].(map[string]any)["href"].(string)
				path = href[strings.Index(href, "/v1/"):]
			}
		}
		if len(ids) != 5 || ids[0] < ids[4] {
			t.Fatalf("paged ids %v", ids)
		}
		tests := []struct {
			method, path, token, body string
			status                    int
		}{
			{"GET", "/v1/ledger?marker=" + ids[0], "other", "", 400}, // another project's marker
			{"GET", "/v1/ledger?limit=0", "demo", "", 400},
			{"GET", "/v1/ledger?limit=x", "demo", "", 400},
			{"GET", "/v1/account", "", "", 401},
			{"GET", "/v1/account", "unscoped", "", 403},
			{"GET", "/v1/prices", "demo", "", 200},
			{"PUT", "/v1/prices", "demo", `{"prices": {"hourly": {"vcpu": 1}}}`, 403},
			{"PUT", "/v1/prices", "admin", `{"prices": {"hourly": {"vcpu": -1}}}`, 400},
			{"PUT", "/v1/prices", "admin", `{"prices": {"hourly": {"cpu": 1}}}`, 400},
			{"PUT", "/v1/prices", "admin", `{"prices": {"hourly": {"gpu": {"H100": 30000000}}}}`, 200},
			{"POST", "/v1/quotes", "demo", `{"quote": {"vcpus": 16, "ram_gb": 64, "disk_gb": 100, "gpu_model": "H100", "quantity": 2}}`, 200},
			{"POST", "/v1/quotes", "demo", `{"quote": {"vcpus": 1, "gpu_model": "nope"}}`, 400},
			{"POST", "/v1/quotes", "demo", `{"quote": {"vcpus": 1, "colour": "red"}}`, 400},
			{"POST", "/v1/quotes", "demo", `{"quote": {"vcpus": 1e30}}`, 400},
			{"POST", "/v1/quotes", "demo", `{"quote": {"ram_gb": 99999999999}}`, 400},
			{"POST", "/v1/quotes", "demo", `{"quote": {"vcpus": 2, "ram_gb": 4, "tariff": "prepaid", "term_months": 12}}`, 200},
			{"POST", "/v1/quotes", "demo", `{"quote": {"vcpus": 2, "tariff": "hourly", "duration_hours": 72}}`, 200},
			{"POST", "/v1/quotes", "demo", `{"quote": {"vcpus": 2, "tariff": "prepaid", "term_months": 7}}`, 400},
			{"POST", "/v1/quotes", "demo", `{"quote": {"vcpus": 2, "tariff": "weekly"}}`, 400},
			{"PUT", "/v1/accounts/p-demo/credit_limit", "demo", `{"credit_limit": 500}`, 403},
			{"PUT", "/v1/accounts/p-demo/credit_limit", "admin", `{"credit_limit": -1}`, 400},
			{"PUT", "/v1/accounts/p-demo/credit_limit", "admin", `{"credit_limit": 500}`, 200},
			{"POST", "/v1/accounts/p-demo/adjustments", "demo", `{"adjustment": {"amount": 7}}`, 403},
			{"POST", "/v1/accounts/p-demo/adjustments", "admin", `{"adjustment": {"amount": 0}}`, 400},
			{"POST", "/v1/accounts/p-demo/adjustments", "admin", `{"adjustment": {"amount": -7, "reference": "goodwill fix"}}`, 201},
			{"GET", "/v1/accounts/p-demo", "demo", "", 403},
		}
		for _, tt := range tests {
			if st, body := call(t, srv, tt.method, tt.path, tt.token, tt.body); st != tt.status {
				t.Fatalf("%s %s %s: %d, want %d (%v)", tt.method, tt.path, tt.body, st, tt.status, body)
			}
		}
		_, body := call(t, srv, "POST", "/v1/quotes", "demo", `{"quote": {"vcpus": 16, "ram_gb": 64, "disk_gb": 100, "gpu_model": "H100", "quantity": 2}}`)
		q := body["quote"].(map[string]any)
		// 16×50 + 64×20 + 100×0.5 + 3000 = 5130 per server.
		if q["hourly_each"] != float64(5130) || q["hourly"] != float64(10260) || q["monthly"] != float64(10260*720) {
			t.Fatalf("quote %v", q)
		}
		_, body = call(t, srv, "GET", "/v1/prices", "demo", "")
		pr := body["prices"].(map[string]any)
		if pr["currency"] != "RUB" || pr["rate_scale"] != float64(RateScale) ||
			pr["hourly"].(map[string]any)["gpu"].(map[string]any)["H100"] != float64(30000000) {
			t.Fatalf("prices %v", pr)
		}
		st, body := call(t, srv, "GET", "/v1/accounts/p-demo", "admin", "")
		a := body["account"].(map[string]any)
		if st != 200 || a["balance"] != float64(5000-7) || a["credit_limit"] != float64(500) {
			t.Fatalf("admin account %d %v", st, body)
		}
	})
}

// TestLedgerPeriodStart: only charges show period_start; the welcome
// credit keys its once-only row on that column without showing it.
func TestLedgerPeriodStart(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, url string) {
		b := New(openDB(t, url), Config{TestPayments: true})
		if err := b.Welcome(context.Background(), "p-demo", 5000); err != nil {
			t.Fatal(err)
		}
		st, body := call(t, startAPI(t, b), "GET", "/v1/ledger", "demo", "")
		entries, _ := body["ledger"].([]any)
		if st != 200 || len(entries) != 1 {
			t.Fatalf("ledger %d %v", st, body)
		}
		if e := entries[0].(map[string]any); e["kind"] != "adjustment" || e["amount"] != float64(5000) || e["period_start"] != nil {
			t.Fatalf("welcome entry %v", e)
		}
	})
}
