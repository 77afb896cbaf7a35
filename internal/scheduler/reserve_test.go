package scheduler

import (
	"errors"
	"maps"
	"slices"
	"testing"

	"nimbus/internal/driver"
)

func TestParsePolicy(t *testing.T) {
	for _, tc := range []struct {
		weigher string
		want    string
		bad     bool
	}{
		{"", Spread, false},
		{"spread", Spread, false},
		{"pack", Pack, false},
		{"Pack", "", true},
		{"binpack", "", true},
	} {
		p, err := ParsePolicy(tc.weigher, true)
		if (err != nil) != tc.bad || p.Weigher != tc.want || (!tc.bad && !p.KeepGPUHosts) {
			t.Errorf("ParsePolicy(%q) = %+v, %v", tc.weigher, p, err)
		}
	}
	if s := New(Policy{Weigher: Pack}); s.Policy().Weigher != Pack {
		t.Errorf("Policy() = %+v", s.Policy())
	}
	if s := New(Policy{}); s.Policy().Weigher != Spread {
		t.Errorf("default Policy() = %+v", s.Policy())
	}
}

func TestRequestChecked(t *testing.T) {
	s := fleet(t, Policy{}, countsHost("h", 8, 8192, 100))
	for _, req := range []Request{
		{VCPUs: 0},
		{VCPUs: 1, MemoryMB: -1},
		{VCPUs: 1, GPUs: 1},
		{VCPUs: 1, NUMANodes: 2},
	} {
		if _, err := s.Reserve(req); err == nil || errors.Is(err, ErrNoValidHost) {
			t.Errorf("Reserve(%+v) = %v, want a request error", req, err)
		}
	}
}

// Every server gets distinct host CPUs that no other claim holds and never
// a reserved one, until the host is full.
func TestReserveDistinctUnreservedCPUs(t *testing.T) {
	for _, tc := range []struct {
		name  string
		host  driver.Host
		vcpus int
		want  int // claims that fit
	}{
		{"linux 2x8 one reserved core", linuxHost("h", 2, 8, 1<<20, 0, 16), 1, 30},
		{"linux 2x8 by threes", linuxHost("h", 2, 8, 1<<20, 0, 16), 3, 10}, // 15 free per node: 5 per node
		{"counts only", countsHost("h", 64, 1<<20, 100), 4, 16},
		{"reserved threads split cores", linuxHost("h", 1, 8, 1<<20, 1, 2, 3), 2, 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := fleet(t, Policy{}, tc.host)
			held := map[int]bool{}
			n := 0
			for {
				req := Request{VCPUs: tc.vcpus, MemoryMB: 1}
				c, err := s.Reserve(req)
				if errors.Is(err, ErrNoValidHost) {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				if err := claimOK(tc.host, req, c); err != nil {
					t.Fatal(err)
				}
				for _, id := range c.CPUs() {
					if held[id] {
						t.Fatalf("CPU %d given twice", id)
					}
					held[id] = true
				}
				n++
				mustCheck(t, s)
			}
			if n != tc.want {
				t.Errorf("%d claims fit, want %d", n, tc.want)
			}
			if u, _ := s.Usage("h"); u.VCPUsUsed != n*tc.vcpus {
				t.Errorf("usage %+v after %d claims", u, n)
			}
		})
	}
}

