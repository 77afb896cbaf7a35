package compute

// This file holds the types and functions that the server half of the
// compute package (servers.go and friends) and the resource half
// (resources.go and friends: flavors, key pairs, quotas, hypervisors,
// services) use from each other. Each stub below is replaced by its owner;
// the signatures are the contract.

import (
	"context"
	"time"

	"nimbus/internal/driver"
	"nimbus/internal/store"
)

// Flavor is a Nova flavor. Owner: resources.
type Flavor struct {
	ID          string
	Name        string
	VCPUs       int
	RAM         int // MiB
	Disk        int // GiB
	Ephemeral   int // GiB
	Swap        int // MiB
	RxTxFactor  float64
	IsPublic    bool
	Disabled    bool
	Description *string
	ExtraSpecs  map[string]string
	CreatedAt   time.Time
}

// Keypair is a Nova key pair. Owner: resources.
type Keypair struct {
	ID          int64
	Name        string
	UserID      string
	PublicKey   string
	Fingerprint string
	Type        string // "ssh" or "x509"
	CreatedAt   time.Time
}

// Quota is a project's compute limits; -1 means unlimited. Owner: resources.
type Quota struct {
	Instances, Cores, RAM, KeyPairs, MetadataItems, ServerGroups, ServerGroupMembers int
}

// HostUsage is what the servers placed on one host hold. Owner: servers.
type HostUsage struct {
	Servers, VCPUs, MemoryMB, DiskGB int
}

// getFlavor loads a flavor by id; store.ErrNotFound when there is none.
// Owner: resources.
func (s *Service) getFlavor(ctx context.Context, q store.Querier, id string) (*Flavor, error) {
	return nil, store.ErrNotFound
}

// flavorAccessible reports whether a project may use a flavor (public, or
// private with the project on its access list). Owner: resources.
func (s *Service) flavorAccessible(ctx context.Context, q store.Querier, f *Flavor, projectID string) (bool, error) {
	return f.IsPublic, nil
}

// getKeypair loads a user's key pair by name; store.ErrNotFound when there
// is none. Owner: resources.
func (s *Service) getKeypair(ctx context.Context, q store.Querier, userID, name string) (*Keypair, error) {
	return nil, store.ErrNotFound
}

// quotaFor returns a project's quota (its own values over the defaults).
// Owner: resources.
func (s *Service) quotaFor(ctx context.Context, q store.Querier, projectID string) (Quota, error) {
	return Quota{Instances: 10, Cores: 20, RAM: 51200, KeyPairs: 100, MetadataItems: 128, ServerGroups: 10, ServerGroupMembers: 10}, nil
}

// enabledHosts returns the hosts that may take new servers: up, and with
// their compute service enabled. Owner: resources.
func (s *Service) enabledHosts(ctx context.Context) ([]driver.Host, error) {
	return s.driver.Hosts(ctx)
}

// hostUsage returns, per host name, what the servers placed there hold
// (servers not deleted and not shelved-offloaded). Owner: servers.
func (s *Service) hostUsage(ctx context.Context, q store.Querier) (map[string]HostUsage, error) {
	return map[string]HostUsage{}, nil
}

// projectUsage returns what a project's servers count against its quota:
// instances, cores and RAM of servers not deleted. Owner: servers.
func (s *Service) projectUsage(ctx context.Context, q store.Querier, projectID string) (instances, cores, ram int, err error) {
	return 0, 0, 0, nil
}
