package fleet_test

import (
	"context"
	"encoding/pem"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"nimbus/internal/agent"
	"nimbus/internal/driver"
	"nimbus/internal/driver/fake"
	"nimbus/internal/fleet"
	"nimbus/internal/store"
)

// testLog discards, unless NIMBUS_TEST_LOG is set.
func testLog() *slog.Logger {
	if os.Getenv("NIMBUS_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// controller is a fleet service on its own database handle, serving the
// agent API over HTTPS on loopback.
type controller struct {
	db  *store.DB
	svc *fleet.Service
	srv *httptest.Server
	ca  string // PEM file of the server's certificate
}

func newController(t testing.TB, dbURL string, cfg fleet.Config) *controller {
	t.Helper()
	ctx := context.Background()
	db, err := store.Open(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Log == nil {
		cfg.Log = testLog()
	}
	svc := fleet.New(db, cfg)
	srv := httptest.NewTLSServer(svc.Handler())
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); svc.Run(runCtx) }()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	c := &controller{db: db, svc: svc, srv: srv, ca: ca}
	t.Cleanup(func() {
		svc.Close()
		srv.Close()
		cancel()
		wg.Wait()
		db.Close()
	})
	return c
}

// countingDriver is a fake driver that counts the calls it runs.
type countingDriver struct {
	*fake.Driver
	mu    sync.Mutex
	calls map[string]int // "spawn:<id>", "power_off:<id>", …
}

func newCounting(t testing.TB, hosts ...string) *countingDriver {
	t.Helper()
	var hs []driver.Host
	for _, h := range hosts {
		hs = append(hs, driver.Host{Name: h, VCPUs: 64, MemoryMB: 1 << 18, DiskGB: 1000, Up: true})
	}
	d, err := fake.New(fake.Config{Hosts: hs})
	if err != nil {
		t.Fatal(err)
	}
	return &countingDriver{Driver: d, calls: map[string]int{}}
}

func (d *countingDriver) count(op, id string) {
	d.mu.Lock()
	d.calls[op+":"+id]++
	d.mu.Unlock()
}

func (d *countingDriver) n(op, id string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.calls[op+":"+id]
}

func (d *countingDriver) Spawn(ctx context.Context, spec driver.Spec) error {
	d.count("spawn", spec.ServerID)
	return d.Driver.Spawn(ctx, spec)
}

func (d *countingDriver) PowerOff(ctx context.Context, id string, graceful bool) error {
	d.count("power_off", id)
	return d.Driver.PowerOff(ctx, id, graceful)
}

func (d *countingDriver) PowerOn(ctx context.Context, id string) error {
	d.count("power_on", id)
	return d.Driver.PowerOn(ctx, id)
}

// runAgent runs an agent for c with drv until the test ends (or stop is
// called), and waits until it is ready.
func runAgent(t testing.TB, c *controller, drv driver.Driver, dir string) (a *agent.Agent, stop func()) {
	t.Helper()
	ctx := context.Background()
	if _, err := agent.LoadIdentity(dir); err != nil {
		id, cred, err := c.svc.NewAgent(ctx, "test")
		if err != nil {
			t.Fatal(err)
		}
		if err := agent.SaveIdentity(dir, agent.Identity{AgentID: id, Credential: cred}); err != nil {
			t.Fatal(err)
		}
	}
	a, err := agent.New(agent.Config{ControllerURL: c.srv.URL, CACertFile: c.ca, DataDir: dir, Driver: drv,
		Heartbeat: 200 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, Log: testLog()})
	if err != nil {
		t.Fatal(err)
	}
	actx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); a.Run(actx) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	select {
	case <-a.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("agent not ready")
	}
	return a, stop
}
