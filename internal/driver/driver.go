// Package driver is the contract between Nimbus's control plane and the
// hypervisors that run its servers. The compute service's reconcile loop is
// the only caller: it reads what a server should be from the store and asks
// the driver to make it so. Implementations live in subpackages: fake (a
// simulated fleet, the default) and, later, qemu.
package driver

import (
	"context"
	"errors"
)

// PowerState is Nova's power_state number.
type PowerState int

// Nova's power states (nova/compute/power_state.py).
const (
	NoState   PowerState = 0
	Running   PowerState = 1
	Paused    PowerState = 3
	Shutdown  PowerState = 4
	Crashed   PowerState = 6
	Suspended PowerState = 7
)

// GPU is one passthrough device on a host.
type GPU struct {
	Address string `json:"address"` // PCI address, e.g. 0000:3b:00.0
	Vendor  string `json:"vendor"`
	Model   string `json:"model"`
	NUMA    int    `json:"numa_node"`
}

// Host is one hypervisor host and what it has to give.
type Host struct {
	Name        string `json:"name"`
	IP          string `json:"host_ip"`
	VCPUs       int    `json:"vcpus"`     // pCPUs that servers may use
	MemoryMB    int    `json:"memory_mb"` // RAM that servers may use
	DiskGB      int    `json:"disk_gb"`   // local disk pool
	GPUs        []GPU  `json:"gpus"`
	Zone        string `json:"availability_zone"`
	Hypervisor  string `json:"hypervisor_type"` // "fake", "QEMU", "KVM"
	Version     int    `json:"hypervisor_version"`
	Up          bool   `json:"up"`
	UptimeSince int64  `json:"uptime_since"` // unix seconds the host came up
}

// Spec is everything a driver needs to build a server's VM.
type Spec struct {
	ServerID  string
	Name      string
	Hostname  string
	ProjectID string
	Host      string // the host the scheduler chose
	VCPUs     int
	MemoryMB  int
	DiskGB    int
	ImageID   string
	OSType    string // "linux" or "windows"
	KeyName   string
	PublicKey string
	UserData  []byte
	AdminPass string
	Metadata  map[string]string
	FixedIPs  []string
}

// Instance is what a driver sees running.
type Instance struct {
	ID    string
	Host  string
	Power PowerState
}

// ErrNotFound is returned for a server the driver does not know.
var ErrNotFound = errors.New("driver: instance not found")

// Driver runs servers on a fleet of hosts. Every method is idempotent in the
// sense the reconcile loop needs: asking for a state the VM is already in
// succeeds, so a retried or resumed step does no harm. Methods block until
// the operation is done or ctx ends.
type Driver interface {
	// Name is the driver's name ("fake", "qemu").
	Name() string
	// Hosts lists the fleet.
	Hosts(ctx context.Context) ([]Host, error)
	// Spawn creates and boots a server on spec.Host. Spawning an existing
	// server only makes sure it runs.
	Spawn(ctx context.Context, spec Spec) error
	// Destroy removes a server and all it holds on its host; an unknown
	// server is not an error.
	Destroy(ctx context.Context, id string) error
	// PowerOff stops a server (ACPI first, then hard when graceful is false
	// or the guest does not stop).
	PowerOff(ctx context.Context, id string, graceful bool) error
	// PowerOn starts a stopped server.
	PowerOn(ctx context.Context, id string) error
	// Reboot restarts a server.
	Reboot(ctx context.Context, id string, hard bool) error
	// Pause and Unpause freeze and thaw a server's vCPUs.
	Pause(ctx context.Context, id string) error
	Unpause(ctx context.Context, id string) error
	// Suspend saves a server's state to disk and stops it; Resume brings it back.
	Suspend(ctx context.Context, id string) error
	Resume(ctx context.Context, id string) error
	// Resize changes a stopped or running server's CPU, RAM and disk; it may
	// reboot the server.
	Resize(ctx context.Context, spec Spec) error
	// Snapshot copies a server's boot disk and returns its bytes' size and a
	// reader-free handle: the image service stores what the driver gives.
	Snapshot(ctx context.Context, id string) (sizeBytes int64, err error)
	// ConsoleOutput returns the last lines of the serial console (all when
	// lines <= 0).
	ConsoleOutput(ctx context.Context, id string, lines int) (string, error)
	// List returns every server the driver has on any host, for the
	// reconcile that follows a restart.
	List(ctx context.Context) ([]Instance, error)
	// State returns one server's power state.
	State(ctx context.Context, id string) (PowerState, error)
}
