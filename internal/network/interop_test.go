package network_test

import (
	"fmt"
	"strings"
	"testing"

	"nimbus/internal/testenv"
)

// Neutron behaviours the interop guideline's networks-* Tempest tests
// check: security group port ranges, router interfaces on overlapping
// subnets, extra routes (extraroute, extraroute-atomic) and subnet pools
// (subnet_allocation, default-subnetpools).
func TestNeutronInterop(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		t.Run("rule_ports", e.testRulePorts)
		t.Run("router_overlap", e.testRouterOverlap)
		t.Run("extra_routes", e.testExtraRoutes)
		t.Run("subnet_pools", e.testSubnetPools)
		t.Run("subnets_from_pools", e.testSubnetsFromPools)
	})
}

// must sends a request that must answer want and returns the answer's
// resource (the body's only key's value when it is an object).
func (e *env) must(t *testing.T, want int, method, path, tok, body string) map[string]any {
	t.Helper()
	code, m := e.do(t, method, path, tok, body)
	if code != want {
		t.Fatalf("%s %s %s: %d %v, want %d", method, path, body, code, m, want)
	}
	for _, v := range m {
		if r, ok := v.(map[string]any); ok && len(m) == 1 {
			return r
		}
	}
	return m
}

// refused sends a request that must fail with status, Neutron's exception
// type and a message containing msg.
func (e *env) refused(t *testing.T, status int, typ, msg, method, path, tok, body string) {
	t.Helper()
	code, m := e.do(t, method, path, tok, body)
	ne, _ := m["NeutronError"].(map[string]any)
	got, _ := ne["message"].(string)
	if code != status || neutronType(m) != typ || !strings.Contains(got, msg) {
		t.Errorf("%s %s %s: %d %v, want %d %s %q", method, path, body, code, m, status, typ, msg)
	}
}

// netWithSubnet makes a network of the demo project with one IPv4 subnet.
func (e *env) netWithSubnet(t *testing.T, cidr string) (netID, subnetID string) {
	t.Helper()
	n := e.must(t, 201, "POST", "/v2.0/networks", e.demoTok, `{"network":{"name":"n-`+cidr+`"}}`)
	netID = n["id"].(string)
	s := e.must(t, 201, "POST", "/v2.0/subnets", e.demoTok,
		`{"subnet":{"network_id":"`+netID+`","ip_version":4,"cidr":"`+cidr+`"}}`)
	return netID, s["id"].(string)
}

func (e *env) testRulePorts(t *testing.T) {
	g := e.must(t, 201, "POST", "/v2.0/security-groups", e.demoTok, `{"security_group":{"name":"ports"}}`)
	null := func(v *int) string {
		if v == nil {
			return "null"
		}
		return fmt.Sprint(*v)
	}
	n := func(v int) *int { return &v }
	// The cases of tempest's test_create_security_group_rule_with_invalid_ports,
	// with neutron's exception types.
	for _, c := range []struct {
		proto    string
		min, max *int
		typ, msg string
	}{
		{"tcp", n(-16), n(80), "SecurityGroupInvalidPortValue", "Invalid value for port -16"},
		{"tcp", n(80), n(79), "SecurityGroupInvalidPortRange", "port_range_min must be <= port_range_max"},
		{"tcp", n(80), n(65536), "SecurityGroupInvalidPortValue", "Invalid value for port 65536"},
		{"tcp", nil, n(6), "SecurityGroupInvalidPortRange", "port_range_min must be <= port_range_max"},
		{"tcp", n(6), nil, "SecurityGroupInvalidPortRange", "port_range_min must be <= port_range_max"},
		{"tcp", n(-16), n(65536), "SecurityGroupInvalidPortValue", "Invalid value for port"},
		{"udp", n(0), n(53), "SecurityGroupInvalidPortValue", "Invalid value for port 0"},
		{"icmp", n(1), n(256), "SecurityGroupInvalidIcmpValue", "Invalid value for ICMP code (port_range_max) 256. It must be 0 to 255."},
		{"icmp", n(-1), n(25), "SecurityGroupInvalidPortValue", "Invalid value"},
		{"icmp", nil, n(6), "SecurityGroupMissingIcmpType", "ICMP type (port-range-min) is missing"},
		{"icmp", n(300), n(1), "SecurityGroupInvalidIcmpValue", "Invalid value for ICMP type (port_range_min) 300"},
	} {
		body := fmt.Sprintf(`{"security_group_rule":{"security_group_id":"%s","direction":"ingress","protocol":"%s","port_range_min":%s,"port_range_max":%s}}`,
			g["id"], c.proto, null(c.min), null(c.max))
		e.refused(t, 400, c.typ, c.msg, "POST", "/v2.0/security-group-rules", e.demoTok, body)
	}
	// Good ranges still pass: one port, a range, an ICMP type alone.
	for _, ok := range []string{`"protocol":"tcp","port_range_min":22,"port_range_max":22`,
		`"protocol":"udp","port_range_min":1000,"port_range_max":2000`, `"protocol":"icmp","port_range_min":8`} {
		e.must(t, 201, "POST", "/v2.0/security-group-rules", e.demoTok,
			`{"security_group_rule":{"security_group_id":"`+g["id"].(string)+`","direction":"ingress",`+ok+`}}`)
	}
}

