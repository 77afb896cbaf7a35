package fleet_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"nimbus/internal/driver"
	"nimbus/internal/driver/fake"
	"nimbus/internal/fleet"
	"nimbus/internal/fleet/wire"
	"nimbus/internal/store/storetest"
	"nimbus/internal/testenv"
)

// clock is a settable clock for the fleet.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// httpClient trusts the controller's certificate.
func httpClient(t *testing.T, c *controller) *http.Client {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AddCert(c.srv.Certificate())
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
}

// TestAgentAPI covers enrolment (tokens are one-time, expire, and a bad
// one is 401) and the API's answers to bad requests: JSON errors, never a
// 500.
func TestAgentAPI(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, dbURL string) {
		clk := &clock{t: time.Now()}
		c := newController(t, dbURL, fleet.Config{Now: clk.now})
		ctx := context.Background()
		hc := httpClient(t, c)
		do := func(method, path, cred, body string) (int, wire.ErrorBody, string) {
			t.Helper()
			req, _ := http.NewRequest(method, c.srv.URL+path, strings.NewReader(body))
			if cred != "" {
				req.Header.Set("Authorization", "Bearer "+cred)
			}
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("%s %s: content type %q", method, path, ct)
			}
			var eb wire.ErrorBody
			json.Unmarshal(b, &eb)
			return resp.StatusCode, eb, string(b)
		}
		enrol := func(tok string) (int, wire.EnrolResponse) {
			t.Helper()
			st, _, body := do("POST", wire.PathEnrol, "", `{"token":"`+tok+`","name":"hv-1"}`)
			var er wire.EnrolResponse
			json.Unmarshal([]byte(body), &er)
			return st, er
		}

		tok, err := c.svc.CreateToken(ctx, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		st, er := enrol(tok)
		if st != http.StatusCreated || er.AgentID == "" || !strings.HasPrefix(er.Credential, er.AgentID+".") {
			t.Fatalf("enrol: %d %+v", st, er)
		}
		if st, _ := enrol(tok); st != http.StatusUnauthorized {
			t.Errorf("a token used twice: %d, want 401", st)
		}
		old, _ := c.svc.CreateToken(ctx, time.Minute)
		clk.add(2 * time.Minute)
		if st, _ := enrol(old); st != http.StatusUnauthorized {
			t.Errorf("an expired token: %d, want 401", st)
		}
		if _, err := c.svc.CreateToken(ctx, 0); err == nil {
			t.Error("a token without a lifetime was made")
		}
		cred := er.Credential
		id, sec, _ := strings.Cut(cred, ".")

		big := `{"token":"` + strings.Repeat("x", 5000) + `"}`
		for _, tc := range []struct {
			method, path, cred, body string
			status                   int
			code                     string
		}{
			{"POST", wire.PathEnrol, "", `{"token":"nimbus-enrol-nope"}`, 401, wire.CodeUnauthorized},
			{"POST", wire.PathEnrol, "", `{"token":"guess"}`, 401, wire.CodeUnauthorized},
			{"POST", wire.PathEnrol, "", `{"token":`, 400, wire.CodeBadRequest},
			{"POST", wire.PathEnrol, "", ``, 400, wire.CodeBadRequest},
			{"POST", wire.PathEnrol, "", `[1,2]`, 400, wire.CodeBadRequest},
			{"POST", wire.PathEnrol, "", `{"token":"nimbus-enrol-x","name":"two words"}`, 400, wire.CodeBadRequest},
			{"POST", wire.PathEnrol, "", big, 413, wire.CodeTooLarge},
			{"GET", wire.PathEnrol, "", ``, 405, wire.CodeMethod},
			{"POST", "/v1/agent/nothing", cred, `{}`, 404, wire.CodeNotFound},
			{"PUT", wire.PathHosts, "", `{"hosts":[]}`, 401, wire.CodeUnauthorized},
			{"PUT", wire.PathHosts, "nonsense", `{"hosts":[]}`, 401, wire.CodeUnauthorized},
			{"PUT", wire.PathHosts, id + ".wrong-secret", `{"hosts":[]}`, 401, wire.CodeUnauthorized},
			{"PUT", wire.PathHosts, "no-such-agent." + sec, `{"hosts":[]}`, 401, wire.CodeUnauthorized},
			{"PUT", wire.PathHosts, cred, `{"hosts":[{"name":""}]}`, 400, wire.CodeBadRequest},
			{"PUT", wire.PathHosts, cred, `{"hosts":[{"name":"a"},{"name":"a"}]}`, 400, wire.CodeBadRequest},
			{"PUT", wire.PathHosts, cred, `{"hosts":[{"name":"a","vcpus":-1}]}`, 400, wire.CodeBadRequest},
			{"PUT", wire.PathHosts, cred, `{"hosts":"many"}`, 400, wire.CodeBadRequest},
			{"POST", wire.PathHeartbeat, cred, `{"hosts":[]}`, 400, wire.CodeBadRequest},
			{"POST", wire.PathHeartbeat, cred, `{"observed":1,"instances":[{"id":""}]}`, 400, wire.CodeBadRequest},
			{"POST", wire.PathPoll, cred, `{"have":5}`, 400, wire.CodeBadRequest},
			{"POST", wire.PathResults, cred, `{"results":[{"op_id":""}]}`, 400, wire.CodeBadRequest},
			{"POST", wire.PathResults, cred, `{"results":[{"op_id":"x","ok":false}]}`, 400, wire.CodeBadRequest},
			{"POST", wire.PathResults, cred, `{"results":[{"op_id":"x","ok":true,"observed":"soon"}]}`, 400, wire.CodeBadRequest},
		} {
			st, eb, body := do(tc.method, tc.path, tc.cred, tc.body)
			if st != tc.status || eb.Error.Code != tc.code || eb.Error.Message == "" {
				t.Errorf("%s %s %.60s: %d %s, want %d %s", tc.method, tc.path, tc.body, st, body, tc.status, tc.code)
			}
		}

		// The enrolled agent's calls work.
		for _, tc := range []struct{ method, path, body string }{
			{"PUT", wire.PathHosts, `{"hosts":[{"name":"hv-1","vcpus":8,"memory_mb":16384,"disk_gb":100,"up":true}]}`},
			{"POST", wire.PathHeartbeat, `{"observed":1,"hosts":[{"name":"hv-1","up":true}]}`},
			{"POST", wire.PathPoll, `{"have":[],"wait_ms":0}`},
			{"POST", wire.PathResults, `{"results":[{"op_id":"unknown","ok":true}]}`},
		} {
			if st, _, body := do(tc.method, tc.path, cred, tc.body); st != http.StatusOK {
				t.Errorf("%s %s: %d %s", tc.method, tc.path, st, body)
			}
		}
		hosts, err := c.svc.Hosts(ctx)
		if err != nil || len(hosts) != 1 || !hosts[0].Up || hosts[0].VCPUs != 8 {
			t.Fatalf("hosts %+v %v", hosts, err)
		}
	})
}

