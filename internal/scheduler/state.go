package scheduler

import (
	"fmt"
	"sync"

	"nimbus/internal/driver"
)

// State is the scheduler's view of the fleet and what is taken. Safe for
// concurrent use: one mutex serialises every call, so a reservation's
// choice and its taking are one step.
type State struct {
	mu     sync.Mutex
	policy Policy
	pack   bool

	// hosts, sums and marks are parallel; sums is what the filter scans,
	// contiguous so that a pass over thousands of hosts stays in cache.
	hosts  []*host
	sums   []summary
	marks  []mark
	byName map[string]int
	zones  map[string]int32 // interned availability zones
	zoneOf []string         // the names of zones, by number
	models map[string]int32 // interned GPU models

	// Scratch reused under mu, so that Reserve allocates only its claim.
	only  []int
	cells []cellPlan
	order []int
	posns []int
}

// summary is a host's counters for the filter and the weighers.
type summary struct {
	freeCPUs, freeMemMB, freeDiskGB int
	invCPUs, invMemMB               float64 // 1/capacity, 0 when none
	zone                            int32
	sched, gpu                      bool
	nodes                           []nodeFree // the host's free, shared
}

// mark is what a request says of one host; all zero between requests.
type mark struct {
	only, avoid  bool
	prefer, shun int
}

// New returns an empty state that chooses by p. An empty Weigher is
// Spread, and any other than Pack weighs as Spread too; ParsePolicy checks
// an operator's choice.
func New(p Policy) *State {
	if p.Weigher == "" {
		p.Weigher = Spread
	}
	return &State{
		policy: p,
		pack:   p.Weigher == Pack,
		byName: map[string]int{},
		zones:  map[string]int32{},
		models: map[string]int32{},
	}
}

// Policy returns the policy the state chooses by.
func (s *State) Policy() Policy { return s.policy }

// SetHost adds a host or replaces its inventory (on re-registration),
// keeping the claims already applied there. zone is the host's effective
// availability zone (aggregates may override h.Zone); schedulable false
// keeps the host and its claims but never picks it (disabled service, host
// down). h is normalised on a copy.
//
// Claims keep what the new inventory still has; where it no longer has room
// for them (fewer CPUs, less memory) they stay held and the host takes
// nothing more until enough is released.
func (s *State) SetHost(h driver.Host, zone string, schedulable bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	nh := newHost(h, s.modelID)
	z, ok := s.zones[zone]
	if !ok {
		z = int32(len(s.zones))
		s.zones[zone] = z
		s.zoneOf = append(s.zoneOf, zone)
	}
	i, ok := s.byName[nh.name]
	if ok {
		nh.adopt(s.hosts[i])
		s.hosts[i] = nh
	} else {
		i = len(s.hosts)
		s.byName[nh.name] = i
		s.hosts = append(s.hosts, nh)
		s.sums = append(s.sums, summary{})
		s.marks = append(s.marks, mark{})
	}
	s.sums[i] = nh.summary(z, schedulable)
}

// modelID interns a GPU model name; called with mu held.
func (s *State) modelID(model string) int32 {
	m, ok := s.models[model]
	if !ok {
		m = int32(len(s.models))
		s.models[model] = m
	}
	return m
}

// summary builds the host's summary from its counters.
func (h *host) summary(zone int32, schedulable bool) summary {
	sm := summary{zone: zone, sched: schedulable, gpu: len(h.gpus) > 0, nodes: h.free, freeDiskGB: h.diskGB}
	for _, n := range h.free {
		sm.freeCPUs += n.cpus
		sm.freeMemMB += n.memMB
	}
	for _, cl := range h.claims {
		if cl.live {
			sm.freeDiskGB -= cl.disk
		}
	}
	if h.vcpus > 0 {
		sm.invCPUs = 1 / float64(h.vcpus)
	}
	if h.memMB > 0 {
		sm.invMemMB = 1 / float64(h.memMB)
	}
	return sm
}

// SetSchedulable says whether the host may be chosen; an unknown host is
// ignored.
func (s *State) SetSchedulable(name string, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if i, found := s.byName[name]; found {
		s.sums[i].sched = ok
	}
}

// RemoveHost forgets a host and its claims; an unknown host is ignored.
func (s *State) RemoveHost(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i, ok := s.byName[name]
	if !ok {
		return
	}
	last := len(s.hosts) - 1
	if i != last {
		s.hosts[i], s.sums[i], s.marks[i] = s.hosts[last], s.sums[last], s.marks[last]
		s.byName[s.hosts[i].name] = i
	}
	s.hosts[last], s.sums[last] = nil, summary{}
	s.hosts, s.sums, s.marks = s.hosts[:last], s.sums[:last], s.marks[:last]
	delete(s.byName, name)
}

// HasHost reports whether the state has the host.
func (s *State) HasHost(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.byName[name]
	return ok
}

// Zone returns the availability zone the host was last set with; false
// for an unknown host. Placement records it on the servers it places
// without asking the store again.
func (s *State) Zone(name string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i, ok := s.byName[name]
	if !ok {
		return "", false
	}
	return s.zoneOf[s.sums[i].zone], true
}

// HostUsage is one host's capacity and what is used of it: vCPUs that
// servers may use, memory and local disk, and GPUs.
type HostUsage struct {
	VCPUs, VCPUsUsed       int
	MemoryMB, MemoryUsedMB int
	DiskGB, DiskUsedGB     int
	GPUs, GPUsUsed         int
}

