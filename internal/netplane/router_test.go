package netplane

import (
	"bufio"
	"context"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"nimbus/internal/netstate"
)

// The router test's world: a host namespace with two tenant bridges and a
// provider bridge; an "internet" namespace on the provider bridge
// (203.0.113.1, the provider's gateway, with a route to 10.0.0.0/8 through
// the router so that only the router's NAT and filter keep fixed IPs
// private); guests g1 and g2 on network A (10.0.1.0/24) and g3 on network
// B (10.0.2.0/24, also holding 198.51.100.1 for the extra route). Each
// namespace runs a TCP server that answers "<name> <source IP>", so a
// probe tells who answered and from which address they saw it come.
const (
	rtNetA, rtNetB   = "a0000000-0000-4000-8000-00000000000a", "b0000000-0000-4000-8000-00000000000b"
	rtPortA, rtPortB = "a1111111-0000-4000-8000-00000000000a", "b1111111-0000-4000-8000-00000000000b"
	rtRouter         = "c2222222-0000-4000-8000-00000000000c"
	rtGwMAC          = "fa:16:3e:00:00:0c"
	rtProvider       = "nprov0"
	rtProbePort      = "7000"
)

type rtWorld struct {
	host, inet, g1, g2, g3 string
	cfg                    Config
	r                      part
}

func rtState(fixed string, snat, withB bool) *netstate.Host {
	rt := netstate.Router{
		ID: rtRouter,
		Gateway: &netstate.Gateway{MAC: rtGwMAC, IP: "203.0.113.10", CIDR: "203.0.113.0/24",
			NextHop: "203.0.113.1", EnableSNAT: snat},
		Interfaces: []netstate.RouterInterface{{PortID: rtPortA, NetworkID: rtNetA, SubnetID: "sa",
			MAC: "fa:16:3e:00:00:0a", IP: "10.0.1.1", CIDR: "10.0.1.0/24"}},
		FloatingIPs: []netstate.FloatingIP{{ID: "f", Address: "203.0.113.50", FixedIP: fixed}},
	}
	if withB {
		rt.Interfaces = append(rt.Interfaces, netstate.RouterInterface{PortID: rtPortB, NetworkID: rtNetB,
			SubnetID: "sb", MAC: "fa:16:3e:00:00:0b", IP: "10.0.2.1", CIDR: "10.0.2.0/24"})
		rt.Routes = []netstate.Route{{Destination: "198.51.100.0/24", NextHop: "10.0.2.13"}}
	}
	return &netstate.Host{
		Networks: []netstate.Network{{ID: rtNetA, VNI: 10, MTU: 1450}, {ID: rtNetB, VNI: 11, MTU: 1450}},
		Routers:  []netstate.Router{rt},
	}
}

func newRTWorld(t *testing.T) *rtWorld {
	t.Helper()
	w := &rtWorld{host: testNS(t)}
	w.cfg = Config{NetNS: w.host, Prefix: testName(t, "-"), ProviderBridge: rtProvider}
	t.Cleanup(func() {
		names, _ := namedNS(w.cfg.Prefix)
		for _, n := range names {
			_ = removeRouterNS(n)
		}
	})
	h := rtHandle(t, w.host)
	for _, br := range []string{netstate.BridgeName(rtNetA), netstate.BridgeName(rtNetB), rtProvider} {
		if err := h.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: br}}); err != nil {
			t.Fatal(err)
		}
		rtUp(t, h, br)
	}
	w.inet = rtGuest(t, w, "inet", rtProvider, "203.0.113.1/24", "10.0.0.0/8", "203.0.113.10")
	if err := inNS(w.inet, func() error {
		// Learn addresses from gratuitous ARP, to see the router's.
		return os.WriteFile("/proc/sys/net/ipv4/conf/all/arp_accept", []byte("1"), 0o644)
	}); err != nil {
		t.Fatal(err)
	}
	w.g1 = rtGuest(t, w, "g1", netstate.BridgeName(rtNetA), "10.0.1.11/24", "0.0.0.0/0", "10.0.1.1")
	w.g2 = rtGuest(t, w, "g2", netstate.BridgeName(rtNetA), "10.0.1.12/24", "0.0.0.0/0", "10.0.1.1")
	w.g3 = rtGuest(t, w, "g3", netstate.BridgeName(rtNetB), "10.0.2.13/24", "0.0.0.0/0", "10.0.2.1")
	g3 := rtHandle(t, w.g3)
	if err := g3.AddrAdd(rtLink(t, g3, "lo"), &netlink.Addr{IPNet: prefixNet(rtPrefix("198.51.100.1/32"))}); err != nil {
		t.Fatal(err)
	}
	r, err := newRouters(w.cfg)
	if err != nil {
		t.Fatal(err)
	}
	w.r = r
	return w
}

