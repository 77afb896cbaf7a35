package compute_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/attachinterfaces"

	"nimbus/internal/cloud"
	"nimbus/internal/driver/fake"
	"nimbus/internal/testenv"
)

// ifEnv is a cloud with one active server of demo's, for the os-interface
// tests.
type ifEnv struct {
	*env
	server string
}

func newIfEnv(t *testing.T, dbURL string) *ifEnv {
	e := &ifEnv{env: newEnv(t, dbURL)}
	e.server = e.create(e.demo, "2.96", "")
	e.wait(e.server, e.demo, "ACTIVE")
	return e
}

// neutron sends a request to the network API and decodes its answer.
func (e *ifEnv) neutron(want int, method, path, tok, body string) map[string]any {
	e.t.Helper()
	resp, raw := testenv.Do(e.t, e.client, method, e.c.NetworkURL+"/v2.0"+path, tok, body)
	if resp.StatusCode != want {
		e.t.Fatalf("%s %s: %d, want %d: %s", method, path, resp.StatusCode, want, raw)
	}
	var m map[string]any
	if strings.TrimSpace(raw) != "" {
		if err := json.Unmarshal([]byte(raw), &m); err != nil {
			e.t.Fatalf("%s %s: %q", method, path, raw)
		}
	}
	return m
}

// network is the id of the network named name that tok sees.
func (e *ifEnv) network(tok, name string) string {
	e.t.Helper()
	for _, n := range e.neutron(200, "GET", "/networks?name="+name, tok, "")["networks"].([]any) {
		return n.(map[string]any)["id"].(string)
	}
	e.t.Fatalf("no network %s", name)
	return ""
}

// port makes a port of demo's on network.
func (e *ifEnv) port(network string) string {
	e.t.Helper()
	p := e.neutron(201, "POST", "/ports", e.demo, `{"port":{"network_id":"`+network+`"}}`)
	return p["port"].(map[string]any)["id"].(string)
}

// nics are the ports the driver has NICs for.
func (e *ifEnv) nics(server string) []string {
	e.t.Helper()
	sp, ok := e.c.Fake.Spec(server)
	if !ok {
		e.t.Fatalf("the driver has no VM %s", server)
	}
	var ids []string
	for _, p := range sp.Ports {
		ids = append(ids, p.ID)
	}
	return ids
}

// attachments are the port ids os-interface lists.
func (e *ifEnv) attachments(server string) []string {
	e.t.Helper()
	var ids []string
	for _, a := range e.must(200, "GET", "/servers/"+server+"/os-interface", e.demo, "2.96", "")["interfaceAttachments"].([]any) {
		ids = append(ids, a.(map[string]any)["port_id"].(string))
	}
	return ids
}

func attachment(m map[string]any) map[string]any { return m["interfaceAttachment"].(map[string]any) }

