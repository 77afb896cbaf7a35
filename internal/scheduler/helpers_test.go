package scheduler

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"nimbus/internal/driver"
)

// linuxHost builds a host numbered as Linux numbers one: sockets × cores
// with two threads each, the first thread of every core first (ids 0 to
// sockets*cores-1), their siblings after; one NUMA node per socket with
// memMB each.
func linuxHost(name string, sockets, cores, memMB int, reserved ...int) driver.Host {
	h := driver.Host{Name: name, DiskGB: 1000, ReservedCPUs: reserved}
	half := sockets * cores
	for t := range 2 {
		for s := range sockets {
			for c := range cores {
				id := t*half + s*cores + c
				first := s*cores + c
				h.CPUs = append(h.CPUs, driver.CPU{ID: id, Core: c, Socket: s, NUMA: s, Siblings: []int{first, first + half}})
			}
		}
	}
	for s := range sockets {
		h.NUMANodes = append(h.NUMANodes, driver.NUMANode{ID: s, MemoryMB: memMB})
	}
	return h
}

// countsHost is a host given by counts only, as a fleet file may give it.
func countsHost(name string, vcpus, memMB, diskGB int) driver.Host {
	return driver.Host{Name: name, VCPUs: vcpus, MemoryMB: memMB, DiskGB: diskGB}
}

func withGPUs(h driver.Host, gpus ...driver.GPU) driver.Host {
	h.GPUs = gpus
	return h
}

func gpuAt(addr, model string, numa int) driver.GPU {
	return driver.GPU{Address: addr, Vendor: "NVIDIA", Model: model, NUMA: numa}
}

// fleet returns a spread, GPU-keeping state of hosts, all schedulable in
// zone "nova".
func fleet(t testing.TB, p Policy, hosts ...driver.Host) *State {
	t.Helper()
	s := New(p)
	for _, h := range hosts {
		s.SetHost(h, "nova", true)
	}
	mustCheck(t, s)
	return s
}

func mustCheck(t testing.TB, s *State) {
	t.Helper()
	if err := s.Check(); err != nil {
		t.Fatalf("Check: %v", err)
	}
}

func mustReserve(t testing.TB, s *State, req Request) Claim {
	t.Helper()
	c, err := s.Reserve(req)
	if err != nil {
		t.Fatalf("Reserve(%+v): %v", req, err)
	}
	return c
}

// usages returns every host's usage, to compare states.
func usages(s *State, names ...string) map[string]HostUsage {
	out := map[string]HostUsage{}
	for _, n := range names {
		u, _ := s.Usage(n)
		out[n] = u
	}
	return out
}

// cellShape is a cell as tests expect it: node, vCPU count, memory.
type cellShape struct{ node, cpus, mem int }

func shape(c Claim) []cellShape {
	var out []cellShape
	for _, cl := range c.Cells {
		out = append(out, cellShape{cl.Node, len(cl.CPUs), cl.MemoryMB})
	}
	return out
}

// claimOK checks what every claim of req must be: the vCPUs and memory
// asked for, distinct CPUs on the cells' own nodes, sorted within cells,
// none reserved.
func claimOK(h driver.Host, req Request, c Claim) error {
	h.Normalize()
	node := map[int]int{}
	for _, cpu := range h.CPUs {
		node[cpu.ID] = cpu.NUMA
	}
	cpus := c.CPUs()
	if len(cpus) != req.VCPUs || c.MemoryMB() != req.MemoryMB || c.DiskGB != req.DiskGB || len(c.GPUs) != req.GPUs {
		return fmt.Errorf("claim %+v does not match request %+v", c, req)
	}
	if len(slices.Compact(slices.Clone(cpus))) != len(cpus) {
		return fmt.Errorf("claim %+v holds a CPU twice", c)
	}
	for _, cl := range c.Cells {
		if !slices.IsSorted(cl.CPUs) || len(cl.CPUs) == 0 {
			return fmt.Errorf("cell %+v: CPUs unsorted or none", cl)
		}
		for _, id := range cl.CPUs {
			if slices.Contains(h.ReservedCPUs, id) {
				return fmt.Errorf("reserved CPU %d given", id)
			}
			if node[id] != cl.Node {
				return fmt.Errorf("CPU %d of node %d in a cell of node %d", id, node[id], cl.Node)
			}
		}
	}
	switch {
	case req.NUMANodes == 1 && len(c.Cells) != 1,
		req.NUMANodes > 1 && len(c.Cells) != req.NUMANodes:
		return fmt.Errorf("%d cells for hw:numa_nodes=%d", len(c.Cells), req.NUMANodes)
	}
	return nil
}

func errIs(err, target error) bool {
	if target == nil {
		return err == nil
	}
	return errors.Is(err, target)
}