// TestOps runs driver calls through an agent: a key names one op (asked
// again, it is not run again), a failed op's key gets a new attempt, and
// the calls answer as the driver contract says.
func TestOps(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, dbURL string) {
		c := newController(t, dbURL, fleet.Config{})
		drv := newCounting(t, "h1")
		runAgent(t, c, drv, t.TempDir())
		ctx := context.Background()
		key := func(k string) context.Context { return driver.WithOpKey(ctx, k) }

		spec := driver.Spec{ServerID: "s1", Host: "h1", VCPUs: 1, MemoryMB: 512, Name: "one"}
		for range 2 {
			if err := c.svc.Spawn(key("s1/spawning/req-1"), spec); err != nil {
				t.Fatal(err)
			}
		}
		if n := drv.n("spawn", "s1"); n != 1 {
			t.Fatalf("spawn with one key ran %d times", n)
		}
		if p, err := c.svc.State(ctx, "s1"); err != nil || p != driver.Running {
			t.Fatalf("state after spawn: %v %v", p, err)
		}

		drv.FailNext(fake.OpPowerOff, errors.New("injected: the guest would not stop"))
		err := c.svc.PowerOff(key("s1/powering-off/req-2"), "s1", true)
		if err == nil || !strings.Contains(err.Error(), "injected") {
			t.Fatalf("failed power off: %v", err)
		}
		for range 2 {
			if err := c.svc.PowerOff(key("s1/powering-off/req-2"), "s1", true); err != nil {
				t.Fatalf("retried power off: %v", err)
			}
		}
		if n := drv.n("power_off", "s1"); n != 2 {
			t.Fatalf("power off ran %d times, want 2 (the failure and one retry)", n)
		}
		if p, _ := c.svc.State(ctx, "s1"); p != driver.Shutdown {
			t.Fatalf("state after power off: %v", p)
		}
		// The key names a step, which may do several kinds of work: the
		// same key with another kind is other work, done once too.
		for range 2 {
			if err := c.svc.PowerOn(key("s1/powering-off/req-2"), "s1"); err != nil {
				t.Fatalf("another kind under the step's key: %v", err)
			}
		}
		if n := drv.n("power_on", "s1"); n != 1 {
			t.Fatalf("keyed power on ran %d times, want 1", n)
		}
		// Without a key every call is its own op.
		for range 2 {
			if err := c.svc.PowerOn(ctx, "s1"); err != nil {
				t.Fatal(err)
			}
		}
		if n := drv.n("power_on", "s1"); n != 3 {
			t.Fatalf("power on ran %d times, want 3 (one keyed, two unkeyed)", n)
		}

		if out, err := c.svc.ConsoleOutput(ctx, "s1", 3); err != nil || strings.Count(out, "\n") != 3 {
			t.Errorf("console %q %v", out, err)
		}
		if size, err := c.svc.Snapshot(ctx, "s1", ""); err != nil || size <= 0 {
			t.Errorf("snapshot %d %v", size, err)
		}
		if err := c.svc.Resize(ctx, driver.Spec{ServerID: "s1", VCPUs: 2, MemoryMB: 1024}); err != nil {
			t.Errorf("resize on its own host: %v", err)
		}
		list, err := c.svc.List(ctx)
		if err != nil || len(list) != 1 || list[0].ID != "s1" || list[0].Host != "h1" || list[0].Power != driver.Running {
			t.Errorf("list %+v %v", list, err)
		}
		if err := c.svc.PowerOn(ctx, "nope"); !errors.Is(err, driver.ErrNotFound) {
			t.Errorf("unknown server: %v", err)
		}
		if err := c.svc.Destroy(ctx, "nope"); err != nil {
			t.Errorf("destroying an unknown server: %v", err)
		}
		if err := c.svc.Spawn(ctx, driver.Spec{ServerID: "s2", Host: "elsewhere"}); err == nil {
			t.Error("spawn on an unregistered host")
		}
		// A failed spawn leaves the server's host known, so a destroy
		// reaches it.
		drv.FailNext(fake.OpSpawn, errors.New("injected: no image"))
		if err := c.svc.Spawn(ctx, driver.Spec{ServerID: "s3", Host: "h1"}); err == nil {
			t.Fatal("injected spawn failure lost")
		}
		if err := c.svc.Destroy(ctx, "s3"); err != nil {
			t.Fatalf("destroy after a failed spawn: %v", err)
		}
		if err := c.svc.Destroy(ctx, "s1"); err != nil {
			t.Fatal(err)
		}
		if _, err := c.svc.State(ctx, "s1"); !errors.Is(err, driver.ErrNotFound) {
			t.Errorf("state of a destroyed server: %v", err)
		}
		if err := c.svc.PowerOn(ctx, "s1"); !errors.Is(err, driver.ErrNotFound) {
			t.Errorf("power on a destroyed server: %v", err)
		}
		if list, _ := c.svc.List(ctx); len(list) != 0 {
			t.Errorf("list after destroy %+v", list)
		}
	})
}

