package netplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"nimbus/internal/netstate"
)

// The DHCP part runs, per network of the host with DHCP on, a namespace
// joined to the network's bridge by a veth, holding the network's DHCP
// port: a DHCPv4 server that answers the network's ports on this host
// with their fixed IPs, and the metadata proxy on 169.254.169.254.
// Servers answer from data swapped whole on each apply, so leases follow
// port updates without a restart.

// dhcpIfName is the DHCP port's device inside its namespace.
const dhcpIfName = "eth0"

// metadataAddr is where guests reach the metadata service.
var metadataAddr = netip.MustParsePrefix("169.254.169.254/32")

// Lease times: short, so that a port update reaches its guest soon.
const (
	dhcpLeaseTime = 600 * time.Second
	dhcpT1        = dhcpLeaseTime / 2
	dhcpT2        = dhcpLeaseTime * 7 / 8
)

type dhcpPart struct {
	cfg Config
	log *slog.Logger

	mu   sync.Mutex
	nets map[string]*dhcpNet // by namespace name
}

// dhcpNet is one network's DHCP namespace and its servers.
type dhcpNet struct {
	networkID string
	path      string
	data      atomic.Pointer[dhcpData]
	server    *dhcpServer
	proxy     *metadataProxy
}

// dhcpData is what a network's servers answer from.
type dhcpData struct {
	host   string                // the agent's host, told to the metadata service
	leases map[string]*dhcpLease // by the port's MAC, lower case
}

// dhcpLease is what a port's guest is told.
type dhcpLease struct {
	IP       netip.Addr
	Mask     netip.Prefix // the subnet
	Server   netip.Addr   // the DHCP port's IP on the subnet
	Router   netip.Addr   // invalid when the subnet has no gateway
	DNS      []netip.Addr
	Routes   []classlessRoute
	Hostname string
	MTU      int
}

func newDHCP(cfg Config) (part, error) {
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &dhcpPart{cfg: cfg, log: log.With("part", "dhcp"), nets: map[string]*dhcpNet{}}, nil
}

// nsName is network networkID's DHCP namespace.
func (d *dhcpPart) nsName(networkID string) string {
	return d.cfg.prefix() + "dhcp-" + netstate.ShortID(networkID)
}

// dhcpVethName is the host end of the DHCP namespace's veth.
func dhcpVethName(networkID string) string { return netstate.DHCPPrefix + netstate.ShortID(networkID) }

func (d *dhcpPart) apply(_ context.Context, st *netstate.Host) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	host, err := nsHandle(d.cfg.NetNS)
	if err != nil {
		return err
	}
	defer host.Close()
	want := map[string]bool{}
	wantVeth := map[string]bool{}
	var errs []error
	for i := range st.Networks {
		n := &st.Networks[i]
		if n.DHCP == nil {
			continue
		}
		name := d.nsName(n.ID)
		want[name], wantVeth[dhcpVethName(n.ID)] = true, true
		br, err := host.LinkByName(netstate.BridgeName(n.ID))
		if err != nil {
			// l2 makes the bridge; without it there is nothing to join,
			// and what is there already stays until it returns.
			errs = append(errs, fmt.Errorf("network %s: bridge: %w", n.ID, err))
			continue
		}
		if err := d.ensure(host, br, st, n, name); err != nil {
			errs = append(errs, fmt.Errorf("network %s: %w", n.ID, err))
		}
	}
	errs = append(errs, d.prune(host, want, wantVeth)...)
	return errors.Join(errs...)
}

