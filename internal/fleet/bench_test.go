package fleet_test

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"nimbus/internal/driver"
	"nimbus/internal/fleet"
)

// BenchmarkSpawn measures spawns through the fleet and a local agent over
// HTTPS, from six callers at once as compute's workers on SQLite.
func BenchmarkSpawn(b *testing.B) {
	c := newController(b, filepath.Join(b.TempDir(), "nimbus.db"), fleet.Config{})
	hosts := []string{"h1"}
	for i := range 199 {
		hosts = append(hosts, fmt.Sprintf("h%d", i+2))
	}
	drv := newCounting(b, hosts...)
	runAgent(b, c, drv, b.TempDir())
	ctx := context.Background()
	var n atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := n.Add(1)
				if i > int64(b.N) {
					return
				}
				if err := c.svc.Spawn(ctx, driver.Spec{ServerID: fmt.Sprintf("s-%d", i), Host: "h1"}); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}
