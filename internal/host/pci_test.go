package host

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"nimbus/internal/driver"
)

func TestIsGPU(t *testing.T) {
	for _, tc := range []struct {
		name   string
		class  uint32
		vendor string
		addr   string
		want   bool
	}{
		{"NVIDIA 3D controller", 0x030200, "10de", "0000:17:00.0", true},
		{"NVIDIA VGA", 0x030000, "10de", "0000:65:00.0", true},
		{"NVIDIA VGA at 00:02.0 (in a VM)", 0x030000, "10de", "0000:00:02.0", true},
		{"NVIDIA audio function", 0x040300, "10de", "0000:65:00.1", false},
		{"NVIDIA USB function", 0x0c0330, "10de", "0000:65:00.2", false},
		{"NVSwitch bridge", 0x068000, "10de", "0000:05:00.0", false},
		{"AMD Instinct MI210 display controller", 0x038000, "1002", "0000:c1:00.0", true},
		{"AMD Instinct MI300X processing accelerator", 0x120000, "1002", "0000:05:00.0", true},
		{"AMD Radeon VGA", 0x030000, "1002", "0000:03:00.0", true},
		{"AMD CPU vendor id (root complex)", 0x060000, "1022", "0000:00:00.0", false},
		{"Intel integrated VGA", 0x030000, "8086", "0000:00:02.0", false},
		{"Intel integrated, not the primary display", 0x038000, "8086", "0000:00:02.0", false},
		{"Intel integrated SR-IOV VF", 0x030000, "8086", "0000:00:02.3", false},
		{"Intel Data Center GPU Flex", 0x038000, "8086", "0000:4d:00.0", true},
		{"Intel Arc discrete VGA", 0x030000, "8086", "0000:03:00.0", true},
		{"Intel NPU (processing accelerator)", 0x120000, "8086", "0000:00:0b.0", false},
		{"Intel NIC", 0x020000, "8086", "0000:18:00.0", false},
		{"ASPEED BMC VGA", 0x030000, "1a03", "0000:03:00.0", false},
		{"Matrox BMC VGA", 0x030000, "102b", "0000:03:00.0", false},
		{"NVMe", 0x010802, "144d", "0000:65:00.0", false},
		{"virtio", 0xffff00, "1af4", "0000:00:01.0", false},
	} {
		if got := isGPU(tc.class, tc.vendor, tc.addr); got != tc.want {
			t.Errorf("%s: isGPU(%06x, %s, %s) = %v", tc.name, tc.class, tc.vendor, tc.addr, got)
		}
	}
}

func TestGPUModel(t *testing.T) {
	for _, tc := range []struct{ vendor, device, want string }{
		{"10de", "20b5", "A100 80GB"},
		{"10de", "20f1", "A100 40GB"},
		{"10de", "2331", "H100 80GB"},
		{"10de", "2330", "H100 SXM 80GB"},
		{"10de", "27b8", "L4"},
		{"10de", "26b9", "L40S"},
		{"10de", "2236", "A10"},
		{"10de", "1eb8", "T4"},
		{"10de", "2230", "RTX A6000"},
		{"1002", "740f", "MI210"},
		{"10de", "1234", "10de:1234"},
		{"8086", "e20b", "8086:e20b"},
	} {
		if got := gpuModel(tc.vendor, tc.device); got != tc.want {
			t.Errorf("gpuModel(%s, %s) = %q, want %q", tc.vendor, tc.device, got, tc.want)
		}
	}
}