// ensure wires network n's DHCP namespace and starts its servers; a
// changed DHCP port is wired anew and its servers restarted.
func (d *dhcpPart) ensure(host *netlink.Handle, br netlink.Link, st *netstate.Host, n *netstate.Network, name string) error {
	data := &dhcpData{host: st.Host, leases: dhcpLeases(st, n, d.log)}
	path, err := ensureNamedNS(name)
	if err != nil {
		return err
	}
	e := d.nets[name]
	if e == nil {
		e = &dhcpNet{networkID: n.ID, path: path}
		d.nets[name] = e
	}
	e.data.Store(data)
	rewired, err := wireDHCP(host, br, path, n)
	if err != nil {
		return err
	}
	if rewired {
		d.log.Info("dhcp namespace wired", "network", n.ID, "namespace", name, "mac", n.DHCP.MAC)
		e.stop(d.log)
	}
	var errs []error
	if e.server == nil {
		if e.server, err = startDHCPServer(path, &e.data, d.log.With("network", n.ID)); err != nil {
			errs = append(errs, err)
		}
	}
	if e.proxy == nil && d.cfg.Metadata != nil {
		if e.proxy, err = startMetadataProxy(path, n.ID, &e.data, d.cfg.Metadata, d.log.With("network", n.ID)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// stop ends the network's servers; the namespace stays.
func (e *dhcpNet) stop(log *slog.Logger) {
	if e.server != nil {
		e.server.close()
		e.server = nil
	}
	if e.proxy != nil {
		if err := e.proxy.close(); err != nil {
			log.Warn("metadata proxy close", "network", e.networkID, "err", err)
		}
		e.proxy = nil
	}
}

// prune stops and removes the namespaces, servers and veths of networks
// that are no longer wanted, including those a previous run left.
func (d *dhcpPart) prune(host *netlink.Handle, want, wantVeth map[string]bool) []error {
	var errs []error
	for name, e := range d.nets {
		if !want[name] {
			e.stop(d.log)
			delete(d.nets, name)
		}
	}
	// The host ends first: a namespace a socket still holds would keep
	// its veth alive.
	links, err := host.LinkList()
	if err != nil {
		errs = append(errs, err)
	}
	for _, l := range links {
		name := l.Attrs().Name
		if _, ok := l.(*netlink.Veth); ok && strings.HasPrefix(name, netstate.DHCPPrefix) && !wantVeth[name] {
			if err := host.LinkDel(l); err != nil && !errors.Is(err, syscall.ENODEV) { // ENODEV: gone with its peer
				errs = append(errs, fmt.Errorf("delete %s: %w", name, err))
			}
		}
	}
	names, err := namedNS(d.cfg.prefix() + "dhcp-")
	if err != nil {
		errs = append(errs, err)
	}
	for _, name := range names {
		if !want[name] {
			d.log.Info("dhcp namespace removed", "namespace", name)
			if err := deleteNamedNS(name); err != nil {
				errs = append(errs, fmt.Errorf("delete namespace %s: %w", name, err))
			}
		}
	}
	return errs
}

func (d *dhcpPart) close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, e := range d.nets {
		e.stop(d.log)
	}
	return nil
}

// dhcpAddrs are the addresses of the DHCP port's device: its fixed IPs
// with their subnets' prefix lengths (the first IPv4 one first, as the
// source of broadcast replies), then the metadata address.
func dhcpAddrs(n *netstate.Network) []netip.Prefix {
	bits := map[string]int{}
	for _, s := range n.Subnets {
		if p, err := netip.ParsePrefix(s.CIDR); err == nil {
			bits[s.ID] = p.Bits()
		}
	}
	var out []netip.Prefix
	for _, ip := range n.DHCP.IPs {
		a, err := netip.ParseAddr(ip.IP)
		if b, ok := bits[ip.SubnetID]; err == nil && ok {
			out = append(out, netip.PrefixFrom(a.Unmap(), b))
		}
	}
	slices.SortStableFunc(out, func(x, y netip.Prefix) int {
		switch {
		case x.Addr().Is4() == y.Addr().Is4():
			return 0
		case x.Addr().Is4():
			return -1
		}
		return 1
	})
	return append(out, metadataAddr)
}

// wireDHCP makes the veth between bridge br and namespace path as n's
// DHCP port has it, and reports whether it made it anew. One that exists
// with another MAC or other addresses is replaced, so that the servers'
// sockets and the address order start fresh; a changed MTU is set.
func wireDHCP(host *netlink.Handle, br netlink.Link, path string, n *netstate.Network) (bool, error) {
	mac, err := net.ParseMAC(n.DHCP.MAC)
	if err != nil {
		return false, fmt.Errorf("DHCP port MAC: %w", err)
	}
	addrs := dhcpAddrs(n)
	inner, err := nsHandle(path)
	if err != nil {
		return false, err
	}
	defer inner.Close()
	name := dhcpVethName(n.ID)
	outer, oerr := host.LinkByName(name)
	peer, perr := inner.LinkByName(dhcpIfName)
	made := false
	if oerr != nil || perr != nil || peer.Attrs().HardwareAddr.String() != mac.String() || !hasAddrs(inner, peer, addrs) {
		if oerr == nil {
			if err := host.LinkDel(outer); err != nil {
				return false, fmt.Errorf("delete %s: %w", name, err)
			}
		}
		if outer, peer, err = makeDHCPVeth(host, inner, path, name, mac, n.MTU); err != nil {
			return false, err
		}
		for _, a := range addrs {
			addr := &netlink.Addr{IPNet: prefixNet(a)}
			if a.Addr().Is6() {
				addr.Flags = syscall.IFA_F_NODAD
			}
			if err := inner.AddrAdd(peer, addr); err != nil {
				return false, fmt.Errorf("address %s: %w", a, err)
			}
		}
		made = true
	}
	for _, step := range []struct {
		what string
		err  func() error
	}{
		{"master", func() error { return host.LinkSetMaster(outer, br) }},
		{"mtu", func() error { return host.LinkSetMTU(outer, n.MTU) }},
		{"up", func() error { return host.LinkSetUp(outer) }},
		{"peer mtu", func() error { return inner.LinkSetMTU(peer, n.MTU) }},
		{"peer up", func() error { return inner.LinkSetUp(peer) }},
	} {
		if err := step.err(); err != nil {
			return made, fmt.Errorf("%s %s: %w", name, step.what, err)
		}
	}
	return made, nil
}

func makeDHCPVeth(host, inner *netlink.Handle, path, name string, mac net.HardwareAddr, mtu int) (netlink.Link, netlink.Link, error) {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return nil, nil, err
	}
	defer ns.Close()
	v := &netlink.Veth{
		LinkAttrs:        netlink.LinkAttrs{Name: name, MTU: mtu},
		PeerName:         dhcpIfName,
		PeerHardwareAddr: mac,
		PeerNamespace:    netlink.NsFd(ns),
		PeerMTU:          uint32(mtu),
	}
	if err := host.LinkAdd(v); err != nil {
		return nil, nil, fmt.Errorf("make %s: %w", name, err)
	}
	outer, err := host.LinkByName(name)
	if err != nil {
		return nil, nil, err
	}
	peer, err := inner.LinkByName(dhcpIfName)
	if err != nil {
		return nil, nil, err
	}
	return outer, peer, nil
}

// hasAddrs reports whether link has exactly addrs, in the order given
// for IPv4. IPv6 addresses the kernel adds (link-local, and SLAAC ones
// should a router advertise a prefix) are no mismatch.
func hasAddrs(h *netlink.Handle, link netlink.Link, addrs []netip.Prefix) bool {
	got, err := h.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return false
	}
	var have []netip.Prefix
	for _, a := range got {
		if a.IP.To4() == nil && (a.IP.IsLinkLocalUnicast() || a.Flags&syscall.IFA_F_PERMANENT == 0) {
			continue
		}
		ip, _ := netip.AddrFromSlice(a.IP)
		bits, _ := a.Mask.Size()
		have = append(have, netip.PrefixFrom(ip.Unmap(), bits))
	}
	sortV4First := func(ps []netip.Prefix) []netip.Prefix {
		var v4, v6 []netip.Prefix
		for _, p := range ps {
			if p.Addr().Is4() {
				v4 = append(v4, p)
			} else {
				v6 = append(v6, p)
			}
		}
		slices.SortFunc(v6, func(x, y netip.Prefix) int { return strings.Compare(x.String(), y.String()) })
		return append(v4, v6...)
	}
	return slices.Equal(sortV4First(have), sortV4First(addrs))
}

