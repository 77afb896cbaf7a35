package network

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

var portFilters = filterableOf(viewKeys((&portRow{}).view(true))...)

// portColumns are the port attributes a list reads in SQL.
var portColumns = columnList{
	cols: map[string]string{"id": "id", "name": "name", "project_id": "project_id", "tenant_id": "project_id",
		"description": "description", "network_id": "network_id", "mac_address": "mac_address", "device_id": "device_id",
		"device_owner": "device_owner", "status": "status", "admin_state_up": "admin_state_up",
		"port_security_enabled": "port_security_enabled", "binding:vnic_type": "vnic_type"},
	bools: map[string]bool{"admin_state_up": true, "port_security_enabled": true},
}

func (s *Service) listPorts(r *http.Request) (*api.Response, error) {
	c := caller(r)
	where, args := "1 = 1", []any{}
	if !c.IsAdmin() {
		where, args = "project_id = ?", []any{c.ProjectID}
	}
	q := r.URL.Query()
	if p, ok := portColumns.page(q, where, args...); ok {
		if err := p.afterMarker(r.Context(), s.db, "ports"); err != nil {
			return nil, err
		}
		ports, err := loadPortPage(r.Context(), s.db, p.clauses(), p.Args...)
		if err != nil {
			return nil, err
		}
		return p.answer(r, "ports", portViews(ports, c.IsAdmin())), nil
	}
	// Push the most selective filters into SQL: Nova-style lookups by
	// device_id and network_id on large port tables.
	for _, k := range []string{"device_id", "network_id"} {
		if vs, ok := q[k]; ok && len(vs) > 0 {
			in, vals := api.InList(vs)
			where += " AND " + k + " " + in
			args = append(args, vals...)
		}
	}
	ports, err := loadPorts(r.Context(), s.db, where, args...)
	if err != nil {
		return nil, err
	}
	return render(r, "ports", portViews(ports, c.IsAdmin()), portFilters)
}

func portViews(ports []*portRow, admin bool) []map[string]any {
	items := make([]map[string]any, 0, len(ports))
	for _, p := range ports {
		items = append(items, p.view(admin))
	}
	return items
}

func ownedPort(ctx context.Context, q store.Querier, c *api.Caller, id string) (*portRow, error) {
	p, err := getPortRow(ctx, q, id)
	if err == store.ErrNotFound || (err == nil && !c.IsAdmin() && p.ProjectID != c.ProjectID) {
		return nil, errPortNotFound(id)
	}
	return p, err
}

func (s *Service) showPort(r *http.Request) (*api.Response, error) {
	c := caller(r)
	p, err := ownedPort(r.Context(), s.db, c, pathID(r, "id"))
	if err != nil {
		return nil, err
	}
	return showOne(r, 200, "port", p.view(c.IsAdmin())), nil
}

func randomMAC() string {
	b := make([]byte, 3)
	rand.Read(b)
	return fmt.Sprintf("fa:16:3e:%02x:%02x:%02x", b[0], b[1], b[2])
}

