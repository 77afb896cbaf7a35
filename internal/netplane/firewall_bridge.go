package netplane

import (
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"nimbus/internal/netstate"
)

// bridgeProgram writes the bridge table: anti-spoofing, the ports'
// egress and ingress chains, the groups' rule chains and sets.
type bridgeProgram struct {
	c                      *nftables.Conn
	t                      *nftables.Table
	spoof, egress, ingress *nftables.Chain
	// groups are the rule chains that exist, by group id.
	groups map[string]bool
	// remote is a remote group's IPv4 and IPv6 member sets, by group id.
	remote map[string][2]*nftables.Set
	// to is, per base chain, which port chain a device's frames jump to.
	to map[*nftables.Chain][]nftables.SetElement
	// setID numbers the transaction's sets (see setIDs).
	setID *setIDs
}

// The headers the rules read from: link layer, network, transport.
const (
	ll = expr.PayloadBaseLLHeader
	nh = expr.PayloadBaseNetworkHeader
	th = expr.PayloadBaseTransportHeader
)

func (b *bridgeProgram) chain(name string) *nftables.Chain {
	return b.c.AddChain(&nftables.Chain{Table: b.t, Name: name})
}

func (b *bridgeProgram) base(name string, hook *nftables.ChainHook, prio int32) *nftables.Chain {
	return b.c.AddChain(&nftables.Chain{Table: b.t, Name: name, Type: nftables.ChainTypeFilter,
		Hooknum: hook, Priority: nftables.ChainPriorityRef(nftables.ChainPriority(prio))})
}

func (b *bridgeProgram) rule(ch *nftables.Chain, parts ...[]expr.Any) {
	b.c.AddRule(&nftables.Rule{Table: b.t, Chain: ch, Exprs: cat(parts...)})
}

// bases adds the base chains. Anti-spoofing runs before br_netfilter
// (priority 0) hands the packet to conntrack; the forward chains run
// after br_netfilter's forward hook, so they see the established mark.
func (b *bridgeProgram) bases(tunnels, dhcps []string) {
	b.spoof = b.base("spoof", nftables.ChainHookPrerouting, -200)
	b.egress = b.base("egress", nftables.ChainHookForward, 100)
	b.ingress = b.base("ingress", nftables.ChainHookForward, 110)
	// Distributed DHCP: each host's DHCP namespace answers only its own
	// guests, so nothing crosses between it and the tunnels. The VXLAN
	// devices and DHCP veths are dispatched by name like the ports (their
	// names follow from the networks), not matched by name prefix ahead
	// of the dispatch: every forwarded frame would pay for loading its
	// input device's name twice more.
	fromTunnel := b.chain("from-tunnel")
	b.rule(fromTunnel, ifPrefix(expr.MetaKeyOIFNAME, netstate.DHCPPrefix), verdict(expr.VerdictDrop))
	fromDHCP := b.chain("from-dhcp")
	b.rule(fromDHCP, ifPrefix(expr.MetaKeyOIFNAME, netstate.VXLANPrefix), verdict(expr.VerdictDrop))
	for _, dev := range tunnels {
		b.dispatch(b.egress, dev, fromTunnel)
	}
	for _, dev := range dhcps {
		b.dispatch(b.egress, dev, fromDHCP)
	}
}

// addrSet adds an interval set of addresses holding prefixes ps.
func (b *bridgeProgram) addrSet(name string, typ nftables.SetDatatype, ps []netip.Prefix) *nftables.Set {
	s := &nftables.Set{Table: b.t, ID: b.setID.next(), Name: name, KeyType: typ, Interval: true}
	_ = b.c.AddSet(s, intervalElems(ps)) // errors only for anonymous non-constant sets
	return s
}

// group adds a group's rule chains: "gi-<id>" (ingress) and "ge-<id>"
// (egress), where a matching rule accepts.
func (b *bridgeProgram) group(g fwGroup) {
	b.groups[g.id] = true
	for _, d := range []struct {
		prefix string
		rules  []fwRule
		egress bool
	}{{"gi-", g.ingress, false}, {"ge-", g.egress, true}} {
		ch := b.chain(d.prefix + g.id)
		for _, r := range d.rules {
			b.rule(ch, b.match(r, d.egress), verdict(expr.VerdictAccept))
		}
	}
}

