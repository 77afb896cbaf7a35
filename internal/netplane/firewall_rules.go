package netplane

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"nimbus/internal/netstate"
)

// fwRuleset is a host's firewall compiled from its desired state: what
// program writes into the two tables.
type fwRuleset struct {
	// zones maps every network's bridge to the network's conntrack zone.
	zones map[string]uint16
	// tunnels and dhcps are the networks' VXLAN devices and DHCP veths,
	// which never forward to each other.
	tunnels, dhcps []string
	ports          []fwPort
	// groups are the security groups some secured port is in, with their
	// compiled rules.
	groups []fwGroup
	// remotes are the member addresses of every group a rule names as
	// its remote group.
	remotes map[string]*fwAddrs
	// skipped are rules that cannot be enforced, for the log.
	skipped []string
}

// fwPort is a server port with port security on.
type fwPort struct {
	tap      string
	network  string
	macs     []net.HardwareAddr
	addrs    fwAddrs // fixed IPs, allowed pairs, EUI-64 link-locals
	groups   []string
	stateful bool
}

type fwAddrs struct{ v4, v6 []netip.Prefix }

func (a *fwAddrs) add(p netip.Prefix) {
	if p.Addr().Is4() {
		a.v4 = append(a.v4, p)
	} else {
		a.v6 = append(a.v6, p)
	}
}

type fwGroup struct {
	id      string
	ingress []fwRule
	egress  []fwRule
}

// fwRule is one security group rule: the matches of its rule in nftables
// (the remote group's set is bound by name when programmed).
type fwRule struct {
	ether  uint16
	proto  int // -1: any
	ports  *[2]uint16
	icmp   *[2]int // type, code (-1: any)
	remote netip.Prefix
	group  string // remote group id
}

// compileFirewall checks st and turns it into the ruleset program writes.
func compileFirewall(st *netstate.Host) (*fwRuleset, error) {
	rs := &fwRuleset{zones: zonesOf(st), remotes: map[string]*fwAddrs{}}
	for _, n := range st.Networks {
		rs.tunnels = append(rs.tunnels, netstate.VXLANName(n.VNI))
		rs.dhcps = append(rs.dhcps, dhcpVethName(n.ID))
	}
	sgs := map[string]*netstate.SecurityGroup{}
	for i := range st.SecurityGroups {
		sgs[st.SecurityGroups[i].ID] = &st.SecurityGroups[i]
	}
	used := map[string]bool{}
	for _, p := range st.Ports {
		if !p.PortSecurity {
			continue
		}
		fp, err := compilePort(p, sgs)
		if err != nil {
			return nil, err
		}
		rs.ports = append(rs.ports, fp)
		for _, g := range fp.groups {
			used[g] = true
		}
	}
	for _, sg := range st.SecurityGroups {
		if !used[sg.ID] {
			continue
		}
		g := fwGroup{id: sg.ID}
		for _, r := range sg.Rules {
			fr, err := compileRule(r)
			if err != nil {
				rs.skipped = append(rs.skipped, fmt.Sprintf("group %s rule %s: %v", sg.ID, r.ID, err))
				continue
			}
			if fr.group != "" && rs.remotes[fr.group] == nil {
				rs.remotes[fr.group] = membersOf(sgs[fr.group])
			}
			if r.Direction == "egress" {
				g.egress = append(g.egress, fr)
			} else {
				g.ingress = append(g.ingress, fr)
			}
		}
		rs.groups = append(rs.groups, g)
	}
	return rs, nil
}

// zonesOf gives each network a conntrack zone derived from its VNI (so it
// stays the same from one apply to the next), probing past collisions in
// VNI order, and maps the network's bridge to it: br_netfilter hands
// bridged packets to the inet hooks with the bridge as their input
// device.
func zonesOf(st *netstate.Host) map[string]uint16 {
	nets := slices.Clone(st.Networks)
	slices.SortFunc(nets, func(a, b netstate.Network) int { return int(a.VNI) - int(b.VNI) })
	taken := map[uint16]bool{}
	out := map[string]uint16{}
	for _, n := range nets {
		z := uint16(n.VNI%65535) + 1
		for taken[z] {
			z = z%65535 + 1
		}
		taken[z] = true
		out[netstate.BridgeName(n.ID)] = z
	}
	return out
}

