package network

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strings"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// Device owners of router ports (neutron_lib/constants.py).
const (
	ownerRouterInterface = "network:router_interface"
	ownerRouterGateway   = "network:router_gateway"
)

// routerRow is a router; its interfaces are ports the router code bound to
// it (bound_by 'router', bound_device its id) owned by
// network:router_interface.
type routerRow struct {
	ID, Name, ProjectID, Description string
	AdminStateUp, EnableSNAT         bool
	GwNetworkID, GwPortID            *string
	Tags                             []string
	Routes                           []route // extra routes (extraroute)
	CreatedAt, UpdatedAt             string
	Revision                         int64
	gwIPs                            []FixedIP
}

func loadRouters(ctx context.Context, q store.Querier, where string, args ...any) ([]*routerRow, error) {
	rows, err := q.Query(ctx, `SELECT id, name, project_id, description, admin_state_up, gw_network_id, gw_port_id,
		enable_snat, tags, routes, created_at, updated_at, revision_number FROM routers WHERE `+where+" ORDER BY created_at, id", args...)
	if err != nil {
		return nil, err
	}
	var out []*routerRow
	var gwPorts []any
	for rows.Next() {
		var rt routerRow
		var up, snat int
		var gwn, gwp sql.NullString
		var tags, routes string
		if err := rows.Scan(&rt.ID, &rt.Name, &rt.ProjectID, &rt.Description, &up, &gwn, &gwp, &snat, &tags,
			&routes, &rt.CreatedAt, &rt.UpdatedAt, &rt.Revision); err != nil {
			rows.Close()
			return nil, err
		}
		rt.Routes = []route{}
		_ = store.FromJSON(routes, &rt.Routes)
		rt.AdminStateUp, rt.EnableSNAT = up == 1, snat == 1
		rt.GwNetworkID, rt.GwPortID = nullStr(gwn), nullStr(gwp)
		rt.Tags = tagsOf(tags)
		if rt.GwPortID != nil {
			gwPorts = append(gwPorts, *rt.GwPortID)
		}
		out = append(out, &rt)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	ips := map[string][]FixedIP{}
	err = inChunks(gwPorts, func(chunk []any) error {
		ps, err := loadPorts(ctx, q, "id IN ("+api.Placeholders(len(chunk))+")", chunk...)
		for _, p := range ps {
			ips[p.ID] = p.FixedIPs
		}
		return err
	})
	for _, rt := range out {
		if rt.GwPortID != nil {
			rt.gwIPs = ips[*rt.GwPortID]
		}
	}
	return out, err
}

func (rt *routerRow) view() map[string]any {
	var gw any
	if rt.GwNetworkID != nil {
		fips := make([]map[string]string, 0, len(rt.gwIPs))
		for _, f := range rt.gwIPs {
			fips = append(fips, map[string]string{"subnet_id": f.SubnetID, "ip_address": f.IPAddress})
		}
		gw = map[string]any{"network_id": *rt.GwNetworkID, "enable_snat": rt.EnableSNAT, "external_fixed_ips": fips}
	}
	return map[string]any{
		"id": rt.ID, "name": rt.Name, "status": "ACTIVE", "admin_state_up": rt.AdminStateUp,
		"external_gateway_info": gw, "routes": rt.Routes, "project_id": rt.ProjectID, "tenant_id": rt.ProjectID,
		"description": rt.Description, "tags": rt.Tags,
		"created_at": neutronTime(rt.CreatedAt), "updated_at": neutronTime(rt.UpdatedAt), "revision_number": rt.Revision,
	}
}

var routerFilters = filterableOf(viewKeys((&routerRow{}).view())...)

func errRouterNotFound(id string) *api.Error {
	return nerr(404, "RouterNotFound", "Router %s could not be found", id)
}

func ownedRouter(ctx context.Context, q store.Querier, c *api.Caller, id string) (*routerRow, error) {
	l, err := loadRouters(ctx, q, "id = ?", id)
	if err != nil {
		return nil, err
	}
	if len(l) == 0 || (!c.IsAdmin() && l[0].ProjectID != c.ProjectID) {
		return nil, errRouterNotFound(id)
	}
	return l[0], nil
}

func routerRoutes(s *Service) []api.Route {
	return []api.Route{
		{Pattern: "GET /v2.0/routers", Handler: s.listRouters},
		{Pattern: "POST /v2.0/routers", Handler: s.createRouter},
		{Pattern: "GET /v2.0/routers/{id}", Handler: s.showRouter},
		{Pattern: "PUT /v2.0/routers/{id}", Handler: s.updateRouter},
		{Pattern: "DELETE /v2.0/routers/{id}", Handler: s.deleteRouter},
		{Pattern: "PUT /v2.0/routers/{id}/add_router_interface", Handler: s.routerInterface(true)},
		{Pattern: "PUT /v2.0/routers/{id}/remove_router_interface", Handler: s.routerInterface(false)},
		{Pattern: "PUT /v2.0/routers/{id}/add_extraroutes", Handler: s.extraRoutes(addRoutes)},
		{Pattern: "PUT /v2.0/routers/{id}/remove_extraroutes", Handler: s.extraRoutes(removeRoutes)},
	}
}

func (s *Service) listRouters(r *http.Request) (*api.Response, error) {
	c := caller(r)
	where, args := "1 = 1", []any{}
	if !c.IsAdmin() {
		where, args = "project_id = ?", []any{c.ProjectID}
	}
	l, err := loadRouters(r.Context(), s.db, where, args...)
	if err != nil {
		return nil, err
	}
	items := make([]map[string]any, 0, len(l))
	for _, rt := range l {
		items = append(items, rt.view())
	}
	return render(r, "routers", items, routerFilters)
}

func (s *Service) showRouter(r *http.Request) (*api.Response, error) {
	rt, err := ownedRouter(r.Context(), s.db, caller(r), pathID(r, "id"))
	if err != nil {
		return nil, err
	}
	return showOne(r, 200, "router", rt.view()), nil
}

// gatewayInfo is the external_gateway_info of a request.
type gatewayInfo struct {
	NetworkID  string          `json:"network_id"`
	EnableSNAT *bool           `json:"enable_snat"`
	FixedIPs   json.RawMessage `json:"external_fixed_ips"`
}

// setGateway points a router at an external network (nil clears it),
// replacing its gateway port (neutron/db/l3_db.py _update_router_gw_info).
func setGateway(ctx context.Context, q store.Querier, c *api.Caller, rt *routerRow, gi *gatewayInfo) error {
	if gi != nil && gi.FixedIPs != nil && string(gi.FixedIPs) != "null" && !c.IsAdmin() {
		return policyDenied("update_router:external_gateway_info:external_fixed_ips")
	}
	if gi != nil && gi.EnableSNAT != nil && !c.IsAdmin() {
		return policyDenied("update_router:external_gateway_info:enable_snat")
	}
	if gi != nil && rt.GwNetworkID != nil && *rt.GwNetworkID == gi.NetworkID {
		if gi.EnableSNAT != nil {
			rt.EnableSNAT = *gi.EnableSNAT
		}
		return nil
	}
	if rt.GwNetworkID != nil {
		if err := checkGatewayNeedNot(ctx, q, rt); err != nil {
			return err
		}
	}
	if rt.GwPortID != nil {
		if err := deletePortRow(ctx, q, *rt.GwPortID); err != nil {
			return err
		}
		rt.GwNetworkID, rt.GwPortID, rt.gwIPs = nil, nil, nil
	}
	if gi == nil {
		return nil
	}
	n, err := visibleNet(ctx, q, c, gi.NetworkID)
	if err != nil {
		return err
	}
	if !n.External {
		return nerr(400, "BadRequest", "Bad router request: Network %s is not an external network.", n.ID)
	}
	var reqs []ipRequest
	if gi.FixedIPs != nil && string(gi.FixedIPs) != "null" {
		if err := json.Unmarshal(gi.FixedIPs, &reqs); err != nil {
			return invalid("external_fixed_ips", gi.FixedIPs, "Invalid data format for fixed IP: '%s'")
		}
	}
	p := &portRow{ID: newID(), NetworkID: n.ID, Status: "ACTIVE", DeviceID: rt.ID, DeviceOwner: ownerRouterGateway,
		BoundBy: bindRouter, BoundDevice: rt.ID, AdminStateUp: true, PortSecurity: false}
	if err := insertPort(ctx, q, p, reqs, ""); err != nil {
		return err
	}
	rt.GwNetworkID, rt.GwPortID, rt.gwIPs = &n.ID, &p.ID, p.FixedIPs
	rt.EnableSNAT = gi.EnableSNAT == nil || *gi.EnableSNAT
	return nil
}

// routerAttrs applies the writable router attributes.
func routerAttrs(ctx context.Context, q store.Querier, c *api.Caller, b body, rt *routerRow) error {
	if v, ok, err := b.str("name", 255); err != nil {
		return err
	} else if ok {
		rt.Name = v
	}
	if v, ok, err := b.str("description", 255); err != nil {
		return err
	} else if ok {
		rt.Description = v
	}
	if v, ok, err := b.boolean("admin_state_up"); err != nil {
		return err
	} else if ok {
		rt.AdminStateUp = v
	}
	raw, ok := b["external_gateway_info"]
	if !ok {
		return nil
	}
	var gi *gatewayInfo
	if err := json.Unmarshal(raw, &gi); err != nil {
		return invalid("external_gateway_info", raw, "Invalid data format for external_gateway_info: '%s'")
	}
	if gi != nil && gi.NetworkID == "" {
		gi = nil // {} clears the gateway, as neutron does
	}
	return setGateway(ctx, q, c, rt, gi)
}

func saveRouter(ctx context.Context, q store.Querier, rt *routerRow, insert bool) error {
	if rt.Routes == nil {
		rt.Routes = []route{}
	}
	if insert {
		_, err := q.Exec(ctx, `INSERT INTO routers (id, name, project_id, description, admin_state_up, gw_network_id,
			gw_port_id, enable_snat, tags, routes, created_at, updated_at, revision_number)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, '[]', ?, ?, ?, 0)`,
			rt.ID, rt.Name, rt.ProjectID, rt.Description, b2i(rt.AdminStateUp), rt.GwNetworkID, rt.GwPortID,
			b2i(rt.EnableSNAT), store.JSON(rt.Routes), rt.CreatedAt, rt.UpdatedAt)
		return err
	}
	_, err := q.Exec(ctx, `UPDATE routers SET name = ?, description = ?, admin_state_up = ?, gw_network_id = ?,
		gw_port_id = ?, enable_snat = ?, routes = ?, updated_at = ?, revision_number = ? WHERE id = ?`,
		rt.Name, rt.Description, b2i(rt.AdminStateUp), rt.GwNetworkID, rt.GwPortID, b2i(rt.EnableSNAT),
		store.JSON(rt.Routes), rt.UpdatedAt, rt.Revision, rt.ID)
	return err
}

func (s *Service) createRouter(r *http.Request) (*api.Response, error) {
	c := caller(r)
	b, err := decodeBody(r, "router", "name", "admin_state_up", "description", "tenant_id", "project_id",
		"external_gateway_info", "routes")
	if err != nil {
		return nil, err
	}
	if b.has("routes") {
		// extraroute's routes are allow_post False (neutron/api/v2/base.py)
		return nil, nerr(400, "HTTPBadRequest", "Attribute 'routes' not allowed in POST")
	}
	rt := &routerRow{ID: newID(), AdminStateUp: true, EnableSNAT: true, Tags: []string{}}
	if rt.ProjectID, err = projectFor(c, b, "router"); err != nil {
		return nil, err
	}
	err = s.db.Tx(r.Context(), func(tx *store.Tx) error {
		if err := checkQuota(r.Context(), tx, rt.ProjectID, "router"); err != nil {
			return err
		}
		if err := routerAttrs(r.Context(), tx, c, b, rt); err != nil {
			return err
		}
		t := now()
		rt.CreatedAt, rt.UpdatedAt = t, t
		return saveRouter(r.Context(), tx, rt, true)
	})
	if err != nil {
		return nil, err
	}
	return showOne(r, 201, "router", rt.view()), nil
}

func (s *Service) updateRouter(r *http.Request) (*api.Response, error) {
	c := caller(r)
	b, err := decodeBody(r, "router", "name", "admin_state_up", "description", "external_gateway_info", "routes")
	if err != nil {
		return nil, err
	}
	var rt *routerRow
	err = s.db.Tx(r.Context(), func(tx *store.Tx) error {
		var err error
		if rt, err = ownedRouter(r.Context(), tx, c, pathID(r, "id")); err != nil {
			return err
		}
		if err := routerAttrs(r.Context(), tx, c, b, rt); err != nil {
			return err
		}
		if raw, ok := b["routes"]; ok {
			routes, err := parseRoutes(raw)
			if err != nil {
				return err
			}
			if err := setRoutes(r.Context(), tx, rt, routes); err != nil {
				return err
			}
		}
		rt.UpdatedAt = now()
		if err := checkRevision(r, rt.Revision); err != nil {
			return err
		}
		rt.Revision++
		return saveRouter(r.Context(), tx, rt, false)
	})
	if err != nil {
		return nil, err
	}
	return showOne(r, 200, "router", rt.view()), nil
}

func (s *Service) deleteRouter(r *http.Request) (*api.Response, error) {
	c := caller(r)
	err := s.db.Tx(r.Context(), func(tx *store.Tx) error {
		rt, err := ownedRouter(r.Context(), tx, c, pathID(r, "id"))
		if err != nil {
			return err
		}
		var n int
		if err := tx.QueryRow(r.Context(), "SELECT COUNT(*) FROM ports WHERE bound_by = ? AND bound_device = ? AND device_owner = ?",
			bindRouter, rt.ID, ownerRouterInterface).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			// neutron_lib/exceptions/l3.py RouterInUse
			return nerr(409, "RouterInUse", "Router %s still has ports", rt.ID)
		}
		if err := setGateway(r.Context(), tx, c, rt, nil); err != nil {
			return err
		}
		_, err = tx.Exec(r.Context(), "DELETE FROM routers WHERE id = ?", rt.ID)
		return err
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(204), nil
}

// routerInterface serves add_router_interface and remove_router_interface
// (neutron/db/l3_db.py); both answer the interface info with 200.
func (s *Service) routerInterface(add bool) api.HandlerFunc {
	return func(r *http.Request) (*api.Response, error) {
		c := caller(r)
		var in map[string]json.RawMessage
		if err := api.DecodeJSON(r, &in); err != nil {
			return nil, nerr(400, "HTTPBadRequest", "%s", api.AsError(err).Message)
		}
		b := body(in)
		subnetID, hasSubnet, err := b.uuidAttr("subnet_id")
		if err != nil {
			return nil, err
		}
		portID, hasPort, err := b.uuidAttr("port_id")
		if err != nil {
			return nil, err
		}
		if hasSubnet == hasPort {
			if hasSubnet && add {
				return nil, nerr(400, "BadRequest", "Bad router request: Cannot specify both subnet-id and port-id.")
			}
			if !hasSubnet {
				return nil, nerr(400, "BadRequest", "Bad router request: Either subnet_id or port_id must be specified.")
			}
		}
		var info map[string]any
		err = s.db.Tx(r.Context(), func(tx *store.Tx) error {
			rt, err := ownedRouter(r.Context(), tx, c, pathID(r, "id"))
			if err != nil {
				return err
			}
			var p *portRow
			if add {
				p, err = addInterface(r.Context(), tx, c, rt, subnetID, portID)
			} else {
				p, err = removeInterface(r.Context(), tx, rt, subnetID, portID)
			}
			if err != nil {
				return err
			}
			ids := []string{}
			for _, f := range p.FixedIPs {
				ids = append(ids, f.SubnetID)
			}
			info = map[string]any{"id": rt.ID, "tenant_id": rt.ProjectID, "project_id": rt.ProjectID, "port_id": p.ID,
				"network_id": p.NetworkID, "subnet_ids": ids}
			if len(ids) > 0 {
				info["subnet_id"] = ids[0]
			}
			_, err = tx.Exec(r.Context(), "UPDATE routers SET revision_number = revision_number + 1, updated_at = ? WHERE id = ?", now(), rt.ID)
			return err
		})
		if err != nil {
			return nil, err
		}
		return api.JSON(200, info), nil
	}
}

func addInterface(ctx context.Context, q store.Querier, c *api.Caller, rt *routerRow, subnetID, portID string) (*portRow, error) {
	if portID != "" {
		p, err := ownedPort(ctx, q, c, portID)
		if err != nil {
			return nil, err
		}
		if p.DeviceID != "" || p.BoundBy != "" {
			return nil, nerr(409, "PortInUse", "Unable to complete operation on port %s for network %s. Port already has an attached device %s.", p.ID, p.NetworkID, p.DeviceID)
		}
		if len(p.FixedIPs) == 0 {
			return nil, nerr(400, "BadRequest", "Bad router request: Router port must have at least one fixed IP.")
		}
		var subs []*subnetRow
		for _, f := range p.FixedIPs {
			sub, err := getSubnet(ctx, q, f.SubnetID)
			if err != nil {
				return nil, err
			}
			subs = append(subs, sub)
		}
		if err := checkRouterSubnets(ctx, q, rt, subs); err != nil {
			return nil, err
		}
		if _, err := q.Exec(ctx, `UPDATE ports SET device_id = ?, device_owner = ?, bound_by = ?, bound_device = ?, status = 'ACTIVE',
			security_groups = '[]', updated_at = ?, revision_number = revision_number + 1 WHERE id = ?`,
			rt.ID, ownerRouterInterface, bindRouter, rt.ID, now(), p.ID); err != nil {
			return nil, err
		}
		return p, setPortSGs(ctx, q, p.ID, nil)
	}
	sub, err := getSubnet(ctx, q, subnetID)
	if err == store.ErrNotFound {
		return nil, errSubnetNotFound(subnetID)
	}
	if err != nil {
		return nil, err
	}
	if !c.IsAdmin() && sub.ProjectID != rt.ProjectID {
		n, err := getNet(ctx, q, sub.NetworkID)
		if err != nil || !n.Shared {
			return nil, errSubnetNotFound(subnetID)
		}
	}
	if sub.Gateway == nil {
		return nil, nerr(400, "BadRequest", "Bad router request: Subnet for router interface must have a gateway IP.")
	}
	if err := checkRouterSubnets(ctx, q, rt, []*subnetRow{sub}); err != nil {
		return nil, err
	}
	p := &portRow{ID: newID(), NetworkID: sub.NetworkID, ProjectID: rt.ProjectID, Status: "ACTIVE", DeviceID: rt.ID,
		DeviceOwner: ownerRouterInterface, BoundBy: bindRouter, BoundDevice: rt.ID, AdminStateUp: true, PortSecurity: false}
	if err := insertPort(ctx, q, p, []ipRequest{{SubnetID: sub.ID, IPAddress: *sub.Gateway}}, ""); err != nil {
		return nil, err
	}
	return p, nil
}

func removeInterface(ctx context.Context, q store.Querier, rt *routerRow, subnetID, portID string) (*portRow, error) {
	ports, err := loadPorts(ctx, q, "bound_by = ? AND bound_device = ? AND device_owner = ?", bindRouter, rt.ID, ownerRouterInterface)
	if err != nil {
		return nil, err
	}
	for _, p := range ports {
		match := portID == p.ID
		if portID == "" {
			for _, f := range p.FixedIPs {
				match = match || f.SubnetID == subnetID
			}
		} else if subnetID != "" && match {
			match = false
			for _, f := range p.FixedIPs {
				match = match || f.SubnetID == subnetID
			}
		}
		if match {
			if err := checkRoutesNeedNot(ctx, q, rt, p); err != nil {
				return nil, err
			}
			if err := checkFIPsNeedNot(ctx, q, rt, p); err != nil {
				return nil, err
			}
			return p, deletePortRow(ctx, q, p.ID)
		}
	}
	if portID != "" {
		return nil, nerr(404, "RouterInterfaceNotFound", "Router %s does not have an interface with id %s", rt.ID, portID)
	}
	return nil, nerr(404, "RouterInterfaceNotFoundForSubnet", "Router %s has no interface on subnet %s", rt.ID, subnetID)
}

// maxRoutes is neutron's max_routes default: extra routes per router.
const maxRoutes = 30

// parseRoutes reads a routes attribute as neutron_lib's type:hostroutes
// validator does; null is no routes (convert_none_to_empty_list).
func parseRoutes(raw json.RawMessage) ([]route, error) {
	fail := func(format string, args ...any) error {
		return nerr(400, "HTTPBadRequest", "Invalid input for routes. Reason: "+format+".", args...)
	}
	if strings.TrimSpace(string(raw)) == "null" {
		return []route{}, nil
	}
	var items []map[string]json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, fail("Invalid data format for hostroute: '%s'", string(raw))
	}
	out := make([]route, 0, len(items))
	for _, it := range items {
		var rt route
		dst, okD := it["destination"]
		nh, okN := it["nexthop"]
		if len(it) != 2 || !okD || !okN || json.Unmarshal(dst, &rt.Destination) != nil || json.Unmarshal(nh, &rt.Nexthop) != nil {
			return nil, fail("Validation of dictionary's keys failed. Expected keys: {'destination', 'nexthop'}")
		}
		p, err := netip.ParsePrefix(rt.Destination)
		if err != nil {
			return nil, fail("'%s' is not a valid IP subnet", rt.Destination)
		}
		if p.Masked() != p {
			return nil, fail("'%s' isn't a recognized IP subnet cidr, '%s' is recommended", rt.Destination, p.Masked())
		}
		a, err := netip.ParseAddr(rt.Nexthop)
		if err != nil {
			return nil, fail("'%s' is not a valid IP address", rt.Nexthop)
		}
		rt.Destination, rt.Nexthop = p.String(), a.String()
		if slices.Contains(out, rt) {
			return nil, fail("Duplicate hostroute '%s'", routeRepr(rt))
		}
		out = append(out, rt)
	}
	return out, nil
}

// routeRepr is a route as neutron's messages print it (a Python dict).
func routeRepr(rt route) string {
	return fmt.Sprintf("{'destination': '%s', 'nexthop': '%s'}", rt.Destination, rt.Nexthop)
}

func routesRepr(routes []route) string {
	parts := make([]string, 0, len(routes))
	for _, rt := range routes {
		parts = append(parts, routeRepr(rt))
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

// routerAddrs are the subnets and addresses of all a router's ports, its
// gateway included, as neutron's extraroute _validate_routes reads them.
func routerAddrs(ctx context.Context, q store.Querier, rt *routerRow) ([]netip.Prefix, []netip.Addr, error) {
	ports, err := loadPorts(ctx, q, "bound_by = ? AND bound_device = ?", bindRouter, rt.ID)
	if err != nil {
		return nil, nil, err
	}
	var cidrs []netip.Prefix
	var ips []netip.Addr
	for _, p := range ports {
		for _, f := range p.FixedIPs {
			sub, err := getSubnet(ctx, q, f.SubnetID)
			if err != nil {
				return nil, nil, err
			}
			cidr, err := netip.ParsePrefix(sub.CIDR)
			if err != nil {
				return nil, nil, err
			}
			ip, err := netip.ParseAddr(f.IPAddress)
			if err != nil {
				return nil, nil, err
			}
			cidrs, ips = append(cidrs, cidr), append(ips, ip)
		}
	}
	return cidrs, ips, nil
}

// setRoutes replaces a router's extra routes after neutron's checks
// (neutron/db/extraroute_db.py _validate_routes): at most maxRoutes, each
// nexthop on a subnet of the router and not one of the router's own
// addresses.
func setRoutes(ctx context.Context, q store.Querier, rt *routerRow, routes []route) error {
	if len(routes) > maxRoutes {
		return nerr(400, "RoutesExhausted", "Unable to complete operation for %s. The number of routes exceeds the maximum %d.", rt.ID, maxRoutes)
	}
	cidrs, ips, err := routerAddrs(ctx, q, rt)
	if err != nil {
		return err
	}
	for _, r := range routes {
		nh, _ := netip.ParseAddr(r.Nexthop)
		if !slices.ContainsFunc(cidrs, func(c netip.Prefix) bool { return c.Contains(nh) }) {
			return nerr(400, "InvalidRoutes", "Invalid format for routes: %s, The nexthop is not connected with router", routesRepr(routes))
		}
		if slices.Contains(ips, nh) {
			return nerr(400, "InvalidRoutes", "Invalid format for routes: %s, The nexthop is used by router", routesRepr(routes))
		}
	}
	rt.Routes = routes
	return nil
}

// addRoutes is old with add merged in, exact duplicates once
// (extraroute_db.py _add_extra_routes).
func addRoutes(old, add []route) []route {
	out := slices.Clone(old)
	for _, r := range add {
		if !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	return out
}

// removeRoutes is old without remove; removing a route that is not there
// is no error (extraroute_db.py _remove_extra_routes).
func removeRoutes(old, remove []route) []route {
	return slices.DeleteFunc(slices.Clone(old), func(r route) bool { return slices.Contains(remove, r) })
}

// extraRoutes serves extraroute-atomic's add_extraroutes and
// remove_extraroutes: {"router": {"routes": [...]}} in, the whole router
// out, the new set checked as a PUT of routes would be.
func (s *Service) extraRoutes(merge func(old, change []route) []route) api.HandlerFunc {
	return func(r *http.Request) (*api.Response, error) {
		c := caller(r)
		b, err := decodeBody(r, "router", "routes")
		if err != nil {
			return nil, err
		}
		raw, ok := b["routes"]
		if !ok {
			return nil, nerr(400, "HTTPBadRequest", "Failed to parse request. Required attribute 'routes' not specified")
		}
		change, err := parseRoutes(raw)
		if err != nil {
			return nil, err
		}
		var rt *routerRow
		err = s.db.Tx(r.Context(), func(tx *store.Tx) error {
			if rt, err = ownedRouter(r.Context(), tx, c, pathID(r, "id")); err != nil {
				return err
			}
			if err := setRoutes(r.Context(), tx, rt, merge(rt.Routes, change)); err != nil {
				return err
			}
			rt.UpdatedAt = now()
			rt.Revision++
			return saveRouter(r.Context(), tx, rt, false)
		})
		if err != nil {
			return nil, err
		}
		return api.JSON(200, map[string]any{"router": rt.view()}), nil
	}
}

// checkRoutesNeedNot refuses to remove an interface whose subnet holds the
// nexthop of one of the router's routes (extraroute_db.py
// _confirm_router_interface_not_in_use).
func checkRoutesNeedNot(ctx context.Context, q store.Querier, rt *routerRow, p *portRow) error {
	for _, f := range p.FixedIPs {
		sub, err := getSubnet(ctx, q, f.SubnetID)
		if err != nil {
			return err
		}
		cidr, err := netip.ParsePrefix(sub.CIDR)
		if err != nil {
			return err
		}
		for _, r := range rt.Routes {
			if nh, err := netip.ParseAddr(r.Nexthop); err == nil && cidr.Contains(nh) {
				return nerr(409, "RouterInterfaceInUseByRoute", "Router interface for subnet %s on router %s cannot be deleted, as it is required by one or more routes.", sub.ID, rt.ID)
			}
		}
	}
	return nil
}

// checkRouterSubnets refuses a new interface on a subnet the router is
// already on, or one overlapping another interface's subnet
// (neutron/db/l3_db.py _check_for_dup_router_subnets); the gateway's
// subnet does not count.
func checkRouterSubnets(ctx context.Context, q store.Querier, rt *routerRow, add []*subnetRow) error {
	ports, err := loadPorts(ctx, q, "bound_by = ? AND bound_device = ? AND device_owner = ?", bindRouter, rt.ID, ownerRouterInterface)
	if err != nil {
		return err
	}
	var have []string
	for _, p := range ports {
		for _, f := range p.FixedIPs {
			for _, n := range add {
				if f.SubnetID == n.ID {
					return nerr(400, "BadRequest", "Bad router request: Router already has a port on subnet %s.", n.ID)
				}
			}
			have = append(have, f.SubnetID)
		}
	}
	for _, id := range have {
		old, err := getSubnet(ctx, q, id)
		if err != nil {
			return err
		}
		op, err := netip.ParsePrefix(old.CIDR)
		if err != nil {
			return err
		}
		for _, n := range add {
			if np, err := netip.ParsePrefix(n.CIDR); err == nil && np.Overlaps(op) {
				return nerr(400, "BadRequest", "Bad router request: Cidr %s of subnet %s overlaps with cidr %s of subnet %s.",
					n.CIDR, n.ID, old.CIDR, old.ID)
			}
		}
	}
	return nil
}

// checkFIPsNeedNot refuses to take interface p off rt while a floating IP
// behind it has no other router to its external network
// (neutron/db/l3_db.py _confirm_router_interface_not_in_use).
func checkFIPsNeedNot(ctx context.Context, q store.Querier, rt *routerRow, p *portRow) error {
	if rt.GwNetworkID == nil {
		return nil
	}
	for _, f := range p.FixedIPs {
		id, err := strandedFIP(ctx, q, *rt.GwNetworkID, []string{f.SubnetID}, rt.ID)
		if err != nil {
			return err
		}
		if id != "" {
			return nerr(409, "RouterInterfaceInUseByFloatingIP",
				"Router interface for subnet %s on router %s cannot be deleted, as it is required by one or more floating IPs.",
				f.SubnetID, rt.ID)
		}
	}
	return nil
}

// checkGatewayNeedNot refuses to clear or move rt's gateway while a
// floating IP behind it has no other router to its external network
// (neutron/db/l3_db.py _check_router_gw_port_in_use).
func checkGatewayNeedNot(ctx context.Context, q store.Querier, rt *routerRow) error {
	rows, err := q.Query(ctx, `SELECT DISTINCT a.subnet_id FROM ports p JOIN ip_allocations a ON a.owner_id = p.id
		WHERE p.bound_by = ? AND p.bound_device = ? AND p.device_owner = ?`, bindRouter, rt.ID, ownerRouterInterface)
	if err != nil {
		return err
	}
	var subnets []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			rows.Close()
			return err
		}
		subnets = append(subnets, s)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	id, err := strandedFIP(ctx, q, *rt.GwNetworkID, subnets, rt.ID)
	if err != nil {
		return err
	}
	if id != "" {
		return nerr(409, "RouterExternalGatewayInUseByFloatingIp",
			"Gateway cannot be updated for router %s, since a gateway to external network %s is required by one or more floating IPs.",
			rt.ID, *rt.GwNetworkID)
	}
	return nil
}