// match is a security group rule as nftables matches; the remote end is
// the source for ingress and the destination for egress.
func (b *bridgeProgram) match(r fwRule, egress bool) []expr.Any {
	m := etherType(r.ether)
	if r.proto >= 0 {
		m = cat(m, l4(uint8(r.proto)))
	}
	if r.ports != nil {
		m = cat(m, portRange(r.ports[0], r.ports[1]))
	}
	if r.icmp != nil {
		m = cat(m, field(th, 0, expr.CmpOpEq, []byte{byte(r.icmp[0])}))
		if r.icmp[1] >= 0 {
			m = cat(m, field(th, 1, expr.CmpOpEq, []byte{byte(r.icmp[1])}))
		}
	}
	off, n := uint32(12), uint32(4) // IPv4 source
	if r.ether == etherIPv6 {
		off, n = 8, 16
	}
	if egress {
		off += n // the destination follows the source in both headers
	}
	if r.remote.IsValid() && r.remote.Bits() > 0 {
		m = cat(m, []expr.Any{load(nh, off, n),
			&expr.Range{Op: expr.CmpOpEq, Register: 1,
				FromData: r.remote.Addr().AsSlice(), ToData: lastAddr(r.remote).AsSlice()}})
	}
	if r.group != "" {
		s := b.remote[r.group][0]
		if r.ether == etherIPv6 {
			s = b.remote[r.group][1]
		}
		m = cat(m, inSet(nh, off, n, s, false))
	}
	return m
}

// port adds a secured port's sets and chains: "s-<tap>" (anti-spoofing),
// "e-<tap>" (what it sends), "i-<tap>" (what it receives).
func (b *bridgeProgram) port(p fwPort) {
	macs := &nftables.Set{Table: b.t, ID: b.setID.next(), Name: "m-" + p.tap, KeyType: nftables.TypeEtherAddr}
	var elems []nftables.SetElement
	for _, m := range p.macs {
		elems = append(elems, nftables.SetElement{Key: m})
	}
	_ = b.c.AddSet(macs, elems)
	v4 := b.addrSet("a4-"+p.tap, nftables.TypeIPAddr, p.addrs.v4)
	v6 := b.addrSet("a6-"+p.tap, nftables.TypeIP6Addr, p.addrs.v6)

	s := b.chain("s-" + p.tap)
	b.dispatch(b.spoof, p.tap, s)
	b.antiSpoof(s, macs, v4, v6)

	e := b.chain("e-" + p.tap)
	b.dispatch(b.egress, p.tap, e)
	b.guard(e, p, "ge-", []guardRule{
		{etherIPv4, udpPorts(68, 67)},   // DHCP requests
		{etherIPv6, udpPorts(546, 547)}, // DHCPv6 requests
		{etherIPv6, icmp6Type(133)},     // router solicitation
		{etherIPv6, icmp6Type(135)},     // neighbour solicitation
		{etherIPv6, icmp6Type(136)},     // neighbour advertisement
		{etherIPv6, icmp6Type(143)},     // MLDv2 report
	})

	i := b.chain("i-" + p.tap)
	b.dispatch(b.ingress, p.tap, i)
	// DHCP replies only from the host's DHCP namespace, router
	// advertisements only from a router: not from a port without port
	// security.
	fromDHCP := ifPrefix(expr.MetaKeyIIFNAME, netstate.DHCPPrefix)
	fromRouter := ifPrefix(expr.MetaKeyIIFNAME, netstate.RouterPrefix)
	b.guard(i, p, "gi-", []guardRule{
		{etherIPv4, cat(fromDHCP, udpPorts(67, 68))},
		{etherIPv6, cat(fromDHCP, udpPorts(547, 546))},
		{etherIPv6, cat(fromRouter, icmp6Type(134))},
		{etherIPv6, icmp6Type(130)}, // MLD query
		{etherIPv6, icmp6Type(135)}, // neighbour solicitation
		{etherIPv6, icmp6Type(136)}, // neighbour advertisement
	})
}

// dispatch sends base's frames of device dev (input for spoof and
// egress, output for ingress) to chain ch.
func (b *bridgeProgram) dispatch(base *nftables.Chain, dev string, ch *nftables.Chain) {
	b.to[base] = append(b.to[base], nftables.SetElement{Key: ifname(dev),
		VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: ch.Name}})
}

