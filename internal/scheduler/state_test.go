package scheduler

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"nimbus/internal/driver"
)

// Apply refuses a claim that does not fit the state and then changes
// nothing.
func TestApplyConflicts(t *testing.T) {
	// Node 0: CPUs 0-3, 8-11; node 1: 4-7, 12-15; CPU 0 reserved; 8192 MB
	// per node, 1000 GB of disk.
	host := withGPUs(linuxHost("h", 2, 4, 8192, 0), gpuAt("0000:01:00.0", "L4", 0), gpuAt("0000:02:00.0", "L4", 1))
	existing := Claim{Host: "h", Cells: []Cell{{Node: 0, CPUs: []int{1, 9}, MemoryMB: 4096}}, GPUs: []string{"0000:01:00.0"}, DiskGB: 600}
	cell := func(node int, mem int, cpus ...int) []Cell { return []Cell{{Node: node, CPUs: cpus, MemoryMB: mem}} }
	for _, tc := range []struct {
		name  string
		claim Claim
		err   error
		says  string
	}{
		{"fits", Claim{Host: "h", Cells: cell(1, 8192, 4, 12), GPUs: []string{"0000:02:00.0"}, DiskGB: 400}, nil, ""},
		{"memory only", Claim{Host: "h", Cells: cell(0, 1024)}, nil, ""},
		{"unknown host", Claim{Host: "x", Cells: cell(0, 1, 2)}, ErrUnknownHost, `"x"`},
		{"CPU taken", Claim{Host: "h", Cells: cell(0, 1, 2, 9)}, ErrConflict, "CPU 9 is already taken"},
		{"CPU reserved", Claim{Host: "h", Cells: cell(0, 1, 0)}, ErrConflict, "CPU 0 is reserved"},
		{"unknown CPU", Claim{Host: "h", Cells: cell(0, 1, 99)}, ErrConflict, "no CPU 99"},
		{"negative CPU", Claim{Host: "h", Cells: cell(0, 1, -1)}, ErrConflict, "no CPU -1"},
		{"CPU on another node", Claim{Host: "h", Cells: cell(0, 1, 4)}, ErrConflict, "CPU 4 is on NUMA node 1"},
		{"CPU twice", Claim{Host: "h", Cells: cell(0, 1, 2, 2)}, ErrConflict, "CPU 2 named twice"},
		{"unknown node", Claim{Host: "h", Cells: cell(7, 1)}, ErrConflict, "no NUMA node 7"},
		{"node twice", Claim{Host: "h", Cells: append(cell(0, 1, 2), cell(0, 1, 3)...)}, ErrConflict, "named twice"},
		{"memory over on the node", Claim{Host: "h", Cells: cell(0, 4097, 2)}, ErrConflict, "4097 MB asked, 4096 free"},
		{"negative memory", Claim{Host: "h", Cells: cell(0, -1, 2)}, ErrConflict, "negative memory"},
		{"disk over", Claim{Host: "h", Cells: cell(1, 1, 4), DiskGB: 401}, ErrConflict, "401 GB of disk asked, 400 free"},
		{"negative disk", Claim{Host: "h", DiskGB: -1}, ErrConflict, "negative disk"},
		{"GPU taken", Claim{Host: "h", Cells: cell(1, 1, 4), GPUs: []string{"0000:01:00.0"}}, ErrConflict, "GPU 0000:01:00.0 is already taken"},
		{"unknown GPU", Claim{Host: "h", GPUs: []string{"0000:09:00.0"}}, ErrConflict, "no GPU"},
		{"GPU twice", Claim{Host: "h", GPUs: []string{"0000:02:00.0", "0000:02:00.0"}}, ErrConflict, "named twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := fleet(t, Policy{}, host)
			if err := s.Apply(existing); err != nil {
				t.Fatal(err)
			}
			before := usages(s, "h")
			err := s.Apply(tc.claim)
			if !errIs(err, tc.err) || (err != nil && !strings.Contains(err.Error(), tc.says)) {
				t.Fatalf("Apply = %v, want %v saying %q", err, tc.err, tc.says)
			}
			mustCheck(t, s)
			after := usages(s, "h")
			if tc.err != nil {
				if !maps.Equal(before, after) {
					t.Errorf("refused Apply changed usage %v -> %v", before, after)
				}
				return
			}
			b, a := before["h"], after["h"]
			if a.VCPUsUsed-b.VCPUsUsed != len(tc.claim.CPUs()) || a.MemoryUsedMB-b.MemoryUsedMB != tc.claim.MemoryMB() ||
				a.DiskUsedGB-b.DiskUsedGB != tc.claim.DiskGB || a.GPUsUsed-b.GPUsUsed != len(tc.claim.GPUs) {
				t.Errorf("usage %+v -> %+v for %+v", b, a, tc.claim)
			}
			// What was applied is never handed out again.
			for {
				c, err := s.Reserve(Request{VCPUs: 1})
				if err != nil {
					break
				}
				if slices.Contains(tc.claim.CPUs(), c.CPUs()[0]) || slices.Contains(existing.CPUs(), c.CPUs()[0]) {
					t.Fatalf("applied CPU %d reserved again", c.CPUs()[0])
				}
			}
			mustCheck(t, s)
		})
	}
}

