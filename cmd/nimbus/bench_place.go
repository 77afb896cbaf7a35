package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"time"

	"nimbus/internal/cloud"
	"nimbus/internal/driver"
	"nimbus/internal/driver/fake"
)

// benchPlace is the scheduler's end-to-end figure: creates through the API,
// one server per POST, onto a fleet of as many fake hosts of realistic shape
// (two sockets of 16 cores with two threads, one core each kept for the
// host, 256 GiB), timed from the first POST to the last server ACTIVE, with
// the memory the process holds before and after.
func benchPlace(dbURL string, hosts, creates, workers int, wait time.Duration) error {
	fleet := make([]driver.Host, hosts)
	for i := range fleet {
		h := driver.Host{Name: fmt.Sprintf("place-%05d", i), MemoryMB: 256 * 1024, DiskGB: 2000, Zone: "nova",
			Hypervisor: "fake", Up: true}
		fake.Topology(&h, 2, 16, 1)
		fleet[i] = h
	}
	_, b, stop, err := startBenchCloud("place", dbURL, fleet, workers, wait)
	if err != nil {
		return err
	}
	defer stop()
	heap0, rss0 := memNow()
	start := time.Now()
	if err := b.createToActive(creates, 1, workers); err != nil {
		return err
	}
	took := time.Since(start)
	heap1, rss1 := memNow()
	fmt.Printf("%-40s%8.2f s   (%d servers onto %d hosts, %d clients)\n", "place: creates to ACTIVE:", took.Seconds(), creates, hosts, workers)
	fmt.Printf("%-40s%8.1f MB  heap %.1f → %.1f MB, RSS %.1f → %.1f MB\n", "place: memory held:", heap1-heap0, heap0, heap1, rss0, rss1)
	return nil
}

// startBenchCloud starts a cloud on the fleet in a fresh data directory
// (SQLite unless dbURL) and an admin client without quotas; stop closes
// both and removes the directory.
func startBenchCloud(name, dbURL string, fleet []driver.Host, workers int, wait time.Duration) (*cloud.Cloud, *benchClient, func(), error) {
	dir, err := os.MkdirTemp("", "nimbus-bench-"+name+"-")
	if err != nil {
		return nil, nil, nil, err
	}
	c, err := cloud.Start(context.Background(), cloud.Config{
		DataDir: dir, DatabaseURL: dbURL, Listen: "127.0.0.1", Fleet: fleet,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, nil, err
	}
	stop := func() { c.Close(); os.RemoveAll(dir) }
	b, err := newBenchClient(c, workers, wait)
	if err == nil {
		err = b.unlimitedQuota()
	}
	if err != nil {
		stop()
		return nil, nil, nil, err
	}
	return c, b, stop, nil
}

// memNow is the Go heap in use after a collection and the resident set, in MB.
func memNow() (heapMB, rssMB float64) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return float64(ms.HeapInuse) / (1 << 20), float64(rssOf("self")) / (1 << 20)
}
