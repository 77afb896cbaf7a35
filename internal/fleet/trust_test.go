package fleet_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"nimbus/internal/driver"
	"nimbus/internal/fleet"
	"nimbus/internal/fleet/wire"
	"nimbus/internal/store/storetest"
)

// TestHeartbeatOwnership: an agent's heartbeat speaks only for its own
// hosts and for the servers compute placed there. A second agent naming
// the first one's server (on its own host, or on the first one's) changes
// neither the server's host nor its power state, and is logged; an
// honest report still counts.
func TestHeartbeatOwnership(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, dbURL string) {
		logs := &logBuffer{}
		c := newController(t, dbURL, fleet.Config{Log: slog.New(slog.NewTextHandler(logs, nil))})
		pl := &placements{}
		c.svc.SetPlacements(pl)
		ctx := context.Background()
		honest, a := enrolAgent(t, c, "honest", "hv-1")
		rogue, r := enrolAgent(t, c, "rogue", "rogue-host")
		pl.set("s1", "hv-1")
		pl.set("s2", "hv-1")  // placed, but no VM reported yet
		pl.set("shelved", "") // compute has it on no host
		observed := int64(1000)
		beat := func(ac *agentClient, host string, insts ...string) {
			t.Helper()
			observed++
			body := fmt.Sprintf(`{"observed":%d,"hosts":[{"name":%q,"up":true}],"instances":[%s]}`, observed, host, strings.Join(insts, ","))
			if st, out := ac.do("POST", wire.PathHeartbeat, body); st != 200 {
				t.Fatalf("heartbeat %s: %d %s", body, st, out)
			}
		}
		inst := func(id, host string, p driver.PowerState) string {
			return fmt.Sprintf(`{"id":%q,"host":%q,"power_state":%d}`, id, host, p)
		}
		where := func(id string) string {
			var host string
			var power int
			if err := c.db.QueryRow(ctx, "SELECT host, power FROM fleet_instances WHERE server_id = ?", id).Scan(&host, &power); err != nil {
				return "none"
			}
			return fmt.Sprintf("%s/%d", host, power)
		}
		beat(a, "hv-1", inst("s1", "hv-1", driver.Running))
		if got := where("s1"); got != "hv-1/1" {
			t.Fatalf("the honest agent's report: s1 %s", got)
		}
		for _, tc := range []struct {
			name   string
			agent  *agentClient
			host   string // the host the heartbeat is for
			report string
			id     string
			want   string // the VM's host/power after
			logged string // what the warning names
		}{
			{"rogue names s1 on its own host", r, "rogue-host", inst("s1", "rogue-host", driver.Shutdown), "s1", "hv-1/1", "host=rogue-host server=s1"},
			{"rogue names s1 on s1's host", r, "rogue-host", inst("s1", "hv-1", driver.Shutdown), "s1", "hv-1/1", "host=hv-1 server=s1"},
			{"rogue claims a placed server not yet reported", r, "rogue-host", inst("s2", "rogue-host", driver.Running), "s2", "none", "server=s2"},
			{"rogue claims a server compute has on no host", r, "rogue-host", inst("shelved", "rogue-host", driver.Running), "shelved", "none", "server=shelved"},
			{"honest agent reports s1 stopped", a, "hv-1", inst("s1", "hv-1", driver.Shutdown), "s1", "hv-1/4", ""},
			{"an orphan on the rogue's own host", r, "rogue-host", inst("orphan", "rogue-host", driver.Running), "orphan", "rogue-host/1", ""},
			{"honest agent claims the rogue's orphan", a, "hv-1", inst("orphan", "hv-1", driver.Running), "orphan", "rogue-host/1", "host=hv-1 server=orphan"},
		} {
			before := len(logs.String())
			beat(tc.agent, tc.host, tc.report)
			if got := where(tc.id); got != tc.want {
				t.Errorf("%s: %s is %s, want %s", tc.name, tc.id, got, tc.want)
			}
			logged := logs.String()[before:]
			if tc.logged == "" && strings.Contains(logged, "refused") {
				t.Errorf("%s: refused: %s", tc.name, logged)
			}
			if tc.logged != "" && (!strings.Contains(logged, "agent report refused") || !strings.Contains(logged, tc.logged) ||
				!strings.Contains(logged, "agent="+map[*agentClient]string{a: honest, r: rogue}[tc.agent])) {
				t.Errorf("%s: logged %q, want a refusal naming the agent and %s", tc.name, logged, tc.logged)
			}
		}
	})
}