// Release gives back exactly what the claim holds; the same resources can
// then be reserved again. Releasing twice, or on an unknown host, does
// nothing more.
func TestReleaseThenReserve(t *testing.T) {
	s := fleet(t, Policy{}, withGPUs(linuxHost("h", 1, 4, 8192), gpuAt("0000:01:00.0", "L4", 0)))
	var claims []Claim
	for {
		c, err := s.Reserve(Request{VCPUs: 2, MemoryMB: 1024, DiskGB: 10})
		if err != nil {
			break
		}
		claims = append(claims, c)
	}
	if len(claims) != 4 {
		t.Fatalf("%d claims", len(claims))
	}
	full := usages(s, "h")
	s.Release(claims[1])
	mustCheck(t, s)
	again := mustReserve(t, s, Request{VCPUs: 2, MemoryMB: 1024, DiskGB: 10})
	if !slices.Equal(again.CPUs(), claims[1].CPUs()) {
		t.Errorf("re-reserved %v, released %v", again.CPUs(), claims[1].CPUs())
	}
	if !maps.Equal(full, usages(s, "h")) {
		t.Errorf("usage after release and reserve: %v, was %v", usages(s, "h"), full)
	}
	s.Release(again)
	released := usages(s, "h")
	s.Release(again)                                   // twice
	s.Release(Claim{Host: "nope", Cells: again.Cells}) // unknown host
	s.Release(Claim{Host: "h", Cells: []Cell{{Node: 0, CPUs: []int{42}, MemoryMB: 1024}}})
	if !maps.Equal(released, usages(s, "h")) {
		t.Errorf("repeated or unknown release changed usage: %v -> %v", released, usages(s, "h"))
	}
	mustCheck(t, s)

	// A claim of memory and disk only is found by what it holds.
	memOnly := Claim{Host: "h", Cells: []Cell{{Node: 0, MemoryMB: 512}}, DiskGB: 5}
	if err := s.Apply(memOnly); err != nil {
		t.Fatal(err)
	}
	s.Release(Claim{Host: "h", Cells: []Cell{{Node: 0, MemoryMB: 256}}, DiskGB: 5}) // not that one
	if u, _ := s.Usage("h"); u.MemoryUsedMB != released["h"].MemoryUsedMB+512 {
		t.Errorf("a different claim was released: %+v", u)
	}
	s.Release(memOnly)
	if !maps.Equal(released, usages(s, "h")) {
		t.Errorf("memory-only release: %v, want %v", usages(s, "h"), released)
	}

	// GPUs come back too.
	g := mustReserve(t, s, Request{VCPUs: 1, GPUModel: "L4", GPUs: 1})
	if _, err := s.Reserve(Request{VCPUs: 1, GPUModel: "L4", GPUs: 1}); !errors.Is(err, ErrNoValidHost) {
		t.Fatalf("second GPU: %v", err)
	}
	s.Release(g)
	if g2 := mustReserve(t, s, Request{VCPUs: 1, GPUModel: "L4", GPUs: 1}); !slices.Equal(g2.GPUs, g.GPUs) {
		t.Errorf("GPU after release: %v", g2.GPUs)
	}
	mustCheck(t, s)
}

