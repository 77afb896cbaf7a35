package network_test

import (
	"context"
	"testing"

	"nimbus/internal/network"
	"nimbus/internal/testenv"
)

// TestProviderAttributes: admins alone see a network's segment and give
// one on create, as Neutron's provider policies say.
func TestProviderAttributes(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		private := e.must(t, 200, "GET", "/v2.0/networks?name=private&project_id="+e.demoProject, e.adminTok, "")["networks"].([]any)[0].(map[string]any)
		id := private["id"].(string)
		cases := []struct {
			name, tok, path string
			want            map[string]any // nil: no provider attribute at all
		}{
			{"admin sees the VXLAN segment", e.adminTok, "/v2.0/networks/" + id,
				map[string]any{"provider:network_type": "vxlan", "provider:physical_network": nil}},
			{"the public network is flat", e.adminTok, "/v2.0/networks?name=public",
				map[string]any{"provider:network_type": "flat", "provider:physical_network": "public", "provider:segmentation_id": nil}},
			{"a member sees none", e.demoTok, "/v2.0/networks/" + id, nil},
			{"nor in a list", e.demoTok, "/v2.0/networks?name=public", nil},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				m := e.must(t, 200, "GET", c.path, c.tok, "")
				if l, ok := m["networks"].([]any); ok {
					m = l[0].(map[string]any)
				}
				for _, k := range []string{"provider:network_type", "provider:segmentation_id", "provider:physical_network"} {
					v, has := m[k]
					if c.want == nil && has {
						t.Errorf("%s shown: %v", k, v)
					}
					if w, ok := c.want[k]; c.want != nil && (!has || ok && v != w) {
						t.Errorf("%s = %v (present %v), want %v", k, v, has, w)
					}
				}
				if c.want != nil && c.want["provider:network_type"] == "vxlan" {
					if vni, _ := m["provider:segmentation_id"].(float64); vni < 1000 {
						t.Errorf("segmentation_id %v", m["provider:segmentation_id"])
					}
				}
			})
		}
		creates := []struct {
			name, tok, body string
			status          int
		}{
			{"a member may not give one", e.demoTok, `{"network":{"name":"x","provider:network_type":"vxlan"}}`, 403},
			{"an admin may", e.adminTok, `{"network":{"name":"x","provider:network_type":"vxlan","provider:segmentation_id":424242}}`, 201},
			{"not twice", e.adminTok, `{"network":{"name":"y","provider:segmentation_id":424242}}`, 409},
			{"only VXLAN", e.adminTok, `{"network":{"name":"y","provider:network_type":"vlan"}}`, 400},
			{"no physical network", e.adminTok, `{"network":{"name":"y","provider:physical_network":"public"}}`, 400},
			{"in range", e.adminTok, `{"network":{"name":"y","provider:segmentation_id":16777216}}`, 400},
		}
		made := ""
		for _, c := range creates {
			t.Run(c.name, func(t *testing.T) {
				m := e.must(t, c.status, "POST", "/v2.0/networks", c.tok, c.body)
				if c.status == 201 {
					made, _ = m["id"].(string)
					if m["provider:segmentation_id"] != float64(424242) {
						t.Errorf("created %v", m)
					}
				}
			})
		}
		own := e.must(t, 201, "POST", "/v2.0/networks", e.demoTok, `{"network":{"name":"own"}}`)["id"].(string)
		updates := []struct {
			name, tok, id, body string
			status              int
		}{
			{"a member may not name one", e.demoTok, own, `{"network":{"provider:network_type":"vxlan"}}`, 403},
			{"a member may not name one, even unchanged", e.demoTok, own, `{"network":{"provider:physical_network":null}}`, 403},
			{"an admin may restate them", e.adminTok, made, `{"network":{"provider:network_type":"vxlan","provider:segmentation_id":424242,"provider:physical_network":null}}`, 200},
			{"but not move the segment", e.adminTok, made, `{"network":{"provider:segmentation_id":424243}}`, 400},
			{"nor change its type", e.adminTok, made, `{"network":{"provider:network_type":"flat"}}`, 400},
		}
		for _, c := range updates {
			t.Run(c.name, func(t *testing.T) {
				e.must(t, c.status, "PUT", "/v2.0/networks/"+c.id, c.tok, c.body)
			})
		}
		if m := e.must(t, 200, "GET", "/v2.0/networks/"+made, e.adminTok, ""); m["provider:segmentation_id"] != float64(424242) {
			t.Errorf("after the updates %v", m)
		}
		t.Run("listed as an extension", func(t *testing.T) {
			e.must(t, 200, "GET", "/v2.0/extensions/provider", e.demoTok, "")
		})
	})
}

// TestDHCPPortLifeCycle: a network's DHCP port is made the first time a
// bridged host needs the network, and neither it nor its address keeps
// the owner from deleting the subnet or the network; every write raises
// the data plane's revision.
func TestDHCPPortLifeCycle(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		hosts := []network.HostInfo{{Name: "gw", VTEP: "192.0.2.1", Gateway: true, Up: true}}
		for _, deleteSubnetFirst := range []bool{true, false} {
			before := e.c.Networks.Revision()
			n := e.must(t, 201, "POST", "/v2.0/networks", e.demoTok, `{"network":{"name":"dhcp"}}`)
			if e.c.Networks.Revision() <= before {
				t.Error("creating a network did not raise the revision")
			}
			netID := n["id"].(string)
			sub := e.must(t, 201, "POST", "/v2.0/subnets", e.demoTok,
				`{"subnet":{"network_id":"`+netID+`","ip_version":4,"cidr":"10.9.0.0/24"}}`)["id"].(string)
			rt := e.must(t, 201, "POST", "/v2.0/routers", e.demoTok, `{"router":{"name":"r"}}`)["id"].(string)
			e.must(t, 200, "PUT", "/v2.0/routers/"+rt+"/add_router_interface", e.demoTok, `{"subnet_id":"`+sub+`"}`)
			st, err := e.c.Networks.HostState(context.Background(), "gw", hosts)
			if err != nil {
				t.Fatal(err)
			}
			var dhcp bool
			for _, sn := range st.Networks {
				dhcp = dhcp || sn.ID == netID && sn.DHCP != nil && len(sn.DHCP.IPs) == 1
			}
			ports := e.must(t, 200, "GET", "/v2.0/ports?device_owner=network:dhcp&network_id="+netID, e.demoTok, "")["ports"].([]any)
			if !dhcp || len(ports) != 1 {
				t.Fatalf("DHCP in the state %v, ports %v", dhcp, ports)
			}
			e.must(t, 200, "PUT", "/v2.0/routers/"+rt+"/remove_router_interface", e.demoTok, `{"subnet_id":"`+sub+`"}`)
			e.must(t, 204, "DELETE", "/v2.0/routers/"+rt, e.demoTok, "")
			if deleteSubnetFirst {
				e.must(t, 204, "DELETE", "/v2.0/subnets/"+sub, e.demoTok, "")
			}
			e.must(t, 204, "DELETE", "/v2.0/networks/"+netID, e.demoTok, "")
			var left int
			if err := e.c.DB.QueryRow(context.Background(), "SELECT COUNT(*) FROM ports WHERE network_id = ?", netID).Scan(&left); err != nil || left != 0 {
				t.Errorf("%d ports left (%v)", left, err)
			}
		}
	})
}
