package host

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"

	"nimbus/internal/driver"
)

const pciDir = "sys/bus/pci/devices"

// gpuVendors are the PCI vendors whose display devices Nimbus rents out.
var gpuVendors = map[string]string{"10de": "NVIDIA", "1002": "AMD", "8086": "Intel"}

// gpuModels names well-known devices ("vendor:device") as the fleet's
// flavors and prices do (nimbus:gpu_model). PCIe cards take the plain name
// and SXM modules say so: they are different products at different prices.
var gpuModels = map[string]string{
	"10de:20b5": "A100 80GB", // A100 80GB PCIe
	"10de:20f1": "A100 40GB", // A100 PCIe 40GB
	"10de:20b0": "A100 SXM 40GB",
	"10de:20b2": "A100 SXM 80GB",
	"10de:20b7": "A30",
	"10de:2331": "H100 80GB", // H100 PCIe
	"10de:2330": "H100 SXM 80GB",
	"10de:2321": "H100 NVL",
	"10de:27b8": "L4",
	"10de:26b9": "L40S",
	"10de:26b5": "L40",
	"10de:2236": "A10",
	"10de:2235": "A40",
	"10de:1eb8": "T4",
	"10de:1db4": "V100 16GB", // V100 PCIe 16GB
	"10de:1db6": "V100 32GB", // V100 PCIe 32GB
	"10de:2230": "RTX A6000",
	"10de:26b1": "RTX 6000 Ada",
	"1002:738c": "MI100",
	"1002:740f": "MI210",
	"1002:74a1": "MI300X",
	"1002:74a5": "MI325X",
	"8086:56c0": "Flex 170",
	"8086:56c1": "Flex 140",
	"8086:0bd5": "Max 1550",
	"8086:0bda": "Max 1100",
}

// PCI class codes (base class and subclass, the class file's top 16 bits).
const (
	classVGA         = 0x0300
	class3D          = 0x0302
	classDisplay     = 0x0380 // "other display controller"
	classPCIBridge   = 0x0604
	classSemiBridge  = 0x0609 // semi-transparent PCI-to-PCI bridge
	classAccelerator = 0x1200 // processing accelerator
)

// isGPU tells a rentable GPU from the other PCI functions of a host:
//   - the vendor is NVIDIA, AMD or Intel (a server's BMC VGA, ASPEED or
//     Matrox, is not);
//   - the class is VGA or 3D controller, or other display controller, which
//     AMD Instinct MI50-MI250 and Intel Data Center GPUs report, or for AMD
//     processing accelerator, which MI300-series GPUs report (an Intel
//     processing accelerator is an NPU, not a GPU);
//   - it is not Intel's integrated graphics, which Intel always puts at bus 0,
//     device 2 of domain 0 (function 0, and 1-7 for its SR-IOV VFs), where no
//     add-in card can sit: those hang below a root port, on another bus.
//
// An AMD APU's integrated graphics has no such fixed address and would count;
// hypervisor hosts are servers without one.
func isGPU(class uint32, vendorID, addr string) bool {
	if _, ok := gpuVendors[vendorID]; !ok {
		return false
	}
	switch class >> 8 {
	case classVGA, class3D, classDisplay:
	case classAccelerator:
		if vendorID != "1002" {
			return false
		}
	default:
		return false
	}
	return !(vendorID == "8086" && strings.HasPrefix(addr, "0000:00:02."))
}

// gpuModel is the fleet's name of a device, or "vendor:device" in hex.
func gpuModel(vendorID, deviceID string) string {
	id := vendorID + ":" + deviceID
	if m, ok := gpuModels[id]; ok {
		return m
	}
	return id
}

// pciID reads a vendor or device file ("0x10de") as 4 lower-case hex digits.
func (t tree) pciID(rel string) (string, error) {
	s, err := t.read(rel)
	if err != nil {
		return "", err
	}
	id := strings.ToLower(strings.TrimPrefix(s, "0x"))
	if _, err := strconv.ParseUint(id, 16, 16); err != nil || len(id) != 4 {
		return "", fmt.Errorf("host: %s: %q is not a PCI id", t.path(rel), s)
	}
	return id, nil
}

// pciClass reads a class file ("0x030200").
func (t tree) pciClass(rel string) (uint32, error) {
	s, err := t.read(rel)
	if err != nil {
		return 0, err
	}
	c, err := strconv.ParseUint(strings.TrimPrefix(s, "0x"), 16, 24)
	if err != nil {
		return 0, fmt.Errorf("host: %s: %q is not a PCI class", t.path(rel), s)
	}
	return uint32(c), nil
}

// iommuGroup is the device's IOMMU group, -1 when it has none.
func (t tree) iommuGroup(addr string) (int, error) {
	g, err := t.linkBase(pciDir + "/" + addr + "/iommu_group")
	if err != nil || g == "" {
		return -1, err
	}
	n, err := strconv.Atoi(g)
	if err != nil {
		return -1, fmt.Errorf("host: %s: IOMMU group %q is not a number", t.path(pciDir+"/"+addr+"/iommu_group"), g)
	}
	return n, nil
}

