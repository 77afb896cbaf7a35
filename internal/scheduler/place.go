package scheduler

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
)

// cellPlan is one cell of a claim before its CPUs are picked: a node
// position, how many vCPUs and how much memory.
type cellPlan struct{ node, cpus, memMB int }

// place takes q on host i, which fits it, and returns the claim.
func (s *State) place(i int, q *query) Claim {
	h, sm := s.hosts[i], &s.sums[i]
	plan := s.layout(h, q)
	slot := h.newSlot()
	o := int32(slot + 1)
	cl := &h.claims[slot]
	*cl = held{live: true, ncpu: int32(q.vcpus), disk: q.diskGB, cells: make([]cellMem, len(plan))}
	c := Claim{Host: h.name, Cells: make([]Cell, len(plan)), DiskGB: q.diskGB}
	ids := make([]int, 0, q.vcpus) // one array for every cell's CPUs
	for k, cp := range plan {
		from := len(ids)
		ids = s.takeCPUs(h, sm, o, cp.node, cp.cpus, ids)
		slices.Sort(ids[from:])
		c.Cells[k] = Cell{Node: h.nodeID[cp.node], CPUs: ids[from:len(ids):len(ids)], MemoryMB: cp.memMB}
		cl.cells[k] = cellMem{node: int32(cp.node), memMB: int32(cp.memMB)}
		h.free[cp.node].memMB -= cp.memMB
		sm.freeMemMB -= cp.memMB
	}
	sm.freeDiskGB -= q.diskGB
	if q.gpus > 0 {
		c.GPUs = h.takeGPUs(o, q.model, q.gpus, plan[0].node)
		cl.ngpu = int32(q.gpus)
	}
	return c
}

// layout splits q over the nodes of h, which fits it, as q.numa asks. The
// result is scratch, valid until the next call.
func (s *State) layout(h *host, q *query) []cellPlan {
	cells := s.cells[:0]
	if q.numa <= 1 {
		best := -1
		for n, f := range h.free {
			if f.cpus >= q.vcpus && f.memMB >= q.memMB && (best < 0 || s.nodeBetter(h, q, n, best)) {
				best = n
			}
		}
		if best >= 0 {
			cells = append(cells, cellPlan{node: best, cpus: q.vcpus, memMB: q.memMB})
		} else {
			cells = s.spreadLayout(h, q, cells)
		}
	} else {
		cells = s.evenLayout(h, q, cells)
	}
	s.cells = cells
	return cells
}

// nodeBetter reports whether node a of h suits q better than node b: for a
// GPU request the node with more of its GPUs (so that the GPUs sit on the
// server's main node), then the weigher's choice among nodes, then the
// lower id.
func (s *State) nodeBetter(h *host, q *query, a, b int) bool {
	if q.gpus > 0 {
		ga, gb := min(h.nodeGPUs(a, q.model), q.gpus), min(h.nodeGPUs(b, q.model), q.gpus)
		if ga != gb {
			return ga > gb
		}
	}
	fa, fb := h.free[a], h.free[b]
	if fa.cpus != fb.cpus {
		return (fa.cpus > fb.cpus) != s.pack
	}
	if fa.memMB != fb.memMB {
		return (fa.memMB > fb.memMB) != s.pack
	}
	return a < b
}

// evenLayout gives each of q.numa cells its even share on a distinct node,
// most demanding cell first (see even for why the greedy choice is safe).
func (s *State) evenLayout(h *host, q *query, cells []cellPlan) []cellPlan {
	e := evenSplit(q)
	for k := range q.numa {
		c, m := e.c, e.m
		if k < e.rc {
			c++
		}
		if k < e.rm {
			m++
		}
		best := -1
		for n, f := range h.free {
			if f.cpus >= c && f.memMB >= m && !slices.ContainsFunc(cells, func(cp cellPlan) bool { return cp.node == n }) &&
				(best < 0 || s.nodeBetter(h, q, n, best)) {
				best = n
			}
		}
		if best < 0 {
			panic("scheduler: NUMA counters out of step with the filter")
		}
		cells = append(cells, cellPlan{node: best, cpus: c, memMB: m})
	}
	return cells
}

