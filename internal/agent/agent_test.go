package agent_test

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"net"
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

// spawnCounter is a fake driver that counts spawns.
type spawnCounter struct {
	*fake.Driver
	mu     sync.Mutex
	spawns map[string]int
}

func newSpawnCounter(t *testing.T, delay time.Duration) *spawnCounter {
	t.Helper()
	d, err := fake.New(fake.Config{Delay: delay, Hosts: []driver.Host{{Name: "h1", VCPUs: 8, MemoryMB: 8192, DiskGB: 100, Up: true}}})
	if err != nil {
		t.Fatal(err)
	}
	return &spawnCounter{Driver: d, spawns: map[string]int{}}
}

func (d *spawnCounter) Spawn(ctx context.Context, spec driver.Spec) error {
	d.mu.Lock()
	d.spawns[spec.ServerID]++
	d.mu.Unlock()
	return d.Driver.Spawn(ctx, spec)
}

func (d *spawnCounter) n(id string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.spawns[id]
}

// fakeController speaks the agent API with one op to deliver, and can
// lose its answers to result posts.
type fakeController struct {
	mu         sync.Mutex
	op         wire.Op
	ignoreHave bool // deliver the op even to an agent that has it
	loseAnswer int  // result posts whose answer is lost (connection cut)
	posts      int  // result posts received for the op
	accepted   bool
}

func (f *fakeController) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	reply := func(v any) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(v)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	switch r.URL.Path {
	case wire.PathHosts:
		reply(wire.HostsResponse{Registered: []string{"h1"}})
	case wire.PathHeartbeat:
		reply(wire.HeartbeatResponse{DownAfterSeconds: 60, Hosts: []string{"h1"}})
	case wire.PathPoll:
		var req wire.PollRequest
		json.NewDecoder(r.Body).Decode(&req)
		has := false
		for _, id := range req.Have {
			has = has || id == f.op.ID
		}
		if f.accepted || (has && !f.ignoreHave) {
			f.mu.Unlock()
			time.Sleep(50 * time.Millisecond) // a short long-poll
			f.mu.Lock()
			reply(wire.PollResponse{Ops: []wire.Op{}})
			return
		}
		reply(wire.PollResponse{Ops: []wire.Op{f.op}})
	case wire.PathResults:
		var req wire.ResultsRequest
		json.NewDecoder(r.Body).Decode(&req)
		for _, res := range req.Results {
			if res.OpID == f.op.ID {
				f.posts++
			}
		}
		if f.loseAnswer > 0 {
			f.loseAnswer--
			// The controller recorded it, but the answer never arrives.
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.Close()
			return
		}
		f.accepted = true
		done := []string{}
		for _, res := range req.Results {
			done = append(done, res.OpID)
		}
		reply(wire.ResultsResponse{Done: done})
	default:
		http.NotFound(w, r)
	}
}

func writeCA(t *testing.T, srv *httptest.Server) string {
	t.Helper()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	return ca
}

