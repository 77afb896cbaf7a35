// Package driver is the contract between Nimbus's control plane and the
// hypervisors that run its servers. Compute drives it, chiefly from its
// reconcile loop: it reads what a server should be from the store and asks
// the driver to make it so. On the controller the driver is the fleet
// (internal/fleet), which hands each call to the agent of the server's
// host; the agent runs a host driver from the subpackages: fake (a
// simulated fleet, the default) or qemu (real virtual machines).
package driver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
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
	Address    string `json:"address"` // PCI address, e.g. 0000:3b:00.0
	Vendor     string `json:"vendor"`
	Model      string `json:"model"`
	NUMA       int    `json:"numa_node"`
	VendorID   string `json:"vendor_id,omitempty"` // PCI ids, e.g. 10de
	DeviceID   string `json:"device_id,omitempty"`
	IOMMUGroup int    `json:"iommu_group"`
	// Driver is the kernel driver bound to the device ("vfio-pci" when it
	// is ready for passthrough, "" when none).
	Driver string `json:"driver,omitempty"`
}

// CPU is one logical processor (a hardware thread) of a host.
type CPU struct {
	ID     int `json:"id"`
	Core   int `json:"core"`   // core id within its socket
	Socket int `json:"socket"` // physical package
	NUMA   int `json:"numa_node"`
	// Siblings are the threads that share this CPU's core, itself included.
	Siblings []int `json:"siblings,omitempty"`
}

// NUMANode is one NUMA node's memory that servers may use.
type NUMANode struct {
	ID       int `json:"id"`
	MemoryMB int `json:"memory_mb"`
}

// Host is one hypervisor host and what it has to give.
type Host struct {
	Name        string `json:"name"`
	IP          string `json:"host_ip"`
	VCPUs       int    `json:"vcpus"`     // pCPUs that servers may use (CPUs less ReservedCPUs)
	MemoryMB    int    `json:"memory_mb"` // RAM that servers may use
	DiskGB      int    `json:"disk_gb"`   // local disk pool
	GPUs        []GPU  `json:"gpus"`
	Zone        string `json:"availability_zone"`
	Hypervisor  string `json:"hypervisor_type"` // "fake", "QEMU", "KVM"
	Version     int    `json:"hypervisor_version"`
	Up          bool   `json:"up"`
	UptimeSince int64  `json:"uptime_since"` // unix seconds the host came up

	// CPUs is every logical CPU of the host; ReservedCPUs are those kept
	// for the host itself (and QEMU's emulator threads), never given to a
	// server. NUMANodes split MemoryMB by node.
	CPUs         []CPU      `json:"cpus,omitempty"`
	ReservedCPUs []int      `json:"reserved_cpus,omitempty"`
	NUMANodes    []NUMANode `json:"numa_nodes,omitempty"`
	// Health is "" when the host is fine, else what is wrong with it.
	Health string `json:"health,omitempty"`
	// NetworkMode is how the host wires its servers' ports: "" or "user"
	// (user-mode networking, one forwarded port per server) or "bridged"
	// (the data plane of internal/netplane, IP then being the host's
	// VXLAN underlay address). Gateway is set on a bridged host that
	// reaches the provider network and so may carry routers.
	NetworkMode string `json:"network_mode,omitempty"`
	Gateway     bool   `json:"gateway,omitempty"`
}

// Bounds on what a host may present: beyond any real machine, and small
// enough that the scheduler's work per host stays bounded whatever an
// agent reports.
const (
	MaxHostCPUs     = 4096    // logical CPUs
	MaxHostMemoryMB = 1 << 26 // 64 TiB
	MaxHostDiskGB   = 1 << 24 // 16 PiB
	MaxHostNUMA     = 64
	MaxHostGPUs     = 64
	maxSiblings     = 16
	maxZoneLen      = 255
)