// TestHostDown: a host its agent reports unhealthy, or whose agent stops
// heartbeating for DownAfter, is down; calls for it answer ErrHostDown at
// once, and a call waiting when the host goes down stops waiting. A keyed
// op stays for the caller to ask again; one without a key is withdrawn.
func TestHostDown(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, dbURL string) {
		c := newController(t, dbURL, fleet.Config{DownAfter: time.Second, PollInterval: 50 * time.Millisecond})
		drv := newCounting(t, "h1")
		dir := t.TempDir()
		a, stop := runAgent(t, c, drv, dir)
		ctx := context.Background()
		if err := c.svc.Spawn(ctx, driver.Spec{ServerID: "s1", Host: "h1"}); err != nil {
			t.Fatal(err)
		}
		up := func() bool {
			hs, err := c.svc.Hosts(ctx)
			return err == nil && len(hs) == 1 && hs[0].Up
		}

		// Unhealthy by the agent's report.
		drv.SetHostUp("h1", false)
		if err := a.Heartbeat(ctx); err != nil {
			t.Fatal(err)
		}
		hs, _ := c.svc.Hosts(ctx)
		if hs[0].Up || hs[0].Health == "" {
			t.Fatalf("reported down: %+v", hs[0])
		}
		start := time.Now()
		if err := c.svc.PowerOff(ctx, "s1", true); !errors.Is(err, driver.ErrHostDown) {
			t.Fatalf("call on a down host: %v", err)
		}
		if d := time.Since(start); d > 500*time.Millisecond {
			t.Errorf("ErrHostDown took %s", d)
		}
		drv.SetHostUp("h1", true)
		if err := a.Heartbeat(ctx); err != nil {
			t.Fatal(err)
		}
		if !up() {
			t.Fatal("host not back up")
		}

		// Silent: the agent stops while calls wait, and its word that it
		// stops is lost (as when it is killed): the hosts stay up until
		// DownAfter passes without heartbeats.
		stop()
		if _, err := c.db.Exec(ctx, "UPDATE fleet_hosts SET up = 1, health = ''"); err != nil {
			t.Fatal(err)
		}
		errs := make(chan error, 2)
		go func() { errs <- c.svc.PowerOff(ctx, "s1", true) }()
		go func() { errs <- c.svc.Reboot(driver.WithOpKey(ctx, "s1/reboot/r1"), "s1", true) }()
		for range 2 {
			select {
			case err := <-errs:
				if !errors.Is(err, driver.ErrHostDown) {
					t.Fatalf("waiting call: %v, want ErrHostDown", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("a waiting call did not see its host go down")
			}
		}
		if up() {
			t.Fatal("host up without its agent")
		}
		var unkeyed, keyed string
		c.db.QueryRow(ctx, "SELECT state FROM fleet_ops WHERE kind = 'power_off'").Scan(&unkeyed)
		c.db.QueryRow(ctx, "SELECT state FROM fleet_ops WHERE op_key = 's1/reboot/r1/reboot'").Scan(&keyed)
		if unkeyed != "failed" || keyed != "pending" {
			t.Fatalf("ops after the host went down: unkeyed %q (want failed), keyed %q (want pending)", unkeyed, keyed)
		}

		// The agent comes back: the keyed op runs once, when asked again.
		runAgent(t, c, drv, dir)
		testenv.Eventually(t, 10*time.Second, "host back up", up)
		if err := c.svc.Reboot(driver.WithOpKey(ctx, "s1/reboot/r1"), "s1", true); err != nil {
			t.Fatal(err)
		}
		if n := drv.n("power_off", "s1"); n != 0 {
			t.Errorf("the withdrawn power off ran %d times", n)
		}
	})
}

