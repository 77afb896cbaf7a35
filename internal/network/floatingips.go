package network

import (
	"context"
	"net/http"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/metering"
	"nimbus/internal/store"
)

var fipFilters = filterableOf(viewKeys((&fipRow{}).view(nil))...)

// SpendGate is billing's rule of what a project's money allows (billing's
// gate.go), asked before a project allocates a public address (CanStart:
// its first hour must be paid for) or attaches one (CanSpend: undoing
// billing's suspension needs funds left). Each answers a 403 *api.Error
// with the reason when it refuses.
type SpendGate interface {
	CanSpend(ctx context.Context, project string) error
	CanStart(ctx context.Context, project, kind string, spec metering.Spec, count int64) error
}

// SetSpendGate connects billing's gate.
func (s *Service) SetSpendGate(g SpendGate) { s.gate = g }

// checkSpend asks the gate, when there is one, whether project may
// allocate or attach a public address.
func (s *Service) checkSpend(ctx context.Context, project string) error {
	if s.gate == nil {
		return nil
	}
	return s.gate.CanSpend(ctx, project)
}

// DetachFloatingIPs takes every floating IP of project off its port,
// keeping it allocated to the project (and charged), as billing's
// suspension of an account that ran dry does; the addresses given with a
// server's flavor are the server's and stay with it. It answers how many
// it detached.
func (s *Service) DetachFloatingIPs(ctx context.Context, project string) (int, error) {
	var n int64
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		s.changedAfterCommit(tx) // hoststate.go
		res, err := tx.Exec(ctx, `UPDATE floatingips SET port_id = NULL, fixed_ip_address = NULL, updated_at = ?,
			revision_number = revision_number + 1 WHERE project_id = ? AND port_id IS NOT NULL AND server_id IS NULL`, now(), project)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	return int(n), err
}

// allocFIP takes an address for f on its external network (address if
// given, else the first free one of the network's IPv4 subnets).
func allocFIP(ctx context.Context, q store.Querier, f *fipRow, address string) error {
	var reqs []ipRequest
	if address != "" {
		reqs = []ipRequest{{IPAddress: address}}
	} else if f.SubnetID != "" {
		reqs = []ipRequest{{SubnetID: f.SubnetID}}
	}
	ips, err := allocateIPs(ctx, q, f.NetworkID, f.ID, reqs, true)
	if err != nil {
		return err
	}
	if len(ips) == 0 {
		return nerr(409, "IpAddressGenerationFailure", "No more IP addresses available on network %s.", f.NetworkID)
	}
	f.SubnetID, f.Address = ips[0].SubnetID, ips[0].IPAddress
	return nil
}

func insertFIP(ctx context.Context, q store.Querier, f *fipRow) error {
	t := now()
	f.CreatedAt, f.UpdatedAt = t, t
	if f.Tags == nil {
		f.Tags = []string{}
	}
	_, err := q.Exec(ctx, `INSERT INTO floatingips (id, project_id, description, floating_network_id, floating_subnet_id,
		floating_ip_address, port_id, fixed_ip_address, server_id, tags, created_at, updated_at, revision_number)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, '[]', ?, ?, 0)`,
		f.ID, f.ProjectID, f.Description, f.NetworkID, f.SubnetID, f.Address, f.PortID, f.FixedIP, f.ServerID, t, t)
	if err != nil {
		return err
	}
	// A public address is billed from allocation to release; one given
	// with a server's flavor is paid with the server while the server is
	// (MeterServerAddresses).
	if f.ServerID != nil {
		return nil
	}
	return metering.Set(ctx, q, metering.KindPublicIP, f.ID, f.ProjectID, &metering.Spec{PublicIPv4: true, Name: f.Address}, time.Now())
}

// MeterServerAddresses records, in q, who pays for the public addresses
// server's flavor gave it: the server, whose price includes them, while
// it is billed (serverPays); the addresses themselves, as public IPv4
// addresses, while it is not (shelved, it keeps them). internal/metering
// states the rule.
func (s *Service) MeterServerAddresses(ctx context.Context, q store.Querier, serverID string, serverPays bool) error {
	fips, err := loadFIPs(ctx, q, "server_id = ?", serverID)
	if err != nil {
		return err
	}
	for _, f := range fips {
		var spec *metering.Spec
		if !serverPays {
			spec = &metering.Spec{PublicIPv4: true, Name: f.Address}
		}
		if err := metering.Set(ctx, q, metering.KindPublicIP, f.ID, f.ProjectID, spec, time.Now()); err != nil {
			return err
		}
	}
	return nil
}

