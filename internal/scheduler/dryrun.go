package scheduler

// Short is what stops one more server of a request from fitting.
type Short uint8

// The reasons DryRun gives, in the order it looks for them.
const (
	ShortNone     Short = iota // it fits
	ShortHost                  // no host takes new servers (in the zone, among those allowed)
	ShortGPU                   // no host has the GPUs free
	ShortVCPU                  // no host (with the GPUs free) has the vCPUs free
	ShortMemory                // … the memory
	ShortDisk                  // … the local disk
	ShortTogether              // each is free on some host, never all of it on one (or on its NUMA nodes as asked)
)

// DryRun reports how many servers of req, up to n, fit right now, as n
// Reserve calls in a row would place them, and when fewer than n fit,
// what stops the next one. It takes nothing: the claims it makes are given
// back before the lock is let go, so no Reserve running beside it ever
// sees them and its answer costs nobody a host.
func (s *State) DryRun(req Request, n int) (int, Short, error) {
	if err := req.check(); err != nil {
		return 0, ShortNone, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	q, short := s.resolve(&req)
	if short != ShortNone {
		return 0, short, nil
	}
	q.marked = s.mark(&req)
	defer s.unmark(&req)
	only := req.OnlyHosts != nil
	var held []Claim
	for len(held) < n {
		best := s.choose(&q, only)
		if best < 0 {
			short = s.shortOf(&q, only)
			break
		}
		held = append(held, s.place(best, &q))
	}
	for _, c := range held {
		s.release(c)
	}
	return len(held), short, nil
}

// shortOf says why q fits no host: the first amount that no host allowed
// has free on its own. Called with mu held and req's marks set.
func (s *State) shortOf(q *query, only bool) Short {
	var host, gpu, cpu, mem, disk bool
	look := func(i int) {
		sm := &s.sums[i]
		if !sm.sched || (q.zone >= 0 && sm.zone != q.zone) || (q.marked && s.marks[i].avoid) {
			return
		}
		host = true
		if q.gpus > 0 && (!sm.gpu || s.hosts[i].freeGPUs(q.model) < q.gpus) {
			return
		}
		gpu = true
		cpu = cpu || sm.freeCPUs >= q.vcpus
		mem = mem || sm.freeMemMB >= q.memMB
		disk = disk || sm.freeDiskGB >= q.diskGB
	}
	if only {
		for _, i := range s.only {
			look(i)
		}
	} else {
		for i := range s.sums {
			look(i)
		}
	}
	switch {
	case !host:
		return ShortHost
	case !gpu:
		return ShortGPU
	case !cpu:
		return ShortVCPU
	case !mem:
		return ShortMemory
	case !disk:
		return ShortDisk
	}
	return ShortTogether
}