// gpus lists the host's GPUs by PCI address. A host without a PCI bus (some
// VMs and containers) has none.
func (t tree) gpus() ([]driver.GPU, error) {
	entries, err := os.ReadDir(t.path(pciDir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("host: %w", err)
	}
	var gpus []driver.GPU
	for _, e := range entries {
		addr := e.Name()
		dir := pciDir + "/" + addr + "/"
		class, err := t.pciClass(dir + "class")
		if err != nil {
			return nil, err
		}
		vendorID, err := t.pciID(dir + "vendor")
		if err != nil {
			return nil, err
		}
		if !isGPU(class, vendorID, addr) {
			continue
		}
		deviceID, err := t.pciID(dir + "device")
		if err != nil {
			return nil, err
		}
		g := driver.GPU{Address: addr, Vendor: gpuVendors[vendorID], Model: gpuModel(vendorID, deviceID),
			VendorID: vendorID, DeviceID: deviceID}
		// numa_node is -1 on a kernel or firmware that does not place the
		// device; one node's host is the common case, and 0 is right there.
		if numa, err := t.int(dir + "numa_node"); err == nil && numa > 0 {
			g.NUMA = numa
		} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		if g.IOMMUGroup, err = t.iommuGroup(addr); err != nil {
			return nil, err
		}
		if g.Driver, err = t.linkBase(dir + "driver"); err != nil {
			return nil, err
		}
		gpus = append(gpus, g)
	}
	// ReadDir sorts by name, and PCI addresses sort as names.
	return gpus, nil
}

// slot is a PCI address without its function: "0000:3b:00" of "0000:3b:00.1".
func slot(addr string) string {
	if i := strings.LastIndexByte(addr, '.'); i >= 0 {
		return addr[:i]
	}
	return addr
}

// PassthroughProblems lists what keeps gpu from being passed through on the host at root, in
// words an operator can act on: no IOMMU (no sys/kernel/iommu_groups entries), the IOMMU group
// holding other devices than the GPU's own functions (same bus:device, any function) and PCI
// bridges, the GPU's other functions or the GPU itself not bound to vfio-pci (saying which
// driver holds them), /dev/vfio/<group> missing. It is empty when the GPU is ready. Only
// gpu.Address is used: the rest is read afresh under root. It is meant for when a host
// enrols, not for each server boot.
func PassthroughProblems(root string, gpu driver.GPU) []string {
	t := tree(root)
	addr := gpu.Address
	dir := pciDir + "/" + addr + "/"
	if addr == "" {
		return []string{"the GPU has no PCI address"}
	}
	if _, err := os.Stat(t.path(dir + "class")); err != nil {
		return []string{fmt.Sprintf("%s: no such PCI device on this host", addr)}
	}

	var binding string // what is wrong with the GPU's own driver, if anything
	drv, err := t.linkBase(dir + "driver")
	hint := fmt.Sprintf("bind it to vfio-pci (for example: driverctl set-override %s vfio-pci)", addr)
	switch {
	case err != nil:
		binding = fmt.Sprintf("%s: cannot tell its driver: %v", addr, err)
	case drv == "":
		binding = fmt.Sprintf("%s is bound to no driver: %s", addr, hint)
	case drv != "vfio-pci":
		binding = fmt.Sprintf("%s is held by the %s driver: %s", addr, drv, hint)
	}
	// with returns the problems so far with the binding one after them.
	with := func(problems ...string) []string {
		if binding != "" {
			problems = append(problems, binding)
		}
		return problems
	}

	if groups, _ := os.ReadDir(t.path("sys/kernel/iommu_groups")); len(groups) == 0 {
		return with("no IOMMU (/sys/kernel/iommu_groups is empty): enable VT-d or AMD-Vi in the firmware setup " +
			"and, on Intel, boot with intel_iommu=on")
	}
	group, err := t.iommuGroup(addr)
	if err != nil || group < 0 {
		return with(fmt.Sprintf("%s is in no IOMMU group although the host has an IOMMU: "+
			"check the firmware's IOMMU settings for its slot", addr))
	}

	var problems, strangers []string
	members, err := os.ReadDir(t.path(fmt.Sprintf("sys/kernel/iommu_groups/%d/devices", group)))
	if err != nil {
		problems = append(problems, fmt.Sprintf("cannot list IOMMU group %d: %v", group, err))
	}
	for _, m := range members {
		other := m.Name()
		if other == addr {
			continue
		}
		odir := pciDir + "/" + other + "/"
		odrv, _ := t.linkBase(odir + "driver")
		if slot(other) == slot(addr) {
			// A function of the same card (its audio or USB-C controller) goes
			// to the guest with it, and VFIO refuses the group while the host
			// drives it.
			if odrv != "" && odrv != "vfio-pci" && odrv != "pci-stub" {
				problems = append(problems, fmt.Sprintf("%s, another function of the same card, is held by the %s driver: "+
					"bind it to vfio-pci too", other, odrv))
			}
			continue
		}
		class, err := t.pciClass(odir + "class")
		if err == nil && (class>>8 == classPCIBridge || class>>8 == classSemiBridge) {
			continue // VFIO lets bridges stay with the host
		}
		desc := other
		if err == nil {
			desc += fmt.Sprintf(" (class %06x", class)
			if odrv != "" {
				desc += ", driver " + odrv
			}
			desc += ")"
		}
		strangers = append(strangers, desc)
	}
	if len(strangers) > 0 {
		problems = append([]string{fmt.Sprintf("IOMMU group %d of %s also holds %s, and a guest can only get a whole group: "+
			"move the GPU to a slot whose group holds only it (a PCIe switch or root port without ACS groups what is below it)",
			group, addr, strings.Join(strangers, ", "))}, problems...)
	}
	problems = with(problems...)

	// Binding a device to vfio-pci makes the kernel create /dev/vfio/<group>;
	// for an unbound one the binding problem says it all.
	if drv == "vfio-pci" {
		if _, err := os.Stat(t.path(fmt.Sprintf("dev/vfio/%d", group))); err != nil {
			problems = append(problems, fmt.Sprintf("/dev/vfio/%d is missing although %s is bound to vfio-pci: "+
				"QEMU cannot open the group (is this the host's /dev?)", group, addr))
		}
	}
	return problems
}
