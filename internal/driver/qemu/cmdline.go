package qemu

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/google/uuid"
)

// Names on the command line that the runtime uses over QMP.
const (
	// DiskDevID is the boot disk's qdev id (block_set_io_throttle takes
	// "disk0-dev/virtio-backend" for virtio-blk, "disk0-dev" for scsi-hd
	// and ide-hd).
	DiskDevID = "disk0-dev"
	// DiskNode is the boot disk's format node (qcow2 or raw); DiskFileNode
	// the file node under it; DiskThrottleNode the throttle filter on top
	// of it, present only when the disk has IOPS limits.
	DiskNode         = "disk0"
	DiskFileNode     = "disk0-file"
	DiskThrottleNode = "disk0-throttle"
	// ThrottleGroupID is the boot disk's throttle group object
	// (/objects/tg0; qom-set its "limits" to change them live), present
	// only when the disk has IOPS limits.
	ThrottleGroupID = "tg0"
	// SeedNode is the seed's format node, SeedDevID its qdev id.
	SeedNode  = "seed"
	SeedDevID = "seed-dev"
	// SCSIControllerID is the virtio-scsi controller, present when the
	// disk or the seed is on the "scsi" bus.
	SCSIControllerID = "scsi0"
	// QMPSocket, VNCSocket, SerialLog and PIDFile are the file names in
	// Machine.Dir.
	QMPSocket = "qmp.sock"
	VNCSocket = "vnc.sock"
	SerialLog = "serial.log"
	PIDFile   = "qemu.pid"
)

// HotplugPortID is the id of the i-th spare pcie-root-port (bus= for
// device_add of a volume or NIC attached later).
func HotplugPortID(i int) string { return "hp" + strconv.Itoa(i) }

// NICPortID is the id of the pcie-root-port of the i-th NIC on the
// command line: an "hp" name, so that once its NIC is detached the port
// takes another device.
func NICPortID(i int) string { return "hpn" + strconv.Itoa(i) }

// VolumePortID is the id of the pcie-root-port of the i-th volume on the
// command line: an "hp" name, so that once its volume is detached the
// port takes another one.
func VolumePortID(i int) string { return "hpv" + strconv.Itoa(i) }

