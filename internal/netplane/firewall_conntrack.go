package netplane

import (
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"nimbus/internal/netstate"
)

// A connection a rule let in stays established after the rule goes: the
// kernel keeps its conntrack entry and the ports' chains accept it on
// the established mark. So after a ruleset changes, every tracked
// connection of a stateful secured port is checked against the new
// rules, as if it were opened now, and forgotten when they no longer
// allow it; its next packet is then new, and dropped.

// revokeConnections deletes the host's conntrack entries that rs no
// longer allows.
func revokeConnections(nsPath string, rs *fwRuleset) error {
	h, err := nsHandle(nsPath)
	if err != nil {
		return err
	}
	defer h.Close()
	f := newRevoker(rs)
	for _, fam := range []netlink.InetFamily{unix.AF_INET, unix.AF_INET6} {
		if _, err := h.ConntrackDeleteFilters(netlink.ConntrackTable, fam, f); err != nil {
			return fmt.Errorf("netplane: firewall: revoke connections: %w", err)
		}
	}
	return nil
}

// revoker matches the conntrack entries rs does not allow.
type revoker struct {
	rs     *fwRuleset
	groups map[string]*fwGroup
	// ports are the stateful secured ports by their network's zone.
	ports map[uint16][]*fwPort
}

func newRevoker(rs *fwRuleset) *revoker {
	r := &revoker{rs: rs, groups: map[string]*fwGroup{}, ports: map[uint16][]*fwPort{}}
	for i := range rs.groups {
		r.groups[rs.groups[i].id] = &rs.groups[i]
	}
	for i := range rs.ports {
		p := &rs.ports[i]
		if p.stateful {
			z := rs.zones[netstate.BridgeName(p.network)]
			r.ports[z] = append(r.ports[z], p)
		}
	}
	return r
}

// MatchConntrackFlow reports whether flow is one that a secured port in
// its zone would refuse if it started now.
func (r *revoker) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	t := flow.Forward
	src, ok1 := netip.AddrFromSlice(t.SrcIP)
	dst, ok2 := netip.AddrFromSlice(t.DstIP)
	if !ok1 || !ok2 {
		return false
	}
	src, dst = src.Unmap(), dst.Unmap()
	for _, p := range r.ports[flow.Zone] {
		if p.owns(dst) && !r.allows(p, false, t.Protocol, t.DstPort, src) {
			return true
		}
		if p.owns(src) && !r.allows(p, true, t.Protocol, t.DstPort, dst) {
			return true
		}
	}
	return false
}

// allows reports whether one of port p's groups has a rule for a new
// connection in the direction given, to destination port dport, with
// peer at the other end. What it cannot judge from a conntrack entry
// (ICMP types) it allows.
func (r *revoker) allows(p *fwPort, egress bool, proto uint8, dport uint16, peer netip.Addr) bool {
	if proto == unix.IPPROTO_UDP && alwaysAllowedUDP(egress, dport) {
		return true
	}
	for _, id := range p.groups {
		g := r.groups[id]
		if g == nil {
			continue
		}
		rules := g.ingress
		if egress {
			rules = g.egress
		}
		for _, rule := range rules {
			if r.matches(rule, proto, dport, peer) {
				return true
			}
		}
	}
	return false
}

func (r *revoker) matches(rule fwRule, proto uint8, dport uint16, peer netip.Addr) bool {
	if peer.Is4() != (rule.ether == etherIPv4) {
		return false
	}
	if rule.proto >= 0 && rule.proto != int(proto) {
		return false
	}
	if rule.ports != nil && (dport < rule.ports[0] || dport > rule.ports[1]) {
		return false
	}
	if rule.remote.IsValid() && !rule.remote.Contains(peer) {
		return false
	}
	if rule.group != "" {
		m := r.rs.remotes[rule.group]
		ps := m.v4
		if peer.Is6() {
			ps = m.v6
		}
		return containsAddr(ps, peer)
	}
	return true
}

// owns reports whether a is one of the port's addresses.
func (p *fwPort) owns(a netip.Addr) bool {
	if a.Is4() {
		return containsAddr(p.addrs.v4, a)
	}
	return containsAddr(p.addrs.v6, a)
}

func containsAddr(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// alwaysAllowedUDP: DHCP and DHCPv6 requests, which pass whatever the
// groups say (replies come from the DHCP namespace, not through a flow
// the port's rules judge).
func alwaysAllowedUDP(egress bool, dport uint16) bool {
	return egress && (dport == 67 || dport == 547)
}
