package network

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"nimbus/internal/netstate"
	"nimbus/internal/store"
	"nimbus/internal/store/storetest"
)

// dpFixture is a small cloud's network state on two compute hosts and a
// gateway host: projects A and B each with their "private" 10.0.0.0/24,
// servers a1 (h1) and a2 (h2) of A, b1 (h1) of B, A's router with a
// floating IP for a1, and group "web" of A whose rule names group
// "dbs" as remote, with a member on no host.
type dpFixture struct {
	s                  *Service
	db                 *store.DB
	hosts              []HostInfo
	netA, netB, subA   string
	a1, a2, b1, dbPort *Port
	sgA, sgB, web, dbs string
	router             string
}

func newDPFixture(t *testing.T, dbURL string) *dpFixture {
	t.Helper()
	ctx := context.Background()
	db, err := store.Open(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	f := &dpFixture{s: New(db), db: db, hosts: []HostInfo{
		{Name: "h1", VTEP: "192.0.2.1", Up: true},
		{Name: "h2", VTEP: "192.0.2.2", Up: true},
		{Name: "gw", VTEP: "192.0.2.3", Gateway: true, Up: true},
	}}
	if err := f.s.Bootstrap(ctx); err != nil {
		t.Fatal(err)
	}
	f.tx(t, func(tx *store.Tx) (err error) {
		if f.netA, err = ensureDefaults(ctx, tx, "proj-a"); err != nil {
			return err
		}
		f.netB, err = ensureDefaults(ctx, tx, "proj-b")
		return err
	})
	f.sgA, f.sgB = f.groupID(t, "proj-a", "default"), f.groupID(t, "proj-b", "default")
	f.web, f.dbs = f.group(t, "proj-a", "web"), f.group(t, "proj-a", "dbs")
	f.rule(t, f.web, "ingress", "tcp", 22, f.dbs)
	f.a1 = f.serverPort(t, "proj-a", f.netA, "h1", "default", "web")
	f.a2 = f.serverPort(t, "proj-a", f.netA, "h2", "default")
	f.b1 = f.serverPort(t, "proj-b", f.netB, "h1", "default")
	f.dbPort = f.serverPort(t, "proj-a", f.netA, "", "dbs") // a server with no host
	if err := db.QueryRow(ctx, "SELECT id FROM subnets WHERE network_id = ?", f.netA).Scan(&f.subA); err != nil {
		t.Fatal(err)
	}
	f.router = f.makeRouter(t, "proj-a", f.subA, f.a1)
	return f
}

func (f *dpFixture) tx(t *testing.T, fn func(tx *store.Tx) error) {
	t.Helper()
	if err := f.db.Tx(context.Background(), fn); err != nil {
		t.Fatal(err)
	}
}

func (f *dpFixture) groupID(t *testing.T, project, name string) string {
	var id string
	if err := f.db.QueryRow(context.Background(), "SELECT id FROM security_groups WHERE project_id = ? AND name = ?",
		project, name).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return id
}

func (f *dpFixture) group(t *testing.T, project, name string) string {
	id := newID()
	if _, err := f.db.Exec(context.Background(), `INSERT INTO security_groups (id, name, project_id, stateful, tags,
		created_at, updated_at) VALUES (?, ?, ?, 1, '[]', ?, ?)`, id, name, project, now(), now()); err != nil {
		t.Fatal(err)
	}
	return id
}

func (f *dpFixture) rule(t *testing.T, sg, dir, proto string, port int, remote string) {
	id := newID()
	if _, err := f.db.Exec(context.Background(), `INSERT INTO security_group_rules (id, security_group_id, direction,
		ethertype, protocol, port_range_min, port_range_max, remote_group_id, fingerprint, created_at, updated_at)
		VALUES (?, ?, ?, 'IPv4', ?, ?, ?, ?, ?, ?, ?)`, id, sg, dir, proto, port, port, remote, id, now(), now()); err != nil {
		t.Fatal(err)
	}
}

// serverPort makes a server of project on host (none: "") and its port.
func (f *dpFixture) serverPort(t *testing.T, project, netID, host string, groups ...string) *Port {
	t.Helper()
	ctx := context.Background()
	id := newID()
	if _, err := f.db.Exec(ctx, `INSERT INTO compute_servers (id, project_id, user_id, name, vm_state, host, flavor_id,
		reservation_id, hostname, created_at, updated_at, doc) VALUES (?, ?, 'u', ?, 'active', ?, '1', 'r', ?, ?, ?, '{}')`,
		id, project, "vm-"+id[:4], host, "vm-"+id[:4], now(), now()); err != nil {
		t.Fatal(err)
	}
	var p *Port
	f.tx(t, func(tx *store.Tx) (err error) {
		p, err = f.s.CreateServerPort(ctx, tx, project, netID, id, "", groups)
		return err
	})
	return p
}

// makeRouter makes a router of project with its gateway on the public
// network and, unless subnet is "", an interface on subnet and a floating
// IP for port fip.
func (f *dpFixture) makeRouter(t *testing.T, project, subnet string, fip *Port) string {
	ctx := context.Background()
	id := newID()
	f.tx(t, func(tx *store.Tx) error {
		pub, err := loadNets(ctx, tx, "builtin = 'public'")
		if err != nil {
			return err
		}
		gw := &portRow{ID: newID(), NetworkID: pub[0].ID, Status: "ACTIVE", DeviceID: id, DeviceOwner: ownerRouterGateway,
			BoundBy: bindRouter, BoundDevice: id, AdminStateUp: true}
		if err := insertPort(ctx, tx, gw, nil, ""); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `INSERT INTO routers (id, name, project_id, gw_network_id, gw_port_id, enable_snat, tags,
			created_at, updated_at) VALUES (?, 'r', ?, ?, ?, 1, '[]', ?, ?)`, id, project, pub[0].ID, gw.ID, now(), now()); err != nil {
			return err
		}
		if subnet == "" {
			return nil
		}
		sub, err := getSubnet(ctx, tx, subnet)
		if err != nil {
			return err
		}
		itf := &portRow{ID: newID(), NetworkID: sub.NetworkID, ProjectID: project, Status: "ACTIVE", DeviceID: id,
			DeviceOwner: ownerRouterInterface, BoundBy: bindRouter, BoundDevice: id, AdminStateUp: true}
		if err := insertPort(ctx, tx, itf, []ipRequest{{SubnetID: subnet, IPAddress: *sub.Gateway}}, ""); err != nil {
			return err
		}
		_, err = f.s.AttachPublicIP(ctx, tx, project, fip.DeviceID, fip.ID)
		return err
	})
	return id
}

