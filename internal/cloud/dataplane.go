package cloud

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"nimbus/internal/compute"
	"nimbus/internal/driver"
	"nimbus/internal/fleet"
	"nimbus/internal/fleet/wire"
	"nimbus/internal/netstate"
	"nimbus/internal/network"
)

// dataPlane is the agent API's fleet.DataPlane: the network service's
// host states over the fleet's bridged hosts, and compute's metadata.
//
// A change must not cost one build per waiting host: with a thousand
// hosts that is seconds, while a rule change is to reach the hosts it
// touches within one. So the polls do not build on a change; while any
// waits, one goroutine (run) builds the states of all waiting hosts in
// one network.HostStates per change (bursts coalesced) and per recheck
// interval, keeps them, and wakes only the polls whose host's content
// changed. A woken poll is then answered from what was kept.
type dataPlane struct {
	net     *network.Service
	compute *compute.Service
	// fleetHosts is the fleet's hosts (fleet.Service.Hosts).
	fleetHosts func(context.Context) ([]driver.Host, error)

	mu sync.Mutex
	// built is each host's last state built, by a poll or by run; one
	// revision must mean one content.
	built map[string]builtState
	// waiting are the polls waiting on each host; running is whether run
	// is building for them.
	waiting map[string][]*waiter
	running bool
	// hostList caches the fleet's bridged hosts for hostsTTL.
	hostList []network.HostInfo
	hostsAt  time.Time
}

type builtState struct {
	st  *netstate.Host
	sum [32]byte
	at  time.Time
}

// waiter is one poll waiting for its host's content to differ from sum.
type waiter struct {
	sum  [32]byte
	wake chan struct{}
}

// Bounds of the shared build: how often the states of waiting hosts are
// built anyway, to catch a change nobody announced (another controller's
// write, a host gone down), which also bounds how long a kept state is
// served; how long a burst of changes (a server's ports, its placement,
// its address) may settle into one build; how long the fleet's host list
// is kept (a host's up/down has seconds of slack anyway).
const (
	recheckEvery = 5 * time.Second
	coalesce     = 100 * time.Millisecond
	hostsTTL     = time.Second
)

var _ fleet.DataPlane = (*dataPlane)(nil)

func newDataPlane(n *network.Service, f *fleet.Service, c *compute.Service) *dataPlane {
	return &dataPlane{net: n, compute: c, fleetHosts: f.Hosts, built: map[string]builtState{}, waiting: map[string][]*waiter{}}
}

// hosts is every bridged host as the network service needs it: its
// underlay address (the agent's --host-ip), whether it reaches the
// provider network, and whether it is up.
func (d *dataPlane) hosts(ctx context.Context) ([]network.HostInfo, error) {
	d.mu.Lock()
	if d.hostList != nil && time.Since(d.hostsAt) < hostsTTL {
		l := d.hostList
		d.mu.Unlock()
		return l, nil
	}
	d.mu.Unlock()
	hs, err := d.fleetHosts(ctx)
	if err != nil {
		return nil, err
	}
	out := []network.HostInfo{}
	for _, h := range hs {
		if h.NetworkMode == "bridged" {
			out = append(out, network.HostInfo{Name: h.Name, VTEP: h.IP, Gateway: h.Gateway, Up: h.Up})
		}
	}
	d.mu.Lock()
	d.hostList, d.hostsAt = out, time.Now()
	d.mu.Unlock()
	return out, nil
}

// HostState is host's state: the one kept when no change came since it
// was built, else built now.
func (d *dataPlane) HostState(ctx context.Context, host string) (*netstate.Host, error) {
	rev := d.net.Revision()
	d.mu.Lock()
	b, ok := d.built[host]
	d.mu.Unlock()
	if ok && b.st.Revision == rev && time.Since(b.at) < recheckEvery {
		c := *b.st // the caller may set the revision of its copy
		return &c, nil
	}
	hosts, err := d.hosts(ctx)
	if err != nil {
		return nil, err
	}
	for range 2 {
		st, err := d.net.HostState(ctx, host, hosts)
		if err != nil {
			return nil, err
		}
		if d.keep(host, st, fleet.Digest(st)) {
			c := *st
			return &c, nil
		}
		// The content changed while the revision did not (a host went
		// down, another controller wrote): raise it and build again.
		d.net.NetworkChanged()
	}
	return nil, errors.New("cloud: a host's network state keeps changing at one revision")
}