// TestInterfaceAttachDetach attaches a NIC by network and by port to an
// active and to a stopped server, checks the views at the microversions
// that change them, and detaches them again: the driver's NICs follow the
// bindings at every step.
func TestInterfaceAttachDetach(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newIfEnv(t, dbURL)
		first := e.attachments(e.server)
		if len(first) != 1 || !slices.Equal(e.nics(e.server), first) {
			t.Fatalf("a new server: attachments %v, NICs %v", first, e.nics(e.server))
		}
		net := e.network(e.demo, "private")

		// By network, at 2.49 (tag accepted, not shown).
		a := attachment(e.must(200, "POST", "/servers/"+e.server+"/os-interface", e.demo, "2.49",
			`{"interfaceAttachment":{"net_id":"`+net+`","tag":"data"}}`))
		byNet := a["port_id"].(string)
		ips := a["fixed_ips"].([]any)
		if a["net_id"] != net || a["port_state"] != "ACTIVE" || a["mac_addr"] == "" || len(ips) != 1 ||
			ips[0].(map[string]any)["subnet_id"] == "" || ips[0].(map[string]any)["ip_address"] == "" {
			t.Errorf("attachment %v", a)
		}
		if _, ok := a["tag"]; ok {
			t.Errorf("tag shown before 2.70: %v", a)
		}
		if got := e.nics(e.server); !slices.Equal(got, []string{first[0], byNet}) {
			t.Fatalf("NICs after attach %v, want %v", got, []string{first[0], byNet})
		}

		// By port, at 2.70 (tag shown).
		own := e.port(net)
		a = attachment(e.must(200, "POST", "/servers/"+e.server+"/os-interface", e.demo, "2.70",
			`{"interfaceAttachment":{"port_id":"`+own+`"}}`))
		if tag, ok := a["tag"]; !ok || tag != nil || a["port_id"] != own {
			t.Errorf("attachment at 2.70 %v", a)
		}
		if dev := e.neutron(200, "GET", "/ports/"+own, e.demo, "")["port"].(map[string]any)["device_id"]; dev != e.server {
			t.Errorf("attached port's device_id %v", dev)
		}
		if got := e.attachments(e.server); !slices.Equal(got, []string{first[0], byNet, own}) {
			t.Errorf("attachments %v", got)
		}
		show := attachment(e.must(200, "GET", "/servers/"+e.server+"/os-interface/"+byNet, e.demo, "2.1", ""))
		if show["port_id"] != byNet || show["net_id"] != net {
			t.Errorf("show %v", show)
		}

		// Detach: the NIC goes, the port made for the attach is deleted,
		// the user's port is unbound and kept.
		e.must(202, "DELETE", "/servers/"+e.server+"/os-interface/"+byNet, e.demo, "2.96", "")
		e.must(202, "DELETE", "/servers/"+e.server+"/os-interface/"+own, e.demo, "2.96", "")
		if got := e.nics(e.server); !slices.Equal(got, first) {
			t.Errorf("NICs after detach %v, want %v", got, first)
		}
		e.neutron(404, "GET", "/ports/"+byNet, e.demo, "")
		if p := e.neutron(200, "GET", "/ports/"+own, e.demo, "")["port"].(map[string]any); p["device_id"] != "" || p["status"] != "DOWN" {
			t.Errorf("detached user port %v", p)
		}
		if got := e.attachments(e.server); !slices.Equal(got, first) {
			t.Errorf("attachments after detach %v", got)
		}

		// A stopped server takes the NIC into its next start.
		e.action(e.server, e.demo, "2.96", `{"os-stop":null}`, 202)
		e.wait(e.server, e.demo, "SHUTOFF")
		e.must(200, "POST", "/servers/"+e.server+"/os-interface", e.demo, "2.96", `{"interfaceAttachment":{"port_id":"`+own+`"}}`)
		if got := e.nics(e.server); !slices.Equal(got, []string{first[0], own}) {
			t.Errorf("stopped server's NICs %v", got)
		}
		e.must(202, "DELETE", "/servers/"+e.server+"/os-interface/"+own, e.demo, "2.96", "")
		if got := e.nics(e.server); !slices.Equal(got, first) {
			t.Errorf("stopped server's NICs after detach %v", got)
		}

		// With no body, the project's default network.
		a = attachment(e.must(200, "POST", "/servers/"+e.server+"/os-interface", e.demo, "2.96", ""))
		if a["net_id"] != net {
			t.Errorf("attach without a body went to %v, want %s", a["net_id"], net)
		}
	})
}

