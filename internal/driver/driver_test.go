package driver

import (
	"reflect"
	"testing"
)

func TestNormalize(t *testing.T) {
	tests := []struct {
		name      string
		in        Host
		vcpus     int
		memory    int
		nodes     []NUMANode
		siblings0 []int
	}{
		{"counts only", Host{VCPUs: 8, MemoryMB: 1000}, 8, 1000, []NUMANode{{0, 1000}}, []int{0, 1}},
		{"two nodes from 64 threads", Host{VCPUs: 64, MemoryMB: 1001}, 64, 1001, []NUMANode{{0, 501}, {1, 500}}, []int{0, 1}},
		{"reserved cores counted out", Host{
			CPUs:         []CPU{{ID: 0, Siblings: []int{0, 1}}, {ID: 1, Siblings: []int{0, 1}}, {ID: 2, Core: 1, Siblings: []int{2, 3}}, {ID: 3, Core: 1, Siblings: []int{2, 3}}},
			ReservedCPUs: []int{0, 1}, NUMANodes: []NUMANode{{0, 4096}}, MemoryMB: 1}, 2, 4096, []NUMANode{{0, 4096}}, []int{0, 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := tc.in
			h.Normalize()
			if h.VCPUs != tc.vcpus || h.MemoryMB != tc.memory || !reflect.DeepEqual(h.NUMANodes, tc.nodes) {
				t.Errorf("got vcpus %d memory %d nodes %v; want %d %d %v", h.VCPUs, h.MemoryMB, h.NUMANodes, tc.vcpus, tc.memory, tc.nodes)
			}
			if !reflect.DeepEqual(h.CPUs[0].Siblings, tc.siblings0) {
				t.Errorf("CPU 0 siblings %v, want %v", h.CPUs[0].Siblings, tc.siblings0)
			}
			again := h
			again.Normalize()
			if !reflect.DeepEqual(again, h) {
				t.Errorf("Normalize is not idempotent")
			}
		})
	}
}
