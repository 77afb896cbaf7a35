package scheduler

// query is a request with its names resolved to the state's numbers.
type query struct {
	vcpus, memMB, diskGB int
	gpus                 int
	model                int32 // interned GPUModel, when gpus > 0
	numa                 int
	zone                 int32 // -1: any
	marked               bool  // AvoidHosts, Prefer or Shun set marks
}

// rank is how a host that fits compares with others, most important first.
type rank struct {
	gpuHost bool // a GPU host kept from a request without GPUs
	prefer  int
	shun    int
	score   float64 // the weigher's: higher wins
}

// Reserve picks the best host for req and takes the resources at once in
// the state, so that concurrent Reserve calls never hand out the same CPU
// or GPU. The caller then commits the claim to the database (which
// re-checks it) and calls Release when that fails. ErrNoValidHost when
// nothing fits; nothing is taken then.
func (s *State) Reserve(req Request) (Claim, error) {
	if err := req.check(); err != nil {
		return Claim{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	q, short := s.resolve(&req)
	if short != ShortNone {
		return Claim{}, ErrNoValidHost
	}
	q.marked = s.mark(&req)
	best := s.choose(&q, req.OnlyHosts != nil)
	s.unmark(&req)
	if best < 0 {
		return Claim{}, ErrNoValidHost
	}
	return s.place(best, &q), nil
}

// resolve turns req's names into the state's numbers; an unknown zone
// (ShortHost) or GPU model (ShortGPU) means nothing can fit. Called with mu
// held.
func (s *State) resolve(req *Request) (query, Short) {
	q := query{vcpus: req.VCPUs, memMB: req.MemoryMB, diskGB: req.DiskGB, gpus: req.GPUs, numa: req.NUMANodes, zone: -1}
	if req.Zone != "" {
		z, ok := s.zones[req.Zone]
		if !ok {
			return q, ShortHost
		}
		q.zone = z
	}
	if q.gpus > 0 {
		m, ok := s.models[req.GPUModel]
		if !ok {
			return q, ShortGPU
		}
		q.model = m
	}
	return q, ShortNone
}

// mark records on the hosts what req says of them, and s.only for
// OnlyHosts; it reports whether any AvoidHosts, Prefer or Shun mark was set.
func (s *State) mark(req *Request) bool {
	s.only = s.only[:0]
	for _, name := range req.OnlyHosts {
		if i, ok := s.byName[name]; ok && !s.marks[i].only {
			s.marks[i].only = true
			s.only = append(s.only, i)
		}
	}
	marked := false
	for _, name := range req.AvoidHosts {
		if i, ok := s.byName[name]; ok {
			s.marks[i].avoid, marked = true, true
		}
	}
	for name, n := range req.Prefer {
		if i, ok := s.byName[name]; ok && n > 0 {
			s.marks[i].prefer, marked = n, true
		}
	}
	for name, n := range req.Shun {
		if i, ok := s.byName[name]; ok && n > 0 {
			s.marks[i].shun, marked = n, true
		}
	}
	return marked
}

// unmark undoes mark.
func (s *State) unmark(req *Request) {
	for _, i := range s.only {
		s.marks[i].only = false
	}
	for _, name := range req.AvoidHosts {
		if i, ok := s.byName[name]; ok {
			s.marks[i] = mark{}
		}
	}
	for name := range req.Prefer {
		if i, ok := s.byName[name]; ok {
			s.marks[i] = mark{}
		}
	}
	for name := range req.Shun {
		if i, ok := s.byName[name]; ok {
			s.marks[i] = mark{}
		}
	}
}

// choose returns the index of the best host for q, or -1: over s.only when
// only is set, else over every host.
func (s *State) choose(q *query, only bool) int {
	best := -1
	var top rank
	try := func(i int) {
		r, ok := s.rankHost(i, q)
		if ok && (best < 0 || s.better(r, i, top, best)) {
			best, top = i, r
		}
	}
	if only {
		for _, i := range s.only {
			try(i)
		}
		return best
	}
	for i := range s.sums {
		try(i)
	}
	return best
}

// rankHost filters host i for q on its counters alone (no allocation, the
// host's own record is read only for GPU requests) and ranks it.
func (s *State) rankHost(i int, q *query) (rank, bool) {
	sm := &s.sums[i]
	if !sm.sched || (q.zone >= 0 && sm.zone != q.zone) ||
		sm.freeCPUs < q.vcpus || sm.freeMemMB < q.memMB || sm.freeDiskGB < q.diskGB {
		return rank{}, false
	}
	var r rank
	if q.marked {
		m := &s.marks[i]
		if m.avoid {
			return rank{}, false
		}
		r.prefer, r.shun = m.prefer, m.shun
	}
	if q.gpus > 0 {
		if !sm.gpu || s.hosts[i].freeGPUs(q.model) < q.gpus {
			return rank{}, false
		}
	} else {
		r.gpuHost = sm.gpu && s.policy.KeepGPUHosts
	}
	if !fitNodes(q, sm.nodes) {
		return rank{}, false
	}
	r.score = float64(sm.freeCPUs)*sm.invCPUs + float64(sm.freeMemMB)*sm.invMemMB
	if s.pack {
		r.score = -r.score
	}
	return r, true
}

// better reports whether host i ranked a beats host j ranked b: a host kept
// for GPUs loses, then more soft affinity wins, then less soft
// anti-affinity, then the weigher, then the lower name, so that the choice
// does not depend on the order hosts were added.
func (s *State) better(a rank, i int, b rank, j int) bool {
	switch {
	case a.gpuHost != b.gpuHost:
		return !a.gpuHost
	case a.prefer != b.prefer:
		return a.prefer > b.prefer
	case a.shun != b.shun:
		return a.shun < b.shun
	case a.score != b.score:
		return a.score > b.score
	}
	return s.hosts[i].name < s.hosts[j].name
}

// fitNodes reports whether q's vCPUs and memory fit the NUMA nodes' free
// counters as q.numa asks.
func fitNodes(q *query, nodes []nodeFree) bool {
	v, m := q.vcpus, q.memMB
	if q.numa <= 1 {
		for _, n := range nodes {
			if n.cpus >= v && n.memMB >= m {
				return true
			}
		}
		if q.numa == 1 {
			return false
		}
		// Spread: the nodes' room in proportion, summed.
		room := 0
		for _, n := range nodes {
			if room += spreadCap(n, v, m); room >= v {
				return true
			}
		}
		return false
	}
	ev := evenSplit(q)
	if len(nodes) < q.numa {
		return false
	}
	var a, b, f int
	for _, n := range nodes {
		if n.cpus >= ev.c+1 && n.memMB >= ev.m+1 {
			a++
		}
		if n.cpus >= ev.c+ev.bc && n.memMB >= ev.m+ev.bm {
			b++
		}
		if n.cpus >= ev.c && n.memMB >= ev.m {
			f++
		}
	}
	return a >= ev.na && b >= ev.na+ev.nb && f >= q.numa
}

// spreadCap is how many of v vCPUs node n can take when a cell's memory is
// in proportion to its vCPUs (m for all v).
func spreadCap(n nodeFree, v, m int) int {
	c := n.cpus
	if m > 0 {
		c = min(c, n.memMB*v/m)
	}
	return max(c, 0)
}

// even is an even split of q over q.numa cells: every cell gets c vCPUs and
// m MB; the first rc cells one vCPU more, the first rm cells one MB more.
// The cells then come in at most three kinds, each wanting no less than the
// next: na cells of (c+1, m+1), nb cells of (c+bc, m+bm), the rest (c, m).
// Nodes that fit a kind also fit the kinds after it, so counting the nodes
// that fit each kind decides whether the split fits.
type even struct {
	c, m, rc, rm int
	na, nb       int
	bc, bm       int
}

func evenSplit(q *query) even {
	n := q.numa
	e := even{c: q.vcpus / n, m: q.memMB / n, rc: q.vcpus % n, rm: q.memMB % n}
	e.na = min(e.rc, e.rm)
	e.nb = max(e.rc, e.rm) - e.na
	if e.rc > e.rm {
		e.bc = 1
	} else if e.rm > e.rc {
		e.bm = 1
	}
	return e
}
