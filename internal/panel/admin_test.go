package panel_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"nimbus/internal/cloud"
	"nimbus/internal/panel"
	"nimbus/internal/testenv"
)

// TestAdminPagesAreAdminOnly: the operator's customers and trials pages
// and their forms do not exist for a customer.
func TestAdminPagesAreAdminOnly(t *testing.T) {
	c := startCloud(t)
	project := bilProject(t, c, cloud.DemoUser)
	demo := newWeb(t, c)
	demo.login(demoLogin(c))
	op := newWeb(t, c)
	op.login(adminLogin(c))
	for _, path := range []string{"/admin/customers", "/admin/trials", "/admin/customers/" + project} {
		if status, _, _ := demo.get(path); status != http.StatusNotFound {
			t.Errorf("a customer's GET %s: %d, want 404", path, status)
		}
		if status, _, body := op.get(path); status != http.StatusOK {
			t.Errorf("the operator's GET %s: %d %s", path, status, snippet(body))
		}
	}
	for _, path := range []string{"/admin/customers/" + project + "/credit", "/admin/customers/" + project + "/limit",
		"/admin/customers/" + project + "/adjust", "/admin/trials/x/approve", "/admin/trials/x/decline"} {
		form := url.Values{"amount": {"1000"}, "credit_limit": {"1000"}, "reference": {"x"}, "credit": {"1"}, "days": {"1"}, "reason": {"x"}}
		if status, _, _ := demo.post("/billing", path, form, true); status != http.StatusNotFound {
			t.Errorf("a customer's POST %s: %d, want 404", path, status)
		}
	}
	acc, err := c.Billing.Account(context.Background(), project)
	if err != nil {
		t.Fatal(err)
	}
	if acc.Balance != 0 || acc.CreditLimit != 1<<40 {
		t.Fatalf("the customer's posts changed the account: %+v", acc)
	}
}

// TestAdminCustomerActions: the operator credits a payment, adjusts the
// balance and sets the credit limit; the API's refusals come back as the
// page's message.
func TestAdminCustomerActions(t *testing.T) {
	c := startCloud(t)
	ctx := context.Background()
	project := bilProject(t, c, cloud.DemoUser)
	op := newWeb(t, c)
	op.login(adminLogin(c))
	page := "/admin/customers/" + project
	tests := []struct {
		name, action string
		form         url.Values
		wantFlash    string // the one-time message's cookie, unescaped
		wantBalance  int64
		wantLimit    int64
	}{
		{"credit", "credit", url.Values{"amount": {"250.00"}, "reference": {"bank transfer 42"}}, "250.00 RUB (≈ 2.75 USD) is credited", 25000, 1 << 40},
		{"credit without reference", "credit", url.Values{"amount": {"10"}, "reference": {""}}, "'reference' is required", 25000, 1 << 40},
		{"adjust down", "adjust", url.Values{"amount": {"-10,5"}, "reference": {"correction"}}, "adjusted by -10.50 RUB", 23950, 1 << 40},
		{"adjust by nothing", "adjust", url.Values{"amount": {"0"}}, "other than 0", 23950, 1 << 40},
		{"limit", "limit", url.Values{"credit_limit": {"50"}}, "credit limit is now 50.00 RUB", 23950, 5000},
		{"negative limit", "limit", url.Values{"credit_limit": {"-1"}}, "0 or more", 23950, 5000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, loc, body := op.post(page, page+"/"+tt.action, tt.form, true)
			if status != http.StatusSeeOther || loc != page {
				t.Fatalf("POST %s: %d %q %s", tt.action, status, loc, snippet(body))
			}
			if got := flashOf(t, op); !strings.Contains(got, tt.wantFlash) {
				t.Fatalf("the message is %q, want %q", got, tt.wantFlash)
			}
			acc, err := c.Billing.Account(ctx, project)
			if err != nil {
				t.Fatal(err)
			}
			if acc.Balance != tt.wantBalance || acc.CreditLimit != tt.wantLimit {
				t.Fatalf("account %d / %d, want %d / %d", acc.Balance, acc.CreditLimit, tt.wantBalance, tt.wantLimit)
			}
		})
	}
	// The list shows the project with its balance.
	status, _, body := op.get("/admin/customers?q=" + cloud.DemoProject)
	if status != http.StatusOK || !strings.Contains(body, `data-project="`+project+`"`) || !strings.Contains(body, "239.50 RUB") {
		t.Fatalf("the customers list: %d %s", status, snippet(body))
	}
}

