package fleet_test

import (
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"nimbus/internal/fleet"
	"nimbus/internal/fleet/wire"
	"nimbus/internal/netstate"
	"nimbus/internal/testenv"
)

// hostPorts is a data plane whose hosts' states are lists of port ids,
// with one server, "s1" at 10.0.0.5 on network "n1", running on "h1".
type hostPorts struct {
	mu    sync.Mutex
	rev   int64
	ports map[string][]string
	wake  chan struct{}
}

func (d *hostPorts) HostState(ctx context.Context, host string) (*netstate.Host, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	st := &netstate.Host{Host: host, Revision: d.rev}
	for _, p := range d.ports[host] {
		st.Ports = append(st.Ports, netstate.Port{ID: p})
	}
	return st, nil
}

// WaitHost wakes on every change, the host's or not: the agent API must
// still answer only when the host's own content changed.
func (d *hostPorts) WaitHost(ctx context.Context, host string, held *netstate.Host) {
	d.mu.Lock()
	if d.rev > held.Revision {
		d.mu.Unlock()
		return
	}
	ch := d.wake
	d.mu.Unlock()
	select {
	case <-ch:
	case <-ctx.Done():
	}
}

// change adds a port on host and raises the revision.
func (d *hostPorts) change(host, port string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.ports[host] = append(d.ports[host], port)
	d.rev++
	close(d.wake)
	d.wake = make(chan struct{})
}

func (d *hostPorts) Metadata(ctx context.Context, agentHosts []string, req wire.MetadataRequest) (wire.MetadataResponse, error) {
	if req.NetworkID != "n1" || req.SourceIP != "10.0.0.5" || !slices.Contains(agentHosts, "h1") {
		return wire.MetadataResponse{}, fleet.ErrNoServer
	}
	return wire.MetadataResponse{Status: 200, ContentType: "text/plain", Body: []byte("s1")}, nil
}

func TestNetStateAPI(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		c := newController(t, dbURL, fleet.Config{})
		dp := &hostPorts{rev: 1, ports: map[string][]string{}, wake: make(chan struct{})}
		c.svc.SetDataPlane(dp)
		_, a1 := enrolAgent(t, c, "a1", "h1")
		_, a2 := enrolAgent(t, c, "a2", "h2")
		meta := func(host string) string {
			b, _ := json.Marshal(wire.MetadataRequest{Host: host, NetworkID: "n1", SourceIP: "10.0.0.5", Method: "GET",
				Path: "/openstack/latest/meta_data.json"})
			return string(b)
		}
		cases := []struct {
			name   string
			a      *agentClient
			path   string
			body   string
			status int
		}{
			{"another agent's host state", a2, wire.PathNetState, `{"host":"h1","after":-1}`, 403},
			{"its own host state", a2, wire.PathNetState, `{"host":"h2","after":-1}`, 200},
			{"metadata for another agent's host", a2, wire.PathMetadata, meta("h1"), 403},
			{"metadata for a server on another agent's host", a2, wire.PathMetadata, meta("h2"), 404},
			{"metadata for its own server", a1, wire.PathMetadata, meta("h1"), 200},
			{"metadata without a method", a1, wire.PathMetadata, `{"host":"h1","network_id":"n1","source_ip":"10.0.0.5","path":"/"}`, 400},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				if st, body := tc.a.do("POST", tc.path, tc.body); st != tc.status {
					t.Errorf("%d %s, want %d", st, body, tc.status)
				}
			})
		}

		t.Run("long-poll ends on the host's own change only", func(t *testing.T) {
			poll := func(after int64) (*netstate.Host, time.Time) {
				st, body := a1.do("POST", wire.PathNetState, `{"host":"h1","after":`+strconv.FormatInt(after, 10)+`}`)
				var h netstate.Host
				if st != 200 || json.Unmarshal([]byte(body), &h) != nil {
					t.Errorf("poll: %d %s", st, body)
				}
				return &h, time.Now()
			}
			first, _ := poll(-1)
			type answer struct {
				st *netstate.Host
				at time.Time
			}
			done := make(chan answer, 1)
			go func() { st, at := poll(first.Revision); done <- answer{st, at} }()
			time.Sleep(300 * time.Millisecond)
			dp.change("h2", "p-elsewhere")
			select {
			case a := <-done:
				t.Fatalf("answered on another host's change: %+v", a.st)
			case <-time.After(time.Second):
			}
			changed := time.Now()
			dp.change("h1", "p-here")
			select {
			case a := <-done:
				if d := a.at.Sub(changed); d > time.Second {
					t.Errorf("answered %v after the change", d)
				}
				if a.st.Revision <= first.Revision || len(a.st.Ports) != 1 || a.st.Ports[0].ID != "p-here" {
					t.Errorf("answer %+v", a.st)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("no answer after the host's change")
			}
		})
	})
}