// Validate refuses a host whose description is out of any real machine's
// range, before anything else reads it.
func (h *Host) Validate() error {
	switch {
	case h.VCPUs < 0 || h.MemoryMB < 0 || h.DiskGB < 0:
		return errors.New("negative resources")
	case h.VCPUs > MaxHostCPUs || len(h.CPUs) > MaxHostCPUs || len(h.ReservedCPUs) > MaxHostCPUs:
		return fmt.Errorf("at most %d CPUs", MaxHostCPUs)
	case h.MemoryMB > MaxHostMemoryMB:
		return fmt.Errorf("at most %d MiB of memory", MaxHostMemoryMB)
	case h.DiskGB > MaxHostDiskGB:
		return fmt.Errorf("at most %d GiB of disk", MaxHostDiskGB)
	case len(h.NUMANodes) > MaxHostNUMA:
		return fmt.Errorf("at most %d NUMA nodes", MaxHostNUMA)
	case len(h.GPUs) > MaxHostGPUs:
		return fmt.Errorf("at most %d GPUs", MaxHostGPUs)
	case len(h.Zone) > maxZoneLen:
		return fmt.Errorf("availability zone longer than %d bytes", maxZoneLen)
	}
	for _, c := range h.CPUs {
		if len(c.Siblings) > maxSiblings {
			return fmt.Errorf("cpu %d: at most %d siblings", c.ID, maxSiblings)
		}
	}
	for _, n := range h.NUMANodes {
		if n.MemoryMB < 0 || n.MemoryMB > MaxHostMemoryMB {
			return fmt.Errorf("numa node %d: memory out of range", n.ID)
		}
	}
	return nil
}

// Normalize completes a host described only by counts, as the fake fleet's
// config may be: with no CPUs it gets a synthetic topology of VCPUs
// threads (two per core, one NUMA node per 32 threads, none reserved), with
// no NUMANodes its memory is split evenly over the CPUs' nodes, and VCPUs
// and MemoryMB are recomputed from the topology.
func (h *Host) Normalize() {
	if len(h.CPUs) == 0 && h.VCPUs > 0 {
		nodes := max(1, h.VCPUs/32)
		per := (h.VCPUs + nodes - 1) / nodes
		for id := 0; id < h.VCPUs; id++ {
			node := id / per
			core := id / 2
			h.CPUs = append(h.CPUs, CPU{ID: id, Core: core, Socket: node, NUMA: node})
		}
		// Threads of one core, found by one pass rather than a pass per
		// CPU.
		type coreKey struct{ socket, core int }
		cores := map[coreKey][]int{}
		for _, c := range h.CPUs {
			k := coreKey{c.Socket, c.Core}
			cores[k] = append(cores[k], c.ID)
		}
		for i := range h.CPUs {
			c := &h.CPUs[i]
			c.Siblings = slices.Clone(cores[coreKey{c.Socket, c.Core}])
		}
	}
	if len(h.NUMANodes) == 0 {
		seen := map[int]bool{}
		var ids []int
		for _, c := range h.CPUs {
			if !seen[c.NUMA] {
				seen[c.NUMA] = true
				ids = append(ids, c.NUMA)
			}
		}
		if len(ids) == 0 {
			ids = []int{0}
		}
		for i, id := range ids {
			mb := h.MemoryMB / len(ids)
			if i == 0 {
				mb += h.MemoryMB % len(ids)
			}
			h.NUMANodes = append(h.NUMANodes, NUMANode{ID: id, MemoryMB: mb})
		}
	}
	reserved := map[int]bool{}
	for _, id := range h.ReservedCPUs {
		reserved[id] = true
	}
	n := 0
	for _, c := range h.CPUs {
		if !reserved[c.ID] {
			n++
		}
	}
	h.VCPUs = n
	mem := 0
	for _, nd := range h.NUMANodes {
		mem += nd.MemoryMB
	}
	h.MemoryMB = mem
}

// Spec is everything a driver needs to build a server's VM.
type Spec struct {
	ServerID  string
	Name      string
	Hostname  string
	ProjectID string
	Host      string // the host the scheduler chose
	Zone      string // its availability zone (for the instance metadata)
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

	// Image is the boot image (on unshelve, the shelved snapshot): a
	// driver that runs real VMs fetches its data through an ImageStore.
	Image ImageRef `json:",omitzero"`
	// Cells are the host's pCPUs and memory the scheduler claimed, per
	// NUMA node: vCPU i runs on the i-th pCPU in cell order.
	Cells []Cell `json:",omitempty"`
	// GPUs are the PCI addresses of the GPUs claimed for the server.
	GPUs []string `json:",omitempty"`
	// DiskType is the boot disk's type ("local" or "network"), DiskIOPS
	// its throttle.
	DiskType string `json:",omitempty"`
	DiskIOPS IOPS   `json:",omitzero"`
	// Ports are the server's network ports, first the primary one.
	Ports []Port `json:",omitempty"`
	// ConfigDrive asks for an OpenStack config drive rather than a NoCloud
	// seed (the server's config_drive, or the image's
	// img_config_drive=mandatory).
	ConfigDrive bool `json:",omitempty"`
	// LaunchIndex and ReservationID go into the instance metadata.
	LaunchIndex   int    `json:",omitempty"`
	ReservationID string `json:",omitempty"`
	// Revert, on Resize, takes the server back to the flavor it had
	// before its last resize, with the disk the driver kept then.
	Revert bool `json:",omitempty"`
	// Volumes are the block storage volumes attached to the server, in
	// the order they were attached: every start of the VM has them.
	Volumes []Volume `json:",omitempty"`
}

