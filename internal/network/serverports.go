package network

import (
	"context"

	"nimbus/internal/store"
)

// Interface is one port of a server as Nova's os-interface shows it.
type Interface struct {
	PortID, NetworkID, MAC, Status string
	FixedIPs                       []FixedIP
}

// ServerInterfaces returns the ports compute bound to a server in its
// project, in the order they were made.
func (s *Service) ServerInterfaces(ctx context.Context, sv ServerRef) ([]Interface, error) {
	ports, err := loadPorts(ctx, s.db, "bound_by = ? AND bound_device = ? AND project_id = ?", bindCompute, sv.ID, sv.ProjectID)
	if err != nil {
		return nil, err
	}
	out := make([]Interface, 0, len(ports))
	for _, p := range ports {
		out = append(out, Interface{PortID: p.ID, NetworkID: p.NetworkID, MAC: p.MAC, Status: p.Status,
			FixedIPs: append([]FixedIP{}, p.FixedIPs...)})
	}
	return out, nil
}

// ReleasePort, in tx, takes one port away from a server, as ReleaseServer
// does for all of them: a port made for the server is deleted, a port the
// user brought is unbound, and no floating IP stays on it. A port not
// bound to the server is store.ErrNotFound.
func (s *Service) ReleasePort(ctx context.Context, tx *store.Tx, serverID, portID string) error {
	p, err := getPortRow(ctx, tx, portID)
	if err != nil {
		return err
	}
	if p.BoundBy != bindCompute || p.BoundDevice != serverID {
		return store.ErrNotFound
	}
	s.changedAfterCommit(tx) // hoststate.go
	if p.ServerOwned {
		return deletePortRow(ctx, tx, p.ID)
	}
	t := now()
	if _, err := tx.Exec(ctx, `UPDATE floatingips SET port_id = NULL, fixed_ip_address = NULL, updated_at = ?,
		revision_number = revision_number + 1 WHERE port_id = ?`, t, p.ID); err != nil {
		return err
	}
	_, err = tx.Exec(ctx, `UPDATE ports SET device_id = '', device_owner = '', bound_by = '', bound_device = '', releasing = 0,
		status = 'DOWN', updated_at = ?, revision_number = revision_number + 1 WHERE id = ?`, t, p.ID)
	return err
}
