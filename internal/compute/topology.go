package compute

import (
	"net/http"
	"sort"
	"strconv"

	"nimbus/internal/api"
)

// handleTopology is GET /servers/{id}/topology (2.78): the server's NUMA
// cells with their guest vCPUs, memory and thread siblings, and for admins
// the host node and the host pCPU each vCPU is pinned to
// (nova/api/openstack/compute/server_topology.py). A server that holds no
// claim (not placed, shelved-offloaded) has no topology.
func (s *Service) handleTopology(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	if !VersionFrom(ctx).AtLeast(78) {
		return nil, api.NotFound("The resource could not be found.")
	}
	sv, err := s.visibleServer(ctx, s.db, r.PathValue("id"), false)
	if err != nil {
		return nil, err
	}
	c, ok, err := loadClaim(ctx, s.db, sv.ID)
	if err != nil {
		return nil, err
	}
	if !ok || len(c.Cells) == 0 {
		return api.JSON(http.StatusOK, map[string]any{"nodes": []any{}, "pagesize_kb": nil}), nil
	}
	// Host threads that share a core: their guest vCPUs are siblings.
	coreOf := map[int]string{}
	if hosts, err := s.fleet(ctx); err == nil {
		h := hosts[c.Host]
		h.Normalize()
		for _, cpu := range h.CPUs {
			coreOf[cpu.ID] = strconv.Itoa(cpu.Socket) + "/" + strconv.Itoa(cpu.Core)
		}
	}
	showHost := callerAdmin(r)
	nodes := make([]any, 0, len(c.Cells))
	vcpu := 0
	for _, cell := range c.Cells {
		cpus := append([]int{}, cell.CPUs...)
		sort.Ints(cpus)
		set := make([]int, 0, len(cpus))
		pinning := map[string]int{}
		byCore := map[string][]int{}
		var cores []string
		for _, p := range cpus {
			set = append(set, vcpu)
			pinning[strconv.Itoa(vcpu)] = p
			k, ok := coreOf[p]
			if !ok {
				k = "cpu" + strconv.Itoa(p)
			}
			if _, seen := byCore[k]; !seen {
				cores = append(cores, k)
			}
			byCore[k] = append(byCore[k], vcpu)
			vcpu++
		}
		siblings := [][]int{}
		for _, k := range cores {
			if len(byCore[k]) > 1 {
				siblings = append(siblings, byCore[k])
			}
		}
		node := map[string]any{"vcpu_set": set, "siblings": siblings, "memory_mb": cell.MemoryMB}
		if showHost {
			node["host_node"], node["cpu_pinning"] = cell.Node, pinning
		}
		nodes = append(nodes, node)
	}
	return api.JSON(http.StatusOK, map[string]any{"nodes": nodes, "pagesize_kb": nil}), nil
}
