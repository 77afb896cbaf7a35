package network_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/floatingips"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/routers"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/quotas"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/security/groups"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/security/rules"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"
	"github.com/gophercloud/gophercloud/v2/pagination"

	"nimbus/internal/api"
	"nimbus/internal/cloud"
	"nimbus/internal/network"
	"nimbus/internal/store"
	"nimbus/internal/testenv"
)

// env is one running cloud with network clients for admin and demo.
type env struct {
	c            *cloud.Cloud
	admin, demo  *gophercloud.ServiceClient
	http         *http.Client
	adminTok     string
	demoTok      string
	demoProject  string
	adminProject string
}

func newEnv(t *testing.T, dbURL string) *env {
	c := testenv.StartCloud(t, dbURL)
	nc := func(user string) *gophercloud.ServiceClient {
		sc, err := openstack.NewNetworkV2(testenv.Provider(t, c, user), gophercloud.EndpointOpts{Region: "RegionOne"})
		if err != nil {
			t.Fatal(err)
		}
		return sc
	}
	e := &env{c: c, admin: nc(cloud.AdminUser), demo: nc(cloud.DemoUser), http: testenv.HTTPClient(t, c),
		adminTok: testenv.Token(t, c, cloud.AdminUser), demoTok: testenv.Token(t, c, cloud.DemoUser)}
	// Parallel requests leave dialled but unused connections, which would
	// hold the cloud's graceful shutdown for its whole timeout.
	t.Cleanup(func() {
		e.http.CloseIdleConnections()
		e.admin.ProviderClient.HTTPClient.CloseIdleConnections()
		e.demo.ProviderClient.HTTPClient.CloseIdleConnections()
	})
	ctx := context.Background()
	for name, dst := range map[string]*string{cloud.DemoProject: &e.demoProject, cloud.AdminProject: &e.adminProject} {
		p, err := c.Identity.ProjectByName(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		*dst = p.ID
	}
	return e
}

// do sends a raw request to the network API and decodes a JSON answer.
func (e *env) do(t *testing.T, method, path, token, body string) (int, map[string]any) {
	t.Helper()
	resp, b := testenv.Do(t, e.http, method, e.c.NetworkURL+path, token, body)
	var m map[string]any
	if len(b) > 0 {
		if err := json.Unmarshal([]byte(b), &m); err != nil {
			t.Fatalf("%s %s: body is not JSON: %q", method, path, b)
		}
	}
	return resp.StatusCode, m
}

func neutronType(m map[string]any) string {
	ne, _ := m["NeutronError"].(map[string]any)
	s, _ := ne["type"].(string)
	return s
}

func mustCode(t *testing.T, err error, code int) {
	t.Helper()
	if !gophercloud.ResponseCodeIs(err, code) {
		t.Fatalf("want HTTP %d, got %v", code, err)
	}
}

func networkByName(t *testing.T, sc *gophercloud.ServiceClient, name string) networks.Network {
	t.Helper()
	pages, err := networks.List(sc, networks.ListOpts{Name: name}).AllPages(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	l, err := networks.ExtractNetworks(pages)
	if err != nil || len(l) != 1 {
		t.Fatalf("network %s: %v %v", name, l, err)
	}
	return l[0]
}

var neutronTimeRE = regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$`)

func TestNetworkAPI(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		t.Run("discovery", e.testDiscovery)
		t.Run("networks", e.testNetworks)
		t.Run("isolation", e.testIsolation)
		t.Run("ipam", e.testIPAM)
		t.Run("ipam_concurrent", e.testIPAMConcurrent)
		t.Run("security_groups", e.testSecurityGroups)
		t.Run("floating_ips", e.testFloatingIPs)
		t.Run("list_options", e.testListOptions)
		t.Run("bulk", e.testBulk)
		t.Run("tags", e.testTags)
		t.Run("quotas", e.testQuotas)
		t.Run("routers", e.testRouters)
		t.Run("bad_input", e.testBadInput)
		t.Run("contract", e.testContract)
		t.Run("addresses_many", e.testAddressesMany)
	})
}

func (e *env) testDiscovery(t *testing.T) {
	code, m := e.do(t, "GET", "/", "", "")
	if code != 200 {
		t.Fatalf("GET / = %d", code)
	}
	v := m["versions"].([]any)[0].(map[string]any)
	if v["id"] != "v2.0" || v["status"] != "CURRENT" {
		t.Fatalf("versions: %v", m)
	}
	link := v["links"].([]any)[0].(map[string]any)
	if link["rel"] != "self" || link["href"] != e.c.NetworkURL+"/v2.0/" {
		t.Fatalf("self link %v, want %s/v2.0/", link, e.c.NetworkURL)
	}
	if code, _ := e.do(t, "GET", "/v2.0/networks", "", ""); code != 401 {
		t.Fatalf("no token: %d", code)
	}
	code, m = e.do(t, "GET", "/v2.0/extensions", e.demoTok, "")
	if code != 200 {
		t.Fatalf("extensions = %d", code)
	}
	var aliases []string
	for _, x := range m["extensions"].([]any) {
		aliases = append(aliases, x.(map[string]any)["alias"].(string))
	}
	for _, want := range []string{"security-group", "external-net", "standard-attr-tag", "port-security", "project-id"} {
		if !slices.Contains(aliases, want) {
			t.Errorf("extension %s missing from %v", want, aliases)
		}
	}
	for _, never := range []string{"dvr", "l3-ha", "availability_zone", "binding-extended", "dns-integration"} {
		if slices.Contains(aliases, never) {
			t.Errorf("extension %s listed but not served", never)
		}
	}
	if code, _ := e.do(t, "GET", "/v2.0/extensions/security-group", e.demoTok, ""); code != 200 {
		t.Fatalf("show extension = %d", code)
	}
	if code, m := e.do(t, "GET", "/v2.0/extensions/dvr", e.demoTok, ""); code != 404 || m["NeutronError"] == nil {
		t.Fatalf("unknown extension = %d %v", code, m)
	}
	code, m = e.do(t, "GET", "/v2.0", e.demoTok, "")
	if code != 200 || len(m["resources"].([]any)) == 0 {
		t.Fatalf("GET /v2.0 = %d %v", code, m)
	}
}

func (e *env) testNetworks(t *testing.T) {
	ctx := context.Background()
	up := true
	n, err := networks.Create(ctx, e.demo, networks.CreateOpts{Name: "net1", AdminStateUp: &up, Description: "d"}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	if n.Status != "ACTIVE" || n.ProjectID != e.demoProject || n.TenantID != e.demoProject || n.Shared || len(n.Subnets) != 0 {
		t.Fatalf("created network: %+v", n)
	}
	code, m := e.do(t, "GET", "/v2.0/networks/"+n.ID, e.demoTok, "")
	raw := m["network"].(map[string]any)
	if code != 200 || raw["mtu"] != float64(1450) || raw["router:external"] != false || raw["port_security_enabled"] != true ||
		raw["l2_adjacency"] != true || raw["revision_number"] != float64(0) {
		t.Fatalf("show: %d %v", code, raw)
	}
	if !neutronTimeRE.MatchString(raw["created_at"].(string)) {
		t.Fatalf("created_at %v", raw["created_at"])
	}
	for _, k := range []string{"availability_zones", "availability_zone_hints", "tags", "ipv4_address_scope", "is_default"} {
		if _, ok := raw[k]; !ok {
			t.Errorf("network lacks %s", k)
		}
	}
	name := "net1-renamed"
	n, err = networks.Update(ctx, e.demo, n.ID, networks.UpdateOpts{Name: &name}).Extract()
	if err != nil || n.Name != name || n.RevisionNumber != 1 {
		t.Fatalf("update: %+v %v", n, err)
	}
	// A stale revision precondition fails with 412.
	zero := 0
	_, err = networks.Update(ctx, e.demo, n.ID, networks.UpdateOpts{Description: &name, RevisionNumber: &zero}).Extract()
	mustCode(t, err, 412)
	one := 1
	if _, err = networks.Update(ctx, e.demo, n.ID, networks.UpdateOpts{Description: &name, RevisionNumber: &one}).Extract(); err != nil {
		t.Fatal(err)
	}
	// Only admins may share a network.
	shared := true
	_, err = networks.Update(ctx, e.demo, n.ID, networks.UpdateOpts{Shared: &shared}).Extract()
	mustCode(t, err, 403)
	if err := networks.Delete(ctx, e.demo, n.ID).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	_, err = networks.Get(ctx, e.demo, n.ID).Extract()
	mustCode(t, err, 404)

	// The public network is external, not shared, and has the pool subnet.
	pub := networkByName(t, e.demo, network.PublicNetwork)
	if pub.Shared || len(pub.Subnets) != 1 {
		t.Fatalf("public: %+v", pub)
	}
	code, m = e.do(t, "GET", "/v2.0/networks?router:external=True", e.demoTok, "")
	if code != 200 || len(m["networks"].([]any)) != 1 {
		t.Fatalf("external filter: %d %v", code, m)
	}
}

func (e *env) testIsolation(t *testing.T) {
	ctx := context.Background()
	// admin sees every project's network: filter by project.
	pages, _ := networks.List(e.admin, networks.ListOpts{Name: network.PrivateNetwork, ProjectID: e.adminProject}).AllPages(ctx)
	l, _ := networks.ExtractNetworks(pages)
	if len(l) != 1 {
		t.Fatalf("admin private: %v", l)
	}
	adminPriv := l[0]
	_, err := networks.Get(ctx, e.demo, adminPriv.ID).Extract()
	mustCode(t, err, 404)
	mustCode(t, networks.Delete(ctx, e.demo, adminPriv.ID).ExtractErr(), 404)
	code, m := e.do(t, "GET", "/v2.0/networks/"+adminPriv.ID, e.demoTok, "")
	if code != 404 || neutronType(m) != "NetworkNotFound" {
		t.Fatalf("foreign network: %d %v", code, m)
	}
	// demo's list: its private network and the public one, nothing of admin's.
	pages, err = networks.List(e.demo, nil).AllPages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	l, _ = networks.ExtractNetworks(pages)
	for _, n := range l {
		if n.ProjectID != e.demoProject && n.Name != network.PublicNetwork {
			t.Fatalf("demo sees %+v", n)
		}
	}
	// Subnets of admin's private network are invisible too.
	_, err = subnets.Get(ctx, e.demo, adminPriv.Subnets[0]).Extract()
	mustCode(t, err, 404)
	// demo may not put a port on the (external, unshared) public network.
	pub := networkByName(t, e.demo, network.PublicNetwork)
	_, err = ports.Create(ctx, e.demo, ports.CreateOpts{NetworkID: pub.ID}).Extract()
	mustCode(t, err, 403)
}

func (e *env) testIPAM(t *testing.T) {
	ctx := context.Background()
	n, err := networks.Create(ctx, e.demo, networks.CreateOpts{Name: "small"}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	s, err := subnets.Create(ctx, e.demo, subnets.CreateOpts{NetworkID: n.ID, CIDR: "192.168.50.0/29", IPVersion: 4, Name: "small-sub"}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	if s.GatewayIP != "192.168.50.1" || len(s.AllocationPools) != 1 || s.AllocationPools[0].Start != "192.168.50.2" ||
		s.AllocationPools[0].End != "192.168.50.6" || !s.EnableDHCP || s.SubnetPoolID != "" {
		t.Fatalf("subnet: %+v", s)
	}
	// Overlapping CIDR on the same network: 400.
	_, err = subnets.Create(ctx, e.demo, subnets.CreateOpts{NetworkID: n.ID, CIDR: "192.168.50.0/28", IPVersion: 4}).Extract()
	mustCode(t, err, 400)
	// A requested address is honoured, and only once.
	p1, err := ports.Create(ctx, e.demo, ports.CreateOpts{NetworkID: n.ID, FixedIPs: []ports.IP{{IPAddress: "192.168.50.4"}}}).Extract()
	if err != nil || p1.FixedIPs[0].IPAddress != "192.168.50.4" || p1.FixedIPs[0].SubnetID != s.ID {
		t.Fatalf("port with ip: %+v %v", p1, err)
	}
	if !strings.HasPrefix(p1.MACAddress, "fa:16:3e:") || p1.Status != "DOWN" || len(p1.SecurityGroups) != 1 {
		t.Fatalf("port: %+v", p1)
	}
	code, m := e.do(t, "POST", "/v2.0/ports", e.demoTok, `{"port":{"network_id":"`+n.ID+`","fixed_ips":[{"ip_address":"192.168.50.4"}]}}`)
	if code != 409 || neutronType(m) != "IpAddressAlreadyAllocated" {
		t.Fatalf("duplicate ip: %d %v", code, m)
	}
	seen := map[string]bool{"192.168.50.4": true}
	for i := 0; i < 4; i++ {
		p, err := ports.Create(ctx, e.demo, ports.CreateOpts{NetworkID: n.ID}).Extract()
		if err != nil {
			t.Fatalf("port %d: %v", i, err)
		}
		ip := p.FixedIPs[0].IPAddress
		if seen[ip] || ip == "192.168.50.1" {
			t.Fatalf("address %s given twice or is the gateway", ip)
		}
		seen[ip] = true
	}
	code, m = e.do(t, "POST", "/v2.0/ports", e.demoTok, `{"port":{"network_id":"`+n.ID+`"}}`)
	if code != 409 || neutronType(m) != "IpAddressGenerationFailure" {
		t.Fatalf("exhaustion: %d %v", code, m)
	}
	// Freeing one address makes room again.
	if err := ports.Delete(ctx, e.demo, p1.ID).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	p, err := ports.Create(ctx, e.demo, ports.CreateOpts{NetworkID: n.ID}).Extract()
	if err != nil || p.FixedIPs[0].IPAddress != "192.168.50.4" {
		t.Fatalf("reuse: %+v %v", p, err)
	}
	mustCode(t, subnets.Delete(ctx, e.demo, s.ID).ExtractErr(), 409)
	code, m = e.do(t, "DELETE", "/v2.0/networks/"+n.ID, e.demoTok, "")
	if code != 409 || neutronType(m) != "NetworkInUse" {
		t.Fatalf("delete busy network: %d %v", code, m)
	}
	// Cleaning up ports lets the network go, subnets with it.
	pages, _ := ports.List(e.demo, ports.ListOpts{NetworkID: n.ID}).AllPages(ctx)
	pl, _ := ports.ExtractPorts(pages)
	if len(pl) != 5 {
		t.Fatalf("ports on network: %d", len(pl))
	}
	for _, p := range pl {
		if err := ports.Delete(ctx, e.demo, p.ID).ExtractErr(); err != nil {
			t.Fatal(err)
		}
	}
	if err := networks.Delete(ctx, e.demo, n.ID).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	_, err = subnets.Get(ctx, e.demo, s.ID).Extract()
	mustCode(t, err, 404)
}

func (e *env) testSecurityGroups(t *testing.T) {
	ctx := context.Background()
	pages, err := groups.List(e.demo, groups.ListOpts{Name: "default"}).AllPages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	gl, _ := groups.ExtractGroups(pages)
	if len(gl) != 1 {
		t.Fatalf("default groups: %v", gl)
	}
	def := gl[0]
	type key struct{ dir, eth, remote string }
	got := map[key]bool{}
	for _, r := range def.Rules {
		got[key{r.Direction, r.EtherType, r.RemoteGroupID}] = true
	}
	want := map[key]bool{{"egress", "IPv4", ""}: true, {"egress", "IPv6", ""}: true,
		{"ingress", "IPv4", def.ID}: true, {"ingress", "IPv6", def.ID}: true}
	if len(def.Rules) != 4 || !mapsEqual(got, want) {
		t.Fatalf("default rules: %+v", def.Rules)
	}
	code, m := e.do(t, "DELETE", "/v2.0/security-groups/"+def.ID, e.demoTok, "")
	if code != 409 {
		t.Fatalf("delete default: %d %v", code, m)
	}
	g, err := groups.Create(ctx, e.demo, groups.CreateOpts{Name: "web", Description: "web servers"}).Extract()
	if err != nil || len(g.Rules) != 2 {
		t.Fatalf("create group: %+v %v", g, err)
	}
	r, err := rules.Create(ctx, e.demo, rules.CreateOpts{SecGroupID: g.ID, Direction: rules.DirIngress, EtherType: rules.EtherType4,
		Protocol: rules.ProtocolTCP, PortRangeMin: 80, PortRangeMax: 80, RemoteIPPrefix: "0.0.0.0/0"}).Extract()
	if err != nil || r.PortRangeMin != 80 || r.Protocol != "tcp" {
		t.Fatalf("rule: %+v %v", r, err)
	}
	code, m = e.do(t, "POST", "/v2.0/security-group-rules", e.demoTok, `{"security_group_rule":{"security_group_id":"`+g.ID+
		`","direction":"ingress","ethertype":"IPv4","protocol":"tcp","port_range_min":80,"port_range_max":80,"remote_ip_prefix":"0.0.0.0/0"}}`)
	if code != 409 || neutronType(m) != "SecurityGroupRuleExists" {
		t.Fatalf("duplicate rule: %d %v", code, m)
	}
	for _, bad := range []string{
		`{"security_group_rule":{"security_group_id":"` + g.ID + `","direction":"sideways"}}`,
		`{"security_group_rule":{"security_group_id":"` + g.ID + `","direction":"ingress","port_range_min":22}}`,
		`{"security_group_rule":{"security_group_id":"` + g.ID + `","direction":"ingress","protocol":"tcp","port_range_min":90,"port_range_max":80}}`,
		`{"security_group_rule":{"security_group_id":"` + g.ID + `","direction":"ingress","ethertype":"IPv4","remote_ip_prefix":"::/0"}}`,
		`{"security_group_rule":{"security_group_id":"` + g.ID + `","direction":"ingress","protocol":"bogus"}}`,
	} {
		if code, m := e.do(t, "POST", "/v2.0/security-group-rules", e.demoTok, bad); code != 400 {
			t.Errorf("%s: %d %v", bad, code, m)
		}
	}
	// Admin cannot be seen or used by demo.
	_, err = groups.Get(ctx, e.admin, g.ID).Extract()
	if err != nil {
		t.Fatalf("admin sees all groups: %v", err)
	}
	// A port using the group keeps it from being deleted.
	priv := networkByName(t, e.demo, network.PrivateNetwork)
	p, err := ports.Create(ctx, e.demo, ports.CreateOpts{NetworkID: priv.ID, SecurityGroups: &[]string{g.ID}}).Extract()
	if err != nil || len(p.SecurityGroups) != 1 || p.SecurityGroups[0] != g.ID {
		t.Fatalf("port with group: %+v %v", p, err)
	}
	code, m = e.do(t, "DELETE", "/v2.0/security-groups/"+g.ID, e.demoTok, "")
	if code != 409 || neutronType(m) != "SecurityGroupInUse" {
		t.Fatalf("delete used group: %d %v", code, m)
	}
	if err := ports.Delete(ctx, e.demo, p.ID).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	if err := rules.Delete(ctx, e.demo, r.ID).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	if err := groups.Delete(ctx, e.demo, g.ID).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	mustCode(t, groups.Delete(ctx, e.demo, g.ID).ExtractErr(), 404)
}

func mapsEqual[K comparable](a, b map[K]bool) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if !b[k] {
			return false
		}
	}
	return true
}