func deleteFIP(ctx context.Context, q store.Querier, id string) error {
	if err := releaseIPs(ctx, q, id); err != nil {
		return err
	}
	if _, err := q.Exec(ctx, "DELETE FROM floatingips WHERE id = ?", id); err != nil {
		return err
	}
	return metering.Set(ctx, q, metering.KindPublicIP, id, "", nil, time.Now())
}

func (s *Service) fipViews(ctx context.Context, q store.Querier, fips []*fipRow) ([]map[string]any, error) {
	var ids []any
	for _, f := range fips {
		if f.PortID != nil {
			ids = append(ids, *f.PortID)
		}
	}
	ports := map[string]*portRow{}
	if err := inChunks(ids, func(chunk []any) error {
		l, err := loadPorts(ctx, q, "id IN ("+api.Placeholders(len(chunk))+")", chunk...)
		for _, p := range l {
			ports[p.ID] = p
		}
		return err
	}); err != nil {
		return nil, err
	}
	out := make([]map[string]any, 0, len(fips))
	for _, f := range fips {
		var p *portRow
		if f.PortID != nil {
			p = ports[*f.PortID]
		}
		v := f.view(p)
		if p != nil && f.FixedIP != nil {
			rid, err := routerFor(ctx, q, f.NetworkID, p, *f.FixedIP)
			if err != nil {
				return nil, err
			}
			if rid != "" {
				v["router_id"] = rid
			}
		}
		out = append(out, v)
	}
	return out, nil
}

// subnetOf is the subnet of port p's fixed address, "" if p has none such.
func subnetOf(p *portRow, fixed string) string {
	for _, f := range p.FixedIPs {
		if f.IPAddress == fixed {
			return f.SubnetID
		}
	}
	return ""
}

// routerFor is the router that joins the subnet of a port's fixed address
// to an external network, which neutron reports as a floating IP's
// router_id (neutron/db/l3_db.py _get_router_for_floatingip); "" if none.
func routerFor(ctx context.Context, q store.Querier, extNetID string, p *portRow, fixed string) (string, error) {
	subnet := subnetOf(p, fixed)
	var id string
	err := q.QueryRow(ctx, `SELECT r.id FROM routers r
		JOIN ports ip ON ip.bound_by = ? AND ip.bound_device = r.id AND ip.device_owner = ?
		JOIN ip_allocations a ON a.owner_id = ip.id WHERE r.gw_network_id = ? AND a.subnet_id = ? ORDER BY r.created_at LIMIT 1`,
		bindRouter, ownerRouterInterface, extNetID, subnet).Scan(&id)
	if store.IsNoRows(err) {
		return "", nil
	}
	return id, err
}

// strandedFIP is a floating IP on extNetID associated with an address in
// one of subnets that no router other than exclude joins to extNetID: the
// one that a change to router exclude would leave without its NAT, which
// Neutron refuses (RouterInterfaceInUseByFloatingIP,
// RouterExternalGatewayInUseByFloatingIp); "" if none.
func strandedFIP(ctx context.Context, q store.Querier, extNetID string, subnets []string, exclude string) (string, error) {
	if len(subnets) == 0 {
		return "", nil
	}
	args := []any{extNetID}
	for _, s := range subnets {
		args = append(args, s)
	}
	args = append(args, bindRouter, ownerRouterInterface, exclude)
	var id string
	err := q.QueryRow(ctx, `SELECT f.id FROM floatingips f
		JOIN ip_allocations a ON a.owner_id = f.port_id AND a.ip_address = f.fixed_ip_address
		WHERE f.floating_network_id = ? AND a.subnet_id IN (`+api.Placeholders(len(subnets))+`)
		AND NOT EXISTS (SELECT 1 FROM routers r
			JOIN ports ip ON ip.bound_by = ? AND ip.bound_device = r.id AND ip.device_owner = ?
			JOIN ip_allocations b ON b.owner_id = ip.id
			WHERE r.id <> ? AND r.gw_network_id = f.floating_network_id AND b.subnet_id = a.subnet_id)
		LIMIT 1`, args...).Scan(&id)
	if store.IsNoRows(err) {
		return "", nil
	}
	return id, err
}

// FloatingIP is a public address as billing needs it.
type FloatingIP struct {
	ID, ProjectID, Address string
	// ServerID is set for addresses given with a server's flavor
	// (AttachPublicIP); PortID when the address is associated.
	ServerID, PortID string
	CreatedAt        time.Time
}

// FloatingIPs lists every floating IP that exists now.
func (s *Service) FloatingIPs(ctx context.Context) ([]FloatingIP, error) {
	l, err := loadFIPs(ctx, s.db, "1 = 1")
	if err != nil {
		return nil, err
	}
	out := make([]FloatingIP, 0, len(l))
	for _, f := range l {
		x := FloatingIP{ID: f.ID, ProjectID: f.ProjectID, Address: f.Address, CreatedAt: store.ParseTime(f.CreatedAt)}
		if f.ServerID != nil {
			x.ServerID = *f.ServerID
		}
		if f.PortID != nil {
			x.PortID = *f.PortID
		}
		out = append(out, x)
	}
	return out, nil
}

