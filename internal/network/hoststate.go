package network

import (
	"context"
	"database/sql"
	"encoding/json"
	"net/http"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/netstate"
	"nimbus/internal/store"
)

// This file is the controller's side of the bridged data plane (issue
// 13): each tenant network's VXLAN segment, the change feed agents
// long-poll on, and the netstate.Host a bridged host is told to wire.

// Binding and owner of a network's DHCP port: system state, one per
// network (the ports_dhcp_network key), shared by every host's DHCP
// namespace on the network.
const (
	bindDHCP  = "dhcp"
	ownerDHCP = "network:dhcp"
)

// firstVNI is the first segment handed to a tenant network.
const firstVNI = 1000

// dataplane is the service's change feed; its zero value is ready.
type dataplane struct {
	mu   sync.Mutex
	rev  int64
	wake chan struct{} // closed by the next change; nil when no one waits
}

// current is the revision, started from the wall clock so that a
// restarted controller never answers one below what its agents hold.
func (d *dataplane) current() int64 {
	if d.rev == 0 {
		d.rev = time.Now().UnixNano()
	}
	return d.rev
}

// Revision is the data plane's current revision.
func (s *Service) Revision() int64 {
	s.dp.mu.Lock()
	defer s.dp.mu.Unlock()
	return s.dp.current()
}

// NetworkChanged raises the revision and wakes every long-poll: call it
// after a committed change to ports, networks, groups, routers or where a
// server runs (compute calls it when it moves a server's host).
func (s *Service) NetworkChanged() {
	d := &s.dp
	d.mu.Lock()
	defer d.mu.Unlock()
	d.rev = max(d.current()+1, time.Now().UnixNano())
	if d.wake != nil {
		close(d.wake)
		d.wake = nil
	}
}

// WaitChange returns the revision once it is above after, or when ctx
// ends, whichever is first.
func (s *Service) WaitChange(ctx context.Context, after int64) int64 {
	d := &s.dp
	d.mu.Lock()
	if cur := d.current(); cur > after {
		d.mu.Unlock()
		return cur
	}
	if d.wake == nil {
		d.wake = make(chan struct{})
	}
	ch := d.wake
	d.mu.Unlock()
	select {
	case <-ch:
	case <-ctx.Done():
	}
	return s.Revision()
}

// notifyWrites makes every successful write of the API raise the
// revision; a handler returns after its transaction committed. Tags and
// quotas change nothing a host wires.
func (s *Service) notifyWrites(rt []api.Route) []api.Route {
	for i, r := range rt {
		if strings.HasPrefix(r.Pattern, "GET ") || strings.Contains(r.Pattern, "/tags") || strings.Contains(r.Pattern, "/quotas") {
			continue
		}
		h := r.Handler
		rt[i].Handler = func(req *http.Request) (*api.Response, error) {
			resp, err := h(req)
			if err == nil && resp != nil && resp.Status < 400 {
				s.NetworkChanged()
			}
			return resp, err
		}
	}
	return rt
}

// changedAfterCommit raises the revision once tx commits.
func (s *Service) changedAfterCommit(tx *store.Tx) { tx.AfterCommit(s.NetworkChanged) }

// ---- segments and the provider attributes ----

var providerKeys = []string{"provider:network_type", "provider:segmentation_id", "provider:physical_network"}

func init() {
	// Admins filter on the provider attributes as on any other.
	for _, k := range providerKeys {
		netFilters[k] = true
	}
}

// provider is the network's provider attributes: a VXLAN segment, or the
// flat provider network for the public one.
func (n *netRow) provider() map[string]any {
	if n.SegmentationID == nil {
		return map[string]any{"provider:network_type": "flat", "provider:segmentation_id": nil,
			"provider:physical_network": PublicNetwork}
	}
	return map[string]any{"provider:network_type": "vxlan", "provider:segmentation_id": *n.SegmentationID,
		"provider:physical_network": nil}
}

// providerAttrs reads the provider attributes of a network create: only
// an admin gives them (neutron's create_network:provider:* policies), and
// only a VXLAN segment, optionally with its id, is made here.
func providerAttrs(c *api.Caller, b body, n *netRow) error {
	for _, k := range providerKeys {
		if b.has(k) && !c.IsAdmin() {
			return policyDenied("create_network:" + k)
		}
	}
	if t, ok, err := b.optStr("provider:network_type"); err != nil {
		return err
	} else if ok && t != nil && *t != "vxlan" {
		return badInput("network_type value '%s' not supported", *t)
	}
	if p, ok, err := b.optStr("provider:physical_network"); err != nil {
		return err
	} else if ok && p != nil {
		return badInput("provider:physical_network specified for vxlan network")
	}
	id, ok, err := b.integer("provider:segmentation_id")
	if err != nil || !ok || id == nil {
		return err
	}
	if *id < 1 || *id > netstate.MaxVNI {
		return badInput("segmentation_id out of range (1 through %d)", netstate.MaxVNI)
	}
	v := int64(*id)
	n.SegmentationID = &v
	return nil
}