// rtGuest makes a namespace named for label on bridge br with address
// addr and a route to dst via gw, and starts its probe server.
func rtGuest(t *testing.T, w *rtWorld, label, br, addr, dst, gw string) string {
	t.Helper()
	ns := testNS(t)
	h, g := rtHandle(t, w.host), rtHandle(t, ns)
	fd, err := netns.GetFromPath(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer fd.Close()
	bl, err := h.LinkByName(br)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.LinkAdd(&netlink.Veth{
		LinkAttrs: netlink.LinkAttrs{Name: "v" + label, MTU: 1450, MasterIndex: bl.Attrs().Index},
		PeerName:  "eth0", PeerMTU: 1450, PeerNamespace: netlink.NsFd(fd),
	}); err != nil {
		t.Fatal(err)
	}
	rtUp(t, h, "v"+label)
	rtUp(t, g, "eth0")
	if err := g.AddrAdd(rtLink(t, g, "eth0"), &netlink.Addr{IPNet: prefixNet(rtPrefix(addr))}); err != nil {
		t.Fatal(err)
	}
	if err := g.RouteAdd(&netlink.Route{Dst: prefixNet(rtPrefix(dst)), Gw: net.ParseIP(gw)}); err != nil {
		t.Fatal(err)
	}
	var ln net.Listener
	if err := inNS(ns, func() (err error) { ln, err = net.Listen("tcp4", ":"+rtProbePort); return err }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			host, _, _ := net.SplitHostPort(c.RemoteAddr().String())
			_, _ = c.Write([]byte(label + " " + host + "\n"))
			c.Close()
		}
	}()
	return ns
}

