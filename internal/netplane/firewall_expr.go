package netplane

import (
	"encoding/binary"
	"net"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Small builders for the nftables expressions the firewall uses. Each
// returns the expressions of one match; a rule is their concatenation
// followed by a verdict. Everything loads into register 1.

// Ethernet types as they appear on the wire.
const (
	etherIPv4 = 0x0800
	etherARP  = 0x0806
	etherIPv6 = 0x86dd
)

// ifname is an interface name as the kernel compares it: NUL-padded to
// IFNAMSIZ, so that "tap1" does not match "tap12".
func ifname(name string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return b
}

// ifPrefix matches the input (or output) interface by name prefix.
func ifPrefix(key expr.MetaKey, prefix string) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte(prefix)},
	}
}

// etherType matches the frame's type field (bridge family), VLAN tags
// included, so a tagged frame never passes for an untagged one.
func etherType(t uint16) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseLLHeader, Offset: 12, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: be16(t)},
	}
}

// load puts len bytes at offset of a header into register 1.
func load(base expr.PayloadBase, offset, n uint32) *expr.Payload {
	return &expr.Payload{DestRegister: 1, Base: base, Offset: offset, Len: n}
}

// field compares n bytes at offset of a header with data.
func field(base expr.PayloadBase, offset uint32, op expr.CmpOp, data []byte) []expr.Any {
	return []expr.Any{load(base, offset, uint32(len(data))), &expr.Cmp{Op: op, Register: 1, Data: data}}
}

// inSet looks n bytes at offset of a header up in set s; invert matches
// when they are not in it.
func inSet(base expr.PayloadBase, offset, n uint32, s *nftables.Set, invert bool) []expr.Any {
	return []expr.Any{
		load(base, offset, n),
		&expr.Lookup{SourceRegister: 1, SetName: s.Name, SetID: s.ID, Invert: invert},
	}
}

// l4 matches the transport protocol (set only for IPv4/IPv6 packets).
func l4(proto uint8) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
	}
}

// udpPorts matches a UDP packet from port sport to port dport.
func udpPorts(sport, dport uint16) []expr.Any {
	return cat(l4(unix.IPPROTO_UDP),
		field(expr.PayloadBaseTransportHeader, 0, expr.CmpOpEq, be16(sport)),
		field(expr.PayloadBaseTransportHeader, 2, expr.CmpOpEq, be16(dport)))
}

// icmp6Type matches an ICMPv6 message of type t.
func icmp6Type(t uint8) []expr.Any {
	return cat(l4(unix.IPPROTO_ICMPV6), field(expr.PayloadBaseTransportHeader, 0, expr.CmpOpEq, []byte{t}))
}

// portRange matches a TCP/UDP/SCTP destination port in [lo, hi].
func portRange(lo, hi uint16) []expr.Any {
	if lo == hi {
		return field(expr.PayloadBaseTransportHeader, 2, expr.CmpOpEq, be16(lo))
	}
	return []expr.Any{
		load(expr.PayloadBaseTransportHeader, 2, 2),
		&expr.Range{Op: expr.CmpOpEq, Register: 1, FromData: be16(lo), ToData: be16(hi)},
	}
}

// markBit matches packets whose meta mark has bit set.
func markBit(bit uint32) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: ne32(bit), Xor: ne32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: ne32(0)},
	}
}

// setMarkBit sets (on) or clears bit in the meta mark, keeping the rest
// of the mark for whoever else uses it.
func setMarkBit(bit uint32, on bool) []expr.Any {
	xor := uint32(0)
	if on {
		xor = bit
	}
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: ne32(^bit), Xor: ne32(xor)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1},
	}
}

func verdict(k expr.VerdictKind) []expr.Any { return []expr.Any{&expr.Verdict{Kind: k}} }

func jump(chain string) []expr.Any {
	return []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: chain}}
}

func cat(parts ...[]expr.Any) []expr.Any { return slices.Concat(parts...) }

func be16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }

// ne16 is a 16-bit value in host order, as the kernel loads a ct zone.
func ne16(v uint16) []byte { return binary.NativeEndian.AppendUint16(nil, v) }

// ne32 is a 32-bit value in host order, as meta mark is kept.
func ne32(v uint32) []byte { return binary.NativeEndian.AppendUint32(nil, v) }

// intervalElems encodes prefixes of one family as the elements of an
// interval set: overlapping and adjacent ones merged (the kernel refuses
// overlaps), each range as its first address and the address after its
// last, flagged as the interval's end.
func intervalElems(ps []netip.Prefix) []nftables.SetElement {
	type span struct{ lo, hi netip.Addr }
	spans := make([]span, 0, len(ps))
	for _, p := range ps {
		p = p.Masked()
		spans = append(spans, span{p.Addr(), lastAddr(p)})
	}
	slices.SortFunc(spans, func(a, b span) int { return a.lo.Compare(b.lo) })
	var merged []span
	for _, s := range spans {
		if n := len(merged); n > 0 {
			last := &merged[n-1]
			if next := last.hi.Next(); !next.IsValid() || s.lo.Compare(next) <= 0 {
				if s.hi.Compare(last.hi) > 0 {
					last.hi = s.hi
				}
				continue
			}
		}
		merged = append(merged, s)
	}
	var out []nftables.SetElement
	for _, s := range merged {
		out = append(out, nftables.SetElement{Key: s.lo.AsSlice()})
		if end := s.hi.Next(); end.IsValid() {
			out = append(out, nftables.SetElement{Key: end.AsSlice(), IntervalEnd: true})
		}
	}
	return out
}

// lastAddr is the highest address of prefix p.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// linkLocal is the EUI-64 IPv6 link-local address a guest forms from
// mac, the one Neutron lets a port send from.
func linkLocal(mac net.HardwareAddr) netip.Addr {
	var b [16]byte
	b[0], b[1] = 0xfe, 0x80
	b[8], b[9], b[10] = mac[0]^0x02, mac[1], mac[2]
	b[11], b[12] = 0xff, 0xfe
	b[13], b[14], b[15] = mac[3], mac[4], mac[5]
	return netip.AddrFrom16(b)
}