// Usage reports, for one host, its used vCPUs, memory and disk and its
// GPUs, for views; false for an unknown host.
func (s *State) Usage(name string) (HostUsage, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i, ok := s.byName[name]
	if !ok {
		return HostUsage{}, false
	}
	h, sm := s.hosts[i], &s.sums[i]
	u := HostUsage{
		VCPUs: h.vcpus, VCPUsUsed: h.vcpus - sm.freeCPUs,
		MemoryMB: h.memMB, MemoryUsedMB: h.memMB - sm.freeMemMB,
		DiskGB: h.diskGB, DiskUsedGB: h.diskGB - sm.freeDiskGB,
		GPUs: len(h.gpus),
	}
	for _, m := range h.models {
		u.GPUsUsed += m.total - m.free
	}
	return u, true
}

// Check verifies the internal invariants and returns the first violation:
// no reserved CPU held, every CPU and GPU held by a live claim, per-node
// memory and disk within capacity, and every counter equal to what the
// claims hold. It is for tests.
func (s *State) Check() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.hosts) != len(s.sums) || len(s.hosts) != len(s.marks) || len(s.hosts) != len(s.byName) {
		return fmt.Errorf("%d hosts, %d summaries, %d marks, %d names", len(s.hosts), len(s.sums), len(s.marks), len(s.byName))
	}
	for i, h := range s.hosts {
		if err := s.checkHost(i, h); err != nil {
			return fmt.Errorf("host %s: %w", h.name, err)
		}
	}
	return nil
}

func (s *State) checkHost(i int, h *host) error {
	if j, ok := s.byName[h.name]; !ok || j != i {
		return fmt.Errorf("indexed at %d, found at %d", j, i)
	}
	if s.marks[i] != (mark{}) {
		return fmt.Errorf("mark left over: %+v", s.marks[i])
	}
	sm := &s.sums[i]
	for p, o := range h.owner {
		if o < 0 || int(o) > len(h.claims) || (o > 0 && !h.claims[o-1].live) {
			return fmt.Errorf("CPU %d held by slot %d, which is not a claim", h.cpuID[p], o-1)
		}
		if o > 0 && h.isReserved(p) {
			return fmt.Errorf("reserved CPU %d is held", h.cpuID[p])
		}
	}
	for _, g := range h.gpus {
		if g.owner < 0 || int(g.owner) > len(h.claims) || (g.owner > 0 && !h.claims[g.owner-1].live) {
			return fmt.Errorf("GPU %s held by slot %d, which is not a claim", g.addr, g.owner-1)
		}
	}
	spare := map[int32]bool{}
	for _, sl := range h.spare {
		if int(sl) >= len(h.claims) || h.claims[sl].live || spare[sl] {
			return fmt.Errorf("spare slot %d is in use or listed twice", sl)
		}
		spare[sl] = true
	}
	for sl, cl := range h.claims {
		if !cl.live && !spare[int32(sl)] {
			return fmt.Errorf("slot %d is neither used nor spare", sl)
		}
	}
	c := h.count()
	freeCPUs, freeMem := 0, 0
	for n := range h.nodeID {
		if c.nodeMem[n] > h.nodeMemMB[n] {
			return fmt.Errorf("NUMA node %d: %d MB held of %d", h.nodeID[n], c.nodeMem[n], h.nodeMemMB[n])
		}
		want := nodeFree{cpus: c.nodeCPUs[n], memMB: h.nodeMemMB[n] - c.nodeMem[n]}
		if h.free[n] != want {
			return fmt.Errorf("NUMA node %d: counters %+v, claims leave %+v", h.nodeID[n], h.free[n], want)
		}
		freeCPUs += want.cpus
		freeMem += want.memMB
	}
	if &sm.nodes[0] != &h.free[0] {
		return fmt.Errorf("summary does not share the node counters")
	}
	if c.diskUsed > h.diskGB {
		return fmt.Errorf("disk: %d GB held of %d", c.diskUsed, h.diskGB)
	}
	if sm.freeCPUs != freeCPUs || sm.freeMemMB != freeMem || sm.freeDiskGB != h.diskGB-c.diskUsed {
		return fmt.Errorf("host counters %d CPUs, %d MB, %d GB free; claims leave %d, %d, %d",
			sm.freeCPUs, sm.freeMemMB, sm.freeDiskGB, freeCPUs, freeMem, h.diskGB-c.diskUsed)
	}
	for k, f := range c.coreFree {
		if h.coreFree[k] != f {
			return fmt.Errorf("core of CPU %d: %d threads counted free, %d are", h.cpuID[h.coreCPUs[h.coreStart[k]]], h.coreFree[k], f)
		}
	}
	for k, m := range h.models {
		if m.free != c.gpuFree[k] {
			return fmt.Errorf("GPU model %d: %d counted free, %d are", m.model, m.free, c.gpuFree[k])
		}
	}
	for sl, cl := range h.claims {
		if cl.ncpu != c.ncpu[sl] || cl.ngpu != c.ngpu[sl] {
			return fmt.Errorf("claim %d counts %d CPUs and %d GPUs, holds %d and %d", sl, cl.ncpu, cl.ngpu, c.ncpu[sl], c.ngpu[sl])
		}
	}
	return nil
}
