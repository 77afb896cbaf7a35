package network_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"

	"nimbus/internal/testenv"
)

func tagList(n int) string {
	return testenv.JSONList(n, func(i int) string { return fmt.Sprintf("%q", fmt.Sprintf("t%d", i)) })
}

// TestNetworkBounds: the customer-controlled lists of the network API are
// bounded as neutron bounds them, and a server's fixed_ip keeps the port
// API's owner-only rule and never gets a subnet's gateway.
func TestNetworkBounds(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newBindingEnv(t, dbURL)
		ctx := context.Background()
		n, err := networks.Create(ctx, e.demo, networks.CreateOpts{Name: "bounds"}).Extract()
		if err != nil {
			t.Fatal(err)
		}
		sub, err := subnets.Create(ctx, e.demo, subnets.CreateOpts{NetworkID: n.ID, CIDR: "10.9.0.0/24", IPVersion: 4}).Extract()
		if err != nil {
			t.Fatal(err)
		}
		port, err := ports.Create(ctx, e.demo, ports.CreateOpts{NetworkID: n.ID}).Extract()
		if err != nil {
			t.Fatal(err)
		}
		ips := func(count, from int) string {
			return testenv.JSONList(count, func(i int) string { return fmt.Sprintf(`{"ip_address":"10.9.0.%d"}`, from+i) })
		}
		pairs := func(count int) string {
			return testenv.JSONList(count, func(i int) string { return fmt.Sprintf(`{"ip_address":"192.168.%d.0/24"}`, i) })
		}
		dns := func(count int) string {
			return testenv.JSONList(count, func(i int) string { return fmt.Sprintf(`"10.1.1.%d"`, i+1) })
		}
		routes := func(count int) string {
			return testenv.JSONList(count, func(i int) string {
				return fmt.Sprintf(`{"destination":"172.16.%d.0/24","nexthop":"10.8.2.1"}`, i)
			})
		}
		pools := func(count int) string {
			return testenv.JSONList(count, func(i int) string {
				return fmt.Sprintf(`{"start":"10.8.3.%d","end":"10.8.3.%d"}`, 2+2*i, 3+2*i)
			})
		}
		// Each subnet case has its own CIDR (10.8.net.0/24), so that one
		// accepted by mistake cannot make the next fail for overlapping.
		subnetBody := func(net int, attr string) string {
			return fmt.Sprintf(`{"subnet":{"network_id":%q,"cidr":"10.8.%d.0/24","ip_version":4,%s}}`, n.ID, net, attr)
		}
		for _, tc := range []struct {
			name, method, path, body string
			code                     int
			typ, msg                 string
		}{
			{"tags replace at limit", "PUT", "/v2.0/networks/" + n.ID + "/tags", `{"tags":` + tagList(50) + `}`, 200, "", ""},
			{"tag add over limit", "PUT", "/v2.0/networks/" + n.ID + "/tags/one-more", "", 400, "HTTPBadRequest", "Number of tags 51 exceeds the limit 50"},
			{"tags replace over limit", "PUT", "/v2.0/ports/" + port.ID + "/tags", `{"tags":` + tagList(51) + `}`, 400, "HTTPBadRequest", "exceeds the limit 50"},
			{"fixed_ips create over limit", "POST", "/v2.0/ports", fmt.Sprintf(`{"port":{"network_id":%q,"fixed_ips":%s}}`, n.ID, ips(6, 10)),
				400, "InvalidInput", "Exceeded maximum amount of fixed ips per port."},
			{"fixed_ips update over limit", "PUT", "/v2.0/ports/" + port.ID, `{"port":{"fixed_ips":` + ips(6, 20) + `}}`,
				400, "InvalidInput", "Exceeded maximum amount of fixed ips per port."},
			{"address pairs over limit", "POST", "/v2.0/ports", fmt.Sprintf(`{"port":{"network_id":%q,"allowed_address_pairs":%s}}`, n.ID, pairs(11)),
				400, "AllowedAddressPairExhausted", "exceeds the maximum 10"},
			{"address pairs update over limit", "PUT", "/v2.0/ports/" + port.ID, `{"port":{"allowed_address_pairs":` + pairs(11) + `}}`,
				400, "AllowedAddressPairExhausted", "exceeds the maximum 10"},
			{"dns create over limit", "POST", "/v2.0/subnets", subnetBody(1, `"dns_nameservers":`+dns(6)),
				400, "DNSNameServersExhausted", "Unable to complete operation for new subnet. The number of DNS nameservers exceeds the limit 5."},
			{"dns update over limit", "PUT", "/v2.0/subnets/" + sub.ID, `{"subnet":{"dns_nameservers":` + dns(6) + `}}`,
				400, "DNSNameServersExhausted", "Unable to complete operation for " + sub.ID + "."},
			{"host routes over limit", "POST", "/v2.0/subnets", subnetBody(2, `"host_routes":`+routes(21)),
				400, "HostRoutesExhausted", "The number of host routes exceeds the limit 20."},
			{"allocation pools over limit", "POST", "/v2.0/subnets", subnetBody(3, `"allocation_pools":`+pools(51)),
				400, "InvalidInput", "The number of allocation pools exceeds the limit 50."},
		} {
			t.Run(tc.name, func(t *testing.T) {
				code, m := e.do(t, tc.method, tc.path, e.demoTok, tc.body)
				if code != tc.code || neutronType(m) != tc.typ || !containsStr(m, tc.msg) {
					t.Fatalf("%d %v, want %d %s %q", code, m, tc.code, tc.typ, tc.msg)
				}
			})
		}

		shared := true
		sn, err := networks.Create(ctx, e.admin, networks.CreateOpts{Name: "shared-bounds", Shared: &shared}).Extract()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := subnets.Create(ctx, e.admin, subnets.CreateOpts{NetworkID: sn.ID, CIDR: "172.30.0.0/24", IPVersion: 4}).Extract(); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			name, network, ip string
			code              int
			msg               string
		}{
			{"fixed_ip on a shared network", sn.ID, "172.30.0.50", 403, "create_port:fixed_ips"},
			{"gateway as fixed_ip", n.ID, "10.9.0.1", 400, "Fixed IP address 10.9.0.1 is invalid."},
		} {
			t.Run(tc.name, func(t *testing.T) {
				body := fmt.Sprintf(`{"server":{"name":"b","imageRef":%q,"flavorRef":%q,"networks":[{"uuid":%q,"fixed_ip":%q}]}}`,
					e.imageID, e.flavor, tc.network, tc.ip)
				resp, b := testenv.Do(t, e.http, "POST", e.c.ComputeURL+"/servers", e.demoTok, body,
					"X-OpenStack-Nova-API-Version", "2.37")
				var m map[string]map[string]any
				_ = json.Unmarshal([]byte(b), &m)
				var msg string
				for _, f := range m {
					msg, _ = f["message"].(string)
				}
				if resp.StatusCode != tc.code || !strings.Contains(msg, tc.msg) {
					t.Fatalf("%d %s, want %d %q", resp.StatusCode, b, tc.code, tc.msg)
				}
			})
		}
		// The refused boot left no port holding the gateway.
		code, m := e.do(t, "GET", "/v2.0/ports?fixed_ips=ip_address=10.9.0.1", e.adminTok, "")
		if code != 200 || len(m["ports"].([]any)) != 0 {
			t.Fatalf("gateway handed out: %v", m)
		}
	})
}