// SetHost on a known host replaces its inventory and keeps its claims.
func TestSetHostKeepsClaims(t *testing.T) {
	host := withGPUs(linuxHost("h", 2, 4, 8192, 0), gpuAt("0000:01:00.0", "L4", 1))
	s := fleet(t, Policy{}, host, countsHost("other", 64, 65536, 100))
	a := mustReserve(t, s, Request{VCPUs: 3, MemoryMB: 2048, DiskGB: 50, OnlyHosts: []string{"h"}})
	b := mustReserve(t, s, Request{VCPUs: 2, MemoryMB: 1024, GPUModel: "L4", GPUs: 1, NUMANodes: 1})
	before := usages(s, "h")

	s.SetHost(host, "nova", true) // same inventory
	mustCheck(t, s)
	if !maps.Equal(before, usages(s, "h")) {
		t.Fatalf("re-registration changed usage: %v -> %v", before, usages(s, "h"))
	}
	// Nothing held is given again; the GPU stays taken.
	if _, err := s.Reserve(Request{VCPUs: 1, GPUModel: "L4", GPUs: 1}); !errors.Is(err, ErrNoValidHost) {
		t.Errorf("held GPU reserved again: %v", err)
	}
	for {
		c, err := s.Reserve(Request{VCPUs: 1, OnlyHosts: []string{"h"}})
		if err != nil {
			break
		}
		if slices.Contains(a.CPUs(), c.CPUs()[0]) || slices.Contains(b.CPUs(), c.CPUs()[0]) {
			t.Fatalf("held CPU %d reserved again", c.CPUs()[0])
		}
		s.Release(c)
		if err := s.Apply(c); err != nil { // keep it, to walk on
			t.Fatal(err)
		}
	}

	// More memory, a new zone, disabled: claims stay and release still works.
	bigger := host
	bigger.NUMANodes = []driver.NUMANode{{ID: 0, MemoryMB: 16384}, {ID: 1, MemoryMB: 16384}}
	s.SetHost(bigger, "z9", false)
	mustCheck(t, s)
	u, _ := s.Usage("h")
	if u.MemoryMB != 32768 || u.MemoryUsedMB != before["h"].MemoryUsedMB || u.DiskUsedGB != 50 || u.GPUsUsed != 1 {
		t.Errorf("after growing: %+v", u)
	}
	if _, err := s.Reserve(Request{VCPUs: 1, Zone: "z9"}); !errors.Is(err, ErrNoValidHost) {
		t.Errorf("disabled host chosen: %v", err)
	}
	s.Release(a)
	s.Release(b)
	if u, _ := s.Usage("h"); u.MemoryUsedMB != 0 || u.DiskUsedGB != 0 || u.GPUsUsed != 0 {
		t.Errorf("after release: %+v", u)
	}
	mustCheck(t, s)

	// A host that shrank under its servers keeps them: it is full, and
	// Check says so.
	s2 := fleet(t, Policy{}, host)
	c := mustReserve(t, s2, Request{VCPUs: 2, MemoryMB: 6000, NUMANodes: 1})
	smaller := host
	smaller.NUMANodes = []driver.NUMANode{{ID: 0, MemoryMB: 4096}, {ID: 1, MemoryMB: 4096}}
	smaller.ReservedCPUs = []int{0, c.CPUs()[0]}
	s2.SetHost(smaller, "nova", true)
	if err := s2.Check(); err == nil {
		t.Error("Check passes on a host that shrank under its claims")
	}
	if _, err := s2.Reserve(Request{VCPUs: 1, MemoryMB: 1, OnlyHosts: []string{"h"}, NUMANodes: 1}); err != nil {
		// node 1 still has room
		t.Errorf("node with room refused: %v", err)
	}
	s2.Release(c)
	mustCheck(t, s2)

	// Removing a host forgets its claims; Apply then names it unknown.
	s2.RemoveHost("h")
	if err := s2.Apply(c); !errors.Is(err, ErrUnknownHost) {
		t.Errorf("Apply on a removed host: %v", err)
	}
	s2.RemoveHost("h") // ignored
	mustCheck(t, s2)
}

func TestUsage(t *testing.T) {
	s := fleet(t, Policy{}, withGPUs(linuxHost("h", 2, 4, 8192, 0, 8), gpuAt("a", "L4", 0), gpuAt("b", "L4", 1)))
	if _, ok := s.Usage("nope"); ok {
		t.Error("usage of an unknown host")
	}
	mustReserve(t, s, Request{VCPUs: 3, MemoryMB: 1000, DiskGB: 7, GPUModel: "L4", GPUs: 1})
	u, ok := s.Usage("h")
	want := HostUsage{VCPUs: 14, VCPUsUsed: 3, MemoryMB: 16384, MemoryUsedMB: 1000, DiskGB: 1000, DiskUsedGB: 7, GPUs: 2, GPUsUsed: 1}
	if !ok || u != want {
		t.Errorf("Usage = %+v, want %+v", u, want)
	}
}

