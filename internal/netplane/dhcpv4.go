package netplane

import (
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"slices"
)

// A DHCPv4 message (RFC 2131 §2): the fixed BOOTP header, the magic
// cookie, then options (RFC 2132).
const (
	dhcpHeaderLen = 236
	dhcpMinLen    = dhcpHeaderLen + 4 // with the magic cookie
	// dhcpPadTo is the smallest message sent: BOOTP's 300 bytes, which
	// some clients and relays still expect.
	dhcpPadTo = 300
)

var dhcpMagic = [4]byte{99, 130, 83, 99}

// BOOTP op codes.
const (
	bootRequest = 1
	bootReply   = 2
)

// DHCP message types (option 53).
const (
	dhcpDiscover = 1
	dhcpOffer    = 2
	dhcpRequest  = 3
	dhcpDecline  = 4
	dhcpAck      = 5
	dhcpNak      = 6
	dhcpRelease  = 7
	dhcpInform   = 8
)

// Option codes used here (RFC 2132, RFC 3442).
const (
	optPad            = 0
	optSubnetMask     = 1
	optRouter         = 3
	optDNS            = 6
	optHostname       = 12
	optMTU            = 26
	optRequestedIP    = 50
	optLeaseTime      = 51
	optMessageType    = 53
	optServerID       = 54
	optMessage        = 56
	optRenewalTime    = 58
	optRebindingTime  = 59
	optClasslessRoute = 121
	optEnd            = 255
)

// dhcpMessage is a decoded DHCPv4 message. Options repeated in the wire
// form are joined (RFC 3396), so each code holds its whole value.
type dhcpMessage struct {
	Op, HType, HLen, Hops byte
	XID                   uint32
	Secs, Flags           uint16
	// Addresses are always IPv4 (0.0.0.0 when unset).
	CIAddr, YIAddr, SIAddr, GIAddr netip.Addr
	CHAddr                         [16]byte
	SName                          [64]byte
	File                           [128]byte
	Options                        map[byte][]byte
}

// flagBroadcast is the client's request for broadcast replies.
const flagBroadcast = 0x8000

var errDHCPMalformed = errors.New("dhcp: malformed message")

// decodeDHCP parses a DHCPv4 message; anything short, without the
// cookie or with a truncated option is refused.
func decodeDHCP(b []byte) (*dhcpMessage, error) {
	if len(b) < dhcpMinLen || [4]byte(b[236:240]) != dhcpMagic {
		return nil, errDHCPMalformed
	}
	m := &dhcpMessage{
		Op: b[0], HType: b[1], HLen: b[2], Hops: b[3],
		XID:    binary.BigEndian.Uint32(b[4:]),
		Secs:   binary.BigEndian.Uint16(b[8:]),
		Flags:  binary.BigEndian.Uint16(b[10:]),
		CIAddr: netip.AddrFrom4([4]byte(b[12:16])),
		YIAddr: netip.AddrFrom4([4]byte(b[16:20])),
		SIAddr: netip.AddrFrom4([4]byte(b[20:24])),
		GIAddr: netip.AddrFrom4([4]byte(b[24:28])),
	}
	copy(m.CHAddr[:], b[28:44])
	copy(m.SName[:], b[44:108])
	copy(m.File[:], b[108:236])
	opts, err := decodeOptions(b[dhcpMinLen:])
	if err != nil {
		return nil, err
	}
	m.Options = opts
	return m, nil
}

func decodeOptions(b []byte) (map[byte][]byte, error) {
	opts := map[byte][]byte{}
	for len(b) > 0 {
		code := b[0]
		switch code {
		case optPad:
			b = b[1:]
			continue
		case optEnd:
			return opts, nil
		}
		if len(b) < 2 || len(b) < 2+int(b[1]) {
			return nil, errDHCPMalformed
		}
		n := int(b[1])
		opts[code] = append(opts[code], b[2:2+n]...)
		b = b[2+n:]
	}
	// A message without the end option is accepted, as most servers do.
	return opts, nil
}

// encode is the wire form of m: the message type first, other options by
// code, values longer than 255 bytes split (RFC 3396), padded to 300
// bytes.
func (m *dhcpMessage) encode() []byte {
	b := make([]byte, dhcpMinLen, 576)
	b[0], b[1], b[2], b[3] = m.Op, m.HType, m.HLen, m.Hops
	binary.BigEndian.PutUint32(b[4:], m.XID)
	binary.BigEndian.PutUint16(b[8:], m.Secs)
	binary.BigEndian.PutUint16(b[10:], m.Flags)
	for i, a := range []netip.Addr{m.CIAddr, m.YIAddr, m.SIAddr, m.GIAddr} {
		if a.Is4() {
			v := a.As4()
			copy(b[12+4*i:], v[:])
		}
	}
	copy(b[28:44], m.CHAddr[:])
	copy(b[44:108], m.SName[:])
	copy(b[108:236], m.File[:])
	copy(b[236:240], dhcpMagic[:])
	codes := make([]byte, 0, len(m.Options))
	for c := range m.Options {
		if c != optPad && c != optEnd {
			codes = append(codes, c)
		}
	}
	slices.SortFunc(codes, func(x, y byte) int {
		// The message type first: some clients look for it there.
		switch {
		case x == y:
			return 0
		case x == optMessageType:
			return -1
		case y == optMessageType:
			return 1
		}
		return int(x) - int(y)
	})
	for _, c := range codes {
		v := m.Options[c]
		for first := true; first || len(v) > 0; first = false {
			n := min(len(v), 255)
			b = append(b, c, byte(n))
			b = append(b, v[:n]...)
			v = v[n:]
		}
	}
	b = append(b, optEnd)
	for len(b) < dhcpPadTo {
		b = append(b, optPad)
	}
	return b
}

// msgType is the message's DHCP type (option 53), 0 for BOOTP.
func (m *dhcpMessage) msgType() byte {
	if v := m.Options[optMessageType]; len(v) == 1 {
		return v[0]
	}
	return 0
}

// optAddr is an option holding one IPv4 address.
func (m *dhcpMessage) optAddr(code byte) (netip.Addr, bool) {
	v := m.Options[code]
	if len(v) != 4 {
		return netip.Addr{}, false
	}
	return netip.AddrFrom4([4]byte(v)), true
}

// mac is the client's Ethernet address, nil for another hardware type.
func (m *dhcpMessage) mac() net.HardwareAddr {
	if m.HType != 1 || m.HLen != 6 {
		return nil
	}
	return net.HardwareAddr(m.CHAddr[:6])
}

func optAddrs(as ...netip.Addr) []byte {
	b := make([]byte, 0, 4*len(as))
	for _, a := range as {
		v := a.As4()
		b = append(b, v[:]...)
	}
	return b
}

func optU32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }

func optU16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }

// classlessRoute is one route of option 121.
type classlessRoute struct {
	Dst     netip.Prefix // IPv4, masked
	NextHop netip.Addr
}

// optClasslessRoutes encodes option 121 (RFC 3442 §3): per route the
// prefix length, the significant octets of the destination, the router.
func optClasslessRoutes(rs []classlessRoute) []byte {
	var b []byte
	for _, r := range rs {
		bits := r.Dst.Bits()
		dst := r.Dst.Masked().Addr().As4()
		b = append(b, byte(bits))
		b = append(b, dst[:(bits+7)/8]...)
		hop := r.NextHop.As4()
		b = append(b, hop[:]...)
	}
	return b
}