// TestOpTimeout: an op no agent takes fails after OpTimeout, and is not
// delivered afterwards.
func TestOpTimeout(t *testing.T) {
	c := newController(t, filepath.Join(t.TempDir(), "nimbus.db"), fleet.Config{OpTimeout: 300 * time.Millisecond})
	ctx := context.Background()
	id, _, err := c.svc.NewAgent(ctx, "silent")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.svc.Register(ctx, id, []driver.Host{{Name: "h1", VCPUs: 4, MemoryMB: 4096, Up: true}}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = c.svc.Spawn(ctx, driver.Spec{ServerID: "s1", Host: "h1"})
	if err == nil || !strings.Contains(err.Error(), "timed out") {
		t.Fatalf("spawn nobody takes: %v", err)
	}
	if d := time.Since(start); d < 300*time.Millisecond || d > 3*time.Second {
		t.Errorf("timed out after %s", d)
	}
	ops, err := c.svc.Poll(ctx, id, nil, 0)
	if err != nil || len(ops) != 0 {
		t.Fatalf("a timed-out op delivered: %+v %v", ops, err)
	}
}

// TestPowerListener: a heartbeat's power state that differs from the
// stored one is told to the listener; a report older than the stored one,
// or a VM first seen, is not; a VM gone from its host is NoState. Reports
// for other agents' hosts change nothing.
func TestPowerListener(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, dbURL string) {
		c := newController(t, dbURL, fleet.Config{})
		ctx := context.Background()
		var mu sync.Mutex
		var heard []string
		c.svc.SetPowerListener(func(id string, p driver.PowerState) {
			mu.Lock()
			heard = append(heard, fmt.Sprintf("%s:%d", id, p))
			mu.Unlock()
		})
		a1, _, _ := c.svc.NewAgent(ctx, "a1")
		a2, _, _ := c.svc.NewAgent(ctx, "a2")
		c.svc.Register(ctx, a1, []driver.Host{{Name: "h1", VCPUs: 4, MemoryMB: 4096, Up: true}})
		c.svc.Register(ctx, a2, []driver.Host{{Name: "h2", VCPUs: 4, MemoryMB: 4096, Up: true}})
		beat := func(agent string, observed int64, insts ...wire.Instance) {
			t.Helper()
			host := "h1"
			if agent == a2 {
				host = "h2"
			}
			if _, err := c.svc.Heartbeat(ctx, agent, wire.Heartbeat{Observed: observed,
				Hosts: []wire.HostStatus{{Name: host, Up: true}}, Instances: insts}); err != nil {
				t.Fatal(err)
			}
		}
		power := func(id string) driver.PowerState {
			p, _ := c.svc.State(ctx, id)
			return p
		}
		beat(a1, 10, wire.Instance{ID: "s1", Host: "h1", Power: driver.Running}, wire.Instance{ID: "s2", Host: "h1", Power: driver.Running})
		beat(a1, 20, wire.Instance{ID: "s1", Host: "h1", Power: driver.Shutdown}, wire.Instance{ID: "s2", Host: "h1", Power: driver.Running})
		beat(a1, 15, wire.Instance{ID: "s1", Host: "h1", Power: driver.Running}) // late: ignored
		if power("s1") != driver.Shutdown || power("s2") != driver.Running {
			t.Fatalf("after a late report: s1 %v, s2 %v", power("s1"), power("s2"))
		}
		beat(a2, 30, wire.Instance{ID: "s1", Host: "h1", Power: driver.Paused}) // not a2's host
		beat(a1, 40, wire.Instance{ID: "s1", Host: "h1", Power: driver.Shutdown})
		mu.Lock()
		got := strings.Join(heard, " ")
		mu.Unlock()
		if want := "s1:4 s2:0"; got != want { // Shutdown, then NoState
			t.Fatalf("listener heard %q, want %q", got, want)
		}
		if power("s2") != driver.NoState {
			t.Errorf("a vanished VM is %v", power("s2"))
		}
	})
}