// dispatchRules ends each base chain with one lookup in a verdict map of
// device to port chain, so a frame costs the same with 1 port or 1,000.
// The maps come after the chains they name.
func (b *bridgeProgram) dispatchRules() {
	for _, base := range []*nftables.Chain{b.spoof, b.egress, b.ingress} {
		key := expr.MetaKeyIIFNAME
		if base == b.ingress {
			key = expr.MetaKeyOIFNAME
		}
		m := &nftables.Set{Table: b.t, ID: b.setID.next(), Name: base.Name + "-ports", IsMap: true,
			KeyType: nftables.TypeIFName, DataType: nftables.TypeVerdict}
		_ = b.c.AddSet(m, b.to[base])
		b.rule(base, []expr.Any{
			&expr.Meta{Key: key, Register: 1},
			&expr.Lookup{SourceRegister: 1, DestRegister: 0, IsDestRegSet: true, SetName: m.Name, SetID: m.ID},
		})
	}
}

// guardRule is traffic a port always passes, whatever its groups say.
type guardRule struct {
	ether uint16
	match []expr.Any
}

// guard fills a port's egress or ingress chain: ARP (checked by
// anti-spoofing), established traffic for a stateful port, the always
// allowed, then the groups' chains; the rest is dropped.
func (b *bridgeProgram) guard(ch *nftables.Chain, p fwPort, prefix string, always []guardRule) {
	b.rule(ch, etherType(etherARP), verdict(expr.VerdictAccept))
	if p.stateful {
		b.rule(ch, markBit(markEstablished), verdict(expr.VerdictAccept))
	}
	for _, a := range always {
		b.rule(ch, etherType(a.ether), a.match, verdict(expr.VerdictAccept))
	}
	for _, g := range p.groups {
		if b.groups[g] {
			b.rule(ch, jump(prefix+g))
		}
	}
	b.rule(ch, verdict(expr.VerdictDrop))
}

// antiSpoof fills a port's "s-" chain: a frame from the port carries one
// of its MACs, ARP speaks for its own addresses, IP comes from its
// addresses, and it never plays DHCP server or IPv6 router.
func (b *bridgeProgram) antiSpoof(ch *nftables.Chain, macs, v4, v6 *nftables.Set) {
	drop, accept := verdict(expr.VerdictDrop), verdict(expr.VerdictAccept)
	ip4, ip6 := etherType(etherIPv4), etherType(etherIPv6)
	b.rule(ch, inSet(ll, 6, 6, macs, true), drop)

	a := etherType(etherARP)
	b.rule(ch, a, inSet(nh, 8, 6, macs, true), drop)                    // sender MAC
	b.rule(ch, a, field(nh, 14, expr.CmpOpEq, make([]byte, 4)), accept) // probe (RFC 5227)
	b.rule(ch, a, inSet(nh, 14, 4, v4, true), drop)                     // sender IP
	b.rule(ch, a, accept)

	// A DHCP client asks before it has an address.
	b.rule(ch, ip4, field(nh, 12, expr.CmpOpEq, make([]byte, 4)), udpPorts(68, 67), accept)
	b.rule(ch, ip4, inSet(nh, 12, 4, v4, true), drop)
	b.rule(ch, ip4, udpPorts(67, 68), drop)
	b.rule(ch, ip4, accept)

	// Duplicate address detection, router solicitation and MLD reports
	// come from :: before the port has an address.
	for _, t := range []uint8{133, 135, 143} {
		b.rule(ch, ip6, field(nh, 8, expr.CmpOpEq, make([]byte, 16)), icmp6Type(t), accept)
	}
	b.rule(ch, ip6, inSet(nh, 8, 16, v6, true), drop)
	b.rule(ch, ip6, icmp6Type(134), drop) // router advertisement
	b.rule(ch, ip6, icmp6Type(137), drop) // redirect
	// A neighbour advertisement speaks only for the port's addresses.
	b.rule(ch, ip6, icmp6Type(136), inSet(th, 8, 16, v6, true), drop)
	b.rule(ch, ip6, udpPorts(547, 546), drop)
	b.rule(ch, ip6, accept)

	b.rule(ch, drop) // other ethertypes (VLAN tags among them)
}
