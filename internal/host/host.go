// Package host discovers a Linux hypervisor host's inventory (CPU topology, NUMA memory, GPUs
// and their readiness for passthrough) from its sysfs and procfs.
package host

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"nimbus/internal/driver"
)

// Options tune discovery.
type Options struct {
	Name string // host name; default os.Hostname()
	IP   string // address the controller reaches the host on (as given; not discovered)
	Zone string // availability zone, default "nova"
	// ReservedCPUs are kept for the host (and QEMU's emulator threads). nil means: if the
	// kernel isolates CPUs (isolcpus: /sys/devices/system/cpu/isolated names online CPUs)
	// every online CPU that is NOT isolated is reserved; otherwise the first core (all its
	// sibling threads) of each NUMA node is reserved. An explicit empty slice reserves
	// nothing. Every CPU listed must be online.
	ReservedCPUs []int
	// ReservedMemoryMB is kept for the host itself, taken from the NUMA nodes in proportion
	// to their memory. 0 means the default, 1024; a negative value reserves nothing.
	ReservedMemoryMB int
	// DiskGB is the local disk pool size in GiB; when 0 and DiskPath is set, statfs(DiskPath)
	// gives it (the whole size, free and used, of that filesystem). DiskPath is a path of the
	// running system, not under Discover's root.
	DiskGB   int
	DiskPath string
}

// DefaultReservedMemoryMB is the memory Discover keeps for the host when
// Options.ReservedMemoryMB is 0.
const DefaultReservedMemoryMB = 1024

// Discover reads the inventory of the host whose root filesystem is at root ("/" on a real
// host, a recorded tree in tests). It returns a driver.Host with CPUs (id, core, socket, NUMA
// node, siblings from thread_siblings_list), ReservedCPUs, NUMANodes (memory per node from
// nodeN/meminfo MemTotal, less the reserved share; one node 0 with /proc/meminfo MemTotal when
// the kernel shows no nodes), GPUs, and VCPUs and MemoryMB as driver.Host.Normalize computes
// them. Hypervisor, Version, Up and UptimeSince are left to the caller.
func Discover(root string, o Options) (driver.Host, error) {
	fi, err := os.Stat(root)
	if err != nil {
		return driver.Host{}, fmt.Errorf("host: root: %w", err)
	}
	if !fi.IsDir() {
		return driver.Host{}, fmt.Errorf("host: root %s is not a directory", root)
	}
	t := tree(root)

	h := driver.Host{Name: o.Name, IP: o.IP, Zone: o.Zone, DiskGB: o.DiskGB}
	if h.Name == "" {
		if h.Name, err = os.Hostname(); err != nil {
			return driver.Host{}, fmt.Errorf("host: name: %w", err)
		}
	}
	if h.Zone == "" {
		h.Zone = "nova"
	}
	switch {
	case o.DiskGB < 0:
		return driver.Host{}, fmt.Errorf("host: DiskGB %d is negative", o.DiskGB)
	case o.DiskGB == 0 && o.DiskPath != "":
		if h.DiskGB, err = filesystemGB(o.DiskPath); err != nil {
			return driver.Host{}, err
		}
	}

	if h.CPUs, err = t.cpus(); err != nil {
		return driver.Host{}, err
	}
	nodes, err := t.nodes(h.CPUs)
	if err != nil {
		return driver.Host{}, err
	}
	if h.ReservedCPUs, err = t.reservedCPUs(o.ReservedCPUs, h.CPUs, nodes); err != nil {
		return driver.Host{}, err
	}
	if h.NUMANodes, err = reserveMemory(nodes, o.ReservedMemoryMB); err != nil {
		return driver.Host{}, err
	}
	if h.GPUs, err = t.gpus(); err != nil {
		return driver.Host{}, err
	}

	h.VCPUs = len(h.CPUs) - len(h.ReservedCPUs)
	for _, n := range h.NUMANodes {
		h.MemoryMB += n.MemoryMB
	}
	// Compute normalizes every host a driver reports; a host that Normalize
	// would change is one whose topology and totals disagree.
	n := h
	n.CPUs = slices.Clone(h.CPUs)
	n.NUMANodes = slices.Clone(h.NUMANodes)
	n.Normalize()
	if !reflect.DeepEqual(n, h) {
		return driver.Host{}, fmt.Errorf("host: inventory of %s is not normal: %d vCPUs and %d MB, Normalize makes %d and %d",
			root, h.VCPUs, h.MemoryMB, n.VCPUs, n.MemoryMB)
	}
	return h, nil
}

