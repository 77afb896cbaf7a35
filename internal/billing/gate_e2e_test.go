package billing_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/flavors"

	"nimbus/internal/cloud"
	"nimbus/internal/testenv"
)

// TestGateBelowCreditLimit drives a real cloud: below the credit limit
// every call that starts or raises a charge — a resize to a dearer
// flavor, a volume created or extended, a floating IP allocated or
// attached, a snapshot, a backup — is refused with the very refusal a
// server create gets. The charging pass then suspends the account: the
// server is shelved, the floating IP detached but kept (same address,
// still charged), the volume kept as it was. After a top-up each call
// succeeds again.
func TestGateBelowCreditLimit(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, url string) {
		c, clk, hc, demo := startClocked(t, url, noCredit)
		ctx := context.Background()
		admin := testenv.Token(t, c, cloud.AdminUser)
		project := projectOf(t, c, hc, demo)
		call := func(method, url, body string, want int) string {
			t.Helper()
			resp, raw := testenv.Do(t, hc, method, url, demo, body, "OpenStack-API-Version", "compute 2.79")
			testenv.MustStatus(t, resp, raw, want)
			return raw
		}
		call("POST", c.BillingURL+"/v1/topups", `{"topup": {"amount": 100000, "provider": "test"}}`, 201)

		// While funded: a server, a volume, a port with a floating IP and
		// a second, unattached floating IP.
		sc := testenv.Compute(t, testenv.Provider(t, c, cloud.DemoUser), "2.79")
		image, minRAM, minDisk := baseImage(t, c, hc, demo)
		small := smallest(t, sc, minRAM, minDisk)
		big := dearer(t, sc, small)
		server := idOf(t, call("POST", c.ComputeURL+"/servers",
			`{"server": {"name": "gate", "imageRef": "`+image+`", "flavorRef": "`+small+`", "networks": "none"}}`, 202), "server")
		waitStatus(t, sc, server, "ACTIVE")
		volume := idOf(t, call("POST", c.VolumeURL+"/volumes", `{"volume": {"size": 1}}`, 202), "volume")
		waitVolume(t, c, hc, demo, volume, "available")
		private := networkID(t, c, hc, demo, "private")
		public := networkID(t, c, hc, demo, "public")
		port := idOf(t, call("POST", c.NetworkURL+"/v2.0/ports", `{"port": {"network_id": "`+private+`"}}`, 201), "port")
		// A floating IP needs a router from the port's subnet to public,
		// as in Neutron.
		var subs struct{ Subnets []struct{ ID string } }
		if json.Unmarshal([]byte(call("GET", c.NetworkURL+"/v2.0/subnets?network_id="+private, "", 200)), &subs); len(subs.Subnets) != 1 {
			t.Fatalf("private subnets: %+v", subs)
		}
		router := idOf(t, call("POST", c.NetworkURL+"/v2.0/routers",
			`{"router": {"name": "gate", "external_gateway_info": {"network_id": "`+public+`"}}}`, 201), "router")
		call("PUT", c.NetworkURL+"/v2.0/routers/"+router+"/add_router_interface", `{"subnet_id": "`+subs.Subnets[0].ID+`"}`, 200)
		fipBody := func(portID string) string {
			if portID == "" {
				return `{"floatingip": {"floating_network_id": "` + public + `"}}`
			}
			return `{"floatingip": {"floating_network_id": "` + public + `", "port_id": "` + portID + `"}}`
		}
		fip := idOf(t, call("POST", c.NetworkURL+"/v2.0/floatingips", fipBody(port), 201), "floatingip")
		spare := idOf(t, call("POST", c.NetworkURL+"/v2.0/floatingips", fipBody(""), 201), "floatingip")
		address := fipOf(t, c, hc, demo, fip).Address
		var queued struct{ ID string }
		json.Unmarshal([]byte(call("POST", c.ImageURL+"/v2/images", `{"name": "up", "disk_format": "raw", "container_format": "bare"}`, 201)), &queued)
		upload := func() (*http.Response, string) {
			return testenv.Do(t, hc, "PUT", c.ImageURL+"/v2/images/"+queued.ID+"/file", demo, "image data",
				"Content-Type", "application/octet-stream")
		}

		// −10.00 below a credit limit of 0.
		var acct struct{ Account struct{ Balance int64 } }
		json.Unmarshal([]byte(call("GET", c.BillingURL+"/v1/account", "", 200)), &acct)
		resp, raw := testenv.Do(t, hc, "POST", c.BillingURL+"/v1/accounts/"+project+"/adjustments", admin,
			testenv.Sprintf(`{"adjustment": {"amount": %d, "reference": "test"}}`, -acct.Account.Balance-1000))
		testenv.MustStatus(t, resp, raw, 201)

		// The refusal a create gets, and that every other call must give
		// in its own words: what its first hour costs, what is left.
		refusal := messageOf(t, call("POST", c.ComputeURL+"/servers",
			`{"server": {"name": "gate", "imageRef": "`+image+`", "flavorRef": "`+small+`", "networks": "none"}}`, 403))
		const prepaid = "Please top up first: the service is prepaid."
		if !strings.Contains(refusal, "do not cover this request: its first hour costs") || !strings.HasSuffix(refusal, prepaid) {
			t.Errorf("a create is refused with %q", refusal)
		}
		refused := []struct{ name, method, url, body string }{
			{"createImage", "POST", c.ComputeURL + "/servers/" + server + "/action", `{"createImage": {"name": "snap"}}`},
			{"createBackup", "POST", c.ComputeURL + "/servers/" + server + "/action",
				`{"createBackup": {"name": "bak", "backup_type": "daily", "rotation": 1}}`},
			{"volume create", "POST", c.VolumeURL + "/volumes", `{"volume": {"size": 999}}`},
			{"volume extend", "POST", c.VolumeURL + "/volumes/" + volume + "/action", `{"os-extend": {"new_size": 2}}`},
			{"floating IP create", "POST", c.NetworkURL + "/v2.0/floatingips", fipBody("")},
			{"floating IP attach", "PUT", c.NetworkURL + "/v2.0/floatingips/" + spare, `{"floatingip": {"port_id": "` + port + `"}}`},
			{"resize to a dearer flavor", "POST", c.ComputeURL + "/servers/" + server + "/action", `{"resize": {"flavorRef": "` + big + `"}}`},
		}
		for _, r := range refused {
			resp, raw := testenv.Do(t, hc, r.method, r.url, demo, r.body, "OpenStack-API-Version", "compute 2.79")
			if resp.StatusCode != http.StatusForbidden || !strings.HasSuffix(messageOf(t, raw), prepaid) {
				t.Errorf("%s below the credit limit: %d %s; want 403 ending %q", r.name, resp.StatusCode, raw, prepaid)
			}
		}
		// Image data is charged per GB-hour: its upload is refused too.
		if resp, raw := upload(); resp.StatusCode != http.StatusForbidden || !strings.Contains(raw, "are spent") {
			t.Errorf("image upload below the credit limit: %d %s; want 403 saying the funds are spent", resp.StatusCode, raw)
		}

		// The charging pass suspends the account, keeping its data.
		if _, err := c.Billing.ChargeUntil(ctx, clk.add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		waitStatus(t, sc, server, "SHELVED_OFFLOADED")
		if f := fipOf(t, c, hc, demo, fip); f.PortID != nil || f.Address != address {
			t.Fatalf("suspended floating IP: port %v, address %s; want detached, still %s", f.PortID, f.Address, address)
		}
		waitVolume(t, c, hc, demo, volume, "available")
		charges := func(id string) int {
			var n int
			if err := c.DB.QueryRow(ctx, "SELECT COUNT(*) FROM billing_ledger WHERE kind = 'charge' AND resource_id = ?", id).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
		ipHours, volHours := charges(fip), charges(volume)
		if _, err := c.Billing.ChargeUntil(ctx, clk.add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		if charges(fip) != ipHours+1 || charges(volume) != volHours+1 {
			t.Fatalf("a kept address and volume are charged on: address %d → %d hours, volume %d → %d",
				ipHours, charges(fip), volHours, charges(volume))
		}

		// A top-up reopens every call.
		call("POST", c.BillingURL+"/v1/topups", `{"topup": {"amount": 100000, "provider": "test"}}`, 201)
		call("PUT", c.NetworkURL+"/v2.0/floatingips/"+fip, `{"floatingip": {"port_id": "`+port+`"}}`, 200)
		call("POST", c.NetworkURL+"/v2.0/floatingips", fipBody(""), 201)
		call("POST", c.VolumeURL+"/volumes", `{"volume": {"size": 100}}`, 202)
		call("POST", c.VolumeURL+"/volumes/"+volume+"/action", `{"os-extend": {"new_size": 2}}`, 202)
		if resp, raw := upload(); resp.StatusCode != http.StatusNoContent {
			t.Errorf("image upload after a top-up: %d %s", resp.StatusCode, raw)
		}
		call("POST", c.ComputeURL+"/servers/"+server+"/action", `{"unshelve": null}`, 202)
		waitStatus(t, sc, server, "ACTIVE")
		call("POST", c.ComputeURL+"/servers/"+server+"/action", `{"createImage": {"name": "snap"}}`, 202)
		waitTaskDone(t, c, hc, demo, server)
		call("POST", c.ComputeURL+"/servers/"+server+"/action", `{"resize": {"flavorRef": "`+big+`"}}`, 202)
		waitStatus(t, sc, server, "VERIFY_RESIZE")
	})
}

// dearer is a flavor without a GPU, of the same disk type, with more
// vCPUs and RAM and at least the disk of flavor base.
func dearer(t *testing.T, sc *gophercloud.ServiceClient, base string) string {
	t.Helper()
	pages, err := flavors.ListDetail(sc, nil).AllPages(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	fs, err := flavors.ExtractFlavors(pages)
	if err != nil {
		t.Fatal(err)
	}
	var b *flavors.Flavor
	for i := range fs {
		if fs[i].ID == base {
			b = &fs[i]
		}
	}
	for _, f := range fs {
		if f.VCPUs > b.VCPUs && f.RAM > b.RAM && f.Disk >= b.Disk && f.ExtraSpecs["nimbus:gpu_model"] == "" &&
			f.ExtraSpecs["nimbus:disk_type"] == b.ExtraSpecs["nimbus:disk_type"] {
			return f.ID
		}
	}
	t.Fatalf("no flavor dearer than %s", b.Name)
	return ""
}

// idOf is the id of the object under key in a create's answer.
func idOf(t *testing.T, raw, key string) string {
	t.Helper()
	var body map[string]struct{ ID string }
	if err := json.Unmarshal([]byte(raw), &body); err != nil || body[key].ID == "" {
		t.Fatalf("no %s id in %s", key, raw)
	}
	return body[key].ID
}

// messageOf is the message of an OpenStack error body, in Nova's, Cinder's
// or Neutron's shape.
func messageOf(t *testing.T, raw string) string {
	t.Helper()
	var body map[string]json.RawMessage
	if err := json.Unmarshal([]byte(raw), &body); err != nil || len(body) != 1 {
		t.Fatalf("not an error body: %s", raw)
	}
	for _, v := range body {
		var e struct{ Message string }
		json.Unmarshal(v, &e)
		if e.Message != "" {
			return e.Message
		}
	}
	t.Fatalf("no message in %s", raw)
	return ""
}

func networkID(t *testing.T, c *cloud.Cloud, hc *http.Client, token, name string) string {
	t.Helper()
	resp, raw := testenv.Do(t, hc, "GET", c.NetworkURL+"/v2.0/networks?name="+name, token, "")
	testenv.MustStatus(t, resp, raw, 200)
	var nets struct{ Networks []struct{ ID string } }
	if json.Unmarshal([]byte(raw), &nets); len(nets.Networks) != 1 {
		t.Fatalf("network %s: %s", name, raw)
	}
	return nets.Networks[0].ID
}

type floatingIP struct {
	Address string  `json:"floating_ip_address"`
	PortID  *string `json:"port_id"`
}

func fipOf(t *testing.T, c *cloud.Cloud, hc *http.Client, token, id string) floatingIP {
	t.Helper()
	resp, raw := testenv.Do(t, hc, "GET", c.NetworkURL+"/v2.0/floatingips/"+id, token, "")
	testenv.MustStatus(t, resp, raw, 200)
	var body struct{ Floatingip floatingIP }
	json.Unmarshal([]byte(raw), &body)
	return body.Floatingip
}

func waitVolume(t *testing.T, c *cloud.Cloud, hc *http.Client, token, id, want string) {
	t.Helper()
	poll(t, "volume "+id+" "+want, func() bool {
		resp, raw := testenv.Do(t, hc, "GET", c.VolumeURL+"/volumes/"+id, token, "")
		testenv.MustStatus(t, resp, raw, 200)
		var body struct{ Volume struct{ Status string } }
		json.Unmarshal([]byte(raw), &body)
		return body.Volume.Status == want
	})
}

// waitTaskDone waits until the server has no task (a snapshot stored).
func waitTaskDone(t *testing.T, c *cloud.Cloud, hc *http.Client, token, id string) {
	t.Helper()
	poll(t, "server "+id+" without a task", func() bool {
		resp, raw := testenv.Do(t, hc, "GET", c.ComputeURL+"/servers/"+id, token, "")
		testenv.MustStatus(t, resp, raw, 200)
		var body struct {
			Server struct {
				Task *string `json:"OS-EXT-STS:task_state"`
			}
		}
		json.Unmarshal([]byte(raw), &body)
		return body.Server.Task == nil
	})
}

func poll(t *testing.T, what string, done func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !done(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}
