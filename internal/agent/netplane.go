package agent

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"

	"nimbus/internal/driver"
	"nimbus/internal/fleet/wire"
	"nimbus/internal/netplane"
	"nimbus/internal/netstate"
)

// Plane is the host's data plane (*netplane.Plane) as the agent drives it.
type Plane interface {
	// Apply makes the host match st.
	Apply(ctx context.Context, st *netstate.Host) error
	// Wired tells whether every port named is wired and filtered.
	Wired(portIDs ...string) bool
}

// NetPlane is the agent's side of bridged networking
// (--network-mode bridged): it keeps the host's data plane at the
// controller's desired state, which it long-polls, answers the plane's
// metadata requests through the agent's connection to the controller,
// and lets the driver wait for a server's ports before it starts the VM.
// Give it to the driver (Wired, Kick) and to the agent (Config.Net).
type NetPlane struct {
	plane   Plane
	closer  func() error
	gateway bool
	kick    chan struct{}
	applied atomic.Int64 // the revision last applied, -1 before the first

	mu   sync.Mutex
	c    *client // the agent's, once it runs
	host string  // the host the state is for, once the loop runs
}

// NewNetPlane makes the host's data plane from cfg, with the agent's
// metadata relay as its metadata source. A host with a provider bridge
// is a gateway host: it carries routers.
func NewNetPlane(cfg netplane.Config) (*NetPlane, error) {
	n := newNetPlane(nil, cfg.ProviderBridge != "")
	cfg.Metadata = n
	p, err := netplane.New(cfg)
	if err != nil {
		return nil, err
	}
	n.plane, n.closer = p, p.Close
	return n, nil
}

func newNetPlane(p Plane, gateway bool) *NetPlane {
	n := &NetPlane{plane: p, gateway: gateway, kick: make(chan struct{}, 1)}
	n.applied.Store(-1)
	return n
}

// Close stops the data plane's servers (DHCP, metadata proxies); the
// devices and rules stay, so that guests keep their traffic while the
// agent restarts.
func (n *NetPlane) Close() error {
	if n.closer == nil {
		return nil
	}
	return n.closer()
}

// Wired tells whether the ports are wired on this host.
func (n *NetPlane) Wired(portIDs ...string) bool { return n.plane.Wired(portIDs...) }

// Kick asks for the controller's state to be fetched and applied now,
// without waiting for a change: the driver calls it before it starts a
// VM whose ports are not wired yet.
func (n *NetPlane) Kick() {
	select {
	case n.kick <- struct{}{}:
	default:
	}
}

// Applied is the revision of the state last applied, -1 before the
// first.
func (n *NetPlane) Applied() int64 { return n.applied.Load() }

// describe marks the hosts as bridged, and as gateways when this one
// reaches the provider network.
func (n *NetPlane) describe(hosts []driver.Host) {
	if n == nil {
		return
	}
	for i := range hosts {
		hosts[i].NetworkMode, hosts[i].Gateway = "bridged", n.gateway
	}
}

// metadataTimeout bounds one metadata request through the controller: a
// guest's cloud-init retries, and must not hang on a controller away.
const metadataTimeout = 10 * time.Second

// Metadata relays a guest's metadata request to the controller. A
// request from an address no server of this host has is the guest's 404,
// as Neutron's metadata agent answers it, not a failure.
func (n *NetPlane) Metadata(ctx context.Context, req wire.MetadataRequest) (wire.MetadataResponse, error) {
	n.mu.Lock()
	c, host := n.c, n.host
	n.mu.Unlock()
	if c == nil || host == "" {
		return wire.MetadataResponse{}, errors.New("agent: not connected to the controller yet")
	}
	if req.Host == "" {
		req.Host = host
	}
	resp, err := c.metadata(ctx, req, metadataTimeout)
	var se *statusError
	if errors.As(err, &se) && se.status == http.StatusNotFound {
		return wire.MetadataResponse{Status: http.StatusNotFound, ContentType: "text/plain; charset=utf-8", Body: []byte("404 Not Found\n")}, nil
	}
	return resp, err
}

var _ netplane.MetadataSource = (*NetPlane)(nil)

// netLoop keeps the host's data plane at the controller's state: first
// the current state at once (after an agent restart or a host reboot this
// rebuilds every device), then each newer one as it comes. Errors are
// retried with backoff, each distinct one logged once.
func (a *Agent) netLoop(ctx context.Context, n *NetPlane) {
	select {
	case <-a.ready: // the controller answers only for registered hosts
	case <-ctx.Done():
		return
	}
	host, err := a.netHost(ctx)
	if err != nil {
		a.log.Error("agent: no host for the network state; the data plane is not kept", "error", err)
		return
	}
	n.mu.Lock()
	n.c, n.host = a.c, host
	n.mu.Unlock()
	bo := a.backoff()
	after := int64(-1) // anything: the current state at once
	failed := ""
	for ctx.Err() == nil {
		rev, err := a.netStep(ctx, n, host, after)
		if errors.Is(err, errKicked) {
			after = -1
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			if msg := err.Error(); msg != failed {
				a.log.Warn("agent: network state not applied, retrying", "error", err)
				failed = msg
			}
			select {
			case <-n.kick:
			case <-time.After(bo.next()):
			case <-ctx.Done():
				return
			}
			continue
		}
		if failed != "" {
			a.log.Info("agent: network state applied again", "revision", rev)
			failed = ""
		}
		bo.reset()
		after = rev
	}
}

