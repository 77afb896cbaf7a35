package billing

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"nimbus/internal/store/storetest"
)

// BenchmarkChargeHour is one hourly charging run over 100,000 servers
// usage periods, on each engine. Each iteration is the next hour's run: it
// reads every period, skips the hour the last run charged and charges the
// new one, as the job does every hour. It reports the peak Go heap seen while
// the run was going and the most memory the Go runtime held from the OS
// (which includes the benchmark's own setup).
func BenchmarkChargeHour(b *testing.B) {
	const servers = 100_000
	for _, e := range storetest.Engines(b) {
		b.Run(e.Name, func(b *testing.B) {
			db := openDB(b, e.URL)
			start := at("2026-03-01T00:00:00Z")
			svs := make([]testServer, servers)
			for i := range svs {
				svs[i] = stdServer(uuid.NewString(), fmt.Sprintf("project-%d", i%500), start) // random, as compute's ids
			}
			insertServers(b, db, svs)
			svs = nil
			s := New(db, Config{})
			// The first pass ever, and the next hour's, which re-reads the
			// first hour for servers it has not seen charged: after them
			// every run is the steady state, one new hour per server.
			now := start.Add(5 * time.Second)
			mustCharge(b, s, now)
			now = now.Add(time.Hour)
			mustCharge(b, s, now)
			var peak, peakSys atomic.Uint64
			stop := make(chan struct{})
			done := make(chan struct{})
			go func() {
				defer close(done)
				var ms runtime.MemStats
				for {
					select {
					case <-stop:
						return
					case <-time.After(20 * time.Millisecond):
					}
					runtime.ReadMemStats(&ms)
					if ms.HeapAlloc > peak.Load() {
						peak.Store(ms.HeapAlloc)
					}
					if ms.Sys > peakSys.Load() {
						peakSys.Store(ms.Sys)
					}
				}
			}()
			b.ResetTimer()
			for b.Loop() {
				now = now.Add(time.Hour)
				r, err := s.ChargeUntil(context.Background(), now)
				if err != nil {
					b.Fatal(err)
				}
				if r.Charges != servers {
					b.Fatalf("charged %d, want %d", r.Charges, servers)
				}
			}
			b.StopTimer()
			close(stop)
			<-done
			b.ReportMetric(float64(peak.Load())/(1<<20), "peak-heap-MB")
			b.ReportMetric(float64(peakSys.Load())/(1<<20), "peak-sys-MB")
		})
	}
}

// BenchmarkCover is the spending gate a server create asks, for a project
// that already runs servers (1, 100 or 2,000) started this hour, none of
// them charged yet: the funds are the balance and credit less what the
// hour now running owes, so the gate prices the project's open periods.
func BenchmarkCover(b *testing.B) {
	for _, e := range storetest.Engines(b) {
		for _, n := range []int{1, 100, 2000} {
			b.Run(fmt.Sprintf("%s/%d-servers", e.Name, n), func(b *testing.B) {
				db := openDB(b, e.URL)
				now := time.Now().UTC()
				svs := make([]testServer, n)
				for i := range svs {
					svs[i] = stdServer(uuid.NewString(), "busy", now)
				}
				insertServers(b, db, svs)
				s := New(db, Config{DefaultCreditLimit: MaxAmount})
				spec := svs[0].spec()
				b.ResetTimer()
				for b.Loop() {
					if _, err := s.Cover(context.Background(), "busy", "server", spec, 1, 1); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