func (e *env) testFloatingIPs(t *testing.T) {
	ctx := context.Background()
	pub := networkByName(t, e.demo, network.PublicNetwork)
	priv := networkByName(t, e.demo, network.PrivateNetwork)
	p, err := ports.Create(ctx, e.demo, ports.CreateOpts{NetworkID: priv.ID, Name: "fip-port"}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	unroute := e.routeToPublic(t, priv.Subnets[0])
	f, err := floatingips.Create(ctx, e.demo, floatingips.CreateOpts{FloatingNetworkID: pub.ID}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	if f.Status != "DOWN" || f.PortID != "" || !strings.HasPrefix(f.FloatingIP, "203.0.113.") || f.ProjectID != e.demoProject {
		t.Fatalf("fip: %+v", f)
	}
	f, err = floatingips.Update(ctx, e.demo, f.ID, floatingips.UpdateOpts{PortID: &p.ID}).Extract()
	if err != nil || f.Status != "ACTIVE" || f.PortID != p.ID || f.FixedIP != p.FixedIPs[0].IPAddress {
		t.Fatalf("associate: %+v %v", f, err)
	}
	// A second floating IP cannot take the same fixed address.
	f2, err := floatingips.Create(ctx, e.demo, floatingips.CreateOpts{FloatingNetworkID: pub.ID}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	_, err = floatingips.Update(ctx, e.demo, f2.ID, floatingips.UpdateOpts{PortID: &p.ID}).Extract()
	mustCode(t, err, 409)
	empty := ""
	f, err = floatingips.Update(ctx, e.demo, f.ID, floatingips.UpdateOpts{PortID: &empty}).Extract()
	if err != nil || f.Status != "DOWN" || f.PortID != "" || f.FixedIP != "" {
		t.Fatalf("disassociate: %+v %v", f, err)
	}
	// Not from a non-external network.
	_, err = floatingips.Create(ctx, e.demo, floatingips.CreateOpts{FloatingNetworkID: priv.ID}).Extract()
	mustCode(t, err, 400)
	// admin's view and demo isolation
	_, err = floatingips.Get(ctx, e.admin, f.ID).Extract()
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{f.ID, f2.ID} {
		if err := floatingips.Delete(ctx, e.demo, id).ExtractErr(); err != nil {
			t.Fatal(err)
		}
	}
	if err := ports.Delete(ctx, e.demo, p.ID).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	unroute()
}

func (e *env) testListOptions(t *testing.T) {
	ctx := context.Background()
	var ids []string
	for _, name := range []string{"pg-c", "pg-a", "pg-b"} {
		n, err := networks.Create(ctx, e.demo, networks.CreateOpts{Name: name}).Extract()
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, n.ID)
	}
	defer func() {
		for _, id := range ids {
			networks.Delete(ctx, e.demo, id)
		}
	}()
	// gophercloud follows networks_links page by page.
	var names []string
	err := networks.List(e.demo, networks.ListOpts{Limit: 1, SortKey: "name", SortDir: "asc"}).EachPage(ctx,
		func(_ context.Context, page pagination.Page) (bool, error) {
			l, err := networks.ExtractNetworks(page)
			if len(l) > 1 {
				t.Errorf("page of %d", len(l))
			}
			for _, n := range l {
				if strings.HasPrefix(n.Name, "pg-") {
					names = append(names, n.Name)
				}
			}
			return true, err
		})
	if err != nil || strings.Join(names, ",") != "pg-a,pg-b,pg-c" {
		t.Fatalf("paged names %v %v", names, err)
	}
	code, m := e.do(t, "GET", "/v2.0/networks?name=pg-a&name=pg-b&fields=id&fields=name", e.demoTok, "")
	l := m["networks"].([]any)
	if code != 200 || len(l) != 2 || len(l[0].(map[string]any)) != 2 {
		t.Fatalf("fields/filter: %d %v", code, m)
	}
	code, m = e.do(t, "GET", "/v2.0/networks?sort_key=name&sort_dir=desc&name=pg-a&name=pg-c", e.demoTok, "")
	if code != 200 || m["networks"].([]any)[0].(map[string]any)["name"] != "pg-c" {
		t.Fatalf("sort desc: %v", m)
	}
	// page_reverse gives the last page first, with a "previous" link.
	q := "/v2.0/networks?name=pg-a&name=pg-b&name=pg-c&sort_key=name&sort_dir=asc&limit=2&page_reverse=True"
	code, m = e.do(t, "GET", q, e.demoTok, "")
	page := m["networks"].([]any)
	if code != 200 || len(page) != 2 || page[0].(map[string]any)["name"] != "pg-b" || page[1].(map[string]any)["name"] != "pg-c" {
		t.Fatalf("reverse page: %d %v", code, m)
	}
	var prev string
	for _, l := range m["networks_links"].([]any) {
		if l.(map[string]any)["rel"] == "previous" {
			prev = l.(map[string]any)["href"].(string)
		}
	}
	if prev == "" {
		t.Fatalf("no previous link: %v", m["networks_links"])
	}
	resp, b := testenv.Do(t, e.http, "GET", prev, e.demoTok, "")
	if resp.StatusCode != 200 || !strings.Contains(b, `"pg-a"`) || strings.Contains(b, `"pg-b"`) {
		t.Fatalf("previous page: %d %s", resp.StatusCode, b)
	}
	code, m = e.do(t, "GET", "/v2.0/networks?shared=false&id="+ids[0], e.demoTok, "")
	if code != 200 || len(m["networks"].([]any)) != 1 {
		t.Fatalf("bool filter: %v", m)
	}
}

func (e *env) testTags(t *testing.T) {
	ctx := context.Background()
	n, err := networks.Create(ctx, e.demo, networks.CreateOpts{Name: "tagged"}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	defer networks.Delete(ctx, e.demo, n.ID)
	base := "/v2.0/networks/" + n.ID + "/tags"
	if code, _ := e.do(t, "PUT", base+"/red", e.demoTok, ""); code != 201 {
		t.Fatalf("add tag: %d", code)
	}
	if code, _ := e.do(t, "GET", base+"/red", e.demoTok, ""); code != 204 {
		t.Fatalf("check tag: %d", code)
	}
	if code, _ := e.do(t, "GET", base+"/blue", e.demoTok, ""); code != 404 {
		t.Fatalf("check absent tag: %d", code)
	}
	code, m := e.do(t, "PUT", base, e.demoTok, `{"tags":["a","b"]}`)
	if code != 200 || len(m["tags"].([]any)) != 2 {
		t.Fatalf("replace: %d %v", code, m)
	}
	code, m = e.do(t, "GET", "/v2.0/networks?tags=a,b", e.demoTok, "")
	if code != 200 || len(m["networks"].([]any)) != 1 {
		t.Fatalf("tags filter: %v", m)
	}
	if code, _ := e.do(t, "DELETE", base, e.demoTok, ""); code != 204 {
		t.Fatalf("clear: %d", code)
	}
	got, _ := networks.Get(ctx, e.demo, n.ID).Extract()
	if len(got.Tags) != 0 {
		t.Fatalf("tags after clear %v", got.Tags)
	}
}

func (e *env) testBadInput(t *testing.T) {
	priv := networkByName(t, e.demo, network.PrivateNetwork)
	const unknown = "6a1ce2b4-0000-4000-8000-000000000000"
	cases := []struct {
		name, method, path, body string
		want                     int
	}{
		{"bad json", "POST", "/v2.0/networks", `{"network":`, 400},
		{"no wrapper", "POST", "/v2.0/networks", `{"name":"x"}`, 400},
		{"unknown attr", "POST", "/v2.0/networks", `{"network":{"colour":"red"}}`, 400},
		{"bad bool", "POST", "/v2.0/networks", `{"network":{"admin_state_up":"maybe"}}`, 400},
		{"wrong type", "POST", "/v2.0/networks", `{"network":{"name":7}}`, 400},
		{"bad cidr", "POST", "/v2.0/subnets", `{"subnet":{"network_id":"` + priv.ID + `","ip_version":4,"cidr":"10.1.0.0/33"}}`, 400},
		{"host bits cidr", "POST", "/v2.0/subnets", `{"subnet":{"network_id":"` + priv.ID + `","ip_version":4,"cidr":"10.1.0.5/24"}}`, 400},
		{"version mismatch", "POST", "/v2.0/subnets", `{"subnet":{"network_id":"` + priv.ID + `","ip_version":6,"cidr":"10.1.0.0/24"}}`, 400},
		{"bad ip_version", "POST", "/v2.0/subnets", `{"subnet":{"network_id":"` + priv.ID + `","ip_version":5,"cidr":"10.1.0.0/24"}}`, 400},
		{"unknown network", "POST", "/v2.0/subnets", `{"subnet":{"network_id":"` + unknown + `","ip_version":4,"cidr":"10.1.0.0/24"}}`, 404},
		{"network_id not uuid", "POST", "/v2.0/subnets", `{"subnet":{"network_id":"nope","ip_version":4,"cidr":"10.1.0.0/24"}}`, 400},
		{"bad uuid", "GET", "/v2.0/networks/not-a-uuid", "", 404},
		{"bad uuid port", "DELETE", "/v2.0/ports/not-a-uuid", "", 404},
		{"unknown filter", "GET", "/v2.0/networks?colour=red", "", 400},
		{"bad limit", "GET", "/v2.0/ports?limit=abc", "", 400},
		{"bad sort dir", "GET", "/v2.0/ports?sort_key=name&sort_dir=up", "", 400},
		{"bad sort key", "GET", "/v2.0/networks?sort_key=colour", "", 400},
		{"unknown marker", "GET", "/v2.0/networks?limit=1&marker=nope", "", 404},
		{"bad ip", "POST", "/v2.0/ports", `{"port":{"network_id":"` + priv.ID + `","fixed_ips":[{"ip_address":"10.0.0.999"}]}}`, 400},
		{"ip outside", "POST", "/v2.0/ports", `{"port":{"network_id":"` + priv.ID + `","fixed_ips":[{"ip_address":"172.16.0.5"}]}}`, 400},
		{"fixed_ips not list", "POST", "/v2.0/ports", `{"port":{"network_id":"` + priv.ID + `","fixed_ips":"10.0.0.5"}}`, 400},
		{"bad mac", "POST", "/v2.0/ports", `{"port":{"network_id":"` + priv.ID + `","mac_address":"zz"}}`, 400},
		{"unknown sg", "POST", "/v2.0/ports", `{"port":{"network_id":"` + priv.ID + `","security_groups":["` + unknown + `"]}}`, 404},
		{"sg not uuid", "POST", "/v2.0/ports", `{"port":{"network_id":"` + priv.ID + `","security_groups":["nope"]}}`, 400},
		{"fip no net", "POST", "/v2.0/floatingips", `{"floatingip":{}}`, 400},
		{"fip bad net", "POST", "/v2.0/floatingips", `{"floatingip":{"floating_network_id":"nope"}}`, 400},
		{"fip unknown net", "POST", "/v2.0/floatingips", `{"floatingip":{"floating_network_id":"` + unknown + `"}}`, 404},
		{"rule unknown group", "POST", "/v2.0/security-group-rules", `{"security_group_rule":{"security_group_id":"` + unknown + `","direction":"ingress"}}`, 404},
		{"router iface none", "PUT", "/v2.0/routers/" + unknown + "/add_router_interface", `{}`, 400},
		{"tags bad body", "PUT", "/v2.0/networks/" + priv.ID + "/tags", `{"tags":"x"}`, 400},
		{"mtu too big", "POST", "/v2.0/networks", `{"network":{"mtu":9000}}`, 400},
		{"share as member", "POST", "/v2.0/networks", `{"network":{"shared":true}}`, 403},
		{"method", "PATCH", "/v2.0/networks", `{}`, 405},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, m := e.do(t, tc.method, tc.path, e.demoTok, tc.body)
			if code != tc.want {
				t.Fatalf("%s %s = %d, want %d: %v", tc.method, tc.path, code, tc.want, m)
			}
			if m["NeutronError"] == nil {
				t.Fatalf("no NeutronError body: %v", m)
			}
		})
	}
}

func (e *env) testContract(t *testing.T) {
	ctx := context.Background()
	nets := e.c.Networks
	priv, err := nets.AutoNetwork(ctx, e.demoProject)
	if err != nil || priv.Name != network.PrivateNetwork || priv.ProjectID != e.demoProject || len(priv.SubnetIDs) != 1 {
		t.Fatalf("AutoNetwork: %+v %v", priv, err)
	}
	if _, err := nets.GetNetwork(ctx, e.adminProject, false, priv.ID); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("admin project (non-admin call) sees demo's network: %v", err)
	}
	// A new project's defaults are made once however many ask at once.
	fresh := "c0ffee00000040008000000000000001"
	var wg sync.WaitGroup
	got := make([]string, 6)
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, err := nets.AutoNetwork(ctx, fresh)
			if err != nil {
				t.Errorf("AutoNetwork: %v", err)
				return
			}
			got[i] = n.ID
		}()
	}
	wg.Wait()
	for _, id := range got {
		if id != got[0] {
			t.Fatalf("AutoNetwork made several networks: %v", got)
		}
	}
	if err := nets.CheckSecurityGroups(ctx, e.demoProject, []string{"default"}); err != nil {
		t.Fatal(err)
	}
	err = nets.CheckSecurityGroups(ctx, e.demoProject, []string{"nope"})
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Status != 400 || !strings.Contains(ae.Message, "Security group nope not found for project") {
		t.Fatalf("CheckSecurityGroups unknown: %v", err)
	}

	servers := []string{"11111111-1111-1111-1111-111111111111", "22222222-2222-2222-2222-222222222222", "33333333-3333-3333-3333-333333333333"}
	ports := map[string]*network.Port{}
	public := map[string]string{}
	err = e.c.DB.Tx(ctx, func(tx *store.Tx) error {
		for i, sid := range servers {
			fixed := ""
			if i == 0 {
				fixed = "10.0.0.100"
			}
			p, err := nets.CreateServerPort(ctx, tx, e.demoProject, priv.ID, sid, fixed, nil)
			if err != nil {
				return err
			}
			ports[sid] = p
			if i < 2 {
				if public[sid], err = nets.AttachPublicIP(ctx, tx, e.demoProject, sid, p.ID); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if ports[servers[0]].FixedIPs[0].IPAddress != "10.0.0.100" || ports[servers[0]].NetworkName != network.PrivateNetwork {
		t.Fatalf("server port: %+v", ports[servers[0]])
	}
	// The port is ACTIVE, owned by compute:nova, in the default group.
	code, m := e.do(t, "GET", "/v2.0/ports/"+ports[servers[0]].ID, e.demoTok, "")
	pv := m["port"].(map[string]any)
	if code != 200 || pv["status"] != "ACTIVE" || pv["device_owner"] != "compute:nova" || pv["device_id"] != servers[0] ||
		len(pv["security_groups"].([]any)) != 1 {
		t.Fatalf("server port view: %d %v", code, pv)
	}
	code, m = e.do(t, "GET", "/v2.0/ports?device_id="+servers[1], e.demoTok, "")
	if code != 200 || len(m["ports"].([]any)) != 1 {
		t.Fatalf("ports by device: %v", m)
	}
	refs := []network.ServerRef{{ID: "no-such-server", ProjectID: e.demoProject}}
	for _, sid := range servers {
		refs = append(refs, network.ServerRef{ID: sid, ProjectID: e.demoProject})
	}
	addrs, err := nets.Addresses(ctx, refs)
	if err != nil {
		t.Fatal(err)
	}
	a0 := addrs[servers[0]][network.PrivateNetwork]
	if len(a0) != 2 || a0[0].Type != "fixed" || a0[0].Addr != "10.0.0.100" || a0[0].Version != 4 ||
		a0[1].Type != "floating" || a0[1].Addr != public[servers[0]] || a0[0].MAC != ports[servers[0]].MACAddress {
		t.Fatalf("addresses of server 0: %+v", a0)
	}
	if a2 := addrs[servers[2]][network.PrivateNetwork]; len(a2) != 1 || a2[0].Type != "fixed" {
		t.Fatalf("addresses of server 2: %+v", a2)
	}
	if _, ok := addrs["no-such-server"]; ok {
		t.Fatal("addresses for an unknown server")
	}
	// A user port bound to one server cannot be bound to another.
	up, err := portsCreate(ctx, e, priv.ID)
	if err != nil {
		t.Fatal(err)
	}
	err = e.c.DB.Tx(ctx, func(tx *store.Tx) error { return nets.BindPort(ctx, tx, e.demoProject, up, servers[2]) })
	if err != nil {
		t.Fatal(err)
	}
	err = e.c.DB.Tx(ctx, func(tx *store.Tx) error { return nets.BindPort(ctx, tx, e.demoProject, up, servers[1]) })
	if !errors.As(err, &ae) || ae.Status != 409 {
		t.Fatalf("BindPort to second server: %v", err)
	}
	// Release server 0 and 2: their ports and public IPs go; the user port stays, unbound.
	for _, sid := range []string{servers[0], servers[2]} {
		if err := e.c.DB.Tx(ctx, func(tx *store.Tx) error { return nets.ReleaseServer(ctx, tx, sid) }); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := nets.GetPort(ctx, e.demoProject, false, ports[servers[0]].ID); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("server port survived release: %v", err)
	}
	kept, err := nets.GetPort(ctx, e.demoProject, false, up)
	if err != nil || kept.DeviceID != "" {
		t.Fatalf("user port after release: %+v %v", kept, err)
	}
	code, m = e.do(t, "GET", "/v2.0/floatingips?floating_ip_address="+public[servers[0]], e.adminTok, "")
	if code != 200 || len(m["floatingips"].([]any)) != 0 {
		t.Fatalf("floating IP not released: %v", m)
	}
	// The freed fixed address can be given again.
	err = e.c.DB.Tx(ctx, func(tx *store.Tx) error {
		p, err := nets.CreateServerPort(ctx, tx, e.demoProject, priv.ID, servers[0], "10.0.0.100", []string{"default"})
		if err == nil && p.FixedIPs[0].IPAddress != "10.0.0.100" {
			t.Errorf("reused port %+v", p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, sid := range servers {
		if err := e.c.DB.Tx(ctx, func(tx *store.Tx) error { return nets.ReleaseServer(ctx, tx, sid) }); err != nil {
			t.Fatal(err)
		}
	}
	if code, _ := e.do(t, "DELETE", "/v2.0/ports/"+up, e.demoTok, ""); code != 204 {
		t.Fatalf("delete user port: %d", code)
	}
}

func portsCreate(ctx context.Context, e *env, netID string) (string, error) {
	p, err := ports.Create(ctx, e.demo, ports.CreateOpts{NetworkID: netID, Name: "user-port"}).Extract()
	if err != nil {
		return "", err
	}
	return p.ID, nil
}

// TestBootstrapIdempotent starts two clouds on one database: the public
// network, private networks and default groups exist once.
func TestBootstrapIdempotent(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		c1 := testenv.StartCloud(t, dbURL)
		ctx := context.Background()
		p, err := c1.Identity.ProjectByName(ctx, cloud.DemoProject)
		if err != nil {
			t.Fatal(err)
		}
		if err := c1.Networks.EnsureDefaults(ctx, p.ID); err != nil {
			t.Fatal(err)
		}
		c1.Close()
		c2 := testenv.StartCloud(t, dbURL)
		if err := c2.Networks.EnsureDefaults(ctx, p.ID); err != nil {
			t.Fatal(err)
		}
		if err := c2.Networks.Bootstrap(ctx); err != nil {
			t.Fatal(err)
		}
		for q, want := range map[string]int{
			"SELECT COUNT(*) FROM networks WHERE name = 'public'":         1,
			"SELECT COUNT(*) FROM networks WHERE name = 'private'":        2,
			"SELECT COUNT(*) FROM subnets":                                3,
			"SELECT COUNT(*) FROM security_groups WHERE name = 'default'": 2,
			"SELECT COUNT(*) FROM security_group_rules":                   8,
		} {
			var n int
			if err := c2.DB.QueryRow(ctx, q).Scan(&n); err != nil || n != want {
				t.Errorf("%s = %d (%v), want %d", q, n, err, want)
			}
		}
	})
}

func (e *env) testQuotas(t *testing.T) {
	ctx := context.Background()
	q, err := quotas.Get(ctx, e.demo, e.demoProject).Extract()
	if err != nil || q.Network != 100 || q.Port != 500 || q.SecurityGroup != 10 {
		t.Fatalf("default quota: %+v %v", q, err)
	}
	_, err = quotas.Get(ctx, e.demo, e.adminProject).Extract()
	mustCode(t, err, 403)
	two := 2
	_, err = quotas.Update(ctx, e.demo, e.demoProject, quotas.UpdateOpts{Network: &two}).Extract()
	mustCode(t, err, 403)
	// demo holds its private network: with a limit of 2 it may make one more.
	q, err = quotas.Update(ctx, e.admin, e.demoProject, quotas.UpdateOpts{Network: &two}).Extract()
	if err != nil || q.Network != 2 {
		t.Fatalf("update quota: %+v %v", q, err)
	}
	n, err := networks.Create(ctx, e.demo, networks.CreateOpts{Name: "q1"}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	defer networks.Delete(ctx, e.demo, n.ID)
	code, m := e.do(t, "POST", "/v2.0/networks", e.demoTok, `{"network":{"name":"q2"}}`)
	if code != 409 || neutronType(m) != "OverQuota" {
		t.Fatalf("over quota: %d %v", code, m)
	}
	d, err := quotas.GetDetail(ctx, e.demo, e.demoProject).Extract()
	if err != nil || d.Network.Used != 2 || d.Network.Limit != 2 {
		t.Fatalf("details: %+v %v", d, err)
	}
	if code, _ := e.do(t, "DELETE", "/v2.0/quotas/"+e.demoProject, e.adminTok, ""); code != 204 {
		t.Fatalf("reset quota: %d", code)
	}
	if q, _ := quotas.Get(ctx, e.demo, e.demoProject).Extract(); q.Network != 100 {
		t.Fatalf("quota after reset: %+v", q)
	}
}

// testIPAMConcurrent fills a /29 from parallel requests: every request gets
// a distinct address, none fails for a race.
func (e *env) testIPAMConcurrent(t *testing.T) {
	ctx := context.Background()
	n, err := networks.Create(ctx, e.demo, networks.CreateOpts{Name: "race"}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := subnets.Create(ctx, e.demo, subnets.CreateOpts{NetworkID: n.ID, CIDR: "192.168.60.0/29", IPVersion: 4}).Extract(); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	got := map[string]bool{}
	var ids []string
	for i := 0; i < 5; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := ports.Create(ctx, e.demo, ports.CreateOpts{NetworkID: n.ID}).Extract()
			if err != nil {
				t.Errorf("parallel port: %v", err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if got[p.FixedIPs[0].IPAddress] {
				t.Errorf("address %s given twice", p.FixedIPs[0].IPAddress)
			}
			got[p.FixedIPs[0].IPAddress] = true
			ids = append(ids, p.ID)
		}()
	}
	wg.Wait()
	for _, id := range ids {
		ports.Delete(ctx, e.demo, id)
	}
	if err := networks.Delete(ctx, e.demo, n.ID).ExtractErr(); err != nil {
		t.Fatal(err)
	}
}

func (e *env) testRouters(t *testing.T) {
	ctx := context.Background()
	pub := networkByName(t, e.demo, network.PublicNetwork)
	priv := networkByName(t, e.demo, network.PrivateNetwork)
	rt, err := routers.Create(ctx, e.demo, routers.CreateOpts{Name: "r1",
		GatewayInfo: &routers.GatewayInfo{NetworkID: pub.ID}}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	gw := rt.GatewayInfo
	if gw.NetworkID != pub.ID || gw.EnableSNAT == nil || !*gw.EnableSNAT || len(gw.ExternalFixedIPs) != 1 ||
		!strings.HasPrefix(gw.ExternalFixedIPs[0].IPAddress, "203.0.113.") || rt.Status != "ACTIVE" {
		t.Fatalf("router: %+v", rt)
	}
	// Only admins choose SNAT.
	no := false
	_, err = routers.Update(ctx, e.demo, rt.ID, routers.UpdateOpts{GatewayInfo: &routers.GatewayInfo{NetworkID: pub.ID, EnableSNAT: &no}}).Extract()
	mustCode(t, err, 403)
	// The gateway must be an external network.
	_, err = routers.Create(ctx, e.demo, routers.CreateOpts{GatewayInfo: &routers.GatewayInfo{NetworkID: priv.ID}}).Extract()
	mustCode(t, err, 400)

	info, err := routers.AddInterface(ctx, e.demo, rt.ID, routers.AddInterfaceOpts{SubnetID: priv.Subnets[0]}).Extract()
	if err != nil || info.SubnetID != priv.Subnets[0] || info.ID != rt.ID || info.PortID == "" {
		t.Fatalf("add interface: %+v %v", info, err)
	}
	p, err := ports.Get(ctx, e.demo, info.PortID).Extract()
	if err != nil || p.DeviceOwner != "network:router_interface" || p.DeviceID != rt.ID || p.FixedIPs[0].IPAddress != "10.0.0.1" {
		t.Fatalf("interface port: %+v %v", p, err)
	}
	_, err = routers.AddInterface(ctx, e.demo, rt.ID, routers.AddInterfaceOpts{SubnetID: priv.Subnets[0]}).Extract()
	mustCode(t, err, 400)
	// A floating IP behind the router reports it.
	vm, err := ports.Create(ctx, e.demo, ports.CreateOpts{NetworkID: priv.ID}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	f, err := floatingips.Create(ctx, e.demo, floatingips.CreateOpts{FloatingNetworkID: pub.ID, PortID: vm.ID}).Extract()
	if err != nil || f.RouterID != rt.ID || f.Status != "ACTIVE" {
		t.Fatalf("fip behind router: %+v %v", f, err)
	}
	all, err := e.c.Networks.FloatingIPs(ctx)
	if err != nil || len(all) == 0 {
		t.Fatalf("FloatingIPs: %v %v", all, err)
	}
	if err := floatingips.Delete(ctx, e.demo, f.ID).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	if err := ports.Delete(ctx, e.demo, vm.ID).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	code, m := e.do(t, "DELETE", "/v2.0/ports/"+info.PortID, e.demoTok, "")
	if code != 409 || neutronType(m) != "L3PortInUse" {
		t.Fatalf("delete router port: %d %v", code, m)
	}
	code, m = e.do(t, "DELETE", "/v2.0/routers/"+rt.ID, e.demoTok, "")
	if code != 409 || neutronType(m) != "RouterInUse" {
		t.Fatalf("delete busy router: %d %v", code, m)
	}
	// admin's routers are not demo's business.
	_, err = routers.Get(ctx, e.demo, rt.ID).Extract()
	if err != nil {
		t.Fatal(err)
	}
	ar, err := routers.Create(ctx, e.admin, routers.CreateOpts{Name: "admin-r"}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	_, err = routers.Get(ctx, e.demo, ar.ID).Extract()
	mustCode(t, err, 404)
	if err := routers.Delete(ctx, e.admin, ar.ID).ExtractErr(); err != nil {
		t.Fatal(err)
	}

	if _, err := routers.RemoveInterface(ctx, e.demo, rt.ID, routers.RemoveInterfaceOpts{SubnetID: priv.Subnets[0]}).Extract(); err != nil {
		t.Fatal(err)
	}
	_, err = routers.RemoveInterface(ctx, e.demo, rt.ID, routers.RemoveInterfaceOpts{SubnetID: priv.Subnets[0]}).Extract()
	mustCode(t, err, 404)
	// Clearing the gateway frees its public address.
	rt, err = routers.Update(ctx, e.demo, rt.ID, routers.UpdateOpts{GatewayInfo: &routers.GatewayInfo{}}).Extract()
	if err != nil || rt.GatewayInfo.NetworkID != "" {
		t.Fatalf("clear gateway: %+v %v", rt, err)
	}
	if err := routers.Delete(ctx, e.demo, rt.ID).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	mustCode(t, routers.Delete(ctx, e.demo, rt.ID).ExtractErr(), 404)
}

// testAddressesMany asks for the addresses of more servers than one query
// chunk holds, as GET /servers/detail does with a full page.
func (e *env) testAddressesMany(t *testing.T) {
	ctx := context.Background()
	n, err := networks.Create(ctx, e.demo, networks.CreateOpts{Name: "big"}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := subnets.Create(ctx, e.demo, subnets.CreateOpts{NetworkID: n.ID, CIDR: "172.20.0.0/22", IPVersion: 4}).Extract(); err != nil {
		t.Fatal(err)
	}
	const count = 520
	ids := make([]string, count)
	err = e.c.DB.Tx(ctx, func(tx *store.Tx) error {
		for i := range ids {
			ids[i] = "srv-many-" + strconv.Itoa(i)
			if _, err := e.c.Networks.CreateServerPort(ctx, tx, e.demoProject, n.ID, ids[i], "", nil); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	refs := make([]network.ServerRef, len(ids))
	for i, id := range ids {
		refs[i] = network.ServerRef{ID: id, ProjectID: e.demoProject}
	}
	addrs, err := e.c.Networks.Addresses(ctx, refs)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, id := range ids {
		a := addrs[id]["big"]
		if len(a) != 1 || a[0].Type != "fixed" || seen[a[0].Addr] {
			t.Fatalf("addresses of %s: %+v", id, a)
		}
		seen[a[0].Addr] = true
	}
	err = e.c.DB.Tx(ctx, func(tx *store.Tx) error {
		for _, id := range ids {
			if err := e.c.Networks.ReleaseServer(ctx, tx, id); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := networks.Delete(ctx, e.demo, n.ID).ExtractErr(); err != nil {
		t.Fatal(err)
	}
}

// testBulk creates several networks in one request, and checks that a bad
// item makes the whole request fail with nothing created.
func (e *env) testBulk(t *testing.T) {
	ctx := context.Background()
	code, m := e.do(t, "POST", "/v2.0/networks", e.demoTok, `{"networks":[{"name":"bulk-1"},{"name":"bulk-2"}]}`)
	l, _ := m["networks"].([]any)
	if code != 201 || len(l) != 2 {
		t.Fatalf("bulk networks: %d %v", code, m)
	}
	var nets []networks.Network
	for _, x := range l {
		n, err := networks.Get(ctx, e.demo, x.(map[string]any)["id"].(string)).Extract()
		if err != nil {
			t.Fatal(err)
		}
		nets = append(nets, *n)
	}
	if nets[0].Name != "bulk-1" || nets[1].Name != "bulk-2" {
		t.Fatalf("bulk order: %+v", nets)
	}
	// gophercloud's bulk rule call.
	g, err := groups.Create(ctx, e.demo, groups.CreateOpts{Name: "bulk-sg"}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	rs, err := rules.CreateBulk(ctx, e.demo, []rules.CreateOpts{
		{SecGroupID: g.ID, Direction: rules.DirIngress, EtherType: rules.EtherType4, Protocol: rules.ProtocolTCP, PortRangeMin: 22, PortRangeMax: 22},
		{SecGroupID: g.ID, Direction: rules.DirIngress, EtherType: rules.EtherType4, Protocol: rules.ProtocolICMP},
	}).Extract()
	if err != nil || len(rs) != 2 {
		t.Fatalf("bulk rules: %+v %v", rs, err)
	}
	if err := groups.Delete(ctx, e.demo, g.ID).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	code, m = e.do(t, "POST", "/v2.0/subnets", e.demoTok, `{"subnets":[
		{"network_id":"`+nets[0].ID+`","ip_version":4,"cidr":"10.9.0.0/24"},
		{"network_id":"`+nets[0].ID+`","ip_version":4,"cidr":"10.9.0.0/25"}]}`)
	if code != 400 {
		t.Fatalf("overlapping bulk subnets: %d %v", code, m)
	}
	got, _ := networks.Get(ctx, e.demo, nets[0].ID).Extract()
	if len(got.Subnets) != 0 {
		t.Fatalf("failed bulk left subnets behind: %v", got.Subnets)
	}
	code, m = e.do(t, "POST", "/v2.0/ports", e.demoTok, `{"ports":[]}`)
	if code != 400 {
		t.Fatalf("empty bulk: %d %v", code, m)
	}
	for _, n := range nets {
		if err := networks.Delete(ctx, e.demo, n.ID).ExtractErr(); err != nil {
			t.Fatal(err)
		}
	}
}