// errKicked ends a long-poll that a Kick cut short.
var errKicked = errors.New("agent: network state wanted now")

// netStep fetches the host's state newer than after (or the current one
// at once when kicked meanwhile), checks it and applies it.
func (a *Agent) netStep(ctx context.Context, n *NetPlane, host string, after int64) (int64, error) {
	pctx, cancel := context.WithCancel(ctx)
	kicked := make(chan bool, 1)
	go func() {
		select {
		case <-n.kick:
			cancel()
			kicked <- true
		case <-pctx.Done():
			kicked <- false
		}
	}()
	st, err := a.c.netState(pctx, wire.NetStateRequest{Host: host, After: after}, pollWait+15*time.Second)
	cancel()
	wasKicked := <-kicked
	if err != nil {
		if wasKicked && ctx.Err() == nil {
			return 0, errKicked
		}
		return 0, fmt.Errorf("fetching: %w", err)
	}
	if wasKicked {
		// The kick came with this answer, which may predate what it wants.
		n.Kick()
	}
	if st.Host != host {
		return 0, fmt.Errorf("the controller sent the state of host %q, not %q", st.Host, host)
	}
	if err := st.Validate(); err != nil {
		return 0, err
	}
	if after >= 0 && st.Revision <= after {
		// The wait ended with nothing new: nothing to apply.
		return after, nil
	}
	start := time.Now()
	if err := n.plane.Apply(ctx, st); err != nil {
		return 0, fmt.Errorf("applying revision %d: %w", st.Revision, err)
	}
	n.applied.Store(st.Revision)
	a.log.Debug("agent: network state applied", "revision", st.Revision, "ports", len(st.Ports),
		"ms", time.Since(start).Milliseconds())
	return st.Revision, nil
}

// netHost is the one host whose network the agent keeps: bridged
// networking is a real host's, one per agent.
func (a *Agent) netHost(ctx context.Context) (string, error) {
	hosts, err := a.drv.Hosts(ctx)
	if err != nil {
		return "", err
	}
	if len(hosts) != 1 {
		return "", fmt.Errorf("the driver presents %d hosts; bridged networking needs exactly one", len(hosts))
	}
	return hosts[0].Name, nil
}

// ProviderBridgeName is the bridge the agent makes for
// --provider-interface.
const ProviderBridgeName = "nbr-provider"

// ProviderBridge makes (or keeps) bridge ProviderBridgeName in the
// agent's network namespace with iface enslaved, both up, and returns
// its name. It moves no addresses: the host's own address on the provider
// network belongs on the bridge, which the operator puts there.
func ProviderBridge(iface string) (string, error) {
	link, err := netlink.LinkByName(iface)
	if err != nil {
		return "", fmt.Errorf("agent: provider interface %s: %w", iface, err)
	}
	br, err := netlink.LinkByName(ProviderBridgeName)
	if err != nil {
		la := netlink.NewLinkAttrs()
		la.Name = ProviderBridgeName
		if err := netlink.LinkAdd(&netlink.Bridge{LinkAttrs: la}); err != nil && !errors.Is(err, syscall.EEXIST) {
			return "", fmt.Errorf("agent: making bridge %s: %w", ProviderBridgeName, err)
		}
		if br, err = netlink.LinkByName(ProviderBridgeName); err != nil {
			return "", fmt.Errorf("agent: bridge %s: %w", ProviderBridgeName, err)
		}
	}
	if _, ok := br.(*netlink.Bridge); !ok {
		return "", fmt.Errorf("agent: %s exists and is a %s, not a bridge", ProviderBridgeName, br.Type())
	}
	if link.Attrs().MasterIndex != br.Attrs().Index {
		if link.Attrs().MasterIndex != 0 {
			return "", fmt.Errorf("agent: provider interface %s is already enslaved to another device", iface)
		}
		if err := netlink.LinkSetMaster(link, br); err != nil {
			return "", fmt.Errorf("agent: enslaving %s to %s: %w", iface, ProviderBridgeName, err)
		}
	}
	for _, l := range []netlink.Link{link, br} {
		if err := netlink.LinkSetUp(l); err != nil {
			return "", fmt.Errorf("agent: setting %s up: %w", l.Attrs().Name, err)
		}
	}
	return ProviderBridgeName, nil
}