// Whole free cores are taken first, a core's threads together, cores by
// lowest id; partly used cores are filled last.
func TestWholeCoresFirst(t *testing.T) {
	// One socket of four cores: {0,4} {1,5} {2,6} {3,7}.
	for _, tc := range []struct {
		name     string
		reserved []int
		pre      []int // CPUs an applied claim holds
		vcpus    int
		want     []int
	}{
		{"one core", nil, nil, 2, []int{0, 4}},
		{"core and a half", nil, nil, 3, []int{0, 1, 4}},
		{"skips a shared core", nil, []int{0}, 2, []int{1, 5}},
		{"whole cores before the shared one", nil, []int{0}, 5, []int{1, 2, 3, 5, 6}},
		{"then the shared core", nil, []int{0}, 7, []int{1, 2, 3, 4, 5, 6, 7}},
		{"reserved thread makes a core partial", []int{3}, nil, 6, []int{0, 1, 2, 4, 5, 6}},
		{"partial core last", []int{3}, nil, 7, []int{0, 1, 2, 4, 5, 6, 7}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := fleet(t, Policy{}, linuxHost("h", 1, 4, 65536, tc.reserved...))
			if tc.pre != nil {
				if err := s.Apply(Claim{Host: "h", Cells: []Cell{{Node: 0, CPUs: tc.pre}}}); err != nil {
					t.Fatal(err)
				}
			}
			c := mustReserve(t, s, Request{VCPUs: tc.vcpus})
			if got := c.CPUs(); !slices.Equal(got, tc.want) {
				t.Errorf("CPUs %v, want %v", got, tc.want)
			}
			mustCheck(t, s)
		})
	}
	// Normalize's synthetic topology pairs ids 2k and 2k+1.
	s := fleet(t, Policy{}, countsHost("h", 8, 8192, 10))
	if got := mustReserve(t, s, Request{VCPUs: 1}).CPUs(); !slices.Equal(got, []int{0}) {
		t.Errorf("first CPU %v", got)
	}
	if got := mustReserve(t, s, Request{VCPUs: 2}).CPUs(); !slices.Equal(got, []int{2, 3}) {
		t.Errorf("whole core %v, want [2 3]", got)
	}
	if got := mustReserve(t, s, Request{VCPUs: 1}).CPUs(); !slices.Equal(got, []int{4}) {
		t.Errorf("third claim %v, want [4] (a whole core before the shared CPU 1)", got)
	}
}

// NUMA: one node when asked or when one fits, the fewest nodes otherwise,
// exactly N nodes split evenly for N>1, memory never over per node.
func TestNUMA(t *testing.T) {
	// Two nodes of 8 threads and 8192 MB each; node 0 holds 0-3 and 8-11.
	host := linuxHost("h", 2, 4, 8192)
	for _, tc := range []struct {
		name string
		pre  []Request
		req  Request
		want []cellShape
		err  error
	}{
		{name: "single node", req: Request{VCPUs: 4, MemoryMB: 4096, NUMANodes: 1},
			want: []cellShape{{0, 4, 4096}}},
		{name: "auto fits one node", req: Request{VCPUs: 8, MemoryMB: 8192},
			want: []cellShape{{0, 8, 8192}}},
		{name: "auto goes to the node with room", pre: []Request{{VCPUs: 2, NUMANodes: 1}},
			req: Request{VCPUs: 8, MemoryMB: 1024}, want: []cellShape{{1, 8, 1024}}},
		{name: "auto spreads when no node fits", req: Request{VCPUs: 10, MemoryMB: 10240},
			want: []cellShape{{0, 5, 5120}, {1, 5, 5120}}},
		{name: "spread in proportion to room", pre: []Request{{VCPUs: 5, MemoryMB: 1024, NUMANodes: 1}},
			req: Request{VCPUs: 10, MemoryMB: 1000}, want: []cellShape{{1, 7, 700}, {0, 3, 300}}},
		{name: "single node refused", req: Request{VCPUs: 10, MemoryMB: 1024, NUMANodes: 1}, err: ErrNoValidHost},
		{name: "single node refused on memory", req: Request{VCPUs: 2, MemoryMB: 8193, NUMANodes: 1}, err: ErrNoValidHost},
		{name: "two nodes even", req: Request{VCPUs: 4, MemoryMB: 4096, NUMANodes: 2},
			want: []cellShape{{0, 2, 2048}, {1, 2, 2048}}},
		{name: "two nodes uneven", req: Request{VCPUs: 5, MemoryMB: 3001, NUMANodes: 2},
			want: []cellShape{{0, 3, 1501}, {1, 2, 1500}}},
		{name: "two nodes, bigger cell where it fits", pre: []Request{{VCPUs: 6, NUMANodes: 1}},
			req: Request{VCPUs: 5, MemoryMB: 10, NUMANodes: 2}, want: []cellShape{{1, 3, 5}, {0, 2, 5}}},
		{name: "two nodes need two nodes with room", pre: []Request{{VCPUs: 7, NUMANodes: 1}},
			req: Request{VCPUs: 4, NUMANodes: 2}, err: ErrNoValidHost},
		{name: "more nodes than the host has", req: Request{VCPUs: 3, NUMANodes: 3}, err: ErrNoValidHost},
		{name: "memory per node not overcommitted",
			pre: []Request{{VCPUs: 1, MemoryMB: 6144, NUMANodes: 1}},
			req: Request{VCPUs: 1, MemoryMB: 4096, NUMANodes: 1}, want: []cellShape{{1, 1, 4096}}},
		{name: "host memory free but no node has it",
			pre: []Request{{VCPUs: 1, MemoryMB: 6144, NUMANodes: 1}, {VCPUs: 1, MemoryMB: 4096, NUMANodes: 1}},
			req: Request{VCPUs: 1, MemoryMB: 5000, NUMANodes: 1}, err: ErrNoValidHost},
		{name: "spread with memory in proportion",
			pre: []Request{{VCPUs: 1, MemoryMB: 6144, NUMANodes: 1}, {VCPUs: 1, MemoryMB: 4096, NUMANodes: 1}},
			req: Request{VCPUs: 4, MemoryMB: 5000}, want: []cellShape{{1, 3, 3750}, {0, 1, 1250}}},
		{name: "spread refused when proportions do not fit",
			pre: []Request{{VCPUs: 1, MemoryMB: 6144, NUMANodes: 1}, {VCPUs: 1, MemoryMB: 4096, NUMANodes: 1}},
			req: Request{VCPUs: 2, MemoryMB: 5000}, err: ErrNoValidHost},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := fleet(t, Policy{}, host)
			for _, r := range tc.pre {
				mustReserve(t, s, r)
			}
			before := usages(s, "h")
			c, err := s.Reserve(tc.req)
			if !errIs(err, tc.err) {
				t.Fatalf("err %v, want %v", err, tc.err)
			}
			mustCheck(t, s)
			if tc.err != nil {
				if after := usages(s, "h"); !maps.Equal(before, after) {
					t.Errorf("refusal changed usage: %v -> %v", before, after)
				}
				return
			}
			if got := shape(c); !slices.Equal(got, tc.want) {
				t.Errorf("cells %v, want %v", got, tc.want)
			}
			if err := claimOK(host, tc.req, c); err != nil {
				t.Error(err)
			}
		})
	}
}