func (e *env) testRouterOverlap(t *testing.T) {
	_, s1 := e.netWithSubnet(t, "10.70.0.0/24")
	_, s2 := e.netWithSubnet(t, "10.70.0.0/25")
	n3, s3 := e.netWithSubnet(t, "10.70.0.128/25")
	_, s4 := e.netWithSubnet(t, "10.71.0.0/24")
	rt := e.must(t, 201, "POST", "/v2.0/routers", e.demoTok, `{"router":{"name":"overlap"}}`)
	base := "/v2.0/routers/" + rt["id"].(string)
	e.must(t, 200, "PUT", base+"/add_router_interface", e.demoTok, `{"subnet_id":"`+s1+`"}`)
	// A subnet inside another interface's, by subnet and by port.
	e.refused(t, 400, "BadRequest", "Bad router request: Cidr 10.70.0.0/25 of subnet "+s2+" overlaps with cidr 10.70.0.0/24 of subnet "+s1+".",
		"PUT", base+"/add_router_interface", e.demoTok, `{"subnet_id":"`+s2+`"}`)
	p := e.must(t, 201, "POST", "/v2.0/ports", e.demoTok, `{"port":{"network_id":"`+n3+`"}}`)
	e.refused(t, 400, "BadRequest", "overlaps with cidr 10.70.0.0/24 of subnet "+s1,
		"PUT", base+"/add_router_interface", e.demoTok, `{"port_id":"`+p["id"].(string)+`"}`)
	e.refused(t, 400, "BadRequest", "Router already has a port on subnet "+s1,
		"PUT", base+"/add_router_interface", e.demoTok, `{"subnet_id":"`+s1+`"}`)
	// A disjoint subnet joins; after the first leaves, the overlapping one may.
	e.must(t, 200, "PUT", base+"/add_router_interface", e.demoTok, `{"subnet_id":"`+s4+`"}`)
	e.must(t, 200, "PUT", base+"/remove_router_interface", e.demoTok, `{"subnet_id":"`+s1+`"}`)
	e.must(t, 200, "PUT", base+"/add_router_interface", e.demoTok, `{"subnet_id":"`+s3+`"}`)
}

