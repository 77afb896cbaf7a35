package doctor_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"nimbus/internal/billing"
	"nimbus/internal/doctor"
	"nimbus/internal/metering"
	"nimbus/internal/scheduler"
	"nimbus/internal/store"
)

// BenchmarkDoctor runs doctor over n placed servers (NIMBUS_DOCTOR_SERVERS,
// default 20,000) on 1,000 hosts, each with its claim, pinned pCPU and
// usage period, and six billed hours, on SQLite, and reports the run's
// time and peak Go heap: doctor pages, so the heap stays flat as n grows.
func BenchmarkDoctor(b *testing.B) {
	n := 20000
	if v, err := strconv.Atoi(os.Getenv("NIMBUS_DOCTOR_SERVERS")); err == nil && v > 0 {
		n = v
	}
	ctx := context.Background()
	url := filepath.Join(b.TempDir(), "nimbus.db")
	db, err := store.Open(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	now := time.Now().UTC()
	cur := now.Truncate(time.Hour)
	at := store.FormatTime(cur.Add(-6 * time.Hour))
	ids := make([]string, n)
	for i := range ids {
		ids[i] = uuid.NewString()
	}
	const hosts, per = 1000, 400
	for lo := 0; lo < n; lo += per {
		hi := min(n, lo+per)
		var sv, cl, it []string
		var svArgs, clArgs, itArgs []any
		for i := lo; i < hi; i++ {
			host := fmt.Sprintf("h-%d", i%hosts)
			cpu := i / hosts
			cells := store.JSON([]scheduler.Cell{{Node: 0, CPUs: []int{cpu}, MemoryMB: 2048}})
			sv = append(sv, "(?, 'p', 'u', 's', 'active', ?, 'd1', 'r', ?, ?, '{}')")
			svArgs = append(svArgs, ids[i], host, at, at)
			cl = append(cl, "(?, ?, ?, '[]', 20, ?)")
			clArgs = append(clArgs, ids[i], host, cells, at)
			it = append(it, "(?, ?, ?)")
			itArgs = append(itArgs, host, "cpu:"+strconv.Itoa(cpu), ids[i])
		}
		for _, q := range []struct {
			sql  string
			args []any
		}{
			{"INSERT INTO compute_servers (id, project_id, user_id, name, vm_state, host, flavor_id, reservation_id, created_at, updated_at, doc) VALUES " + strings.Join(sv, ","), svArgs},
			{"INSERT INTO compute_claims (server_id, host, cells, gpus, disk_gb, created_at) VALUES " + strings.Join(cl, ","), clArgs},
			{"INSERT INTO compute_claim_items (host, item, server_id) VALUES " + strings.Join(it, ","), itArgs},
		} {
			if _, err := db.Exec(ctx, q.sql, q.args...); err != nil {
				b.Fatal(err)
			}
		}
	}
	for h := 0; h < hosts; h++ {
		k := int64(n / hosts)
		if h < n%hosts {
			k++
		}
		if _, err := db.Exec(ctx, "INSERT INTO compute_host_capacity (host, node, total, used) VALUES (?, 0, 1000000, ?), (?, -1, 100000, ?)",
			fmt.Sprintf("h-%d", h), 2048*k, fmt.Sprintf("h-%d", h), 20*k); err != nil {
			b.Fatal(err)
		}
	}
	spec := metering.ServerSpec("bench", 1, 2048, 20, map[string]string{"nimbus:disk_type": "local"}, "")
	openings := make([]metering.Opening, n)
	for i := range openings {
		openings[i] = metering.Opening{Kind: metering.KindServer, Resource: ids[i], Project: "p", Spec: spec, At: cur.Add(-6 * time.Hour)}
	}
	if err := metering.OpenMany(ctx, db, openings); err != nil {
		b.Fatal(err)
	}
	if _, err := db.Exec(ctx, "INSERT INTO billing_state (name, value) VALUES ('charged_through', ?)", store.FormatTime(cur.Add(-7*time.Hour))); err != nil {
		b.Fatal(err)
	}
	svc := billing.New(db, billing.Config{})
	for {
		res, err := svc.ChargeUntil(ctx, now)
		if err != nil {
			b.Fatal(err)
		}
		if res.CaughtUp {
			break
		}
	}
	ro, err := store.OpenReadOnly(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	defer ro.Close()
	runtime.GC()
	b.ResetTimer()
	for range b.N {
		var peak atomic.Uint64
		stop := make(chan struct{})
		go func() {
			var ms runtime.MemStats
			for {
				select {
				case <-stop:
					return
				case <-time.After(10 * time.Millisecond):
				}
				runtime.ReadMemStats(&ms)
				if ms.HeapAlloc > peak.Load() {
					peak.Store(ms.HeapAlloc)
				}
			}
		}()
		start := time.Now()
		rep, err := doctor.Run(ctx, ro, doctor.Config{BillingHours: 6}, func(f doctor.Finding) { b.Errorf("%+v", f) })
		close(stop)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(peak.Load())/(1<<20), "peak-heap-MB")
		b.Logf("doctor over %d servers, 6 billed hours: %v, %d findings, peak Go heap %.1f MB", n, time.Since(start).Round(time.Millisecond),
			rep.Total, float64(peak.Load())/(1<<20))
	}
}