func (f *dpFixture) state(t *testing.T, host string) *netstate.Host {
	t.Helper()
	st, err := f.s.HostState(context.Background(), host, f.hosts)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Validate(); err != nil {
		t.Fatalf("%s: %v", host, err)
	}
	return st
}

func netOf(st *netstate.Host, id string) *netstate.Network {
	for i := range st.Networks {
		if st.Networks[i].ID == id {
			return &st.Networks[i]
		}
	}
	return nil
}

func portIDs(st *netstate.Host) []string {
	var out []string
	for _, p := range st.Ports {
		out = append(out, p.ID)
	}
	slices.Sort(out)
	return out
}

func peersOf(n *netstate.Network) map[string][]string {
	out := map[string][]string{}
	for _, p := range n.Peers {
		out[p.Host+"@"+p.VTEP] = p.MACs
	}
	return out
}

func groupOf(st *netstate.Host, id string) *netstate.SecurityGroup {
	for i := range st.SecurityGroups {
		if st.SecurityGroups[i].ID == id {
			return &st.SecurityGroups[i]
		}
	}
	return nil
}

func ipOf(p *Port) string { return p.FixedIPs[0].IPAddress }

func sorted(l ...string) []string { slices.Sort(l); return l }

func TestHostState(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, dbURL string) {
		f := newDPFixture(t, dbURL)
		h1, h2, gw := f.state(t, "h1"), f.state(t, "h2"), f.state(t, "gw")
		routerMAC := func() string {
			var mac string
			if err := f.db.QueryRow(context.Background(), "SELECT mac_address FROM ports WHERE bound_device = ? AND device_owner = ?",
				f.router, ownerRouterInterface).Scan(&mac); err != nil {
				t.Fatal(err)
			}
			return mac
		}()
		cases := []struct {
			name  string
			check func(t *testing.T)
		}{
			{"same CIDR, different VNIs", func(t *testing.T) {
				a, b := netOf(h1, f.netA), netOf(h1, f.netB)
				if a == nil || b == nil {
					t.Fatalf("h1 networks %+v", h1.Networks)
				}
				if a.VNI < firstVNI || b.VNI < firstVNI || a.VNI == b.VNI {
					t.Errorf("VNIs %d and %d", a.VNI, b.VNI)
				}
				if a.Subnets[0].CIDR != "10.0.0.0/24" || b.Subnets[0].CIDR != "10.0.0.0/24" || a.MTU != 1450 {
					t.Errorf("subnets %+v / %+v, MTU %d", a.Subnets, b.Subnets, a.MTU)
				}
			}},
			{"each host its own ports", func(t *testing.T) {
				if got, want := portIDs(h1), sorted(f.a1.ID, f.b1.ID); !slices.Equal(got, want) {
					t.Errorf("h1 ports %v, want %v", got, want)
				}
				if got, want := portIDs(h2), []string{f.a2.ID}; !slices.Equal(got, want) {
					t.Errorf("h2 ports %v, want %v", got, want)
				}
				if len(gw.Ports) != 0 {
					t.Errorf("gw ports %v", portIDs(gw))
				}
			}},
			{"peers and MACs, never the other project's", func(t *testing.T) {
				want := map[string][]string{"h2@192.0.2.2": {f.a2.MACAddress}, "gw@192.0.2.3": {routerMAC}}
				if got := peersOf(netOf(h1, f.netA)); fmt.Sprint(got) != fmt.Sprint(want) {
					t.Errorf("h1 peers on A %v, want %v", got, want)
				}
				want = map[string][]string{"h1@192.0.2.1": {f.a1.MACAddress}, "gw@192.0.2.3": {routerMAC}}
				if got := peersOf(netOf(h2, f.netA)); fmt.Sprint(got) != fmt.Sprint(want) {
					t.Errorf("h2 peers on A %v, want %v", got, want)
				}
				if got := peersOf(netOf(h1, f.netB)); len(got) != 0 {
					t.Errorf("h1 peers on B %v, want none", got)
				}
			}},
			{"a host without the network has none of it", func(t *testing.T) {
				if netOf(h2, f.netB) != nil || netOf(gw, f.netB) != nil {
					t.Error("B's network on a host without its ports")
				}
			}},
			{"DHCP port: one per network, the same everywhere", func(t *testing.T) {
				d1, d2, d3 := netOf(h1, f.netA).DHCP, netOf(h2, f.netA).DHCP, netOf(gw, f.netA).DHCP
				if d1 == nil || d2 == nil || d3 == nil || d1.MAC != d2.MAC || d1.MAC != d3.MAC || len(d1.IPs) != 1 {
					t.Fatalf("DHCP ports %+v %+v %+v", d1, d2, d3)
				}
				if a := netip.MustParseAddr(d1.IPs[0].IP); !netip.MustParsePrefix("10.0.0.0/24").Contains(a) {
					t.Errorf("DHCP address %s", a)
				}
				if b := netOf(h1, f.netB).DHCP; b == nil || b.MAC == d1.MAC {
					t.Errorf("B's DHCP port %+v", b)
				}
			}},
			{"groups, members and remote groups", func(t *testing.T) {
				a, b, web, dbs := groupOf(h1, f.sgA), groupOf(h1, f.sgB), groupOf(h1, f.web), groupOf(h1, f.dbs)
				if a == nil || b == nil || web == nil || dbs == nil {
					t.Fatalf("h1 groups %+v", h1.SecurityGroups)
				}
				if want := sorted(ipOf(f.a1), ipOf(f.a2)); !slices.Equal(a.Members, want) {
					t.Errorf("A default members %v, want %v", a.Members, want)
				}
				if want := []string{ipOf(f.b1)}; !slices.Equal(b.Members, want) {
					t.Errorf("B default members %v, want %v", b.Members, want)
				}
				if want := []string{ipOf(f.dbPort)}; !slices.Equal(dbs.Members, want) {
					t.Errorf("remote group members %v, want %v", dbs.Members, want)
				}
				if len(web.Rules) != 1 || web.Rules[0].RemoteGroupID != f.dbs || *web.Rules[0].PortMin != 22 {
					t.Errorf("web rules %+v", web.Rules)
				}
				if groupOf(h2, f.web) != nil || groupOf(h2, f.sgB) != nil {
					t.Error("h2 has groups of no port of its own")
				}
			}},
			{"router on the gateway host only", func(t *testing.T) {
				if len(h1.Routers)+len(h2.Routers) != 0 || len(gw.Routers) != 1 {
					t.Fatalf("routers h1 %d h2 %d gw %d", len(h1.Routers), len(h2.Routers), len(gw.Routers))
				}
				r := gw.Routers[0]
				if r.Gateway == nil || r.Gateway.CIDR != PublicCIDR || r.Gateway.NextHop != "203.0.113.1" || !r.Gateway.EnableSNAT {
					t.Errorf("gateway %+v", r.Gateway)
				}
				if len(r.Interfaces) != 1 || r.Interfaces[0].IP != "10.0.0.1" || r.Interfaces[0].CIDR != "10.0.0.0/24" {
					t.Errorf("interfaces %+v", r.Interfaces)
				}
				if len(r.FloatingIPs) != 1 || r.FloatingIPs[0].FixedIP != ipOf(f.a1) || r.FloatingIPs[0].PortID != f.a1.ID {
					t.Errorf("floating IPs %+v", r.FloatingIPs)
				}
				n := netOf(gw, f.netA)
				want := map[string][]string{"h1@192.0.2.1": {f.a1.MACAddress}, "h2@192.0.2.2": {f.a2.MACAddress}}
				if n == nil || fmt.Sprint(peersOf(n)) != fmt.Sprint(want) {
					t.Errorf("gw's network A %+v", n)
				}
			}},
		}
		for _, c := range cases {
			t.Run(c.name, c.check)
		}
	})
}