// spreadLayout spreads q, which no single node fits, over as few nodes as
// can hold it, taking the nodes with most room first. vCPUs are split as
// evenly as the nodes' room allows (every cell gets at least one) and
// memory in proportion to them.
func (s *State) spreadLayout(h *host, q *query, cells []cellPlan) []cellPlan {
	v, m := q.vcpus, q.memMB
	room := func(n int) int { return spreadCap(h.free[n], v, m) }
	order := s.order[:0]
	for n := range h.free {
		if room(n) > 0 {
			order = append(order, n)
		}
	}
	slices.SortFunc(order, func(a, b int) int {
		if c := cmp.Compare(room(b), room(a)); c != 0 {
			return c
		}
		return s.nodeOrder(h, q, a, b)
	})
	k, sum := 0, 0
	for k < len(order) && sum < v {
		sum += room(order[k])
		k++
	}
	if sum < v {
		panic("scheduler: NUMA counters out of step with the filter")
	}
	s.order = order
	// Water-filling, least room first: each node takes its share of what
	// is left or all its room, so the larger nodes even out the rest. With
	// the fewest nodes, what is left never falls below one per node.
	chosen := slices.Clone(order[:k])
	slices.SortFunc(chosen, func(a, b int) int { return cmp.Or(cmp.Compare(room(a), room(b)), cmp.Compare(a, b)) })
	left := v
	for j, n := range chosen {
		c := min(room(n), left/(k-j))
		cells = append(cells, cellPlan{node: n, cpus: c})
		left -= c
	}
	// Memory in proportion, rounded down; the few MB left go to cells
	// whose share was rounded, which room leaves space for.
	used := 0
	for j := range cells {
		cells[j].memMB = m * cells[j].cpus / v
		used += cells[j].memMB
	}
	for j := range cells {
		if used < m && m*cells[j].cpus%v != 0 {
			cells[j].memMB++
			used++
		}
	}
	slices.SortFunc(cells, func(a, b cellPlan) int {
		return cmp.Or(cmp.Compare(b.cpus, a.cpus), s.nodeOrder(h, q, a.node, b.node))
	})
	return cells
}

// nodeOrder is nodeBetter as a comparison.
func (s *State) nodeOrder(h *host, q *query, a, b int) int {
	switch {
	case a == b:
		return 0
	case s.nodeBetter(h, q, a, b):
		return -1
	}
	return 1
}

// takeCPUs takes n free CPUs of node for owner o and appends their ids to
// out: CPUs of wholly free cores first, a core's threads together, cores by
// lowest id, so that a server's threads share cores with each other and not
// with another tenant; then the free threads of partly used cores.
func (s *State) takeCPUs(h *host, sm *summary, o int32, node, n int, out []int) []int {
	for c := range h.coreFree {
		if n == 0 {
			break
		}
		lo, hi := h.coreStart[c], h.coreStart[c+1]
		if h.coreFree[c] != hi-lo {
			continue
		}
		for _, p := range h.coreCPUs[lo:hi] {
			if n > 0 && int(h.cpuNode[p]) == node {
				h.take(sm, int(p), o)
				out = append(out, int(h.cpuID[p]))
				n--
			}
		}
	}
	for p := range h.owner {
		if n == 0 {
			break
		}
		if h.owner[p] == 0 && int(h.cpuNode[p]) == node && !h.isReserved(p) {
			h.take(sm, p, o)
			out = append(out, int(h.cpuID[p]))
			n--
		}
	}
	if n > 0 {
		panic("scheduler: CPU counters out of step with the owners")
	}
	return out
}