// Command is QEMU's argv (without the binary) for m.
//
// The result is deterministic. Notes on the choices, all checked against
// QEMU 7.2:
//   - The serial console is a file chardev with append=on, so the log
//     keeps growing across guest reboots and process restarts.
//   - QMP is a unix socket chardev (server, no wait) bound to a monitor.
//   - The boot disk is -blockdev: file node (cache.direct=on,
//     aio=threads, i.e. cache=none) → format node → throttle node when
//     IOPS are set (throttle group tg0 with x-iops-read/x-iops-write; the
//     dotted limits.* form is rejected on the command line).
//   - Volumes are JSON -object/-blockdev/-device arguments, the very
//     ones hot-plug gives QMP (volumeSpec), so that detach finds either.
//   - No -no-shutdown: a guest poweroff ends the process.
//   - With Incoming, QEMU reads the saved state through "exec:cat FILE"
//     (QEMU 7.2 has no file: migration URI) and resumes the guest by
//     itself; since that spawns a process, the sandbox then leaves out
//     spawn=deny. With RunAs, the sandbox leaves out
//     elevateprivileges=deny, which makes -runas die with SIGSYS.
//
// QemuOpts values (paths, names) have their commas doubled, so any path
// works.
func Command(m *Machine) []string {
	var a args
	accel := m.Accel
	if accel == "" {
		accel = "tcg"
	}
	name := m.Name
	if name == "" {
		name = m.ID
	}
	if name != "" {
		a.add("-name", "guest="+esc(name)+",debug-threads=on")
	} else {
		a.add("-name", "debug-threads=on")
	}
	if isUUID(m.ID) {
		a.add("-uuid", m.ID)
	}
	a.add("-machine", "q35,accel="+accel)
	a.add("-cpu", cpuArg(m, accel))
	vcpus := max(m.VCPUs, 1)
	cells := cellLayout(m, vcpus)
	if len(cells) > 1 && vcpus%len(cells) == 0 && evenCells(cells) {
		a.add("-smp", fmt.Sprintf("%d,sockets=%d,cores=%d,threads=1", vcpus, len(cells), vcpus/len(cells)))
	} else {
		a.add("-smp", fmt.Sprintf("%d,sockets=1,cores=%d,threads=1", vcpus, vcpus))
	}
	a.add("-m", strconv.Itoa(memoryMB(m)))
	for i, c := range cells {
		a.add("-object", fmt.Sprintf("memory-backend-ram,id=mem%d,size=%dM", i, c.memMB))
		node := fmt.Sprintf("node,nodeid=%d", i)
		switch {
		case c.ncpus == 1:
			node += fmt.Sprintf(",cpus=%d", c.first)
		case c.ncpus > 1:
			node += fmt.Sprintf(",cpus=%d-%d", c.first, c.first+c.ncpus-1)
		}
		a.add("-numa", node+fmt.Sprintf(",memdev=mem%d", i))
	}
	a.add("-nodefaults", "-no-user-config")
	a.add("-display", "none")
	a.add("-msg", "timestamp=on")
	if m.Windows {
		a.add("-rtc", "base=localtime,driftfix=slew")
	}
	if m.Sandbox {
		sb := "on,obsolete=deny"
		if m.RunAs == "" {
			sb += ",elevateprivileges=deny"
		}
		if m.Incoming == "" {
			sb += ",spawn=deny"
		}
		a.add("-sandbox", sb+",resourcecontrol=deny")
	}
	if m.RunAs != "" {
		a.add("-runas", m.RunAs)
	}
	a.add("-pidfile", filepath.Join(m.Dir, PIDFile))
	a.add("-chardev", "socket,id=qmp,path="+esc(filepath.Join(m.Dir, QMPSocket))+",server=on,wait=off")
	a.add("-mon", "chardev=qmp,mode=control")
	a.add("-chardev", "file,id=serial0,path="+esc(filepath.Join(m.Dir, SerialLog))+",append=on")
	a.add("-serial", "chardev:serial0")
	a.add("-vnc", "unix:"+esc(filepath.Join(m.Dir, VNCSocket)))
	a.add("-device", "VGA,id=video0")
	// An entropy source, as Nova gives with hw_rng: a fresh guest under TCG
	// otherwise waits seconds for its random pool before sshd can start.
	a.add("-object", "rng-random,id=rng0,filename=/dev/urandom")
	a.add("-device", "virtio-rng-pci,rng=rng0,id=rng0-dev")
	if m.Firmware == "uefi" {
		a.add("-drive", "if=pflash,format=raw,readonly=on,file="+esc(m.OVMFCode))
		a.add("-drive", "if=pflash,format=raw,file="+esc(m.OVMFVars))
		if len(m.GPUs) > 0 {
			// Room for the 64-bit BARs of big GPUs (256 GiB window).
			a.add("-fw_cfg", "name=opt/ovmf/X-PciMmio64Mb,string=262144")
		}
	}
	a.add("-boot", "strict=on")
	if m.Kernel != "" {
		a.add("-kernel", m.Kernel)
		if m.Initrd != "" {
			a.add("-initrd", m.Initrd)
		}
		if m.Append != "" {
			a.add("-append", m.Append)
		}
	}

	diskBus := busOr(m.Disk.Bus, "virtio")
	seedBus := ""
	if m.Seed != nil {
		seedBus = busOr(m.Seed.Bus, "scsi")
	}
	if (m.Disk.Path != "" && diskBus == "scsi") || seedBus == "scsi" {
		a.add("-device", "virtio-scsi-pci,id="+SCSIControllerID)
	}
	if m.Disk.Path != "" {
		a.disk(m.Disk, diskBus)
	}
	if m.Seed != nil {
		a.add("-blockdev", "driver=file,node-name=seed-file,filename="+esc(m.Seed.Path)+",read-only=on")
		a.add("-blockdev", "driver=raw,node-name="+SeedNode+",file=seed-file,read-only=on")
		switch seedBus {
		case "sata":
			a.add("-device", "ide-cd,drive="+SeedNode+",bus=ide.1,id="+SeedDevID)
		case "virtio":
			a.add("-device", "virtio-blk-pci,drive="+SeedNode+",id="+SeedDevID)
		default:
			a.add("-device", "scsi-cd,drive="+SeedNode+",bus="+SCSIControllerID+".0,id="+SeedDevID)
		}
	}

	// Each NIC sits on a pcie-root-port of its own, as hot-plugged ones
	// do, so that any NIC can be unplugged (the root complex cannot).
	chassis := 0
	for i, n := range m.NICs {
		model := n.Model
		if model == "" {
			model = "virtio-net-pci"
		}
		chassis++
		rp := NICPortID(i)
		a.add("-device", fmt.Sprintf("pcie-root-port,id=%s,chassis=%d,slot=%d", rp, chassis, chassis))
		dev := model
		if n.Netdev != "" {
			a.add("-netdev", n.Netdev)
			dev += ",netdev=" + n.ID
		}
		if n.MAC != "" {
			dev += ",mac=" + n.MAC
		}
		a.add("-device", dev+",bus="+rp+",id="+n.ID+"-dev")
	}

	if m.Windows {
		a.add("-device", "qemu-xhci,id=usb0")
		a.add("-device", "usb-tablet,id=tablet0,bus=usb0.0")
	}

	for i, addr := range m.GPUs {
		chassis++
		rp := fmt.Sprintf("gpurp%d", i)
		a.add("-device", fmt.Sprintf("pcie-root-port,id=%s,chassis=%d,slot=%d", rp, chassis, chassis))
		a.add("-device", fmt.Sprintf("vfio-pci,host=%s,bus=%s,id=gpu%d", esc(addr), rp, i))
	}
	for i, vol := range m.Volumes {
		chassis++
		rp := VolumePortID(i)
		a.add("-device", fmt.Sprintf("pcie-root-port,id=%s,chassis=%d,slot=%d", rp, chassis, chassis))
		p := volumeSpec(m.Dir, vol, rp)
		for _, o := range p.objects {
			a.add("-object", jsonArg(o))
		}
		a.add("-blockdev", jsonArg(p.node))
		a.add("-device", jsonArg(p.device))
	}
	for i := range m.HotplugSlots {
		chassis++
		a.add("-device", fmt.Sprintf("pcie-root-port,id=%s,chassis=%d,slot=%d", HotplugPortID(i), chassis, chassis))
	}

	if m.Incoming != "" {
		a.add("-incoming", "exec:cat "+shellQuote(m.Incoming))
	}
	return a
}

