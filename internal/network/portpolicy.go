package network

import (
	"context"
	"strings"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// netOwnerAttrs are the port attributes neutron gives only to admins and
// the network's owner (neutron/conf/policies/port.py: create_port:* and
// update_port:* with ADMIN_OR_NET_OWNER), so that a project on a shared
// network cannot pick addresses or MACs, or turn off anti-spoofing.
var netOwnerAttrs = []string{"mac_address", "fixed_ips", "port_security_enabled", "allowed_address_pairs"}

// checkNetOwnerAttrs refuses, for a caller who neither is admin nor owns
// the network, the attributes only they may set; action is "create_port"
// or "update_port".
func checkNetOwnerAttrs(c *api.Caller, b body, n *netRow, action string) error {
	if c.IsAdmin() || n.ProjectID == c.ProjectID {
		return nil
	}
	for _, k := range netOwnerAttrs {
		if b.has(k) {
			return policyDenied(action + ":" + k)
		}
	}
	return nil
}

// checkDevice enforces who may name what as a port's device, given the
// port's new device_id and device_owner and what the port was before (nil
// on create):
//   - a port the service bound keeps its device: only the service unbinds
//     it (neutron's PortInUse);
//   - device_owner network:* is for admins and the network's owner
//     (create_port:device_owner, "not rule:network_device or
//     rule:admin_or_network_owner");
//   - device_owner compute:* names a live server of the caller's project:
//     compute's owner is the service's, as Nova sets it;
//   - device_id may not name another project's router or server
//     (neutron's DeviceIDNotOwnedByTenant, which neutron checks for router
//     interfaces only).
func (s *Service) checkDevice(ctx context.Context, q store.Querier, c *api.Caller, action string, n *netRow, p, old *portRow) error {
	if old != nil && old.BoundBy != "" && (p.DeviceID != old.DeviceID || p.DeviceOwner != old.DeviceOwner) {
		return nerr(409, "PortInUse", "Unable to complete operation on port %s for network %s. Port already has an attached device %s.",
			p.ID, p.NetworkID, old.DeviceID)
	}
	if c.IsAdmin() {
		return nil
	}
	server, err := s.serverProject(ctx, p.DeviceID)
	if err != nil {
		return err
	}
	switch {
	case strings.HasPrefix(p.DeviceOwner, "network:") && n.ProjectID != c.ProjectID:
		return policyDenied(action + ":device_owner")
	case strings.HasPrefix(p.DeviceOwner, "compute:") && server != c.ProjectID:
		return policyDenied(action + ":device_owner")
	case server != "" && server != c.ProjectID:
		return errDeviceNotOwned(p.DeviceID)
	}
	if p.DeviceID == "" {
		return nil
	}
	var router string
	err = q.QueryRow(ctx, "SELECT project_id FROM routers WHERE id = ?", p.DeviceID).Scan(&router)
	if store.IsNoRows(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if router != c.ProjectID {
		return errDeviceNotOwned(p.DeviceID)
	}
	return nil
}

// serverProject is the project of the live server id names, "" if none.
func (s *Service) serverProject(ctx context.Context, id string) (string, error) {
	if id == "" || s.servers == nil {
		return "", nil
	}
	project, found, err := s.servers.ServerProject(ctx, id)
	if err != nil || !found {
		return "", err
	}
	return project, nil
}

// errDeviceNotOwned is neutron_lib's DeviceIDNotOwnedByTenant (a Conflict).
func errDeviceNotOwned(id string) *api.Error {
	return nerr(409, "DeviceIDNotOwnedByTenant",
		"The following device_id %s is not owned by your tenant or matches another tenants router.", id)
}
