package billing_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/flavors"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"

	"nimbus/internal/cloud"
	"nimbus/internal/store"
	"nimbus/internal/testenv"
)

// clock is the billing job's injected clock; compute keeps real time, so
// the test moves billing's clock forward from the real now.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
	return c.t
}

// startClocked starts a real cloud whose billing runs on a test clock set
// to the real now, changed further by opts, and returns it with the clock, a
// client that trusts it and the demo customer's token.
func startClocked(t *testing.T, url string, opts ...testenv.Options) (*cloud.Cloud, *clock, *http.Client, string) {
	t.Helper()
	clk := &clock{t: time.Now().UTC()}
	opts = append([]testenv.Options{func(cfg *cloud.Config) { cfg.Billing.Now = clk.now }}, opts...)
	c := testenv.StartCloud(t, url, opts...)
	// Billing's first pass ever marks where charging starts: run it now,
	// at the test clock's hour, so that the controller's own pass (a job
	// under a lease, run when its controller gets to it) cannot make it
	// later, after the test moved the clock on.
	if _, err := c.Billing.ChargeUntil(context.Background(), clk.now()); err != nil {
		t.Fatal(err)
	}
	return c, clk, testenv.HTTPClient(t, c), testenv.Token(t, c, cloud.DemoUser)
}

// noCredit gives projects no credit limit: they are refused below zero.
func noCredit(cfg *cloud.Config) { cfg.Billing.DefaultCreditLimit = 0 }

// TestRunningDry drives a real cloud: a project whose balance lasts less
// than 72 hours is warned; once the balance falls below minus the credit
// limit, a charging pass shelves its servers (kept, no longer charged),
// creates and unshelves are refused with 403, and a top-up lets the
// customer unshelve and create again.
func TestRunningDry(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, url string) {
		c, clk, hc, demo := startClocked(t, url, noCredit)
		ctx := context.Background()
		bill := func(method, path, body string, want int) map[string]any {
			t.Helper()
			resp, raw := testenv.Do(t, hc, method, c.BillingURL+path, demo, body)
			testenv.MustStatus(t, resp, raw, want)
			var out map[string]any
			json.Unmarshal([]byte(raw), &out)
			return out
		}
		bill("POST", "/v1/topups", `{"topup": {"amount": 10000, "provider": "test"}}`, 201)

		sc := testenv.Compute(t, testenv.Provider(t, c, cloud.DemoUser), "2.79")
		image, minRAM, minDisk := baseImage(t, c, hc, demo)
		flavor := smallest(t, sc, minRAM, minDisk)
		create := func() (*http.Response, string) {
			return testenv.Do(t, hc, "POST", c.ComputeURL+"/servers", demo,
				`{"server": {"name": "dry", "imageRef": "`+image+`", "flavorRef": "`+flavor+`", "networks": "none"}}`,
				"OpenStack-API-Version", "compute 2.79")
		}
		resp, raw := create()
		testenv.MustStatus(t, resp, raw, 202)
		var created struct{ Server struct{ ID string } }
		json.Unmarshal([]byte(raw), &created)
		id := created.Server.ID
		waitStatus(t, sc, id, "ACTIVE")

		// With 100.00 less 50.00 the balance lasts between 24 and 72 hours
		// of this flavor (1.00 an hour): one warning.
		admin := testenv.Token(t, c, cloud.AdminUser)
		project := projectOf(t, c, hc, demo)
		adjust := func(amount string) {
			t.Helper()
			resp, raw := testenv.Do(t, hc, "POST", c.BillingURL+"/v1/accounts/"+project+"/adjustments", admin,
				`{"adjustment": {"amount": `+amount+`, "reference": "test"}}`)
			testenv.MustStatus(t, resp, raw, 201)
		}
		adjust("-5000")
		if _, err := c.Billing.ChargeUntil(ctx, clk.add(time.Minute)); err != nil {
			t.Fatal(err)
		}
		notices := bill("GET", "/v1/notices", "", 200)["notices"].([]any)
		if !hasLevel(notices, "72h") || hasLevel(notices, "24h") || hasLevel(notices, "suspended") {
			t.Fatalf("notices after the first pass: %v", notices)
		}

		// An adjustment takes the balance below the limit: the next pass
		// shelves the server.
		adjust("-20000")
		if _, err := c.Billing.ChargeUntil(ctx, clk.add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		waitStatus(t, sc, id, "SHELVED_OFFLOADED")
		notices = bill("GET", "/v1/notices", "", 200)["notices"].([]any)
		if !hasLevel(notices, "suspended") {
			t.Fatalf("no suspension notice: %v", notices)
		}
		resp, raw = create()
		testenv.MustStatus(t, resp, raw, http.StatusForbidden)
		if !strings.Contains(raw, "top up first") || !strings.Contains(raw, `"forbidden"`) {
			t.Fatalf("create refused with %s", raw)
		}
		unshelve := func() (*http.Response, string) {
			return testenv.Do(t, hc, "POST", c.ComputeURL+"/servers/"+id+"/action", demo, `{"unshelve": null}`)
		}
		resp, raw = unshelve()
		testenv.MustStatus(t, resp, raw, http.StatusForbidden)

		// Charging stopped for the server: another pass charges only the
		// shelve image's storage, which keeps its disk.
		if _, err := c.Billing.ChargeUntil(ctx, clk.add(2*time.Hour)); err != nil {
			t.Fatal(err)
		}
		var serverCharges, otherCharges int
		since := store.FormatTime(clk.now().Add(-90 * time.Minute))
		if err := c.DB.QueryRow(ctx, `SELECT COUNT(*) FROM billing_ledger WHERE kind = 'charge' AND project_id = ? AND resource_id = ? AND period_start >= ?`,
			project, id, since).Scan(&serverCharges); err != nil {
			t.Fatal(err)
		}
		if err := c.DB.QueryRow(ctx, `SELECT COUNT(*) FROM billing_ledger WHERE kind = 'charge' AND project_id = ? AND resource_id <> ? AND period_start >= ?`,
			project, id, since).Scan(&otherCharges); err != nil {
			t.Fatal(err)
		}
		if serverCharges != 0 || otherCharges == 0 {
			t.Fatalf("after shelve: %d charges for the server, %d for its shelve image; want none and some", serverCharges, otherCharges)
		}

		// A top-up past the limit reopens the account.
		bill("POST", "/v1/topups", `{"topup": {"amount": 50000, "provider": "test"}}`, 201)
		resp, raw = unshelve()
		testenv.MustStatus(t, resp, raw, http.StatusAccepted)
		waitStatus(t, sc, id, "ACTIVE")
		resp, raw = create()
		testenv.MustStatus(t, resp, raw, http.StatusAccepted)
	})
}

