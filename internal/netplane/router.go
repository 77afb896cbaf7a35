package netplane

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"nimbus/internal/netstate"
)

// Names of a router's devices. The host ends are RouterPrefix+port and
// gatewayPrefix+router; the namespace ends follow Neutron's qr-/qg-.
const (
	gatewayPrefix = "ngw" // host end of a router's gateway veth
	qrPrefix      = "qr-" // namespace end of a router interface
	qgPrefix      = "qg-" // namespace end of a router's gateway
	routerNSPart  = "router-"
	// routeProto marks the routes the plane puts in a router namespace,
	// so that it removes only its own and never the kernel's.
	routeProto = netlink.RouteProtocol(unix.RTPROT_STATIC)
)

// routers is the part that makes each router placed on the host a network
// namespace: an interface on each attached subnet, a gateway on the
// provider bridge carrying the floating IPs, and NAT between them.
type routers struct {
	cfg Config
	mu  sync.Mutex
	// nat is the NAT last written per router namespace: an unchanged
	// router keeps its table and its connections untouched.
	nat map[string]natPlan
}

func newRouters(cfg Config) (part, error) {
	return &routers{cfg: cfg, nat: map[string]natPlan{}}, nil
}

// close has nothing to stop: a router is only devices and rules.
func (r *routers) close() error { return nil }

// apply makes every router of st and removes the router namespaces and
// veths that st does not explain. A router that fails does not stop the
// others; the errors are joined.
func (r *routers) apply(ctx context.Context, st *netstate.Host) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	host, err := nsHandle(r.cfg.NetNS)
	if err != nil {
		return err
	}
	defer host.Close()

	mtus := map[string]int{}
	for _, n := range st.Networks {
		mtus[n.ID] = n.MTU
	}
	wantNS, wantHost := map[string]bool{}, map[string]bool{}
	var errs []error
	for _, rt := range st.Routers {
		// A router whose state is bad keeps what it has: it is still
		// explained, never torn down for a typo.
		wantNS[r.nsName(rt.ID)] = true
		for _, in := range rt.Interfaces {
			wantHost[netstate.RouterPrefix+netstate.ShortID(in.PortID)] = true
		}
		if rt.Gateway != nil {
			wantHost[gatewayPrefix+netstate.ShortID(rt.ID)] = true
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		p, err := r.plan(rt, mtus)
		if err == nil {
			err = r.applyRouter(host, p)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("netplane: router %s: %w", rt.ID, err))
		}
	}
	errs = append(errs, r.removeOrphans(host, wantNS, wantHost))
	return errors.Join(errs...)
}

func (r *routers) nsName(routerID string) string {
	return r.cfg.prefix() + routerNSPart + netstate.ShortID(routerID)
}

func (r *routers) log() *slog.Logger {
	if r.cfg.Log != nil {
		return r.cfg.Log
	}
	return slog.Default()
}

// routerPlan is a router with its input parsed and checked, before any
// device is touched.
type routerPlan struct {
	ns     string
	ports  []vethPlan // one per router port, its subnets' addresses on it
	gw     *vethPlan
	gwHop  netip.Addr // the provider's gateway; invalid for none
	routes []routePlan
	nat    natPlan
}

func (p routerPlan) gwPorts() []vethPlan {
	if p.gw == nil {
		return nil
	}
	return []vethPlan{*p.gw}
}

// vethPlan is a veth from a bridge of the host into the router namespace.
type vethPlan struct {
	hostEnd, nsEnd, bridge string
	mtu                    int // 0: the bridge's
	mac                    net.HardwareAddr
	addrs                  []netip.Prefix
}

type routePlan struct {
	dst netip.Prefix
	via netip.Addr
}