// dhcpLeases is what network n's DHCP server tells each of its ports on
// the host: the port's fixed IP on the first DHCP-enabled IPv4 subnet
// where the DHCP port has an address too. Ports without one get nothing.
func dhcpLeases(st *netstate.Host, n *netstate.Network, log *slog.Logger) map[string]*dhcpLease {
	server := map[string]netip.Addr{}
	for _, ip := range n.DHCP.IPs {
		if a, err := netip.ParseAddr(ip.IP); err == nil && a.Unmap().Is4() {
			server[ip.SubnetID] = a.Unmap()
		}
	}
	subnets := map[string]*netstate.Subnet{}
	for i := range n.Subnets {
		subnets[n.Subnets[i].ID] = &n.Subnets[i]
	}
	out := map[string]*dhcpLease{}
	for _, p := range st.Ports {
		if p.NetworkID != n.ID {
			continue
		}
		for _, ip := range p.IPs {
			s, srv := subnets[ip.SubnetID], server[ip.SubnetID]
			if s == nil || !s.EnableDHCP || !srv.IsValid() {
				continue
			}
			o, err := leaseFor(s, ip.IP, srv, p.Hostname, n.MTU)
			if err != nil {
				log.Warn("no lease for port", "port", p.ID, "err", err)
				continue
			}
			if o != nil {
				out[strings.ToLower(p.MAC)] = o
				break
			}
		}
	}
	return out
}