// start runs an agent until the returned stop is called.
func start(t *testing.T, cfg agent.Config) (stop func()) {
	t.Helper()
	a, err := agent.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("agent: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// TestJournal: an op delivered again while it runs is not started again,
// and one delivered again after its result was lost — to an agent
// restarted meanwhile — is answered from the journal, not run again.
func TestJournal(t *testing.T) {
	spec, _ := json.Marshal(driver.Spec{ServerID: "s1", Host: "h1", VCPUs: 1, MemoryMB: 512})
	fc := &fakeController{op: wire.Op{ID: "op-1", Key: "s1/spawn", Host: "h1", ServerID: "s1", Kind: wire.KindSpawn, Args: spec},
		ignoreHave: true, loseAnswer: 1 << 30}
	srv := httptest.NewTLSServer(fc)
	defer srv.Close()
	dir := t.TempDir()
	if err := agent.SaveIdentity(dir, agent.Identity{AgentID: "a1", Credential: "a1.secret"}); err != nil {
		t.Fatal(err)
	}
	drv := newSpawnCounter(t, 50*time.Millisecond) // a spawn takes 150 ms: polls deliver it again meanwhile
	cfg := agent.Config{ControllerURL: srv.URL, CACertFile: writeCA(t, srv), DataDir: dir, Driver: drv,
		Heartbeat: time.Second, MaxBackoff: 100 * time.Millisecond, Log: testenv.Log()}
	stop := start(t, cfg)
	testenv.Eventually(t, 10*time.Second, "a result post", func() bool {
		fc.mu.Lock()
		defer fc.mu.Unlock()
		return fc.posts >= 1
	})
	stop()
	if n := drv.n("s1"); n != 1 {
		t.Fatalf("spawned %d times while delivered again and again", n)
	}
	fc.mu.Lock()
	fc.loseAnswer = 1 // and once more after the restart
	fc.mu.Unlock()

	// A new agent process on the same data directory: the controller still
	// has the op pending and delivers it again.
	start(t, cfg)
	testenv.Eventually(t, 10*time.Second, "the result accepted", func() bool {
		fc.mu.Lock()
		defer fc.mu.Unlock()
		return fc.accepted
	})
	if n := drv.n("s1"); n != 1 {
		t.Fatalf("spawned %d times across a restart", n)
	}
	fc.mu.Lock()
	posts := fc.posts
	fc.mu.Unlock()
	if posts < 3 {
		t.Errorf("result posted %d times, want at least two lost and the accepted one", posts)
	}
}

// TestEnrolment: a first start without a token or with a refused one
// stops with a clear error; with a good one the credential is saved (mode
// 0600) and reused, without a token, by the next start.
func TestEnrolment(t *testing.T) {
	db, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "nimbus.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	svc := fleet.New(db, fleet.Config{Log: testenv.Log()})
	srv := httptest.NewTLSServer(svc.Handler())
	defer func() { svc.Close(); srv.Close() }()
	dir := t.TempDir()
	cfg := agent.Config{ControllerURL: srv.URL, CACertFile: writeCA(t, srv), DataDir: dir, Driver: newSpawnCounter(t, 0),
		Heartbeat: 100 * time.Millisecond, Log: testenv.Log()}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := agent.Run(ctx, cfg); err == nil {
		t.Fatal("an agent started without identity or token")
	}
	cfg.Token = "nimbus-enrol-wrong"
	if err := agent.Run(ctx, cfg); err == nil {
		t.Fatal("an agent started with a wrong token")
	}
	tok, _ := svc.CreateToken(ctx, time.Hour)
	cfg.Token = tok
	stop := start(t, cfg)
	testenv.Eventually(t, 10*time.Second, "host registered", func() bool {
		hs, _ := svc.Hosts(ctx)
		return len(hs) == 1 && hs[0].Up
	})
	stop()
	st, err := os.Stat(filepath.Join(dir, agent.IdentityFile))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("identity file: %v %v", st, err)
	}
	// A clean stop put the host down at once.
	if hs, _ := svc.Hosts(ctx); len(hs) != 1 || hs[0].Up || hs[0].Health != fleet.StoppedHealth {
		t.Fatalf("hosts after a clean stop: %+v", hs)
	}
	cfg.Token = "" // spent; the saved credential is enough
	start(t, cfg)
	testenv.Eventually(t, 10*time.Second, "host up again", func() bool {
		hs, _ := svc.Hosts(ctx)
		return len(hs) == 1 && hs[0].Up
	})
	if err := svc.Spawn(ctx, driver.Spec{ServerID: "s1", Host: "h1"}); err != nil {
		t.Fatal(err)
	}
}

// controllerAt serves a fleet on db at addr (":0" style "127.0.0.1:0" picks
// one) over TLS; stop ends it, leaving db open.
func controllerAt(t *testing.T, db *store.DB, addr string) (svc *fleet.Service, srv *httptest.Server, stop func()) {
	t.Helper()
	var ln net.Listener
	var err error
	for i := 0; i < 50; i++ { // the old socket may linger a moment
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		t.Fatal(err)
	}
	svc = fleet.New(db, fleet.Config{Log: testenv.Log(), PollInterval: 50 * time.Millisecond})
	srv = httptest.NewUnstartedServer(svc.Handler())
	srv.Listener.Close()
	srv.Listener = ln
	srv.StartTLS()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); svc.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			svc.Close()
			srv.Close()
			cancel()
			<-done
		})
	}
	t.Cleanup(stop)
	return svc, srv, stop
}

