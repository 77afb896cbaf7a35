package compute

// This file holds the types and functions that the server half of the
// compute package (servers.go and friends) and the resource half
// (resources.go and friends: flavors, key pairs, quotas, hypervisors,
// services) use from each other. Each stub below is replaced by its owner;
// the signatures are the contract.

import "time"

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

// hostUsage and projectUsage (Owner: servers) live in server_store.go.
// getFlavor and flavorAccessible (Owner: resources) live in flavors.go,
// getKeypair in keypairs.go, quotaFor in quotas.go and enabledHosts in
// os_services.go.