// GPUs: whole devices of exactly the model, each in one claim, near the
// server's main node.
func TestGPUs(t *testing.T) {
	host := withGPUs(linuxHost("g", 2, 8, 65536),
		gpuAt("0000:17:00.0", "A100 80GB", 0), gpuAt("0000:31:00.0", "A100 80GB", 0),
		gpuAt("0000:b1:00.0", "A100 80GB", 1), gpuAt("0000:ca:00.0", "A100 80GB", 1),
		gpuAt("0000:e3:00.0", "L4", 1), gpuAt("0000:e4:00.0", "L4", 1))
	model := map[string]string{}
	node := map[string]int{}
	for _, g := range host.GPUs {
		model[g.Address], node[g.Address] = g.Model, g.NUMA
	}
	for _, tc := range []struct {
		name string
		pre  []Request
		req  Request
		want []string
		err  error
	}{
		{name: "one A100", req: Request{VCPUs: 4, GPUModel: "A100 80GB", GPUs: 1}, want: []string{"0000:17:00.0"}},
		{name: "two L4 pull the cell to their node", req: Request{VCPUs: 4, GPUModel: "L4", GPUs: 2, NUMANodes: 1},
			want: []string{"0000:e3:00.0", "0000:e4:00.0"}},
		{name: "near the main node, not the lowest address", pre: []Request{{VCPUs: 8, NUMANodes: 1}},
			req: Request{VCPUs: 2, GPUModel: "A100 80GB", GPUs: 1, NUMANodes: 1}, want: []string{"0000:b1:00.0"}},
		{name: "next near one", pre: []Request{{VCPUs: 8, NUMANodes: 1}, {VCPUs: 1, GPUModel: "A100 80GB", GPUs: 1}},
			req: Request{VCPUs: 2, GPUModel: "A100 80GB", GPUs: 1, NUMANodes: 1}, want: []string{"0000:ca:00.0"}},
		{name: "then the far ones", req: Request{VCPUs: 2, GPUModel: "A100 80GB", GPUs: 3},
			want: []string{"0000:17:00.0", "0000:31:00.0", "0000:b1:00.0"}},
		{name: "all four", req: Request{VCPUs: 2, GPUModel: "A100 80GB", GPUs: 4},
			want: []string{"0000:17:00.0", "0000:31:00.0", "0000:b1:00.0", "0000:ca:00.0"}},
		{name: "too many", req: Request{VCPUs: 2, GPUModel: "A100 80GB", GPUs: 5}, err: ErrNoValidHost},
		{name: "taken ones are not given", pre: []Request{{VCPUs: 1, GPUModel: "L4", GPUs: 1}},
			req: Request{VCPUs: 2, GPUModel: "L4", GPUs: 2}, err: ErrNoValidHost},
		{name: "model must match exactly", req: Request{VCPUs: 2, GPUModel: "A100", GPUs: 1}, err: ErrNoValidHost},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := fleet(t, Policy{KeepGPUHosts: true}, host)
			for _, r := range tc.pre {
				mustReserve(t, s, r)
			}
			c, err := s.Reserve(tc.req)
			if !errIs(err, tc.err) {
				t.Fatalf("err %v, want %v", err, tc.err)
			}
			mustCheck(t, s)
			if err != nil {
				return
			}
			if !slices.Equal(c.GPUs, tc.want) {
				t.Errorf("GPUs %v, want %v", c.GPUs, tc.want)
			}
			for _, a := range c.GPUs {
				if model[a] != tc.req.GPUModel {
					t.Errorf("GPU %s is a %s", a, model[a])
				}
			}
			if tc.req.NUMANodes == 1 && node[c.GPUs[0]] != c.Cells[0].Node {
				t.Errorf("GPU %s on node %d, cell on %d", c.GPUs[0], node[c.GPUs[0]], c.Cells[0].Node)
			}
		})
	}
	// One claim per GPU: six one-GPU servers take six distinct devices.
	s := fleet(t, Policy{}, host)
	seen := map[string]bool{}
	for _, m := range []string{"A100 80GB", "L4", "A100 80GB", "A100 80GB", "L4", "A100 80GB"} {
		c := mustReserve(t, s, Request{VCPUs: 1, GPUModel: m, GPUs: 1})
		if seen[c.GPUs[0]] {
			t.Fatalf("GPU %s given twice", c.GPUs[0])
		}
		seen[c.GPUs[0]] = true
	}
	for _, m := range []string{"A100 80GB", "L4"} {
		if _, err := s.Reserve(Request{VCPUs: 1, GPUModel: m, GPUs: 1}); !errors.Is(err, ErrNoValidHost) {
			t.Errorf("seventh %s: %v", m, err)
		}
	}
	if u, _ := s.Usage("g"); u.GPUs != 6 || u.GPUsUsed != 6 {
		t.Errorf("usage %+v", u)
	}
	mustCheck(t, s)
}