// rtProbe connects from namespace from to addr and returns the answer
// ("<who> <source it saw>"), or "" when nothing answers.
func rtProbe(from, addr string) string {
	var line string
	_ = inNS(from, func() error {
		c, err := net.DialTimeout("tcp4", net.JoinHostPort(addr, rtProbePort), time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		line, err = bufio.NewReader(c).ReadString('\n')
		return err
	})
	return strings.TrimSpace(line)
}

type rtProbeCase struct{ from, to, want string }

func TestRouter(t *testing.T) {
	w := newRTWorld(t)
	ctx := context.Background()
	rns := w.routerNS()
	steps := []struct {
		name   string
		st     *netstate.Host
		before func(t *testing.T)
		quiet  bool // the apply must change nothing in the router
		fresh  bool // a new part, as after an agent restart: it may rewrite the NAT table, nothing else
		checks []func(t *testing.T)
		probes []rtProbeCase
	}{{
		name:   "first apply",
		st:     rtState("10.0.1.11", true, true),
		checks: []func(*testing.T){w.checkGARP, w.checkForwarding, w.checkExtraRoute},
		probes: []rtProbeCase{
			{"g2", "203.0.113.1", "inet 203.0.113.10"}, // SNAT to the gateway IP
			{"inet", "10.0.1.12", ""},                  // fixed IPs stay private
			{"inet", "203.0.113.50", "g1 203.0.113.1"}, // DNAT to the floating IP's server
			{"g1", "203.0.113.1", "inet 203.0.113.50"}, // which leaves from its floating IP
			{"g1", "10.0.2.13", "g3 10.0.1.11"},        // subnets routed, not NATed
			{"g3", "10.0.1.12", "g2 10.0.2.13"},
			{"g1", "198.51.100.1", "g3 10.0.1.11"},    // the extra route
			{"g2", "203.0.113.50", "g1 203.0.113.10"}, // hairpin to a neighbour's floating IP
		},
	}, {
		name:   "same state again",
		st:     rtState("10.0.1.11", true, true),
		quiet:  true,
		checks: []func(*testing.T){w.checkARP},
		probes: []rtProbeCase{{"inet", "203.0.113.50", "g1 203.0.113.1"}},
	}, {
		name:  "agent restarted",
		st:    rtState("10.0.1.11", true, true),
		fresh: true,
		quiet: true,
		probes: []rtProbeCase{
			{"inet", "203.0.113.50", "g1 203.0.113.1"},
			{"g2", "203.0.113.1", "inet 203.0.113.10"},
		},
	}, {
		name:   "host rebooted (router namespace lost)",
		st:     rtState("10.0.1.11", true, true),
		before: func(t *testing.T) { rtLoseRouter(t, w) },
		checks: []func(*testing.T){w.checkForwarding, w.checkExtraRoute},
		probes: []rtProbeCase{
			{"inet", "203.0.113.50", "g1 203.0.113.1"},
			{"g2", "203.0.113.1", "inet 203.0.113.10"},
			{"inet", "10.0.1.12", ""},
			{"g1", "10.0.2.13", "g3 10.0.1.11"},
		},
	}, {
		name:   "floating IP moved to g2",
		st:     rtState("10.0.1.12", true, true),
		checks: []func(*testing.T){func(t *testing.T) { w.checkNoFlows(t, rns, "10.0.1.11") }},
		probes: []rtProbeCase{
			{"inet", "203.0.113.50", "g2 203.0.113.1"},
			{"g2", "203.0.113.1", "inet 203.0.113.50"},
			{"g1", "203.0.113.1", "inet 203.0.113.10"},
		},
	}, {
		name: "SNAT off",
		st:   rtState("10.0.1.12", false, true),
		probes: []rtProbeCase{
			{"g1", "203.0.113.1", "inet 10.0.1.11"}, // no masquerade
			{"inet", "10.0.1.11", "g1 203.0.113.1"}, // routed as Neutron's router does
			{"g2", "203.0.113.1", "inet 203.0.113.50"},
		},
	}, {
		name:   "floating IP released",
		st:     rtRelease(rtState("10.0.1.12", true, true)),
		checks: []func(*testing.T){w.checkGatewayAddrs("203.0.113.10/24")},
		probes: []rtProbeCase{
			{"inet", "203.0.113.50", ""},
			{"g2", "203.0.113.1", "inet 203.0.113.10"},
		},
	}, {
		name:   "interface on B removed, orphans swept",
		st:     rtState("10.0.1.12", true, false),
		before: w.plantOrphans,
		checks: []func(*testing.T){w.checkOrphansGone, w.checkUnplugged},
		probes: []rtProbeCase{
			{"g1", "10.0.2.13", ""},
			{"g2", "203.0.113.1", "inet 203.0.113.50"},
		},
	}, {
		name:   "router removed",
		st:     &netstate.Host{},
		checks: []func(*testing.T){w.checkRouterGone},
		probes: []rtProbeCase{{"inet", "203.0.113.50", ""}},
	}}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			if s.before != nil {
				s.before(t)
			}
			if s.fresh {
				r, err := newRouters(w.cfg)
				if err != nil {
					t.Fatal(err)
				}
				w.r = r
			}
			var stop func() []string
			if s.quiet {
				stop = rtWatch(t, rns, !s.fresh)
			}
			start := time.Now()
			if err := w.r.apply(ctx, s.st); err != nil {
				t.Fatalf("apply: %v", err)
			}
			t.Logf("applied in %v", time.Since(start))
			if stop != nil {
				if changes := stop(); len(changes) > 0 {
					t.Errorf("applying the same state changed the router: %v", changes)
				}
			}
			for _, c := range s.checks {
				c(t)
			}
			for _, p := range s.probes {
				if got := rtProbe(w.ns(p.from), p.to); got != p.want {
					t.Errorf("%s → %s: answered %q, want %q", p.from, p.to, got, p.want)
				}
			}
		})
	}
}