func (e *env) testExtraRoutes(t *testing.T) {
	_, s1 := e.netWithSubnet(t, "10.80.1.0/24")
	_, s2 := e.netWithSubnet(t, "10.80.2.0/24")
	rt := e.must(t, 201, "POST", "/v2.0/routers", e.demoTok, `{"router":{"name":"routes"}}`)
	if r, ok := rt["routes"].([]any); !ok || len(r) != 0 {
		t.Fatalf("new router routes: %v", rt["routes"])
	}
	id := rt["id"].(string)
	base := "/v2.0/routers/" + id
	e.refused(t, 400, "HTTPBadRequest", "Attribute 'routes' not allowed in POST", "POST", "/v2.0/routers", e.demoTok,
		`{"router":{"routes":[]}}`)
	e.must(t, 200, "PUT", base+"/add_router_interface", e.demoTok, `{"subnet_id":"`+s1+`"}`)
	e.must(t, 200, "PUT", base+"/add_router_interface", e.demoTok, `{"subnet_id":"`+s2+`"}`)

	routes := `[{"destination":"192.168.10.0/24","nexthop":"10.80.1.5"},{"destination":"192.168.20.0/24","nexthop":"10.80.2.5"}]`
	got := e.must(t, 200, "PUT", base, e.demoTok, `{"router":{"routes":`+routes+`}}`)
	if fmt.Sprint(got["routes"]) != "[map[destination:192.168.10.0/24 nexthop:10.80.1.5] map[destination:192.168.20.0/24 nexthop:10.80.2.5]]" {
		t.Fatalf("routes after PUT: %v", got["routes"])
	}
	if show := e.must(t, 200, "GET", base, e.demoTok, ""); fmt.Sprint(show["routes"]) != fmt.Sprint(got["routes"]) {
		t.Fatalf("routes shown: %v", show["routes"])
	}
	for _, c := range []struct{ routes, typ, msg string }{
		{`[{"destination":"192.168.30.0/24","nexthop":"10.99.0.5"}]`, "InvalidRoutes", "The nexthop is not connected with router"},
		{`[{"destination":"192.168.30.0/24","nexthop":"10.80.1.1"}]`, "InvalidRoutes", "The nexthop is used by router"},
		{`[{"destination":"192.168.30.1/24","nexthop":"10.80.1.5"}]`, "HTTPBadRequest", "isn't a recognized IP subnet cidr, '192.168.30.0/24' is recommended"},
		{`[{"destination":"192.168.30.0/24","nexthop":"nowhere"}]`, "HTTPBadRequest", "'nowhere' is not a valid IP address"},
		{`[{"destination":"192.168.30.0/24"}]`, "HTTPBadRequest", "Invalid input for routes"},
		{`[{"destination":"192.168.30.0/24","nexthop":"10.80.1.5"},{"destination":"192.168.30.0/24","nexthop":"10.80.1.5"}]`,
			"HTTPBadRequest", "Duplicate hostroute"},
	} {
		e.refused(t, 400, c.typ, c.msg, "PUT", base, e.demoTok, `{"router":{"routes":`+c.routes+`}}`)
	}
	// A refused update changes nothing.
	if show := e.must(t, 200, "GET", base, e.demoTok, ""); fmt.Sprint(show["routes"]) != fmt.Sprint(got["routes"]) {
		t.Fatalf("routes after refused updates: %v", show["routes"])
	}
	// The interface a nexthop needs stays.
	e.refused(t, 409, "RouterInterfaceInUseByRoute", "Router interface for subnet "+s1+" on router "+id+" cannot be deleted",
		"PUT", base+"/remove_router_interface", e.demoTok, `{"subnet_id":"`+s1+`"}`)

	// extraroute-atomic: adding merges exact duplicates, removing a missing
	// route is no error, and both answer the whole router.
	add := e.must(t, 200, "PUT", base+"/add_extraroutes", e.demoTok,
		`{"router":{"routes":[{"destination":"192.168.10.0/24","nexthop":"10.80.1.5"},{"destination":"192.168.10.0/24","nexthop":"10.80.1.6"}]}}`)
	if add["id"] != id || len(add["routes"].([]any)) != 3 {
		t.Fatalf("add_extraroutes: %v", add)
	}
	e.refused(t, 400, "InvalidRoutes", "The nexthop is not connected with router", "PUT", base+"/add_extraroutes", e.demoTok,
		`{"router":{"routes":[{"destination":"192.168.40.0/24","nexthop":"10.99.0.5"}]}}`)
	rm := e.must(t, 200, "PUT", base+"/remove_extraroutes", e.demoTok,
		`{"router":{"routes":[{"destination":"192.168.10.0/24","nexthop":"10.80.1.5"},{"destination":"10.0.0.0/8","nexthop":"10.80.1.9"}]}}`)
	if fmt.Sprint(rm["routes"]) != "[map[destination:192.168.20.0/24 nexthop:10.80.2.5] map[destination:192.168.10.0/24 nexthop:10.80.1.6]]" {
		t.Fatalf("remove_extraroutes: %v", rm["routes"])
	}
	// routes: null clears them (tempest's _delete_extra_routes), and then
	// the interfaces may go.
	if cleared := e.must(t, 200, "PUT", base, e.demoTok, `{"router":{"routes":null}}`); len(cleared["routes"].([]any)) != 0 {
		t.Fatalf("routes after null: %v", cleared["routes"])
	}
	e.must(t, 200, "PUT", base+"/remove_router_interface", e.demoTok, `{"subnet_id":"`+s1+`"}`)
	e.refused(t, 404, "RouterNotFound", "0e1f2a3b-0000-4000-8000-000000000000", "PUT",
		"/v2.0/routers/0e1f2a3b-0000-4000-8000-000000000000/add_extraroutes", e.demoTok, `{"router":{"routes":[]}}`)
}

