package region_test

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"nimbus/internal/testenv/region"
)

// TestPrimaryFailover runs docs/operator.md's region on loopback from
// deploy/region's files: PostgreSQL under Patroni on three etcd members,
// synchronously replicated; three controllers (--no-local-agent) on its
// multi-host URL; HAProxy in front of them; an agent with a fake host
// reaching them through HAProxy. Under a light load of writes through
// HAProxy, the primary's node is killed (Patroni and every PostgreSQL
// process, SIGKILL). The synchronous standby takes over; requests meanwhile
// answer 503 in their service's shape with Retry-After, none hangs past
// its deadline and none answers otherwise; every create that answered 2xx
// exists afterwards; service resumes by itself. The killed node then
// rejoins as a standby. Last, a controller is killed under the load:
// HAProxy serves on through the two others.
func TestPrimaryFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("runs etcd, Patroni, PostgreSQL, HAProxy and nimbus as processes")
	}
	region.Need(t, "NIMBUS_REQUIRE_PGHA", "etcd", "patroni", "haproxy")
	up := time.Now()
	r := region.StartRegion(t, "127.0.0.10", []string{"127.0.0.11", "127.0.0.12", "127.0.0.13"},
		"--billing-credit-limit", "100000000000", "--down-after", "20s")
	cluster, bal, procs := r.Cluster, r.Balancer, r.Procs()
	t.Logf("region up in %.1f s: %+v", time.Since(up).Seconds(), cluster.Members())

	// A hypervisor host whose agent enrols and reports through HAProxy.
	agentDir := t.TempDir()
	fleet := filepath.Join(agentDir, "fleet.json")
	os.WriteFile(fleet, []byte(`[{"name":"hv-1","vcpus":256,"memory_mb":1048576,"disk_gb":100000}]`), 0o600)
	agent := r.StartAgent(t, agentDir, fleet, "--fake-delay", "50ms", "--heartbeat", "1s")
	procs = append(procs, agent)

	cl := region.Connect(t, bal.URL("identity")+"/v3", r.CA, requestDeadline)
	if got := cl.Compute.Endpoint; !strings.HasPrefix(got, bal.URL("compute")) {
		t.Fatalf("the catalog names compute at %s, not at HAProxy (%s)", got, bal.URL("compute"))
	}
	cl.Unlimit(t)
	region.WaitFor(t, 60*time.Second, "hv-1 up through HAProxy", func() bool { return cl.HostUp(t, "hv-1") }, procs...)
	image, flavor, network := cl.BootChoice(t)

	load := &region.Load{Compute: cl.Compute, Network: cl.Network, Image: image, Flavor: flavor, Net: network,
		Deadline: requestDeadline, Every: 100 * time.Millisecond}
	stop := load.Run(4)
	time.Sleep(3 * time.Second)
	old := cluster.Primary()
	if old == nil {
		stop()
		t.Fatal("no primary")
	}
	killed := time.Now()
	old.Kill()
	var promoted time.Duration
	region.WaitFor(t, 90*time.Second, "a standby promoted", func() bool {
		p := cluster.Primary()
		if p != nil && p != old {
			promoted = time.Since(killed)
			return true
		}
		return false
	}, procs...)
	region.WaitFor(t, 90*time.Second, "writes through HAProxy again", func() bool {
		return cl.Writes(t) == http.StatusCreated
	}, procs...)
	time.Sleep(10 * time.Second) // and they go on succeeding
	reqs := stop()

	s := region.Summarize(t, reqs)
	t.Logf("primary %s killed; %s promoted after %.1f s", old.Name, cluster.Primary().Name, promoted.Seconds())
	t.Logf("through HAProxy: %s", s)
	if s.Unavailable == 0 {
		t.Errorf("no request answered 503 during the failover")
	}
	if s.Hung > 0 || s.NoAnswer > 0 || len(s.Other) > 0 {
		t.Errorf("want only 2xx and 503: %s\n%s", s, region.Tails(procs...))
	}
	if !s.LastFailure.IsZero() {
		t.Logf("service resumed %.1f s after the kill (first failure %.1f s after it)",
			s.LastFailure.Sub(killed).Seconds(), s.FirstFailure.Sub(killed).Seconds())
		if s.LastFailure.After(killed.Add(60 * time.Second)) {
			t.Errorf("requests still failed %s after the kill", s.LastFailure.Sub(killed))
		}
	}
	if lost := load.Missing(t, reqs); len(lost) == 0 {
		t.Logf("all %d acknowledged creates found", s.Created)
	} else {
		t.Errorf("%d acknowledged creates lost, such as %s %s answered at %s", len(lost), lost[0].Op, lost[0].ID,
			lost[0].End.Format("15:04:05.000"))
	}

	// docs/operator.md's way back: start the dead node's Patroni; it rewinds
	// and follows the new primary, synchronously again.
	old.Start()
	region.WaitFor(t, 120*time.Second, old.Name+" back as a standby", func() bool {
		for _, m := range cluster.Members() {
			if m.Name == old.Name && m.Role != "leader" && (m.State == "running" || m.State == "streaming") {
				return true
			}
		}
		return false
	}, old.Patroni)
	cluster.WaitSynchronous(t, 60*time.Second)
	t.Logf("after %s rejoined: %+v", old.Name, cluster.Members())

	// A controller killed (-9) under the same load: HAProxy sends new
	// connections to the two others (a refused connect goes to another,
	// the dead one is out after two failed checks). Only requests in
	// flight on its connections go unanswered.
	stop = load.Run(4)
	time.Sleep(2 * time.Second)
	ctlKilled := time.Now()
	r.Controllers[2].Kill()
	time.Sleep(10 * time.Second)
	reqs = stop()
	s = region.Summarize(t, reqs)
	t.Logf("controller3 killed, through HAProxy: %s", s)
	for _, q := range reqs {
		if q.Status/100 != 2 && (q.Start.After(ctlKilled.Add(3*time.Second)) || q.Status != 0 || q.Hung()) {
			t.Errorf("%s started %.1f s after the controller's kill: %d %v %s", q.Op, q.Start.Sub(ctlKilled).Seconds(), q.Status, q.Err, q.Body)
		}
	}
	if !s.LastFailure.IsZero() {
		t.Logf("requests in flight on controller3 went unanswered until %.1f s after its kill", s.LastFailure.Sub(ctlKilled).Seconds())
	}
	if lost := load.Missing(t, reqs); len(lost) > 0 {
		t.Errorf("%d acknowledged creates lost, such as %s %s", len(lost), lost[0].Op, lost[0].ID)
	}
}