// TestHostStateShelved: a shelved-offloaded server's ports leave its
// host's state (its taps go) and its peers' forwarding entries, and come
// back with the server wherever it is unshelved.
func TestHostStateShelved(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, dbURL string) {
		f := newDPFixture(t, dbURL)
		ctx := context.Background()
		setTask := func(state, task, host string) {
			t.Helper()
			if _, err := f.db.Exec(ctx, "UPDATE compute_servers SET vm_state = ?, task_state = ?, host = ? WHERE id = ?",
				state, task, host, f.a2.DeviceID); err != nil {
				t.Fatal(err)
			}
		}
		set := func(state, host string) { t.Helper(); setTask(state, "", host) }
		has := func(st *netstate.Host) bool { return slices.Contains(portIDs(st), f.a2.ID) }
		peerMAC := func(st *netstate.Host) bool {
			for _, macs := range peersOf(netOf(st, f.netA)) {
				if slices.Contains(macs, f.a2.MACAddress) {
					return true
				}
			}
			return false
		}
		if !has(f.state(t, "h2")) || !peerMAC(f.state(t, "h1")) {
			t.Fatal("the server's port is not wired on h2 before shelving")
		}
		// Shelved but still on its host (not offloaded): wired as before.
		set("shelved", "h2")
		if !has(f.state(t, "h2")) {
			t.Error("a shelved server still on h2 lost its port")
		}
		set("shelved_offloaded", "h2")
		if h2, h1 := f.state(t, "h2"), f.state(t, "h1"); has(h2) || peerMAC(h1) {
			t.Errorf("offloaded: port on h2 %v, h1 still forwards to its MAC %v", has(h2), peerMAC(h1))
		}
		// Unshelving: placed on h1 and being spawned there, still
		// offloaded until its VM runs, which waits for the port's wiring.
		setTask("shelved_offloaded", "spawning", "h1")
		if h1, h2 := f.state(t, "h1"), f.state(t, "h2"); !has(h1) || has(h2) {
			t.Errorf("being unshelved on h1: port on h1 %v, on h2 %v", has(h1), has(h2))
		}
		set("active", "h1")
		if h1, h2 := f.state(t, "h1"), f.state(t, "h2"); !has(h1) || has(h2) {
			t.Errorf("unshelved on h1: port on h1 %v, on h2 %v", has(h1), has(h2))
		}
	})
}