// providerUpdate checks the provider attributes of a network update:
// only an admin names them (neutron's update_network:provider:*
// policies, 403 before anything else), and a segment is never moved
// under its ports, so only the values the network has are accepted.
func providerUpdate(c *api.Caller, b body, n *netRow) error {
	for _, k := range providerKeys {
		if b.has(k) && !c.IsAdmin() {
			return policyDenied("update_network:" + k)
		}
	}
	cur := n.provider()
	for _, k := range providerKeys {
		if !b.has(k) {
			continue
		}
		var v any
		_ = json.Unmarshal(b[k], &v)
		if f, ok := v.(float64); ok && n.SegmentationID != nil && f == float64(*n.SegmentationID) {
			v = *n.SegmentationID
		}
		if v != cur[k] {
			return badInput("Plugin does not support updating provider attributes")
		}
	}
	return nil
}

// assignSegment gives a network just inserted its VNI (the one an admin
// asked for, or the counter's next free one), except the flat public
// network; q is the create's transaction. The counter row's lock
// serialises concurrent creates.
func assignSegment(ctx context.Context, q store.Querier, n *netRow, builtin string) error {
	n.showProvider = api.CallerFrom(ctx).IsAdmin()
	if builtin == "public" {
		n.SegmentationID = nil
		return nil
	}
	if n.SegmentationID != nil {
		used, err := segmentUsed(ctx, q, *n.SegmentationID)
		if err != nil {
			return err
		}
		if used {
			return nerr(409, "TunnelIdInUse", "Unable to create the network. The tunnel ID %d is in use.", *n.SegmentationID)
		}
	} else {
		vni, err := nextSegment(ctx, q)
		if err != nil {
			return err
		}
		n.SegmentationID = &vni
	}
	_, err := q.Exec(ctx, "UPDATE networks SET segmentation_id = ? WHERE id = ?", *n.SegmentationID, n.ID)
	return err
}

func segmentUsed(ctx context.Context, q store.Querier, vni int64) (bool, error) {
	var k int
	err := q.QueryRow(ctx, "SELECT COUNT(*) FROM networks WHERE segmentation_id = ?", vni).Scan(&k)
	return k > 0, err
}

// nextSegment takes the counter's next VNI not taken by an admin's choice.
func nextSegment(ctx context.Context, q store.Querier) (int64, error) {
	for {
		if _, err := q.Exec(ctx, "UPDATE network_vni_counter SET next_vni = next_vni + 1 WHERE id = 1"); err != nil {
			return 0, err
		}
		var vni int64
		if err := q.QueryRow(ctx, "SELECT next_vni - 1 FROM network_vni_counter WHERE id = 1").Scan(&vni); err != nil {
			return 0, err
		}
		if vni > netstate.MaxVNI {
			return 0, nerr(503, "NoNetworkAvailable", "Unable to create the network. No tenant network is available for allocation.")
		}
		used, err := segmentUsed(ctx, q, vni)
		if err != nil || !used {
			return vni, err
		}
	}
}

// ---- a host's state ----

// HostInfo is the fleet's view of one bridged host.
type HostInfo struct {
	Name, VTEP  string
	Gateway, Up bool
}

// HostState is the network state host is to wire: its servers' ports and
// their networks with DHCP and peers, the security groups filtering them,
// and the routers placed on it. hosts is every bridged host. Routers
// without a live gateway host are placed, and networks given their DHCP
// port, first, each in a short transaction of its own.
func (s *Service) HostState(ctx context.Context, host string, hosts []HostInfo) (*netstate.Host, error) {
	m, err := s.HostStates(ctx, []string{host}, hosts)
	if err != nil {
		return nil, err
	}
	return m[host], nil
}

// HostStates is HostState for each host of names at once: the same
// queries over the set, so that a change costs one build for every host
// waiting on the change feed rather than one build each.
func (s *Service) HostStates(ctx context.Context, names []string, hosts []HostInfo) (map[string]*netstate.Host, error) {
	rev := s.Revision() // before reading: a change during the build raises it past what is served
	if err := s.placeRouters(ctx, hosts); err != nil {
		return nil, err
	}
	b := &hostBuild{s: s, hosts: map[string]HostInfo{}, states: map[string]*netstate.Host{}, hostNets: map[string][]string{},
		netSet: map[string]bool{}, nets: map[string]*netstate.Network{}, ifSubnets: map[string][]*netstate.Router{}}
	for _, h := range hosts {
		b.hosts[h.Name] = h
	}
	for _, name := range names {
		if b.states[name] != nil {
			continue
		}
		b.names = append(b.names, name)
		b.states[name] = &netstate.Host{Host: name, Revision: rev, VTEP: b.hosts[name].VTEP,
			Networks: []netstate.Network{}, Ports: []netstate.Port{}, SecurityGroups: []netstate.SecurityGroup{},
			Routers: []netstate.Router{}}
	}
	if len(b.names) == 0 {
		return b.states, nil
	}
	for _, step := range []func(context.Context) error{b.ports, b.routers, b.networks, b.peers, b.groups, b.floatingIPs} {
		if err := step(ctx); err != nil {
			return nil, err
		}
	}
	return b.states, nil
}

