// Package region_test runs a region's faults with real processes:
// PostgreSQL stopped under one controller, and the primary of a Patroni
// cluster killed under three controllers behind HAProxy, started from the
// files in deploy/region that the README gives.
package region_test

import (
	"net/http"
	"testing"
	"time"

	"nimbus/internal/testenv/region"
)

// requestDeadline is how long a client of these tests waits for any
// answer: a request still unanswered then has hung.
const requestDeadline = 10 * time.Second

// TestDatabaseOutage stops the PostgreSQL server under one controller for
// a few seconds, as a crash would, while a light load of writes runs.
// Requests meanwhile answer 503 in their service's error shape with
// Retry-After, none 500 and none hangs; the controller reconnects by
// itself when the server is back, and no acknowledged create is lost.
func TestDatabaseOutage(t *testing.T) {
	if testing.Short() {
		t.Skip("runs PostgreSQL and nimbus serve as processes")
	}
	pg := region.StartServer(t)
	pg.CreateDatabase("nimbus")
	bin := region.Build(t)
	ctl := region.StartController(t, "controller", region.ControllerConfig{Bin: bin, DatabaseURL: pg.URL("nimbus"),
		Args: []string{"--fake-delay", "50ms", "--billing-credit-limit", "100000000000"}})
	cl := region.Connect(t, ctl.URL("identity")+"/v3", ctl.CACert(), requestDeadline)
	cl.Unlimit(t)
	image, flavor, network := cl.BootChoice(t)

	load := &region.Load{Compute: cl.Compute, Network: cl.Network, Image: image, Flavor: flavor, Net: network,
		Deadline: requestDeadline, Every: 100 * time.Millisecond}
	stop := load.Run(4)
	time.Sleep(2 * time.Second)
	crashed := time.Now()
	pg.Crash()
	time.Sleep(5 * time.Second)
	pg.Start()
	restarted := time.Now()
	// Wait for the controller to serve again by itself, then some more
	// load to show it stays so.
	region.WaitFor(t, 60*time.Second, "healthy again", func() bool { return ctl.Healthz() == http.StatusOK }, ctl.Proc)
	time.Sleep(5 * time.Second)
	reqs := stop()

	s := region.Summarize(t, reqs)
	t.Logf("database down %.1f s: %s", restarted.Sub(crashed).Seconds(), s)
	if s.Unavailable == 0 {
		t.Errorf("no request answered 503 while the database was down")
	}
	if s.Hung > 0 || s.NoAnswer > 0 || len(s.Other) > 0 {
		t.Errorf("want only 2xx and 503: %s\n%s", s, ctl.Lines(`"server error"`, 10))
	}
	if !s.LastFailure.IsZero() {
		t.Logf("service resumed %.1f s after the database restarted (%.1f s after it stopped)",
			s.LastFailure.Sub(restarted).Seconds(), s.LastFailure.Sub(crashed).Seconds())
		if s.LastFailure.After(restarted.Add(30 * time.Second)) {
			t.Errorf("requests still failed %s after the database came back", s.LastFailure.Sub(restarted))
		}
	}
	if lost := load.Missing(t, reqs); len(lost) > 0 {
		t.Errorf("%d acknowledged creates lost, such as %s %s", len(lost), lost[0].Op, lost[0].ID)
	}
}