// Hosts with GPUs are kept for GPU requests while another host fits.
func TestKeepGPUHosts(t *testing.T) {
	hosts := []driver.Host{
		countsHost("cpu1", 8, 16384, 100),
		withGPUs(countsHost("gpu1", 64, 262144, 1000), gpuAt("0000:3b:00.0", "L4", 0)),
	}
	for _, tc := range []struct {
		name string
		keep bool
		req  Request
		want string
	}{
		{"kept", true, Request{VCPUs: 2}, "cpu1"},
		{"not kept: spread picks the emptier GPU host", false, Request{VCPUs: 2}, "gpu1"},
		{"used when nothing else fits", true, Request{VCPUs: 16}, "gpu1"},
		{"GPU request", true, Request{VCPUs: 1, GPUModel: "L4", GPUs: 1}, "gpu1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := fleet(t, Policy{Weigher: Spread, KeepGPUHosts: tc.keep}, hosts...)
			mustReserve(t, s, Request{VCPUs: 4, OnlyHosts: []string{"cpu1"}}) // cpu1 half used
			if c := mustReserve(t, s, tc.req); c.Host != tc.want {
				t.Errorf("host %s, want %s", c.Host, tc.want)
			}
		})
	}
}

// Zone, OnlyHosts and AvoidHosts filter; unschedulable hosts are never
// chosen.
func TestFilters(t *testing.T) {
	newState := func() *State {
		s := New(Policy{})
		s.SetHost(countsHost("a", 16, 16384, 100), "z1", true)
		s.SetHost(countsHost("b", 16, 16384, 100), "z2", true)
		s.SetHost(countsHost("c", 32, 32768, 100), "z1", false)
		return s
	}
	for _, tc := range []struct {
		name string
		req  Request
		want string // "" for ErrNoValidHost
	}{
		{"any zone", Request{}, "a"},
		{"zone z1", Request{Zone: "z1"}, "a"},
		{"zone z2", Request{Zone: "z2"}, "b"},
		{"unknown zone", Request{Zone: "z3"}, ""},
		{"only b", Request{OnlyHosts: []string{"b"}}, "b"},
		{"only the unschedulable host", Request{OnlyHosts: []string{"c"}}, ""},
		{"only, empty", Request{OnlyHosts: []string{}}, ""},
		{"only an unknown host", Request{OnlyHosts: []string{"nope"}}, ""},
		{"only, twice", Request{OnlyHosts: []string{"b", "b"}}, "b"},
		{"avoid a", Request{AvoidHosts: []string{"a"}}, "b"},
		{"avoid a in z1", Request{Zone: "z1", AvoidHosts: []string{"a"}}, ""},
		{"only and avoid", Request{OnlyHosts: []string{"a", "b"}, AvoidHosts: []string{"a"}}, "b"},
		{"only and zone", Request{OnlyHosts: []string{"a", "b"}, Zone: "z2"}, "b"},
		{"too big for the schedulable hosts", Request{VCPUs: 20}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newState()
			tc.req.VCPUs = max(tc.req.VCPUs, 1)
			c, err := s.Reserve(tc.req)
			if tc.want == "" {
				if !errors.Is(err, ErrNoValidHost) {
					t.Errorf("got %+v, %v; want ErrNoValidHost", c, err)
				}
			} else if err != nil || c.Host != tc.want {
				t.Errorf("got %q, %v; want %s", c.Host, err, tc.want)
			}
			mustCheck(t, s)
		})
	}
	s := newState()
	s.SetSchedulable("c", true)
	if c := mustReserve(t, s, Request{VCPUs: 20}); c.Host != "c" {
		t.Errorf("after SetSchedulable: %s", c.Host)
	}
	s.SetSchedulable("c", false)
	if _, err := s.Reserve(Request{VCPUs: 1, OnlyHosts: []string{"c"}}); !errors.Is(err, ErrNoValidHost) {
		t.Errorf("disabled again: %v", err)
	}
	if u, _ := s.Usage("c"); u.VCPUsUsed != 20 {
		t.Errorf("disabling lost the claim: %+v", u)
	}
	s.SetSchedulable("nope", true) // ignored
	s.RemoveHost("a")
	if s.HasHost("a") || !s.HasHost("b") {
		t.Error("RemoveHost")
	}
	if c := mustReserve(t, s, Request{VCPUs: 1, Zone: "z2"}); c.Host != "b" {
		t.Errorf("after removal: %s", c.Host)
	}
	mustCheck(t, s)
}