func (e *env) testSubnetPools(t *testing.T) {
	// Tempest's test_create_list_show_update_delete_subnetpools, with the
	// defaults neutron gives an IPv4 pool.
	sp := e.must(t, 201, "POST", "/v2.0/subnetpools", e.demoTok,
		`{"subnetpool":{"name":"pool1","prefixes":["1.0.0.0/16","2.0.0.0/16","1.0.0.0/17"]}}`)
	want := map[string]any{"name": "pool1", "ip_version": 4.0, "min_prefixlen": 8.0, "max_prefixlen": 32.0,
		"default_prefixlen": 8.0, "shared": false, "is_default": false, "address_scope_id": nil, "default_quota": nil,
		"project_id": e.demoProject, "tenant_id": e.demoProject}
	for k, v := range want {
		if sp[k] != v {
			t.Errorf("pool %s = %v, want %v", k, sp[k], v)
		}
	}
	if fmt.Sprint(sp["prefixes"]) != "[1.0.0.0/16 2.0.0.0/16]" {
		t.Errorf("prefixes not compacted: %v", sp["prefixes"])
	}
	id := sp["id"].(string)
	path := "/v2.0/subnetpools/" + id
	if got := e.must(t, 200, "GET", path, e.demoTok, ""); got["name"] != "pool1" {
		t.Fatalf("show pool: %v", got)
	}
	if got := e.must(t, 200, "GET", "/v2.0/subnetpools?name=pool1", e.demoTok, ""); len(got["subnetpools"].([]any)) != 1 {
		t.Fatalf("list pools: %v", got)
	}
	got := e.must(t, 200, "PUT", path, e.demoTok, `{"subnetpool":{"name":"pool1b","prefixes":["1.0.0.0/15","2.0.0.0/16"],"min_prefixlen":16,"default_prefixlen":24}}`)
	if got["name"] != "pool1b" || fmt.Sprint(got["prefixes"]) != "[1.0.0.0/15 2.0.0.0/16]" || got["min_prefixlen"] != 16.0 || got["default_prefixlen"] != 24.0 {
		t.Fatalf("update pool: %v", got)
	}
	for _, c := range []struct {
		method, path, body string
		status             int
		typ, msg           string
	}{
		{"PUT", path, `{"subnetpool":{"prefixes":["2.0.0.0/16"]}}`, 400, "IllegalSubnetPoolPrefixUpdate", "Existing prefixes must be a subset of the new prefixes"},
		{"PUT", path, `{"subnetpool":{"min_prefixlen":28}}`, 400, "IllegalSubnetPoolPrefixBounds", "Illegal prefix bounds: default_prefixlen=24, min_prefixlen=28."},
		{"PUT", path, `{"subnetpool":{"shared":true}}`, 400, "HTTPBadRequest", "Cannot update read-only attribute shared"},
		{"POST", "/v2.0/subnetpools", `{"subnetpool":{"name":"x","prefixes":[]}}`, 400, "EmptySubnetPoolPrefixList", "Empty subnet pool prefix list."},
		{"POST", "/v2.0/subnetpools", `{"subnetpool":{"name":"x"}}`, 400, "HTTPBadRequest", "Required attribute 'prefixes' not specified"},
		{"POST", "/v2.0/subnetpools", `{"subnetpool":{"name":"x","prefixes":["10.0.0.0/8","fd00::/48"]}}`, 400, "PrefixVersionMismatch", "Cannot mix IPv4 and IPv6"},
		{"POST", "/v2.0/subnetpools", `{"subnetpool":{"name":"x","prefixes":["10.0.0.1/8"]}}`, 400, "HTTPBadRequest", "'10.0.0.0/8' is recommended"},
		{"POST", "/v2.0/subnetpools", `{"subnetpool":{"name":"x","prefixes":["10.0.0.0/8"],"max_prefixlen":33}}`, 400, "IllegalSubnetPoolPrefixBounds", "max_prefixlen=33, ip_version_max=32"},
		{"POST", "/v2.0/subnetpools", `{"subnetpool":{"name":"x","prefixes":["10.0.0.0/8"],"min_prefixlen":24,"max_prefixlen":20}}`, 400, "IllegalSubnetPoolPrefixBounds", "min_prefixlen=24, max_prefixlen=20"},
		{"POST", "/v2.0/subnetpools", `{"subnetpool":{"name":"x","prefixes":["10.0.0.0/8"],"default_prefixlen":-1}}`, 400, "HTTPBadRequest", "should be non-negative"},
		{"POST", "/v2.0/subnetpools", `{"subnetpool":{"name":"x","prefixes":["10.0.0.0/8"],"shared":true}}`, 403, "PolicyNotAuthorized", "create_subnetpool:shared"},
		{"POST", "/v2.0/subnetpools", `{"subnetpool":{"name":"x","prefixes":["10.0.0.0/8"],"is_default":true}}`, 403, "PolicyNotAuthorized", "create_subnetpool:is_default"},
		{"POST", "/v2.0/subnetpools", `{"subnetpool":{"name":"x","prefixes":["10.0.0.0/8"],"address_scope_id":"` + id + `"}}`, 404, "AddressScopeNotFound", id},
	} {
		e.refused(t, c.status, c.typ, c.msg, c.method, c.path, e.demoTok, c.body)
	}
	// An IPv6 pool's defaults.
	v6 := e.must(t, 201, "POST", "/v2.0/subnetpools", e.demoTok, `{"subnetpool":{"name":"pool6","prefixes":["fd00:1::/48"]}}`)
	if v6["ip_version"] != 6.0 || v6["min_prefixlen"] != 64.0 || v6["max_prefixlen"] != 128.0 || v6["default_prefixlen"] != 64.0 {
		t.Errorf("IPv6 pool: %v", v6)
	}
	// A project's pool is its own: admin sees it, a shared one is everyone's.
	adminPool := e.must(t, 201, "POST", "/v2.0/subnetpools", e.adminTok, `{"subnetpool":{"name":"adminpool","prefixes":["172.31.0.0/16"]}}`)
	e.refused(t, 404, "SubnetPoolNotFound", adminPool["id"].(string), "GET", "/v2.0/subnetpools/"+adminPool["id"].(string), e.demoTok, "")
	e.must(t, 200, "GET", path, e.adminTok, "")
	shared := e.must(t, 201, "POST", "/v2.0/subnetpools", e.adminTok, `{"subnetpool":{"name":"sharedpool","prefixes":["172.30.0.0/16"],"shared":true}}`)
	e.must(t, 200, "GET", "/v2.0/subnetpools/"+shared["id"].(string), e.demoTok, "")
	e.refused(t, 403, "PolicyNotAuthorized", "update_subnetpool", "PUT", "/v2.0/subnetpools/"+shared["id"].(string), e.demoTok, `{"subnetpool":{"name":"mine"}}`)

	e.must(t, 204, "DELETE", path, e.demoTok, "")
	e.refused(t, 404, "SubnetPoolNotFound", id, "GET", path, e.demoTok, "")
	for _, p := range []map[string]any{v6, adminPool, shared} {
		e.must(t, 204, "DELETE", "/v2.0/subnetpools/"+p["id"].(string), e.adminTok, "")
	}
}