func (r *routers) plan(rt netstate.Router, mtus map[string]int) (routerPlan, error) {
	if rt.ID == "" {
		return routerPlan{}, errors.New("no id")
	}
	p := routerPlan{ns: r.nsName(rt.ID)}
	byPort := map[string]int{} // a port on several subnets of its network has all their addresses
	for _, in := range rt.Interfaces {
		addr, err := ifaceAddr(in.IP, in.CIDR)
		if err != nil {
			return p, fmt.Errorf("interface %s: %w", in.PortID, err)
		}
		if pfx := addr.Masked(); addr.Addr().Is4() {
			p.nat.subnets = append(p.nat.subnets, pfx)
		}
		if i, ok := byPort[in.PortID]; ok {
			p.ports[i].addrs = append(p.ports[i].addrs, addr)
			continue
		}
		mac, err := net.ParseMAC(in.MAC)
		if err != nil || len(mac) != 6 || in.PortID == "" {
			return p, fmt.Errorf("interface %q: bad port id or MAC %q", in.PortID, in.MAC)
		}
		mtu, ok := mtus[in.NetworkID]
		if !ok {
			return p, fmt.Errorf("interface %s: network %s not in the state", in.PortID, in.NetworkID)
		}
		byPort[in.PortID] = len(p.ports)
		p.ports = append(p.ports, vethPlan{
			hostEnd: netstate.RouterPrefix + netstate.ShortID(in.PortID), nsEnd: qrPrefix + netstate.ShortID(in.PortID),
			bridge: netstate.BridgeName(in.NetworkID), mtu: mtu, mac: mac, addrs: []netip.Prefix{addr},
		})
	}
	if err := r.planGateway(rt, &p); err != nil {
		return p, err
	}
	for _, rr := range rt.Routes {
		dst, err1 := netip.ParsePrefix(rr.Destination)
		via, err2 := netip.ParseAddr(rr.NextHop)
		if err := errors.Join(err1, err2); err != nil {
			return p, fmt.Errorf("route %s via %s: %w", rr.Destination, rr.NextHop, err)
		}
		p.routes = append(p.routes, routePlan{dst: dst.Masked(), via: via})
	}
	return p, nil
}

// planGateway adds the gateway, its floating IPs and its default route.
func (r *routers) planGateway(rt netstate.Router, p *routerPlan) error {
	g := rt.Gateway
	if g == nil {
		return nil
	}
	if r.cfg.ProviderBridge == "" {
		return errors.New("has a gateway but this host has no provider bridge")
	}
	addr, err := ifaceAddr(g.IP, g.CIDR)
	if err != nil || !addr.Addr().Is4() {
		return fmt.Errorf("gateway %s in %s: not an IPv4 address in its CIDR", g.IP, g.CIDR)
	}
	mac, err := net.ParseMAC(g.MAC)
	if err != nil || len(mac) != 6 {
		return fmt.Errorf("gateway: bad MAC %q", g.MAC)
	}
	p.gw = &vethPlan{
		hostEnd: gatewayPrefix + netstate.ShortID(rt.ID), nsEnd: qgPrefix + netstate.ShortID(rt.ID),
		bridge: r.cfg.ProviderBridge, mac: mac, addrs: []netip.Prefix{addr},
	}
	if g.NextHop != "" {
		if p.gwHop, err = netip.ParseAddr(g.NextHop); err != nil {
			return fmt.Errorf("gateway next hop: %w", err)
		}
		p.routes = append(p.routes, routePlan{dst: netip.PrefixFrom(netip.IPv4Unspecified(), 0), via: p.gwHop})
	}
	p.nat.gwDev, p.nat.gwIP, p.nat.snat = p.gw.nsEnd, addr.Addr(), g.EnableSNAT
	for _, f := range rt.FloatingIPs {
		fl, err1 := netip.ParseAddr(f.Address)
		fx, err2 := netip.ParseAddr(f.FixedIP)
		if err := errors.Join(err1, err2); err != nil || !fl.Is4() || !fx.Is4() {
			return fmt.Errorf("floating IP %s → %s: not a pair of IPv4 addresses", f.Address, f.FixedIP)
		}
		// The floating IP lives on the gateway as a /32, so that the
		// namespace answers ARP for it on the provider network.
		p.gw.addrs = append(p.gw.addrs, netip.PrefixFrom(fl, 32))
		p.nat.fips = append(p.nat.fips, fipNAT{floating: fl, fixed: fx})
	}
	return nil
}

// ifaceAddr is ip with the prefix length of cidr.
func ifaceAddr(ip, cidr string) (netip.Prefix, error) {
	a, err := netip.ParseAddr(ip)
	if err != nil {
		return netip.Prefix{}, err
	}
	c, err := netip.ParsePrefix(cidr)
	if err != nil {
		return netip.Prefix{}, err
	}
	if !c.Contains(a) {
		return netip.Prefix{}, fmt.Errorf("%s is not in %s", ip, cidr)
	}
	return netip.PrefixFrom(a, c.Bits()), nil
}