// hostBuild is one HostStates in progress.
type hostBuild struct {
	s     *Service
	hosts map[string]HostInfo
	// names are the hosts being built, states their states.
	names  []string
	states map[string]*netstate.Host
	// hostNets are the networks each host needs, in the order met; netIDs
	// all of them, netSet the same as a set; nets those with a VXLAN
	// segment once loaded, which each host's state copies.
	hostNets map[string][]string
	netIDs   []string
	netSet   map[string]bool
	nets     map[string]*netstate.Network
	// ifSubnets are the subnets of the built hosts' routers' interfaces,
	// by subnet: the routers.
	ifSubnets map[string][]*netstate.Router
}

func (b *hostBuild) needNet(host, id string) {
	if !slices.Contains(b.hostNets[host], id) {
		b.hostNets[host] = append(b.hostNets[host], id)
	}
	if !b.netSet[id] {
		b.netSet[id] = true
		b.netIDs = append(b.netIDs, id)
	}
}

// theIDs stands in queryIn's arguments for the chunk of ids, where the
// query says "(@)".
type chunkArg struct{}

var theIDs = chunkArg{}

// queryIn runs query once per chunk of ids, small enough for any
// engine's placeholder limit, and row on each row.
func queryIn(ctx context.Context, q store.Querier, ids []string, query string, args []any, row func(*sql.Rows) error) error {
	vals := make([]any, len(ids))
	for i, id := range ids {
		vals[i] = id
	}
	return inChunks(vals, func(part []any) error {
		qs := strings.ReplaceAll(query, "(@)", "("+api.Placeholders(len(part))+")")
		var all []any
		for _, a := range args {
			if a == theIDs {
				all = append(all, part...)
			} else {
				all = append(all, a)
			}
		}
		rows, err := q.Query(ctx, qs, all...)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			if err := row(rows); err != nil {
				return err
			}
		}
		return rows.Err()
	})
}

// liveServer is the condition on compute_servers s for a server that
// runs (or is to run) on its host: an offloaded one only while it is
// being spawned on the host its unshelve was placed on (its VM waits
// for the wiring before it starts).
const liveServer = "s.deleted = 0 AND s.host <> '' AND (s.vm_state <> 'shelved_offloaded' OR s.task_state = 'spawning')"

// ports reads the hosts' server ports with their addresses.
func (b *hostBuild) ports(ctx context.Context) error {
	return queryIn(ctx, b.s.db, b.names, `SELECT s.host, p.id, p.network_id, p.bound_device, s.hostname, p.mac_address,
			p.admin_state_up, p.port_security_enabled, p.security_groups, p.allowed_address_pairs, a.subnet_id, a.ip_address
		FROM compute_servers s CROSS JOIN ports p LEFT JOIN ip_allocations a ON a.owner_id = p.id
		WHERE s.host IN (@) AND `+liveServer+` AND p.bound_device = s.id AND p.project_id = s.project_id AND p.bound_by = ?
		ORDER BY p.id, a.seq`, []any{theIDs, bindCompute}, func(rows *sql.Rows) error {
		var host string
		var p netstate.Port
		var up, ps int
		var sgs, pairs string
		var sub, ip sql.NullString
		if err := rows.Scan(&host, &p.ID, &p.NetworkID, &p.ServerID, &p.Hostname, &p.MAC, &up, &ps, &sgs, &pairs, &sub, &ip); err != nil {
			return err
		}
		st := b.states[host]
		if n := len(st.Ports); n == 0 || st.Ports[n-1].ID != p.ID {
			p.AdminUp, p.PortSecurity = up == 1, ps == 1
			p.IPs = []netstate.FixedIP{}
			_ = store.FromJSON(sgs, &p.SecurityGroups)
			if p.SecurityGroups == nil {
				p.SecurityGroups = []string{}
			}
			p.AllowedPairs = addressPairs(pairs)
			st.Ports = append(st.Ports, p)
			b.needNet(host, p.NetworkID)
		}
		if ip.Valid {
			last := &st.Ports[len(st.Ports)-1]
			last.IPs = append(last.IPs, netstate.FixedIP{SubnetID: sub.String, IP: ip.String})
		}
		return nil
	})
}

func addressPairs(js string) []netstate.AddressPair {
	var raw []map[string]string
	_ = store.FromJSON(js, &raw)
	var out []netstate.AddressPair
	for _, m := range raw {
		out = append(out, netstate.AddressPair{IP: m["ip_address"], MAC: m["mac_address"]})
	}
	return out
}