// insertPort stores a new port with its addresses and security groups;
// reqs nil means one address picked from the network's subnets.
func insertPort(ctx context.Context, q store.Querier, p *portRow, reqs []ipRequest, mac string) error {
	if mac != "" {
		var n int
		if err := q.QueryRow(ctx, "SELECT COUNT(*) FROM ports WHERE network_id = ? AND mac_address = ?", p.NetworkID, mac).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			return nerr(409, "MacAddressInUse", "Unable to complete operation for network %s. The mac address %s is in use.", p.NetworkID, mac)
		}
		p.MAC = mac
	} else {
		for i := 0; i < 16; i++ {
			p.MAC = randomMAC()
			var n int
			if err := q.QueryRow(ctx, "SELECT COUNT(*) FROM ports WHERE network_id = ? AND mac_address = ?", p.NetworkID, p.MAC).Scan(&n); err != nil {
				return err
			}
			if n == 0 {
				break
			}
		}
	}
	ips, err := allocateIPs(ctx, q, p.NetworkID, p.ID, reqs, true)
	if err != nil {
		return err
	}
	p.FixedIPs = ips
	if p.FixedIPs == nil {
		p.FixedIPs = []FixedIP{}
	}
	t := now()
	p.CreatedAt, p.UpdatedAt = t, t
	if p.SecurityGroups == nil {
		p.SecurityGroups = []string{}
	}
	if p.Pairs == nil {
		p.Pairs = []map[string]string{}
	}
	if p.Tags == nil {
		p.Tags = []string{}
	}
	if p.VNIC == "" {
		p.VNIC = "normal"
	}
	_, err = q.Exec(ctx, `INSERT INTO ports (id, network_id, name, project_id, description, mac_address, admin_state_up,
		status, device_id, device_owner, bound_by, bound_device, port_security_enabled, security_groups, allowed_address_pairs,
		vnic_type, server_owned, tags, created_at, updated_at, revision_number)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0)`,
		p.ID, p.NetworkID, p.Name, p.ProjectID, p.Description, p.MAC, b2i(p.AdminStateUp), p.Status, p.DeviceID,
		p.DeviceOwner, p.BoundBy, p.BoundDevice, b2i(p.PortSecurity), store.JSON(p.SecurityGroups), store.JSON(p.Pairs), p.VNIC,
		b2i(p.ServerOwned), store.JSON(p.Tags), t, t)
	if err != nil {
		return err
	}
	// A new port has no groups to replace.
	return addPortSGs(ctx, q, p.ID, p.SecurityGroups)
}

// setPortSGs replaces a port's security groups.
func setPortSGs(ctx context.Context, q store.Querier, portID string, sgs []string) error {
	if _, err := q.Exec(ctx, "DELETE FROM port_security_groups WHERE port_id = ?", portID); err != nil {
		return err
	}
	return addPortSGs(ctx, q, portID, sgs)
}

func addPortSGs(ctx context.Context, q store.Querier, portID string, sgs []string) error {
	for _, g := range sgs {
		if _, err := q.Exec(ctx, "INSERT INTO port_security_groups (port_id, security_group_id) VALUES (?, ?)", portID, g); err != nil {
			return err
		}
	}
	return nil
}

func deletePortRow(ctx context.Context, q store.Querier, id string) error {
	for _, stmt := range []string{
		"UPDATE floatingips SET port_id = NULL, fixed_ip_address = NULL WHERE port_id = ?",
		"DELETE FROM ip_allocations WHERE owner_id = ?",
		"DELETE FROM port_security_groups WHERE port_id = ?",
		"DELETE FROM ports WHERE id = ?",
	} {
		if _, err := q.Exec(ctx, stmt, id); err != nil {
			return err
		}
	}
	return nil
}

// Who bound a port (portRow.BoundBy).
const (
	bindCompute = "compute"
	bindRouter  = "router"
)

// portStatus is ACTIVE for a port the service attached to a device.
func portStatus(p *portRow) string {
	if p.BoundBy != "" {
		return "ACTIVE"
	}
	return "DOWN"
}

// Neutron's defaults for max_fixed_ips_per_port and max_allowed_address_pair.
const (
	maxFixedIPsPerPort = 5
	maxAddressPairs    = 10
)