// Many goroutines reserving at once never share a CPU, and every vCPU
// claimed is one taken from the free count.
func TestConcurrentReserve(t *testing.T) {
	var hosts []driver.Host
	names := []string{"h0", "h1", "h2", "h3", "h4"}
	for _, n := range names {
		hosts = append(hosts, linuxHost(n, 2, 8, 1<<20, 0, 16))
	}
	hosts[4] = withGPUs(hosts[4], gpuAt("g0", "L4", 0), gpuAt("g1", "L4", 1))
	s := fleet(t, Policy{KeepGPUHosts: true}, hosts...)
	free := 0
	for _, n := range names {
		u, _ := s.Usage(n)
		free += u.VCPUs - u.VCPUsUsed
	}
	const vcpus = 2
	var (
		mu     sync.Mutex
		claims []Claim
		wg     sync.WaitGroup
	)
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				req := Request{VCPUs: vcpus, MemoryMB: 512}
				if w%4 == 0 && i < 1 {
					req.GPUModel, req.GPUs = "L4", 1
				}
				c, err := s.Reserve(req)
				if errors.Is(err, ErrNoValidHost) {
					if req.GPUs > 0 {
						continue
					}
					return
				}
				if err != nil {
					t.Error(err)
					return
				}
				if i%5 == 0 { // churn: give some back and take them again
					s.Release(c)
					if err := s.Apply(c); err != nil {
						continue // another goroutine took them meanwhile
					}
				}
				s.Usage(c.Host)
				mu.Lock()
				claims = append(claims, c)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	mustCheck(t, s)
	used := 0
	held := map[string]bool{}
	for _, c := range claims {
		for _, id := range c.CPUs() {
			key := fmt.Sprintf("%s/%d", c.Host, id)
			if held[key] {
				t.Fatalf("CPU %s held twice", key)
			}
			held[key] = true
		}
	}
	for _, n := range names {
		u, _ := s.Usage(n)
		used += u.VCPUsUsed
	}
	if len(claims)*vcpus != used || used != free {
		t.Errorf("%d claims × %d vCPUs, %d used, %d were free", len(claims), vcpus, used, free)
	}
}