// routers reads the routers placed on the hosts with their gateway and
// interfaces, those an admin set down aside; their networks join their
// host's.
func (b *hostBuild) routers(ctx context.Context) error {
	gwPort := map[string]string{} // router → gateway port
	snat := map[string]bool{}
	hostOf := map[string]string{} // router → host
	var ids []string
	err := queryIn(ctx, b.s.db, b.names, "SELECT host, id, project_id, enable_snat, COALESCE(gw_port_id, ''), routes FROM routers WHERE host IN (@) AND admin_state_up = 1 ORDER BY id",
		[]any{theIDs}, func(rows *sql.Rows) error {
			var host, gw, routes string
			var r netstate.Router
			var on int
			if err := rows.Scan(&host, &r.ID, &r.ProjectID, &on, &gw, &routes); err != nil {
				return err
			}
			r.Interfaces = []netstate.RouterInterface{}
			r.Routes = netRoutes(routes)
			gwPort[r.ID], snat[r.ID], hostOf[r.ID] = gw, on == 1, host
			st := b.states[host]
			st.Routers = append(st.Routers, r)
			ids = append(ids, r.ID)
			return nil
		})
	if err != nil || len(ids) == 0 {
		return err
	}
	// Pointers once every host's routers are in place.
	byID := map[string]*netstate.Router{}
	for _, name := range b.names {
		st := b.states[name]
		for i := range st.Routers {
			byID[st.Routers[i].ID] = &st.Routers[i]
		}
	}
	return queryIn(ctx, b.s.db, ids, `SELECT p.id, p.bound_device, p.network_id, p.mac_address, a.subnet_id, a.ip_address,
			sn.cidr, COALESCE(sn.gateway_ip, '')
		FROM ports p JOIN ip_allocations a ON a.owner_id = p.id JOIN subnets sn ON sn.id = a.subnet_id
		WHERE p.bound_by = ? AND p.bound_device IN (@) ORDER BY p.id, a.seq`, []any{bindRouter, theIDs}, func(rows *sql.Rows) error {
		var id, rid, netID, mac, sub, ip, cidr, nextHop string
		if err := rows.Scan(&id, &rid, &netID, &mac, &sub, &ip, &cidr, &nextHop); err != nil {
			return err
		}
		r := byID[rid]
		if id == gwPort[rid] {
			if a, err := netip.ParseAddr(ip); err == nil && a.Is4() && r.Gateway == nil {
				r.Gateway = &netstate.Gateway{MAC: mac, IP: ip, CIDR: cidr, NextHop: nextHop, EnableSNAT: snat[rid]}
			}
			return nil
		}
		r.Interfaces = append(r.Interfaces, netstate.RouterInterface{PortID: id, NetworkID: netID, SubnetID: sub,
			MAC: mac, IP: ip, CIDR: cidr})
		if !slices.Contains(b.ifSubnets[sub], r) {
			b.ifSubnets[sub] = append(b.ifSubnets[sub], r)
		}
		b.needNet(hostOf[rid], netID)
		return nil
	})
}

func netRoutes(js string) []netstate.Route {
	var rs []route
	_ = store.FromJSON(js, &rs)
	var out []netstate.Route
	for _, r := range rs {
		out = append(out, netstate.Route{Destination: r.Destination, NextHop: r.Nexthop})
	}
	return out
}

// networks loads the hosts' networks with their subnets and DHCP port,
// making the DHCP port where one is missing, and gives each host its own
// (peers come next). Ports on a network without a segment (the flat
// public one) are not wired here.
func (b *hostBuild) networks(ctx context.Context) error {
	db := b.s.db
	var all []*netstate.Network
	err := queryIn(ctx, db, b.netIDs, `SELECT id, project_id, segmentation_id, mtu FROM networks
		WHERE segmentation_id IS NOT NULL AND id IN (@)`, []any{theIDs}, func(rows *sql.Rows) error {
		n := &netstate.Network{}
		var vni int64
		if err := rows.Scan(&n.ID, &n.ProjectID, &vni, &n.MTU); err != nil {
			return err
		}
		n.VNI, n.Subnets, n.Peers = uint32(vni), []netstate.Subnet{}, []netstate.Peer{}
		b.nets[n.ID] = n
		all = append(all, n)
		return nil
	})
	if err != nil {
		return err
	}
	ids := make([]string, len(all))
	for i, n := range all {
		ids[i] = n.ID
	}
	slices.Sort(ids)
	dhcpOn := map[string]bool{} // subnet
	err = queryIn(ctx, db, ids, `SELECT id, network_id, cidr, COALESCE(gateway_ip, ''), dns_nameservers, host_routes,
			enable_dhcp FROM subnets WHERE network_id IN (@) ORDER BY created_at, id`, []any{theIDs}, func(rows *sql.Rows) error {
		var sn netstate.Subnet
		var netID, dns, routes string
		var dhcp int
		if err := rows.Scan(&sn.ID, &netID, &sn.CIDR, &sn.Gateway, &dns, &routes, &dhcp); err != nil {
			return err
		}
		_ = store.FromJSON(dns, &sn.DNS)
		sn.Routes = netRoutes(routes)
		sn.EnableDHCP = dhcp == 1
		dhcpOn[sn.ID] = sn.EnableDHCP
		n := b.nets[netID]
		n.Subnets = append(n.Subnets, sn)
		return nil
	})
	if err != nil {
		return err
	}
	if err := b.dhcpPorts(ctx, ids, dhcpOn); err != nil {
		return err
	}
	if lacking := dhcpLacking(all); len(lacking) > 0 {
		if err := b.s.ensureDHCP(ctx, lacking); err != nil {
			return err
		}
		if err := b.dhcpPorts(ctx, lacking, dhcpOn); err != nil {
			return err
		}
	}
	for _, name := range b.names {
		st := b.states[name]
		for _, id := range b.hostNets[name] {
			if n := b.nets[id]; n != nil {
				st.Networks = append(st.Networks, *n)
			}
		}
		slices.SortFunc(st.Networks, func(x, y netstate.Network) int { return strings.Compare(x.ID, y.ID) })
		st.Ports = slices.DeleteFunc(st.Ports, func(p netstate.Port) bool { return b.nets[p.NetworkID] == nil })
	}
	return nil
}