// portAttrs applies the writable port attributes; it returns the fixed_ips
// request (nil when absent) and the security group list (nil when absent).
func portAttrs(c *api.Caller, b body, p *portRow) (reqs []ipRequest, sgs []string, err error) {
	for _, f := range []struct {
		k   string
		dst *string
	}{{"name", &p.Name}, {"description", &p.Description}, {"device_id", &p.DeviceID}, {"device_owner", &p.DeviceOwner}} {
		v, ok, e := b.str(f.k, 255)
		if e != nil {
			return nil, nil, e
		}
		if ok {
			*f.dst = v
		}
	}
	if v, ok, e := b.boolean("admin_state_up"); e != nil {
		return nil, nil, e
	} else if ok {
		p.AdminStateUp = v
	}
	if v, ok, e := b.boolean("port_security_enabled"); e != nil {
		return nil, nil, e
	} else if ok {
		p.PortSecurity = v
	}
	if v, ok, e := b.str("binding:vnic_type", 64); e != nil {
		return nil, nil, e
	} else if ok {
		switch v {
		case "normal", "direct", "macvtap", "baremetal", "direct-physical", "virtio-forwarder", "smart-nic", "vdpa", "remote-managed":
			p.VNIC = v
		default:
			return nil, nil, nerr(400, "HTTPBadRequest", "Invalid input for binding:vnic_type. Reason: %s is not in valid_values.", v)
		}
	}
	for _, k := range []string{"binding:host_id", "binding:profile"} {
		if b.has(k) && !c.IsAdmin() {
			return nil, nil, policyDenied("create_port:" + k)
		}
	}
	if raw, ok := b["fixed_ips"]; ok {
		if err := json.Unmarshal(raw, &reqs); err != nil {
			return nil, nil, invalid("fixed_ips", raw, "Invalid data format for fixed IP: '%s'")
		}
		if len(reqs) > maxFixedIPsPerPort {
			return nil, nil, badInput("Exceeded maximum amount of fixed ips per port.")
		}
		for _, rq := range reqs {
			if rq.SubnetID != "" && !isUUID(rq.SubnetID) {
				return nil, nil, errNotUUID("fixed_ips", rq.SubnetID)
			}
		}
		if reqs == nil {
			reqs = []ipRequest{}
		}
	}
	if raw, ok := b["security_groups"]; ok {
		if err := json.Unmarshal(raw, &sgs); err != nil {
			return nil, nil, invalid("security_groups", raw, "'%s' is not a list")
		}
		for _, g := range sgs {
			if !isUUID(g) {
				return nil, nil, errNotUUID("security_groups", g)
			}
		}
		if sgs == nil {
			sgs = []string{}
		}
	}
	if raw, ok := b["allowed_address_pairs"]; ok {
		var pairs []map[string]string
		if err := json.Unmarshal(raw, &pairs); err != nil {
			return nil, nil, invalid("allowed_address_pairs", raw, "Invalid data format for allowed address pairs: '%s'")
		}
		if len(pairs) > maxAddressPairs {
			return nil, nil, nerr(400, "AllowedAddressPairExhausted", "The number of allowed address pair exceeds the maximum %d.", maxAddressPairs)
		}
		for _, pr := range pairs {
			ip := pr["ip_address"]
			if _, e1 := netip.ParseAddr(ip); e1 != nil {
				if _, e2 := netip.ParsePrefix(ip); e2 != nil {
					return nil, nil, nerr(400, "HTTPBadRequest", "Invalid input for allowed_address_pairs. Reason: '%s' is not a valid IP address.", ip)
				}
			}
			if m, ok := pr["mac_address"]; ok {
				if _, err := net.ParseMAC(m); err != nil {
					return nil, nil, nerr(400, "HTTPBadRequest", "Invalid input for allowed_address_pairs. Reason: '%s' is not a valid MAC address.", m)
				}
			}
		}
		if pairs == nil {
			pairs = []map[string]string{}
		}
		p.Pairs = pairs
	}
	return reqs, sgs, nil
}

// checkPortSecurity enforces neutron's port-security rules and fills in
// pair MACs (neutron/db/portsecurity_db_common.py, allowedaddresspairs_db.py).
func checkPortSecurity(p *portRow) error {
	if !p.PortSecurity && len(p.SecurityGroups) > 0 {
		return nerr(409, "PortSecurityAndIPRequiredForSecurityGroups", "Port security must be enabled and port must have an IP address in order to use security groups.")
	}
	if !p.PortSecurity && len(p.Pairs) > 0 {
		return nerr(409, "AddressPairAndPortSecurityRequired", "Port Security must be enabled in order to have allowed address pairs on a port.")
	}
	for _, pr := range p.Pairs {
		if pr["mac_address"] == "" {
			pr["mac_address"] = p.MAC
		}
	}
	return nil
}