func (w *rtWorld) ns(label string) string {
	return map[string]string{"inet": w.inet, "g1": w.g1, "g2": w.g2, "g3": w.g3}[label]
}

func (w *rtWorld) routerNS() string {
	return namedNSDir + "/" + w.cfg.Prefix + "router-" + rtRouter[:11]
}

// checkGARP: the router's announcements taught the internet where its
// gateway IP and floating IP live, before any traffic.
func (w *rtWorld) checkGARP(t *testing.T) {
	for _, ip := range []string{"203.0.113.10", "203.0.113.50"} {
		if mac := rtNeigh(t, w.inet, ip, time.Second); mac != rtGwMAC {
			t.Errorf("internet learnt %s at %q from gratuitous ARP, want %s", ip, mac, rtGwMAC)
		}
	}
}

// checkARP: the internet resolves the floating IP to the gateway's MAC.
func (w *rtWorld) checkARP(t *testing.T) {
	h := rtHandle(t, w.inet)
	_ = h.NeighDel(&netlink.Neigh{LinkIndex: rtLink(t, h, "eth0").Attrs().Index, IP: net.ParseIP("203.0.113.50")})
	if mac := rtNeigh(t, w.inet, "203.0.113.50", 0); mac != "" {
		t.Fatalf("neighbour entry survived its deletion: %s", mac)
	}
	_ = rtProbe(w.inet, "203.0.113.50")
	if mac := rtNeigh(t, w.inet, "203.0.113.50", time.Second); mac != rtGwMAC {
		t.Errorf("internet resolved the floating IP to %q, want %s", mac, rtGwMAC)
	}
}

func (w *rtWorld) checkForwarding(t *testing.T) {
	var b []byte
	if err := inNS(w.routerNS(), func() (err error) {
		b, err = os.ReadFile("/proc/sys/net/ipv4/ip_forward")
		return err
	}); err != nil || strings.TrimSpace(string(b)) != "1" {
		t.Errorf("router forwarding = %q, %v; want 1", b, err)
	}
}

func (w *rtWorld) checkExtraRoute(t *testing.T) {
	rs, err := rtHandle(t, w.routerNS()).RouteGet(net.ParseIP("198.51.100.7"))
	if err != nil || len(rs) != 1 || !rs[0].Gw.Equal(net.ParseIP("10.0.2.13")) {
		t.Errorf("route to 198.51.100.7 in the router: %v, %v; want via 10.0.2.13", rs, err)
	}
}

// checkNoFlows: no tracked connection through the floating IP still
// reaches its old server.
func (w *rtWorld) checkNoFlows(t *testing.T, ns, old string) {
	flows, err := rtHandle(t, ns).ConntrackTableList(netlink.ConntrackTable, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range flows {
		if f.Forward.DstIP.String() == "203.0.113.50" && f.Reverse.SrcIP.String() == old {
			t.Errorf("connection to the floating IP still tracked to its old server: %s", f)
		}
	}
}

// plantOrphans leaves what a crashed agent might: a router namespace no
// router explains and a router veth whose router is gone, beside a
// device that only looks like ours.
func (w *rtWorld) plantOrphans(t *testing.T) {
	if _, err := ensureNamedNS(w.cfg.Prefix + "router-dead0000-00"); err != nil {
		t.Fatal(err)
	}
	h := rtHandle(t, w.host)
	for _, n := range []string{"nrtdead0000-00", "ngwdead0000-00", "nrtmine"} {
		if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: n}, PeerName: n + "p"}); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { _ = h.LinkDel(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "nrtmine"}}) })
}

