package network

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"

	"nimbus/internal/store"
)

// Provider describes the provider network, where public addresses live:
// the operator gives it once (nimbus serve --public-cidr, --public-gateway,
// --public-pool) and the "public" network's subnet follows it.
type Provider struct {
	CIDR    string // e.g. 203.0.113.0/24
	Gateway string // the provider's router on it
	// Pools are the ranges given out as floating IPs and router gateways
	// ("start-end"); default: the CIDR less its network, gateway and
	// broadcast addresses.
	Pools []string
}

// DefaultProvider is the documentation range (RFC 5737) the public
// network uses until the operator names a real one.
var DefaultProvider = Provider{CIDR: PublicCIDR, Gateway: "203.0.113.1", Pools: []string{"203.0.113.10-203.0.113.250"}}

// SetProvider sets the provider network the public subnet follows from
// the next Bootstrap.
func (s *Service) SetProvider(p Provider) { s.provider = p }

// Check refuses a provider network that is not one IPv4 subnet with its
// gateway and pools inside.
func (p Provider) Check() error {
	_, _, _, err := p.subnet()
	return err
}

// subnet checks p and returns its subnet's CIDR, gateway and pools.
func (p Provider) subnet() (string, string, []pool, error) {
	if p.CIDR == "" || (p.CIDR == DefaultProvider.CIDR && p.Gateway == DefaultProvider.Gateway && len(p.Pools) == 0) {
		p = DefaultProvider
	}
	pfx, err := netip.ParsePrefix(p.CIDR)
	if err != nil || !pfx.Addr().Is4() || pfx.Bits() > 30 {
		return "", "", nil, fmt.Errorf("public network: %q is not an IPv4 CIDR of at least 4 addresses", p.CIDR)
	}
	pfx = pfx.Masked()
	gw, err := netip.ParseAddr(p.Gateway)
	if err != nil || !pfx.Contains(gw) {
		return "", "", nil, fmt.Errorf("public network: gateway %q is not an address in %s", p.Gateway, pfx)
	}
	var pools []pool
	for _, r := range p.Pools {
		a, b, ok := strings.Cut(r, "-")
		start, err1 := netip.ParseAddr(strings.TrimSpace(a))
		end, err2 := netip.ParseAddr(strings.TrimSpace(b))
		if !ok || err1 != nil || err2 != nil || !pfx.Contains(start) || !pfx.Contains(end) || end.Less(start) ||
			(!gw.Less(start) && !end.Less(gw)) {
			return "", "", nil, fmt.Errorf("public network: pool %q is not a range start-end in %s without the gateway %s", r, pfx, gw)
		}
		pools = append(pools, pool{start.String(), end.String()})
	}
	if len(pools) == 0 {
		// The whole subnet but its network, broadcast and gateway.
		first, last := pfx.Addr().Next(), lastAddr(pfx).Prev()
		switch {
		case gw == first:
			first = first.Next()
		case gw == last:
			last = last.Prev()
		}
		if gw.Less(last) && first.Less(gw) {
			pools = []pool{{first.String(), gw.Prev().String()}, {gw.Next().String(), last.String()}}
		} else {
			pools = []pool{{first.String(), last.String()}}
		}
	}
	return pfx.String(), gw.String(), pools, nil
}

// followProvider, in tx, moves the public subnet to the provider network
// the operator configured. It refuses while addresses outside the new
// range are in use, naming how many: nothing is renumbered behind a
// customer's back.
func followProvider(ctx context.Context, tx *store.Tx, sub *subnetRow, p Provider) error {
	cidr, gw, pools, err := p.subnet()
	if err != nil {
		return err
	}
	if sub.CIDR == cidr && sub.Gateway != nil && *sub.Gateway == gw && samePools(sub.Pools, pools) {
		return nil
	}
	pfx := netip.MustParsePrefix(cidr)
	rows, err := tx.Query(ctx, "SELECT ip_address FROM ip_allocations WHERE subnet_id = ?", sub.ID)
	if err != nil {
		return err
	}
	defer rows.Close()
	outside := 0
	for rows.Next() {
		var ip string
		if err := rows.Scan(&ip); err != nil {
			return err
		}
		if a, err := netip.ParseAddr(ip); err != nil || !pfx.Contains(a) {
			outside++
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if outside > 0 {
		return fmt.Errorf("public network: %d address(es) of %s are in use outside %s; release them (floating IPs, router gateways) before moving the provider network", outside, sub.CIDR, cidr)
	}
	pj, _ := json.Marshal(pools)
	_, err = tx.Exec(ctx, "UPDATE subnets SET cidr = ?, gateway_ip = ?, allocation_pools = ?, updated_at = ?, revision_number = revision_number + 1 WHERE id = ?",
		cidr, gw, string(pj), now(), sub.ID)
	return err
}

func samePools(a, b []pool) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