// Volume is one block storage volume attached to a server, and how the
// server's host opens it.
type Volume struct {
	// ID is the volume's id; the guest sees it as the disk's serial
	// (virtio-blk keeps its first 20 characters, Linux's
	// /dev/disk/by-id/virtio-<serial>), as Nova's libvirt driver gives it.
	ID string `json:"id"`
	// Device is the name Nova answered for the attachment (/dev/vdb), a
	// hint only: the guest names its disks itself.
	Device   string `json:"device,omitempty"`
	ReadOnly bool   `json:"read_only,omitempty"`
	// Conn is where the data is.
	Conn VolumeConn `json:"connection"`
	// Throttle is the volume type's QoS, enforced as a QEMU throttle group.
	Throttle Throttle `json:"throttle,omitzero"`
	// Boot marks the server's boot volume (Nova's boot_index 0): the VM
	// boots from it and has no local root disk. At most one volume of a
	// Spec has it, and it comes first in Spec.Volumes.
	Boot bool `json:"boot,omitempty"`
}

// Volume connection kinds: how a host reaches a volume's data.
const (
	VolumeFile = "file" // a raw file on this host (the storage node's own host)
	VolumeNBD  = "nbd"  // an NBD export over TLS with a pre-shared key
	VolumeRBD  = "rbd"  // a Ceph RBD image
)

// NBDTLSPriority is the GnuTLS priority string of both ends of a
// VolumeNBD connection (the tls-creds-psk objects' priority; QEMU appends
// its PSK key exchanges): GnuTLS's NORMAL with ChaCha20-Poly1305 moved
// last, so that AES-GCM is chosen (the client's order decides, and the
// server follows it). GnuTLS 3.7 can put ChaCha20 first even on a CPU
// with AES-NI (it did on our 2-core test host), and there it costs more
// CPU: 4 KiB random I/O over an export on loopback (qemu-io at depth
// 4) took 38 µs of client and 49 µs of daemon CPU per read with ChaCha20
// against 22 and 33 with AES-GCM, and 41 and 68 per write against 27
// and 50. ChaCha20 stays allowed, so either end still talks to a peer
// that wants it.
const NBDTLSPriority = "NORMAL:-CHACHA20-POLY1305:+CHACHA20-POLY1305"

// VolumeConn is Cinder's connection_info for one host: the volume
// service gives it for the host a server runs on.
type VolumeConn struct {
	Driver string `json:"driver_volume_type"` // VolumeFile, VolumeNBD or VolumeRBD
	// Path is a VolumeFile's file.
	Path string `json:"path,omitempty"`
	// Host, Port and Export are a VolumeNBD's server and export name;
	// PSKIdentity and PSKKey (hex) its TLS pre-shared key.
	Host        string `json:"host,omitempty"`
	Port        int    `json:"port,omitempty"`
	Export      string `json:"export,omitempty"`
	PSKIdentity string `json:"psk_identity,omitempty"`
	PSKKey      string `json:"psk_key,omitempty"`
	// Pool, Image, User, Key and Monitors are a VolumeRBD's Ceph pool,
	// image, client name (without "client."), its secret key and the
	// monitors' addresses.
	Pool     string   `json:"pool,omitempty"`
	Image    string   `json:"image,omitempty"`
	User     string   `json:"user,omitempty"`
	Key      string   `json:"key,omitempty"`
	Monitors []string `json:"monitors,omitempty"`
	// SizeBytes is the volume's size when the connection was made.
	SizeBytes int64 `json:"size_bytes,omitempty"`
}