func (w *rtWorld) checkOrphansGone(t *testing.T) {
	if names, _ := namedNS(w.cfg.Prefix + "router-dead"); len(names) != 0 {
		t.Errorf("orphan router namespaces left: %v", names)
	}
	h := rtHandle(t, w.host)
	for n, want := range map[string]bool{"nrtdead0000-00": false, "ngwdead0000-00": false, "nrtmine": true} {
		if _, err := h.LinkByName(n); (err == nil) != want {
			t.Errorf("%s present = %v, want %v", n, err == nil, want)
		}
	}
}

func (w *rtWorld) checkUnplugged(t *testing.T) {
	if _, err := rtHandle(t, w.host).LinkByName(netstate.RouterPrefix + rtPortB[:11]); err == nil {
		t.Error("host end of the removed interface left")
	}
	if _, err := rtHandle(t, w.routerNS()).LinkByName("qr-" + rtPortB[:11]); err == nil {
		t.Error("removed interface left in the router")
	}
}

// rtLoseRouter drops the router's namespace as a reboot would, with its
// veths (whose host ends go with them).
func rtLoseRouter(t *testing.T, w *rtWorld) {
	if err := deleteNamedNS(w.cfg.Prefix + "router-" + rtRouter[:11]); err != nil {
		t.Fatal(err)
	}
}

func rtRelease(st *netstate.Host) *netstate.Host {
	st.Routers[0].FloatingIPs = nil
	return st
}

// checkGatewayAddrs: the gateway has exactly the IPv4 addresses want.
func (w *rtWorld) checkGatewayAddrs(want ...string) func(*testing.T) {
	return func(t *testing.T) {
		h := rtHandle(t, w.routerNS())
		as, err := h.AddrList(rtLink(t, h, "qg-"+rtRouter[:11]), netlink.FAMILY_V4)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, a := range as {
			got = append(got, a.IPNet.String())
		}
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("gateway addresses %v, want %v", got, want)
		}
	}
}

func (w *rtWorld) checkRouterGone(t *testing.T) {
	if names, _ := namedNS(w.cfg.Prefix); len(names) != 0 {
		t.Errorf("router namespaces left: %v", names)
	}
	links, err := rtHandle(t, w.host).LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		if isRouterHostEnd(l.Attrs().Name) {
			t.Errorf("router veth left: %s", l.Attrs().Name)
		}
	}
}

// rtNeigh is the MAC namespace ns has for ip, waiting up to wait for it.
func rtNeigh(t *testing.T, ns, ip string, wait time.Duration) string {
	h := rtHandle(t, ns)
	for end := time.Now().Add(wait); ; time.Sleep(20 * time.Millisecond) {
		ns, err := h.NeighList(0, netlink.FAMILY_V4)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range ns {
			if n.IP.String() == ip && n.HardwareAddr != nil && n.State&netlink.NUD_FAILED == 0 {
				return n.HardwareAddr.String()
			}
		}
		if time.Now().After(end) {
			return ""
		}
	}
}

// rtWatch records every address, route and link change in namespace ns
// and its NAT table's rules (with their handles, which a rewrite
// changes) until the returned function is called.
func rtWatch(t *testing.T, ns string, nat bool) func() []string {
	fd, err := netns.GetFromPath(ns)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	addrs, routes, links := make(chan netlink.AddrUpdate, 64), make(chan netlink.RouteUpdate, 64), make(chan netlink.LinkUpdate, 64)
	err1 := netlink.AddrSubscribeWithOptions(addrs, done, netlink.AddrSubscribeOptions{Namespace: &fd})
	err2 := netlink.RouteSubscribeWithOptions(routes, done, netlink.RouteSubscribeOptions{Namespace: &fd})
	err3 := netlink.LinkSubscribeWithOptions(links, done, netlink.LinkSubscribeOptions{Namespace: &fd})
	if err1 != nil || err2 != nil || err3 != nil {
		t.Fatal(err1, err2, err3)
	}
	rules := rtRules(t, ns)
	return func() []string {
		time.Sleep(200 * time.Millisecond)
		// Drained before done is closed: the subscriptions close their
		// channels then.
		defer fd.Close()
		defer close(done)
		var out []string
		for drained := false; !drained; {
			select {
			default:
				drained = true
			case u := <-addrs:
				if !rtKernelOwn(u.LinkAddress.IP) {
					out = append(out, "address "+u.LinkAddress.String())
				}
			case u := <-routes:
				if u.Dst == nil || !rtKernelOwn(u.Dst.IP) {
					out = append(out, "route "+u.Route.String())
				}
			case u := <-links:
				out = append(out, "link "+u.Attrs().Name)
			}
		}
		if now := rtRules(t, ns); nat && now != rules {
			out = append(out, "NAT table rewritten")
		}
		return out
	}
}

