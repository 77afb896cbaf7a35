package scheduler

import (
	"cmp"
	"math"
	"slices"

	"nimbus/internal/driver"
)

// host is one host's inventory in compact form, with what its claims hold.
// CPUs are addressed by position (their rank by id); positions, cores and
// NUMA nodes are small integers so that a fleet of thousands of hosts costs
// a few MB. The free counters it shares with its summary are kept in step
// by take and give; count recomputes them from the owners for SetHost and
// Check.
type host struct {
	name string

	cpuID    []int32  // CPU id by position, ascending
	cpuNode  []uint16 // node position by CPU position
	cpuCore  []uint16 // core by CPU position
	reserved []uint64 // bitset of reserved positions
	owner    []int32  // slot+1 of the claim that holds a position, 0 when free

	// Cores are ordered by their lowest CPU id; coreCPUs lists each core's
	// positions, ascending, from coreStart[c] to coreStart[c+1].
	coreStart []uint16
	coreCPUs  []uint16
	coreFree  []uint16 // free, unreserved threads per core

	nodeID    []int      // NUMA node id by node position, ascending
	nodeMemMB []int      // capacity by node
	nodeCPUs  []int      // unreserved CPUs by node
	free      []nodeFree // free counters by node, shared with the summary

	vcpus, memMB, diskGB int // capacity

	gpus   []gpu       // by PCI address
	models []modelFree // free GPUs per model

	claims []held  // by slot
	spare  []int32 // unused slots
}

// nodeFree is what one NUMA node still has for servers.
type nodeFree struct{ cpus, memMB int }

// gpu is one passthrough device.
type gpu struct {
	addr  string
	model int32 // interned by the State
	node  int32 // node position, -1 when its NUMA node is not one of the host's
	owner int32 // slot+1, 0 when free
}

// modelFree counts one GPU model's devices on a host.
type modelFree struct {
	model       int32
	total, free int
}

// held is what the state remembers of one claim besides the CPUs and GPUs
// marked with its slot: memory per node and disk.
type held struct {
	live  bool
	ncpu  int32 // CPUs and GPUs marked with this slot
	ngpu  int32
	disk  int
	cells []cellMem
}

// cellMem is the memory a claim holds on one node (a node position).
type cellMem struct{ node, memMB int32 }

// maxThreads bounds a host's CPUs and NUMA nodes so that positions fit in
// 16 bits; CPUs with higher ids, and nodes beyond it, are ignored. The
// largest hosts sold have a few thousand threads.
const maxThreads = math.MaxUint16

