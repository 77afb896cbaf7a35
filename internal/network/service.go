// Package network is Nimbus's Neutron v2.0: networks, subnets, ports with
// IP address management, security groups with rules, and floating IPs from
// the public pool.
package network

import (
	"context"
	"errors"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// Network is a network as compute needs it.
type Network struct {
	ID, Name, ProjectID string
	Shared, External    bool
	SubnetIDs           []string
}

// FixedIP is one address of a port.
type FixedIP struct {
	SubnetID  string
	IPAddress string
}

// Port is a port as compute needs it.
type Port struct {
	ID, NetworkID, NetworkName, MACAddress, DeviceID string
	FixedIPs                                         []FixedIP
}

// Address is one entry of a server's Nova "addresses" map.
type Address struct {
	Addr    string
	Version int
	Type    string // "fixed" or "floating"
	MAC     string
}

// Service is the network service.
type Service struct {
	db *store.DB
}

// New makes the network service.
func New(db *store.DB) *Service { return &Service{db: db} }

// Routes is the network API's route table.
func (s *Service) Routes() []api.Route { return nil }

var errTODO = errors.New("network: not implemented yet")

// Bootstrap makes the shared public network and its pool once.
func (s *Service) Bootstrap(ctx context.Context) error { return nil }

// EnsureDefaults gives a project its default network, subnet and "default"
// security group if it has none; it is idempotent.
func (s *Service) EnsureDefaults(ctx context.Context, projectID string) error { return nil }

// GetNetwork returns a network the project may use (its own or shared), or
// store.ErrNotFound.
func (s *Service) GetNetwork(ctx context.Context, projectID string, admin bool, id string) (*Network, error) {
	return nil, errTODO
}

// AutoNetwork is the network a server gets for networks "auto" or none: the
// project's default network, made if missing.
func (s *Service) AutoNetwork(ctx context.Context, projectID string) (*Network, error) {
	return nil, errTODO
}

// CheckSecurityGroups checks that each name (or id) is a security group of
// the project; an unknown one is an *api.Error 400.
func (s *Service) CheckSecurityGroups(ctx context.Context, projectID string, names []string) error {
	return nil
}

// GetPort returns a port of the project, or store.ErrNotFound.
func (s *Service) GetPort(ctx context.Context, projectID string, admin bool, id string) (*Port, error) {
	return nil, errTODO
}

// CreateServerPort makes a port on networkID for a server in tx, with an
// address from the network's subnet (fixedIP if given) and the named
// security groups ("default" when none).
func (s *Service) CreateServerPort(ctx context.Context, tx *store.Tx, projectID, networkID, serverID, fixedIP string, securityGroups []string) (*Port, error) {
	return nil, errTODO
}

// BindPort attaches an existing port to a server in tx.
func (s *Service) BindPort(ctx context.Context, tx *store.Tx, portID, serverID string) error {
	return errTODO
}

// AttachPublicIP gives a server's port a floating IP from the public pool, in tx.
func (s *Service) AttachPublicIP(ctx context.Context, tx *store.Tx, projectID, serverID, portID string) (string, error) {
	return "", errTODO
}

// ReleaseServer, in tx, deletes the ports made for a server, unbinds ports
// the user brought, and releases the public IPs given with its flavor.
func (s *Service) ReleaseServer(ctx context.Context, tx *store.Tx, serverID string) error { return nil }

// Addresses returns, for each server id, Nova's addresses map: network name
// to addresses, fixed before floating.
func (s *Service) Addresses(ctx context.Context, serverIDs []string) (map[string]map[string][]Address, error) {
	return map[string]map[string][]Address{}, nil
}
