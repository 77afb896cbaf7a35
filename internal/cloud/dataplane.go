package cloud

import (
	"context"
	"slices"
	"sync"

	"nimbus/internal/compute"
	"nimbus/internal/fleet"
	"nimbus/internal/fleet/wire"
	"nimbus/internal/netstate"
	"nimbus/internal/network"
)

// dataPlane is the agent API's fleet.DataPlane: the network service's
// host states over the fleet's bridged hosts, and compute's metadata.
type dataPlane struct {
	net     *network.Service
	fleet   *fleet.Service
	compute *compute.Service

	mu    sync.Mutex
	built map[string]builtState // host → its last state built
}

type builtState struct {
	rev int64
	sum [32]byte
}

var _ fleet.DataPlane = (*dataPlane)(nil)

func newDataPlane(n *network.Service, f *fleet.Service, c *compute.Service) *dataPlane {
	return &dataPlane{net: n, fleet: f, compute: c, built: map[string]builtState{}}
}

// hosts is every bridged host as the network service needs it: its
// underlay address (the agent's --host-ip), whether it reaches the
// provider network, and whether it is up.
func (d *dataPlane) hosts(ctx context.Context) ([]network.HostInfo, error) {
	hs, err := d.fleet.Hosts(ctx)
	if err != nil {
		return nil, err
	}
	var out []network.HostInfo
	for _, h := range hs {
		if h.NetworkMode == "bridged" {
			out = append(out, network.HostInfo{Name: h.Name, VTEP: h.IP, Gateway: h.Gateway, Up: h.Up})
		}
	}
	return out, nil
}

// HostState builds host's state. One revision must mean one content: a
// state that changed while the revision did not (a host went down,
// another controller wrote) raises the revision and is built again.
func (d *dataPlane) HostState(ctx context.Context, host string) (*netstate.Host, error) {
	hosts, err := d.hosts(ctx)
	if err != nil {
		return nil, err
	}
	st, err := d.net.HostState(ctx, host, hosts)
	if err != nil {
		return nil, err
	}
	sum := fleet.Digest(st)
	d.mu.Lock()
	prev, ok := d.built[host]
	d.built[host] = builtState{st.Revision, sum}
	d.mu.Unlock()
	if !ok || prev.rev != st.Revision || prev.sum == sum {
		return st, nil
	}
	d.net.NetworkChanged()
	if st, err = d.net.HostState(ctx, host, hosts); err != nil {
		return nil, err
	}
	d.mu.Lock()
	d.built[host] = builtState{st.Revision, fleet.Digest(st)}
	d.mu.Unlock()
	return st, nil
}

// WaitChange is the network service's change feed.
func (d *dataPlane) WaitChange(ctx context.Context, after int64) int64 {
	return d.net.WaitChange(ctx, after)
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