func (e *env) testSubnetsFromPools(t *testing.T) {
	sp := e.must(t, 201, "POST", "/v2.0/subnetpools", e.demoTok,
		`{"subnetpool":{"name":"carve","prefixes":["10.90.0.0/22","10.91.0.0/26"],"min_prefixlen":24,"default_prefixlen":26,"max_prefixlen":28}}`)
	pool := sp["id"].(string)
	n := e.must(t, 201, "POST", "/v2.0/networks", e.demoTok, `{"network":{"name":"pooled"}}`)
	net := n["id"].(string)
	subnet := func(extra string) string {
		return `{"subnet":{"network_id":"` + net + `","ip_version":4,"subnetpool_id":"` + pool + `"` + extra + `}}`
	}
	// By default size, from the smallest free block that holds it.
	s1 := e.must(t, 201, "POST", "/v2.0/subnets", e.demoTok, subnet(""))
	if s1["cidr"] != "10.91.0.0/26" || s1["subnetpool_id"] != pool || s1["gateway_ip"] != "10.91.0.1" {
		t.Fatalf("subnet from pool: %v", s1)
	}
	if got := e.must(t, 200, "GET", "/v2.0/subnets/"+s1["id"].(string), e.demoTok, ""); got["subnetpool_id"] != pool {
		t.Fatalf("subnet show: %v", got)
	}
	if got := e.must(t, 200, "GET", "/v2.0/subnets?subnetpool_id="+pool, e.demoTok, ""); len(got["subnets"].([]any)) != 1 {
		t.Fatalf("subnets of the pool: %v", got)
	}
	// By size; then a specific CIDR inside a free block.
	s2 := e.must(t, 201, "POST", "/v2.0/subnets", e.demoTok, subnet(`,"prefixlen":24`))
	if s2["cidr"] != "10.90.0.0/24" {
		t.Fatalf("prefixlen 24: %v", s2["cidr"])
	}
	s3 := e.must(t, 201, "POST", "/v2.0/subnets", e.demoTok, subnet(`,"cidr":"10.90.2.0/25","gateway_ip":"10.90.2.126"`))
	if s3["cidr"] != "10.90.2.0/25" || s3["gateway_ip"] != "10.90.2.126" || s3["subnetpool_id"] != pool {
		t.Fatalf("specific cidr: %v", s3)
	}
	plain := e.must(t, 201, "POST", "/v2.0/subnets", e.demoTok,
		`{"subnet":{"network_id":"`+net+`","ip_version":4,"cidr":"10.92.0.0/24"}}`)
	if plain["subnetpool_id"] != nil {
		t.Fatalf("plain subnet has a pool: %v", plain)
	}
	for _, c := range []struct {
		body     string
		status   int
		typ, msg string
	}{
		{subnet(`,"prefixlen":29`), 400, "MaxPrefixSubnetAllocationError", "Unable to allocate subnet with prefix length 29, maximum allowed prefix is 28."},
		{subnet(`,"prefixlen":23`), 400, "MinPrefixSubnetAllocationError", "minimum allowed prefix is 24."},
		{subnet(`,"cidr":"10.90.0.128/25"`), 409, "SubnetAllocationError", "Cannot allocate requested subnet from the available set of prefixes"},
		{subnet(`,"cidr":"10.93.0.0/24"`), 409, "SubnetAllocationError", "Cannot allocate requested subnet"},
		{subnet(`,"cidr":"10.90.3.0/24","prefixlen":24`), 400, "BadRequest", "cidr and prefixlen must not be supplied together"},
		{subnet(`,"allocation_pools":[{"start":"10.90.3.10","end":"10.90.3.20"}]`), 400, "BadRequest", "allocation_pools allowed only for specific subnet requests"},
		{`{"subnet":{"network_id":"` + net + `","ip_version":6,"subnetpool_id":"` + pool + `"}}`, 400, "BadRequest", "Cannot allocate IPv6 subnet from IPv4 subnet pool"},
		{`{"subnet":{"network_id":"` + net + `","ip_version":4,"subnetpool_id":"` + net + `"}}`, 404, "SubnetPoolNotFound", net},
		{`{"subnet":{"network_id":"` + net + `","ip_version":4,"use_default_subnetpool":true}}`, 400, "BadRequest", "No default subnetpool found for IPv4"},
		{`{"subnet":{"network_id":"` + net + `","ip_version":4,"prefixlen":24}}`, 400, "InvalidInput", "A cidr must be specified in the absence of a subnet pool"},
	} {
		e.refused(t, c.status, c.typ, c.msg, "POST", "/v2.0/subnets", e.demoTok, c.body)
	}
	// Space runs out: 10.90.1.0/24 and 10.90.3.0/24 are what is left.
	e.must(t, 201, "POST", "/v2.0/subnets", e.demoTok, subnet(`,"prefixlen":24`))
	e.must(t, 201, "POST", "/v2.0/subnets", e.demoTok, subnet(`,"prefixlen":24`))
	e.refused(t, 409, "SubnetAllocationError", "Insufficient prefix space to allocate subnet size /24", "POST", "/v2.0/subnets", e.demoTok, subnet(`,"prefixlen":24`))
	// A pool with subnets stays; deleting a subnet gives its prefix back.
	e.refused(t, 400, "SubnetPoolDeleteError", "Subnet pool has existing allocations", "DELETE", "/v2.0/subnetpools/"+pool, e.demoTok, "")
	e.must(t, 204, "DELETE", "/v2.0/subnets/"+s2["id"].(string), e.demoTok, "")
	if again := e.must(t, 201, "POST", "/v2.0/subnets", e.demoTok, subnet(`,"prefixlen":24`)); again["cidr"] != "10.90.0.0/24" {
		t.Fatalf("freed prefix: %v", again["cidr"])
	}

	// Quota, in /32s: a /28 (16) fits in 20, a second does not.
	q := e.must(t, 201, "POST", "/v2.0/subnetpools", e.demoTok,
		`{"subnetpool":{"name":"quota","prefixes":["10.94.0.0/24"],"default_prefixlen":28,"default_quota":20}}`)
	qn := e.must(t, 201, "POST", "/v2.0/networks", e.demoTok, `{"network":{"name":"quota"}}`)
	qbody := `{"subnet":{"network_id":"` + qn["id"].(string) + `","ip_version":4,"subnetpool_id":"` + q["id"].(string) + `"}}`
	e.must(t, 201, "POST", "/v2.0/subnets", e.demoTok, qbody)
	e.refused(t, 409, "SubnetPoolQuotaExceeded", "Per-tenant subnet pool prefix quota exceeded.", "POST", "/v2.0/subnets", e.demoTok, qbody)

	// default-subnetpools: the admin's shared default pool serves
	// use_default_subnetpool; there is only one default per IP version.
	def := e.must(t, 201, "POST", "/v2.0/subnetpools", e.adminTok,
		`{"subnetpool":{"name":"default4","prefixes":["10.95.0.0/16"],"default_prefixlen":24,"shared":true,"is_default":true}}`)
	e.refused(t, 400, "InvalidInput", "A default subnetpool for this IP family has already been set", "POST", "/v2.0/subnetpools", e.adminTok,
		`{"subnetpool":{"name":"default4b","prefixes":["10.96.0.0/16"],"is_default":true}}`)
	dn := e.must(t, 201, "POST", "/v2.0/networks", e.demoTok, `{"network":{"name":"defaulted"}}`)
	ds := e.must(t, 201, "POST", "/v2.0/subnets", e.demoTok,
		`{"subnet":{"network_id":"`+dn["id"].(string)+`","ip_version":4,"use_default_subnetpool":true}}`)
	if ds["cidr"] != "10.95.0.0/24" || ds["subnetpool_id"] != def["id"] {
		t.Fatalf("default pool subnet: %v", ds)
	}
	e.refused(t, 400, "BadRequest", "subnetpool_id and use_default_subnetpool cannot both be specified", "POST", "/v2.0/subnets", e.demoTok,
		`{"subnet":{"network_id":"`+dn["id"].(string)+`","ip_version":4,"use_default_subnetpool":true,"subnetpool_id":"`+pool+`"}}`)
}
