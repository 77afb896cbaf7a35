package network

import (
	"strings"
	"testing"
)

func TestProviderSubnet(t *testing.T) {
	tests := []struct {
		name      string
		p         Provider
		cidr, gw  string
		pools     []pool
		wantError string
	}{
		{"default", Provider{}, PublicCIDR, "203.0.113.1", []pool{{"203.0.113.10", "203.0.113.250"}}, ""},
		{"default spelled out", DefaultProvider, PublicCIDR, "203.0.113.1", []pool{{"203.0.113.10", "203.0.113.250"}}, ""},
		{"whole subnet, gateway first", Provider{CIDR: "198.51.100.0/24", Gateway: "198.51.100.1"}, "198.51.100.0/24", "198.51.100.1",
			[]pool{{"198.51.100.2", "198.51.100.254"}}, ""},
		{"gateway in the middle", Provider{CIDR: "198.51.100.0/29", Gateway: "198.51.100.3"}, "198.51.100.0/29", "198.51.100.3",
			[]pool{{"198.51.100.1", "198.51.100.2"}, {"198.51.100.4", "198.51.100.6"}}, ""},
		{"host bits masked", Provider{CIDR: "198.51.100.7/24", Gateway: "198.51.100.254"}, "198.51.100.0/24", "198.51.100.254",
			[]pool{{"198.51.100.1", "198.51.100.253"}}, ""},
		{"pools given", Provider{CIDR: "198.51.100.0/24", Gateway: "198.51.100.1", Pools: []string{"198.51.100.100-198.51.100.199", " 198.51.100.200 - 198.51.100.201"}},
			"198.51.100.0/24", "198.51.100.1", []pool{{"198.51.100.100", "198.51.100.199"}, {"198.51.100.200", "198.51.100.201"}}, ""},
		{"IPv6", Provider{CIDR: "2001:db8::/64", Gateway: "2001:db8::1"}, "", "", nil, "not an IPv4 CIDR"},
		{"too small", Provider{CIDR: "198.51.100.0/31", Gateway: "198.51.100.0"}, "", "", nil, "not an IPv4 CIDR"},
		{"gateway outside", Provider{CIDR: "198.51.100.0/24", Gateway: "192.0.2.1"}, "", "", nil, "gateway"},
		{"pool outside", Provider{CIDR: "198.51.100.0/24", Gateway: "198.51.100.1", Pools: []string{"198.51.100.10-198.51.101.10"}}, "", "", nil, "pool"},
		{"pool reversed", Provider{CIDR: "198.51.100.0/24", Gateway: "198.51.100.1", Pools: []string{"198.51.100.20-198.51.100.10"}}, "", "", nil, "pool"},
		{"pool over the gateway", Provider{CIDR: "198.51.100.0/24", Gateway: "198.51.100.1", Pools: []string{"198.51.100.1-198.51.100.10"}}, "", "", nil, "pool"},
		{"pool not a range", Provider{CIDR: "198.51.100.0/24", Gateway: "198.51.100.1", Pools: []string{"198.51.100.10"}}, "", "", nil, "pool"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cidr, gw, pools, err := tc.p.subnet()
			if tc.wantError != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantError) {
					t.Fatalf("got %v, want an error with %q", err, tc.wantError)
				}
				return
			}
			if err != nil || cidr != tc.cidr || gw != tc.gw || !samePools(pools, tc.pools) {
				t.Fatalf("got %s %s %v %v, want %s %s %v", cidr, gw, pools, err, tc.cidr, tc.gw, tc.pools)
			}
		})
	}
}