// take marks CPU position p held by o and counts it.
func (h *host) take(sm *summary, p int, o int32) {
	h.owner[p] = o
	if !h.isReserved(p) {
		h.coreFree[h.cpuCore[p]]--
		h.free[h.cpuNode[p]].cpus--
		sm.freeCPUs--
	}
}

// give frees CPU position p and counts it.
func (h *host) give(sm *summary, p int) {
	h.owner[p] = 0
	if !h.isReserved(p) {
		h.coreFree[h.cpuCore[p]]++
		h.free[h.cpuNode[p]].cpus++
		sm.freeCPUs++
	}
}

// takeGPUs takes n free GPUs of model for owner o, those on node first,
// and returns their addresses.
func (h *host) takeGPUs(o int32, model int32, n, node int) []string {
	out := make([]string, 0, n)
	for _, near := range [2]bool{true, false} {
		for i := range h.gpus {
			g := &h.gpus[i]
			if len(out) < n && g.owner == 0 && g.model == model && (int(g.node) == node) == near {
				g.owner = o
				h.modelCount(model).free--
				out = append(out, g.addr)
			}
		}
	}
	if len(out) < n {
		panic("scheduler: GPU counters out of step with the owners")
	}
	return out
}

func (h *host) modelCount(model int32) *modelFree {
	for k := range h.models {
		if h.models[k].model == model {
			return &h.models[k]
		}
	}
	panic("scheduler: GPU model not counted")
}

// Apply records a claim made elsewhere (read from the database at start-up,
// or by another controller). It returns an error wrapping ErrConflict when a
// CPU or GPU it names is already taken, reserved or unknown, or memory or
// disk would go over, and ErrUnknownHost for a host the state does not
// have; it changes nothing then.
func (s *State) Apply(c Claim) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	i, ok := s.byName[c.Host]
	if !ok {
		return fmt.Errorf("%w: %q", ErrUnknownHost, c.Host)
	}
	h, sm := s.hosts[i], &s.sums[i]
	if err := s.admit(h, sm, &c); err != nil {
		return fmt.Errorf("%w: host %s: %v", ErrConflict, c.Host, err)
	}
	slot := h.newSlot()
	o := int32(slot + 1)
	cl := &h.claims[slot]
	*cl = held{live: true, ncpu: int32(len(s.posns)), ngpu: int32(len(c.GPUs)), disk: c.DiskGB, cells: make([]cellMem, len(c.Cells))}
	for k, cell := range c.Cells {
		n := h.nodePos(cell.Node)
		cl.cells[k] = cellMem{node: int32(n), memMB: int32(cell.MemoryMB)}
		h.free[n].memMB -= cell.MemoryMB
		sm.freeMemMB -= cell.MemoryMB
	}
	for _, p := range s.posns {
		h.take(sm, p, o)
	}
	for _, a := range c.GPUs {
		g := &h.gpus[h.gpuIndex(a)]
		g.owner = o
		h.modelCount(g.model).free--
	}
	sm.freeDiskGB -= c.DiskGB
	return nil
}

