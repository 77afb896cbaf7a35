package network_test

import (
	"net/http"
	"strings"
	"testing"

	"nimbus/internal/network"
	"nimbus/internal/testenv"
)

// TestFloatingIPNeedsRouter: a floating IP goes only to a port whose
// subnet a router joins to the floating IP's network, on create and on
// update (Tempest's FloatingIPNegativeTestJSON ..._ext_net_unreachable),
// and that router cannot then drop the interface or the gateway the
// address needs while no other router gives it.
func TestFloatingIPNeedsRouter(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		tok := e.demoTok
		// mk sends a request that must answer want and returns the id of
		// the resource named key in the answer.
		mk := func(method, path, body string, want int, key string) string {
			t.Helper()
			code, m := e.do(t, method, path, tok, body)
			if code != want {
				t.Fatalf("%s %s: %d %v, want %d", method, path, code, m, want)
			}
			if key == "" {
				return ""
			}
			id, _ := m[key].(map[string]any)["id"].(string)
			return id
		}
		pub := networkByName(t, e.demo, network.PublicNetwork).ID
		net := mk("POST", "/v2.0/networks", `{"network":{"name":"fip-reach"}}`, 201, "network")
		sub := mk("POST", "/v2.0/subnets", `{"subnet":{"network_id":"`+net+`","cidr":"10.91.0.0/24","ip_version":4}}`, 201, "subnet")
		port := mk("POST", "/v2.0/ports", `{"port":{"network_id":"`+net+`"}}`, 201, "port")
		spare := mk("POST", "/v2.0/floatingips", `{"floatingip":{"floating_network_id":"`+pub+`"}}`, 201, "floatingip")
		withPort := `{"floatingip":{"floating_network_id":"` + pub + `","port_id":"` + port + `"}}`
		toPort := `{"floatingip":{"port_id":"` + port + `"}}`
		count := func() int {
			t.Helper()
			code, m := e.do(t, "GET", "/v2.0/floatingips", tok, "")
			if code != 200 {
				t.Fatalf("list: %d %v", code, m)
			}
			return len(m["floatingips"].([]any))
		}

		// refused is each way of pointing an address at the port, refused
		// while no router with a gateway on public has the subnet.
		refused := func(stage string) {
			t.Helper()
			before := count()
			for _, tt := range []struct{ method, path, body string }{
				{"POST", "/v2.0/floatingips", withPort},
				{"PUT", "/v2.0/floatingips/" + spare, toPort},
			} {
				code, m := e.do(t, tt.method, tt.path, tok, tt.body)
				msg, _ := m["NeutronError"].(map[string]any)["message"].(string)
				if code != http.StatusNotFound || neutronType(m) != "ExternalGatewayForFloatingIPNotFound" ||
					!strings.Contains(msg, "External network "+pub+" is not reachable from subnet "+sub) || !strings.Contains(msg, port) {
					t.Errorf("%s: %s %s: %d %v", stage, tt.method, tt.path, code, m)
				}
			}
			if n := count(); n != before {
				t.Errorf("%s: a refused create left a floating IP (%d, was %d)", stage, n, before)
			}
		}
		refused("no router")
		rt := mk("POST", "/v2.0/routers", `{"router":{"name":"r1"}}`, 201, "router")
		mk("PUT", "/v2.0/routers/"+rt+"/add_router_interface", `{"subnet_id":"`+sub+`"}`, 200, "")
		refused("router without gateway")
		mk("PUT", "/v2.0/routers/"+rt, `{"router":{"external_gateway_info":{"network_id":"`+pub+`"}}}`, 200, "")
		code, m := e.do(t, "POST", "/v2.0/floatingips", tok, withPort)
		fip, _ := m["floatingip"].(map[string]any)
		if code != 201 || fip["router_id"] != rt || fip["port_id"] != port {
			t.Fatalf("create with port behind the router: %d %v", code, m)
		}

		// While the address is on the port, the router keeps what it needs.
		for _, tt := range []struct {
			what, method, path, body, typ string
		}{
			{"remove interface", "PUT", "/v2.0/routers/" + rt + "/remove_router_interface", `{"subnet_id":"` + sub + `"}`, "RouterInterfaceInUseByFloatingIP"},
			{"clear gateway", "PUT", "/v2.0/routers/" + rt, `{"router":{"external_gateway_info":{}}}`, "RouterExternalGatewayInUseByFloatingIp"},
		} {
			if code, m := e.do(t, tt.method, tt.path, tok, tt.body); code != http.StatusConflict || neutronType(m) != tt.typ {
				t.Errorf("%s: %d %v, want 409 %s", tt.what, code, m, tt.typ)
			}
		}
		// A second router on the subnet with its own gateway gives the
		// address another path, so the first may go.
		rport := mk("POST", "/v2.0/ports", `{"port":{"network_id":"`+net+`","fixed_ips":[{"ip_address":"10.91.0.254"}]}}`, 201, "port")
		rt2 := mk("POST", "/v2.0/routers", `{"router":{"name":"r2","external_gateway_info":{"network_id":"`+pub+`"}}}`, 201, "router")
		mk("PUT", "/v2.0/routers/"+rt2+"/add_router_interface", `{"port_id":"`+rport+`"}`, 200, "")
		mk("PUT", "/v2.0/routers/"+rt+"/remove_router_interface", `{"subnet_id":"`+sub+`"}`, 200, "")
		if code, m := e.do(t, "PUT", "/v2.0/routers/"+rt2, tok, `{"router":{"external_gateway_info":{}}}`); code != http.StatusConflict {
			t.Errorf("clear the last path's gateway: %d %v", code, m)
		}
		// Once the address leaves the port, nothing holds the router.
		mk("PUT", "/v2.0/floatingips/"+fip["id"].(string), `{"floatingip":{"port_id":null}}`, 200, "")
		mk("PUT", "/v2.0/routers/"+rt2, `{"router":{"external_gateway_info":{}}}`, 200, "")
		mk("PUT", "/v2.0/routers/"+rt2+"/remove_router_interface", `{"port_id":"`+rport+`"}`, 200, "")
		refused("routers gone")
		for _, id := range []string{rt, rt2} {
			mk("DELETE", "/v2.0/routers/"+id, "", 204, "")
		}
	})
}

// routeToPublic gives demo a router from subnet to the public network, as
// a floating IP on the subnet needs, and returns a func that takes it away.
func (e *env) routeToPublic(t *testing.T, subnet string) func() {
	t.Helper()
	pub := networkByName(t, e.demo, network.PublicNetwork).ID
	code, m := e.do(t, "POST", "/v2.0/routers", e.demoTok, `{"router":{"name":"to-public","external_gateway_info":{"network_id":"`+pub+`"}}}`)
	if code != 201 {
		t.Fatalf("router: %d %v", code, m)
	}
	rt := m["router"].(map[string]any)["id"].(string)
	if code, m := e.do(t, "PUT", "/v2.0/routers/"+rt+"/add_router_interface", e.demoTok, `{"subnet_id":"`+subnet+`"}`); code != 200 {
		t.Fatalf("interface: %d %v", code, m)
	}
	return func() {
		t.Helper()
		if code, m := e.do(t, "PUT", "/v2.0/routers/"+rt+"/remove_router_interface", e.demoTok, `{"subnet_id":"`+subnet+`"}`); code != 200 {
			t.Fatalf("remove interface: %d %v", code, m)
		}
		if code, m := e.do(t, "DELETE", "/v2.0/routers/"+rt, e.demoTok, ""); code != 204 {
			t.Fatalf("delete router: %d %v", code, m)
		}
	}
}