// projectSGs checks that each id is a security group of the project.
func projectSGs(ctx context.Context, q store.Querier, projectID string, ids []string) ([]string, error) {
	out := []string{}
	seen := map[string]bool{}
	for _, id := range ids {
		var n int
		if err := q.QueryRow(ctx, "SELECT COUNT(*) FROM security_groups WHERE id = ? AND project_id = ?", id, projectID).Scan(&n); err != nil {
			return nil, err
		}
		if n == 0 {
			return nil, errSGNotFound(id)
		}
		if !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	return out, nil
}

var portCreateAttrs = []string{"name", "network_id", "admin_state_up", "mac_address", "fixed_ips", "device_id",
	"device_owner", "tenant_id", "project_id", "security_groups", "port_security_enabled", "allowed_address_pairs",
	"description", "binding:vnic_type", "binding:host_id", "binding:profile"}

func (s *Service) preparePort(r *http.Request, c *api.Caller, b body) (*prepared, error) {
	var err error
	p := &portRow{ID: newID(), AdminStateUp: true, VNIC: "normal"}
	if p.ProjectID, err = projectFor(c, b, "port"); err != nil {
		return nil, err
	}
	netID, ok, err := b.uuidAttr("network_id")
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, nerr(400, "HTTPBadRequest", "Failed to parse request. Required attribute 'network_id' not specified")
	}
	mac, _, err := b.str("mac_address", 64)
	if err != nil {
		return nil, err
	}
	if mac != "" {
		hw, err := net.ParseMAC(mac)
		if err != nil || len(hw) != 6 {
			return nil, nerr(400, "HTTPBadRequest", "Invalid input for mac_address. Reason: '%s' is not a valid MAC address.", mac)
		}
		mac = hw.String()
	}
	_, psGiven := b["port_security_enabled"]
	reqs, sgs, err := portAttrs(c, b, p)
	if err != nil {
		return nil, err
	}
	insert := func(tx *store.Tx) error {
		n, err := visibleNet(r.Context(), tx, c, netID)
		if err != nil {
			return err
		}
		if !c.IsAdmin() && !n.Shared && n.ProjectID != p.ProjectID {
			return nerr(403, "HTTPForbidden", "Tenant %s not allowed to create port on this network", p.ProjectID)
		}
		p.NetworkID = n.ID
		if err := checkNetOwnerAttrs(c, b, n, "create_port"); err != nil {
			return err
		}
		if err := s.checkDevice(r.Context(), tx, c, "create_port", n, p, nil); err != nil {
			return err
		}
		if err := checkQuota(r.Context(), tx, p.ProjectID, "port"); err != nil {
			return err
		}
		if !psGiven {
			p.PortSecurity = n.PortSecurity
		}
		switch {
		case sgs != nil:
			if p.SecurityGroups, err = projectSGs(r.Context(), tx, p.ProjectID, sgs); err != nil {
				return err
			}
		case p.PortSecurity && !strings.HasPrefix(p.DeviceOwner, "network:"):
			// A port gets its project's default group when none is
			// asked for (neutron/db/securitygroups_db.py
			// _ensure_default_security_group_on_port).
			id, err := ensureDefaultSG(r.Context(), tx, p.ProjectID)
			if err != nil {
				return err
			}
			p.SecurityGroups = []string{id}
		}
		if err := checkPortSecurity(p); err != nil {
			return err
		}
		p.Status = portStatus(p)
		return insertPort(r.Context(), tx, p, reqs, mac)
	}
	return &prepared{insert: insert, view: func() map[string]any { return p.view(c.IsAdmin()) }}, nil
}

