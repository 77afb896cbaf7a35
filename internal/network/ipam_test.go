package network

import (
	"net/netip"
	"testing"
)

func TestRandomInPools(t *testing.T) {
	tests := []struct {
		name   string
		pools  []pool
		random bool
	}{
		{"small pool is scanned", []pool{{Start: "10.0.0.2", End: "10.0.0.30"}}, false},
		{"a /24 is probed", []pool{{Start: "10.0.0.2", End: "10.0.0.254"}}, true},
		{"two pools add up", []pool{{Start: "10.0.0.2", End: "10.0.0.40"}, {Start: "10.0.1.2", End: "10.0.1.40"}}, true},
		{"IPv6 /64", []pool{{Start: "fd00::2", End: "fd00::ffff:ffff:ffff:ffff"}}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &subnetRow{Pools: tt.pools}
			for range 200 {
				ip, ok := randomInPools(s)
				if ok != tt.random {
					t.Fatalf("random = %v, want %v", ok, tt.random)
				}
				if !ok {
					return
				}
				a := netip.MustParseAddr(ip)
				in := false
				for _, p := range tt.pools {
					if !a.Less(netip.MustParseAddr(p.Start)) && !netip.MustParseAddr(p.End).Less(a) {
						in = true
					}
				}
				if !in {
					t.Fatalf("%s is outside the pools %v", ip, tt.pools)
				}
			}
		})
	}
}
