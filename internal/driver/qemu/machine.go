// Package qemu is the hypervisor driver that runs every server as one QEMU
// process on the agent's host: KVM where KVM really works, TCG otherwise.
//
// The package splits in two halves that meet in Machine:
//   - pure functions that turn a Machine into QEMU's command line
//     (cmdline.go), a server's first-boot data into a NoCloud seed or an
//     OpenStack config drive (seed.go), and pick the accelerator
//     (accel.go); the data plane (DataPlane, netuser.go) gives each NIC's
//     arguments;
//   - the driver (driver.go and friends), which fetches and caches images,
//     makes the disks, starts, supervises, re-attaches and reaps the QEMU
//     processes and drives them over QMP.
package qemu

import (
	"nimbus/internal/driver"
)

// Machine is everything QEMU's command line is made from: one server's VM
// on this host. Paths are absolute.
type Machine struct {
	ID   string // the server's id (QEMU's -uuid)
	Name string // a display name (QEMU's -name guest=)
	// Dir is the server's private directory (mode 0700): the QMP socket
	// (qmp.sock), the VNC socket (vnc.sock), the serial log (serial.log)
	// and the pid file (qemu.pid) live there.
	Dir string

	Accel string // "kvm" or "tcg"
	// CPUModel is QEMU's -cpu ("host" under KVM, "max" under TCG when
	// empty).
	CPUModel string
	VCPUs    int
	MemoryMB int
	// Cells are the NUMA cells the scheduler claimed; with more than one,
	// the guest sees the same NUMA layout (-numa node per cell).
	Cells []driver.Cell

	// Disk is the boot disk (the qcow2 overlay on the cached base image).
	Disk Disk
	// Kernel, Initrd and Append boot a kernel directly (the image's
	// kernel_id, ramdisk_id and os_command_line) instead of the disk's
	// boot loader.
	Kernel, Initrd, Append string
	// Seed is the first-boot data (NoCloud or config drive ISO), nil for
	// none.
	Seed *SeedDisk

	// NICs are the network devices, in port order; their -netdev and
	// -device arguments come from the DataPlane.
	NICs []NIC

	// GPUs are PCI addresses given to the guest with vfio-pci, each on its
	// own pcie-root-port.
	GPUs []string
	// Windows turns on what Windows guests need (RTC in local time, Hyper-V
	// enlightenments under KVM, a USB tablet).
	Windows bool
	// Firmware is "bios" (SeaBIOS, default) or "uefi" (OVMF: OVMFCode is
	// the read-only code, OVMFVars the server's own copy of the vars).
	Firmware           string
	OVMFCode, OVMFVars string
	// HotplugSlots are spare pcie-root-ports for volumes and NICs attached
	// later.
	HotplugSlots int
	// Volumes are the attached block storage volumes, each a virtio-blk
	// disk on a pcie-root-port of its own (so that it can be unplugged);
	// their keys are in files in Dir (stashVolumeKeys).
	Volumes []driver.Volume

	// Incoming restores the state saved by a suspend (a file QEMU reads
	// with -incoming), "" for a normal boot.
	Incoming string
	// Sandbox turns on QEMU's seccomp sandbox; RunAs drops QEMU to that
	// user after start (-runas), "" keeps the agent's user.
	Sandbox bool
	RunAs   string
}

// Disk is a disk image given to the guest.
type Disk struct {
	Path   string
	Format string // "qcow2" or "raw"
	// Bus is "virtio" (default), "scsi" or "sata" (the image's
	// hw_disk_bus).
	Bus  string
	IOPS driver.IOPS
}

// SeedDisk is the read-only first-boot disk.
type SeedDisk struct {
	Path string
	// Bus is how the CD-ROM is attached: "scsi" (virtio-scsi, default:
	// Debian's cloud kernels have no AHCI), "sata" or "virtio" (a
	// read-only virtio-blk disk). It is the image's hw_cdrom_bus.
	Bus string
}

// NIC is one guest network device.
type NIC struct {
	ID    string // "net0", "net1", …
	MAC   string
	Model string // "virtio-net-pci" (default) or "e1000" (hw_vif_model)
	// Netdev is the backend's -netdev value, from the DataPlane.
	Netdev string
}

// DataPlane connects a server's ports to the outside. User-mode
// networking (netuser.go) is the first; a bridged one with public
// addresses can follow behind the same interface.
type DataPlane interface {
	// Netdev returns the -netdev value for one port of server, with
	// forwards the host ports of the forwarded guest ports (guest port →
	// host port) for the primary port, and the access entries that reach
	// them.
	Netdev(nicID string, port driver.Port, forwards map[int]int) (string, error)
	// Access lists how to reach the forwarded guest ports.
	Access(forwards map[int]int) []driver.Access
}
