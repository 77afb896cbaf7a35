package network_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/projects"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/roles"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/users"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/floatingips"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/routers"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"

	"nimbus/internal/cloud"
	"nimbus/internal/network"
	"nimbus/internal/testenv"
)

// bindingEnv is a cloud with a second customer, alt, beside demo.
type bindingEnv struct {
	*env
	alt, demoCompute *gophercloud.ServiceClient
	altTok, altID    string
	imageID, flavor  string
}

func newBindingEnv(t *testing.T, dbURL string) *bindingEnv {
	ctx := context.Background()
	e := &bindingEnv{env: newEnv(t, dbURL)}
	id, err := openstack.NewIdentityV3(testenv.Provider(t, e.c, cloud.AdminUser), gophercloud.EndpointOpts{Region: "RegionOne"})
	if err != nil {
		t.Fatal(err)
	}
	p, err := projects.Create(ctx, id, projects.CreateOpts{Name: "alt", DomainID: "default"}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	u, err := users.Create(ctx, id, users.CreateOpts{Name: "alt", DomainID: "default", Password: "alt-pw",
		DefaultProjectID: p.ID}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	pages, err := roles.List(id, roles.ListOpts{Name: "member"}).AllPages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := roles.ExtractRoles(pages)
	if err != nil || len(rs) != 1 {
		t.Fatalf("member role: %v %v", rs, err)
	}
	if err := roles.Assign(ctx, id, rs[0].ID, roles.AssignOpts{UserID: u.ID, ProjectID: p.ID}).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	altPC := testenv.ProviderAs(t, e.c, "alt", "alt-pw", "alt")
	if e.alt, err = openstack.NewNetworkV2(altPC, gophercloud.EndpointOpts{Region: "RegionOne"}); err != nil {
		t.Fatal(err)
	}
	e.altTok, e.altID = altPC.Token(), p.ID
	e.demoCompute = testenv.Compute(t, testenv.Provider(t, e.c, cloud.DemoUser), "2.37")
	t.Cleanup(func() {
		e.alt.ProviderClient.HTTPClient.CloseIdleConnections()
		e.demoCompute.ProviderClient.HTTPClient.CloseIdleConnections()
	})
	if err := e.c.DB.QueryRow(ctx, "SELECT id FROM images WHERE name = ?", "Debian 12").Scan(&e.imageID); err != nil {
		t.Fatal(err)
	}
	e.flavor = "2" // m1.small: Debian 12 fits its disk
	return e
}

// server makes an ACTIVE demo server on nets ("auto" or port ids).
func (e *bindingEnv) server(t *testing.T, name string, nets any) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv, err := servers.Create(ctx, e.demoCompute, servers.CreateOpts{Name: name, ImageRef: e.imageID,
		FlavorRef: e.flavor, Networks: nets}, nil).Extract()
	if err != nil {
		t.Fatalf("create server %s: %v", name, err)
	}
	if err := servers.WaitForStatus(ctx, e.demoCompute, srv.ID, "ACTIVE"); err != nil {
		t.Fatalf("server %s: %v", name, err)
	}
	return srv.ID
}

// serverNets is the network names of a demo server's addresses, through
// Nova's server show and the hypervisor's view (ServerPorts).
func (e *bindingEnv) serverNets(t *testing.T, id string) (shown []string, nics []string) {
	t.Helper()
	ctx := context.Background()
	s, err := servers.Get(ctx, e.demoCompute, id).Extract()
	if err != nil {
		t.Fatal(err)
	}
	for name := range s.Addresses {
		shown = append(shown, name)
	}
	ps, err := e.c.Networks.ServerPorts(ctx, network.ServerRef{ID: id, ProjectID: e.demoProject})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		nics = append(nics, p.NetworkID)
	}
	return shown, nics
}

func TestPortBindings(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newBindingEnv(t, dbURL)
		t.Run("device_policy", e.testDevicePolicy)
		t.Run("server_ports", e.testServerPorts)
		t.Run("router_ports", e.testRouterPorts)
		t.Run("shared_network", e.testSharedNetwork)
	})
}