// rtKernelOwn: IPv6 link-local and multicast addresses and routes come
// and go with the kernel's own address configuration, not the plane's.
func rtKernelOwn(ip net.IP) bool {
	return ip.To4() == nil && (ip.IsLinkLocalUnicast() || ip.IsMulticast())
}

// rtRules is the NAT table as nft lists it with handles: a rewrite of
// the table changes the table's handle. (The library does not read it.)
func rtRules(t *testing.T, ns string) string {
	out, err := exec.Command("ip", "netns", "exec", ns[len(namedNSDir)+1:], "nft", "-a", "list", "table", "ip", natTable).CombinedOutput()
	if err != nil {
		t.Fatalf("nft list: %v: %s", err, out)
	}
	return string(out)
}

func rtHandle(t *testing.T, ns string) *netlink.Handle {
	t.Helper()
	h, err := nsHandle(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

func rtUp(t *testing.T, h *netlink.Handle, name string) {
	t.Helper()
	if err := h.LinkSetUp(rtLink(t, h, name)); err != nil {
		t.Fatal(err)
	}
}

func rtLink(t *testing.T, h *netlink.Handle, name string) netlink.Link {
	t.Helper()
	l, err := h.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func rtPrefix(s string) netip.Prefix { return netip.MustParsePrefix(s) }

// A router the state describes badly is refused with its name, before
// anything of it is made.
func TestRouterBadState(t *testing.T) {
	host := testNS(t)
	prefix := testName(t, "-")
	t.Cleanup(func() {
		names, _ := namedNS(prefix)
		for _, n := range names {
			_ = removeRouterNS(n)
		}
	})
	for _, tc := range []struct {
		name, provider, want string
		edit                 func(*netstate.Router)
	}{
		{"gateway without a provider bridge", "", "no provider bridge", func(*netstate.Router) {}},
		{"provider bridge missing", "nprov9", "bridge nprov9", func(r *netstate.Router) { r.Interfaces = nil }},
		{"gateway bad MAC", rtProvider, "bad MAC", func(r *netstate.Router) { r.Gateway.MAC = "fa:16" }},
		{"gateway outside its CIDR", rtProvider, "not an IPv4 address in its CIDR", func(r *netstate.Router) { r.Gateway.IP = "198.18.0.1" }},
		{"floating IP not IPv4", rtProvider, "not a pair of IPv4", func(r *netstate.Router) { r.FloatingIPs[0].FixedIP = "fd00::1" }},
		{"interface on an unknown network", rtProvider, "not in the state", func(r *netstate.Router) { r.Interfaces[0].NetworkID = "x" }},
		{"extra route unparsable", rtProvider, "route", func(r *netstate.Router) { r.Routes = []netstate.Route{{Destination: "10.9/8", NextHop: "10.0.1.5"}} }},
		{"no id", rtProvider, "no id", func(r *netstate.Router) { r.ID = "" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := rtState("10.0.1.11", true, false)
			tc.edit(&st.Routers[0])
			r, err := newRouters(Config{NetNS: host, Prefix: prefix, ProviderBridge: tc.provider})
			if err != nil {
				t.Fatal(err)
			}
			err = r.apply(context.Background(), st)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "router "+st.Routers[0].ID) {
				t.Fatalf("apply: %v; want an error naming the router and %q", err, tc.want)
			}
			if names, _ := namedNS(prefix); len(names) != 0 {
				t.Errorf("a refused router made namespaces: %v", names)
			}
		})
	}
}