// dhcpLacking lists the networks whose DHCP port has no address on some
// DHCP subnet, or that have none.
func dhcpLacking(nets []*netstate.Network) []string {
	var out []string
	for _, n := range nets {
		for _, sn := range n.Subnets {
			if sn.EnableDHCP && (n.DHCP == nil || !slices.ContainsFunc(n.DHCP.IPs, func(f netstate.FixedIP) bool { return f.SubnetID == sn.ID })) {
				out = append(out, n.ID)
				break
			}
		}
	}
	return out
}

// dhcpPorts reads the networks' DHCP ports: their MAC and their
// addresses on DHCP subnets.
func (b *hostBuild) dhcpPorts(ctx context.Context, ids []string, dhcpOn map[string]bool) error {
	for _, id := range ids {
		b.nets[id].DHCP = nil
	}
	return queryIn(ctx, b.s.db, ids, `SELECT p.network_id, p.mac_address, a.subnet_id, a.ip_address
		FROM ports p CROSS JOIN ip_allocations a
		WHERE p.network_id IN (@) AND p.bound_by = ? AND a.owner_id = p.id ORDER BY p.network_id, a.seq`,
		[]any{theIDs, bindDHCP}, func(rows *sql.Rows) error {
			var netID, mac, sub, ip string
			if err := rows.Scan(&netID, &mac, &sub, &ip); err != nil {
				return err
			}
			if !dhcpOn[sub] {
				return nil
			}
			n := b.nets[netID]
			if n.DHCP == nil {
				n.DHCP = &netstate.DHCPPort{MAC: mac}
			}
			n.DHCP.IPs = append(n.DHCP.IPs, netstate.FixedIP{SubnetID: sub, IP: ip})
			return nil
		})
}

