package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"nimbus/internal/driver"
	"nimbus/internal/driver/fake"
	"nimbus/internal/fleet/wire"
	"nimbus/internal/netstate"
)

// recPlane is a data plane that records what it is given, and fails
// while failing is set.
type recPlane struct {
	mu      sync.Mutex
	applied []int64
	failing error
	ports   map[string]bool
}

func (p *recPlane) Apply(ctx context.Context, st *netstate.Host) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.failing != nil {
		return p.failing
	}
	p.applied = append(p.applied, st.Revision)
	p.ports = map[string]bool{}
	for _, port := range st.Ports {
		p.ports[port.ID] = true
	}
	return nil
}

func (p *recPlane) Wired(ids ...string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, id := range ids {
		if !p.ports[id] {
			return false
		}
	}
	return true
}

func (p *recPlane) fail(err error) {
	p.mu.Lock()
	p.failing = err
	p.mu.Unlock()
}

func (p *recPlane) last() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.applied) == 0 {
		return -1
	}
	return p.applied[len(p.applied)-1]
}

// netController speaks the agent API with no ops, and serves one host's
// network state by long-poll: a change wakes the waiters only when
// announced, so that a test can make one the agent does not hear of.
type netController struct {
	mu      sync.Mutex
	st      netstate.Host
	changed chan struct{}
	hosts   []driver.Host // as registered
	afters  []int64       // the After of each netstate request
	meta    []wire.MetadataRequest
}

func (c *netController) set(st netstate.Host, announce bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.st = st
	if announce {
		close(c.changed)
		c.changed = make(chan struct{})
	}
}

func (c *netController) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	reply := func(v any) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(v)
	}
	switch r.URL.Path {
	case wire.PathHosts:
		var req wire.HostsRequest
		json.NewDecoder(r.Body).Decode(&req)
		c.mu.Lock()
		c.hosts = req.Hosts
		c.mu.Unlock()
		reply(wire.HostsResponse{Registered: []string{"h1"}})
	case wire.PathHeartbeat:
		reply(wire.HeartbeatResponse{DownAfterSeconds: 60, Hosts: []string{"h1"}})
	case wire.PathPoll:
		time.Sleep(200 * time.Millisecond)
		reply(wire.PollResponse{Ops: []wire.Op{}})
	case wire.PathStop:
		reply(wire.StopResponse{})
	case wire.PathNetState:
		var req wire.NetStateRequest
		json.NewDecoder(r.Body).Decode(&req)
		c.mu.Lock()
		c.afters = append(c.afters, req.After)
		ch := c.changed
		if c.st.Revision <= req.After {
			c.mu.Unlock()
			select {
			case <-ch:
			case <-time.After(2 * time.Second):
			case <-r.Context().Done():
				return
			}
			c.mu.Lock()
		}
		st := c.st
		c.mu.Unlock()
		reply(st)
	case wire.PathMetadata:
		var req wire.MetadataRequest
		json.NewDecoder(r.Body).Decode(&req)
		c.mu.Lock()
		c.meta = append(c.meta, req)
		c.mu.Unlock()
		if req.SourceIP == "10.0.0.99" {
			w.WriteHeader(http.StatusNotFound)
			reply(wire.ErrorBody{Error: wire.Error{Code: wire.CodeNotFound, Message: "no server of this agent's hosts has that address"}})
			return
		}
		reply(wire.MetadataResponse{Status: 200, ContentType: "application/json", Body: []byte(`{"uuid":"s1"}`)})
	default:
		http.NotFound(w, r)
	}
}

// syncBuffer is a log sink safe for the agent's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) count(sub string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Count(s.b.String(), sub)
}

