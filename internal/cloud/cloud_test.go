package cloud_test

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"

	"nimbus/internal/cloud"
	"nimbus/internal/testenv"
)

// TestFirstStartAndRestart checks what the first start leaves in the data
// directory and that a second start on it keeps the accounts.
func TestFirstStartAndRestart(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		c := testenv.StartCloud(t, dbURL, func(nc *cloud.Config) { nc.DemoCredit = 5000 })
		for _, f := range []string{c.CACertFile, c.CloudsFile} {
			if _, err := os.Stat(f); err != nil {
				t.Fatalf("missing %s: %v", f, err)
			}
		}
		for _, f := range []string{c.CloudsFile, c.Config.DataDir + "/secrets.json", c.Config.DataDir + "/demo-openrc.sh"} {
			st, err := os.Stat(f)
			if err != nil {
				t.Fatal(err)
			}
			if st.Mode().Perm() != 0o600 {
				t.Errorf("%s has mode %v, want 0600", f, st.Mode().Perm())
			}
		}
		tok := testenv.Token(t, c, cloud.DemoUser)
		client := testenv.HTTPClient(t, c)
		resp, body := testenv.Do(t, client, "GET", c.IdentityURL+"/auth/tokens", tok, "", "X-Subject-Token", tok)
		testenv.MustStatus(t, resp, body, http.StatusOK)

		// Billing: the demo project's welcome credit, the admin project's
		// limit, which the operator then lowers.
		account := func(c *cloud.Cloud, name string) (string, int64, int64) {
			t.Helper()
			p, err := c.Identity.ProjectByName(context.Background(), name)
			if err != nil {
				t.Fatal(err)
			}
			a, err := c.Billing.Account(context.Background(), p.ID)
			if err != nil {
				t.Fatal(err)
			}
			return p.ID, a.Balance, a.CreditLimit
		}
		if _, bal, _ := account(c, cloud.DemoProject); bal != 5000 {
			t.Fatalf("demo balance %d, want the welcome credit 5000", bal)
		}
		adminID, _, limit := account(c, cloud.AdminProject)
		if limit != cloud.AdminCreditLimit {
			t.Fatalf("admin credit limit %d", limit)
		}
		if err := c.Billing.SetCreditLimit(context.Background(), adminID, 700); err != nil {
			t.Fatal(err)
		}

		cfg := c.Config
		c.Close()
		cfg.AdminPassword, cfg.DemoPassword = "", ""
		c2 := testenv.StartCloud(t, dbURL, func(nc *cloud.Config) { nc.DataDir = cfg.DataDir })
		if c2.Secrets != c.Secrets {
			t.Fatalf("secrets changed across restart")
		}
		// A restart credits nothing more and keeps the operator's limit.
		if _, bal, _ := account(c2, cloud.DemoProject); bal != 5000 {
			t.Fatalf("demo balance after restart %d, want 5000", bal)
		}
		if _, _, limit := account(c2, cloud.AdminProject); limit != 700 {
			t.Fatalf("admin credit limit after restart %d, want the operator's 700", limit)
		}
		// The token issued before the restart is still valid.
		resp, body = testenv.Do(t, testenv.HTTPClient(t, c2), "GET", c2.IdentityURL+"/auth/tokens", tok, "", "X-Subject-Token", tok)
		testenv.MustStatus(t, resp, body, http.StatusOK)
	})
}

// TestHealthAndMetrics checks the operator endpoints every listener serves.
func TestHealthAndMetrics(t *testing.T) {
	c := testenv.StartCloud(t, "", func(cfg *cloud.Config) { cfg.MetricsListen, cfg.MetricsToken = "127.0.0.1:0", "scrape-me" })
	client := testenv.HTTPClient(t, c)
	resp, body := testenv.Do(t, client, "GET", strings.TrimSuffix(c.ComputeURL, "/v2.1")+"/healthz", "", "")
	testenv.MustStatus(t, resp, body, http.StatusOK)

	tok := testenv.Token(t, c, cloud.DemoUser)
	resp, body = testenv.Do(t, client, "GET", c.ImageURL+"/v2/images?os_type=linux&limit=1", tok, "")
	testenv.MustStatus(t, resp, body, http.StatusOK)
	var images struct {
		Images []struct{ ID string } `json:"images"`
	}
	if err := json.Unmarshal([]byte(body), &images); err != nil || len(images.Images) != 1 {
		t.Fatalf("images: %v %s", err, body)
	}
	resp, body = testenv.Do(t, client, "POST", c.ComputeURL+"/servers", tok,
		`{"server":{"name":"m","imageRef":"`+images.Images[0].ID+`","flavorRef":"2"}}`)
	testenv.MustStatus(t, resp, body, http.StatusAccepted)

	// The customers' ports serve no metrics; the metrics listener does,
	// to the token only.
	for _, u := range []string{c.NetworkURL, strings.TrimSuffix(c.ComputeURL, "/v2.1"), c.PanelURL, c.BillingURL} {
		resp, body = testenv.Do(t, client, "GET", u+"/metrics", "", "")
		if resp.StatusCode == http.StatusOK || strings.Contains(body, "nimbus_http_requests_total") {
			t.Errorf("%s/metrics answered %d", u, resp.StatusCode)
		}
	}
	resp, body = testenv.Do(t, client, "GET", c.MetricsURL, "", "")
	testenv.MustStatus(t, resp, body, http.StatusUnauthorized)
	resp, body = testenv.Do(t, client, "GET", c.MetricsURL, "", "", "Authorization", "Bearer wrong")
	testenv.MustStatus(t, resp, body, http.StatusUnauthorized)
	resp, body = testenv.Do(t, client, "GET", c.MetricsURL, "", "", "Authorization", "Bearer scrape-me")
	testenv.MustStatus(t, resp, body, http.StatusOK)
	for _, want := range []string{`nimbus_http_requests_total{code="202",method="POST",service="compute"}`,
		`nimbus_http_request_duration_seconds_bucket`, `nimbus_servers{status=`} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}