// peers lists, per network of each host, the other hosts with a server
// port or a router interface on it, with the MACs behind them; a host
// that is not bridged (no VTEP) is no peer.
func (b *hostBuild) peers(ctx context.Context) error {
	ids := make([]string, 0, len(b.nets))
	for id := range b.nets {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	// on[network] maps each host with a port there to its MACs.
	on := map[string]map[string][]string{}
	err := queryIn(ctx, b.s.db, ids, `SELECT p.network_id, s.host, p.mac_address
		FROM ports p CROSS JOIN compute_servers s
		WHERE p.network_id IN (@) AND p.bound_by = ? AND s.id = p.bound_device AND s.project_id = p.project_id
			AND `+liveServer+`
		UNION ALL SELECT p.network_id, r.host, p.mac_address FROM ports p CROSS JOIN routers r
		WHERE p.network_id IN (@) AND p.bound_by = ? AND p.device_owner = ? AND r.id = p.bound_device
			AND r.host <> '' AND r.admin_state_up = 1`,
		[]any{theIDs, bindCompute, theIDs, bindRouter, ownerRouterInterface}, func(rows *sql.Rows) error {
			var net, host, mac string
			if err := rows.Scan(&net, &host, &mac); err != nil {
				return err
			}
			if on[net] == nil {
				on[net] = map[string][]string{}
			}
			on[net][host] = append(on[net][host], mac)
			return nil
		})
	if err != nil {
		return err
	}
	// Each network's peers once, sorted by host; each host then leaves
	// itself out.
	all := map[string][]netstate.Peer{}
	for net, byHost := range on {
		var ps []netstate.Peer
		for host, macs := range byHost {
			h, ok := b.hosts[host]
			if !ok || h.VTEP == "" {
				continue
			}
			slices.Sort(macs)
			ps = append(ps, netstate.Peer{Host: host, VTEP: h.VTEP, MACs: slices.Compact(macs)})
		}
		slices.SortFunc(ps, func(x, y netstate.Peer) int { return strings.Compare(x.Host, y.Host) })
		all[net] = ps
	}
	for _, name := range b.names {
		st := b.states[name]
		for i := range st.Networks {
			n := &st.Networks[i]
			n.Peers = []netstate.Peer{}
			for _, p := range all[n.ID] {
				if p.Host != name {
					n.Peers = append(n.Peers, p)
				}
			}
		}
	}
	return nil
}

// groups gives each host the security groups of its ports with port
// security on, and those their rules name as remote groups, each with its
// rules and members.
func (b *hostBuild) groups(ctx context.Context) error {
	own := map[string][]string{} // host → its ports' groups, sorted
	var ids []string
	for _, name := range b.names {
		var mine []string
		for _, p := range b.states[name].Ports {
			if p.PortSecurity {
				mine = append(mine, p.SecurityGroups...)
			}
		}
		slices.Sort(mine)
		own[name] = slices.Compact(mine)
		ids = append(ids, own[name]...)
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	if len(ids) == 0 {
		return nil
	}
	rules := map[string][]netstate.Rule{}
	readRules := func(ids []string) ([]string, error) {
		var remote []string
		err := queryIn(ctx, b.s.db, ids, `SELECT id, security_group_id, direction, ethertype, COALESCE(protocol, ''),
				port_range_min, port_range_max, COALESCE(remote_ip_prefix, ''), COALESCE(remote_group_id, '')
			FROM security_group_rules WHERE security_group_id IN (@) ORDER BY id`, []any{theIDs}, func(rows *sql.Rows) error {
			var r netstate.Rule
			var sg string
			var pmin, pmax sql.NullInt64
			if err := rows.Scan(&r.ID, &sg, &r.Direction, &r.Ethertype, &r.Protocol, &pmin, &pmax, &r.RemoteIPPrefix,
				&r.RemoteGroupID); err != nil {
				return err
			}
			r.PortMin, r.PortMax = nullInt(pmin), nullInt(pmax)
			rules[sg] = append(rules[sg], r)
			if r.RemoteGroupID != "" {
				remote = append(remote, r.RemoteGroupID)
			}
			return nil
		})
		return remote, err
	}
	remote, err := readRules(ids)
	if err != nil {
		return err
	}
	remote = slices.DeleteFunc(remote, func(id string) bool { _, ok := slices.BinarySearch(ids, id); return ok })
	slices.Sort(remote)
	remote = slices.Compact(remote)
	if _, err := readRules(remote); err != nil {
		return err
	}
	ids = append(ids, remote...)
	slices.Sort(ids)
	members, err := b.members(ctx, ids)
	if err != nil {
		return err
	}
	groups := map[string]netstate.SecurityGroup{}
	err = queryIn(ctx, b.s.db, ids, "SELECT id, stateful FROM security_groups WHERE id IN (@)", []any{theIDs},
		func(rows *sql.Rows) error {
			var g netstate.SecurityGroup
			var stateful int
			if err := rows.Scan(&g.ID, &stateful); err != nil {
				return err
			}
			g.Stateful, g.Rules = stateful == 1, rules[g.ID]
			if g.Rules == nil {
				g.Rules = []netstate.Rule{}
			}
			m := members[g.ID]
			slices.Sort(m)
			g.Members = slices.Compact(m)
			if g.Members == nil {
				g.Members = []string{}
			}
			groups[g.ID] = g
			return nil
		})
	if err != nil {
		return err
	}
	for _, name := range b.names {
		mine := own[name]
		need := slices.Clone(mine)
		for _, g := range mine {
			for _, r := range rules[g] {
				if r.RemoteGroupID != "" {
					need = append(need, r.RemoteGroupID)
				}
			}
		}
		slices.Sort(need)
		st := b.states[name]
		for _, id := range slices.Compact(need) {
			if g, ok := groups[id]; ok {
				st.SecurityGroups = append(st.SecurityGroups, g)
			}
		}
	}
	return nil
}

// members maps each group to the fixed IPs and allowed address pairs of
// its ports. Ports first, then their addresses, each by its index: one
// join would let PostgreSQL's planner scan every port.
func (b *hostBuild) members(ctx context.Context, groups []string) (map[string][]string, error) {
	inGroups := map[string][]string{} // port → groups
	var ports []string
	err := queryIn(ctx, b.s.db, groups, "SELECT security_group_id, port_id FROM port_security_groups WHERE security_group_id IN (@)",
		[]any{theIDs}, func(rows *sql.Rows) error {
			var sg, port string
			if err := rows.Scan(&sg, &port); err != nil {
				return err
			}
			if inGroups[port] == nil {
				ports = append(ports, port)
			}
			inGroups[port] = append(inGroups[port], sg)
			return nil
		})
	if err != nil {
		return nil, err
	}
	out := map[string][]string{}
	err = queryIn(ctx, b.s.db, ports, `SELECT p.id, p.allowed_address_pairs, COALESCE(a.ip_address, '')
		FROM ports p LEFT JOIN ip_allocations a ON a.owner_id = p.id WHERE p.id IN (@)`, []any{theIDs}, func(rows *sql.Rows) error {
		var port, pairs, ip string
		if err := rows.Scan(&port, &pairs, &ip); err != nil {
			return err
		}
		var addrs []string
		if ip != "" {
			addrs = append(addrs, ip)
		}
		if pairs != "[]" {
			for _, ap := range addressPairs(pairs) {
				addrs = append(addrs, ap.IP)
			}
		}
		for _, sg := range inGroups[port] {
			out[sg] = append(out[sg], addrs...)
		}
		return nil
	})
	return out, err
}

func nullInt(n sql.NullInt64) *int {
	if !n.Valid {
		return nil
	}
	v := int(n.Int64)
	return &v
}

// floatingIPs gives the hosts' routers their floating IPs: an address is
// NATed by the router that joins its fixed IP's subnet to the address's
// network, the first made when several do (as routerFor answers
// router_id).
func (b *hostBuild) floatingIPs(ctx context.Context) error {
	if len(b.ifSubnets) == 0 {
		return nil
	}
	subs := make([]string, 0, len(b.ifSubnets))
	for id := range b.ifSubnets {
		subs = append(subs, id)
	}
	sort.Strings(subs)
	// The router serving each (subnet, external network): the first made.
	type key struct{ subnet, extNet string }
	serving := map[key]string{}
	err := queryIn(ctx, b.s.db, subs, `SELECT a.subnet_id, r.gw_network_id, r.id FROM routers r
		JOIN ports p ON p.bound_by = ? AND p.bound_device = r.id AND p.device_owner = ?
		JOIN ip_allocations a ON a.owner_id = p.id
		WHERE r.gw_network_id IS NOT NULL AND a.subnet_id IN (@) ORDER BY r.created_at, r.id`,
		[]any{bindRouter, ownerRouterInterface, theIDs}, func(rows *sql.Rows) error {
			var k key
			var rid string
			if err := rows.Scan(&k.subnet, &k.extNet, &rid); err != nil {
				return err
			}
			if _, ok := serving[k]; !ok {
				serving[k] = rid
			}
			return nil
		})
	if err != nil {
		return err
	}
	return queryIn(ctx, b.s.db, subs, `SELECT f.id, f.floating_ip_address, f.fixed_ip_address, f.port_id,
			f.floating_network_id, a.subnet_id
		FROM floatingips f JOIN ip_allocations a ON a.owner_id = f.port_id AND a.ip_address = f.fixed_ip_address
		WHERE a.subnet_id IN (@) ORDER BY f.floating_ip_address`, []any{theIDs}, func(rows *sql.Rows) error {
		var f netstate.FloatingIP
		var k key
		if err := rows.Scan(&f.ID, &f.Address, &f.FixedIP, &f.PortID, &k.extNet, &k.subnet); err != nil {
			return err
		}
		for _, r := range b.ifSubnets[k.subnet] {
			if serving[k] == r.ID {
				r.FloatingIPs = append(r.FloatingIPs, f)
			}
		}
		return nil
	})
}

// ensureDHCP gives each of the networks that has a DHCP subnet its DHCP
// port, with an address on every DHCP subnet. Two controllers racing on
// one network meet on the ports_dhcp_network key (PostgreSQL) or the
// write lock (SQLite); the loser finds the winner's port on its retry.
func (s *Service) ensureDHCP(ctx context.Context, netIDs []string) error {
	missing, err := dhcpMissing(ctx, s.db, netIDs)
	if err != nil || len(missing) == 0 {
		return err
	}
	nets := slices.Sorted(func(yield func(string) bool) {
		for id := range missing {
			if !yield(id) {
				return
			}
		}
	})
	for attempt := 0; ; attempt++ {
		err = s.db.Tx(ctx, func(tx *store.Tx) error {
			for _, id := range nets {
				if err := makeDHCPPort(ctx, tx, id); err != nil {
					return err
				}
			}
			s.changedAfterCommit(tx)
			return nil
		})
		if err == nil || attempt == 1 {
			return err
		}
	}
}

// dhcpMissing maps each network to its DHCP subnets where the network's
// DHCP port has no address.
func dhcpMissing(ctx context.Context, q store.Querier, netIDs []string) (map[string][]string, error) {
	out := map[string][]string{}
	err := queryIn(ctx, q, netIDs, `SELECT sn.network_id, sn.id FROM subnets sn
		WHERE sn.enable_dhcp = 1 AND sn.network_id IN (@) AND NOT EXISTS (SELECT 1 FROM ip_allocations a
			JOIN ports p ON p.id = a.owner_id WHERE a.subnet_id = sn.id AND p.bound_by = ?)
		ORDER BY sn.created_at, sn.id`, []any{theIDs, bindDHCP}, func(rows *sql.Rows) error {
		var netID, sub string
		if err := rows.Scan(&netID, &sub); err != nil {
			return err
		}
		out[netID] = append(out[netID], sub)
		return nil
	})
	return out, err
}

// makeDHCPPort makes network netID's DHCP port, or gives the one there an
// address on each DHCP subnet it lacks, in tx.
func makeDHCPPort(ctx context.Context, tx *store.Tx, netID string) error {
	n, err := getNet(ctx, tx, netID)
	if store.IsNoRows(err) || err == store.ErrNotFound {
		return nil // deleted meanwhile
	}
	if err != nil {
		return err
	}
	var portID string
	err = tx.QueryRow(ctx, "SELECT id FROM ports WHERE network_id = ? AND bound_by = ?", netID, bindDHCP).Scan(&portID)
	if err != nil && !store.IsNoRows(err) {
		return err
	}
	if portID != "" {
		// Lock the port first, so that two adders cannot both add.
		if _, err := tx.Exec(ctx, "UPDATE ports SET revision_number = revision_number + 1 WHERE id = ?", portID); err != nil {
			return err
		}
	}
	missing, err := dhcpMissing(ctx, tx, []string{netID})
	if err != nil || len(missing[netID]) == 0 {
		return err
	}
	var reqs []ipRequest
	for _, sub := range missing[netID] {
		reqs = append(reqs, ipRequest{SubnetID: sub})
	}
	if portID != "" {
		_, err := allocateIPs(ctx, tx, netID, portID, reqs, false)
		return err
	}
	p := &portRow{ID: newID(), NetworkID: netID, ProjectID: n.ProjectID, Status: "ACTIVE", DeviceID: "dhcp-" + netID,
		DeviceOwner: ownerDHCP, BoundBy: bindDHCP, BoundDevice: netID, AdminStateUp: true, PortSecurity: false}
	return insertPort(ctx, tx, p, reqs, "")
}

// deleteDHCPPort removes a network's DHCP port, in the transaction that
// deletes the network: it is the system's, not a port in use.
func deleteDHCPPort(ctx context.Context, tx *store.Tx, netID string) error {
	var id string
	err := tx.QueryRow(ctx, "SELECT id FROM ports WHERE network_id = ? AND bound_by = ?", netID, bindDHCP).Scan(&id)
	if store.IsNoRows(err) {
		return nil
	}
	if err != nil {
		return err
	}
	return deletePortRow(ctx, tx, id)
}

// releaseDHCPAddress frees the DHCP port's address on a subnet being
// deleted, in its transaction: it keeps no subnet in use.
func releaseDHCPAddress(ctx context.Context, tx *store.Tx, subnetID string) error {
	_, err := tx.Exec(ctx, "DELETE FROM ip_allocations WHERE subnet_id = ? AND owner_id IN (SELECT id FROM ports WHERE bound_by = ?)",
		subnetID, bindDHCP)
	return err
}

// placeRouters puts each router whose host is not a live gateway host on
// the live gateway host with the fewest routers. Without any live
// gateway host routers stay where they are.
func (s *Service) placeRouters(ctx context.Context, hosts []HostInfo) error {
	var gws []string
	for _, h := range hosts {
		if h.Gateway && h.Up {
			gws = append(gws, h.Name)
		}
	}
	if len(gws) == 0 {
		return nil
	}
	sort.Strings(gws)
	args := make([]any, len(gws))
	for i, g := range gws {
		args[i] = g
	}
	misplaced := "SELECT id, host FROM routers WHERE host NOT IN (" + api.Placeholders(len(gws)) + ") ORDER BY created_at, id"
	var k int
	if err := s.db.QueryRow(ctx, "SELECT COUNT(*) FROM ("+misplaced+") m", args...).Scan(&k); err != nil || k == 0 {
		return err
	}
	return s.db.Tx(ctx, func(tx *store.Tx) error {
		load := map[string]int{}
		for _, g := range gws {
			load[g] = 0
		}
		rows, err := tx.Query(ctx, "SELECT host, COUNT(*) FROM routers WHERE host IN ("+api.Placeholders(len(gws))+") GROUP BY host", args...)
		if err != nil {
			return err
		}
		for rows.Next() {
			var h string
			var n int
			if err := rows.Scan(&h, &n); err != nil {
				rows.Close()
				return err
			}
			load[h] = n
		}
		rows.Close()
		type placing struct{ id, from string }
		var todo []placing
		rows, err = tx.Query(ctx, misplaced, args...)
		if err != nil {
			return err
		}
		for rows.Next() {
			var p placing
			if err := rows.Scan(&p.id, &p.from); err != nil {
				rows.Close()
				return err
			}
			todo = append(todo, p)
		}
		rows.Close()
		for _, p := range todo {
			to := gws[0]
			for _, g := range gws {
				if load[g] < load[to] {
					to = g
				}
			}
			// The old host in the condition: a concurrent placement wins.
			res, err := tx.Exec(ctx, "UPDATE routers SET host = ? WHERE id = ? AND host = ?", to, p.id, p.from)
			if err != nil {
				return err
			}
			if n, _ := res.RowsAffected(); n == 1 {
				load[to]++
			}
		}
		s.changedAfterCommit(tx)
		return nil
	})
}

// ServerAt names the server whose port on networkID has fixed IP ip and
// the host it runs on, as the metadata proxy identifies a guest; found is
// false when no live server has that address there.
func (s *Service) ServerAt(ctx context.Context, networkID, ip string) (serverID, host string, found bool, err error) {
	err = s.db.QueryRow(ctx, `SELECT s.id, s.host FROM ip_allocations a JOIN ports p ON p.id = a.owner_id
		JOIN compute_servers s ON s.id = p.bound_device AND s.project_id = p.project_id
		WHERE a.network_id = ? AND a.ip_address = ? AND p.bound_by = ? AND `+liveServer,
		networkID, ip, bindCompute).Scan(&serverID, &host)
	if store.IsNoRows(err) {
		return "", "", false, nil
	}
	return serverID, host, err == nil, err
}