func compilePort(p netstate.Port, sgs map[string]*netstate.SecurityGroup) (fwPort, error) {
	fp := fwPort{tap: netstate.TapName(p.ID), network: p.NetworkID, groups: p.SecurityGroups, stateful: true}
	mac, err := net.ParseMAC(p.MAC)
	if err != nil {
		return fp, fmt.Errorf("netplane: firewall: port %s: bad MAC %q", p.ID, p.MAC)
	}
	fp.macs = []net.HardwareAddr{mac}
	for _, ip := range p.IPs {
		a, err := netip.ParseAddr(ip.IP)
		if err != nil {
			return fp, fmt.Errorf("netplane: firewall: port %s: %v", p.ID, err)
		}
		fp.addrs.add(netip.PrefixFrom(a, a.BitLen()))
	}
	for _, pair := range p.AllowedPairs {
		pfx, err := parsePrefix(pair.IP)
		if err != nil {
			return fp, fmt.Errorf("netplane: firewall: port %s: allowed address pair: %v", p.ID, err)
		}
		fp.addrs.add(pfx)
		if pair.MAC != "" {
			m, err := net.ParseMAC(pair.MAC)
			if err != nil {
				return fp, fmt.Errorf("netplane: firewall: port %s: allowed address pair MAC %q", p.ID, pair.MAC)
			}
			if !slices.ContainsFunc(fp.macs, func(x net.HardwareAddr) bool { return x.String() == m.String() }) {
				fp.macs = append(fp.macs, m)
			}
		}
	}
	for _, m := range fp.macs {
		fp.addrs.add(netip.PrefixFrom(linkLocal(m), 128))
	}
	// Neutron forbids mixing stateful and stateless groups on a port;
	// a port whose groups are all stateless is filtered without state.
	stateless := len(p.SecurityGroups) > 0
	for _, id := range p.SecurityGroups {
		if sg := sgs[id]; sg == nil || sg.Stateful {
			stateless = false
		}
	}
	fp.stateful = !stateless
	return fp, nil
}

// parsePrefix reads an address or a CIDR.
func parsePrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		return p.Masked(), err
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}

// membersOf is what remote_group_id matches; a group the state does not
// carry has no members.
func membersOf(sg *netstate.SecurityGroup) *fwAddrs {
	m := &fwAddrs{}
	if sg == nil {
		return m
	}
	for _, s := range sg.Members {
		if p, err := parsePrefix(s); err == nil {
			m.add(p)
		}
	}
	return m
}

// ipProtocols are the protocol names Neutron accepts, by number.
var ipProtocols = map[string]int{
	"ah": 51, "dccp": 33, "egp": 8, "esp": 50, "gre": 47, "icmp": 1,
	"icmpv6": 58, "igmp": 2, "ipip": 4, "ipv6-encap": 41, "ipv6-frag": 44,
	"ipv6-icmp": 58, "ipv6-nonxt": 59, "ipv6-opts": 60, "ipv6-route": 43,
	"ospf": 89, "pgm": 113, "rsvp": 46, "sctp": 132, "tcp": 6, "udp": 17,
	"udplite": 136, "vrrp": 112, "encap": 98,
}

func compileRule(r netstate.Rule) (fwRule, error) {
	fr := fwRule{proto: -1}
	switch r.Ethertype {
	case "IPv4", "":
		fr.ether = etherIPv4
	case "IPv6":
		fr.ether = etherIPv6
	default:
		return fr, fmt.Errorf("unknown ethertype %q", r.Ethertype)
	}
	switch p := strings.ToLower(r.Protocol); {
	case p == "" || p == "any":
	case ipProtocols[p] != 0:
		fr.proto = ipProtocols[p]
	default:
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 || n > 255 {
			return fr, fmt.Errorf("unknown protocol %q", r.Protocol)
		}
		fr.proto = n
	}
	// Neutron takes "icmp" (1) on an IPv6 rule for ICMPv6.
	if fr.ether == etherIPv6 && fr.proto == unix.IPPROTO_ICMP {
		fr.proto = unix.IPPROTO_ICMPV6
	}
	if err := fr.setPorts(r.PortMin, r.PortMax); err != nil {
		return fr, err
	}
	if r.RemoteIPPrefix != "" {
		p, err := parsePrefix(r.RemoteIPPrefix)
		if err != nil {
			return fr, err
		}
		if p.Addr().Is4() != (fr.ether == etherIPv4) {
			return fr, fmt.Errorf("remote prefix %s is not %s", r.RemoteIPPrefix, r.Ethertype)
		}
		fr.remote = p
	}
	fr.group = r.RemoteGroupID
	return fr, nil
}

// setPorts reads the port range (tcp, udp, sctp, udplite, dccp) or the
// ICMP type and code.
func (fr *fwRule) setPorts(lo, hi *int) error {
	val := func(p *int) int {
		if p == nil {
			return -1
		}
		return *p
	}
	first, last := val(lo), val(hi)
	switch fr.proto {
	case unix.IPPROTO_TCP, unix.IPPROTO_UDP, unix.IPPROTO_SCTP, unix.IPPROTO_UDPLITE, unix.IPPROTO_DCCP:
		if first <= 0 && last <= 0 {
			return nil
		}
		if first <= 0 {
			first = 1
		}
		if last <= 0 {
			last = first
		}
		if first > last || last > 65535 {
			return fmt.Errorf("bad port range %d-%d", first, last)
		}
		fr.ports = &[2]uint16{uint16(first), uint16(last)}
	case unix.IPPROTO_ICMP, unix.IPPROTO_ICMPV6:
		if first < 0 || first > 255 {
			return nil
		}
		if last > 255 {
			return fmt.Errorf("bad ICMP code %d", last)
		}
		fr.icmp = &[2]int{first, last}
	}
	return nil
}

