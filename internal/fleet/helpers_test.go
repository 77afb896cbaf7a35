package fleet_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"nimbus/internal/agent"
	"nimbus/internal/driver"
	"nimbus/internal/driver/fake"
	"nimbus/internal/fleet"
	"nimbus/internal/fleet/wire"
	"nimbus/internal/store"
	"nimbus/internal/testenv"
)

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
		cfg.Log = testenv.Log()
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
		Heartbeat: 200 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, Log: testenv.Log()})
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

// placements is compute's record of servers' hosts, as tests set it.
type placements struct {
	mu sync.Mutex
	m  map[string]string // server → host
}

func (p *placements) set(server, host string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = map[string]string{}
	}
	p.m[server] = host
}

func (p *placements) ServerHosts(ctx context.Context, q store.Querier, ids []string) (map[string]string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]string{}
	for _, id := range ids {
		if h, ok := p.m[id]; ok {
			out[id] = h
		}
	}
	return out, nil
}

// logBuffer collects a controller's log lines.
type logBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// agentClient calls the agent API over HTTPS with one agent's credential.
type agentClient struct {
	t    testing.TB
	hc   *http.Client
	url  string
	cred string
}

func newAgentClient(t testing.TB, c *controller, cred string) *agentClient {
	pool := x509.NewCertPool()
	pool.AddCert(c.srv.Certificate())
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	return &agentClient{t: t, hc: hc, url: c.srv.URL, cred: cred}
}

// do sends one call and answers its status and body.
func (a *agentClient) do(method, path, body string) (int, string) {
	a.t.Helper()
	req, err := http.NewRequest(method, a.url+path, strings.NewReader(body))
	if err != nil {
		a.t.Fatal(err)
	}
	if a.cred != "" {
		req.Header.Set("Authorization", "Bearer "+a.cred)
	}
	resp, err := a.hc.Do(req)
	if err != nil {
		a.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// enrolAgent makes an agent presenting host, heartbeating it up; it
// answers the agent's id and a client with its credential.
func enrolAgent(t testing.TB, c *controller, name, host string) (string, *agentClient) {
	t.Helper()
	id, cred, err := c.svc.NewAgent(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	a := newAgentClient(t, c, cred)
	if st, body := a.do("PUT", wire.PathHosts, `{"hosts":[{"name":"`+host+`","vcpus":4,"memory_mb":4096,"up":true}]}`); st != 200 ||
		!strings.Contains(body, `"registered":["`+host+`"]`) {
		t.Fatalf("register %s: %d %s", host, st, body)
	}
	return id, a
}