// A randomized walk over random hosts: reserve, release, apply again,
// re-register and disable, with Check after every step and every claim
// compared with its request.
func TestRandomized(t *testing.T) {
	models := []string{"A100", "L4", "H100"}
	for seed := range uint64(40) {
		r := rand.New(rand.NewPCG(seed, 7))
		var hosts []driver.Host
		for i := range 1 + r.IntN(6) {
			name := string(rune('a' + i))
			var h driver.Host
			if r.IntN(4) == 0 {
				h = countsHost(name, 2*(1+r.IntN(40)), 1024*(1+r.IntN(64)), r.IntN(500))
			} else {
				h = linuxHost(name, 1+r.IntN(4), 1+r.IntN(8), 512*(1+r.IntN(32)))
				h.DiskGB = r.IntN(500)
				for range r.IntN(3) {
					h.ReservedCPUs = append(h.ReservedCPUs, r.IntN(len(h.CPUs)+2))
				}
			}
			for g := range r.IntN(4) {
				h.GPUs = append(h.GPUs, gpuAt(name+string(rune('0'+g)), models[r.IntN(3)], r.IntN(3)))
			}
			hosts = append(hosts, h)
		}
		byName := map[string]driver.Host{}
		for _, h := range hosts {
			byName[h.Name] = h
		}
		s := New(Policy{Weigher: []string{Spread, Pack}[r.IntN(2)], KeepGPUHosts: r.IntN(2) == 0})
		for _, h := range hosts {
			s.SetHost(h, []string{"z1", "z2"}[r.IntN(2)], true)
		}
		var live, gone []Claim
		for step := range 300 {
			switch op := r.IntN(10); {
			case op < 5:
				req := Request{VCPUs: 1 + r.IntN(12), MemoryMB: r.IntN(6000), DiskGB: r.IntN(60), NUMANodes: r.IntN(4)}
				req.NUMANodes = min(req.NUMANodes, req.VCPUs)
				if r.IntN(4) == 0 {
					req.GPUModel, req.GPUs = models[r.IntN(3)], 1+r.IntN(2)
				}
				if r.IntN(5) == 0 {
					req.Zone = "z1"
				}
				if r.IntN(5) == 0 {
					req.AvoidHosts = []string{hosts[r.IntN(len(hosts))].Name}
				}
				if r.IntN(6) == 0 {
					req.Prefer = map[string]int{hosts[r.IntN(len(hosts))].Name: 1}
				}
				c, err := s.Reserve(req)
				if errors.Is(err, ErrNoValidHost) {
					break
				}
				if err != nil {
					t.Fatalf("seed %d step %d: %v", seed, step, err)
				}
				if err := claimOK(byName[c.Host], req, c); err != nil {
					t.Fatalf("seed %d step %d: %v", seed, step, err)
				}
				if slices.Contains(req.AvoidHosts, c.Host) {
					t.Fatalf("seed %d step %d: avoided host %s chosen", seed, step, c.Host)
				}
				live = append(live, c)
			case op < 8 && len(live) > 0:
				k := r.IntN(len(live))
				s.Release(live[k])
				gone = append(gone, live[k])
				live = slices.Delete(live, k, k+1)
			case op == 8 && len(gone) > 0:
				k := r.IntN(len(gone))
				if err := s.Apply(gone[k]); err == nil {
					live = append(live, gone[k])
					gone = slices.Delete(gone, k, k+1)
				} else if !errors.Is(err, ErrConflict) {
					t.Fatalf("seed %d step %d: Apply: %v", seed, step, err)
				}
			case op == 9 && r.IntN(4) == 0:
				// A host leaves and comes back: its claims are forgotten.
				h := hosts[r.IntN(len(hosts))]
				s.RemoveHost(h.Name)
				if s.HasHost(h.Name) {
					t.Fatalf("seed %d step %d: %s still there", seed, step, h.Name)
				}
				s.SetHost(h, "z2", true)
				for k := 0; k < len(live); {
					if live[k].Host == h.Name {
						gone = append(gone, live[k])
						live = slices.Delete(live, k, k+1)
					} else {
						k++
					}
				}
			default:
				h := hosts[r.IntN(len(hosts))]
				if r.IntN(2) == 0 {
					s.SetHost(h, "z1", r.IntN(3) > 0)
				} else {
					s.SetSchedulable(h.Name, r.IntN(3) > 0)
				}
			}
			if err := s.Check(); err != nil {
				t.Fatalf("seed %d step %d: %v", seed, step, err)
			}
		}
		// The claims the walk holds are exactly what the state counts.
		used := map[string]int{}
		for _, c := range live {
			used[c.Host] += len(c.CPUs())
		}
		for _, h := range hosts {
			if u, _ := s.Usage(h.Name); u.VCPUsUsed != used[h.Name] {
				t.Fatalf("seed %d: host %s uses %d vCPUs, claims hold %d", seed, h.Name, u.VCPUsUsed, used[h.Name])
			}
		}
		for _, c := range live {
			s.Release(c)
		}
		for _, h := range hosts {
			if u, _ := s.Usage(h.Name); u.VCPUsUsed+u.MemoryUsedMB+u.DiskUsedGB+u.GPUsUsed != 0 {
				t.Fatalf("seed %d: %s not empty after releasing everything: %+v", seed, h.Name, u)
			}
		}
		mustCheck(t, s)
	}
}

// TestZone checks that a host's zone is the one it was last set with,
// across hosts sharing zones and a host moved to another.
func TestZone(t *testing.T) {
	s := New(Policy{})
	s.SetHost(countsHost("a", 4, 1024, 10), "nova", true)
	s.SetHost(countsHost("b", 4, 1024, 10), "east", true)
	s.SetHost(countsHost("c", 4, 1024, 10), "nova", false)
	s.SetHost(countsHost("b", 4, 1024, 10), "west", true)
	for _, tc := range []struct {
		host, zone string
		ok         bool
	}{
		{"a", "nova", true},
		{"b", "west", true},
		{"c", "nova", true},
		{"d", "", false},
	} {
		if z, ok := s.Zone(tc.host); z != tc.zone || ok != tc.ok {
			t.Errorf("Zone(%q) = %q, %v; want %q, %v", tc.host, z, ok, tc.zone, tc.ok)
		}
	}
}