// maxSocketPath is the longest unix socket path that QEMU listens on and
// Go connects to: sun_path has 108 bytes, and Go (unlike QEMU) wants one
// for a NUL.
const maxSocketPath = 107

// Validate reports what in m would keep QEMU from starting or the runtime
// from reaching it; Command itself never fails. Notably DIR/qmp.sock must
// fit a unix socket path: Dir of at most 98 bytes.
func Validate(m *Machine) error {
	if m.Dir == "" || !filepath.IsAbs(m.Dir) {
		return fmt.Errorf("qemu: machine directory %q is not an absolute path", m.Dir)
	}
	for _, name := range []string{QMPSocket, VNCSocket} {
		if p := filepath.Join(m.Dir, name); len(p) > maxSocketPath {
			return fmt.Errorf("qemu: socket path %s is %d bytes, longer than a unix socket path may be (%d)", p, len(p), maxSocketPath)
		}
	}
	switch m.Accel {
	case "", "tcg", "kvm":
	default:
		return fmt.Errorf("qemu: unknown accelerator %q", m.Accel)
	}
	if m.VCPUs < 1 || m.MemoryMB < 1 {
		return fmt.Errorf("qemu: bad size: %d vCPUs, %d MB", m.VCPUs, m.MemoryMB)
	}
	if m.Firmware == "uefi" && (m.OVMFCode == "" || m.OVMFVars == "") {
		return errors.New("qemu: UEFI firmware without OVMF code and vars files")
	}
	seen := map[string]bool{}
	for _, n := range m.NICs {
		if !isQEMUID(n.ID) || seen[n.ID] {
			return fmt.Errorf("qemu: bad or repeated NIC id %q", n.ID)
		}
		seen[n.ID] = true
		if n.MAC != "" {
			if hw, err := net.ParseMAC(n.MAC); err != nil || len(hw) != 6 {
				return fmt.Errorf("qemu: NIC %s: bad MAC address %q", n.ID, n.MAC)
			}
		}
	}
	vols := map[string]bool{}
	if err := checkBootVolume(m.Volumes); err != nil {
		return err
	}
	if _, ok := bootVolume(m.Volumes); ok && (m.Disk.Path != "" || m.Kernel != "") {
		return errors.New("qemu: a machine that boots from a volume has no boot disk nor kernel of its own")
	}
	for _, vol := range m.Volumes {
		if err := validVolume(vol); err != nil {
			return fmt.Errorf("qemu: %w", err)
		}
		if vols[vol.ID] {
			return fmt.Errorf("qemu: volume %s is attached twice", vol.ID)
		}
		vols[vol.ID] = true
	}
	return nil
}