// Weighers and soft (anti-)affinity: soft affinity first, then soft
// anti-affinity, then spread or pack, then the host name.
func TestWeighers(t *testing.T) {
	// a is empty, b half used, c three quarters used; all 16 vCPUs.
	hosts := []driver.Host{countsHost("a", 16, 16384, 100), countsHost("b", 16, 16384, 100), countsHost("c", 16, 16384, 100)}
	used := map[string]int{"b": 8, "c": 12}
	for _, tc := range []struct {
		name    string
		weigher string
		req     Request
		want    string
	}{
		{"spread", Spread, Request{}, "a"},
		{"pack", Pack, Request{}, "c"},
		{"pack skips a host that does not fit", Pack, Request{VCPUs: 6}, "b"},
		{"spread, memory counts too", Spread, Request{MemoryMB: 1}, "a"},
		{"prefer beats spread", Spread, Request{Prefer: map[string]int{"b": 1}}, "b"},
		{"more preferred wins", Spread, Request{Prefer: map[string]int{"b": 1, "c": 2}}, "c"},
		{"preferred host that does not fit", Spread, Request{VCPUs: 6, Prefer: map[string]int{"c": 3}}, "a"},
		{"prefer with unknown and zero counts", Pack, Request{Prefer: map[string]int{"x": 1, "a": 0}}, "c"},
		{"shun", Spread, Request{Shun: map[string]int{"a": 1}}, "b"},
		{"fewer shunned wins", Spread, Request{Shun: map[string]int{"a": 2, "b": 1}}, "c"},
		{"less shunned wins when all are", Pack, Request{Shun: map[string]int{"a": 1, "b": 1, "c": 3}}, "b"},
		{"prefer before shun", Spread, Request{Prefer: map[string]int{"c": 1}, Shun: map[string]int{"c": 5}}, "c"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := fleet(t, Policy{Weigher: tc.weigher}, hosts...)
			for h, n := range used {
				mustReserve(t, s, Request{VCPUs: n, MemoryMB: n * 1024, OnlyHosts: []string{h}})
			}
			tc.req.VCPUs = max(tc.req.VCPUs, 1)
			if c := mustReserve(t, s, tc.req); c.Host != tc.want {
				t.Errorf("host %s, want %s", c.Host, tc.want)
			}
			mustCheck(t, s)
		})
	}
	// Equal hosts: the lowest name, whatever the order they were added in.
	for _, w := range []string{Spread, Pack} {
		s := fleet(t, Policy{Weigher: w}, countsHost("y", 8, 8192, 10), countsHost("x", 8, 8192, 10), countsHost("z", 8, 8192, 10))
		if c := mustReserve(t, s, Request{VCPUs: 1}); c.Host != "x" {
			t.Errorf("%s tie: %s", w, c.Host)
		}
	}
	// Spread evens load out; pack fills one host before the next.
	for _, tc := range []struct {
		weigher string
		want    []string
	}{
		{Spread, []string{"a", "b", "a", "b"}},
		{Pack, []string{"a", "a", "b", "b"}},
	} {
		s := fleet(t, Policy{Weigher: tc.weigher}, countsHost("a", 4, 4096, 10), countsHost("b", 4, 4096, 10))
		var got []string
		for range 4 {
			got = append(got, mustReserve(t, s, Request{VCPUs: 2, MemoryMB: 1024}).Host)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.weigher, got, tc.want)
		}
	}
}

