package scheduler

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
)

// ErrNoValidHost is returned by Reserve when no host fits; nothing is taken.
// Its text is Nova's fault message, which clients show as is.
//
//lint:ignore ST1005 Nova's exact words
var ErrNoValidHost = errors.New("No valid host was found. There are not enough hosts available.")

// ErrConflict is wrapped by Apply's errors when a claim does not fit the
// state: a CPU or GPU already held, reserved or unknown, or a node's memory
// or the disk pool that would go over.
var ErrConflict = errors.New("scheduler: claim conflicts with the state")

// ErrUnknownHost is wrapped by Apply's error for a claim on a host the state
// does not have (never registered, or removed).
var ErrUnknownHost = errors.New("scheduler: unknown host")

// Request is what one server asks of a host.
type Request struct {
	VCPUs, MemoryMB int
	// DiskGB is local disk taken from the host's pool (0 for network disks).
	DiskGB int
	// GPUModel is the driver.GPU.Model wanted ("" = none); GPUs is how many
	// whole GPUs of that model.
	GPUModel string
	GPUs     int
	// NUMANodes is 1 for all vCPUs and memory on one NUMA node (flavor
	// hw:numa_nodes=1); 0 for one node when some node fits, else spread
	// over as few nodes as possible; N>1 for exactly N nodes with vCPUs and
	// memory split evenly (Nova's hw:numa_nodes=N; the first cells take the
	// remainder of an uneven split).
	NUMANodes int
	// Zone is the availability zone, "" for any.
	Zone string
	// OnlyHosts, when non-nil, are the only hosts allowed (requested host,
	// same_host, affinity); AvoidHosts are never used (different_host,
	// anti-affinity).
	OnlyHosts  []string
	AvoidHosts []string
	// Prefer is soft affinity: a host's weight rises with its count here.
	// Shun is soft anti-affinity: a host's weight falls with its count here.
	Prefer map[string]int
	Shun   map[string]int
}

// check refuses requests no flavor can make; compute validates flavors
// first, so these are programming errors rather than NoValidHost.
func (r *Request) check() error {
	switch {
	case r.VCPUs < 1:
		return fmt.Errorf("scheduler: a request needs at least one vCPU, not %d", r.VCPUs)
	case r.MemoryMB < 0 || r.DiskGB < 0 || r.GPUs < 0 || r.NUMANodes < 0:
		return fmt.Errorf("scheduler: negative amount in request %+v", *r)
	case r.GPUs > 0 && r.GPUModel == "":
		return errors.New("scheduler: a request for GPUs needs a GPU model")
	case r.NUMANodes > r.VCPUs:
		return fmt.Errorf("scheduler: %d NUMA nodes need at least as many vCPUs, not %d", r.NUMANodes, r.VCPUs)
	}
	return nil
}

// Cell is the part of a claim on one NUMA node.
type Cell struct {
	Node     int   // driver.NUMANode.ID
	CPUs     []int // host CPU ids, sorted
	MemoryMB int
}

// Claim is what one server holds on one host. The first cell is the
// server's main NUMA node, the one its GPUs are closest to.
type Claim struct {
	Host   string
	Cells  []Cell
	GPUs   []string // PCI addresses
	DiskGB int
}

// CPUs returns all the host CPUs the claim pins, sorted.
func (c Claim) CPUs() []int {
	n := 0
	for _, cl := range c.Cells {
		n += len(cl.CPUs)
	}
	out := make([]int, 0, n)
	for _, cl := range c.Cells {
		out = append(out, cl.CPUs...)
	}
	slices.Sort(out)
	return out
}

// Items are the names the store reserves the claim's pCPUs and GPUs under
// (compute_claim_items.item, unique per host): "cpu:<id>" for each pCPU,
// sorted, then "gpu:<PCI address>" for each GPU.
func (c Claim) Items() []string {
	cpus := c.CPUs()
	out := make([]string, 0, len(cpus)+len(c.GPUs))
	for _, id := range cpus {
		out = append(out, "cpu:"+strconv.Itoa(id))
	}
	for _, g := range c.GPUs {
		out = append(out, "gpu:"+g)
	}
	return out
}

// MemoryMB returns the memory the claim holds over all its cells.
func (c Claim) MemoryMB() int {
	n := 0
	for _, cl := range c.Cells {
		n += cl.MemoryMB
	}
	return n
}