func (s *Service) listFIPs(r *http.Request) (*api.Response, error) {
	c := caller(r)
	where, args := "1 = 1", []any{}
	if !c.IsAdmin() {
		where, args = "project_id = ?", []any{c.ProjectID}
	}
	fips, err := loadFIPs(r.Context(), s.db, where, args...)
	if err != nil {
		return nil, err
	}
	items, err := s.fipViews(r.Context(), s.db, fips)
	if err != nil {
		return nil, err
	}
	return render(r, "floatingips", items, fipFilters)
}

func ownedFIP(ctx context.Context, q store.Querier, c *api.Caller, id string) (*fipRow, error) {
	f, err := getFIP(ctx, q, id)
	if err == store.ErrNotFound || (err == nil && !c.IsAdmin() && f.ProjectID != c.ProjectID) {
		return nil, errFIPNotFound(id)
	}
	return f, err
}

func (s *Service) showFIP(r *http.Request) (*api.Response, error) {
	f, err := ownedFIP(r.Context(), s.db, caller(r), pathID(r, "id"))
	if err != nil {
		return nil, err
	}
	v, err := s.fipViews(r.Context(), s.db, []*fipRow{f})
	if err != nil {
		return nil, err
	}
	return showOne(r, 200, "floatingip", v[0]), nil
}

// associate points f at a port of its project (neutron/db/l3_db.py
// _get_assoc_data): the port's first IPv4 address unless one is named, and
// at most one floating IP per fixed address.
func associate(ctx context.Context, q store.Querier, c *api.Caller, f *fipRow, portID string, fixed *string) error {
	p, err := getPortRow(ctx, q, portID)
	if err == store.ErrNotFound || (err == nil && p.ProjectID != f.ProjectID && !c.IsAdmin()) {
		return errPortNotFound(portID)
	}
	if err != nil {
		return err
	}
	addr := ""
	if fixed != nil {
		for _, ip := range p.FixedIPs {
			if ip.IPAddress == *fixed {
				addr = *fixed
			}
		}
		if addr == "" {
			return nerr(400, "BadRequest", "Bad floatingip request: Port %s does not have fixed ip %s.", portID, *fixed)
		}
	} else if addr = firstV4(p.FixedIPs); addr == "" {
		return nerr(400, "BadRequest", "Bad floatingip request: Port %s does not have any IPv4 address.", portID)
	}
	if p.NetworkID == f.NetworkID {
		return nerr(400, "BadRequest", "Bad floatingip request: Port %s is on the external network %s.", portID, f.NetworkID)
	}
	// The 1:1 NAT lives in the router that joins the address's subnet to
	// the external network: without one there is nothing to do it, in
	// either network mode, so Neutron's refusal holds everywhere. Nimbus's
	// own paths (a flavor's public address, the panel) make the router
	// first, as ensurePublicPath does.
	if rid, err := routerFor(ctx, q, f.NetworkID, p, addr); err != nil {
		return err
	} else if rid == "" {
		return nerr(404, "ExternalGatewayForFloatingIPNotFound",
			"External network %s is not reachable from subnet %s.  Therefore, cannot associate Port %s with a Floating IP.",
			f.NetworkID, subnetOf(p, addr), portID)
	}
	var other string
	err = q.QueryRow(ctx, "SELECT id FROM floatingips WHERE port_id = ? AND fixed_ip_address = ? AND id <> ?", portID, addr, f.ID).Scan(&other)
	if err == nil {
		return nerr(409, "FloatingIPPortAlreadyAssociated",
			"Cannot associate floating IP %s (%s) with port %s using fixed IP %s, as that fixed IP already has a floating IP on external network %s.",
			f.Address, f.ID, portID, addr, f.NetworkID)
	}
	if !store.IsNoRows(err) {
		return err
	}
	f.PortID, f.FixedIP = &p.ID, &addr
	return nil
}