// TestRedelivery: an op whose poll answer was lost comes again; one the
// agent says it has does not; a result posted twice is recorded once.
func TestRedelivery(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, dbURL string) {
		c := newController(t, dbURL, fleet.Config{})
		ctx := context.Background()
		id, _, _ := c.svc.NewAgent(ctx, "a1")
		c.svc.Register(ctx, id, []driver.Host{{Name: "h1", VCPUs: 4, MemoryMB: 4096, Up: true}})
		c.svc.Heartbeat(ctx, id, wire.Heartbeat{Observed: 1, Hosts: []wire.HostStatus{{Name: "h1", Up: true}}})
		done := make(chan error, 1)
		go func() { done <- c.svc.Spawn(ctx, driver.Spec{ServerID: "s1", Host: "h1"}) }()

		ops, err := c.svc.Poll(ctx, id, nil, 5*time.Second)
		if err != nil || len(ops) != 1 || ops[0].Kind != wire.KindSpawn || ops[0].ServerID != "s1" {
			t.Fatalf("poll: %+v %v", ops, err)
		}
		again, _ := c.svc.Poll(ctx, id, nil, 0)
		if len(again) != 1 || again[0].ID != ops[0].ID {
			t.Fatalf("after a lost answer: %+v", again)
		}
		if held, _ := c.svc.Poll(ctx, id, []string{ops[0].ID}, 0); len(held) != 0 {
			t.Fatalf("an op the agent has came again: %+v", held)
		}
		p := driver.Running
		res := wire.Result{OpID: ops[0].ID, OK: true, Power: &p, Observed: 2}
		for range 2 {
			got, err := c.svc.Record(ctx, id, []wire.Result{res})
			if err != nil || len(got) != 1 || got[0] != ops[0].ID {
				t.Fatalf("record: %v %v", got, err)
			}
		}
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the caller did not get the result")
		}
		if left, _ := c.svc.Poll(ctx, id, nil, 0); len(left) != 0 {
			t.Fatalf("a finished op came again: %+v", left)
		}
		// A result for an op of another agent's host is dropped.
		other, _, _ := c.svc.NewAgent(ctx, "a2")
		go func() { done <- c.svc.PowerOff(ctx, "s1", false) }()
		testenv.Eventually(t, 5*time.Second, "power off op", func() bool {
			ops, _ = c.svc.Poll(ctx, id, nil, 0)
			return len(ops) == 1
		})
		c.svc.Record(ctx, other, []wire.Result{{OpID: ops[0].ID, OK: false, Error: &wire.Error{Code: "failed", Message: "not yours"}}})
		if still, _ := c.svc.Poll(ctx, id, nil, 0); len(still) != 1 {
			t.Fatal("another agent finished our op")
		}
		c.svc.Record(ctx, id, []wire.Result{{OpID: ops[0].ID, OK: true}})
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})
}