func (r *routers) applyRouter(host *netlink.Handle, p routerPlan) error {
	// The bridges are l2's (and the operator's): without one, nothing of
	// the router is made rather than half of it.
	for _, v := range slices.Concat(p.ports, p.gwPorts()) {
		if _, err := host.LinkByName(v.bridge); err != nil {
			return fmt.Errorf("%s: bridge %s: %w", v.nsEnd, v.bridge, err)
		}
	}
	path, err := ensureNamedNS(p.ns)
	if err != nil {
		return err
	}
	if err := inNS(path, enableForwarding); err != nil {
		return err
	}
	nsh, err := netns.GetFromPath(path)
	if err != nil {
		return err
	}
	defer nsh.Close()
	rh, err := netlink.NewHandleAt(nsh)
	if err != nil {
		return err
	}
	defer rh.Close()

	for _, v := range p.ports {
		if _, _, err := plugVeth(host, rh, nsh, v); err != nil {
			return fmt.Errorf("interface %s: %w", v.nsEnd, err)
		}
	}
	if p.gw != nil {
		qg, added, err := plugVeth(host, rh, nsh, *p.gw)
		if err != nil {
			return fmt.Errorf("gateway: %w", err)
		}
		if err := r.announce(host, rh, path, *p.gw, qg, added); err != nil {
			r.log().Warn("netplane: gratuitous ARP", "router", p.ns, "err", err)
		}
	}
	if err := syncRoutes(rh, p.routes); err != nil {
		return err
	}
	return r.syncNAT(path, rh, p.ns, p.nat)
}

// announce tells the provider network's caches at once where the
// gateway's new addresses live instead of letting them wait for their
// entries to expire. A veth that has just come up drops what it is given
// until the kernel sees its carrier (and activates its queue), so both
// ends must be operationally up first.
func (r *routers) announce(host, rh *netlink.Handle, path string, gw vethPlan, qg netlink.Link, added []netip.Prefix) error {
	if len(added) == 0 {
		return nil
	}
	if err := errors.Join(waitOperUp(rh, gw.nsEnd), waitOperUp(host, gw.hostEnd)); err != nil {
		return err
	}
	return inNS(path, func() error { return sendGARP(qg.Attrs().Index, gw.mac, added) })
}

// waitOperUp waits, for at most the kernel's link event delay (a
// second), for link name to be operationally up.
func waitOperUp(h *netlink.Handle, name string) error {
	for end := time.Now().Add(1500 * time.Millisecond); ; time.Sleep(10 * time.Millisecond) {
		l, err := h.LinkByName(name)
		if err != nil {
			return err
		}
		if l.Attrs().OperState == netlink.OperUp {
			return nil
		}
		if time.Now().After(end) {
			return fmt.Errorf("%s not up (%s)", name, l.Attrs().OperState)
		}
	}
}

// enableForwarding turns IPv4 forwarding on in the calling thread's
// namespace (/proc/sys/net follows the thread, not the process).
func enableForwarding() error {
	const f = "/proc/sys/net/ipv4/ip_forward"
	if b, err := os.ReadFile(f); err == nil && bytes.Equal(bytes.TrimSpace(b), []byte("1")) {
		return nil
	}
	return os.WriteFile(f, []byte("1"), 0o644)
}

// plugVeth makes or repairs veth v: host end on its bridge, namespace end
// with its MAC and addresses, both up. It returns the namespace end and
// the addresses it added.
func plugVeth(host, rh *netlink.Handle, nsh netns.NsHandle, v vethPlan) (netlink.Link, []netip.Prefix, error) {
	br, err := host.LinkByName(v.bridge)
	if err != nil {
		return nil, nil, fmt.Errorf("bridge %s: %w", v.bridge, err)
	}
	mtu := v.mtu
	if mtu == 0 {
		mtu = br.Attrs().MTU
	}
	he, ne := pairedVeth(host, rh, v)
	if he == nil {
		veth := &netlink.Veth{
			LinkAttrs: netlink.LinkAttrs{Name: v.hostEnd, MTU: mtu, MasterIndex: br.Attrs().Index},
			PeerName:  v.nsEnd, PeerHardwareAddr: v.mac, PeerMTU: uint32(mtu), PeerNamespace: netlink.NsFd(nsh),
		}
		if err := host.LinkAdd(veth); err != nil {
			return nil, nil, fmt.Errorf("add veth %s: %w", v.hostEnd, err)
		}
		if he, err = host.LinkByName(v.hostEnd); err != nil {
			return nil, nil, err
		}
		if ne, err = rh.LinkByName(v.nsEnd); err != nil {
			return nil, nil, err
		}
	}
	if err := converge(host, he, br.Attrs().Index, mtu, nil); err != nil {
		return nil, nil, err
	}
	if err := converge(rh, ne, 0, mtu, v.mac); err != nil {
		return nil, nil, err
	}
	added, err := syncAddrs(rh, ne, v.addrs)
	return ne, added, err
}