// testDevicePolicy: a customer cannot name another project's server or
// router as its port's device, nor claim compute's or the network
// service's device owners for them (issue 16, item 2).
func (e *bindingEnv) testDevicePolicy(t *testing.T) {
	ctx := context.Background()
	victim := e.server(t, "victim", "auto")
	rt, err := routers.Create(ctx, e.demo, routers.CreateOpts{Name: "demo-r"}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	altNet, err := networks.Create(ctx, e.alt, networks.CreateOpts{Name: "altnet"}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := subnets.Create(ctx, e.alt, subnets.CreateOpts{NetworkID: altNet.ID, CIDR: "192.168.77.0/24", IPVersion: 4}).Extract(); err != nil {
		t.Fatal(err)
	}
	altRouter, err := routers.Create(ctx, e.alt, routers.CreateOpts{Name: "alt-r"}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	plain, err := ports.Create(ctx, e.alt, ports.CreateOpts{NetworkID: altNet.ID, Name: "plain"}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	const noServer = "6c1e0000-0000-4000-8000-000000000001"
	for _, tc := range []struct {
		name, owner, device string
		code                int
		typ                 string
	}{
		{"compute owner on another project's server", "compute:nova", victim, 403, "PolicyNotAuthorized"},
		{"compute owner on no server", "compute:nova", noServer, 403, "PolicyNotAuthorized"},
		{"compute owner without device", "compute:az1", "", 403, "PolicyNotAuthorized"},
		{"another project's server as device", "", victim, 409, "DeviceIDNotOwnedByTenant"},
		{"another project's router as interface", "network:router_interface", rt.ID, 409, "DeviceIDNotOwnedByTenant"},
		{"another project's router, other owner", "network:dhcp", rt.ID, 409, "DeviceIDNotOwnedByTenant"},
		{"own router on own network", "network:router_interface", altRouter.ID, 201, ""},
		{"a device that names nothing", "", noServer, 201, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := testenv.Sprintf(`{"port":{"network_id":%q,"device_owner":%q,"device_id":%q}}`, altNet.ID, tc.owner, tc.device)
			code, m := e.do(t, "POST", "/v2.0/ports", e.altTok, body)
			if code != tc.code || neutronType(m) != tc.typ {
				t.Fatalf("create: %d %v, want %d %s", code, m, tc.code, tc.typ)
			}
			want := tc.code
			if want == 201 {
				want = 200
			}
			body = testenv.Sprintf(`{"port":{"device_owner":%q,"device_id":%q}}`, tc.owner, tc.device)
			code, m = e.do(t, "PUT", "/v2.0/ports/"+plain.ID, e.altTok, body)
			if code != want || neutronType(m) != tc.typ {
				t.Fatalf("update: %d %v, want %d %s", code, m, want, tc.typ)
			}
		})
	}
	// network:* on a network of another project is the admin's (neutron's
	// create_port:device_owner): alt on demo's shared-by-admin network is
	// covered by testSharedNetwork; here the owner of the network may.
	// Demo may name its own server with compute's owner.
	priv := networkByName(t, e.demo, network.PrivateNetwork)
	own, err := ports.Create(ctx, e.demo, ports.CreateOpts{NetworkID: priv.ID, DeviceOwner: "compute:nova", DeviceID: victim}).Extract()
	if err != nil {
		t.Fatalf("own server as device: %v", err)
	}
	// Whatever device a port names, only compute's binding puts it in a
	// server: not alt's port the admin labelled with demo's server, nor
	// demo's own relabelled one.
	forged, err := ports.Create(ctx, e.admin, ports.CreateOpts{NetworkID: altNet.ID, ProjectID: e.altID,
		DeviceOwner: "compute:nova", DeviceID: victim}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	shown, nics := e.serverNets(t, victim)
	if len(shown) != 1 || shown[0] != network.PrivateNetwork || len(nics) != 1 || nics[0] != priv.ID {
		t.Fatalf("victim's networks: shown %v, NICs %v", shown, nics)
	}
	for _, p := range []string{own.ID, forged.ID, plain.ID} {
		if code, m := e.do(t, "DELETE", "/v2.0/ports/"+p, e.adminTok, ""); code != 204 {
			t.Fatalf("delete port: %d %v", code, m)
		}
	}
	if err := routers.Delete(ctx, e.demo, rt.ID).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	if err := servers.Delete(ctx, e.demoCompute, victim).ExtractErr(); err != nil {
		t.Fatal(err)
	}
}

// testServerPorts: the honest path, a demo port given to a server with
// --nic port-id, is bound by compute, shown, held, and released on delete.
func (e *bindingEnv) testServerPorts(t *testing.T) {
	ctx := context.Background()
	priv := networkByName(t, e.demo, network.PrivateNetwork)
	p, err := ports.Create(ctx, e.demo, ports.CreateOpts{NetworkID: priv.ID, Name: "nic"}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	id := e.server(t, "with-port", []servers.Network{{Port: p.ID}})
	shown, nics := e.serverNets(t, id)
	if len(shown) != 1 || shown[0] != network.PrivateNetwork || len(nics) != 1 || nics[0] != priv.ID {
		t.Fatalf("server with port: shown %v, NICs %v", shown, nics)
	}
	got, err := ports.Get(ctx, e.demo, p.ID).Extract()
	if err != nil || got.DeviceID != id || got.DeviceOwner != "compute:nova" || got.Status != "ACTIVE" {
		t.Fatalf("bound port: %+v %v", got, err)
	}
	// The binding is compute's: its owner cannot move the port elsewhere.
	code, m := e.do(t, "PUT", "/v2.0/ports/"+p.ID, e.demoTok, `{"port":{"device_id":"elsewhere"}}`)
	if code != 409 || neutronType(m) != "PortInUse" {
		t.Fatalf("move bound port: %d %v", code, m)
	}
	if code, m := e.do(t, "PUT", "/v2.0/ports/"+p.ID, e.demoTok, `{"port":{"name":"renamed"}}`); code != 200 {
		t.Fatalf("rename bound port: %d %v", code, m)
	}
	// A floating IP follows demo's port; alt cannot point one at it.
	pub := networkByName(t, e.demo, network.PublicNetwork)
	defer e.routeToPublic(t, priv.Subnets[0])()
	f, err := floatingips.Create(ctx, e.demo, floatingips.CreateOpts{FloatingNetworkID: pub.ID, PortID: p.ID}).Extract()
	if err != nil || f.PortID != p.ID {
		t.Fatalf("associate: %+v %v", f, err)
	}
	_, err = floatingips.Create(ctx, e.alt, floatingips.CreateOpts{FloatingNetworkID: pub.ID, PortID: p.ID}).Extract()
	mustCode(t, err, 404)
	if err := floatingips.Delete(ctx, e.demo, f.ID).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	ctx2, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := servers.Delete(ctx2, e.demoCompute, id).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	for {
		got, err = ports.Get(ctx2, e.demo, p.ID).Extract()
		if err != nil || got.DeviceID == "" {
			break
		}
		select {
		case <-ctx2.Done():
			t.Fatalf("port still bound after server delete: %+v", got)
		case <-time.After(100 * time.Millisecond):
		}
	}
	if err != nil || got.Status != "DOWN" || got.DeviceOwner != "" {
		t.Fatalf("port after server delete: %+v %v", got, err)
	}
	if err := ports.Delete(ctx, e.demo, p.ID).ExtractErr(); err != nil {
		t.Fatal(err)
	}
}

// testRouterPorts: only the router's own interfaces hold it; a port another
// project labels with the router's id does not block its delete.
func (e *bindingEnv) testRouterPorts(t *testing.T) {
	ctx := context.Background()
	priv := networkByName(t, e.demo, network.PrivateNetwork)
	rt, err := routers.Create(ctx, e.demo, routers.CreateOpts{Name: "r-bind"}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	altNet, err := networks.Create(ctx, e.alt, networks.CreateOpts{Name: "altnet2"}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := subnets.Create(ctx, e.alt, subnets.CreateOpts{NetworkID: altNet.ID, CIDR: "192.168.78.0/24", IPVersion: 4}).Extract(); err != nil {
		t.Fatal(err)
	}
	// Before the fix alt made this itself; the admin may still label a port so.
	forged, err := ports.Create(ctx, e.admin, ports.CreateOpts{NetworkID: altNet.ID, ProjectID: e.altID,
		DeviceOwner: "network:router_interface", DeviceID: rt.ID}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	// The label neither blocks the port's delete nor is a router interface.
	info, err := routers.AddInterface(ctx, e.demo, rt.ID, routers.AddInterfaceOpts{SubnetID: priv.Subnets[0]}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	code, m := e.do(t, "DELETE", "/v2.0/routers/"+rt.ID, e.demoTok, "")
	if code != 409 || neutronType(m) != "RouterInUse" {
		t.Fatalf("delete router with an interface: %d %v", code, m)
	}
	code, m = e.do(t, "DELETE", "/v2.0/ports/"+info.PortID, e.demoTok, "")
	if code != 409 || neutronType(m) != "L3PortInUse" {
		t.Fatalf("delete interface port: %d %v", code, m)
	}
	if _, err := routers.RemoveInterface(ctx, e.demo, rt.ID, routers.RemoveInterfaceOpts{PortID: info.PortID}).Extract(); err != nil {
		t.Fatal(err)
	}
	_, err = routers.RemoveInterface(ctx, e.demo, rt.ID, routers.RemoveInterfaceOpts{PortID: forged.ID}).Extract()
	mustCode(t, err, 404)
	if err := routers.Delete(ctx, e.demo, rt.ID).ExtractErr(); err != nil {
		t.Fatalf("delete router beside another project's labelled port: %v", err)
	}
	if err := ports.Delete(ctx, e.alt, forged.ID).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	// An interface added by port is the router's too.
	p, err := ports.Create(ctx, e.demo, ports.CreateOpts{NetworkID: priv.ID}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	rt2, err := routers.Create(ctx, e.demo, routers.CreateOpts{Name: "r-bind2"}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := routers.AddInterface(ctx, e.demo, rt2.ID, routers.AddInterfaceOpts{PortID: p.ID}).Extract(); err != nil {
		t.Fatal(err)
	}
	mustCode(t, routers.Delete(ctx, e.demo, rt2.ID).ExtractErr(), 409)
	if _, err := routers.RemoveInterface(ctx, e.demo, rt2.ID, routers.RemoveInterfaceOpts{PortID: p.ID}).Extract(); err != nil {
		t.Fatal(err)
	}
	if err := routers.Delete(ctx, e.demo, rt2.ID).ExtractErr(); err != nil {
		t.Fatal(err)
	}
}

// testSharedNetwork: on a network another project shares with it, a
// customer gets an address and a MAC from the network, keeps port security,
// and cannot add subnets (neutron's ADMIN_OR_NET_OWNER rules).
func (e *bindingEnv) testSharedNetwork(t *testing.T) {
	ctx := context.Background()
	shared := true
	n, err := networks.Create(ctx, e.admin, networks.CreateOpts{Name: "shared", Shared: &shared}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	sub, err := subnets.Create(ctx, e.admin, subnets.CreateOpts{NetworkID: n.ID, CIDR: "172.31.0.0/24", IPVersion: 4}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, attrs, rule string }{
		{"fixed address", `"fixed_ips":[{"ip_address":"172.31.0.1"}]`, "create_port:fixed_ips"},
		{"fixed subnet", testenv.Sprintf(`"fixed_ips":[{"subnet_id":%q}]`, sub.ID), "create_port:fixed_ips"},
		{"mac", `"mac_address":"fa:16:3e:00:00:01"`, "create_port:mac_address"},
		{"port security off", `"port_security_enabled":false`, "create_port:port_security_enabled"},
		{"address pairs", `"allowed_address_pairs":[{"ip_address":"0.0.0.0/0"}]`, "create_port:allowed_address_pairs"},
		{"network device", `"device_owner":"network:router_interface"`, "create_port:device_owner"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, m := e.do(t, "POST", "/v2.0/ports", e.altTok, testenv.Sprintf(`{"port":{"network_id":%q,%s}}`, n.ID, tc.attrs))
			if code != 403 || neutronType(m) != "PolicyNotAuthorized" || !containsStr(m, tc.rule) {
				t.Fatalf("%d %v, want 403 %s", code, m, tc.rule)
			}
		})
	}
	p, err := ports.Create(ctx, e.alt, ports.CreateOpts{NetworkID: n.ID}).Extract()
	if err != nil || len(p.FixedIPs) != 1 || p.FixedIPs[0].SubnetID != sub.ID {
		t.Fatalf("plain port on shared network: %+v %v", p, err)
	}
	code, m := e.do(t, "PUT", "/v2.0/ports/"+p.ID, e.altTok, `{"port":{"allowed_address_pairs":[{"ip_address":"172.31.0.1"}]}}`)
	if code != 403 || !containsStr(m, "update_port:allowed_address_pairs") {
		t.Fatalf("update pairs: %d %v", code, m)
	}
	_, err = subnets.Create(ctx, e.alt, subnets.CreateOpts{NetworkID: n.ID, CIDR: "172.31.1.0/24", IPVersion: 4}).Extract()
	mustCode(t, err, 403)
	if err := ports.Delete(ctx, e.alt, p.ID).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	if err := networks.Delete(ctx, e.admin, n.ID).ExtractErr(); err != nil {
		t.Fatal(err)
	}
}

// containsStr reports whether a Neutron error's message mentions s.
func containsStr(m map[string]any, s string) bool {
	ne, _ := m["NeutronError"].(map[string]any)
	msg, _ := ne["message"].(string)
	return strings.Contains(msg, s)
}