// jsonArg is a QEMU option as JSON (-object, -blockdev and -device take
// it), which needs no escaping of paths or ids.
func jsonArg(v map[string]any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // maps of strings, numbers and bools
	}
	return string(b)
}

type args []string

func (a *args) add(s ...string) { *a = append(*a, s...) }

// disk adds the boot disk's block nodes and device.
func (a *args) disk(d Disk, bus string) {
	format := d.Format
	if format == "" {
		format = "qcow2"
	}
	a.add("-blockdev", "driver=file,node-name="+DiskFileNode+",filename="+esc(d.Path)+",cache.direct=on,aio=threads")
	a.add("-blockdev", "driver="+format+",node-name="+DiskNode+",file="+DiskFileNode)
	top := DiskNode
	if d.IOPS.Read > 0 || d.IOPS.Write > 0 {
		tg := "throttle-group,id=" + ThrottleGroupID
		if d.IOPS.Read > 0 {
			tg += ",x-iops-read=" + strconv.Itoa(d.IOPS.Read)
		}
		if d.IOPS.Write > 0 {
			tg += ",x-iops-write=" + strconv.Itoa(d.IOPS.Write)
		}
		a.add("-object", tg)
		a.add("-blockdev", "driver=throttle,node-name="+DiskThrottleNode+",throttle-group="+ThrottleGroupID+",file="+DiskNode)
		top = DiskThrottleNode
	}
	switch bus {
	case "scsi":
		a.add("-device", "scsi-hd,drive="+top+",bus="+SCSIControllerID+".0,id="+DiskDevID+",bootindex=1")
	case "sata":
		a.add("-device", "ide-hd,drive="+top+",bus=ide.0,id="+DiskDevID+",bootindex=1")
	default:
		a.add("-device", "virtio-blk-pci,drive="+top+",id="+DiskDevID+",bootindex=1")
	}
}

func busOr(bus, def string) string {
	switch bus {
	case "virtio", "scsi", "sata":
		return bus
	case "ide": // Nova's name for the same thing on q35
		return "sata"
	}
	return def
}

// cpuArg is -cpu: CPUModel, else host under kvm and max under tcg; with
// Hyper-V enlightenments for Windows under kvm.
func cpuArg(m *Machine, accel string) string {
	cpu := m.CPUModel
	if cpu == "" {
		cpu = "max"
		if accel == "kvm" {
			cpu = "host"
		}
	}
	if m.Windows && accel == "kvm" {
		cpu += ",hv_relaxed,hv_spinlocks=0x1fff,hv_vapic,hv_time"
	}
	return cpu
}

type numaCell struct {
	first, ncpus, memMB int
}

// cellLayout gives the guest NUMA nodes: none for zero or one cell, else
// one per cell with the vCPUs assigned in order (len(cell.CPUs) each when
// they add up to vcpus, else spread evenly) and the cell's memory (when
// the cells add up to the machine's memory, else spread evenly).
func cellLayout(m *Machine, vcpus int) []numaCell {
	n := len(m.Cells)
	if n < 2 {
		return nil
	}
	cpuSum, memSum := 0, 0
	for _, c := range m.Cells {
		cpuSum += len(c.CPUs)
		memSum += c.MemoryMB
	}
	mem := memoryMB(m)
	out := make([]numaCell, n)
	next := 0
	for i, c := range m.Cells {
		cnt := len(c.CPUs)
		if cpuSum != vcpus {
			cnt = vcpus / n
			if i < vcpus%n {
				cnt++
			}
		}
		mb := c.MemoryMB
		if memSum != mem {
			mb = mem / n
			if i == 0 {
				mb += mem % n
			}
		}
		out[i] = numaCell{first: next, ncpus: cnt, memMB: mb}
		next += cnt
	}
	return out
}

func evenCells(cells []numaCell) bool {
	for _, c := range cells {
		if c.ncpus != cells[0].ncpus {
			return false
		}
	}
	return true
}

func memoryMB(m *Machine) int {
	if m.MemoryMB > 0 {
		return m.MemoryMB
	}
	return 128
}

// isUUID reports whether s is a UUID in the canonical 36-character form
// QEMU's -uuid takes.
func isUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	_, err := uuid.Parse(s)
	return err == nil
}

// esc escapes a QemuOpts value (commas are doubled).
func esc(s string) string { return strings.ReplaceAll(s, ",", ",,") }

// shellQuote quotes s for /bin/sh, which runs exec: migration commands.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