// TestAgentReportValues: values outside what the controller can store
// are refused with 400, never stored.
func TestAgentReportValues(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, dbURL string) {
		c := newController(t, dbURL, fleet.Config{})
		_, a := enrolAgent(t, c, "a", "hv-1")
		for _, tc := range []struct{ path, body string }{
			{wire.PathHeartbeat, `{"observed":5,"hosts":[{"name":"hv-1","up":true}],"instances":[{"id":"s1","host":"hv-1","power_state":99}]}`},
			{wire.PathHeartbeat, `{"observed":5,"hosts":[{"name":"hv-1","up":true}],"instances":[{"id":"s1","host":"hv-1","power_state":-1}]}`},
			{wire.PathResults, `{"results":[{"op_id":"x","ok":true,"power_state":2,"observed":5}]}`},
			// A host out of any real machine's range would make every
			// scheduler refresh and topology read do unbounded work.
			{wire.PathHosts, `{"hosts":[{"name":"hv-1","vcpus":1000000,"memory_mb":4096,"up":true}]}`},
			{wire.PathHosts, `{"hosts":[{"name":"hv-1","vcpus":4,"memory_mb":1099511627776,"up":true}]}`},
			{wire.PathHosts, `{"hosts":[{"name":"hv-1","vcpus":4,"memory_mb":4096,"up":true,"numa_nodes":[` +
				strings.Repeat(`{"id":0,"memory_mb":1},`, 100) + `{"id":0,"memory_mb":1}]}]}`},
		} {
			method := "POST"
			if tc.path == wire.PathHosts {
				method = "PUT"
			}
			if st, body := a.do(method, tc.path, tc.body); st != 400 || !strings.Contains(body, wire.CodeBadRequest) {
				t.Errorf("%s %s: %d %s, want 400", tc.path, tc.body, st, body)
			}
		}
		var n int
		c.db.QueryRow(context.Background(), "SELECT COUNT(*) FROM fleet_instances").Scan(&n)
		if n != 0 {
			t.Errorf("%d VMs stored from bad reports", n)
		}
	})
}

// TestClockAcrossAgents: an agent's clock orders only its own reports.
// One far ahead (skewed, or lying) must not outrank the next agent of a
// server compute moved to another host, nor of a host taken over.
func TestClockAcrossAgents(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, dbURL string) {
		clk := &clock{t: time.Now()}
		c := newController(t, dbURL, fleet.Config{Now: clk.now})
		pl := &placements{}
		c.svc.SetPlacements(pl)
		ctx := context.Background()
		_, first := enrolAgent(t, c, "first", "h1")
		idSecond, second := enrolAgent(t, c, "second", "h2")
		const ahead = int64(1) << 62
		beat := func(ac *agentClient, observed int64, host, health, insts string) {
			t.Helper()
			body := fmt.Sprintf(`{"observed":%d,"hosts":[{"name":%q,"up":%t,"health":%q}],"instances":[%s]}`,
				observed, host, health == "", health, insts)
			if st, out := ac.do("POST", wire.PathHeartbeat, body); st != 200 {
				t.Fatalf("heartbeat %s: %d %s", body, st, out)
			}
		}
		pl.set("s1", "h1")
		beat(first, ahead, "h1", "", `{"id":"s1","host":"h1","power_state":1}`)

		// Compute resizes s1 onto h2.
		pl.set("s1", "h2")
		done := make(chan error, 1)
		go func() { done <- c.svc.Resize(ctx, driver.Spec{ServerID: "s1", Host: "h2", VCPUs: 2, MemoryMB: 1024}) }()
		ops, err := c.svc.Poll(ctx, idSecond, nil, 5*time.Second)
		if err != nil || len(ops) != 1 {
			t.Fatalf("poll: %+v %v", ops, err)
		}
		p := driver.Running
		if _, err := c.svc.Record(ctx, idSecond, []wire.Result{{OpID: ops[0].ID, OK: true, Power: &p, Observed: 100}}); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		beat(second, 200, "h2", "", `{"id":"s1","host":"h2","power_state":4}`)
		if p, err := c.svc.State(ctx, "s1"); err != nil || p != driver.Shutdown {
			t.Errorf("s1 on h2 after its agent's report: %v %v, want Shutdown", p, err)
		}

		// h1's agent goes silent; another takes the host over.
		clk.add(2 * fleet.DefaultDownAfter)
		_, third := enrolAgent(t, c, "third", "h1")
		beat(third, 300, "h1", "disk failing", "")
		hs, err := c.svc.Hosts(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range hs {
			if h.Name == "h1" && (h.Up || h.Health != "disk failing") {
				t.Errorf("h1 after its new agent's report: up %t, health %q", h.Up, h.Health)
			}
		}
	})
}