// flashOf reads (and clears) the one-time message the last form set.
func flashOf(t testing.TB, w *web) string {
	t.Helper()
	u, _ := url.Parse(w.base)
	var out string
	for _, ck := range w.hc.Jar.Cookies(u) {
		if ck.Name == "nimbus_flash" || ck.Name == "nimbus_flash_error" {
			v, _ := url.QueryUnescape(ck.Value)
			out += v
		}
	}
	w.hc.Jar.SetCookies(u, []*http.Cookie{{Name: "nimbus_flash", Value: "", MaxAge: -1, Path: "/"}, {Name: "nimbus_flash_error", Value: "", MaxAge: -1, Path: "/"}})
	return out
}

// TestSupport: the operator's contacts show on the public support page,
// as started and as changed; a customer's custom-configuration request is
// stored and shown to the operator, and refused when empty or unsigned.
// On both engines: the settings are stored with an upsert.
func TestSupport(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		c := testenv.StartCloud(t, dbURL, func(cfg *cloud.Config) {
			cfg.Panel.Support = panel.Support{Email: "help@nimbus.example", Hours: "24/7"}
		})
		testSupport(t, c)
	})
}

func testSupport(t *testing.T, c *cloud.Cloud) {
	ctx := context.Background()
	anon := newWeb(t, c)
	if status, _, body := anon.get("/support"); status != http.StatusOK || !strings.Contains(body, "help@nimbus.example") || !strings.Contains(body, "24/7") {
		t.Fatalf("support as started: %d %s", status, snippet(body))
	}
	if err := c.Panel.SetSupportSettings(ctx, panel.Support{Messenger: "@nimbus_help", Email: "ops@nimbus.example", Phone: "+7 495 000-00-00", Hours: "9–18 MSK"}); err != nil {
		t.Fatal(err)
	}
	if err := c.Panel.SetSupportSettings(ctx, panel.Support{Email: "two\nlines"}); err == nil {
		t.Fatal("a contact with a line break was stored")
	}
	status, _, body := anon.get("/support")
	for _, want := range []string{"@nimbus_help", "ops@nimbus.example", "495 000-00-00", "9–18 MSK"} {
		if status != http.StatusOK || !strings.Contains(body, want) {
			t.Fatalf("support as changed lacks %q: %d %s", want, status, snippet(body))
		}
	}
	if strings.Contains(body, "help@nimbus.example") {
		t.Fatal("the old e-mail is still shown")
	}
	if status, _, _ := anon.post("/login", "/support/requests", url.Values{"body": {"Eight H100 in one server"}}, true); status != http.StatusForbidden {
		t.Fatalf("a visitor's request: %d, want 403", status)
	}

	demo := newWeb(t, c)
	demo.login(demoLogin(c))
	for _, tt := range []struct {
		body, want string
	}{
		{"short", "Describe the configuration you need"},
		{"Eight H100 GPUs\x00 in one server", "Describe the configuration you need"},
		{"Eight H100 GPUs \xff\xfe in one server", "Describe the configuration you need"},
		{"Eight H100 GPUs in one server, <b>bare</b> metal", "Your request is sent"},
	} {
		if status, _, body := demo.post("/support", "/support/requests", url.Values{"body": {tt.body}}, true); status != http.StatusSeeOther {
			t.Fatalf("request %q: %d %s", tt.body, status, snippet(body))
		}
		if got := flashOf(t, demo); !strings.Contains(got, tt.want) {
			t.Fatalf("request %q: the message is %q", tt.body, got)
		}
	}
	var n int
	var user, state string
	if err := c.DB.QueryRow(ctx, "SELECT COUNT(*), MAX(user_name), MAX(state) FROM panel_config_requests").Scan(&n, &user, &state); err != nil ||
		n != 1 || user != cloud.DemoUser || state != "open" {
		t.Fatalf("stored requests: %d by %q, %q, %v", n, user, state, err)
	}
	if _, _, body := demo.get("/support"); !strings.Contains(body, "&lt;b&gt;bare&lt;/b&gt;") {
		t.Fatalf("the customer's own request is not shown escaped: %s", snippet(body))
	}
	op := newWeb(t, c)
	op.login(adminLogin(c))
	if _, _, body := op.get("/admin/support/requests"); !strings.Contains(body, "Eight H100 GPUs in one server") {
		t.Fatalf("the operator does not see the request: %s", snippet(body))
	}
	if _, _, body := op.get("/admin/trials"); !strings.Contains(body, cloud.DemoProject) {
		t.Fatalf("the trials page does not show the customer with an open request: %s", snippet(body))
	}
}
