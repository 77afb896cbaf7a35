package compute_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"nimbus/internal/agent"
	"nimbus/internal/cloud"
	"nimbus/internal/driver"
	"nimbus/internal/driver/fake"
	"nimbus/internal/fleet"
	"nimbus/internal/testenv"
)

// serviceOf answers the nova-compute service of host at 2.53, or nil.
func (e *env) serviceOf(host string) map[string]any {
	e.t.Helper()
	l := e.must(200, "GET", "/os-services?binary=nova-compute&host="+host, e.admin, "2.53", "")["services"].([]any)
	if len(l) == 0 {
		return nil
	}
	return l[0].(map[string]any)
}

// hypervisorNames answers the hypervisors' host names.
func (e *env) hypervisorNames() map[string]map[string]any {
	e.t.Helper()
	out := map[string]map[string]any{}
	for _, h := range e.must(200, "GET", "/os-hypervisors/detail", e.admin, "2.53", "")["hypervisors"].([]any) {
		m := h.(map[string]any)
		out[m["hypervisor_hostname"].(string)] = m
	}
	return out
}

// fleetHas tells whether the fleet holds a host.
func fleetHas(t *testing.T, c *cloud.Cloud, name string) bool {
	t.Helper()
	hs, err := c.Fleet.HostInfos(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hs {
		if h.Name == name {
			return true
		}
	}
	return false
}

// TestServiceDeleteRemovesHost: deleting a nova-compute service is refused
// while servers live on its host (Nova's 409) and otherwise removes the
// fleet's host with it, so that it leaves the hypervisors and "nimbus admin
// host list"; an agent that still presents it registers it again.
func TestServiceDeleteRemovesHost(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := placementEnv(t, dbURL)
		ctx := context.Background()
		id := e.must(202, "POST", "/servers", e.admin, "2.74", fmt.Sprintf(
			`{"server":{"name":"a","imageRef":%q,"flavorRef":"p2","networks":"none","host":"plain-1"}}`, e.imageID))["server"].(map[string]any)["id"].(string)
		e.wait(id, e.admin, "ACTIVE")
		busy, empty := e.serviceOf("plain-1")["id"].(string), e.serviceOf("plain-2")["id"].(string)

		e.fault(409, "Unable to delete compute service that is hosting instances.", "DELETE", "/os-services/"+busy, e.admin, "2.53", "")
		if e.serviceOf("plain-1") == nil || !fleetHas(t, e.c, "plain-1") {
			t.Fatal("a refused delete removed the host")
		}

		e.must(204, "DELETE", "/os-services/"+empty, e.admin, "2.53", "")
		if e.serviceOf("plain-2") != nil || fleetHas(t, e.c, "plain-2") || e.hypervisorNames()["plain-2"] != nil {
			t.Fatal("plain-2 is still a service, a fleet host or a hypervisor after its service was deleted")
		}

		// Drained, the busy host goes too.
		e.must(204, "DELETE", "/servers/"+id, e.admin, "", "")
		deadline := time.Now().Add(10 * time.Second)
		for st, _, _ := e.do("GET", "/servers/"+id, e.admin, "", ""); st != 404; st, _, _ = e.do("GET", "/servers/"+id, e.admin, "", "") {
			if time.Now().After(deadline) {
				t.Fatal("server not deleted")
			}
			time.Sleep(20 * time.Millisecond)
		}
		e.must(204, "DELETE", "/os-services/"+busy, e.admin, "2.53", "")
		if fleetHas(t, e.c, "plain-1") {
			t.Fatal("plain-1 still in the fleet")
		}

		// The local agent still presents both: its next reports register
		// them again, and their services come back with them (as a
		// running nova-compute re-creates its service), no restart needed.
		for range 2 {
			if err := e.c.Agent.Heartbeat(ctx); err != nil {
				t.Fatal(err)
			}
		}
		for _, h := range []string{"plain-1", "plain-2"} {
			if e.serviceOf(h) == nil || !fleetHas(t, e.c, h) {
				t.Errorf("%s not back after its agent registered it again", h)
			}
		}
	})
}

// TestAgentCleanStop: an agent that stops cleanly has its hosts down at
// once in compute's views, not after --down-after.
func TestAgentCleanStop(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL, func(c *cloud.Config) { c.NoLocalAgent = true; c.DownAfter = time.Hour })
		ctx := context.Background()
		dir := t.TempDir()
		aid, cred, err := e.c.Fleet.NewAgent(ctx, "remote")
		if err != nil {
			t.Fatal(err)
		}
		if err := agent.SaveIdentity(dir, agent.Identity{AgentID: aid, Credential: cred}); err != nil {
			t.Fatal(err)
		}
		drv, err := fake.New(fake.Config{Hosts: []driver.Host{{Name: "hv-stop", VCPUs: 8, MemoryMB: 8192, DiskGB: 100, Up: true}},
			StateFile: filepath.Join(dir, "fake-fleet.json")})
		if err != nil {
			t.Fatal(err)
		}
		a, err := agent.New(agent.Config{ControllerURL: e.c.AgentURL, CACertFile: e.c.CACertFile, DataDir: dir, Driver: drv,
			Heartbeat: time.Hour, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		actx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); a.Run(actx) }()
		t.Cleanup(func() { cancel(); <-done })
		select {
		case <-a.Ready():
		case <-time.After(10 * time.Second):
			t.Fatal("agent not ready")
		}
		if sv := e.serviceOf("hv-stop"); sv == nil || sv["state"] != "up" {
			t.Fatalf("service of a running agent's host: %v", sv)
		}
		cancel()
		<-done
		if sv := e.serviceOf("hv-stop"); sv["state"] != "down" {
			t.Errorf("service after a clean stop, with an hour's --down-after: %v", sv)
		}
		if h := e.hypervisorNames()["hv-stop"]; h == nil || h["state"] != "down" {
			t.Errorf("hypervisor after a clean stop: %v", h)
		}
		hs, err := e.c.Fleet.HostInfos(ctx)
		if err != nil || len(hs) != 1 || hs[0].Up || hs[0].Health != fleet.StoppedHealth {
			t.Errorf("host list after a clean stop: %+v %v", hs, err)
		}
	})
}