func TestPassthroughProblems(t *testing.T) {
	pci := func(root, addr string) string { return filepath.Join(root, pciDir, addr) }
	// PassthroughProblems reads only these parts of a tree.
	parts := []string{"sys/bus", "sys/kernel", "dev"}
	noIOMMU := edit(t, gpu2, func(r string) { remove(t, filepath.Join(r, "sys/kernel/iommu_groups")) }, parts...)
	for _, tc := range []struct {
		name string
		root string
		addr string
		want [][]string // one entry per problem: words it must hold
	}{
		{name: "ready A100", root: gpu2, addr: "0000:17:00.0"},
		{name: "ready A100 on node 1", root: gpu2, addr: "0000:b1:00.0"},
		{name: "L4 bound to nvidia", root: gpu2, addr: "0000:ca:00.0",
			want: [][]string{{"0000:ca:00.0", "held by the nvidia driver", "vfio-pci"}}},
		{name: "L4 in a shared group", root: gpu2, addr: "0000:e3:00.0",
			want: [][]string{{"IOMMU group 51", "0000:e4:00.0", "class 020000", "mlx5_core", "ACS"}}},
		{name: "no IOMMU", root: noIOMMU, addr: "0000:17:00.0",
			want: [][]string{{"no IOMMU", "intel_iommu=on"}}},
		{name: "no IOMMU and bound to nvidia", root: noIOMMU, addr: "0000:ca:00.0",
			want: [][]string{{"no IOMMU"}, {"nvidia"}}},
		{name: "recorded tree without IOMMU groups", root: amd1, addr: "0000:01:00.0",
			want: [][]string{{"no IOMMU"}, {"held by the nvme driver"}}},
		{name: "no such device", root: gpu2, addr: "0000:99:00.0",
			want: [][]string{{"0000:99:00.0", "no such PCI device"}}},
		{name: "no address", root: gpu2, addr: "", want: [][]string{{"no PCI address"}}},
		{name: "unbound", addr: "0000:17:00.0", root: edit(t, gpu2, func(r string) {
			remove(t, filepath.Join(pci(r, "0000:17:00.0"), "driver"))
		}, parts...), want: [][]string{{"bound to no driver", "driverctl set-override 0000:17:00.0 vfio-pci"}}},
		{name: "/dev/vfio entry missing", addr: "0000:17:00.0", root: edit(t, gpu2, func(r string) {
			remove(t, filepath.Join(r, "dev/vfio/40"))
		}, parts...), want: [][]string{{"/dev/vfio/40"}}},
		{name: "no IOMMU group link", addr: "0000:17:00.0", root: edit(t, gpu2, func(r string) {
			remove(t, filepath.Join(pci(r, "0000:17:00.0"), "iommu_group"))
		}, parts...), want: [][]string{{"in no IOMMU group"}}},
		{name: "audio function held by the host", addr: "0000:17:00.0", root: edit(t, gpu2, func(r string) {
			addFunction(t, r, "0000:17:00.1", "0x040300", 40, "snd_hda_intel")
		}, parts...), want: [][]string{{"0000:17:00.1", "snd_hda_intel"}}},
		{name: "audio function bound to vfio-pci too", addr: "0000:17:00.0", root: edit(t, gpu2, func(r string) {
			addFunction(t, r, "0000:17:00.1", "0x040300", 40, "vfio-pci")
		}, parts...)},
		{name: "unbound function", addr: "0000:17:00.0", root: edit(t, gpu2, func(r string) {
			addFunction(t, r, "0000:17:00.1", "0x040300", 40, "")
		}, parts...)},
		{name: "host bridge is no PCI bridge", addr: "0000:17:00.0", root: edit(t, gpu2, func(r string) {
			addFunction(t, r, "0000:16:00.0", "0x060000", 40, "")
		}, parts...), want: [][]string{{"also holds 0000:16:00.0 (class 060000)"}}},
		{name: "PCI bridge is allowed", addr: "0000:17:00.0", root: edit(t, gpu2, func(r string) {
			addFunction(t, r, "0000:16:00.0", "0x060400", 40, "pcieport")
		}, parts...)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := PassthroughProblems(tc.root, driver.GPU{Address: tc.addr})
			if len(got) != len(tc.want) {
				t.Fatalf("problems %q, want %d", got, len(tc.want))
			}
			for i, words := range tc.want {
				for _, w := range words {
					if !strings.Contains(got[i], w) {
						t.Errorf("problem %d %q lacks %q", i, got[i], w)
					}
				}
			}
		})
	}
}

// addFunction adds a PCI device to an IOMMU group of a copied tree.
func addFunction(t *testing.T, root, addr, class string, group int, drv string) {
	t.Helper()
	d := filepath.Join(root, pciDir, addr)
	write(t, filepath.Join(d, "class"), class+"\n")
	write(t, filepath.Join(d, "vendor"), "0x10de\n")
	write(t, filepath.Join(d, "device"), "0x22bc\n")
	g := strconv.Itoa(group)
	link(t, "../../../../kernel/iommu_groups/"+g, filepath.Join(d, "iommu_group"))
	link(t, "../../../../bus/pci/devices/"+addr, filepath.Join(root, "sys/kernel/iommu_groups", g, "devices", addr))
	if drv != "" {
		link(t, "../../../../bus/pci/drivers/"+drv, filepath.Join(d, "driver"))
	}
}

func TestMemlock(t *testing.T) {
	got, err := Memlock()
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open("/proc/self/limits")
	if err != nil {
		t.Skipf("Memlock() = %d; no /proc/self/limits to check it against", got)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		rest, ok := strings.CutPrefix(s.Text(), "Max locked memory")
		if !ok {
			continue
		}
		soft := strings.Fields(rest)[0]
		want := int64(-1)
		if soft != "unlimited" {
			if want, err = strconv.ParseInt(soft, 10, 64); err != nil {
				t.Fatal(err)
			}
		}
		if got != want {
			t.Errorf("Memlock() = %d, /proc/self/limits says %s", got, soft)
		}
		return
	}
	t.Skipf("Memlock() = %d; /proc/self/limits has no Max locked memory", got)
}