// A refusal takes nothing and leaves no mark behind.
func TestNoValidHostChangesNothing(t *testing.T) {
	hosts := []driver.Host{
		linuxHost("a", 2, 4, 8192, 0),
		withGPUs(linuxHost("g", 2, 4, 8192), gpuAt("0000:01:00.0", "L4", 0)),
	}
	s := fleet(t, Policy{KeepGPUHosts: true}, hosts...)
	mustReserve(t, s, Request{VCPUs: 3, MemoryMB: 4096, DiskGB: 100})
	mustReserve(t, s, Request{VCPUs: 1, GPUModel: "L4", GPUs: 1})
	before := usages(s, "a", "g")
	for _, req := range []Request{
		{VCPUs: 17},
		{VCPUs: 9, NUMANodes: 1},
		{VCPUs: 1, MemoryMB: 8193, NUMANodes: 1},
		{VCPUs: 1, DiskGB: 1001},
		{VCPUs: 1, GPUModel: "L4", GPUs: 1},
		{VCPUs: 1, GPUModel: "H100", GPUs: 1},
		{VCPUs: 1, Zone: "elsewhere"},
		{VCPUs: 1, AvoidHosts: []string{"a", "g"}, Prefer: map[string]int{"a": 1}, Shun: map[string]int{"g": 1}},
		{VCPUs: 1, OnlyHosts: []string{"a"}, AvoidHosts: []string{"a"}},
		{VCPUs: 5, NUMANodes: 5},
	} {
		if c, err := s.Reserve(req); !errors.Is(err, ErrNoValidHost) {
			t.Errorf("Reserve(%+v) = %+v, %v", req, c, err)
		}
		mustCheck(t, s) // also checks that no mark is left
		if after := usages(s, "a", "g"); !maps.Equal(before, after) {
			t.Fatalf("Reserve(%+v) changed usage %v -> %v", req, before, after)
		}
	}
}

func TestClaimMethods(t *testing.T) {
	c := Claim{Cells: []Cell{{Node: 1, CPUs: []int{9, 3}, MemoryMB: 100}, {Node: 0, CPUs: []int{5, 1}, MemoryMB: 28}}}
	if got := c.CPUs(); !slices.Equal(got, []int{1, 3, 5, 9}) {
		t.Errorf("CPUs %v", got)
	}
	if c.MemoryMB() != 128 {
		t.Errorf("MemoryMB %d", c.MemoryMB())
	}
	if (Claim{}).CPUs() == nil || len((Claim{}).CPUs()) != 0 || (Claim{}).MemoryMB() != 0 {
		t.Error("empty claim")
	}
}