// newHost builds the compact form of d, which it normalises on a copy;
// model interns GPU model names.
func newHost(d driver.Host, model func(string) int32) *host {
	d.CPUs = slices.Clone(d.CPUs)
	d.NUMANodes = slices.Clone(d.NUMANodes)
	d.Normalize()
	h := &host{name: d.Name, diskGB: clampInt(d.DiskGB)}

	cpus := slices.DeleteFunc(d.CPUs, func(c driver.CPU) bool { return c.ID < 0 || c.ID > math.MaxInt32 })
	slices.SortStableFunc(cpus, func(a, b driver.CPU) int { return cmp.Compare(a.ID, b.ID) })
	cpus = slices.CompactFunc(cpus, func(a, b driver.CPU) bool { return a.ID == b.ID })
	cpus = cpus[:min(len(cpus), maxThreads)]
	n := len(cpus)

	// NUMA nodes: those of the CPUs and those with memory, by id.
	ids := make([]int, 0, n+len(d.NUMANodes))
	for _, c := range cpus {
		ids = append(ids, c.NUMA)
	}
	slices.Sort(ids)
	ids = slices.Compact(ids)
	for _, nd := range d.NUMANodes {
		if len(ids) < maxThreads && !slices.Contains(ids, nd.ID) {
			ids = append(ids, nd.ID)
		}
	}
	slices.Sort(ids)
	if len(ids) == 0 {
		ids = append(ids, 0)
	}
	h.nodeID = slices.Clone(ids) // exact size: the fleet holds thousands
	nn := len(h.nodeID)
	h.nodeMemMB = make([]int, nn)
	h.nodeCPUs = make([]int, nn)
	h.free = make([]nodeFree, nn)
	seen := make([]bool, nn)
	for _, nd := range d.NUMANodes {
		if p := h.nodePos(nd.ID); p >= 0 && !seen[p] {
			seen[p] = true
			h.nodeMemMB[p] = clampInt(nd.MemoryMB)
		}
	}

	h.cpuID = make([]int32, n)
	h.cpuNode = make([]uint16, n)
	h.cpuCore = make([]uint16, n)
	h.owner = make([]int32, n)
	h.reserved = make([]uint64, (n+63)/64)
	for p, c := range cpus {
		h.cpuID[p] = int32(c.ID)
		h.cpuNode[p] = uint16(h.nodePos(c.NUMA))
	}
	for _, id := range d.ReservedCPUs {
		if p, ok := h.pos(id); ok {
			h.reserved[p/64] |= 1 << (p % 64)
		}
	}

	// Cores: the sibling sets, joined; a CPU without siblings is a core of
	// its own (guessing from Core and Socket ids could merge a whole host
	// whose fleet file left them zero).
	parent := make([]int32, n)
	for p := range parent {
		parent[p] = int32(p)
	}
	root := func(p int32) int32 {
		for parent[p] != p {
			parent[p] = parent[parent[p]]
			p = parent[p]
		}
		return p
	}
	for p, c := range cpus {
		for _, sib := range c.Siblings {
			if q, ok := h.pos(sib); ok {
				a, b := root(int32(p)), root(int32(q))
				parent[max(a, b)] = min(a, b)
			}
		}
	}
	// A root is its set's lowest position, so numbering cores at their
	// roots in position order orders them by lowest CPU id.
	cores := 0
	for p := range cpus {
		if r := root(int32(p)); r == int32(p) {
			h.cpuCore[p] = uint16(cores)
			cores++
		} else {
			h.cpuCore[p] = h.cpuCore[r]
		}
	}
	h.coreStart = make([]uint16, cores+1)
	for _, c := range h.cpuCore {
		h.coreStart[c+1]++
	}
	for c := range cores {
		h.coreStart[c+1] += h.coreStart[c]
	}
	h.coreCPUs = make([]uint16, n)
	fill := slices.Clone(h.coreStart[:cores])
	for p, c := range h.cpuCore {
		h.coreCPUs[fill[c]] = uint16(p)
		fill[c]++
	}
	h.coreFree = make([]uint16, cores)

	for p := range n {
		if !h.isReserved(p) {
			h.nodeCPUs[h.cpuNode[p]]++
			h.vcpus++
		}
	}
	for _, m := range h.nodeMemMB {
		h.memMB += m
	}

	gs := slices.Clone(d.GPUs)
	slices.SortStableFunc(gs, func(a, b driver.GPU) int { return cmp.Compare(a.Address, b.Address) })
	gs = slices.CompactFunc(gs, func(a, b driver.GPU) bool { return a.Address == b.Address })
	for _, g := range gs {
		m := model(g.Model)
		h.gpus = append(h.gpus, gpu{addr: g.Address, model: m, node: int32(h.nodePos(g.NUMA))})
		k := slices.IndexFunc(h.models, func(mf modelFree) bool { return mf.model == m })
		if k < 0 {
			h.models = append(h.models, modelFree{model: m})
			k = len(h.models) - 1
		}
		h.models[k].total++
	}
	h.recount()
	return h
}

func clampInt(v int) int { return min(max(v, 0), math.MaxInt32) }

// pos returns the position of CPU id.
func (h *host) pos(id int) (int, bool) {
	if id < 0 || id > math.MaxInt32 {
		return 0, false
	}
	return slices.BinarySearch(h.cpuID, int32(id))
}

// nodePos returns the position of NUMA node id, or -1.
func (h *host) nodePos(id int) int {
	if p, ok := slices.BinarySearch(h.nodeID, id); ok {
		return p
	}
	return -1
}

func (h *host) isReserved(p int) bool { return h.reserved[p/64]&(1<<(p%64)) != 0 }

// gpuIndex returns the index of the GPU at addr, or -1.
func (h *host) gpuIndex(addr string) int {
	if i, ok := slices.BinarySearchFunc(h.gpus, addr, func(g gpu, a string) int { return cmp.Compare(g.addr, a) }); ok {
		return i
	}
	return -1
}

