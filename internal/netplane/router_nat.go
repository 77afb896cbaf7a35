package netplane

import (
	"net/netip"
	"reflect"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// natTable is the table a router namespace's NAT lives in (family ip).
const natTable = "nimbus"

// ipsDstNAT is conntrack's IPS_DST_NAT status bit: the connection was
// DNATed (a floating IP's).
const ipsDstNAT = 1 << 5

// natPlan is a router's NAT: 1:1 for floating IPs, the subnets' SNAT to
// the gateway IP, and nothing between the router's own subnets.
type natPlan struct {
	gwDev   string // the gateway's device; "" for a router without one
	gwIP    netip.Addr
	snat    bool
	subnets []netip.Prefix // the router's IPv4 subnets
	fips    []fipNAT
}

type fipNAT struct{ floating, fixed netip.Addr }

// syncNAT writes p into the namespace at path unless it is what the
// namespace already has, then drops the tracked connections that p no
// longer explains (a floating IP moved or gone).
func (r *routers) syncNAT(path string, rh *netlink.Handle, ns string, p natPlan) error {
	prev, known := r.nat[ns]
	if known && reflect.DeepEqual(prev, p) && hasNATTable(path) {
		return nil
	}
	if err := inNS(path, func() error { return writeNAT(p) }); err != nil {
		return err
	}
	r.nat[ns] = p
	if _, err := rh.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET, staleFIPFlows(prev, p)); err != nil {
		r.log().Warn("netplane: flush conntrack", "router", ns, "err", err)
	}
	return nil
}

func hasNATTable(path string) bool {
	found := false
	_ = inNS(path, func() error {
		c, err := nftables.New()
		if err != nil {
			return err
		}
		_, err = c.ListTableOfFamily(natTable, nftables.TableFamilyIPv4)
		found = err == nil
		return nil
	})
	return found
}

// writeNAT replaces the namespace's NAT table with p in one transaction:
// a table is added (so that deleting it cannot fail), deleted and made
// anew, so that no packet ever sees half a rule set.
func writeNAT(p natPlan) error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	t := &nftables.Table{Name: natTable, Family: nftables.TableFamilyIPv4}
	c.AddTable(t)
	c.DelTable(t)
	c.AddTable(t)
	pre := c.AddChain(&nftables.Chain{Name: "prerouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest})
	post := c.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	accept := nftables.ChainPolicyAccept
	fwd := c.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	add := func(ch *nftables.Chain, e ...[]expr.Any) {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: slices.Concat(e...)})
	}
	if p.gwDev == "" {
		return c.Flush()
	}
	for _, f := range p.fips {
		add(pre, natAddr(16, netip.PrefixFrom(f.floating, 32)), natTo(expr.NATTypeDestNAT, f.fixed))
		add(post, natIf(expr.MetaKeyOIFNAME, p.gwDev, expr.CmpOpEq),
			natAddr(12, netip.PrefixFrom(f.fixed, 32)), natTo(expr.NATTypeSourceNAT, f.floating))
	}
	for _, s := range p.subnets {
		// A guest reaching a floating IP of its own router (hairpin) is
		// answered through the router, not straight from its neighbour.
		add(post, natIf(expr.MetaKeyOIFNAME, p.gwDev, expr.CmpOpNeq), natAddr(12, s),
			natCt(expr.CtKeySTATUS, ipsDstNAT), natTo(expr.NATTypeSourceNAT, p.gwIP))
		if p.snat {
			add(post, natIf(expr.MetaKeyOIFNAME, p.gwDev, expr.CmpOpEq), natAddr(12, s),
				natTo(expr.NATTypeSourceNAT, p.gwIP))
		}
	}
	if p.snat {
		// Behind SNAT the fixed IPs are private: the provider network
		// reaches them only through a floating IP or a reply. Without
		// SNAT the router routes, as Neutron's does.
		in := natIf(expr.MetaKeyIIFNAME, p.gwDev, expr.CmpOpEq)
		add(fwd, in, natCt(expr.CtKeySTATE, expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), natVerdict(expr.VerdictAccept))
		add(fwd, in, natCt(expr.CtKeySTATUS, ipsDstNAT), natVerdict(expr.VerdictAccept))
		add(fwd, in, natVerdict(expr.VerdictDrop))
	}
	return c.Flush()
}

// natIf compares the input or output interface name with name.
func natIf(key expr.MetaKey, name string, op expr.CmpOp) []expr.Any {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: op, Register: 1, Data: b},
	}
}

// natAddr matches the IPv4 header's source (offset 12) or destination
// (16) against p.
func natAddr(offset uint32, p netip.Prefix) []expr.Any {
	e := []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4}}
	if p.Bits() < 32 {
		e = append(e, &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: prefixNet(p).Mask, Xor: make([]byte, 4)})
	}
	a := p.Masked().Addr().As4()
	return append(e, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: a[:]})
}

// natCt matches a conntrack state or status having any of bits.
func natCt(key expr.CtKey, bits uint32) []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: key},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(bits), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
	}
}

func natTo(t expr.NATType, to netip.Addr) []expr.Any {
	a := to.As4()
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: a[:]},
		&expr.NAT{Type: t, Family: unix.NFPROTO_IPV4, RegAddrMin: 1},
	}
}

func natVerdict(k expr.VerdictKind) []expr.Any { return []expr.Any{&expr.Verdict{Kind: k}} }

// fipFlows matches the tracked connections through a floating IP whose
// inside end is no longer that IP's fixed IP: after a move they would go
// on reaching the old server until they time out.
type fipFlows struct{ cur, all map[netip.Addr]netip.Addr }

func staleFIPFlows(prev, cur natPlan) fipFlows {
	f := fipFlows{cur: map[netip.Addr]netip.Addr{}, all: map[netip.Addr]netip.Addr{}}
	for _, x := range prev.fips {
		f.all[x.floating] = x.fixed
	}
	for _, x := range cur.fips {
		f.cur[x.floating], f.all[x.floating] = x.fixed, x.fixed
	}
	return f
}

func (f fipFlows) MatchConntrackFlow(fl *netlink.ConntrackFlow) bool {
	ip := func(b []byte) netip.Addr { a, _ := netip.AddrFromSlice(b); return a.Unmap() }
	// Inbound: sent to the floating IP, answered by the inside end.
	if fip := ip(fl.Forward.DstIP); f.all[fip].IsValid() {
		fixed, ok := f.cur[fip]
		return !ok || ip(fl.Reverse.SrcIP) != fixed
	}
	// Outbound: sent by the inside end, answered to the floating IP.
	if fip := ip(fl.Reverse.DstIP); f.all[fip].IsValid() {
		fixed, ok := f.cur[fip]
		return !ok || ip(fl.Forward.SrcIP) != fixed
	}
	return false
}