// Throttle is a disk's QoS limits (0: unlimited), QEMU's throttle-group
// limits: x-iops-read, x-iops-write, x-iops-total and the bps forms.
type Throttle struct {
	ReadIOPS   int64 `json:"read_iops_sec,omitempty"`
	WriteIOPS  int64 `json:"write_iops_sec,omitempty"`
	TotalIOPS  int64 `json:"total_iops_sec,omitempty"`
	ReadBytes  int64 `json:"read_bytes_sec,omitempty"`
	WriteBytes int64 `json:"write_bytes_sec,omitempty"`
	TotalBytes int64 `json:"total_bytes_sec,omitempty"`
}

// ImageRef names an image and what a driver needs to use its data.
type ImageRef struct {
	ID         string `json:"id"`
	Name       string `json:"name,omitempty"`
	DiskFormat string `json:"disk_format,omitempty"` // qcow2, raw, …
	Size       int64  `json:"size,omitempty"`
	// Checksum is the data's MD5 (Glance's checksum); HashValue its
	// sha512 (os_hash_value). A host caches image data by HashValue.
	Checksum  string `json:"checksum,omitempty"`
	HashValue string `json:"os_hash_value,omitempty"`
	// KernelID, RamdiskID and CommandLine are the image's kernel_id,
	// ramdisk_id and os_command_line: when KernelID is set the VM boots
	// that kernel directly, as Nova's libvirt driver does.
	KernelID    string `json:"kernel_id,omitempty"`
	RamdiskID   string `json:"ramdisk_id,omitempty"`
	CommandLine string `json:"os_command_line,omitempty"`
	// Properties are the image's other properties the driver may honour
	// (hw_cdrom_bus, hw_disk_bus, hw_vif_model, hw_firmware_type, …).
	Properties map[string]string `json:"properties,omitempty"`
}

// Cell is the part of a server on one NUMA node of its host.
type Cell struct {
	Node     int   `json:"node"`
	CPUs     []int `json:"cpus"`
	MemoryMB int   `json:"memory_mb"`
}

// IOPS is a disk's throttle in operations per second (0: unlimited).
type IOPS struct {
	Read  int `json:"read,omitempty"`
	Write int `json:"write,omitempty"`
}

// Port is one network port of a server, as the network service has it.
type Port struct {
	ID        string   `json:"id"`
	NetworkID string   `json:"network_id,omitempty"`
	MAC       string   `json:"mac_address"`
	IP        string   `json:"ip_address"`
	CIDR      string   `json:"cidr"` // the subnet, e.g. 10.0.0.0/24
	Gateway   string   `json:"gateway_ip,omitempty"`
	DNS       []string `json:"dns_nameservers,omitempty"`
	MTU       int      `json:"mtu,omitempty"`
}

// Access is one way to log in to a server: Nimbus's
// GET /servers/{id}/access lists them.
type Access struct {
	Protocol string `json:"protocol"` // "ssh" or "rdp"
	Host     string `json:"host"`
	Port     int    `json:"port"`
	User     string `json:"user"`
}

// ConsoleEndpoint is where a server's VNC console is reached: a TCP
// address on its host that speaks RFB once it has read the line
// Secret + "\n" (so that only the console proxy gets in). Each Console
// call gives a secret of its own, which opens one connection.
type ConsoleEndpoint struct {
	Host   string `json:"host"`
	Port   int    `json:"port"`
	Secret string `json:"secret"`
}

// ErrNoConsole is returned by a driver whose servers have no graphical
// console.
var ErrNoConsole = errors.New("driver: no graphical console")

// ImageStore gives a host's driver the image service's data: the boot
// images it caches and the snapshots it uploads. The agent provides one
// that talks to its controller.
type ImageStore interface {
	// Open reads image id's data.
	Open(ctx context.Context, id string) (io.ReadCloser, error)
	// Upload stores r, in diskFormat ("qcow2", "raw"), as image id's
	// data; the image must be waiting for it (a snapshot being saved).
	Upload(ctx context.Context, id, diskFormat string, r io.Reader) error
}

// ImageDirect is where a host reads an image's data itself: the snapshot
// Snapshot of the RBD image of Conn (pool, image, client, key, monitors;
// SizeBytes the data's size), as QEMU's rbd driver opens volumes.
type ImageDirect struct {
	Conn     VolumeConn `json:"conn"`
	Snapshot string     `json:"snapshot"`
}