// TestHostStateDHCPOnce builds many hosts' states at once on a network
// that has no DHCP port yet: exactly one is made.
func TestHostStateDHCPOnce(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, dbURL string) {
		f := newDPFixture(t, dbURL)
		var netC string
		f.tx(t, func(tx *store.Tx) (err error) {
			netC, err = ensureDefaults(context.Background(), tx, "proj-c")
			return err
		})
		var hosts []HostInfo
		for i := range 8 {
			h := fmt.Sprintf("c%d", i)
			hosts = append(hosts, HostInfo{Name: h, VTEP: fmt.Sprintf("192.0.2.%d", 10+i), Up: true})
			f.serverPort(t, "proj-c", netC, h)
		}
		// Many builds at once, released together, then one per host.
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range 32 {
			wg.Go(func() {
				<-start
				if err := f.s.ensureDHCP(context.Background(), []string{netC}); err != nil {
					t.Error(err)
				}
			})
		}
		close(start)
		wg.Wait()
		macs := make([]string, len(hosts))
		for i, h := range hosts {
			wg.Go(func() {
				st, err := f.s.HostState(context.Background(), h.Name, hosts)
				if err != nil {
					t.Error(err)
					return
				}
				if n := netOf(st, netC); n != nil && n.DHCP != nil {
					macs[i] = n.DHCP.MAC
				}
			})
		}
		wg.Wait()
		var k int
		if err := f.db.QueryRow(context.Background(), "SELECT COUNT(*) FROM ports WHERE network_id = ? AND bound_by = ?",
			netC, bindDHCP).Scan(&k); err != nil {
			t.Fatal(err)
		}
		if k != 1 || slices.Contains(macs, "") || len(slices.Compact(slices.Sorted(slices.Values(macs)))) != 1 {
			t.Errorf("%d DHCP ports, MACs seen %v", k, macs)
		}
	})
}