// tree is a host's root directory; its methods read files by paths relative to it.
type tree string

func (t tree) path(rel string) string { return filepath.Join(string(t), rel) }

// read returns a file's content without surrounding white space.
func (t tree) read(rel string) (string, error) {
	b, err := os.ReadFile(t.path(rel))
	if err != nil {
		return "", fmt.Errorf("host: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

func (t tree) int(rel string) (int, error) {
	s, err := t.read(rel)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("host: %s: %q is not a number", t.path(rel), s)
	}
	return n, nil
}

func (t tree) cpuList(rel string) ([]int, error) {
	s, err := t.read(rel)
	if err != nil {
		return nil, err
	}
	ids, err := parseCPUList(s)
	if err != nil {
		return nil, fmt.Errorf("host: %s: %w", t.path(rel), err)
	}
	return ids, nil
}

// linkBase returns the last element of a symlink's target (the group number of
// iommu_group, the driver's name of driver), or "" when there is no link.
func (t tree) linkBase(rel string) (string, error) {
	target, err := os.Readlink(t.path(rel))
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("host: %w", err)
	}
	return filepath.Base(target), nil
}

const cpuDir = "sys/devices/system/cpu"

// cpus reads the topology of every online CPU, in id order. NUMA nodes are
// filled in by nodes.
func (t tree) cpus() ([]driver.CPU, error) {
	online, err := t.cpuList(cpuDir + "/online")
	if err != nil {
		return nil, err
	}
	if len(online) == 0 {
		return nil, fmt.Errorf("host: %s lists no CPU", t.path(cpuDir+"/online"))
	}
	cpus := make([]driver.CPU, 0, len(online))
	for _, id := range online {
		dir := fmt.Sprintf("%s/cpu%d/topology/", cpuDir, id)
		c := driver.CPU{ID: id}
		if c.Core, err = t.int(dir + "core_id"); err != nil {
			return nil, err
		}
		if c.Socket, err = t.int(dir + "physical_package_id"); err != nil {
			return nil, err
		}
		// Some platforms (and VMs) do not know their package and say -1.
		c.Socket = max(c.Socket, 0)
		sib, err := t.cpuList(dir + "thread_siblings_list")
		if err != nil {
			return nil, err
		}
		// The kernel lists only online siblings and the CPU itself; make sure
		// of both, as the scheduler pins by these ids.
		sib = slices.DeleteFunc(sib, func(s int) bool { _, ok := slices.BinarySearch(online, s); return !ok })
		if _, ok := slices.BinarySearch(sib, id); !ok {
			sib = append(sib, id)
			slices.Sort(sib)
		}
		c.Siblings = sib
		cpus = append(cpus, c)
	}
	return cpus, nil
}

// node is one NUMA node as the kernel shows it.
type node struct {
	id    int
	cpus  []int // online CPUs, ascending
	memMB int   // MemTotal
}

const nodeDir = "sys/devices/system/node"

// nodes reads the online NUMA nodes and sets each CPU's node. A kernel that
// shows no nodes (no NUMA support, or a tree recorded from one) makes one
// node 0 holding every CPU and /proc/meminfo's MemTotal.
func (t tree) nodes(cpus []driver.CPU) ([]node, error) {
	ids, err := t.cpuList(nodeDir + "/online")
	if errors.Is(err, fs.ErrNotExist) {
		kb, err := t.memTotalKB("proc/meminfo")
		if err != nil {
			return nil, err
		}
		n := node{id: 0, memMB: int(kb / 1024)}
		for i := range cpus {
			cpus[i].NUMA = 0
			n.cpus = append(n.cpus, cpus[i].ID)
		}
		return []node{n}, nil
	}
	if err != nil {
		return nil, err
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("host: %s lists no node", t.path(nodeDir+"/online"))
	}
	byCPU := map[int]int{}
	var nodes []node
	for _, id := range ids {
		dir := fmt.Sprintf("%s/node%d/", nodeDir, id)
		list, err := t.cpuList(dir + "cpulist")
		if err != nil {
			return nil, err
		}
		kb, err := t.memTotalKB(dir + "meminfo")
		if err != nil {
			return nil, err
		}
		n := node{id: id, memMB: int(kb / 1024)}
		for _, c := range list {
			if _, seen := byCPU[c]; !seen {
				byCPU[c] = id
			}
		}
		nodes = append(nodes, n)
	}
	for i := range cpus {
		// A CPU no node claims would be a kernel oddity; node 0 is where
		// Linux puts what it cannot place.
		cpus[i].NUMA = byCPU[cpus[i].ID]
		for j := range nodes {
			if nodes[j].id == cpus[i].NUMA {
				nodes[j].cpus = append(nodes[j].cpus, cpus[i].ID)
			}
		}
	}
	return nodes, nil
}

// MemoryTotals answers, under root, the memory the online NUMA nodes'
// meminfo shows (what Discover offers, before the reserve) and the
// machine's (/proc/meminfo), in MB: a host whose nodes show less offers
// less than it has.
func MemoryTotals(root string) (nodesMB, machineMB int, err error) {
	t := tree(root)
	kb, err := t.memTotalKB("proc/meminfo")
	if err != nil {
		return 0, 0, err
	}
	cpus, err := t.cpus()
	if err != nil {
		return 0, 0, err
	}
	nodes, err := t.nodes(cpus)
	if err != nil {
		return 0, 0, err
	}
	for _, n := range nodes {
		nodesMB += n.memMB
	}
	return nodesMB, int(kb / 1024), nil
}

// memTotalKB finds the MemTotal line of a meminfo file: "MemTotal:  123 kB" in
// /proc/meminfo, "Node 0 MemTotal:  123 kB" in a node's.
func (t tree) memTotalKB(rel string) (int64, error) {
	s, err := t.read(rel)
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(s) {
		f := strings.Fields(line)
		i := slices.Index(f, "MemTotal:")
		if i < 0 {
			continue
		}
		if i+2 != len(f)-1 || f[len(f)-1] != "kB" {
			break
		}
		kb, err := strconv.ParseInt(f[i+1], 10, 64)
		if err != nil || kb < 0 {
			break
		}
		return kb, nil
	}
	return 0, fmt.Errorf("host: %s: no MemTotal line in kB", t.path(rel))
}

// reservedCPUs applies Options.ReservedCPUs' rules; see there.
func (t tree) reservedCPUs(explicit []int, cpus []driver.CPU, nodes []node) ([]int, error) {
	online := make([]int, len(cpus))
	for i, c := range cpus {
		online[i] = c.ID
	}
	if explicit != nil {
		r := slices.Clone(explicit)
		slices.Sort(r)
		r = slices.Compact(r)
		for _, id := range r {
			if _, ok := slices.BinarySearch(online, id); !ok {
				return nil, fmt.Errorf("host: reserved CPU %d is not an online CPU of this host", id)
			}
		}
		return r, nil
	}

	// Kernels before 4.x have no isolated file: nothing is isolated.
	isolated, err := t.cpuList(cpuDir + "/isolated")
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	// Only isolated CPUs that are online count: isolcpus may name CPUs the
	// host does not have (one command line for a fleet of sizes).
	var r []int
	anyIsolated := false
	for _, id := range online {
		if _, ok := slices.BinarySearch(isolated, id); ok {
			anyIsolated = true
		} else {
			r = append(r, id)
		}
	}
	if anyIsolated {
		return r, nil
	}

	r = nil
	for _, n := range nodes {
		if len(n.cpus) == 0 {
			continue // a memory-only node (CXL, HBM) has no core to give
		}
		first := n.cpus[0]
		for _, c := range cpus {
			if c.ID == first {
				r = append(r, c.Siblings...)
			}
		}
	}
	slices.Sort(r)
	return slices.Compact(r), nil
}

// reserveMemory takes reservedMB (0: the default, < 0: none) from the nodes in
// proportion to their memory. Shares are differences of rounded-down running
// totals, so they add up to exactly reservedMB.
func reserveMemory(nodes []node, reservedMB int) ([]driver.NUMANode, error) {
	switch {
	case reservedMB == 0:
		reservedMB = DefaultReservedMemoryMB
	case reservedMB < 0:
		reservedMB = 0
	}
	var total int64
	for _, n := range nodes {
		total += int64(n.memMB)
	}
	if int64(reservedMB) > total {
		return nil, fmt.Errorf("host: reserving %d MB of memory for the host leaves nothing: it has %d MB", reservedMB, total)
	}
	out := make([]driver.NUMANode, len(nodes))
	var cum, taken int64
	for i, n := range nodes {
		cum += int64(n.memMB)
		share := 0
		if total > 0 {
			share = int(int64(reservedMB)*cum/total - taken)
		}
		taken += int64(share)
		out[i] = driver.NUMANode{ID: n.id, MemoryMB: n.memMB - share}
	}
	return out, nil
}