// freeGPUs returns how many GPUs of model are free.
func (h *host) freeGPUs(model int32) int {
	for _, m := range h.models {
		if m.model == model {
			return m.free
		}
	}
	return 0
}

// nodeGPUs returns how many free GPUs of model sit on node.
func (h *host) nodeGPUs(node int, model int32) int {
	n := 0
	for _, g := range h.gpus {
		if g.owner == 0 && g.model == model && int(g.node) == node {
			n++
		}
	}
	return n
}

// newSlot returns an unused claim slot.
func (h *host) newSlot() int {
	if k := len(h.spare); k > 0 {
		s := h.spare[k-1]
		h.spare = h.spare[:k-1]
		return int(s)
	}
	h.claims = append(h.claims, held{})
	return len(h.claims) - 1
}

// counts is what a host's counters must be, recomputed from the owners and
// the held claims.
type counts struct {
	nodeCPUs []int // free unreserved CPUs by node
	nodeMem  []int // memory held by node
	coreFree []uint16
	gpuFree  []int // by models index
	diskUsed int
	ncpu     []int32 // by slot
	ngpu     []int32
}

func (h *host) count() counts {
	c := counts{
		nodeCPUs: slices.Clone(h.nodeCPUs),
		nodeMem:  make([]int, len(h.nodeID)),
		coreFree: make([]uint16, len(h.coreFree)),
		gpuFree:  make([]int, len(h.models)),
		ncpu:     make([]int32, len(h.claims)),
		ngpu:     make([]int32, len(h.claims)),
	}
	for p, o := range h.owner {
		if o > 0 && int(o) <= len(h.claims) {
			c.ncpu[o-1]++
		}
		if h.isReserved(p) {
			continue
		}
		if o != 0 {
			c.nodeCPUs[h.cpuNode[p]]--
		} else {
			c.coreFree[h.cpuCore[p]]++
		}
	}
	for _, g := range h.gpus {
		if g.owner > 0 && int(g.owner) <= len(h.claims) {
			c.ngpu[g.owner-1]++
		}
		if g.owner == 0 {
			k := slices.IndexFunc(h.models, func(m modelFree) bool { return m.model == g.model })
			c.gpuFree[k]++
		}
	}
	for _, cl := range h.claims {
		if !cl.live {
			continue
		}
		c.diskUsed += cl.disk
		for _, cm := range cl.cells {
			c.nodeMem[cm.node] += int(cm.memMB)
		}
	}
	return c
}

// recount sets the counters from the owners and the held claims.
func (h *host) recount() {
	c := h.count()
	for n := range h.free {
		h.free[n] = nodeFree{cpus: c.nodeCPUs[n], memMB: h.nodeMemMB[n] - c.nodeMem[n]}
	}
	copy(h.coreFree, c.coreFree)
	for k := range h.models {
		h.models[k].free = c.gpuFree[k]
	}
	for s := range h.claims {
		h.claims[s].ncpu, h.claims[s].ngpu = c.ncpu[s], c.ngpu[s]
	}
}

// adopt carries the claims of old, the same host's previous inventory, over
// to h: CPUs, GPUs and nodes that h still has stay held by the same slots,
// those it no longer has are dropped, and counters are recomputed. A claim
// is kept even where h no longer has room for it (a host that shrank under
// its servers): the host is then full until enough is released, and Check
// reports it.
func (h *host) adopt(old *host) {
	h.claims, h.spare = old.claims, old.spare
	for p, o := range old.owner {
		if o == 0 {
			continue
		}
		if q, ok := h.pos(int(old.cpuID[p])); ok {
			h.owner[q] = o
		}
	}
	for _, g := range old.gpus {
		if g.owner == 0 {
			continue
		}
		if i := h.gpuIndex(g.addr); i >= 0 {
			h.gpus[i].owner = g.owner
		}
	}
	for s := range h.claims {
		cl := &h.claims[s]
		cells := cl.cells[:0]
		for _, cm := range cl.cells {
			if p := h.nodePos(old.nodeID[cm.node]); p >= 0 {
				cells = append(cells, cellMem{node: int32(p), memMB: cm.memMB})
			}
		}
		cl.cells = cells
	}
	h.recount()
}
