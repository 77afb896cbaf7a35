package network

import (
	"context"
	"encoding/json"
	"net/http"
	"net/netip"
	"strings"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

func caller(r *http.Request) *api.Caller {
	if c := api.CallerFrom(r.Context()); c != nil {
		return c
	}
	return &api.Caller{}
}

func policyDenied(rule string) *api.Error {
	return nerr(403, "PolicyNotAuthorized", "(rule:%s) is disallowed by policy", rule)
}

func netVisible(c *api.Caller, n *netRow) bool {
	return c.IsAdmin() || n.ProjectID == c.ProjectID || n.Shared || n.External
}

// visibleNet loads a network the caller may see or answers NetworkNotFound.
func visibleNet(ctx context.Context, q store.Querier, c *api.Caller, id string) (*netRow, error) {
	n, err := getNet(ctx, q, id)
	if err == store.ErrNotFound || (err == nil && !netVisible(c, n)) {
		return nil, errNetworkNotFound(id)
	}
	return n, err
}

var netFilters = filterableOf(viewKeys((&netRow{}).view())...)

// netColumns are the network attributes a list reads in SQL.
var netColumns = columnList{
	cols: map[string]string{"id": "id", "name": "name", "project_id": "project_id", "tenant_id": "project_id",
		"description": "description", "admin_state_up": "admin_state_up", "shared": "shared",
		"router:external": "external", "is_default": "is_default", "port_security_enabled": "port_security_enabled"},
	bools: map[string]bool{"admin_state_up": true, "shared": true, "router:external": true, "is_default": true,
		"port_security_enabled": true},
}

func (s *Service) listNetworks(r *http.Request) (*api.Response, error) {
	c := caller(r)
	where, args := "1 = 1", []any{}
	if !c.IsAdmin() {
		where, args = visibleNets, []any{c.ProjectID}
	}
	if p, ok := netColumns.page(r.URL.Query(), where, args...); ok {
		if err := p.afterMarker(r.Context(), s.db, "networks"); err != nil {
			return nil, err
		}
		nets, err := loadNets(r.Context(), s.db, p.clauses(), p.Args...)
		if err != nil {
			return nil, err
		}
		return p.answer(r, "networks", netViews(nets)), nil
	}
	nets, err := loadNets(r.Context(), s.db, where+" ORDER BY created_at, id", args...)
	if err != nil {
		return nil, err
	}
	return render(r, "networks", netViews(nets), netFilters)
}

func netViews(nets []*netRow) []map[string]any {
	items := make([]map[string]any, 0, len(nets))
	for _, n := range nets {
		items = append(items, n.view())
	}
	return items
}

func (s *Service) showNetwork(r *http.Request) (*api.Response, error) {
	n, err := visibleNet(r.Context(), s.db, caller(r), pathID(r, "id"))
	if err != nil {
		return nil, err
	}
	return showOne(r, 200, "network", n.view()), nil
}

func insertNet(ctx context.Context, q store.Querier, n *netRow, builtin string) (bool, error) {
	t := now()
	n.CreatedAt, n.UpdatedAt = t, t
	if n.Tags == nil {
		n.Tags = []string{}
	}
	n.Subnets = []string{}
	var bi any
	if builtin != "" {
		bi = builtin
	}
	res, err := q.Exec(ctx, `INSERT INTO networks (id, name, project_id, description, admin_state_up, shared, external,
		is_default, mtu, port_security_enabled, tags, builtin, created_at, updated_at, revision_number)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0) ON CONFLICT DO NOTHING`,
		n.ID, n.Name, n.ProjectID, n.Description, b2i(n.AdminStateUp), b2i(n.Shared), b2i(n.External), b2i(n.IsDefault),
		n.MTU, b2i(n.PortSecurity), store.JSON(n.Tags), bi, t, t)
	if err != nil {
		return false, err
	}
	k, _ := res.RowsAffected()
	if k == 1 {
		return true, assignSegment(ctx, q, n, builtin) // the network's VNI (hoststate.go)
	}
	return false, nil
}

// netAttrs applies the writable network attributes of b to n.
func netAttrs(c *api.Caller, b body, n *netRow, action string) error {
	var err error
	if v, ok, e := b.str("name", 255); e != nil {
		return e
	} else if ok {
		n.Name = v
	}
	if v, ok, e := b.str("description", 255); e != nil {
		return e
	} else if ok {
		n.Description = v
	}
	if v, ok, e := b.boolean("admin_state_up"); e != nil {
		return e
	} else if ok {
		n.AdminStateUp = v
	}
	if v, ok, e := b.boolean("port_security_enabled"); e != nil {
		return e
	} else if ok {
		n.PortSecurity = v
	}
	for _, k := range []string{"shared", "router:external", "is_default"} {
		v, ok, e := b.boolean(k)
		if e != nil {
			return e
		}
		if !ok {
			continue
		}
		// neutron/conf/policies/network.py: shared, router:external and
		// is_default are admin-only.
		if !c.IsAdmin() {
			return policyDenied(action + "_network:" + k)
		}
		switch k {
		case "shared":
			n.Shared = v
		case "router:external":
			n.External = v
		case "is_default":
			n.IsDefault = v
		}
	}
	if v, ok, e := b.integer("mtu"); e != nil {
		return e
	} else if ok && v != nil {
		if *v < 68 {
			return badInput("MTU %d is too small, minimum is 68.", *v)
		}
		if *v > 1450 {
			return badInput("Requested MTU is too big, maximum is 1450")
		}
		n.MTU = *v
	}
	if v, ok, e := b.strList("availability_zone_hints"); e != nil {
		return e
	} else if ok && len(v) > 0 {
		return nerr(404, "AvailabilityZoneNotFound", "AvailabilityZone %s could not be found.", v[0])
	}
	return err
}

var networkCreateAttrs = []string{"name", "admin_state_up", "shared", "router:external", "tenant_id", "project_id",
	"description", "mtu", "port_security_enabled", "is_default", "availability_zone_hints",
	"provider:network_type", "provider:segmentation_id", "provider:physical_network"} // provider: hoststate.go

func (s *Service) prepareNetwork(r *http.Request, c *api.Caller, b body) (*prepared, error) {
	n := &netRow{AdminStateUp: true, PortSecurity: true, MTU: 1450, ID: newID()}
	var err error
	if n.ProjectID, err = projectFor(c, b, "network"); err != nil {
		return nil, err
	}
	if err := netAttrs(c, b, n, "create"); err != nil {
		return nil, err
	}
	if err := providerAttrs(c, b, n); err != nil { // hoststate.go
		return nil, err
	}
	return &prepared{
		insert: func(tx *store.Tx) error {
			if err := checkQuota(r.Context(), tx, n.ProjectID, "network"); err != nil {
				return err
			}
			_, err := insertNet(r.Context(), tx, n, "")
			return err
		},
		view: n.view,
	}, nil
}

func (s *Service) updateNetwork(r *http.Request) (*api.Response, error) {
	c := caller(r)
	b, err := decodeBody(r, "network", append([]string{"name", "admin_state_up", "shared", "router:external", "description", "mtu",
		"port_security_enabled", "is_default"}, providerKeys...)...)
	if err != nil {
		return nil, err
	}
	var n *netRow
	err = s.db.Tx(r.Context(), func(tx *store.Tx) error {
		var err error
		if n, err = visibleNet(r.Context(), tx, c, pathID(r, "id")); err != nil {
			return err
		}
		if !c.IsAdmin() && n.ProjectID != c.ProjectID {
			return policyDenied("update_network")
		}
		if err := providerUpdate(c, b, n); err != nil { // hoststate.go
			return err
		}
		if err := netAttrs(c, b, n, "update"); err != nil {
			return err
		}
		n.UpdatedAt = now()
		if err := checkRevision(r, n.Revision); err != nil {
			return err
		}
		n.Revision++
		_, err = tx.Exec(r.Context(), `UPDATE networks SET name = ?, description = ?, admin_state_up = ?, shared = ?,
			external = ?, is_default = ?, mtu = ?, port_security_enabled = ?, updated_at = ?, revision_number = ? WHERE id = ?`,
			n.Name, n.Description, b2i(n.AdminStateUp), b2i(n.Shared), b2i(n.External), b2i(n.IsDefault), n.MTU,
			b2i(n.PortSecurity), n.UpdatedAt, n.Revision, n.ID)
		return err
	})
	if err != nil {
		return nil, err
	}
	return showOne(r, 200, "network", n.view()), nil
}

func (s *Service) deleteNetwork(r *http.Request) (*api.Response, error) {
	c := caller(r)
	id := pathID(r, "id")
	err := afterReleases(r.Context(), func() error {
		return s.db.Tx(r.Context(), func(tx *store.Tx) error {
			n, err := visibleNet(r.Context(), tx, c, id)
			if err != nil {
				return err
			}
			if !c.IsAdmin() && n.ProjectID != c.ProjectID {
				return policyDenied("delete_network")
			}
			var ports, releasing, fips int
			if err := deleteDHCPPort(r.Context(), tx, id); err != nil { // the system's own (hoststate.go)
				return err
			}
			if err := tx.QueryRow(r.Context(), "SELECT COUNT(*), COALESCE(SUM(releasing), 0) FROM ports WHERE network_id = ?", id).Scan(&ports, &releasing); err != nil {
				return err
			}
			if err := tx.QueryRow(r.Context(), "SELECT COUNT(*) FROM floatingips WHERE floating_network_id = ?", id).Scan(&fips); err != nil {
				return err
			}
			if ports+fips > 0 {
				// neutron_lib/exceptions/__init__.py NetworkInUse
				return inUse(ports+fips, releasing, nerr(409, "NetworkInUse", "Unable to complete operation on network %s. There are one or more ports still in use on the network.", id))
			}
			for _, q := range []string{"DELETE FROM ip_allocations WHERE network_id = ?", "DELETE FROM subnets WHERE network_id = ?",
				"DELETE FROM networks WHERE id = ?"} {
				if _, err := tx.Exec(r.Context(), q, id); err != nil {
					return err
				}
			}
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(204), nil
}

// ---- subnets ----

var subnetFilters = filterableOf(viewKeys((&subnetRow{}).view())...)

// subnetViews loads the subnets the caller may see: its project's and those
// of shared networks
// (neutron/conf/policies/subnet.py get_subnet).
func (s *Service) subnetViews(ctx context.Context, c *api.Caller, where string, args ...any) ([]*subnetRow, error) {
	if !c.IsAdmin() {
		where = "(" + where + ") AND (project_id = ? OR network_id IN (SELECT id FROM networks WHERE shared = 1))"
		args = append(args, c.ProjectID)
	}
	return loadSubnets(ctx, s.db, where, args...)
}

func (s *Service) listSubnets(r *http.Request) (*api.Response, error) {
	subs, err := s.subnetViews(r.Context(), caller(r), "1 = 1")
	if err != nil {
		return nil, err
	}
	items := make([]map[string]any, 0, len(subs))
	for _, x := range subs {
		items = append(items, x.view())
	}
	if err := withSubnetPools(r.Context(), s.db, items); err != nil {
		return nil, err
	}
	return render(r, "subnets", items, subnetFilters)
}

func (s *Service) showSubnet(r *http.Request) (*api.Response, error) {
	id := pathID(r, "id")
	subs, err := s.subnetViews(r.Context(), caller(r), "id = ?", id)
	if err != nil {
		return nil, err
	}
	if len(subs) == 0 {
		return nil, errSubnetNotFound(id)
	}
	return s.subnetAnswer(r, 200, subs[0])
}

// subnetAnswer renders one subnet with the pool it came from.
func (s *Service) subnetAnswer(r *http.Request, status int, sub *subnetRow) (*api.Response, error) {
	v := sub.view()
	if err := withSubnetPools(r.Context(), s.db, []map[string]any{v}); err != nil {
		return nil, err
	}
	return showOne(r, status, "subnet", v), nil
}

func insertSubnet(ctx context.Context, q store.Querier, s *subnetRow) error {
	t := now()
	s.CreatedAt, s.UpdatedAt = t, t
	if s.DNS == nil {
		s.DNS = []string{}
	}
	if s.Routes == nil {
		s.Routes = []route{}
	}
	if s.Tags == nil {
		s.Tags = []string{}
	}
	_, err := q.Exec(ctx, `INSERT INTO subnets (id, network_id, name, project_id, description, ip_version, cidr, gateway_ip,
		allocation_pools, enable_dhcp, dns_nameservers, host_routes, ipv6_ra_mode, ipv6_address_mode, tags, created_at,
		updated_at, revision_number) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0)`,
		s.ID, s.NetworkID, s.Name, s.ProjectID, s.Description, s.IPVersion, s.CIDR, s.Gateway, store.JSON(s.Pools),
		b2i(s.EnableDHCP), store.JSON(s.DNS), store.JSON(s.Routes), s.RAMode, s.AddrMode, store.JSON(s.Tags), t, t)
	return err
}

// Neutron's defaults for max_dns_nameservers and max_subnet_host_routes;
// neutron sets no count of allocation pools, so ours only bounds the
// pairwise overlap check in validatePools.
const (
	maxDNSNameservers  = 5
	maxHostRoutes      = 20
	maxAllocationPools = 50
)

// subnetLabel names a subnet in neutron's *Exhausted errors: "new subnet"
// before it is stored, as neutron's _validate_subnet does.
func subnetLabel(s *subnetRow) string {
	if s.CreatedAt == "" {
		return "new subnet"
	}
	return s.ID
}

// subnetDNS reads a subnet's dns_nameservers: addresses, each once, at
// most maxDNSNameservers.
func subnetDNS(b body, s *subnetRow) error {
	v, ok, e := b.strList("dns_nameservers")
	if e != nil || !ok {
		return e
	}
	if len(v) > maxDNSNameservers {
		return nerr(400, "DNSNameServersExhausted", "Unable to complete operation for %s. The number of DNS nameservers exceeds the limit %d.",
			subnetLabel(s), maxDNSNameservers)
	}
	seen := map[string]bool{}
	for _, d := range v {
		if _, err := netip.ParseAddr(d); err != nil {
			return nerr(400, "HTTPBadRequest", "Invalid input for dns_nameservers. Reason: '%s' is not a valid nameserver. '%s' is not a valid IP address.", d, d)
		}
		if seen[d] {
			return nerr(400, "HTTPBadRequest", "Invalid input for dns_nameservers. Reason: Duplicate nameserver '%s'.", d)
		}
		seen[d] = true
	}
	s.DNS = v
	return nil
}

// subnetRoutes reads a subnet's host_routes: a destination CIDR and a next
// hop each, at most maxHostRoutes.
func subnetRoutes(b body, s *subnetRow) error {
	raw, ok := b["host_routes"]
	if !ok {
		return nil
	}
	var rs []route
	if err := json.Unmarshal(raw, &rs); err != nil {
		return invalid("host_routes", raw, "Invalid data format for hostroute: '%s'")
	}
	if len(rs) > maxHostRoutes {
		return nerr(400, "HostRoutesExhausted", "Unable to complete operation for %s. The number of host routes exceeds the limit %d.",
			subnetLabel(s), maxHostRoutes)
	}
	for _, rt := range rs {
		if _, err := netip.ParsePrefix(rt.Destination); err != nil {
			return nerr(400, "HTTPBadRequest", "Invalid input for host_routes. Reason: '%s' is not a valid IP subnet.", rt.Destination)
		}
		if _, err := netip.ParseAddr(rt.Nexthop); err != nil {
			return nerr(400, "HTTPBadRequest", "Invalid input for host_routes. Reason: '%s' is not a valid IP address.", rt.Nexthop)
		}
	}
	if rs == nil {
		rs = []route{}
	}
	s.Routes = rs
	return nil
}

// subnetAttrs applies the attributes shared by create and update.
func subnetAttrs(b body, s *subnetRow, p netip.Prefix) error {
	if v, ok, e := b.str("name", 255); e != nil {
		return e
	} else if ok {
		s.Name = v
	}
	if v, ok, e := b.str("description", 255); e != nil {
		return e
	} else if ok {
		s.Description = v
	}
	if v, ok, e := b.boolean("enable_dhcp"); e != nil {
		return e
	} else if ok {
		s.EnableDHCP = v
	}
	if err := subnetDNS(b, s); err != nil {
		return err
	}
	if err := subnetRoutes(b, s); err != nil {
		return err
	}
	gwChanged := false
	if b.has("gateway_ip") {
		gwChanged = true
		if b.isNull("gateway_ip") {
			s.Gateway = nil
		} else {
			g, _, e := b.str("gateway_ip", 64)
			if e != nil {
				return e
			}
			a, err := netip.ParseAddr(g)
			if err != nil {
				return nerr(400, "HTTPBadRequest", "Invalid input for gateway_ip. Reason: '%s' is not a valid IP address.", g)
			}
			if a.Is4() != p.Addr().Is4() || a == p.Masked().Addr() || (a.Is4() && a == lastAddr(p)) {
				return badInput("Gateway is not valid on subnet.")
			}
			gs := a.String()
			s.Gateway = &gs
		}
	}
	var gw *netip.Addr
	if s.Gateway != nil {
		a, _ := netip.ParseAddr(*s.Gateway)
		gw = &a
	}
	if raw, ok := b["allocation_pools"]; ok && string(raw) != "null" {
		var pools []pool
		if err := json.Unmarshal(raw, &pools); err != nil {
			return invalid("allocation_pools", raw, "Invalid data format for IP pool: '%s'")
		}
		if len(pools) > maxAllocationPools {
			return badInput("The number of allocation pools exceeds the limit %d.", maxAllocationPools)
		}
		if err := validatePools(p, pools, gw); err != nil {
			return err
		}
		if pools == nil {
			pools = []pool{}
		}
		s.Pools = pools
	} else if gwChanged || s.Pools == nil {
		if s.Pools == nil {
			s.Pools = defaultPools(p, gw)
		} else if err := validatePools(p, s.Pools, gw); err != nil {
			return err
		}
	}
	return nil
}

var subnetCreateAttrs = []string{"name", "network_id", "ip_version", "cidr", "gateway_ip", "allocation_pools",
	"enable_dhcp", "dns_nameservers", "host_routes", "ipv6_ra_mode", "ipv6_address_mode", "description",
	"tenant_id", "project_id", "subnetpool_id", "prefixlen", "use_default_subnetpool"}

// subnetIPVersion reads a subnet's required ip_version, 4 or 6.
func subnetIPVersion(b body) (int, error) {
	ver, ok, err := b.integer("ip_version")
	if err != nil {
		return 0, err
	}
	if !ok || ver == nil {
		return 0, nerr(400, "HTTPBadRequest", "Failed to parse request. Required attribute 'ip_version' not specified")
	}
	if *ver != 4 && *ver != 6 {
		return 0, nerr(400, "HTTPBadRequest", "Invalid input for ip_version. Reason: %d is not in valid_values [4, 6].", *ver)
	}
	return *ver, nil
}

// ipv6Modes reads an IPv6 subnet's ipv6_ra_mode and ipv6_address_mode
// into sub; an IPv4 subnet takes neither.
func ipv6Modes(b body, sub *subnetRow) error {
	for _, k := range []string{"ipv6_ra_mode", "ipv6_address_mode"} {
		v, ok, err := b.optStr(k)
		if err != nil {
			return err
		}
		if !ok || v == nil {
			continue
		}
		if *v != "slaac" && *v != "dhcpv6-stateful" && *v != "dhcpv6-stateless" {
			return nerr(400, "HTTPBadRequest", "Invalid input for %s. Reason: %s is not in valid_values ['dhcpv6-stateful', 'dhcpv6-stateless', 'slaac'].", k, *v)
		}
		if sub.IPVersion != 6 {
			return badInput("Cannot set %s with ip_version 4.", strings.ReplaceAll(k, "_", " "))
		}
		if k == "ipv6_ra_mode" {
			sub.RAMode = v
		} else {
			sub.AddrMode = v
		}
	}
	return nil
}

// noOverlap refuses a subnet of network whose prefix p overlaps another
// of the network's.
func noOverlap(ctx context.Context, tx *store.Tx, network string, p netip.Prefix) error {
	others, err := loadSubnets(ctx, tx, "network_id = ?", network)
	if err != nil {
		return err
	}
	for _, o := range others {
		if op, err := netip.ParsePrefix(o.CIDR); err == nil && op.Overlaps(p) {
			return badInput("Requested subnet with cidr: %s for network: %s overlaps with another subnet", p.String(), network)
		}
	}
	return nil
}

// subnetRequest reads what a subnet asks of the pools (subnetpools.go),
// with the CIDR it names, if any, of its IP version.
func subnetRequest(b body, version int) (*poolRequest, error) {
	rq, err := poolRequestOf(b, version)
	if err != nil {
		return nil, err
	}
	if b.has("cidr") && !b.isNull("cidr") {
		cidr, _, err := b.str("cidr", 64)
		if err != nil {
			return nil, err
		}
		p, err := parseCIDR(cidr, version)
		if err != nil {
			return nil, err
		}
		rq.CIDR = &p
	}
	return rq, nil
}

// fromPool allocates, in tx, the prefix of a subnet rq takes from a pool,
// and gives it to shape; nil when rq names no pool.
func fromPool(ctx context.Context, tx *store.Tx, c *api.Caller, project string, rq *poolRequest, shape func(netip.Prefix) error) (*spRow, error) {
	sp, err := resolvePool(ctx, tx, c, project, rq)
	if err != nil || sp == nil {
		return nil, err
	}
	p, err := allocate(ctx, tx, sp, project, rq)
	if err != nil {
		return nil, err
	}
	return sp, shape(p)
}

func (s *Service) prepareSubnet(r *http.Request, c *api.Caller, b body) (*prepared, error) {
	var err error
	sub := &subnetRow{ID: newID(), EnableDHCP: true}
	if sub.ProjectID, err = projectFor(c, b, "subnet"); err != nil {
		return nil, err
	}
	netID, ok, err := b.uuidAttr("network_id")
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, nerr(400, "HTTPBadRequest", "Failed to parse request. Required attribute 'network_id' not specified")
	}
	if sub.IPVersion, err = subnetIPVersion(b); err != nil {
		return nil, err
	}
	rq, err := subnetRequest(b, sub.IPVersion)
	if err != nil {
		return nil, err
	}
	if err := ipv6Modes(b, sub); err != nil {
		return nil, err
	}
	// shape fixes the subnet's CIDR, default gateway and attributes; a
	// subnet from a pool learns its CIDR only inside the transaction.
	shape := func(p netip.Prefix) error {
		sub.CIDR = p.String()
		if !b.has("gateway_ip") {
			g := p.Masked().Addr().Next().String()
			sub.Gateway = &g
		}
		return subnetAttrs(b, sub, p)
	}
	if rq.PoolID == nil && !rq.UseDefault {
		if rq.CIDR == nil {
			return nil, badInput("A cidr must be specified in the absence of a subnet pool")
		}
		if rq.PrefixLen != nil {
			return nil, subnetsBad("cidr and prefixlen must not be supplied together")
		}
		if err := shape(*rq.CIDR); err != nil {
			return nil, err
		}
	}
	var poolID string
	insert := func(tx *store.Tx) error {
		n, err := visibleNet(r.Context(), tx, c, netID)
		if err != nil {
			return err
		}
		// A subnet's gateway and DNS servers reach every port on the
		// network, so only its owner adds one, shared or not (neutron's
		// create_subnet: ADMIN_OR_NET_OWNER).
		if !c.IsAdmin() && n.ProjectID != sub.ProjectID {
			return nerr(403, "HTTPForbidden", "Tenant %s not allowed to create subnet on this network", sub.ProjectID)
		}
		sub.NetworkID = n.ID
		if err := checkQuota(r.Context(), tx, sub.ProjectID, "subnet"); err != nil {
			return err
		}
		sp, err := fromPool(r.Context(), tx, c, sub.ProjectID, rq, shape)
		if err != nil {
			return err
		}
		if sp != nil {
			poolID = sp.ID
		}
		p, err := netip.ParsePrefix(sub.CIDR)
		if err != nil {
			return err
		}
		if err := noOverlap(r.Context(), tx, n.ID, p); err != nil {
			return err
		}
		if err := insertSubnet(r.Context(), tx, sub); err != nil {
			return err
		}
		if sp != nil {
			return setSubnetPool(r.Context(), tx, sub.ID, sp.ID)
		}
		return nil
	}
	view := func() map[string]any {
		v := sub.view()
		if poolID != "" {
			v["subnetpool_id"] = poolID
		}
		return v
	}
	return &prepared{insert: insert, view: view}, nil
}

func (s *Service) ownedSubnet(ctx context.Context, q store.Querier, c *api.Caller, id, action string) (*subnetRow, error) {
	sub, err := getSubnet(ctx, q, id)
	if err == store.ErrNotFound {
		return nil, errSubnetNotFound(id)
	}
	if err != nil {
		return nil, err
	}
	if !c.IsAdmin() && sub.ProjectID != c.ProjectID {
		n, err := getNet(ctx, q, sub.NetworkID)
		if err != nil || !n.Shared {
			return nil, errSubnetNotFound(id)
		}
		return nil, policyDenied(action + "_subnet")
	}
	return sub, nil
}

func (s *Service) updateSubnet(r *http.Request) (*api.Response, error) {
	c := caller(r)
	b, err := decodeBody(r, "subnet", "name", "gateway_ip", "allocation_pools", "enable_dhcp", "dns_nameservers",
		"host_routes", "description")
	if err != nil {
		return nil, err
	}
	var sub *subnetRow
	err = s.db.Tx(r.Context(), func(tx *store.Tx) error {
		var err error
		if sub, err = s.ownedSubnet(r.Context(), tx, c, pathID(r, "id"), "update"); err != nil {
			return err
		}
		p, err := netip.ParsePrefix(sub.CIDR)
		if err != nil {
			return err
		}
		if err := subnetAttrs(b, sub, p); err != nil {
			return err
		}
		sub.UpdatedAt = now()
		if err := checkRevision(r, sub.Revision); err != nil {
			return err
		}
		sub.Revision++
		_, err = tx.Exec(r.Context(), `UPDATE subnets SET name = ?, description = ?, gateway_ip = ?, allocation_pools = ?,
			enable_dhcp = ?, dns_nameservers = ?, host_routes = ?, updated_at = ?, revision_number = ? WHERE id = ?`,
			sub.Name, sub.Description, sub.Gateway, store.JSON(sub.Pools), b2i(sub.EnableDHCP), store.JSON(sub.DNS),
			store.JSON(sub.Routes), sub.UpdatedAt, sub.Revision, sub.ID)
		return err
	})
	if err != nil {
		return nil, err
	}
	return s.subnetAnswer(r, 200, sub)
}

func (s *Service) deleteSubnet(r *http.Request) (*api.Response, error) {
	c := caller(r)
	id := pathID(r, "id")
	err := afterReleases(r.Context(), func() error {
		return s.db.Tx(r.Context(), func(tx *store.Tx) error {
			if _, err := s.ownedSubnet(r.Context(), tx, c, id, "delete"); err != nil {
				return err
			}
			var n, releasing int
			if err := releaseDHCPAddress(r.Context(), tx, id); err != nil { // hoststate.go
				return err
			}
			if err := tx.QueryRow(r.Context(), `SELECT COUNT(*), COALESCE(SUM(p.releasing), 0) FROM ip_allocations a
			LEFT JOIN ports p ON p.id = a.owner_id WHERE a.subnet_id = ?`, id).Scan(&n, &releasing); err != nil {
				return err
			}
			if n > 0 {
				// neutron_lib/exceptions/__init__.py SubnetInUse
				return inUse(n, releasing, nerr(409, "SubnetInUse", "Unable to complete operation on subnet %s: One or more ports have an IP allocation from this subnet.", id))
			}
			_, err := tx.Exec(r.Context(), "DELETE FROM subnets WHERE id = ?", id)
			return err
		})
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(204), nil
}