// leaseFor is a port's lease on subnet s; nil for an IPv6 subnet.
func leaseFor(s *netstate.Subnet, ip string, server netip.Addr, hostname string, mtu int) (*dhcpLease, error) {
	cidr, err := netip.ParsePrefix(s.CIDR)
	if err != nil || !cidr.Addr().Is4() {
		return nil, err
	}
	a, err := netip.ParseAddr(ip)
	if err != nil {
		return nil, err
	}
	o := &dhcpLease{IP: a.Unmap(), Mask: cidr.Masked(), Server: server, Hostname: hostname, MTU: mtu}
	if s.Gateway != "" {
		if o.Router, err = netip.ParseAddr(s.Gateway); err != nil || !o.Router.Is4() {
			return nil, fmt.Errorf("subnet %s: gateway %q", s.ID, s.Gateway)
		}
	}
	for _, d := range s.DNS {
		if a, err := netip.ParseAddr(d); err == nil && a.Unmap().Is4() {
			o.DNS = append(o.DNS, a.Unmap())
		}
	}
	// Clients ignore option 3 when option 121 is there (RFC 3442), so
	// the default route is in it too; the subnet's own routes win.
	have := map[netip.Prefix]bool{}
	add := func(dst netip.Prefix, hop netip.Addr) {
		if !have[dst] {
			have[dst] = true
			o.Routes = append(o.Routes, classlessRoute{Dst: dst, NextHop: hop})
		}
	}
	for _, r := range s.Routes {
		dst, derr := netip.ParsePrefix(r.Destination)
		hop, herr := netip.ParseAddr(r.NextHop)
		if derr != nil || herr != nil || !dst.Addr().Is4() || !hop.Unmap().Is4() {
			continue // an IPv6 route, or one no client could use
		}
		add(dst.Masked(), hop.Unmap())
	}
	add(metadataAddr, server)
	if o.Router.IsValid() {
		add(netip.PrefixFrom(netip.IPv4Unspecified(), 0), o.Router)
	}
	return o, nil
}

// dhcpServer is a network's DHCPv4 server in its namespace.
type dhcpServer struct {
	conn *net.UDPConn
	done chan struct{}
}

// startDHCPServer listens on port 67 of the namespace's DHCP device and
// answers from data until closed.
func startDHCPServer(path string, data *atomic.Pointer[dhcpData], log *slog.Logger) (*dhcpServer, error) {
	var pc net.PacketConn
	err := inNS(path, func() error {
		lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
			var serr error
			err := c.Control(func(fd uintptr) {
				for _, opt := range []int{syscall.SO_BROADCAST, syscall.SO_REUSEADDR} {
					if serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, opt, 1); serr != nil {
						return
					}
				}
				serr = syscall.BindToDevice(int(fd), dhcpIfName)
			})
			return errors.Join(err, serr)
		}}
		var err error
		pc, err = lc.ListenPacket(context.Background(), "udp4", "0.0.0.0:67")
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("dhcp server: %w", err)
	}
	s := &dhcpServer{conn: pc.(*net.UDPConn), done: make(chan struct{})}
	go s.serve(data, log)
	return s, nil
}

func (s *dhcpServer) close() {
	_ = s.conn.Close()
	<-s.done
}