func hostState(rev int64, ports ...string) netstate.Host {
	st := netstate.Host{Host: "h1", Revision: rev, VTEP: "192.0.2.1",
		Networks: []netstate.Network{{ID: "n1", VNI: 100, MTU: 1450}}}
	for _, p := range ports {
		st.Ports = append(st.Ports, netstate.Port{ID: p, NetworkID: "n1", MAC: "fa:16:3e:00:00:01"})
	}
	return st
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestNetPlaneLoop: the agent registers its host as a bridged gateway,
// applies the controller's current state first, then each newer one;
// a failing apply is retried and logged once; a kick fetches a state the
// long-poll did not hear of; a state that does not validate is never
// applied; metadata requests go to the controller with the host named.
func TestNetPlaneLoop(t *testing.T) {
	ctl := &netController{changed: make(chan struct{})}
	ctl.set(hostState(3), false)
	srv := httptest.NewTLSServer(ctl)
	t.Cleanup(srv.Close)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := SaveIdentity(dir, Identity{AgentID: "a1", Credential: "c", Controller: srv.URL}); err != nil {
		t.Fatal(err)
	}
	drv, err := fake.New(fake.Config{Hosts: []driver.Host{{Name: "h1", VCPUs: 8, MemoryMB: 8192, DiskGB: 100, Up: true}}})
	if err != nil {
		t.Fatal(err)
	}
	plane := &recPlane{}
	np := newNetPlane(plane, true)
	logs := &syncBuffer{}
	a, err := New(Config{ControllerURL: srv.URL, CACertFile: ca, DataDir: dir, Driver: drv, Net: np, MaxBackoff: 100 * time.Millisecond,
		Log: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})

	waitFor(t, "the current state applied", func() bool { return plane.last() == 3 })
	ctl.mu.Lock()
	first, hosts := ctl.afters[0], ctl.hosts
	ctl.mu.Unlock()
	if first != -1 {
		t.Errorf("the first request waits for a revision above %d; want the current state at once (-1)", first)
	}
	if len(hosts) != 1 || hosts[0].NetworkMode != "bridged" || !hosts[0].Gateway {
		t.Errorf("registered hosts %+v, want one bridged gateway", hosts)
	}

	ctl.set(hostState(4, "p1"), true)
	waitFor(t, "revision 4", func() bool { return plane.last() == 4 && np.Wired("p1") && np.Applied() == 4 })

	plane.fail(errors.New("bridge on fire"))
	ctl.set(hostState(5, "p1", "p2"), true)
	waitFor(t, "retries", func() bool {
		return logs.count("bridge on fire") == 1 && countAfter(ctl, 4) >= 4
	})
	if n := logs.count("bridge on fire"); n != 1 {
		t.Errorf("the failure is logged %d times, want once", n)
	}
	plane.fail(nil)
	waitFor(t, "revision 5 after the failure", func() bool { return plane.last() == 5 && np.Wired("p1", "p2") })

	// A change the long-poll misses: only a kick brings it.
	time.Sleep(100 * time.Millisecond) // the loop is back in its long-poll
	ctl.set(hostState(6, "p3"), false)
	np.Kick()
	start := time.Now()
	waitFor(t, "the kicked fetch", func() bool { return plane.last() == 6 })
	if d := time.Since(start); d > time.Second {
		t.Errorf("a kick took %s to apply the state", d)
	}

	bad := hostState(7, "p4")
	bad.Ports[0].MAC = "not-a-mac"
	ctl.set(bad, true)
	waitFor(t, "the refusal logged", func() bool { return logs.count("bad MAC") == 1 })
	if plane.last() != 6 {
		t.Errorf("an invalid state was applied (revision %d)", plane.last())
	}
	ctl.set(hostState(8, "p4"), true)
	waitFor(t, "revision 8", func() bool { return plane.last() == 8 })

	resp, err := np.Metadata(context.Background(), wire.MetadataRequest{NetworkID: "n1", SourceIP: "10.0.0.5", Method: "GET",
		Path: "/openstack/latest/meta_data.json"})
	if err != nil || resp.Status != 200 || string(resp.Body) != `{"uuid":"s1"}` {
		t.Fatalf("metadata %+v, %v", resp, err)
	}
	ctl.mu.Lock()
	got := ctl.meta[0]
	ctl.mu.Unlock()
	if got.Host != "h1" || got.SourceIP != "10.0.0.5" || got.Path != "/openstack/latest/meta_data.json" {
		t.Errorf("the controller got %+v", got)
	}
	// No server there: the guest's 404, not a failure of the service.
	resp, err = np.Metadata(context.Background(), wire.MetadataRequest{NetworkID: "n1", SourceIP: "10.0.0.99", Method: "GET", Path: "/"})
	if err != nil || resp.Status != http.StatusNotFound {
		t.Errorf("metadata for an unknown address: %+v, %v", resp, err)
	}
}

func countAfter(c *netController, after int64) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, a := range c.afters {
		if a == after {
			n++
		}
	}
	return n
}