// program queues the transaction that replaces both tables with rs. A
// table is added before it is deleted so that the deletion never fails
// on a host that has none yet.
func (rs *fwRuleset) program(c *nftables.Conn) {
	br := &nftables.Table{Family: nftables.TableFamilyBridge, Name: tableName}
	in := &nftables.Table{Family: nftables.TableFamilyINet, Name: tableName}
	for _, t := range []*nftables.Table{br, in} {
		c.AddTable(t)
		c.DelTable(t)
	}
	if len(rs.zones) == 0 && len(rs.ports) == 0 {
		return // nothing on the host: leave no table behind
	}
	ids := new(setIDs)
	c.AddTable(in)
	rs.programConntrack(c, in, ids)
	c.AddTable(br)
	b := &bridgeProgram{c: c, t: br, groups: map[string]bool{}, remote: map[string][2]*nftables.Set{},
		to: map[*nftables.Chain][]nftables.SetElement{}, setID: ids}
	b.bases(rs.tunnels, rs.dhcps)
	for id, m := range rs.remotes {
		b.remote[id] = [2]*nftables.Set{
			b.addrSet("r4-"+id, nftables.TypeIPAddr, m.v4),
			b.addrSet("r6-"+id, nftables.TypeIP6Addr, m.v6),
		}
	}
	for _, g := range rs.groups {
		b.group(g)
	}
	for _, p := range rs.ports {
		b.port(p)
	}
	b.dispatchRules()
}

// programConntrack writes the inet table: conntrack zones by bridge,
// then the established mark on bridged packets.
//
// Every IP packet the host receives or bridges passes these chains, so
// they are written for the per-packet cost: br_netfilter hands a bridged
// packet to them (and VXLAN's own UDP passes them once more, unbridged),
// and matching an interface name copies and hashes 16 bytes each time.
// The bridge's name is therefore looked up once per packet, in "zone",
// where the same rule clears the mark bit; "state" then finds a bridged
// packet by its conntrack zone (a 2-byte set, read only for established
// or related packets) instead of looking the name up again.
func (rs *fwRuleset) programConntrack(c *nftables.Conn, t *nftables.Table, ids *setIDs) {
	zoneType := nftables.TypeInteger
	zoneType.Bytes = 2
	zones := &nftables.Set{Table: t, ID: ids.next(), Name: "zones", IsMap: true,
		KeyType: nftables.TypeIFName, DataType: zoneType}
	ours := &nftables.Set{Table: t, ID: ids.next(), Name: "our-zones", KeyType: zoneType}
	var elems, zoneElems []nftables.SetElement
	for dev, z := range rs.zones {
		elems = append(elems, nftables.SetElement{Key: ifname(dev), Val: ne16(z)})
		zoneElems = append(zoneElems, nftables.SetElement{Key: ne16(z)})
	}
	_ = c.AddSet(zones, elems) // errors only for anonymous non-constant sets
	_ = c.AddSet(ours, zoneElems)
	raw := c.AddChain(&nftables.Chain{Table: t, Name: "zone", Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityRaw})
	// The bit is cleared first, on every packet of our bridges: nothing
	// from outside may bring it in.
	c.AddRule(&nftables.Rule{Table: t, Chain: raw, Exprs: cat([]expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Lookup{SourceRegister: 1, DestRegister: 1, IsDestRegSet: true, SetName: zones.Name, SetID: zones.ID},
		&expr.Ct{Key: expr.CtKeyZONE, Register: 1, SourceRegister: true},
	}, setMarkBit(markEstablished, false))})
	state := c.AddChain(&nftables.Chain{Table: t, Name: "state", Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityFilter})
	c.AddRule(&nftables.Rule{Table: t, Chain: state, Exprs: cat(
		[]expr.Any{
			&expr.Ct{Key: expr.CtKeySTATE, Register: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
				Mask: ne32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED), Xor: ne32(0)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: ne32(0)},
			// Only a bridged packet of ours has one of our zones; a
			// host's own connection is in zone 0 or the operator's.
			&expr.Ct{Key: expr.CtKeyZONE, Register: 1},
			&expr.Lookup{SourceRegister: 1, SetName: ours.Name, SetID: ours.ID},
		},
		setMarkBit(markEstablished, true))})
}

// setIDs numbers the sets of one transaction, where rules find them by
// ID. nftables numbers a set left without one from a package-wide
// counter that it does not lock, a data race between hosts (and parts)
// applying at once in one process.
type setIDs uint32

func (n *setIDs) next() uint32 {
	*n++
	return uint32(*n)
}