// DirectImages is implemented by an ImageStore that can say where a host
// reads an image's data itself rather than through Open.
type DirectImages interface {
	// Direct is image id's data for the host to read itself; nil (and no
	// error) when there is none such and Open is the way.
	Direct(ctx context.Context, id string) (*ImageDirect, error)
}

// ImageUser is implemented by drivers that need an ImageStore; the agent
// sets it before it runs any op.
type ImageUser interface {
	SetImageStore(ImageStore)
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
	// reboot the server. It keeps the disk the server had (Nova's
	// <instance>_resize) until ConfirmResize, so that a Resize with
	// spec.Revert brings that disk back.
	Resize(ctx context.Context, spec Spec) error
	// ConfirmResize drops the disk the last resize kept; a server without
	// one is not an error.
	ConfirmResize(ctx context.Context, id string) error
	// Snapshot copies a server's boot disk into image imageID (a snapshot
	// the image service is saving) and returns the bytes stored. A driver
	// that stores data uploads it through its ImageStore.
	Snapshot(ctx context.Context, id, imageID string) (sizeBytes int64, err error)
	// Access lists how a server's owner logs in to it (the login user is
	// the image's, filled in by the caller).
	Access(ctx context.Context, id string) ([]Access, error)
	// Console says where the controller's console proxy reaches a
	// running server's graphical (VNC) console; ErrNoConsole when the
	// driver has none.
	Console(ctx context.Context, id string) (ConsoleEndpoint, error)
	// ConsoleOutput returns the last lines of the serial console (all when
	// lines <= 0).
	ConsoleOutput(ctx context.Context, id string, lines int) (string, error)
	// List returns every server the driver has on any host, for the
	// reconcile that follows a restart.
	List(ctx context.Context) ([]Instance, error)
	// State returns one server's power state.
	State(ctx context.Context, id string) (PowerState, error)
	// AttachPort gives a server a NIC on port, hot-plugged into a running
	// or paused VM; a stopped one gets it at its next start. Attaching a
	// port the server has is not an error.
	AttachPort(ctx context.Context, id string, port Port) error
	// DetachPort takes port portID's NIC out of a server, and out of its
	// next start; a port the server does not have is not an error.
	DetachPort(ctx context.Context, id, portID string) error
	// AttachVolume gives a server a disk on vol, hot-plugged into a
	// running or paused VM; a stopped one gets it at its next start.
	// Attaching a volume the server has updates its record (a new
	// connection) and is otherwise not an error.
	AttachVolume(ctx context.Context, id string, vol Volume) error
	// DetachVolume takes volume volumeID's disk out of a server (waiting
	// for the guest to release it), and out of its next start; a volume
	// the server does not have is not an error.
	DetachVolume(ctx context.Context, id, volumeID string) error
	// ExtendVolume tells a running server that volume volumeID's disk
	// grew to sizeBytes (its data already has), so that the guest sees
	// the new size; a stopped server sees it at its next start.
	ExtendVolume(ctx context.Context, id, volumeID string, sizeBytes int64) error
}

// ErrHostDown is returned by a driver that cannot reach the host a server
// is on (its agent stopped reporting). The work is not lost: the caller
// tries the same step again once the host is back.
var ErrHostDown = errors.New("driver: host is down")

// ErrHostInUse is returned when a host cannot be removed because VMs still
// run on it.
var ErrHostInUse = errors.New("driver: VMs still run on the host")

type opKey struct{}

// WithOpKey names the work a call does, so that a driver that runs work
// remotely (through host agents) can recognise the same step asked again
// after a restart or a lost answer and not run it twice. The compute
// reconcile loop keys each step by server, task and request.
func WithOpKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, opKey{}, key)
}

// OpKey is the key WithOpKey set, or "".
func OpKey(ctx context.Context) string {
	k, _ := ctx.Value(opKey{}).(string)
	return k
}

// PowerListener is told when a driver learns that a server's power state
// changed by itself (a guest that powered off, a host that came back with
// its VMs stopped), so that compute can sync it as Nova's power-state sync
// does. A driver that can tell implements PowerNotifier.
type PowerListener func(serverID string, p PowerState)

// PowerNotifier is implemented by drivers that report power changes.
type PowerNotifier interface {
	SetPowerListener(PowerListener)
}