// TestSharedDatabase: two controllers on one PostgreSQL database. An op
// made on one reaches the agent connected to the other, and its result
// comes back to the caller on the first.
func TestSharedDatabase(t *testing.T) {
	url, err := storetest.FreshPostgres(t)
	if err != nil {
		if os.Getenv("NIMBUS_REQUIRE_POSTGRES") == "1" {
			t.Fatalf("PostgreSQL is required: %v", err)
		}
		t.Skipf("no PostgreSQL: %v", err)
	}
	cfg := fleet.Config{PollInterval: 50 * time.Millisecond}
	a := newController(t, url, cfg)
	b := newController(t, url, cfg)
	drv := newCounting(t, "h1")
	runAgent(t, b, drv, t.TempDir())
	ctx := context.Background()
	start := time.Now()
	if err := a.svc.Spawn(ctx, driver.Spec{ServerID: "s1", Host: "h1"}); err != nil {
		t.Fatal(err)
	}
	t.Logf("spawn across controllers took %s", time.Since(start))
	if err := b.svc.PowerOff(ctx, "s1", false); err != nil {
		t.Fatal(err)
	}
	if err := a.svc.PowerOn(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	if drv.n("spawn", "s1") != 1 || drv.n("power_off", "s1") != 1 || drv.n("power_on", "s1") != 1 {
		t.Fatalf("calls %v", drv.calls)
	}
	hs, err := a.svc.Hosts(ctx)
	if err != nil || len(hs) != 1 || !hs[0].Up {
		t.Fatalf("hosts seen from the other controller: %+v %v", hs, err)
	}
}

// TestLostOp: an op whose row vanishes from the database while its agent
// runs it (a commit lost with a PostgreSQL primary) ends the caller's wait
// within LostCheck, not OpTimeout; the agent's result for it is dropped,
// and the caller asking again with its key gets a new op that runs.
func TestLostOp(t *testing.T) {
	c := newController(t, filepath.Join(t.TempDir(), "nimbus.db"), fleet.Config{LostCheck: 200 * time.Millisecond})
	drv := &gatedDriver{countingDriver: newCounting(t, "h1"), gate: make(chan struct{})}
	runAgent(t, c, drv, t.TempDir())
	ctx := driver.WithOpKey(context.Background(), "spawn-s1")
	errc := make(chan error, 1)
	start := time.Now()
	go func() { errc <- c.svc.Spawn(ctx, driver.Spec{ServerID: "s1", Host: "h1"}) }()
	for deadline := time.Now().Add(5 * time.Second); drv.n("spawn", "s1") == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the agent never ran the spawn")
		}
	}
	if _, err := c.db.Exec(ctx, "DELETE FROM fleet_ops WHERE server_id = 's1'"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if err == nil || !strings.Contains(err.Error(), "no longer recorded") {
			t.Fatalf("spawn whose op vanished: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("spawn whose op vanished still waits after %s", time.Since(start))
	}
	close(drv.gate)
	if err := c.svc.Spawn(ctx, driver.Spec{ServerID: "s1", Host: "h1"}); err != nil {
		t.Fatalf("spawn asked again: %v", err)
	}
	if n := drv.n("spawn", "s1"); n != 2 {
		t.Errorf("spawn ran %d times, want 2 (the lost op, then the new one)", n)
	}
	if p, err := drv.State(ctx, "s1"); err != nil || p != driver.Running {
		t.Errorf("s1 after the spawn asked again: %v %v", p, err)
	}
}

// gatedDriver holds every spawn until gate is closed.
type gatedDriver struct {
	*countingDriver
	gate chan struct{}
}

func (d *gatedDriver) Spawn(ctx context.Context, spec driver.Spec) error {
	d.count("spawn", spec.ServerID)
	select {
	case <-d.gate:
	case <-ctx.Done():
		return ctx.Err()
	}
	return d.Driver.Spawn(ctx, spec)
}