// keep records st as host's state unless it is new content at the
// revision of the one kept, which would give one revision two contents.
func (d *dataPlane) keep(host string, st *netstate.Host, sum [32]byte) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	prev, ok := d.built[host]
	switch {
	case ok && prev.st.Revision == st.Revision && prev.sum != sum:
		delete(d.built, host)
		return false
	case ok && prev.st.Revision > st.Revision:
		return true // a newer build finished first: keep that one
	}
	d.built[host] = builtState{st, sum, time.Now()}
	return true
}

// WaitHost waits until run finds host's content other than held's, or
// ctx ends. A change since held was built (a race with run's last build)
// returns at once: the caller's next HostState builds it.
func (d *dataPlane) WaitHost(ctx context.Context, host string, held *netstate.Host) {
	w := &waiter{sum: fleet.Digest(held), wake: make(chan struct{})}
	d.mu.Lock()
	if d.net.Revision() > held.Revision {
		d.mu.Unlock()
		return
	}
	d.waiting[host] = append(d.waiting[host], w)
	if !d.running {
		d.running = true
		go d.run(held.Revision)
	}
	d.mu.Unlock()
	select {
	case <-w.wake:
	case <-ctx.Done():
		d.mu.Lock()
		d.waiting[host] = slices.DeleteFunc(d.waiting[host], func(x *waiter) bool { return x == w })
		if len(d.waiting[host]) == 0 {
			delete(d.waiting, host)
		}
		d.mu.Unlock()
	}
}

// run builds the waiting hosts' states on each change after rev, and
// every recheckEvery, until no poll waits.
func (d *dataPlane) run(rev int64) {
	ctx := context.Background()
	for {
		wctx, cancel := context.WithTimeout(ctx, recheckEvery)
		changed := d.net.WaitChange(wctx, rev) > rev
		cancel()
		if changed {
			time.Sleep(coalesce)
		}
		d.mu.Lock()
		names := make([]string, 0, len(d.waiting))
		for h := range d.waiting {
			names = append(names, h)
		}
		if len(names) == 0 {
			d.running = false
			d.mu.Unlock()
			return
		}
		d.mu.Unlock()
		slices.Sort(names)
		rev = d.net.Revision()
		sums, err := d.build(ctx, names)
		d.mu.Lock()
		for _, h := range names {
			sum, ok := sums[h]
			if err == nil && !ok {
				continue // its content changed at one revision: rebuilt on the next round
			}
			// Wake a poll whose content changed; on an error wake all, so
			// that each builds its own state and reports what failed.
			kept := d.waiting[h][:0]
			for _, w := range d.waiting[h] {
				if err != nil || w.sum != sum {
					close(w.wake)
				} else {
					kept = append(kept, w)
				}
			}
			if len(kept) == 0 {
				delete(d.waiting, h)
			} else {
				d.waiting[h] = kept
			}
		}
		d.mu.Unlock()
	}
}

// build is HostStates over names, kept; it answers their digests. A host
// whose content changed at the revision of the state kept for it is left
// out, and the revision raised so that the next round builds it again.
func (d *dataPlane) build(ctx context.Context, names []string) (map[string][32]byte, error) {
	hosts, err := d.hosts(ctx)
	if err != nil {
		return nil, err
	}
	states, err := d.net.HostStates(ctx, names, hosts)
	if err != nil {
		return nil, err
	}
	sums := make(map[string][32]byte, len(states))
	raise := false
	for h, st := range states {
		sum := fleet.Digest(st)
		if d.keep(h, st, sum) {
			sums[h] = sum
		} else {
			raise = true
		}
	}
	if raise {
		d.net.NetworkChanged()
	}
	return sums, nil
}

// Metadata answers for the server whose port on req.NetworkID has fixed
// IP req.SourceIP, as Neutron's metadata proxy identifies it, when that
// server runs on one of the calling agent's hosts.
func (d *dataPlane) Metadata(ctx context.Context, agentHosts []string, req wire.MetadataRequest) (wire.MetadataResponse, error) {
	id, host, found, err := d.net.ServerAt(ctx, req.NetworkID, req.SourceIP)
	if err != nil {
		return wire.MetadataResponse{}, err
	}
	if !found || !slices.Contains(agentHosts, host) {
		return wire.MetadataResponse{}, fleet.ErrNoServer
	}
	status, ct, body, err := d.compute.Metadata(ctx, id, req.Method, req.Path, req.Body)
	if err != nil {
		return wire.MetadataResponse{}, err
	}
	return wire.MetadataResponse{Status: status, ContentType: ct, Body: body}, nil
}
