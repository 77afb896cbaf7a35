package netplane

import (
	"bytes"
	"errors"
	"net/netip"
	"reflect"
	"testing"
)

// decodeClasslessRoutes is option 121's inverse, to check what a client
// reads from it.
func decodeClasslessRoutes(b []byte) ([]classlessRoute, error) {
	var out []classlessRoute
	for len(b) > 0 {
		bits := int(b[0])
		n := (bits + 7) / 8
		if bits > 32 || len(b) < 1+n+4 {
			return nil, errDHCPMalformed
		}
		var dst [4]byte
		copy(dst[:], b[1:1+n])
		out = append(out, classlessRoute{
			Dst:     netip.PrefixFrom(netip.AddrFrom4(dst), bits),
			NextHop: netip.AddrFrom4([4]byte(b[1+n : 5+n])),
		})
		b = b[5+n:]
	}
	return out, nil
}

// RFC 3442 §3's examples, each via router 10.0.0.1.
func TestClasslessRoutesRFC3442(t *testing.T) {
	hop := []byte{10, 0, 0, 1}
	for _, c := range []struct {
		dst  string
		want []byte
	}{
		{"0.0.0.0/0", []byte{0}},
		{"10.0.0.0/8", []byte{8, 10}},
		{"10.0.0.0/16", []byte{16, 10, 0}},
		{"10.17.0.0/16", []byte{16, 10, 17}},
		{"10.27.129.0/24", []byte{24, 10, 27, 129}},
		{"10.229.0.128/25", []byte{25, 10, 229, 0, 128}},
		{"10.198.122.47/32", []byte{32, 10, 198, 122, 47}},
	} {
		r := classlessRoute{Dst: netip.MustParsePrefix(c.dst), NextHop: netip.MustParseAddr("10.0.0.1")}
		got := optClasslessRoutes([]classlessRoute{r})
		want := append(append([]byte{}, c.want...), hop...)
		if !bytes.Equal(got, want) {
			t.Errorf("%s: encoded %v, want %v", c.dst, got, want)
		}
		back, err := decodeClasslessRoutes(got)
		if err != nil || len(back) != 1 || back[0] != r {
			t.Errorf("%s: decoded %v, %v", c.dst, back, err)
		}
	}
	// Several routes follow one another.
	rs := []classlessRoute{
		{netip.MustParsePrefix("169.254.169.254/32"), netip.MustParseAddr("10.0.0.2")},
		{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParseAddr("10.0.0.1")},
	}
	want := []byte{32, 169, 254, 169, 254, 10, 0, 0, 2, 0, 10, 0, 0, 1}
	if got := optClasslessRoutes(rs); !bytes.Equal(got, want) {
		t.Errorf("two routes: %v, want %v", got, want)
	}
}

func sampleMessage() *dhcpMessage {
	m := &dhcpMessage{
		Op: bootReply, HType: 1, HLen: 6, Hops: 1, XID: 0xdeadbeef, Secs: 3, Flags: flagBroadcast,
		CIAddr: netip.MustParseAddr("10.0.0.9"), YIAddr: netip.MustParseAddr("10.0.0.5"),
		SIAddr: netip.MustParseAddr("10.0.0.2"), GIAddr: netip.IPv4Unspecified(),
		Options: map[byte][]byte{
			optMessageType: {dhcpAck},
			optSubnetMask:  {255, 255, 255, 0},
			optHostname:    []byte("vm-1"),
			optLeaseTime:   optU32(600),
			optMTU:         optU16(1450),
			// Longer than one option can hold: split, then joined.
			optClasslessRoute: bytes.Repeat([]byte{24, 10, 1, 2, 10, 0, 0, 1}, 40),
		},
	}
	copy(m.CHAddr[:], []byte{0xfa, 0x16, 0x3e, 1, 2, 3})
	copy(m.SName[:], "server")
	copy(m.File[:], "boot")
	return m
}

func TestDHCPRoundTrip(t *testing.T) {
	m := sampleMessage()
	b := m.encode()
	if len(b) < dhcpPadTo {
		t.Fatalf("message of %d bytes, want at least %d", len(b), dhcpPadTo)
	}
	if b[240] != optMessageType {
		t.Errorf("first option %d, want the message type", b[240])
	}
	got, err := decodeDHCP(b)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, m) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, m)
	}
	if got.msgType() != dhcpAck || got.mac().String() != "fa:16:3e:01:02:03" {
		t.Errorf("type %d mac %s", got.msgType(), got.mac())
	}
}

// A wire form from outside: options split across two instances (RFC
// 3396), pads between options, no end option.
func TestDHCPDecodeOptions(t *testing.T) {
	b := make([]byte, dhcpMinLen)
	b[0], b[1], b[2] = bootRequest, 1, 6
	copy(b[236:], dhcpMagic[:])
	b = append(b, optMessageType, 1, dhcpDiscover, optPad, optPad,
		optHostname, 2, 'a', 'b', optRequestedIP, 4, 10, 0, 0, 5, optHostname, 1, 'c')
	m, err := decodeDHCP(b)
	if err != nil {
		t.Fatal(err)
	}
	if string(m.Options[optHostname]) != "abc" || m.msgType() != dhcpDiscover {
		t.Errorf("options %v", m.Options)
	}
	if a, ok := m.optAddr(optRequestedIP); !ok || a != netip.MustParseAddr("10.0.0.5") {
		t.Errorf("requested IP %v %v", a, ok)
	}
}

func TestDHCPDecodeMalformed(t *testing.T) {
	good := sampleMessage().encode()
	noCookie := bytes.Clone(good)
	noCookie[237] = 0
	truncated := bytes.Clone(good[:dhcpMinLen])
	truncated = append(truncated, optHostname, 10, 'a')
	noLen := append(bytes.Clone(good[:dhcpMinLen]), optHostname)
	for name, b := range map[string][]byte{
		"empty":                 nil,
		"short header":          good[:100],
		"no cookie":             noCookie,
		"option past end":       truncated,
		"option without length": noLen,
	} {
		if _, err := decodeDHCP(b); !errors.Is(err, errDHCPMalformed) {
			t.Errorf("%s: %v, want errDHCPMalformed", name, err)
		}
	}
}

// FuzzDecode: the decoder never panics, and what it accepts encodes to
// a message that decodes the same.
func FuzzDecode(f *testing.F) {
	f.Add(sampleMessage().encode())
	f.Add(make([]byte, dhcpMinLen))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := decodeDHCP(b)
		if err != nil {
			return
		}
		_ = dhcpReply(m, map[string]*dhcpLease{testMAC: testLease(), "fa:16:3e:01:02:03": testLease()})
		again, err := decodeDHCP(m.encode())
		if err != nil {
			t.Fatalf("re-decode: %v", err)
		}
		if !reflect.DeepEqual(normalised(again), normalised(m)) {
			t.Fatalf("round trip:\n got %+v\nwant %+v", again, m)
		}
	})
}

// normalised drops empty option values, which encode as length 0 and
// decode as nil either way.
func normalised(m *dhcpMessage) *dhcpMessage {
	c := *m
	c.Options = map[byte][]byte{}
	for k, v := range m.Options {
		if len(v) == 0 {
			v = nil
		}
		c.Options[k] = v
	}
	return &c
}
