// Package region_test runs a region's faults with real processes:
// PostgreSQL stopped under one controller, and the primary of a Patroni
// cluster killed under three controllers behind HAProxy, started from the
// files in deploy/region that docs/operator.md gives.
package region_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
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
	probes := outageProbes(t, ctl)
	for name, p := range probes {
		if got := p.call(); got != p.normal {
			t.Errorf("%s before the outage: %s", name, got)
		}
	}
	crashed := time.Now()
	pg.Crash()
	for name, p := range probes {
		if got := p.call(); got != "503 "+p.away {
			t.Errorf("%s while the database is down: %s, want 503 %s", name, got, p.away)
		}
	}
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
	if lost := load.Missing(t, reqs); len(lost) == 0 {
		t.Logf("all %d acknowledged creates found", s.Created)
	} else {
		t.Errorf("%d acknowledged creates lost, such as %s %s", len(lost), lost[0].Op, lost[0].ID)
	}
}

// probe asks one front end that is not an OpenStack API something that
// needs the database, and answers "status what" (what: the content type,
// or the agent API's error code), with Retry-After checked on a 503.
type probe struct {
	ask          func() string
	normal, away string
}

func (p probe) call() string { return p.ask() }

// outageProbes are the panel, asked for a page with a session cookie it
// must look up (a redirect to sign in when there is no such session), and
// the agent API, asked for a heartbeat with a credential it must look up
// (401 when there is no such agent).
func outageProbes(t *testing.T, ctl *region.Controller) map[string]probe {
	client, err := region.HTTPClient(ctl.CACert(), requestDeadline)
	if err != nil {
		t.Fatal(err)
	}
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	do := func(req *http.Request, what func(*http.Response, []byte) string) string {
		resp, err := client.Do(req)
		if err != nil {
			return "no answer: " + err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") == "" {
			return "503 without Retry-After"
		}
		return fmt.Sprintf("%d %s", resp.StatusCode, what(resp, body))
	}
	return map[string]probe{
		"panel": {normal: "303 ", away: "text/html", ask: func() string {
			req, _ := http.NewRequest(http.MethodGet, ctl.URL("panel")+"/servers", nil)
			req.AddCookie(&http.Cookie{Name: "nimbus_session", Value: strings.Repeat("x", 43)}) // a secret's length: looked up
			return do(req, func(resp *http.Response, _ []byte) string {
				if resp.StatusCode == http.StatusSeeOther {
					return ""
				}
				ct, _, _ := strings.Cut(resp.Header.Get("Content-Type"), ";")
				return ct
			})
		}},
		"agent API": {normal: "401 unauthorized", away: "unavailable", ask: func() string {
			req, _ := http.NewRequest(http.MethodPost, ctl.URL("agent")+"/v1/agent/heartbeat", strings.NewReader(`{}`))
			req.Header.Set("Authorization", "Bearer no-such-agent.secret")
			return do(req, func(_ *http.Response, body []byte) string {
				var e struct {
					Error struct{ Code string } `json:"error"`
				}
				json.Unmarshal(body, &e)
				return e.Error.Code
			})
		}},
	}
}