// admit checks that c fits h as it is, leaving c's CPU positions in
// s.posns.
func (s *State) admit(h *host, sm *summary, c *Claim) error {
	if c.DiskGB < 0 {
		return errors.New("negative disk")
	}
	if c.DiskGB > sm.freeDiskGB {
		return fmt.Errorf("%d GB of disk asked, %d free", c.DiskGB, sm.freeDiskGB)
	}
	s.posns = s.posns[:0]
	for k, cell := range c.Cells {
		n := h.nodePos(cell.Node)
		switch {
		case n < 0:
			return fmt.Errorf("no NUMA node %d", cell.Node)
		case slices.ContainsFunc(c.Cells[:k], func(o Cell) bool { return o.Node == cell.Node }):
			return fmt.Errorf("NUMA node %d named twice", cell.Node)
		case cell.MemoryMB < 0:
			return fmt.Errorf("negative memory on NUMA node %d", cell.Node)
		case cell.MemoryMB > h.free[n].memMB:
			return fmt.Errorf("NUMA node %d: %d MB asked, %d free", cell.Node, cell.MemoryMB, h.free[n].memMB)
		}
		for _, id := range cell.CPUs {
			p, ok := h.pos(id)
			switch {
			case !ok:
				return fmt.Errorf("no CPU %d", id)
			case int(h.cpuNode[p]) != n:
				return fmt.Errorf("CPU %d is on NUMA node %d, not %d", id, h.nodeID[h.cpuNode[p]], cell.Node)
			case h.isReserved(p):
				return fmt.Errorf("CPU %d is reserved for the host", id)
			case h.owner[p] != 0:
				return fmt.Errorf("CPU %d is already taken", id)
			}
			s.posns = append(s.posns, p)
		}
	}
	slices.Sort(s.posns)
	for k := 1; k < len(s.posns); k++ {
		if s.posns[k] == s.posns[k-1] {
			return fmt.Errorf("CPU %d named twice", h.cpuID[s.posns[k]])
		}
	}
	for k, a := range c.GPUs {
		i := h.gpuIndex(a)
		switch {
		case i < 0:
			return fmt.Errorf("no GPU %s", a)
		case h.gpus[i].owner != 0:
			return fmt.Errorf("GPU %s is already taken", a)
		case slices.Contains(c.GPUs[:k], a):
			return fmt.Errorf("GPU %s named twice", a)
		}
	}
	return nil
}

// Release gives back what a claim holds (unknown host or items: ignored).
// The claim recorded in the state is found by c's CPUs, else its GPUs, else
// (a claim of memory and disk only) by its cells and disk, and all of it is
// given back, so releasing twice gives back once.
func (s *State) Release(c Claim) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.release(c)
}

// release is Release with mu held.
func (s *State) release(c Claim) {
	i, ok := s.byName[c.Host]
	if !ok {
		return
	}
	h, sm := s.hosts[i], &s.sums[i]
	slot := h.find(&c)
	if slot < 0 {
		return
	}
	o := int32(slot + 1)
	cl := &h.claims[slot]
	if cl.ncpu > 0 {
		for p, ow := range h.owner {
			if ow == o {
				h.give(sm, p)
			}
		}
	}
	if cl.ngpu > 0 {
		for k := range h.gpus {
			if g := &h.gpus[k]; g.owner == o {
				g.owner = 0
				h.modelCount(g.model).free++
			}
		}
	}
	for _, cm := range cl.cells {
		h.free[cm.node].memMB += int(cm.memMB)
		sm.freeMemMB += int(cm.memMB)
	}
	sm.freeDiskGB += cl.disk
	*cl = held{}
	h.spare = append(h.spare, int32(slot))
}

// find returns the slot of the recorded claim c names, or -1.
func (h *host) find(c *Claim) int {
	pinned := len(c.GPUs) > 0
	for _, cell := range c.Cells {
		for _, id := range cell.CPUs {
			pinned = true
			if p, ok := h.pos(id); ok && h.owner[p] > 0 {
				return int(h.owner[p] - 1)
			}
		}
	}
	for _, a := range c.GPUs {
		if i := h.gpuIndex(a); i >= 0 && h.gpus[i].owner > 0 {
			return int(h.gpus[i].owner - 1)
		}
	}
	if pinned {
		return -1
	}
	for sl, cl := range h.claims {
		if cl.live && cl.ncpu == 0 && cl.ngpu == 0 && cl.disk == c.DiskGB && h.sameCells(cl.cells, c.Cells) {
			return sl
		}
	}
	return -1
}

func (h *host) sameCells(held []cellMem, cells []Cell) bool {
	if len(held) != len(cells) {
		return false
	}
	for k, cm := range held {
		if h.nodeID[cm.node] != cells[k].Node || int(cm.memMB) != cells[k].MemoryMB {
			return false
		}
	}
	return true
}