// pairedVeth finds v's two ends if they exist and are each other's peer;
// otherwise it removes whichever half is there, so that a fresh pair is
// made.
func pairedVeth(host, rh *netlink.Handle, v vethPlan) (netlink.Link, netlink.Link) {
	he, herr := host.LinkByName(v.hostEnd)
	ne, nerr := rh.LinkByName(v.nsEnd)
	if herr == nil && nerr == nil && he.Type() == "veth" && ne.Type() == "veth" &&
		he.Attrs().ParentIndex == ne.Attrs().Index && ne.Attrs().ParentIndex == he.Attrs().Index {
		return he, ne
	}
	if herr == nil {
		_ = host.LinkDel(he)
	}
	if nerr == nil {
		_ = rh.LinkDel(ne)
	}
	return nil, nil
}

// converge sets l's master (when master > 0), MTU and MAC (when mac is
// set) where they differ, and brings it up; nothing changes on a link that
// is already right.
func converge(h *netlink.Handle, l netlink.Link, master, mtu int, mac net.HardwareAddr) error {
	a := l.Attrs()
	if master > 0 && a.MasterIndex != master {
		if err := h.LinkSetMasterByIndex(l, master); err != nil {
			return fmt.Errorf("%s: set master: %w", a.Name, err)
		}
	}
	if a.MTU != mtu {
		if err := h.LinkSetMTU(l, mtu); err != nil {
			return fmt.Errorf("%s: set MTU: %w", a.Name, err)
		}
	}
	if mac != nil && !bytes.Equal(a.HardwareAddr, mac) {
		if err := h.LinkSetHardwareAddr(l, mac); err != nil {
			return fmt.Errorf("%s: set MAC: %w", a.Name, err)
		}
	}
	if a.Flags&net.FlagUp == 0 {
		if err := h.LinkSetUp(l); err != nil {
			return fmt.Errorf("%s: up: %w", a.Name, err)
		}
	}
	return nil
}