// TestInterfaceErrors checks Nova's answers to what os-interface refuses.
func TestInterfaceErrors(t *testing.T) {
	e := newIfEnv(t, "")
	net := e.network(e.demo, "private")
	public := e.network(e.demo, "public")
	inUse := e.attachments(e.server)[0]
	free := e.port(net)
	other := e.create(e.admin, "2.96", "")
	e.wait(other, e.admin, "ACTIVE")
	shelved := e.create(e.demo, "2.96", "")
	e.wait(shelved, e.demo, "ACTIVE")
	e.action(shelved, e.demo, "2.96", `{"shelve":null}`, 202)
	e.wait(shelved, e.demo, "SHELVED_OFFLOADED")
	const unknown = "8d3b7c9e-1111-4222-8333-944455556666"
	path := func(id string) string { return "/servers/" + id + "/os-interface" }
	body := func(inner string) string { return `{"interfaceAttachment":{` + inner + `}}` }

	cases := []struct {
		name, method, path, mv, body string
		status                       int
		msg                          string
	}{
		{"both network and port", "POST", path(e.server), "2.96", body(`"net_id":"` + net + `","port_id":"` + free + `"`), 400,
			"Must not input both network_id and port_id"},
		{"address without network", "POST", path(e.server), "2.96", body(`"fixed_ips":[{"ip_address":"10.0.0.9"}]`), 400,
			"Must input network_id when request IP address"},
		{"bad address", "POST", path(e.server), "2.96", body(`"net_id":"` + net + `","fixed_ips":[{"ip_address":"x"}]`), 400,
			"is not a 'ip_address'"},
		{"net_id not a uuid", "POST", path(e.server), "2.96", body(`"net_id":"abc"`), 400, "'abc' is not a 'uuid'"},
		{"tag before 2.49", "POST", path(e.server), "2.48", body(`"net_id":"` + net + `","tag":"a"`), 400, "'tag' was unexpected"},
		{"unknown key", "POST", path(e.server), "2.96", body(`"network":"x"`), 400, "'network' was unexpected"},
		{"unknown server", "POST", path(unknown), "2.96", body(`"net_id":"` + net + `"`), 404, "could not be found"},
		{"another project's server", "POST", path(other), "2.96", body(`"net_id":"` + net + `"`), 404, "could not be found"},
		{"unknown port", "POST", path(e.server), "2.96", body(`"port_id":"` + unknown + `"`), 404, "Port id " + unknown + " could not be found."},
		{"unknown network", "POST", path(e.server), "2.96", body(`"net_id":"` + unknown + `"`), 404, "Network " + unknown + " could not be found."},
		{"port in use", "POST", path(e.server), "2.96", body(`"port_id":"` + inUse + `"`), 409, "Port " + inUse + " is still in use."},
		{"external network", "POST", path(e.server), "2.96", body(`"net_id":"` + public + `"`), 403,
			"It is not allowed to create an interface on external network " + public},
		{"shelved offloaded", "POST", path(shelved), "2.96", body(`"net_id":"` + net + `"`), 409,
			"Cannot 'attach_interface' instance " + shelved + " while it is in vm_state shelved_offloaded"},
		{"show a port not the server's", "GET", path(e.server) + "/" + free, "2.96", "", 404,
			"Instance " + e.server + " does not have a port with id " + free},
		{"show an unknown port", "GET", path(e.server) + "/" + unknown, "2.96", "", 404, "Port id " + unknown + " could not be found."},
		{"detach a port not attached", "DELETE", path(e.server) + "/" + free, "2.96", "", 404, "Port " + free + " is not attached"},
		{"detach from a shelved server", "DELETE", path(shelved) + "/" + free, "2.96", "", 409,
			"Cannot 'detach_interface' instance " + shelved + " while it is in vm_state shelved_offloaded"},
		{"list another project's server", "GET", path(other), "2.96", "", 404, "could not be found"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st, m, _ := e.do(tc.method, tc.path, e.demo, tc.mv, tc.body)
			if st != tc.status || !strings.Contains(fmt.Sprint(m), tc.msg) {
				t.Errorf("%d %v, want %d %q", st, m, tc.status, tc.msg)
			}
		})
	}
	if got := e.attachments(e.server); len(got) != 1 {
		t.Errorf("refused attaches left attachments %v", got)
	}
	if p := e.neutron(200, "GET", "/ports/"+free, e.demo, "")["port"].(map[string]any); p["device_id"] != "" {
		t.Errorf("refused attaches bound the port: %v", p)
	}
}