// TestReconnect: the controller goes away and comes back on the same
// port; the agent reconnects, runs the op made while it was away (by the
// old controller, which still waits for it) and new ones.
func TestReconnect(t *testing.T) {
	ctx := context.Background()
	db, err := store.Open(ctx, filepath.Join(t.TempDir(), "nimbus.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	svc1, srv1, stop1 := controllerAt(t, db, "127.0.0.1:0")
	addr := srv1.Listener.Addr().String()
	dir := t.TempDir()
	id, cred, err := svc1.NewAgent(ctx, "a1")
	if err != nil {
		t.Fatal(err)
	}
	agent.SaveIdentity(dir, agent.Identity{AgentID: id, Credential: cred})
	drv := newSpawnCounter(t, 0)
	start(t, agent.Config{ControllerURL: srv1.URL, CACertFile: writeCA(t, srv1), DataDir: dir, Driver: drv,
		Heartbeat: 100 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, Log: testenv.Log()})
	testenv.Eventually(t, 10*time.Second, "host up", func() bool {
		hs, _ := svc1.Hosts(ctx)
		return len(hs) == 1 && hs[0].Up
	})
	if err := svc1.Spawn(ctx, driver.Spec{ServerID: "s1", Host: "h1"}); err != nil {
		t.Fatal(err)
	}

	// The controller's listener goes away; its service keeps waiting for a
	// power off made meanwhile.
	svc1.Close()
	srv1.Close()
	off := make(chan error, 1)
	go func() { off <- svc1.PowerOff(ctx, "s1", false) }()
	time.Sleep(300 * time.Millisecond) // the agent fails to reach it a few times

	svc2, _, _ := controllerAt(t, db, addr)
	select {
	case err := <-off:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the op made while the controller was away did not run")
	}
	stop1()
	if err := svc2.Spawn(ctx, driver.Spec{ServerID: "s2", Host: "h1"}); err != nil {
		t.Fatal(err)
	}
	if p, _ := drv.State(ctx, "s1"); p != driver.Shutdown {
		t.Errorf("s1 is %v", p)
	}
	if drv.n("s1") != 1 || drv.n("s2") != 1 {
		t.Errorf("spawns %v", drv.spawns)
	}
}

// TestDefaultName: an agent without --name is the machine's host name and
// a short id, kept in its data directory: the same after a restart,
// different for another agent on a machine of the same host name.
func TestDefaultName(t *testing.T) {
	host, _ := os.Hostname()
	dir1, dir2 := t.TempDir(), t.TempDir()
	n1, err := agent.DefaultName(dir1)
	if err != nil || !strings.HasPrefix(n1, host+"-") || len(n1) != len(host)+7 {
		t.Fatalf("default name %q %v", n1, err)
	}
	if again, err := agent.DefaultName(dir1); again != n1 || err != nil {
		t.Fatalf("after a restart %q %v, want %q", again, err, n1)
	}
	if n2, err := agent.DefaultName(dir2); n2 == n1 || err != nil {
		t.Fatalf("two agents both named %q (%v)", n2, err)
	}
	if st, err := os.Stat(filepath.Join(dir1, agent.NameFile)); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("name file %v %v", st, err)
	}
}