func (s *Service) createFIP(r *http.Request) (*api.Response, error) {
	c := caller(r)
	b, err := decodeBody(r, "floatingip", "floating_network_id", "floating_ip_address", "subnet_id", "port_id",
		"fixed_ip_address", "description", "tenant_id", "project_id")
	if err != nil {
		return nil, err
	}
	f := &fipRow{ID: newID()}
	if f.ProjectID, err = projectFor(c, b, "floatingip"); err != nil {
		return nil, err
	}
	netID, ok, err := b.uuidAttr("floating_network_id")
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, nerr(400, "HTTPBadRequest", "Failed to parse request. Required attribute 'floating_network_id' not specified")
	}
	if f.Description, _, err = b.str("description", 255); err != nil {
		return nil, err
	}
	address, _, err := b.str("floating_ip_address", 64)
	if err != nil {
		return nil, err
	}
	if address != "" && !c.IsAdmin() {
		return nil, policyDenied("create_floatingip:floating_ip_address")
	}
	if sid, _, err := b.optUUID("subnet_id"); err != nil {
		return nil, err
	} else if sid != nil {
		f.SubnetID = *sid
	}
	portID, _, err := b.optUUID("port_id")
	if err != nil {
		return nil, err
	}
	fixed, _, err := b.optStr("fixed_ip_address")
	if err != nil {
		return nil, err
	}
	if s.gate != nil {
		if err := s.gate.CanStart(r.Context(), f.ProjectID, metering.KindPublicIP, metering.Spec{PublicIPv4: true}, 1); err != nil {
			return nil, err
		}
	}
	var views []map[string]any
	err = s.db.Tx(r.Context(), func(tx *store.Tx) error {
		n, err := visibleNet(r.Context(), tx, c, netID)
		if err != nil {
			return err
		}
		if !n.External {
			return nerr(400, "BadRequest", "Bad floatingip request: Network %s is not a valid external network.", netID)
		}
		f.NetworkID = n.ID
		if err := checkQuota(r.Context(), tx, f.ProjectID, "floatingip"); err != nil {
			return err
		}
		if f.SubnetID != "" {
			var k int
			if err := tx.QueryRow(r.Context(), "SELECT COUNT(*) FROM subnets WHERE id = ? AND network_id = ?", f.SubnetID, n.ID).Scan(&k); err != nil {
				return err
			}
			if k == 0 {
				return nerr(400, "BadRequest", "Bad floatingip request: Subnet %s does not belong to network %s.", f.SubnetID, n.ID)
			}
		}
		if err := allocFIP(r.Context(), tx, f, address); err != nil {
			return err
		}
		if portID != nil {
			if err := associate(r.Context(), tx, c, f, *portID, fixed); err != nil {
				return err
			}
		}
		if err := insertFIP(r.Context(), tx, f); err != nil {
			return err
		}
		views, err = s.fipViews(r.Context(), tx, []*fipRow{f})
		return err
	})
	if err != nil {
		return nil, err
	}
	return showOne(r, 201, "floatingip", views[0]), nil
}

func (s *Service) updateFIP(r *http.Request) (*api.Response, error) {
	c := caller(r)
	b, err := decodeBody(r, "floatingip", "port_id", "fixed_ip_address", "description")
	if err != nil {
		return nil, err
	}
	portID, portGiven, err := b.optUUID("port_id")
	if err != nil {
		return nil, err
	}
	fixed, _, err := b.optStr("fixed_ip_address")
	if err != nil {
		return nil, err
	}
	if portID != nil {
		// Attaching needs the address's account in funds.
		f, err := ownedFIP(r.Context(), s.db, c, pathID(r, "id"))
		if err != nil {
			return nil, err
		}
		if err := s.checkSpend(r.Context(), f.ProjectID); err != nil {
			return nil, err
		}
	}
	var views []map[string]any
	err = s.db.Tx(r.Context(), func(tx *store.Tx) error {
		f, err := ownedFIP(r.Context(), tx, c, pathID(r, "id"))
		if err != nil {
			return err
		}
		if v, ok, err := b.str("description", 255); err != nil {
			return err
		} else if ok {
			f.Description = v
		}
		if portGiven {
			if portID == nil {
				f.PortID, f.FixedIP = nil, nil
			} else if err := associate(r.Context(), tx, c, f, *portID, fixed); err != nil {
				return err
			}
		}
		f.UpdatedAt = now()
		if err := checkRevision(r, f.Revision); err != nil {
			return err
		}
		f.Revision++
		if _, err := tx.Exec(r.Context(), `UPDATE floatingips SET description = ?, port_id = ?, fixed_ip_address = ?,
			updated_at = ?, revision_number = ? WHERE id = ?`, f.Description, f.PortID, f.FixedIP, f.UpdatedAt, f.Revision, f.ID); err != nil {
			return err
		}
		views, err = s.fipViews(r.Context(), tx, []*fipRow{f})
		return err
	})
	if err != nil {
		return nil, err
	}
	return showOne(r, 200, "floatingip", views[0]), nil
}

func (s *Service) deleteFIP(r *http.Request) (*api.Response, error) {
	c := caller(r)
	err := s.db.Tx(r.Context(), func(tx *store.Tx) error {
		f, err := ownedFIP(r.Context(), tx, c, pathID(r, "id"))
		if err != nil {
			return err
		}
		return deleteFIP(r.Context(), tx, f.ID)
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(204), nil
}