func (s *dhcpServer) serve(data *atomic.Pointer[dhcpData], log *slog.Logger) {
	defer close(s.done)
	buf := make([]byte, 1500)
	for {
		n, _, err := s.conn.ReadFromUDPAddrPort(buf)
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			log.Warn("dhcp read", "err", err)
			time.Sleep(100 * time.Millisecond) // no busy loop on a persistent error
			continue
		}
		req, err := decodeDHCP(buf[:n])
		if err != nil {
			continue
		}
		reply := dhcpReply(req, data.Load().leases)
		if reply == nil {
			continue
		}
		dst := netip.AddrPortFrom(netip.AddrFrom4([4]byte{255, 255, 255, 255}), 68)
		// A client with an address (renewing, INFORM) is answered at it:
		// it may listen on a socket bound to that address only.
		if reply.msgType() != dhcpNak && !unset(req.CIAddr) && req.Flags&flagBroadcast == 0 {
			dst = netip.AddrPortFrom(req.CIAddr, 68)
		}
		if _, err := s.conn.WriteToUDPAddrPort(reply.encode(), dst); err != nil {
			log.Warn("dhcp reply", "to", dst, "mac", req.mac(), "err", err)
		}
	}
}

// dhcpReply is the server's answer to req, nil when it gives none: the
// client is unknown, the request was relayed or chose another server,
// or it needs no answer (RELEASE, DECLINE).
func dhcpReply(req *dhcpMessage, leases map[string]*dhcpLease) *dhcpMessage {
	mac := req.mac()
	if req.Op != bootRequest || mac == nil || !unset(req.GIAddr) {
		return nil
	}
	o := leases[mac.String()]
	if o == nil {
		return nil
	}
	reply := &dhcpMessage{
		Op: bootReply, HType: req.HType, HLen: req.HLen, XID: req.XID, Flags: req.Flags,
		CIAddr: netip.IPv4Unspecified(), YIAddr: o.IP, SIAddr: netip.IPv4Unspecified(), GIAddr: req.GIAddr,
		CHAddr: req.CHAddr, Options: map[byte][]byte{optServerID: optAddrs(o.Server)},
	}
	switch req.msgType() {
	case dhcpDiscover:
		reply.Options[optMessageType] = []byte{dhcpOffer}
	case dhcpRequest:
		if id, ok := req.optAddr(optServerID); ok && id != o.Server {
			return nil // the client took another server's offer
		}
		want, ok := req.optAddr(optRequestedIP)
		if !ok {
			want = req.CIAddr // renewing or rebinding
		}
		if want != o.IP {
			reply.YIAddr = netip.IPv4Unspecified()
			reply.Options[optMessageType] = []byte{dhcpNak}
			reply.Options[optMessage] = []byte("address not assigned to this client")
			reply.Flags |= flagBroadcast
			return reply
		}
		reply.Options[optMessageType] = []byte{dhcpAck}
	case dhcpInform:
		// RFC 2131 §3.4: configuration only, no address, no lease.
		reply.Options[optMessageType] = []byte{dhcpAck}
		reply.CIAddr, reply.YIAddr = req.CIAddr, netip.IPv4Unspecified()
		o.addOptions(reply.Options, false)
		return reply
	default:
		return nil
	}
	o.addOptions(reply.Options, true)
	return reply
}

// unset is an address field left 0.0.0.0.
func unset(a netip.Addr) bool { return !a.IsValid() || a.IsUnspecified() }

// addOptions puts the lease's options into opts; all of them, requested
// or not, as busybox udhcpc asks for few (the MTU not among them) but
// uses what it gets.
func (o *dhcpLease) addOptions(opts map[byte][]byte, lease bool) {
	mask := net.CIDRMask(o.Mask.Bits(), 32)
	opts[optSubnetMask] = mask
	if o.Router.IsValid() {
		opts[optRouter] = optAddrs(o.Router)
	}
	if len(o.DNS) > 0 {
		opts[optDNS] = optAddrs(o.DNS...)
	}
	if o.Hostname != "" {
		opts[optHostname] = []byte(o.Hostname)
	}
	opts[optMTU] = optU16(uint16(o.MTU))
	opts[optClasslessRoute] = optClasslessRoutes(o.Routes)
	if lease {
		opts[optLeaseTime] = optU32(uint32(dhcpLeaseTime / time.Second))
		opts[optRenewalTime] = optU32(uint32(dhcpT1 / time.Second))
		opts[optRebindingTime] = optU32(uint32(dhcpT2 / time.Second))
	}
}