// TestNetPlaneUserMode: without a data plane the hosts stay as the
// driver has them.
func TestNetPlaneUserMode(t *testing.T) {
	hosts := []driver.Host{{Name: "h1"}}
	var n *NetPlane
	n.describe(hosts)
	if hosts[0].NetworkMode != "" || hosts[0].Gateway {
		t.Errorf("user mode host %+v", hosts[0])
	}
	newNetPlane(&recPlane{}, false).describe(hosts)
	if hosts[0].NetworkMode != "bridged" || hosts[0].Gateway {
		t.Errorf("bridged host without a provider bridge %+v", hosts[0])
	}
}

// inFreshNS runs fn on a thread in a new network namespace, which goes
// away with the thread's reference when fn returns.
func inFreshNS(t *testing.T, fn func()) {
	t.Helper()
	done := make(chan struct{})
	var skip string
	go func() {
		defer close(done)
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			skip = err.Error()
			return
		}
		defer orig.Close()
		ns, err := netns.New()
		if err != nil {
			skip = err.Error()
			runtime.UnlockOSThread()
			return
		}
		defer ns.Close()
		defer func() {
			// A thread that cannot go back is never given back (it
			// dies with the goroutine).
			if netns.Set(orig) == nil {
				runtime.UnlockOSThread()
			}
		}()
		fn()
	}()
	<-done
	if skip != "" {
		if os.Getenv("NIMBUS_REQUIRE_NETNS") == "1" {
			t.Fatalf("cannot make a network namespace (NIMBUS_REQUIRE_NETNS=1): %s", skip)
		}
		t.Skipf("cannot make a network namespace (needs root and CAP_NET_ADMIN): %s", skip)
	}
}

// TestProviderBridge: --provider-interface enslaves the interface to the
// agent's bridge, both up, again and again alike; an interface that is
// missing or already another bridge's, or a device of the bridge's name
// that is no bridge, is refused.
func TestProviderBridge(t *testing.T) {
	add := func(l netlink.Link) {
		if err := netlink.LinkAdd(l); err != nil {
			t.Errorf("adding %s: %v", l.Attrs().Name, err)
		}
	}
	named := func(name string) netlink.LinkAttrs {
		la := netlink.NewLinkAttrs()
		la.Name = name
		return la
	}
	// veths stand in for NICs: this kernel has no dummy devices.
	nic := func(la netlink.LinkAttrs) netlink.Link { return &netlink.Veth{LinkAttrs: la, PeerName: la.Name + "-p"} }
	cases := []struct {
		name    string
		setup   func()
		iface   string
		wantErr string
	}{
		{name: "interface bridged", setup: func() { add(nic(named("eth-prov"))) }, iface: "eth-prov"},
		{name: "bridge there already", setup: func() {
			add(nic(named("eth-prov")))
			add(&netlink.Bridge{LinkAttrs: named(ProviderBridgeName)})
		}, iface: "eth-prov"},
		{name: "no such interface", setup: func() {}, iface: "eth-none", wantErr: "provider interface eth-none"},
		{name: "interface on another bridge", setup: func() {
			add(&netlink.Bridge{LinkAttrs: named("br-other")})
			la := named("eth-prov")
			la.MasterIndex = mustLink(t, "br-other").Attrs().Index
			add(nic(la))
		}, iface: "eth-prov", wantErr: "already enslaved"},
		{name: "not a bridge", setup: func() {
			add(nic(named("eth-prov")))
			add(nic(named(ProviderBridgeName)))
		}, iface: "eth-prov", wantErr: "not a bridge"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			inFreshNS(t, func() {
				tc.setup()
				for range 2 { // idempotent
					got, err := ProviderBridge(tc.iface)
					if tc.wantErr != "" {
						if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
							t.Errorf("got %q, %v; want an error with %q", got, err, tc.wantErr)
						}
						return
					}
					if err != nil || got != ProviderBridgeName {
						t.Fatalf("got %q, %v", got, err)
					}
					br, l := mustLink(t, ProviderBridgeName), mustLink(t, tc.iface)
					if l.Attrs().MasterIndex != br.Attrs().Index {
						t.Errorf("%s is not on %s", tc.iface, ProviderBridgeName)
					}
					for _, x := range []netlink.Link{br, l} {
						if x.Attrs().Flags&net.FlagUp == 0 {
							t.Errorf("%s is down", x.Attrs().Name)
						}
					}
				}
			})
		})
	}
}

func mustLink(t *testing.T, name string) netlink.Link {
	t.Helper()
	l, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return l
}