func hasLevel(notices []any, level string) bool {
	for _, n := range notices {
		if n.(map[string]any)["level"] == level {
			return true
		}
	}
	return false
}

func waitStatus(t *testing.T, sc *gophercloud.ServiceClient, id, want string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := servers.WaitForStatus(ctx, sc, id, want); err != nil {
		t.Fatalf("server %s never %s: %v", id, want, err)
	}
}

// smallest is the smallest flavor without a GPU that the image fits.
func smallest(t *testing.T, sc *gophercloud.ServiceClient, minRAM, minDisk int) string {
	t.Helper()
	pages, err := flavors.ListDetail(sc, nil).AllPages(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	fs, err := flavors.ExtractFlavors(pages)
	if err != nil || len(fs) == 0 {
		t.Fatalf("flavors: %v", err)
	}
	var best *flavors.Flavor
	for i, f := range fs {
		if f.RAM < minRAM || f.Disk < minDisk || f.ExtraSpecs["nimbus:gpu_model"] != "" {
			continue
		}
		if best == nil || f.RAM < best.RAM || (f.RAM == best.RAM && f.VCPUs < best.VCPUs) {
			best = &fs[i]
		}
	}
	if best == nil {
		t.Fatalf("no flavor fits an image of min_ram %d, min_disk %d", minRAM, minDisk)
	}
	return best.ID
}

// baseImage is the public image that needs the least RAM, with its needs.
func baseImage(t *testing.T, c *cloud.Cloud, hc *http.Client, token string) (string, int, int) {
	t.Helper()
	resp, raw := testenv.Do(t, hc, "GET", c.ImageURL+"/v2/images?visibility=public", token, "")
	testenv.MustStatus(t, resp, raw, 200)
	var body struct {
		Images []struct {
			ID      string
			MinRAM  int `json:"min_ram"`
			MinDisk int `json:"min_disk"`
		}
	}
	if err := json.Unmarshal([]byte(raw), &body); err != nil || len(body.Images) == 0 {
		t.Fatalf("images: %s", raw)
	}
	best := body.Images[0]
	for _, im := range body.Images {
		if im.MinRAM < best.MinRAM {
			best = im
		}
	}
	return best.ID, best.MinRAM, best.MinDisk
}

func projectOf(t *testing.T, c *cloud.Cloud, hc *http.Client, token string) string {
	t.Helper()
	resp, raw := testenv.Do(t, hc, "GET", c.BillingURL+"/v1/account", token, "")
	testenv.MustStatus(t, resp, raw, 200)
	var body struct {
		Account struct {
			ProjectID string `json:"project_id"`
		}
	}
	json.Unmarshal([]byte(raw), &body)
	return body.Account.ProjectID
}

// TestTenantUsageMatchesLedger: os-simple-tenant-usage on the compute API
// reports for each server the hours the ledger charged it.
func TestTenantUsageMatchesLedger(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, url string) {
		c := testenv.StartCloud(t, url)
		ctx := context.Background()
		hc := testenv.HTTPClient(t, c)
		demo := testenv.Token(t, c, cloud.DemoUser)
		sc := testenv.Compute(t, testenv.Provider(t, c, cloud.DemoUser), "2.79")
		image, minRAM, minDisk := baseImage(t, c, hc, demo)
		flavor := smallest(t, sc, minRAM, minDisk)
		var ids []string
		for i := 0; i < 2; i++ {
			resp, raw := testenv.Do(t, hc, "POST", c.ComputeURL+"/servers", demo,
				`{"server": {"name": "usage", "imageRef": "`+image+`", "flavorRef": "`+flavor+`", "networks": "none"}}`,
				"OpenStack-API-Version", "compute 2.79")
			testenv.MustStatus(t, resp, raw, 202)
			var created struct{ Server struct{ ID string } }
			json.Unmarshal([]byte(raw), &created)
			ids = append(ids, created.Server.ID)
		}
		for _, id := range ids {
			waitStatus(t, sc, id, "ACTIVE")
		}
		// One is shelved: its hour stays charged and counted.
		resp, raw := testenv.Do(t, hc, "POST", c.ComputeURL+"/servers/"+ids[1]+"/action", demo, `{"shelve": null}`)
		testenv.MustStatus(t, resp, raw, 202)
		waitStatus(t, sc, ids[1], "SHELVED_OFFLOADED")
		now := time.Now().UTC()
		if _, err := c.Billing.ChargeUntil(ctx, now); err != nil {
			t.Fatal(err)
		}
		project := projectOf(t, c, hc, demo)
		start := now.Add(-2 * time.Hour).Format("2006-01-02T15:04:05")
		end := now.Add(2 * time.Hour).Format("2006-01-02T15:04:05")
		resp, raw = testenv.Do(t, hc, "GET", c.ComputeURL+"/os-simple-tenant-usage/"+project+"?detailed=1&start="+start+"&end="+end, demo, "")
		testenv.MustStatus(t, resp, raw, 200)
		var body struct {
			TenantUsage struct {
				TotalHours   float64 `json:"total_hours"`
				ServerUsages []struct {
					InstanceID string  `json:"instance_id"`
					Hours      float64 `json:"hours"`
				} `json:"server_usages"`
			} `json:"tenant_usage"`
		}
		if err := json.Unmarshal([]byte(raw), &body); err != nil {
			t.Fatal(err)
		}
		var total float64
		for _, su := range body.TenantUsage.ServerUsages {
			var n int
			if err := c.DB.QueryRow(ctx, "SELECT COUNT(*) FROM billing_ledger WHERE kind = 'charge' AND resource_id = ?", su.InstanceID).Scan(&n); err != nil {
				t.Fatal(err)
			}
			if float64(n) != su.Hours || n == 0 {
				t.Fatalf("server %s: usage %v hours, ledger %d", su.InstanceID, su.Hours, n)
			}
			total += su.Hours
		}
		if len(body.TenantUsage.ServerUsages) != 2 || total != body.TenantUsage.TotalHours {
			t.Fatalf("usage %s", raw)
		}
	})
}