func (s *Service) updatePort(r *http.Request) (*api.Response, error) {
	c := caller(r)
	b, err := decodeBody(r, "port", "name", "admin_state_up", "fixed_ips", "device_id", "device_owner",
		"security_groups", "port_security_enabled", "allowed_address_pairs", "description", "binding:vnic_type",
		"binding:host_id", "binding:profile")
	if err != nil {
		return nil, err
	}
	var p *portRow
	err = s.db.Tx(r.Context(), func(tx *store.Tx) error {
		var err error
		if p, err = ownedPort(r.Context(), tx, c, pathID(r, "id")); err != nil {
			return err
		}
		old := *p
		reqs, sgs, err := portAttrs(c, b, p)
		if err != nil {
			return err
		}
		n, err := getNet(r.Context(), tx, p.NetworkID)
		if err != nil {
			return err
		}
		if err := checkNetOwnerAttrs(c, b, n, "update_port"); err != nil {
			return err
		}
		if b.has("device_id") || b.has("device_owner") {
			if err := s.checkDevice(r.Context(), tx, c, "update_port", n, p, &old); err != nil {
				return err
			}
		}
		if sgs != nil {
			if p.SecurityGroups, err = projectSGs(r.Context(), tx, p.ProjectID, sgs); err != nil {
				return err
			}
		}
		if !p.PortSecurity && len(p.SecurityGroups) > 0 && sgs == nil {
			return nerr(409, "PortSecurityPortHasSecurityGroup", "Port has security group associated. Cannot disable port security or IP address until security group is removed")
		}
		if err := checkPortSecurity(p); err != nil {
			return err
		}
		if reqs != nil {
			if err := releaseIPs(r.Context(), tx, p.ID); err != nil {
				return err
			}
			ips, err := allocateIPs(r.Context(), tx, p.NetworkID, p.ID, reqs, false)
			if err != nil {
				return err
			}
			if ips == nil {
				ips = []FixedIP{}
			}
			p.FixedIPs = ips
			// Floating IPs follow only addresses the port still has.
			if _, err := tx.Exec(r.Context(), `UPDATE floatingips SET port_id = NULL, fixed_ip_address = NULL
				WHERE port_id = ? AND fixed_ip_address NOT IN (SELECT ip_address FROM ip_allocations WHERE owner_id = ?)`,
				p.ID, p.ID); err != nil {
				return err
			}
		}
		p.Status = portStatus(p)
		p.UpdatedAt = now()
		if err := checkRevision(r, p.Revision); err != nil {
			return err
		}
		p.Revision++
		if _, err := tx.Exec(r.Context(), `UPDATE ports SET name = ?, description = ?, admin_state_up = ?, status = ?,
			device_id = ?, device_owner = ?, port_security_enabled = ?, security_groups = ?, allowed_address_pairs = ?,
			vnic_type = ?, updated_at = ?, revision_number = ? WHERE id = ?`,
			p.Name, p.Description, b2i(p.AdminStateUp), p.Status, p.DeviceID, p.DeviceOwner, b2i(p.PortSecurity),
			store.JSON(p.SecurityGroups), store.JSON(p.Pairs), p.VNIC, p.UpdatedAt, p.Revision, p.ID); err != nil {
			return err
		}
		return setPortSGs(r.Context(), tx, p.ID, p.SecurityGroups)
	})
	if err != nil {
		return nil, err
	}
	return showOne(r, 200, "port", p.view(c.IsAdmin())), nil
}

func (s *Service) deletePort(r *http.Request) (*api.Response, error) {
	c := caller(r)
	err := s.db.Tx(r.Context(), func(tx *store.Tx) error {
		p, err := ownedPort(r.Context(), tx, c, pathID(r, "id"))
		if err != nil {
			return err
		}
		if p.BoundBy == bindRouter {
			// neutron_lib/exceptions/l3.py L3PortInUse
			return nerr(409, "L3PortInUse", "Port %s has owner %s and therefore cannot be deleted directly via the port API.", p.ID, p.DeviceOwner)
		}
		return deletePortRow(r.Context(), tx, p.ID)
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(204), nil
}
