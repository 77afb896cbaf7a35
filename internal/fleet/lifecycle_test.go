package fleet_test

import (
	"context"
	"errors"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"nimbus/internal/driver"
	"nimbus/internal/fleet"
	"nimbus/internal/fleet/wire"
	"nimbus/internal/store"
	"nimbus/internal/store/storetest"
)

// TestCleanStop: an agent that stops cleanly has its hosts down at once,
// long before DownAfter; a heartbeat from before the stop, delivered late,
// does not bring them back; the agent's next start does.
func TestCleanStop(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, dbURL string) {
		c := newController(t, dbURL, fleet.Config{DownAfter: time.Hour})
		ctx := context.Background()
		drv := newCounting(t, "h1", "h2")
		dir := t.TempDir()
		_, stop := runAgent(t, c, drv, dir)
		hosts := func() []driver.Host {
			hs, err := c.svc.Hosts(ctx)
			if err != nil || len(hs) != 2 {
				t.Fatalf("hosts %+v %v", hs, err)
			}
			return hs
		}
		for _, h := range hosts() {
			if !h.Up {
				t.Fatalf("before the stop: %+v", h)
			}
		}
		stop()
		for _, h := range hosts() {
			if h.Up || h.Health != fleet.StoppedHealth {
				t.Fatalf("after a clean stop, with an hour's DownAfter: %s up %v health %q", h.Name, h.Up, h.Health)
			}
		}

		// A late heartbeat from before the stop changes nothing.
		var agentID string
		if err := c.db.QueryRow(ctx, "SELECT agent_id FROM fleet_hosts WHERE name = 'h1'").Scan(&agentID); err != nil {
			t.Fatal(err)
		}
		late := wire.Heartbeat{Observed: time.Now().Add(-time.Minute).UnixNano(), Hosts: []wire.HostStatus{{Name: "h1", Up: true}}}
		if _, err := c.svc.Heartbeat(ctx, agentID, late); err != nil {
			t.Fatal(err)
		}
		if h := hosts()[0]; h.Up {
			t.Fatalf("a late heartbeat revived %+v", h)
		}

		runAgent(t, c, drv, dir)
		for _, h := range hosts() {
			if !h.Up || h.Health != "" {
				t.Fatalf("after the agent started again: %s up %v health %q", h.Name, h.Up, h.Health)
			}
		}
	})
}

// TestStopAPI: the stop call needs the agent's credential and its clock,
// and marks only its own hosts down.
func TestStopAPI(t *testing.T) {
	c := newController(t, filepath.Join(t.TempDir(), "nimbus.db"), fleet.Config{})
	_, a := enrolAgent(t, c, "a", "ha")
	_, b := enrolAgent(t, c, "b", "hb")
	for _, cl := range []*agentClient{a, b} {
		if st, body := cl.do("POST", wire.PathHeartbeat, `{"observed":1}`); st != 200 {
			t.Fatalf("heartbeat %d %s", st, body)
		}
	}
	for _, tc := range []struct {
		cl         *agentClient
		body, want string
		status     int
	}{
		{a, `{}`, "observed", 400},
		{a, `{"observed":-5}`, "observed", 400},
		{a, `{"observed":"now"}`, "", 400},
		{newAgentClient(t, c, ""), `{"observed":2}`, "credential", 401},
		{a, `{"observed":2}`, `{"hosts":["ha"]}`, 200},
	} {
		st, body := tc.cl.do("POST", wire.PathStop, tc.body)
		if st != tc.status || !strings.Contains(body, tc.want) {
			t.Errorf("stop %s: %d %s, want %d with %q", tc.body, st, body, tc.status, tc.want)
		}
	}
	if st, _ := a.do("GET", wire.PathStop, ""); st != 405 {
		t.Errorf("GET stop: %d", st)
	}
	hs, err := c.svc.Hosts(context.Background())
	if err != nil || len(hs) != 2 || hs[0].Up || !hs[1].Up {
		t.Fatalf("after a's stop: %+v %v", hs, err)
	}
}

// TestRemoveHost: a host with VMs recorded on it is not removed; an empty
// one is forgotten, and comes back when its agent registers it again.
func TestRemoveHost(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, dbURL string) {
		c := newController(t, dbURL, fleet.Config{})
		ctx := context.Background()
		_, a := enrolAgent(t, c, "a", "h1")
		if _, err := c.db.Exec(ctx, "INSERT INTO fleet_instances (server_id, host, updated_at) VALUES ('s1', 'h1', ?)",
			store.FormatTime(time.Now())); err != nil {
			t.Fatal(err)
		}
		remove := func(name string) (bool, error) {
			var known bool
			err := c.db.Tx(ctx, func(tx *store.Tx) error {
				var err error
				known, err = c.svc.RemoveHost(ctx, tx, name)
				return err
			})
			return known, err
		}
		if _, err := remove("h1"); !errors.Is(err, driver.ErrHostInUse) || !strings.Contains(err.Error(), "1 VMs on h1") {
			t.Fatalf("remove with a VM: %v", err)
		}
		if _, err := c.db.Exec(ctx, "UPDATE fleet_instances SET gone = 1 WHERE server_id = 's1'"); err != nil {
			t.Fatal(err)
		}
		if known, err := remove("h1"); !known || err != nil {
			t.Fatalf("remove an empty host: %v %v", known, err)
		}
		if hs, err := c.svc.Hosts(ctx); err != nil || len(hs) != 0 {
			t.Fatalf("hosts after remove: %+v %v", hs, err)
		}
		if known, err := remove("h1"); known || err != nil {
			t.Fatalf("remove again: %v %v", known, err)
		}
		// The agent's heartbeat no longer lists h1 as its own: it registers again.
		if st, body := a.do("POST", wire.PathHeartbeat, `{"observed":`+strconv.FormatInt(time.Now().UnixNano(), 10)+`}`); st != 200 ||
			strings.Contains(body, `"h1"`) {
			t.Fatalf("heartbeat after remove: %d %s", st, body)
		}
		if st, body := a.do("PUT", wire.PathHosts, `{"hosts":[{"name":"h1","vcpus":4,"memory_mb":4096,"up":true}]}`); st != 200 {
			t.Fatalf("register again: %d %s", st, body)
		}
		if hs, err := c.svc.Hosts(ctx); err != nil || len(hs) != 1 {
			t.Fatalf("hosts after registering again: %+v %v", hs, err)
		}
	})
}
