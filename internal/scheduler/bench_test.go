package scheduler

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"

	"nimbus/internal/driver"
)

// The stated target: one Reserve among 10,000 hosts holding 100,000
// servers takes a median under 1 ms on a 2-core machine.
const (
	benchHosts   = 10_000
	benchServers = 100_000
)

// benchFleet builds the target's state under weigher: 10,000 hosts of two
// NUMA nodes × 32 threads with one core (two threads) reserved per node,
// 256 GiB and 4 TB, then 100,000 servers of 1-8 vCPUs (4 GiB per vCPU, 40
// GB of disk) on random hosts, so that hosts are unevenly full. It returns
// the state and the heap the state holds, in MB.
func benchFleet(b *testing.B, weigher string) (*State, float64) {
	names := make([]string, benchHosts)
	for i := range names {
		names[i] = fmt.Sprintf("compute-%05d", i)
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	s := New(Policy{Weigher: weigher, KeepGPUHosts: true})
	for _, n := range names {
		s.SetHost(driver.Host{Name: n, VCPUs: 64, MemoryMB: 256 << 10, DiskGB: 4000, ReservedCPUs: []int{0, 1, 32, 33}}, "nova", true)
	}
	r := rand.New(rand.NewPCG(1, 2))
	only := make([]string, 1)
	for placed := 0; placed < benchServers; {
		v := 1 + r.IntN(8)
		only[0] = names[r.IntN(benchHosts)]
		if _, err := s.Reserve(Request{VCPUs: v, MemoryMB: v * 4096, DiskGB: 40, OnlyHosts: only}); err == nil {
			placed++
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if err := s.Check(); err != nil {
		b.Fatal(err)
	}
	return s, float64(after.HeapAlloc-before.HeapAlloc) / (1 << 20)
}

func benchReserve(b *testing.B, weigher string) {
	s, mb := benchFleet(b, weigher)
	r := rand.New(rand.NewPCG(3, 4))
	samples := make([]time.Duration, 1<<16)
	n := 0
	b.ReportAllocs()
	for b.Loop() {
		v := 1 + r.IntN(8)
		t0 := time.Now()
		c, err := s.Reserve(Request{VCPUs: v, MemoryMB: v * 4096, DiskGB: 40})
		if err != nil {
			b.Fatal(err)
		}
		s.Release(c)
		samples[n%len(samples)] = time.Since(t0)
		n++
	}
	k := min(n, len(samples))
	slices.Sort(samples[:k])
	b.ReportMetric(float64(samples[k/2].Nanoseconds()), "median-ns")
	b.ReportMetric(mb, "state-MB")
	if err := s.Check(); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkReserve is one Reserve and its Release under spread.
func BenchmarkReserve(b *testing.B) { benchReserve(b, Spread) }

// BenchmarkReservePack is the same under pack.
func BenchmarkReservePack(b *testing.B) { benchReserve(b, Pack) }
