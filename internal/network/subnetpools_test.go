package network

import (
	"fmt"
	"net/netip"
	"testing"
)

func prefixes(l ...string) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(l))
	for _, s := range l {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

// compact and difference are the netaddr IPSet operations neutron's
// subnet allocator relies on.
func TestPrefixSets(t *testing.T) {
	for _, c := range []struct {
		have, minus []string
		compact     string
		difference  string
	}{
		{[]string{"10.0.0.0/24", "10.0.1.0/24"}, nil, "[10.0.0.0/23]", "[10.0.0.0/23]"},
		{[]string{"10.0.1.0/24", "10.0.0.0/16", "192.168.0.0/24"}, []string{"10.0.0.0/24"},
			"[10.0.0.0/16 192.168.0.0/24]",
			"[10.0.1.0/24 10.0.2.0/23 10.0.4.0/22 10.0.8.0/21 10.0.16.0/20 10.0.32.0/19 10.0.64.0/18 10.0.128.0/17 192.168.0.0/24]"},
		{[]string{"10.0.0.0/24"}, []string{"10.0.0.64/26", "10.0.0.128/26"}, "[10.0.0.0/24]", "[10.0.0.0/26 10.0.0.192/26]"},
		{[]string{"10.0.0.0/24"}, []string{"10.0.0.0/16"}, "[10.0.0.0/24]", "[]"},
		{[]string{"10.0.0.1/32", "10.0.0.2/31", "10.0.0.4/32"}, nil, "[10.0.0.1/32 10.0.0.2/31 10.0.0.4/32]", "[10.0.0.1/32 10.0.0.2/31 10.0.0.4/32]"},
		{[]string{"0.0.0.0/1", "128.0.0.0/1"}, []string{"255.255.255.255/32"}, "[0.0.0.0/0]",
			"[0.0.0.0/1 128.0.0.0/2 192.0.0.0/3 224.0.0.0/4 240.0.0.0/5 248.0.0.0/6 252.0.0.0/7 254.0.0.0/8 255.0.0.0/9 255.128.0.0/10 255.192.0.0/11 255.224.0.0/12 255.240.0.0/13 255.248.0.0/14 255.252.0.0/15 255.254.0.0/16 255.255.0.0/17 255.255.128.0/18 255.255.192.0/19 255.255.224.0/20 255.255.240.0/21 255.255.248.0/22 255.255.252.0/23 255.255.254.0/24 255.255.255.0/25 255.255.255.128/26 255.255.255.192/27 255.255.255.224/28 255.255.255.240/29 255.255.255.248/30 255.255.255.252/31 255.255.255.254/32]"},
		{[]string{"fd00::/64", "fd00:0:0:1::/64"}, []string{"fd00::/65"}, "[fd00::/63]", "[fd00::8000:0:0:0/65 fd00:0:0:1::/64]"},
	} {
		if got := fmt.Sprint(compact(prefixes(c.have...))); got != c.compact {
			t.Errorf("compact(%v) = %s, want %s", c.have, got, c.compact)
		}
		if got := fmt.Sprint(difference(prefixes(c.have...), prefixes(c.minus...))); got != c.difference {
			t.Errorf("difference(%v, %v) = %s, want %s", c.have, c.minus, got, c.difference)
		}
	}
}
