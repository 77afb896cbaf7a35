package main

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"nimbus/internal/cloud"
	"nimbus/internal/metering"
)

// benchCharge is the hourly charging pass over n metered servers in 500
// projects: the periods are written straight into the store (as compute
// would have), two passes bring the job to its steady state, and the third
// is timed, with the peak Go heap while it runs.
func benchCharge(c *cloud.Cloud, n int) error {
	ctx := context.Background()
	cur := time.Now().UTC().Truncate(time.Hour)
	spec := metering.ServerSpec("bench", 2, 4096, 40, map[string]string{"nimbus:disk_type": "network"}, "")
	periods := make([]metering.Opening, n)
	for i := range periods {
		periods[i] = metering.Opening{Kind: metering.KindServer, Resource: uuid.NewString(),
			Project: fmt.Sprintf("bench-project-%d", i%500), Spec: spec, At: cur}
	}
	if err := metering.OpenMany(ctx, c.DB, periods); err != nil {
		return err
	}
	for h := 1; h <= 2; h++ {
		if _, err := c.Billing.ChargeUntil(ctx, cur.Add(time.Duration(h)*time.Hour+5*time.Second)); err != nil {
			return err
		}
	}
	var peak atomic.Uint64
	stop := make(chan struct{})
	go func() {
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
		}
	}()
	start := time.Now()
	res, err := c.Billing.ChargeUntil(ctx, cur.Add(3*time.Hour+5*time.Second))
	d := time.Since(start)
	close(stop)
	if err != nil {
		return err
	}
	fmt.Printf("charge: one hourly pass over %d servers: %d charges in %v (%.0f/s), peak Go heap %.1f MB\n",
		n, res.Charges, d.Round(time.Millisecond), float64(res.Charges)/d.Seconds(), float64(peak.Load())/(1<<20))
	return nil
}
