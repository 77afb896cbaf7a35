package billing

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"nimbus/internal/store/storetest"
)

// passCounter counts the charging passes logged, whoever logs them.
type passCounter struct {
	n *atomic.Int32
}

func (h passCounter) Enabled(context.Context, slog.Level) bool { return true }
func (h passCounter) Handle(_ context.Context, r slog.Record) error {
	if r.Message == "billing: charging pass" {
		h.n.Add(1)
	}
	return nil
}
func (h passCounter) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h passCounter) WithGroup(string) slog.Handler      { return h }

// TestChargePassOncePerRegion: three controllers' billing started at
// once on one database run the hour's charging pass once between them
// (its trial expiry and running-dry checks with it), not once each, and
// none runs it again within the hour. Today's code runs it on every
// controller, at every start.
func TestChargePassOncePerRegion(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, url string) {
		var passes atomic.Int32
		log := slog.New(passCounter{n: &passes})
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		t.Cleanup(func() { cancel(); wg.Wait() })
		for range 3 {
			b := New(openDB(t, url), Config{Log: log})
			wg.Add(1)
			go func() { defer wg.Done(); b.Run(ctx) }()
		}
		time.Sleep(1500 * time.Millisecond)
		if n := passes.Load(); n != 1 {
			t.Fatalf("%d charging passes by 3 controllers in 1.5 s, want 1", n)
		}
	})
}
