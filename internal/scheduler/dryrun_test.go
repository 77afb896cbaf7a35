package scheduler

import (
	"testing"
)

// TestDryRun: how many fit and why no more, with the state left as it was.
func TestDryRun(t *testing.T) {
	// Two hosts of 2 nodes × 8 cores × 2 threads, one core per node kept:
	// 28 vCPUs and 64 GB each; the second has two A100s and little disk.
	plain := linuxHost("a", 2, 8, 32<<10, 0, 8, 16, 24)
	gpu := withGPUs(linuxHost("b", 2, 8, 32<<10, 0, 8, 16, 24),
		gpuAt("0000:01:00.0", "A100", 0), gpuAt("0000:02:00.0", "A100", 1))
	gpu.DiskGB = 100
	tests := []struct {
		name      string
		req       Request
		n         int
		fits      int
		short     Short
		preTaken  []Request // reserved (and kept) before the dry run
		downHosts []string
	}{
		{"all fit", Request{VCPUs: 4, MemoryMB: 8 << 10}, 10, 10, ShortNone, nil, nil},
		{"vCPUs run out", Request{VCPUs: 14}, 10, 4, ShortVCPU, nil, nil},
		{"too big for any host", Request{VCPUs: 29}, 1, 0, ShortVCPU, nil, nil},
		{"memory runs out", Request{VCPUs: 2, MemoryMB: 40 << 10}, 3, 2, ShortMemory, nil, nil},
		{"GPUs run out", Request{VCPUs: 2, GPUModel: "A100", GPUs: 1}, 3, 2, ShortGPU, nil, nil},
		{"two GPUs, one free", Request{VCPUs: 2, GPUModel: "A100", GPUs: 2}, 1, 0, ShortGPU,
			[]Request{{VCPUs: 1, GPUModel: "A100", GPUs: 1}}, nil},
		{"unknown GPU model", Request{VCPUs: 1, GPUModel: "H100", GPUs: 1}, 1, 0, ShortGPU, nil, nil},
		{"GPU host short of vCPUs", Request{VCPUs: 20, GPUModel: "A100", GPUs: 1}, 1, 0, ShortVCPU,
			[]Request{{VCPUs: 20, OnlyHosts: []string{"b"}}}, nil},
		{"disk", Request{VCPUs: 1, DiskGB: 600}, 3, 1, ShortDisk, nil, nil},
		{"unknown zone", Request{VCPUs: 1, Zone: "elsewhere"}, 1, 0, ShortHost, nil, nil},
		{"no host up", Request{VCPUs: 1}, 1, 0, ShortHost, nil, []string{"a", "b"}},
		{"free apart, never together", Request{VCPUs: 10, MemoryMB: 40 << 10}, 3, 1, ShortTogether,
			[]Request{{VCPUs: 20, MemoryMB: 1 << 10, OnlyHosts: []string{"b"}}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := fleet(t, Policy{Weigher: Spread, KeepGPUHosts: true}, plain, gpu)
			for _, r := range tt.preTaken {
				mustReserve(t, s, r)
			}
			for _, h := range tt.downHosts {
				s.SetSchedulable(h, false)
			}
			before := usages(s, "a", "b")
			fits, short, err := s.DryRun(tt.req, tt.n)
			if err != nil {
				t.Fatal(err)
			}
			if fits != tt.fits || short != tt.short {
				t.Errorf("DryRun = %d, %d; want %d, %d", fits, short, tt.fits, tt.short)
			}
			mustCheck(t, s)
			if after := usages(s, "a", "b"); !equalUsages(before, after) {
				t.Errorf("dry run changed the state: %+v, then %+v", before, after)
			}
			// What it said fits, Reserve places.
			for i := range tt.fits {
				if _, err := s.Reserve(tt.req); err != nil {
					t.Fatalf("Reserve %d after a dry run of %d: %v", i+1, tt.fits, err)
				}
			}
		})
	}
}

func TestDryRunRefusesBadRequest(t *testing.T) {
	s := fleet(t, Policy{}, countsHost("a", 4, 4096, 10))
	if _, _, err := s.DryRun(Request{VCPUs: 0}, 1); err == nil {
		t.Error("DryRun of 0 vCPUs: no error")
	}
}

func equalUsages(a, b map[string]HostUsage) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestDryRunHidesNothing: a Reserve beside dry runs of the same host
// always finds it free, since a dry run gives back under the same lock.
func TestDryRunHidesNothing(t *testing.T) {
	s := fleet(t, Policy{}, countsHost("a", 4, 4096, 10))
	req := Request{VCPUs: 4, MemoryMB: 4096}
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, _, err := s.DryRun(req, 1); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	defer func() { close(stop); <-done; mustCheck(t, s) }()
	for i := range 50_000 {
		c, err := s.Reserve(req)
		if err != nil {
			t.Fatalf("Reserve %d beside a dry run: %v", i, err)
		}
		s.Release(c)
	}
}
