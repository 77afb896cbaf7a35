package panel_test

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"nimbus/internal/cloud"
	"nimbus/internal/testenv"
)

// TestAssociateMakesRoute: pointing an address at a port that no router
// joins to the public network, the panel first makes the router Neutron
// requires (once per subnet), then associates.
func TestAssociateMakesRoute(t *testing.T) {
	c := startCloud(t)
	hc := testenv.HTTPClient(t, c)
	tok := testenv.Token(t, c, cloud.DemoUser)
	api := func(method, path, body string, want int, out any) {
		t.Helper()
		resp, raw := testenv.Do(t, hc, method, c.NetworkURL+path, tok, body)
		testenv.MustStatus(t, resp, raw, want)
		if out != nil {
			if err := json.Unmarshal([]byte(raw), out); err != nil {
				t.Fatal(err)
			}
		}
	}
	var nets struct {
		Networks []struct {
			ID      string
			Subnets []string
		}
	}
	api("GET", "/v2.0/networks?name=private", "", 200, &nets)
	if len(nets.Networks) != 1 {
		t.Fatalf("private networks: %+v", nets)
	}
	var pub struct{ Networks []struct{ ID string } }
	api("GET", "/v2.0/networks?name=public", "", 200, &pub)
	routers := func() []string {
		var rts struct {
			Routers []struct {
				Name    string
				Gateway *struct {
					NetworkID string `json:"network_id"`
				} `json:"external_gateway_info"`
			}
		}
		api("GET", "/v2.0/routers", "", 200, &rts)
		var out []string
		for _, r := range rts.Routers {
			if r.Gateway == nil || r.Gateway.NetworkID != pub.Networks[0].ID {
				t.Errorf("router %s without its gateway on public", r.Name)
			}
			out = append(out, r.Name)
		}
		return out
	}
	w := newWeb(t, c)
	w.login(demoLogin(c))
	for _, step := range []string{"first port: the router is made", "second port: the same router"} {
		var port, fip struct {
			Port       struct{ ID string }
			FloatingIP struct {
				ID     string
				PortID *string `json:"port_id"`
			}
		}
		api("POST", "/v2.0/ports", `{"port":{"network_id":"`+nets.Networks[0].ID+`"}}`, 201, &port)
		api("POST", "/v2.0/floatingips", `{"floatingip":{"floating_network_id":"`+pub.Networks[0].ID+`"}}`, 201, &fip)
		status, loc, _ := w.post("/floating-ips", "/floating-ips/"+fip.FloatingIP.ID+"/associate", url.Values{"port": {port.Port.ID}}, true)
		if msg := flashOf(t, w); status != http.StatusSeeOther || !strings.Contains(msg, "updated") {
			t.Fatalf("%s: %d %s %q", step, status, loc, msg)
		}
		fip.FloatingIP.PortID = nil
		api("GET", "/v2.0/floatingips/"+fip.FloatingIP.ID, "", 200, &fip)
		if fip.FloatingIP.PortID == nil || *fip.FloatingIP.PortID != port.Port.ID {
			t.Errorf("%s: address on %v", step, fip.FloatingIP.PortID)
		}
		if got := routers(); len(got) != 1 || got[0] != "public-router" {
			t.Errorf("%s: routers %v", step, got)
		}
	}
}