// TestRouterPlacement: routers go to live gateway hosts, the least
// loaded first, and move off a gateway host that went down.
func TestRouterPlacement(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, dbURL string) {
		f := newDPFixture(t, dbURL)
		ctx := context.Background()
		f.hosts = append(f.hosts, HostInfo{Name: "gw2", VTEP: "192.0.2.4", Gateway: true, Up: true})
		second := f.makeRouter(t, "proj-a", "", nil)
		hostOf := func(id string) string {
			var h string
			if err := f.db.QueryRow(ctx, "SELECT host FROM routers WHERE id = ?", id).Scan(&h); err != nil {
				t.Fatal(err)
			}
			return h
		}
		before := f.s.Revision()
		f.state(t, "h1")
		if a, b := hostOf(f.router), hostOf(second); a == b || a == "" || b == "" || a == "h1" || b == "h1" {
			t.Fatalf("routers on %q and %q", a, b)
		}
		if f.s.Revision() <= before {
			t.Error("placing routers did not raise the revision")
		}
		f.hosts[2].Up = false // gw
		f.state(t, "h1")
		if a, b := hostOf(f.router), hostOf(second); a != "gw2" || b != "gw2" {
			t.Errorf("after gw went down: routers on %q and %q", a, b)
		}
		if _, err := f.db.Exec(ctx, `UPDATE routers SET routes = '[{"destination":"192.168.0.0/24","nexthop":"10.0.0.9"}]'
			WHERE id = ?`, f.router); err != nil {
			t.Fatal(err)
		}
		for _, r := range f.state(t, "gw2").Routers {
			if r.ID == f.router && (len(r.Routes) != 1 || r.Routes[0].NextHop != "10.0.0.9") {
				t.Errorf("extra routes %+v", r.Routes)
			}
		}
	})
}

// TestSegmentAllocation: VNIs from 1000 up, never reused by the counter,
// an admin's choice skipped, the public network flat.
func TestSegmentAllocation(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, dbURL string) {
		f := newDPFixture(t, dbURL)
		ctx := context.Background()
		pub, err := loadNets(ctx, f.db, "builtin = 'public'")
		if err != nil || pub[0].SegmentationID != nil {
			t.Fatalf("public network segment %v (%v)", pub[0].SegmentationID, err)
		}
		var next int64
		if err := f.db.QueryRow(ctx, "SELECT next_vni FROM network_vni_counter").Scan(&next); err != nil {
			t.Fatal(err)
		}
		taken := next
		f.tx(t, func(tx *store.Tx) error {
			_, err := insertNet(ctx, tx, &netRow{ID: newID(), Name: "picked", SegmentationID: &taken, MTU: 1450}, "")
			return err
		})
		var got *int64
		f.tx(t, func(tx *store.Tx) error {
			n := &netRow{ID: newID(), Name: "next", MTU: 1450}
			_, err := insertNet(ctx, tx, n, "")
			got = n.SegmentationID
			return err
		})
		if got == nil || *got != taken+1 {
			t.Errorf("next VNI %v, want %d (skipping the admin's %d)", got, taken+1, taken)
		}
	})
}

// TestChangeFeed: the revision starts from the wall clock (a restarted
// controller never goes back), and a change wakes a waiter at once.
func TestChangeFeed(t *testing.T) {
	s := New(nil)
	start := time.Now().UnixNano()
	rev := s.Revision()
	if rev < start {
		t.Fatalf("revision %d below the clock %d", rev, start)
	}
	woke := make(chan int64, 1)
	go func() { woke <- s.WaitChange(context.Background(), rev) }()
	time.Sleep(50 * time.Millisecond)
	changed := time.Now()
	s.NetworkChanged()
	select {
	case got := <-woke:
		if got <= rev || time.Since(changed) > 100*time.Millisecond {
			t.Errorf("woke with %d (was %d) after %v", got, rev, time.Since(changed))
		}
	case <-time.After(time.Second):
		t.Fatal("a change did not wake the waiter")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if got := s.WaitChange(ctx, s.Revision()); got != s.Revision() {
		t.Errorf("an ended wait answered %d", got)
	}
}