// syncAddrs makes want the addresses of l (IPv6 link-local ones are the
// kernel's and stay) and returns those it added.
func syncAddrs(h *netlink.Handle, l netlink.Link, want []netip.Prefix) ([]netip.Prefix, error) {
	have, err := h.AddrList(l, netlink.FAMILY_ALL)
	if err != nil {
		return nil, err
	}
	wanted := map[netip.Prefix]bool{}
	for _, p := range want {
		wanted[p] = true
	}
	present := map[netip.Prefix]bool{}
	for _, a := range have {
		ip, _ := netip.AddrFromSlice(a.IP)
		ones, _ := a.Mask.Size()
		p := netip.PrefixFrom(ip.Unmap(), ones)
		if p.Addr().IsLinkLocalUnicast() && p.Addr().Is6() {
			continue
		}
		if !wanted[p] {
			if err := h.AddrDel(l, &a); err != nil {
				return nil, fmt.Errorf("%s: remove %s: %w", l.Attrs().Name, p, err)
			}
			continue
		}
		present[p] = true
	}
	var added []netip.Prefix
	for _, p := range want {
		if present[p] {
			continue
		}
		a := &netlink.Addr{IPNet: prefixNet(p)}
		if p.Addr().Is6() {
			a.Flags = unix.IFA_F_NODAD // a router's address is known unique
		}
		if err := h.AddrAdd(l, a); err != nil {
			return nil, fmt.Errorf("%s: add %s: %w", l.Attrs().Name, p, err)
		}
		present[p] = true
		added = append(added, p)
	}
	return added, nil
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// syncRoutes makes want the routes of the router's main table that the
// plane owns (the default route and the extra routes).
func syncRoutes(h *netlink.Handle, want []routePlan) error {
	have, err := h.RouteListFiltered(netlink.FAMILY_ALL,
		&netlink.Route{Table: unix.RT_TABLE_MAIN, Protocol: routeProto},
		netlink.RT_FILTER_TABLE|netlink.RT_FILTER_PROTOCOL)
	if err != nil {
		return err
	}
	wanted := map[routePlan]bool{}
	for _, w := range want {
		wanted[w] = true
	}
	present := map[routePlan]bool{}
	for _, rt := range have {
		k := routeKey(rt)
		if !wanted[k] {
			if err := h.RouteDel(&rt); err != nil {
				return fmt.Errorf("remove route %s via %s: %w", k.dst, k.via, err)
			}
			continue
		}
		present[k] = true
	}
	for _, w := range want {
		if present[w] {
			continue
		}
		rt := &netlink.Route{Dst: prefixNet(w.dst), Gw: w.via.AsSlice(), Protocol: routeProto, Table: unix.RT_TABLE_MAIN}
		if err := h.RouteReplace(rt); err != nil {
			return fmt.Errorf("route %s via %s: %w", w.dst, w.via, err)
		}
		present[w] = true
	}
	return nil
}

func routeKey(rt netlink.Route) routePlan {
	var k routePlan
	if rt.Dst != nil {
		ip, _ := netip.AddrFromSlice(rt.Dst.IP)
		ones, _ := rt.Dst.Mask.Size()
		k.dst = netip.PrefixFrom(ip.Unmap(), ones)
	}
	if gw, ok := netip.AddrFromSlice(rt.Gw); ok {
		k.via = gw.Unmap()
	}
	return k
}

// removeOrphans deletes the router namespaces of this plane's prefix and
// the router veths of the host that st does not explain.
func (r *routers) removeOrphans(host *netlink.Handle, wantNS, wantHost map[string]bool) error {
	var errs []error
	names, err := namedNS(r.cfg.prefix() + routerNSPart)
	errs = append(errs, err)
	for _, n := range names {
		if !wantNS[n] {
			errs = append(errs, removeRouterNS(n))
			delete(r.nat, n)
		}
	}
	links, err := host.LinkList()
	errs = append(errs, err)
	for _, l := range links {
		n := l.Attrs().Name
		if l.Type() == "veth" && isRouterHostEnd(n) && !wantHost[n] {
			if err := host.LinkDel(l); err != nil {
				errs = append(errs, fmt.Errorf("netplane: remove %s: %w", n, err))
			}
		}
	}
	return errors.Join(errs...)
}

// removeRouterNS deletes a router namespace after its veths, so that
// their host ends are gone when it returns rather than whenever the
// kernel gets to destroy the namespace.
func removeRouterNS(name string) error {
	if rh, err := nsHandle(namedNSDir + "/" + name); err == nil {
		if links, err := rh.LinkList(); err == nil {
			for _, l := range links {
				if l.Type() == "veth" {
					_ = rh.LinkDel(l)
				}
			}
		}
		rh.Close()
	}
	if err := deleteNamedNS(name); err != nil {
		return fmt.Errorf("netplane: remove namespace %s: %w", name, err)
	}
	return nil
}

// isRouterHostEnd reports whether n is named like a router veth's host
// end: nrt or ngw and the 11 first characters of a UUID.
func isRouterHostEnd(n string) bool {
	var rest string
	switch {
	case strings.HasPrefix(n, netstate.RouterPrefix):
		rest = n[len(netstate.RouterPrefix):]
	case strings.HasPrefix(n, gatewayPrefix):
		rest = n[len(gatewayPrefix):]
	default:
		return false
	}
	if len(rest) != 11 {
		return false
	}
	for _, c := range rest {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c == '-') {
			return false
		}
	}
	return true
}

// sendGARP announces each IPv4 address of ips as living at mac on link
// ifindex, with a gratuitous ARP request. It runs inside the namespace
// that holds the link: a packet socket belongs to the namespace it is
// made in.
func sendGARP(ifindex int, mac net.HardwareAddr, ips []netip.Prefix) error {
	if len(ips) == 0 {
		return nil
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ARP)))
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	to := &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ARP), Ifindex: ifindex, Halen: 6}
	copy(to.Addr[:], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	var errs []error
	for _, p := range ips {
		if p.Addr().Is4() {
			errs = append(errs, unix.Sendto(fd, garpFrame(mac, p.Addr()), 0, to))
		}
	}
	return errors.Join(errs...)
}

// garpFrame is a broadcast ARP request for ip from ip itself (RFC 5227's
// announcement).
func garpFrame(mac net.HardwareAddr, ip netip.Addr) []byte {
	ip4 := ip.As4()
	f := make([]byte, 0, 42)
	f = append(f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff)
	f = append(f, mac...)
	f = append(f, 0x08, 0x06)             // ARP
	f = append(f, 0, 1, 0x08, 0x00, 6, 4) // Ethernet, IPv4, lengths
	f = append(f, 0, 1)                   // request
	f = append(f, mac...)
	f = append(f, ip4[:]...)
	f = append(f, 0, 0, 0, 0, 0, 0)
	return append(f, ip4[:]...)
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