// TestInterfaceAttachDriverFailure checks that an attach whose NIC the
// hypervisor cannot plug leaves nothing behind: 500, no NIC, the port the
// attach made deleted, the user's port unbound.
func TestInterfaceAttachDriverFailure(t *testing.T) {
	e := newIfEnv(t, "")
	net := e.network(e.demo, "private")
	own := e.port(net)
	before := e.nics(e.server)
	var ports0 int
	countPorts := func() int {
		return len(e.neutron(200, "GET", "/ports?network_id="+net, e.demo, "")["ports"].([]any))
	}
	ports0 = countPorts()
	for _, body := range []string{`{"interfaceAttachment":{"net_id":"` + net + `"}}`, `{"interfaceAttachment":{"port_id":"` + own + `"}}`} {
		for range 3 { // compute retries a driver call three times
			e.c.Fake.FailNext(fake.OpAttach, errors.New("no free PCIe slot"))
		}
		resp, raw := testenv.Do(t, e.client, "POST", e.c.ComputeURL+"/servers/"+e.server+"/os-interface", e.demo, body,
			"OpenStack-API-Version", "compute 2.96")
		if resp.StatusCode != 500 || !strings.Contains(raw, "Failed to attach network adapter device to "+e.server) {
			t.Errorf("%s: %d %s", body, resp.StatusCode, raw)
		}
		if got := e.nics(e.server); !slices.Equal(got, before) {
			t.Errorf("%s: NICs %v, want %v", body, got, before)
		}
		if got := e.attachments(e.server); !slices.Equal(got, before) {
			t.Errorf("%s: attachments %v", body, got)
		}
	}
	if n := countPorts(); n != ports0 {
		t.Errorf("%d ports on the network after failed attaches, want %d", n, ports0)
	}
	if p := e.neutron(200, "GET", "/ports/"+own, e.demo, "")["port"].(map[string]any); p["device_id"] != "" {
		t.Errorf("the user's port stayed bound: %v", p)
	}
	// The next attach works.
	e.must(200, "POST", "/servers/"+e.server+"/os-interface", e.demo, "2.96", `{"interfaceAttachment":{"port_id":"`+own+`"}}`)
	if got := e.nics(e.server); !slices.Contains(got, own) {
		t.Errorf("NICs %v after a good attach", got)
	}
}

// TestInterfaceGophercloud drives os-interface with gophercloud's
// attachinterfaces, as Terraform's OpenStack provider does.
func TestInterfaceGophercloud(t *testing.T) {
	e := newIfEnv(t, "")
	ctx := context.Background()
	net := e.network(e.demo, "private")
	sc := testenv.Compute(t, testenv.Provider(t, e.c, cloud.DemoUser), "2.96")
	a, err := attachinterfaces.Create(ctx, sc, e.server, attachinterfaces.CreateOpts{NetworkID: net,
		FixedIPs: []attachinterfaces.FixedIP{{IPAddress: "10.0.0.77"}}}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	if a.NetID != net || a.PortState != "ACTIVE" || len(a.FixedIPs) != 1 || a.FixedIPs[0].IPAddress != "10.0.0.77" || a.MACAddr == "" {
		t.Errorf("created %+v", a)
	}
	pages, err := attachinterfaces.List(sc, e.server).AllPages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	all, err := attachinterfaces.ExtractInterfaces(pages)
	if err != nil || len(all) != 2 || all[1].PortID != a.PortID {
		t.Fatalf("list %+v %v", all, err)
	}
	got, err := attachinterfaces.Get(ctx, sc, e.server, a.PortID).Extract()
	if err != nil || got.PortID != a.PortID || got.NetID != net {
		t.Fatalf("get %+v %v", got, err)
	}
	if err := attachinterfaces.Delete(ctx, sc, e.server, a.PortID).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	if got := e.nics(e.server); slices.Contains(got, a.PortID) {
		t.Errorf("NICs %v after delete", got)
	}
}
