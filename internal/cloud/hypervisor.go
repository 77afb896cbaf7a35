package cloud

import (
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"

	"nimbus/internal/agent"
	"nimbus/internal/driver"
	"nimbus/internal/driver/qemu"
	"nimbus/internal/host"
	"nimbus/internal/netplane"
)

// QEMUOptions configure the QEMU driver of the host an agent runs on.
type QEMUOptions struct {
	// DataDir is the agent's data directory: VMs and the image cache go
	// under DataDir/qemu.
	DataDir string
	// Name, IP and Zone present the host (IP: how the controller and
	// users reach it).
	Name, IP, Zone string
	// Accel is "auto", "kvm" or "tcg".
	Accel string
	// ReservedCPUs are kept for the host and QEMU's emulator threads; nil
	// means internal/host's default (the first core of each NUMA node).
	ReservedCPUs []int
	// ReservedMemoryMB is kept for the host (0: the default, 1 GiB).
	ReservedMemoryMB int
	// AccessHost is the address users connect to for SSH/RDP (default IP).
	AccessHost string
	// NoSandbox turns QEMU's seccomp sandbox off.
	NoSandbox bool
	// RunAs is an unprivileged user for QEMU when the agent runs as root.
	RunAs string
	// ConsoleListen is where the VNC relay listens for the console proxy
	// (default: the host's IP, any free port).
	ConsoleListen string
	// Network is the bridged data plane's settings (--network-mode
	// bridged); nil is user-mode networking.
	Network *NetworkOptions
	// Wiring is the agent's data plane that a bridged driver waits on
	// (NewNetPlane's); needed when Network is set.
	Wiring qemu.Wiring
	Log    *slog.Logger
}

// NetworkOptions are a bridged host's data plane settings. IP (the
// --host-ip) is the host's VXLAN underlay address.
type NetworkOptions struct {
	// UnderlayMTU is the underlay's MTU (0: the link's).
	UnderlayMTU int
	// ProviderBridge is an existing bridge on the provider network; or
	// ProviderInterface an interface on it, which the agent enslaves to a
	// bridge of its own. Either makes the host a gateway host.
	ProviderBridge, ProviderInterface string
	// NamespacePrefix starts the names of the host's DHCP and router
	// namespaces (default netplane.DefaultPrefix): simulated hosts on one
	// machine each need their own.
	NamespacePrefix string
}

// NewNetPlane makes the host's bridged data plane from o, nil in
// user-mode networking. A provider interface is enslaved to the agent's
// provider bridge here.
func NewNetPlane(o QEMUOptions) (*agent.NetPlane, error) {
	n := o.Network
	if n == nil {
		return nil, nil
	}
	if o.IP == "" {
		return nil, errors.New("cloud: bridged networking needs the host's underlay address (--host-ip)")
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	bridge := n.ProviderBridge
	if n.ProviderInterface != "" {
		var err error
		if bridge, err = agent.ProviderBridge(n.ProviderInterface); err != nil {
			return nil, err
		}
	}
	return agent.NewNetPlane(netplane.Config{VTEP: o.IP, UnderlayMTU: n.UnderlayMTU, ProviderBridge: bridge, Prefix: n.NamespacePrefix,
		Log: o.Log.With("component", "netplane")})
}

// NewQEMUDriver reads this host's inventory and makes its QEMU driver.
// Passthrough is checked here, when the host enrols, not at each boot: a
// GPU whose IOMMU group, driver binding or device node is not ready, or
// all GPUs when the memlock limit cannot pin guest memory, are left out
// of the inventory, and the host's log says why.
func NewQEMUDriver(o QEMUOptions) (*qemu.Driver, error) {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	dir := filepath.Join(o.DataDir, "qemu")
	h, err := host.Discover("/", host.Options{Name: o.Name, IP: o.IP, Zone: o.Zone, ReservedCPUs: o.ReservedCPUs,
		ReservedMemoryMB: o.ReservedMemoryMB, DiskPath: o.DataDir})
	if err != nil {
		return nil, fmt.Errorf("qemu: host inventory: %w", err)
	}
	h.GPUs = passthroughReady(h, o.Log)
	logMemory(o.Log, h)
	access := o.AccessHost
	if access == "" {
		access = h.IP
	}
	var net qemu.DataPlane = qemu.UserNet{AccessHost: access}
	if o.Network != nil {
		if o.Wiring == nil {
			return nil, errors.New("qemu: bridged networking without the agent's data plane")
		}
		net = qemu.BridgedNet{Wiring: o.Wiring}
	}
	return qemu.New(qemu.Config{DataDir: dir, Accel: o.Accel, Host: h, Net: net,
		Sandbox: !o.NoSandbox, RunAs: o.RunAs, ConsoleListen: o.ConsoleListen, Log: o.Log})
}

// logMemory says how much memory the host offers, and why it is less than
// the machine has when the kernel's NUMA nodes show less than /proc/meminfo:
// a server's memory is claimed on NUMA nodes, so only what the nodes' own
// meminfo shows can be offered (less --reserved-memory-mb).
func logMemory(log *slog.Logger, h driver.Host) {
	nodesMB, machineMB, err := host.MemoryTotals("/")
	if err != nil {
		log.Warn("qemu: cannot read the host's memory totals", "error", err)
		return
	}
	log.Info("qemu: host memory", "offered_mb", h.MemoryMB, "numa_nodes", len(h.NUMANodes), "numa_nodes_mb", nodesMB,
		"machine_mb", machineMB)
	if nodesMB < machineMB*9/10 {
		log.Warn("qemu: the NUMA nodes show less memory than the machine has; only theirs is offered, since servers' memory is claimed per node",
			"numa_nodes_mb", nodesMB, "machine_mb", machineMB, "offered_mb", h.MemoryMB)
	}
}

// LocalAccel is the local agent's QEMU accelerator and why it was chosen,
// for the start banner; ok is false when the local agent is not qemu.
func (c *Cloud) LocalAccel() (accel, reason string, ok bool) {
	q, ok := c.localDriver.(*qemu.Driver)
	if !ok {
		return "", "", false
	}
	accel, reason = q.Accel()
	return accel, reason, true
}

// passthroughReady is the GPUs of h that can be given to guests.
func passthroughReady(h driver.Host, log *slog.Logger) []driver.GPU {
	var ready []driver.GPU
	for _, g := range h.GPUs {
		if p := host.PassthroughProblems("/", g); len(p) > 0 {
			log.Warn("qemu: GPU left out: it cannot be passed through", "gpu", g.Address, "model", g.Model,
				"problems", strings.Join(p, "; "))
			continue
		}
		ready = append(ready, g)
	}
	if len(ready) == 0 {
		return nil
	}
	// VFIO pins all of a guest's memory: QEMU's memlock limit must cover
	// the largest guest, which may be all the host gives servers.
	limit, err := host.Memlock()
	need := int64(h.MemoryMB) << 20
	switch {
	case err != nil:
		log.Warn("qemu: GPUs left out: memlock limit unknown", "error", err)
		return nil
	case limit >= 0 && limit < need:
		log.Warn("qemu: GPUs left out: the memlock limit cannot pin guest memory (raise LimitMEMLOCK, e.g. infinity)",
			"memlock_bytes", limit, "needed_bytes", need)
		return nil
	}
	return ready
}
