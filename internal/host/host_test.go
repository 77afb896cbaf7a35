package host

import (
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"nimbus/internal/driver"
)

// copyTree copies a testdata tree, links as links, into a temporary
// directory that a test may change. With only, it copies just those parts
// of the tree: creating files can be slow, and the topology of 64 CPUs is
// most of a tree.
func copyTree(t *testing.T, src string, only ...string) string {
	t.Helper()
	dst := t.TempDir()
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if len(only) > 0 && rel != "." && !slices.ContainsFunc(only, func(o string) bool {
			return rel == o || strings.HasPrefix(rel, o+"/") || strings.HasPrefix(o, rel+"/")
		}) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		to := filepath.Join(dst, rel)
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(target, to)
		case d.IsDir():
			return os.MkdirAll(to, 0o755)
		default:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			return os.WriteFile(to, b, 0o644)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

// edit returns a copy of a testdata tree (or of its parts only) changed by f.
func edit(t *testing.T, src string, f func(root string), only ...string) string {
	t.Helper()
	root := copyTree(t, src, only...)
	f(root)
	return root
}

func write(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func remove(t *testing.T, path string) {
	t.Helper()
	if err := os.RemoveAll(path); err != nil {
		t.Fatal(err)
	}
}

func link(t *testing.T, target, path string) {
	t.Helper()
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
}

const (
	gpu2 = "testdata/gpu-2socket"
	amd1 = "testdata/amd-1node"
	vm   = "testdata/this-vm"
)

var gpu2GPUs = []driver.GPU{
	{Address: "0000:17:00.0", Vendor: "NVIDIA", Model: "A100 80GB", NUMA: 0, VendorID: "10de", DeviceID: "20b5", IOMMUGroup: 40, Driver: "vfio-pci"},
	{Address: "0000:31:00.0", Vendor: "NVIDIA", Model: "A100 80GB", NUMA: 0, VendorID: "10de", DeviceID: "20b5", IOMMUGroup: 41, Driver: "vfio-pci"},
	{Address: "0000:98:00.0", Vendor: "NVIDIA", Model: "A100 80GB", NUMA: 1, VendorID: "10de", DeviceID: "20b5", IOMMUGroup: 42, Driver: "vfio-pci"},
	{Address: "0000:b1:00.0", Vendor: "NVIDIA", Model: "A100 80GB", NUMA: 1, VendorID: "10de", DeviceID: "20b5", IOMMUGroup: 43, Driver: "vfio-pci"},
	{Address: "0000:ca:00.0", Vendor: "NVIDIA", Model: "L4", NUMA: 1, VendorID: "10de", DeviceID: "27b8", IOMMUGroup: 50, Driver: "nvidia"},
	{Address: "0000:e3:00.0", Vendor: "NVIDIA", Model: "L4", NUMA: 1, VendorID: "10de", DeviceID: "27b8", IOMMUGroup: 51, Driver: "vfio-pci"},
}

func TestDiscover(t *testing.T) {
	const gib = 262144 // MB per node of gpu-2socket
	noIsolated := edit(t, gpu2, func(root string) {
		write(t, filepath.Join(root, cpuDir, "isolated"), "\n")
	})
	for _, tc := range []struct {
		name     string
		root     string
		o        Options
		cpus     int
		sockets  []int         // socket of each CPU, by distinct value
		siblings map[int][]int // a few CPUs' siblings
		cores    map[int]int   // a few CPUs' core ids
		numa     map[int]int   // a few CPUs' nodes
		reserved []int
		nodes    []driver.NUMANode
		gpus     []driver.GPU
	}{
		{
			name: "gpu-2socket isolcpus", root: gpu2, o: Options{Name: "gpu1", IP: "192.0.2.21", DiskGB: 8000},
			cpus: 64, sockets: []int{0, 1},
			siblings: map[int][]int{0: {0, 32}, 5: {5, 37}, 37: {5, 37}, 20: {20, 52}, 63: {31, 63}},
			cores:    map[int]int{5: 5, 37: 5, 20: 4, 52: 4},
			numa:     map[int]int{0: 0, 15: 0, 16: 1, 31: 1, 32: 0, 47: 0, 48: 1, 63: 1},
			reserved: []int{0, 1, 16, 17, 32, 33, 48, 49},
			nodes:    []driver.NUMANode{{ID: 0, MemoryMB: gib - 512}, {ID: 1, MemoryMB: gib - 512}},
			gpus:     gpu2GPUs,
		},
		{
			name: "gpu-2socket first core per node", root: noIsolated, o: Options{Name: "gpu1"},
			cpus: 64, sockets: []int{0, 1},
			reserved: []int{0, 16, 32, 48},
			nodes:    []driver.NUMANode{{ID: 0, MemoryMB: gib - 512}, {ID: 1, MemoryMB: gib - 512}},
			gpus:     gpu2GPUs,
		},
		{
			name: "gpu-2socket explicit list", root: gpu2, o: Options{Name: "gpu1", ReservedCPUs: []int{32, 0, 0}},
			cpus: 64, sockets: []int{0, 1},
			reserved: []int{0, 32},
			nodes:    []driver.NUMANode{{ID: 0, MemoryMB: gib - 512}, {ID: 1, MemoryMB: gib - 512}},
			gpus:     gpu2GPUs,
		},
		{
			name: "gpu-2socket explicit empty", root: gpu2, o: Options{Name: "gpu1", ReservedCPUs: []int{}},
			cpus: 64, sockets: []int{0, 1},
			reserved: nil,
			nodes:    []driver.NUMANode{{ID: 0, MemoryMB: gib - 512}, {ID: 1, MemoryMB: gib - 512}},
			gpus:     gpu2GPUs,
		},
		{
			name: "gpu-2socket no memory reserved", root: gpu2, o: Options{Name: "gpu1", ReservedMemoryMB: -1},
			cpus: 64, sockets: []int{0, 1},
			reserved: []int{0, 1, 16, 17, 32, 33, 48, 49},
			nodes:    []driver.NUMANode{{ID: 0, MemoryMB: gib}, {ID: 1, MemoryMB: gib}},
			gpus:     gpu2GPUs,
		},
		{
			// An odd reservation still adds up: 512 from node 0, 513 from node 1.
			name: "gpu-2socket odd memory reservation", root: gpu2, o: Options{Name: "gpu1", ReservedMemoryMB: 1025},
			cpus: 64, sockets: []int{0, 1},
			reserved: []int{0, 1, 16, 17, 32, 33, 48, 49},
			nodes:    []driver.NUMANode{{ID: 0, MemoryMB: gib - 512}, {ID: 1, MemoryMB: gib - 513}},
			gpus:     gpu2GPUs,
		},
		{
			name: "amd-1node default", root: amd1, o: Options{Name: "epyc1", Zone: "az2"},
			cpus: 16, sockets: []int{0},
			siblings: map[int][]int{0: {0, 1}, 1: {0, 1}, 5: {4, 5}, 15: {14, 15}},
			cores:    map[int]int{0: 0, 7: 3, 8: 8, 9: 8, 15: 11}, // core ids with gaps, kept as they are
			numa:     map[int]int{0: 0, 15: 0},
			reserved: []int{0, 1},
			// 131900000 kB is 128808 MB.
			nodes: []driver.NUMANode{{ID: 0, MemoryMB: 128808 - 1024}},
		},
		{
			name: "amd-1node explicit", root: amd1, o: Options{Name: "epyc1", ReservedCPUs: []int{15}, ReservedMemoryMB: 4096},
			cpus: 16, sockets: []int{0},
			reserved: []int{15},
			nodes:    []driver.NUMANode{{ID: 0, MemoryMB: 128808 - 4096}},
		},
		{
			// Recorded from the VM these tests were written on: 2 vCPUs without SMT,
			// virtio devices and no GPU, and one node whose meminfo says 5597396 kB
			// while /proc/meminfo says 24684092 kB: its kernel (deferred_init=lazy)
			// counts pages in the node as it initialises them. Discover takes the
			// node's figure, which is the lower one.
			name: "this-vm", root: vm, o: Options{Name: "vm"},
			cpus: 2, sockets: []int{0},
			siblings: map[int][]int{0: {0}, 1: {1}},
			cores:    map[int]int{0: 0, 1: 1},
			reserved: []int{0},
			nodes:    []driver.NUMANode{{ID: 0, MemoryMB: 5466 - 1024}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, err := Discover(tc.root, tc.o)
			if err != nil {
				t.Fatal(err)
			}
			if h.Name != tc.o.Name || h.IP != tc.o.IP || h.DiskGB != tc.o.DiskGB {
				t.Errorf("name, IP, disk = %q, %q, %d; want the options' %q, %q, %d", h.Name, h.IP, h.DiskGB, tc.o.Name, tc.o.IP, tc.o.DiskGB)
			}
			if want := cmpOr(tc.o.Zone, "nova"); h.Zone != want {
				t.Errorf("zone %q, want %q", h.Zone, want)
			}
			if h.Hypervisor != "" {
				t.Errorf("hypervisor %q, want it left to the caller", h.Hypervisor)
			}
			if len(h.CPUs) != tc.cpus {
				t.Fatalf("%d CPUs, want %d", len(h.CPUs), tc.cpus)
			}
			var sockets []int
			for i, c := range h.CPUs {
				if c.ID != i {
					t.Errorf("CPUs[%d] has id %d", i, c.ID)
				}
				if !slices.Contains(c.Siblings, c.ID) {
					t.Errorf("CPU %d is not among its siblings %v", c.ID, c.Siblings)
				}
				if !slices.Contains(sockets, c.Socket) {
					sockets = append(sockets, c.Socket)
				}
			}
			slices.Sort(sockets)
			if !slices.Equal(sockets, tc.sockets) {
				t.Errorf("sockets %v, want %v", sockets, tc.sockets)
			}
			for id, want := range tc.siblings {
				if got := h.CPUs[id].Siblings; !slices.Equal(got, want) {
					t.Errorf("CPU %d siblings %v, want %v", id, got, want)
				}
			}
			for id, want := range tc.cores {
				if got := h.CPUs[id].Core; got != want {
					t.Errorf("CPU %d core %d, want %d", id, got, want)
				}
			}
			for id, want := range tc.numa {
				if got := h.CPUs[id].NUMA; got != want {
					t.Errorf("CPU %d node %d, want %d", id, got, want)
				}
			}
			if !slices.Equal(h.ReservedCPUs, tc.reserved) {
				t.Errorf("reserved %v, want %v", h.ReservedCPUs, tc.reserved)
			}
			if h.VCPUs != tc.cpus-len(tc.reserved) {
				t.Errorf("VCPUs %d, want %d", h.VCPUs, tc.cpus-len(tc.reserved))
			}
			if !slices.Equal(h.NUMANodes, tc.nodes) {
				t.Errorf("nodes %v, want %v", h.NUMANodes, tc.nodes)
			}
			mem := 0
			for _, n := range tc.nodes {
				mem += n.MemoryMB
			}
			if h.MemoryMB != mem {
				t.Errorf("MemoryMB %d, want %d", h.MemoryMB, mem)
			}
			if !reflect.DeepEqual(h.GPUs, tc.gpus) {
				t.Errorf("GPUs\n%+v\nwant\n%+v", h.GPUs, tc.gpus)
			}
		})
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func TestDiscoverErrors(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	write(t, file, "x")
	for _, tc := range []struct {
		name string
		root string
		o    Options
		want string
	}{
		{name: "missing root", root: "testdata/no-such-host", want: "no such file"},
		{name: "root is a file", root: file, want: "not a directory"},
		{name: "empty root", root: t.TempDir(), want: "cpu/online"},
		{name: "malformed online", want: "bad CPU list", root: edit(t, amd1, func(r string) {
			write(t, filepath.Join(r, cpuDir, "online"), "0-15,x\n")
		})},
		{name: "no online CPU", want: "lists no CPU", root: edit(t, amd1, func(r string) {
			write(t, filepath.Join(r, cpuDir, "online"), "\n")
		})},
		{name: "malformed siblings", want: "thread_siblings_list", root: edit(t, amd1, func(r string) {
			write(t, filepath.Join(r, cpuDir, "cpu3/topology/thread_siblings_list"), "2-\n")
		})},
		{name: "malformed isolated", want: "isolated", root: edit(t, amd1, func(r string) {
			write(t, filepath.Join(r, cpuDir, "isolated"), "1-0\n")
		})},
		{name: "malformed node cpulist", want: "node0/cpulist", root: edit(t, vm, func(r string) {
			write(t, filepath.Join(r, nodeDir, "node0/cpulist"), "0;1\n")
		})},
		{name: "malformed node list", want: "node/online", root: edit(t, vm, func(r string) {
			write(t, filepath.Join(r, nodeDir, "online"), "0-\n")
		})},
		{name: "missing core_id", want: "cpu7/topology/core_id", root: edit(t, amd1, func(r string) {
			remove(t, filepath.Join(r, cpuDir, "cpu7/topology/core_id"))
		})},
		{name: "missing node meminfo", want: "node0/meminfo", root: edit(t, vm, func(r string) {
			remove(t, filepath.Join(r, nodeDir, "node0/meminfo"))
		})},
		{name: "meminfo without MemTotal", want: "no MemTotal", root: edit(t, amd1, func(r string) {
			write(t, filepath.Join(r, "proc/meminfo"), "MemFree: 1 kB\n")
		})},
		{name: "MemTotal not in kB", want: "no MemTotal", root: edit(t, amd1, func(r string) {
			write(t, filepath.Join(r, "proc/meminfo"), "MemTotal: 131900000 MB\n")
		})},
		{name: "bad PCI class", want: "not a PCI class", root: edit(t, amd1, func(r string) {
			write(t, filepath.Join(r, pciDir, "0000:c2:00.0/class"), "VGA\n")
		})},
		{name: "bad PCI vendor", want: "not a PCI id", root: edit(t, amd1, func(r string) {
			write(t, filepath.Join(r, pciDir, "0000:c2:00.0/vendor"), "0x1a03a\n")
		})},
		{name: "reserved CPU offline", root: amd1, o: Options{ReservedCPUs: []int{0, 16}}, want: "reserved CPU 16"},
		{name: "too much memory reserved", root: amd1, o: Options{ReservedMemoryMB: 200000}, want: "leaves nothing"},
		{name: "negative disk", root: amd1, o: Options{DiskGB: -1}, want: "negative"},
		{name: "missing disk path", root: amd1, o: Options{DiskPath: "/no/such/disk"}, want: "/no/such/disk"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.o.Name == "" {
				tc.o.Name = "h"
			}
			h, err := Discover(tc.root, tc.o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Discover = %+v, %v; want an error with %q", h.Name, err, tc.want)
			}
		})
	}
}

func TestDiskPath(t *testing.T) {
	h, err := Discover(amd1, Options{Name: "h", DiskPath: "."})
	if err != nil {
		t.Fatal(err)
	}
	if h.DiskGB < 0 {
		t.Errorf("DiskGB %d", h.DiskGB)
	}
	h2, err := Discover(amd1, Options{Name: "h", DiskPath: ".", DiskGB: 7})
	if err != nil || h2.DiskGB != 7 {
		t.Errorf("an explicit DiskGB must win over DiskPath: %d, %v", h2.DiskGB, err)
	}
	t.Logf("the filesystem of . holds %d GiB", h.DiskGB)
}

// TestDiscoverThisMachine runs Discover on the machine the tests run on.
func TestDiscoverThisMachine(t *testing.T) {
	online, err := os.ReadFile("/sys/devices/system/cpu/online")
	if errors.Is(err, fs.ErrNotExist) {
		t.Skip("no /sys/devices/system/cpu/online: not a Linux machine with sysfs mounted")
	}
	if err != nil {
		t.Fatal(err)
	}
	ids, err := parseCPUList(string(online))
	if err != nil {
		t.Fatal(err)
	}
	h, err := Discover("/", Options{DiskPath: "/"})
	if err != nil {
		t.Fatal(err)
	}
	if h.Name == "" || len(h.CPUs) != len(ids) || len(h.NUMANodes) == 0 || h.MemoryMB <= 0 {
		t.Errorf("Discover(/) = %d CPUs (online: %d), nodes %v, name %q", len(h.CPUs), len(ids), h.NUMANodes, h.Name)
	}
	t.Logf("%s: %d CPUs, reserved %v, %d vCPUs, nodes %v, %d MB, %d GB disk", h.Name, len(h.CPUs), h.ReservedCPUs,
		h.VCPUs, h.NUMANodes, h.MemoryMB, h.DiskGB)
	for _, g := range h.GPUs {
		t.Logf("GPU %+v: problems %q", g, PassthroughProblems("/", g))
	}
}

// TestRecordScript checks that record.sh copies what Discover reads: a tree
// recorded from a tree, or from this machine, discovers the same.
func TestRecordScript(t *testing.T) {
	if testing.Short() {
		t.Skip("records four trees with a shell script")
	}
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh to run record.sh")
	}
	record := func(src string) string {
		out := filepath.Join(t.TempDir(), "rec")
		cmd := exec.Command("sh", "testdata/record.sh", out, src)
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("record.sh %s: %v\n%s", src, err, b)
		}
		return out
	}
	for _, src := range []string{gpu2, amd1, vm} {
		want, err := Discover(src, Options{Name: "h"})
		if err != nil {
			t.Fatal(err)
		}
		rec := record(src)
		got, err := Discover(rec, Options{Name: "h"})
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s recorded:\n%+v\nwant\n%+v", src, got, want)
		}
		for _, g := range want.GPUs {
			if p, q := PassthroughProblems(rec, g), PassthroughProblems(src, g); !slices.Equal(p, q) {
				t.Errorf("%s %s recorded: problems %q, want %q", src, g.Address, p, q)
			}
		}
	}

	if _, err := os.Stat("/sys/devices/system/cpu/online"); err != nil {
		return
	}
	want, err := Discover("/", Options{Name: "h"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := Discover(record("/"), Options{Name: "h"})
	if err != nil {
		t.Fatal(err)
	}
	// Memory moves while the tests run; topology and devices do not.
	if !reflect.DeepEqual(got.CPUs, want.CPUs) || !slices.Equal(got.ReservedCPUs, want.ReservedCPUs) ||
		!reflect.DeepEqual(got.GPUs, want.GPUs) || len(got.NUMANodes) != len(want.NUMANodes) {
		t.Errorf("/ recorded:\n%+v\nwant\n%+v", got, want)
	}
}

// TestMemoryTotals: the nodes' memory and the machine's, which differ on a
// VM whose node meminfo shows less than /proc/meminfo (the qemu driver
// logs why it offers less than the machine has).
func TestMemoryTotals(t *testing.T) {
	for _, tc := range []struct {
		root             string
		nodes, machineMB int
	}{
		{"testdata/gpu-2socket", 2 * 262144, 524288},
		{"testdata/amd-1node", 131900000 / 1024, 131900000 / 1024},
		{"testdata/this-vm", 5597396 / 1024, 24684092 / 1024},
	} {
		nodes, machine, err := MemoryTotals(tc.root)
		if err != nil || nodes != tc.nodes || machine != tc.machineMB {
			t.Errorf("%s: nodes %d MB, machine %d MB (%v), want %d and %d", tc.root, nodes, machine, err, tc.nodes, tc.machineMB)
		}
	}
	if _, _, err := MemoryTotals(t.TempDir()); err == nil {
		t.Error("an empty tree has memory totals")
	}
}
