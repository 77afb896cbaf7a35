package network

import (
	"context"
	"database/sql"
	"net/netip"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// netRow is a row of the networks table.
type netRow struct {
	ID, Name, ProjectID, Description                        string
	AdminStateUp, Shared, External, IsDefault, PortSecurity bool
	MTU                                                     int
	Tags                                                    []string
	CreatedAt, UpdatedAt                                    string
	Revision                                                int64
	Subnets                                                 []string
	// SegmentationID is the network's VNI, nil for the flat public
	// network; showProvider says the viewer is an admin, who alone sees
	// the provider attributes (hoststate.go).
	SegmentationID *int64
	showProvider   bool
}

const netCols = `id, name, project_id, description, admin_state_up, shared, external, is_default, mtu,
	port_security_enabled, tags, created_at, updated_at, revision_number, segmentation_id`

func scanNet(sc interface{ Scan(...any) error }) (*netRow, error) {
	var n netRow
	var up, sh, ext, def, ps int
	var tags string
	var seg sql.NullInt64
	err := sc.Scan(&n.ID, &n.Name, &n.ProjectID, &n.Description, &up, &sh, &ext, &def, &n.MTU, &ps, &tags,
		&n.CreatedAt, &n.UpdatedAt, &n.Revision, &seg)
	if err != nil {
		return nil, err
	}
	if seg.Valid {
		n.SegmentationID = &seg.Int64
	}
	n.AdminStateUp, n.Shared, n.External, n.IsDefault, n.PortSecurity = up == 1, sh == 1, ext == 1, def == 1, ps == 1
	n.Tags = tagsOf(tags)
	return &n, nil
}

// visibleNets is the SQL condition for networks a project may see: its own,
// shared ones and external ones (neutron policy get_network:
// admin_or_owner or shared or external).
const visibleNets = "(project_id = ? OR shared = 1 OR external = 1)"

func loadNets(ctx context.Context, q store.Querier, where string, args ...any) ([]*netRow, error) {
	rows, err := q.Query(ctx, "SELECT "+netCols+" FROM networks WHERE "+where, args...)
	if err != nil {
		return nil, err
	}
	var out []*netRow
	admin := api.CallerFrom(ctx).IsAdmin()
	for rows.Next() {
		n, err := scanNet(rows)
		if err != nil {
			rows.Close()
			return nil, err
		}
		n.showProvider = admin
		out = append(out, n)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return out, nil
	}
	byID := map[string]*netRow{}
	ids := make([]any, 0, len(out))
	for _, n := range out {
		n.Subnets = []string{}
		byID[n.ID] = n
		ids = append(ids, n.ID)
	}
	err = inChunks(ids, func(chunk []any) error {
		rows, err := q.Query(ctx, "SELECT network_id, id FROM subnets WHERE network_id IN ("+api.Placeholders(len(chunk))+") ORDER BY created_at, id", chunk...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var nid, sid string
			if err := rows.Scan(&nid, &sid); err != nil {
				return err
			}
			byID[nid].Subnets = append(byID[nid].Subnets, sid)
		}
		return rows.Err()
	})
	return out, err
}

func getNet(ctx context.Context, q store.Querier, id string) (*netRow, error) {
	l, err := loadNets(ctx, q, "id = ?", id)
	if err != nil {
		return nil, err
	}
	if len(l) == 0 {
		return nil, store.ErrNotFound
	}
	return l[0], nil
}

func (n *netRow) view() map[string]any {
	v := map[string]any{
		"id": n.ID, "name": n.Name, "status": "ACTIVE", "admin_state_up": n.AdminStateUp,
		"shared": n.Shared, "router:external": n.External, "subnets": n.Subnets, "mtu": n.MTU,
		"project_id": n.ProjectID, "tenant_id": n.ProjectID, "port_security_enabled": n.PortSecurity,
		"availability_zones": []string{}, "availability_zone_hints": []string{}, "tags": n.Tags,
		"description": n.Description, "created_at": neutronTime(n.CreatedAt), "updated_at": neutronTime(n.UpdatedAt),
		"revision_number": n.Revision, "ipv4_address_scope": nil, "ipv6_address_scope": nil,
		"l2_adjacency": true, "is_default": n.IsDefault,
	}
	if n.showProvider {
		for k, x := range n.provider() {
			v[k] = x
		}
	}
	return v
}

// pool is one allocation pool.
type pool struct {
	Start string `json:"start"`
	End   string `json:"end"`
}

// route is one host route.
type route struct {
	Destination string `json:"destination"`
	Nexthop     string `json:"nexthop"`
}

// subnetRow is a row of the subnets table.
type subnetRow struct {
	ID, NetworkID, Name, ProjectID, Description, CIDR string
	IPVersion                                         int
	Gateway, RAMode, AddrMode                         *string
	Pools                                             []pool
	EnableDHCP                                        bool
	DNS                                               []string
	Routes                                            []route
	Tags                                              []string
	CreatedAt, UpdatedAt                              string
	Revision                                          int64
}

const subnetCols = `id, network_id, name, project_id, description, ip_version, cidr, gateway_ip, allocation_pools,
	enable_dhcp, dns_nameservers, host_routes, ipv6_ra_mode, ipv6_address_mode, tags, created_at, updated_at, revision_number`

func loadSubnets(ctx context.Context, q store.Querier, where string, args ...any) ([]*subnetRow, error) {
	rows, err := q.Query(ctx, "SELECT "+subnetCols+" FROM subnets WHERE "+where+" ORDER BY created_at, id", args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*subnetRow
	for rows.Next() {
		var s subnetRow
		var gw, ra, am sql.NullString
		var pools, dns, routes, tags string
		var dhcp int
		if err := rows.Scan(&s.ID, &s.NetworkID, &s.Name, &s.ProjectID, &s.Description, &s.IPVersion, &s.CIDR, &gw,
			&pools, &dhcp, &dns, &routes, &ra, &am, &tags, &s.CreatedAt, &s.UpdatedAt, &s.Revision); err != nil {
			return nil, err
		}
		s.Gateway, s.RAMode, s.AddrMode = nullStr(gw), nullStr(ra), nullStr(am)
		_ = store.FromJSON(pools, &s.Pools)
		_ = store.FromJSON(dns, &s.DNS)
		_ = store.FromJSON(routes, &s.Routes)
		if s.Pools == nil {
			s.Pools = []pool{}
		}
		if s.DNS == nil {
			s.DNS = []string{}
		}
		if s.Routes == nil {
			s.Routes = []route{}
		}
		s.EnableDHCP = dhcp == 1
		s.Tags = tagsOf(tags)
		out = append(out, &s)
	}
	return out, rows.Err()
}

func getSubnet(ctx context.Context, q store.Querier, id string) (*subnetRow, error) {
	l, err := loadSubnets(ctx, q, "id = ?", id)
	if err != nil {
		return nil, err
	}
	if len(l) == 0 {
		return nil, store.ErrNotFound
	}
	return l[0], nil
}

func nullStr(n sql.NullString) *string {
	if !n.Valid {
		return nil
	}
	s := n.String
	return &s
}

func (s *subnetRow) view() map[string]any {
	return map[string]any{
		"id": s.ID, "name": s.Name, "network_id": s.NetworkID, "ip_version": s.IPVersion, "cidr": s.CIDR,
		"gateway_ip": s.Gateway, "allocation_pools": s.Pools, "enable_dhcp": s.EnableDHCP,
		"dns_nameservers": s.DNS, "host_routes": s.Routes, "ipv6_ra_mode": s.RAMode,
		"ipv6_address_mode": s.AddrMode, "subnetpool_id": nil, "project_id": s.ProjectID, "tenant_id": s.ProjectID,
		"description": s.Description, "tags": s.Tags,
		"created_at": neutronTime(s.CreatedAt), "updated_at": neutronTime(s.UpdatedAt), "revision_number": s.Revision,
	}
}

// portRow is a row of the ports table with its addresses.
type portRow struct {
	ID, NetworkID, Name, ProjectID, Description, MAC, Status, DeviceID, DeviceOwner, VNIC string
	// BoundBy and BoundDevice are the service's binding (bindCompute or
	// bindRouter, and the server or router id); no API request writes them.
	BoundBy, BoundDevice                    string
	AdminStateUp, PortSecurity, ServerOwned bool
	SecurityGroups                          []string
	Pairs                                   []map[string]string
	Tags                                    []string
	CreatedAt, UpdatedAt                    string
	Revision                                int64
	FixedIPs                                []FixedIP
}

const portCols = `id, network_id, name, project_id, description, mac_address, status, device_id, device_owner, vnic_type,
	bound_by, bound_device, admin_state_up, port_security_enabled, server_owned, security_groups, allowed_address_pairs, tags,
	created_at, updated_at, revision_number`

func loadPorts(ctx context.Context, q store.Querier, where string, args ...any) ([]*portRow, error) {
	return loadPortPage(ctx, q, where+" ORDER BY created_at, id", args...)
}

// loadPortPage reads the ports of "WHERE <clauses>", which gives their
// order and limit, with their addresses.
func loadPortPage(ctx context.Context, q store.Querier, clauses string, args ...any) ([]*portRow, error) {
	rows, err := q.Query(ctx, "SELECT "+portCols+" FROM ports WHERE "+clauses, args...)
	if err != nil {
		return nil, err
	}
	var out []*portRow
	for rows.Next() {
		var p portRow
		var up, ps, so int
		var sgs, pairs, tags string
		if err := rows.Scan(&p.ID, &p.NetworkID, &p.Name, &p.ProjectID, &p.Description, &p.MAC, &p.Status, &p.DeviceID,
			&p.DeviceOwner, &p.VNIC, &p.BoundBy, &p.BoundDevice, &up, &ps, &so, &sgs, &pairs, &tags, &p.CreatedAt, &p.UpdatedAt, &p.Revision); err != nil {
			rows.Close()
			return nil, err
		}
		p.AdminStateUp, p.PortSecurity, p.ServerOwned = up == 1, ps == 1, so == 1
		_ = store.FromJSON(sgs, &p.SecurityGroups)
		_ = store.FromJSON(pairs, &p.Pairs)
		if p.SecurityGroups == nil {
			p.SecurityGroups = []string{}
		}
		if p.Pairs == nil {
			p.Pairs = []map[string]string{}
		}
		p.Tags = tagsOf(tags)
		p.FixedIPs = []FixedIP{}
		out = append(out, &p)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return out, nil
	}
	byID := map[string]*portRow{}
	ids := make([]any, 0, len(out))
	for _, p := range out {
		byID[p.ID] = p
		ids = append(ids, p.ID)
	}
	err = inChunks(ids, func(chunk []any) error {
		rows, err := q.Query(ctx, "SELECT owner_id, subnet_id, ip_address FROM ip_allocations WHERE owner_id IN ("+
			api.Placeholders(len(chunk))+") ORDER BY seq", chunk...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var o string
			var f FixedIP
			if err := rows.Scan(&o, &f.SubnetID, &f.IPAddress); err != nil {
				return err
			}
			byID[o].FixedIPs = append(byID[o].FixedIPs, f)
		}
		return rows.Err()
	})
	return out, err
}

func getPortRow(ctx context.Context, q store.Querier, id string) (*portRow, error) {
	l, err := loadPorts(ctx, q, "id = ?", id)
	if err != nil {
		return nil, err
	}
	if len(l) == 0 {
		return nil, store.ErrNotFound
	}
	return l[0], nil
}

func (p *portRow) view(admin bool) map[string]any {
	ips := make([]map[string]any, 0, len(p.FixedIPs))
	for _, f := range p.FixedIPs {
		ips = append(ips, map[string]any{"subnet_id": f.SubnetID, "ip_address": f.IPAddress})
	}
	v := map[string]any{
		"id": p.ID, "name": p.Name, "network_id": p.NetworkID, "mac_address": p.MAC, "fixed_ips": ips,
		"device_id": p.DeviceID, "device_owner": p.DeviceOwner, "status": p.Status, "admin_state_up": p.AdminStateUp,
		"security_groups": p.SecurityGroups, "port_security_enabled": p.PortSecurity,
		"allowed_address_pairs": p.Pairs, "project_id": p.ProjectID, "tenant_id": p.ProjectID,
		"description": p.Description, "tags": p.Tags, "binding:vnic_type": p.VNIC,
		"created_at": neutronTime(p.CreatedAt), "updated_at": neutronTime(p.UpdatedAt), "revision_number": p.Revision,
	}
	// binding:host_id, vif_type, vif_details and profile are admin-only
	// (neutron-lib policies for the binding extension).
	if admin {
		host, vif := "", "unbound"
		if p.BoundBy == bindCompute {
			host, vif = "nimbus", "ovs"
		}
		v["binding:host_id"] = host
		v["binding:vif_type"] = vif
		v["binding:vif_details"] = map[string]any{}
		v["binding:profile"] = map[string]any{}
	}
	return v
}

// sgRow is a security group with its rules.
type sgRow struct {
	ID, Name, ProjectID, Description string
	Stateful, Default                bool
	Tags                             []string
	CreatedAt, UpdatedAt             string
	Revision                         int64
	Rules                            []*ruleRow
}

// ruleRow is one security group rule.
type ruleRow struct {
	ID, SecurityGroupID, ProjectID, Direction, Ethertype, Description string
	Protocol, RemoteIPPrefix, RemoteGroupID                           *string
	PortMin, PortMax                                                  *int
	CreatedAt, UpdatedAt                                              string
	Revision                                                          int64
	defaultSG                                                         bool
}

func loadSGs(ctx context.Context, q store.Querier, where string, args ...any) ([]*sgRow, error) {
	rows, err := q.Query(ctx, `SELECT id, name, project_id, description, stateful, builtin, tags, created_at, updated_at,
		revision_number FROM security_groups WHERE `+where+" ORDER BY created_at, id", args...)
	if err != nil {
		return nil, err
	}
	var out []*sgRow
	for rows.Next() {
		var g sgRow
		var st int
		var bi sql.NullString
		var tags string
		if err := rows.Scan(&g.ID, &g.Name, &g.ProjectID, &g.Description, &st, &bi, &tags, &g.CreatedAt, &g.UpdatedAt, &g.Revision); err != nil {
			rows.Close()
			return nil, err
		}
		g.Stateful, g.Default, g.Tags = st == 1, bi.Valid, tagsOf(tags)
		g.Rules = []*ruleRow{}
		out = append(out, &g)
	}
	rows.Close()
	if err := rows.Err(); err != nil || len(out) == 0 {
		return out, err
	}
	byID := map[string]*sgRow{}
	ids := make([]any, 0, len(out))
	for _, g := range out {
		byID[g.ID] = g
		ids = append(ids, g.ID)
	}
	err = inChunks(ids, func(chunk []any) error {
		rules, err := loadRules(ctx, q, "security_group_id IN ("+api.Placeholders(len(chunk))+")", chunk...)
		for _, r := range rules {
			r.defaultSG = byID[r.SecurityGroupID].Default
			byID[r.SecurityGroupID].Rules = append(byID[r.SecurityGroupID].Rules, r)
		}
		return err
	})
	return out, err
}

func loadRules(ctx context.Context, q store.Querier, where string, args ...any) ([]*ruleRow, error) {
	rows, err := q.Query(ctx, `SELECT id, security_group_id, project_id, direction, ethertype, description, protocol,
		remote_ip_prefix, remote_group_id, port_range_min, port_range_max, created_at, updated_at, revision_number
		FROM security_group_rules WHERE `+where+" ORDER BY created_at, id", args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*ruleRow
	for rows.Next() {
		var r ruleRow
		var proto, prefix, rg sql.NullString
		var pmin, pmax sql.NullInt64
		if err := rows.Scan(&r.ID, &r.SecurityGroupID, &r.ProjectID, &r.Direction, &r.Ethertype, &r.Description, &proto,
			&prefix, &rg, &pmin, &pmax, &r.CreatedAt, &r.UpdatedAt, &r.Revision); err != nil {
			return nil, err
		}
		r.Protocol, r.RemoteIPPrefix, r.RemoteGroupID = nullStr(proto), nullStr(prefix), nullStr(rg)
		if pmin.Valid {
			n := int(pmin.Int64)
			r.PortMin = &n
		}
		if pmax.Valid {
			n := int(pmax.Int64)
			r.PortMax = &n
		}
		out = append(out, &r)
	}
	return out, rows.Err()
}

func (r *ruleRow) view() map[string]any {
	var normalized any
	if r.RemoteIPPrefix != nil {
		if p, err := netip.ParsePrefix(*r.RemoteIPPrefix); err == nil {
			normalized = p.Masked().String()
		}
	}
	return map[string]any{
		"id": r.ID, "security_group_id": r.SecurityGroupID, "project_id": r.ProjectID, "tenant_id": r.ProjectID,
		"direction": r.Direction, "ethertype": r.Ethertype, "protocol": r.Protocol, "port_range_min": r.PortMin,
		"port_range_max": r.PortMax, "remote_ip_prefix": r.RemoteIPPrefix, "remote_group_id": r.RemoteGroupID,
		"remote_address_group_id": nil, "normalized_cidr": normalized, "description": r.Description,
		"belongs_to_default_sg": r.defaultSG,
		"created_at":            neutronTime(r.CreatedAt), "updated_at": neutronTime(r.UpdatedAt), "revision_number": r.Revision,
	}
}

func (g *sgRow) view() map[string]any {
	rules := make([]map[string]any, 0, len(g.Rules))
	for _, r := range g.Rules {
		rules = append(rules, r.view())
	}
	return map[string]any{
		"id": g.ID, "name": g.Name, "project_id": g.ProjectID, "tenant_id": g.ProjectID, "description": g.Description,
		"stateful": g.Stateful, "security_group_rules": rules, "tags": g.Tags,
		"created_at": neutronTime(g.CreatedAt), "updated_at": neutronTime(g.UpdatedAt), "revision_number": g.Revision,
	}
}

// fipRow is a floating IP.
type fipRow struct {
	ID, ProjectID, Description, NetworkID, SubnetID, Address string
	PortID, FixedIP, ServerID                                *string
	Tags                                                     []string
	CreatedAt, UpdatedAt                                     string
	Revision                                                 int64
}

func loadFIPs(ctx context.Context, q store.Querier, where string, args ...any) ([]*fipRow, error) {
	rows, err := q.Query(ctx, `SELECT id, project_id, description, floating_network_id, floating_subnet_id,
		floating_ip_address, port_id, fixed_ip_address, server_id, tags, created_at, updated_at, revision_number
		FROM floatingips WHERE `+where+" ORDER BY created_at, id", args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*fipRow
	for rows.Next() {
		var f fipRow
		var port, fixed, server sql.NullString
		var tags string
		if err := rows.Scan(&f.ID, &f.ProjectID, &f.Description, &f.NetworkID, &f.SubnetID, &f.Address, &port, &fixed,
			&server, &tags, &f.CreatedAt, &f.UpdatedAt, &f.Revision); err != nil {
			return nil, err
		}
		f.PortID, f.FixedIP, f.ServerID = nullStr(port), nullStr(fixed), nullStr(server)
		f.Tags = tagsOf(tags)
		out = append(out, &f)
	}
	return out, rows.Err()
}

func getFIP(ctx context.Context, q store.Querier, id string) (*fipRow, error) {
	l, err := loadFIPs(ctx, q, "id = ?", id)
	if err != nil {
		return nil, err
	}
	if len(l) == 0 {
		return nil, store.ErrNotFound
	}
	return l[0], nil
}

// view renders a floating IP; port is its associated port, if any
// (port_details is the fip-port-details extension).
func (f *fipRow) view(port *portRow) map[string]any {
	status := "DOWN"
	var details any
	if f.PortID != nil {
		status = "ACTIVE"
		if port != nil {
			details = map[string]any{"name": port.Name, "network_id": port.NetworkID, "mac_address": port.MAC,
				"admin_state_up": port.AdminStateUp, "status": port.Status, "device_id": port.DeviceID,
				"device_owner": port.DeviceOwner}
		}
	}
	return map[string]any{
		"id": f.ID, "project_id": f.ProjectID, "tenant_id": f.ProjectID, "description": f.Description,
		"floating_network_id": f.NetworkID, "floating_ip_address": f.Address, "port_id": f.PortID,
		"fixed_ip_address": f.FixedIP, "router_id": nil, "status": status, "tags": f.Tags, "port_details": details,
		"created_at": neutronTime(f.CreatedAt), "updated_at": neutronTime(f.UpdatedAt), "revision_number": f.Revision,
	}
}

// marks is api.Placeholders under the name service.go still uses.
var marks = api.Placeholders

// inChunks runs f over ids in chunks small enough for any engine's
// placeholder limit.
func inChunks(ids []any, f func([]any) error) error {
	const size = 500
	for i := 0; i < len(ids); i += size {
		j := min(i+size, len(ids))
		if err := f(ids[i:j]); err != nil {
			return err
		}
	}
	return nil
}