// TestPublicIPCharged: a floating IP is charged each hour from allocation
// to release, at the public IPv4 rate.
func TestPublicIPCharged(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, url string) {
		c, clk, hc, demo := startClocked(t, url)
		ctx := context.Background()
		resp, raw := testenv.Do(t, hc, "GET", c.NetworkURL+"/v2.0/networks?name=public", demo, "")
		testenv.MustStatus(t, resp, raw, 200)
		var nets struct{ Networks []struct{ ID string } }
		if json.Unmarshal([]byte(raw), &nets); len(nets.Networks) != 1 {
			t.Fatalf("public network: %s", raw)
		}
		resp, raw = testenv.Do(t, hc, "POST", c.NetworkURL+"/v2.0/floatingips", demo,
			`{"floatingip": {"floating_network_id": "`+nets.Networks[0].ID+`"}}`)
		testenv.MustStatus(t, resp, raw, 201)
		var fip struct{ Floatingip struct{ ID string } }
		json.Unmarshal([]byte(raw), &fip)
		id := fip.Floatingip.ID
		if _, err := c.Billing.ChargeUntil(ctx, clk.add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		prices, err := c.Billing.Prices(ctx)
		if err != nil {
			t.Fatal(err)
		}
		want := (prices.PublicIPv4 + 9999) / 10000
		charges := func() (int, int64) {
			var n int
			var sum int64
			if err := c.DB.QueryRow(ctx, "SELECT COUNT(*), COALESCE(SUM(amount), 0) FROM billing_ledger WHERE kind = 'charge' AND resource_id = ?", id).Scan(&n, &sum); err != nil {
				t.Fatal(err)
			}
			return n, sum
		}
		// The hour it was allocated in and the next one.
		if n, sum := charges(); n != 2 || sum != -2*want {
			t.Fatalf("floating IP: %d charges, %d; want 2 of %d", n, sum, want)
		}
		resp, raw = testenv.Do(t, hc, "DELETE", c.NetworkURL+"/v2.0/floatingips/"+id, demo, "")
		testenv.MustStatus(t, resp, raw, 204)
		if _, err := c.Billing.ChargeUntil(ctx, clk.add(3*time.Hour)); err != nil {
			t.Fatal(err)
		}
		if n, _ := charges(); n != 2 {
			t.Fatalf("a released address was charged on: %d charges", n)
		}
	})
}
