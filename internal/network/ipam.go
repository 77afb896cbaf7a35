package network

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"net/netip"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// parseCIDR validates a subnet CIDR as neutron's validate_subnet does: it
// must be a network address of the right family
// (neutron_lib/api/validators/__init__.py validate_subnet).
func parseCIDR(s string, version int) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return p, nerr(400, "HTTPBadRequest", "Invalid input for cidr. Reason: '%s' is not a valid IP subnet.", s)
	}
	if p.Masked() != p {
		return p, nerr(400, "HTTPBadRequest", "Invalid input for cidr. Reason: '%s' isn't a recognized IP subnet cidr, '%s' is recommended.", s, p.Masked())
	}
	if (version == 4) != p.Addr().Is4() {
		return p, badInput("Cidr %s does not match the IP version %d.", s, version)
	}
	if p.Addr().Is4() && p.Bits() > 30 || p.Addr().Is6() && p.Bits() > 126 {
		return p, badInput("Subnet %s has no room for addresses.", s)
	}
	return p, nil
}

// lastAddr is the last address of a prefix.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	bits := p.Bits()
	for i := range b {
		for j := 0; j < 8; j++ {
			if i*8+j >= bits {
				b[i] |= 0x80 >> j
			}
		}
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// hostRange is the usable range of a subnet: without the network address,
// and for IPv4 without the broadcast address (neutron/ipam/utils.py
// generate_pools).
func hostRange(p netip.Prefix) (netip.Addr, netip.Addr) {
	first := p.Masked().Addr().Next()
	last := lastAddr(p)
	if p.Addr().Is4() {
		last = last.Prev()
	}
	return first, last
}

// defaultPools is the host range minus the gateway.
func defaultPools(p netip.Prefix, gw *netip.Addr) []pool {
	first, last := hostRange(p)
	if gw == nil || gw.Compare(first) < 0 || gw.Compare(last) > 0 {
		return []pool{{first.String(), last.String()}}
	}
	var out []pool
	if gw.Compare(first) > 0 {
		out = append(out, pool{first.String(), gw.Prev().String()})
	}
	if gw.Compare(last) < 0 {
		out = append(out, pool{gw.Next().String(), last.String()})
	}
	return out
}

// validatePools checks user-given pools: inside the subnet, ordered, not
// overlapping each other and not holding the gateway.
func validatePools(p netip.Prefix, pools []pool, gw *netip.Addr) error {
	type rng struct{ a, b netip.Addr }
	var rs []rng
	for _, pl := range pools {
		a, err1 := netip.ParseAddr(pl.Start)
		b, err2 := netip.ParseAddr(pl.End)
		if err1 != nil || err2 != nil || a.Is4() != p.Addr().Is4() {
			return nerr(400, "InvalidAllocationPool", "The allocation pool %s-%s is not valid.", pl.Start, pl.End)
		}
		if !p.Contains(a) || !p.Contains(b) {
			return nerr(400, "OutOfBoundsAllocationPool", "The allocation pool %s-%s spans beyond the subnet cidr %s.", pl.Start, pl.End, p)
		}
		if a.Compare(b) > 0 {
			return nerr(400, "InvalidAllocationPool", "The allocation pool %s-%s is not valid.", pl.Start, pl.End)
		}
		for _, r := range rs {
			if a.Compare(r.b) <= 0 && b.Compare(r.a) >= 0 {
				return nerr(400, "OverlappingAllocationPools", "Found overlapping allocation pools: %s-%s and %s-%s for subnet %s.", pl.Start, pl.End, r.a, r.b, p)
			}
		}
		rs = append(rs, rng{a, b})
		if gw != nil && gw.Compare(a) >= 0 && gw.Compare(b) <= 0 {
			return nerr(409, "GatewayConflictWithAllocationPools", "Gateway ip %s conflicts with allocation pool %s-%s.", gw, pl.Start, pl.End)
		}
	}
	return nil
}

// allocated returns the addresses in use on a subnet.
func allocated(ctx context.Context, q store.Querier, subnetID string) (map[string]bool, error) {
	rows, err := q.Query(ctx, "SELECT ip_address FROM ip_allocations WHERE subnet_id = ?", subnetID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	m := map[string]bool{}
	for rows.Next() {
		var ip string
		if err := rows.Scan(&ip); err != nil {
			return nil, err
		}
		m[ip] = true
	}
	return m, rows.Err()
}

var errExhausted = errors.New("subnet exhausted")

// nextFree finds the first free address in a subnet's pools, skipping
// the addresses in skip as well.
func nextFree(ctx context.Context, q store.Querier, s *subnetRow, skip map[string]bool) (string, error) {
	used, err := allocated(ctx, q, s.ID)
	if err != nil {
		return "", err
	}
	for _, pl := range s.Pools {
		a, err1 := netip.ParseAddr(pl.Start)
		b, err2 := netip.ParseAddr(pl.End)
		if err1 != nil || err2 != nil {
			continue
		}
		for x := a; x.IsValid() && x.Compare(b) <= 0; x = x.Next() {
			if s.Gateway != nil && x.String() == *s.Gateway {
				continue
			}
			if !used[x.String()] && !skip[x.String()] {
				return x.String(), nil
			}
		}
	}
	return "", errExhausted
}

// tryInsert records an allocation unless the address is taken; a
// concurrent transaction that took it first makes it report false rather
// than abort the caller's transaction.
func tryInsert(ctx context.Context, q store.Querier, f FixedIP, networkID, owner string, seq int) (bool, error) {
	res, err := q.Exec(ctx, `INSERT INTO ip_allocations (subnet_id, ip_address, network_id, owner_id, seq)
		VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING`, f.SubnetID, f.IPAddress, networkID, owner, seq)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

// claim takes a free address of a subnet for owner. Like neutron's IPAM
// (neutrondb_ipam driver _generate_ips picks at random) it first tries a few
// random addresses of the pools, so that allocation stays one insert however
// full a large subnet is; a small or nearly full subnet falls back to
// scanning for the first free address.
func claim(ctx context.Context, q store.Querier, s *subnetRow, networkID, owner string, seq int) (string, error) {
	for range 8 {
		ip, ok := randomInPools(s)
		if !ok {
			break
		}
		if s.Gateway != nil && ip == *s.Gateway {
			continue
		}
		took, err := tryInsert(ctx, q, FixedIP{SubnetID: s.ID, IPAddress: ip}, networkID, owner, seq)
		if err != nil || took {
			return ip, err
		}
	}
	skip := map[string]bool{}
	for range 64 {
		ip, err := nextFree(ctx, q, s, skip)
		if err != nil {
			return "", err
		}
		ok, err := tryInsert(ctx, q, FixedIP{SubnetID: s.ID, IPAddress: ip}, networkID, owner, seq)
		if err != nil || ok {
			return ip, err
		}
		skip[ip] = true
	}
	return "", errExhausted
}

func errNoMoreIPs(networkID string) *api.Error {
	return nerr(409, "IpAddressGenerationFailure", "No more IP addresses available on network %s.", networkID)
}

// ipRequest is one entry of a port's fixed_ips in a request.
type ipRequest struct {
	SubnetID  string `json:"subnet_id,omitempty"`
	IPAddress string `json:"ip_address,omitempty"`
}

// allocateIPs gives owner addresses on a network: the requested ones, or
// (auto with no request) one from the first subnet of each family with
// room, IPv4 first, as neutron's IPAM does for a port without fixed_ips.
func allocateIPs(ctx context.Context, q store.Querier, networkID, owner string, reqs []ipRequest, auto bool) ([]FixedIP, error) {
	subnets, err := loadSubnets(ctx, q, "network_id = ?", networkID)
	if err != nil {
		return nil, err
	}
	var out []FixedIP
	if auto && reqs == nil {
		for _, v := range []int{4, 6} {
			have, got := false, false
			for _, s := range subnets {
				if s.IPVersion != v {
					continue
				}
				have = true
				ip, err := claim(ctx, q, s, networkID, owner, len(out))
				if errors.Is(err, errExhausted) {
					continue
				}
				if err != nil {
					return nil, err
				}
				out = append(out, FixedIP{SubnetID: s.ID, IPAddress: ip})
				got = true
				break
			}
			if have && !got {
				return nil, errNoMoreIPs(networkID)
			}
		}
		return out, nil
	}
	for _, rq := range reqs {
		sub, ip, err := resolveRequest(networkID, subnets, rq)
		if err != nil {
			return nil, err
		}
		f := FixedIP{SubnetID: sub.ID, IPAddress: ip}
		if ip == "" {
			f.IPAddress, err = claim(ctx, q, sub, networkID, owner, len(out))
			if errors.Is(err, errExhausted) {
				return nil, errNoMoreIPs(networkID)
			}
			if err != nil {
				return nil, err
			}
		} else {
			ok, err := tryInsert(ctx, q, f, networkID, owner, len(out))
			if err != nil {
				return nil, err
			}
			if !ok {
				return nil, nerr(409, "IpAddressAlreadyAllocated", "IP address %s already allocated in subnet %s", ip, sub.ID)
			}
		}
		out = append(out, f)
	}
	return out, nil
}

// resolveRequest turns one fixed_ips entry into its subnet and address
// ("" when the address is to be picked).
func resolveRequest(networkID string, subnets []*subnetRow, rq ipRequest) (*subnetRow, string, error) {
	var sub *subnetRow
	if rq.SubnetID != "" {
		for _, s := range subnets {
			if s.ID == rq.SubnetID {
				sub = s
			}
		}
		if sub == nil {
			return nil, "", badInput("Failed to create port on network %s, because fixed_ips included invalid subnet %s.", networkID, rq.SubnetID)
		}
	}
	if rq.IPAddress == "" {
		if sub == nil {
			return nil, "", badInput("IP allocation requires subnet_id or ip_address")
		}
		return sub, "", nil
	}
	ip, err := netip.ParseAddr(rq.IPAddress)
	if err != nil {
		return nil, "", nerr(400, "HTTPBadRequest", "Invalid input for fixed_ips. Reason: '%s' is not a valid IP address.", rq.IPAddress)
	}
	if sub == nil {
		for _, s := range subnets {
			if p, err := netip.ParsePrefix(s.CIDR); err == nil && p.Contains(ip) {
				sub = s
				break
			}
		}
		if sub == nil {
			return nil, "", badInput("IP address %s is not a valid IP for any of the subnets on the specified network.", rq.IPAddress)
		}
	}
	p, err := netip.ParsePrefix(sub.CIDR)
	if err != nil || !p.Contains(ip) || ip == p.Masked().Addr() || (ip.Is4() && ip == lastAddr(p)) {
		return nil, "", badInput("IP address %s is not a valid IP for the specified subnet.", rq.IPAddress)
	}
	return sub, ip.String(), nil
}

// releaseIPs frees every address of an owner.
func releaseIPs(ctx context.Context, q store.Querier, owner string) error {
	_, err := q.Exec(ctx, "DELETE FROM ip_allocations WHERE owner_id = ?", owner)
	return err
}

// randomPoolMin is the pool size under which claim scans instead of probing
// at random: small subnets are cheap to scan and fill up quickly.
const randomPoolMin = 64

// randomInPools picks an address uniformly from a subnet's allocation
// pools; ok is false when the pools are small (or malformed).
func randomInPools(s *subnetRow) (string, bool) {
	type span struct {
		start netip.Addr
		size  uint64
	}
	var spans []span
	var total uint64
	for _, pl := range s.Pools {
		a, err1 := netip.ParseAddr(pl.Start)
		b, err2 := netip.ParseAddr(pl.End)
		if err1 != nil || err2 != nil || a.Is4() != b.Is4() || b.Less(a) {
			continue
		}
		ahi, alo := addrBits(a)
		bhi, blo := addrBits(b)
		size := blo - alo + 1
		if bhi != ahi || size == 0 {
			size = math.MaxUint64 // spans more than 2^64 addresses (IPv6)
		}
		spans = append(spans, span{a, size})
		if total+size < total {
			total = math.MaxUint64
		} else {
			total += size
		}
	}
	if total < randomPoolMin {
		return "", false
	}
	n := rand.Uint64N(total)
	for _, sp := range spans {
		if n < sp.size {
			return addrPlus(sp.start, n).String(), true
		}
		n -= sp.size
	}
	return "", false
}

func addrBits(a netip.Addr) (hi, lo uint64) {
	b := a.As16()
	return binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])
}

// addrPlus returns a+n within a's family.
func addrPlus(a netip.Addr, n uint64) netip.Addr {
	hi, lo := addrBits(a)
	lo2 := lo + n
	if lo2 < lo {
		hi++
	}
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], hi)
	binary.BigEndian.PutUint64(b[8:], lo2)
	out := netip.AddrFrom16(b)
	if a.Is4() {
		return out.Unmap()
	}
	return out
}
