package netplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"

	"github.com/vishvananda/netlink"

	"nimbus/internal/netstate"
)

// part is one layer of the data plane. The Plane runs its parts in order
// (l2, firewall, dhcp, routers), each over the whole desired state.
type part interface {
	// apply makes the host match st and removes what this part made that
	// st does not explain.
	apply(ctx context.Context, st *netstate.Host) error
	// close stops the part's goroutines (servers); devices stay.
	close() error
}

// Plane applies a host's desired network state. Apply is serialised and
// idempotent: every call converges the host on the state it is given, so
// a failed call is retried whole by the next.
type Plane struct {
	cfg   Config
	names []string
	parts []part

	mu     sync.Mutex // serialises Apply and Close
	closed bool

	wiredMu sync.Mutex // guards wired and link
	// wired is, per port of the last Apply that fully succeeded, the
	// bridge its device belongs on and whether it is administratively up.
	wired map[string]wiredPort
	link  *netlink.Handle
}

type wiredPort struct {
	bridge string
	up     bool
}

// New builds a host's data plane from its parts; nothing is touched
// before the first Apply.
func New(cfg Config) (*Plane, error) {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.VTEP != "" {
		if ip := net.ParseIP(cfg.VTEP); ip == nil || ip.To4() == nil {
			return nil, fmt.Errorf("netplane: VTEP %q is not an IPv4 address", cfg.VTEP)
		}
	}
	// The parts, in the order Apply runs them.
	builders := []struct {
		name  string
		build func(Config) (part, error)
	}{
		{"l2", newL2},
		{"firewall", newFirewall},
		{"dhcp", newDHCP},
		{"routers", newRouters},
	}
	h, err := nsHandle(cfg.NetNS)
	if err != nil {
		return nil, err
	}
	p := &Plane{cfg: cfg, link: h}
	for _, b := range builders {
		pt, err := b.build(cfg)
		if err != nil {
			_ = p.Close()
			return nil, fmt.Errorf("netplane: %s: %w", b.name, err)
		}
		p.names = append(p.names, b.name)
		p.parts = append(p.parts, pt)
	}
	return p, nil
}

// Apply makes the host match st. Every part runs even when an earlier one
// failed, so that a port l2 wired is never left without its filter
// because an unrelated step broke; the error names each failed part.
func (p *Plane) Apply(ctx context.Context, st *netstate.Host) error {
	if st == nil {
		return errors.New("netplane: no state")
	}
	if err := st.Validate(); err != nil {
		return err
	}
	if err := p.consistent(st); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errors.New("netplane: plane closed")
	}
	var errs []error
	for i, pt := range p.parts {
		if err := ctx.Err(); err != nil {
			errs = append(errs, err)
			break
		}
		if err := pt.apply(ctx, st); err != nil {
			errs = append(errs, fmt.Errorf("netplane: %s: %w", p.names[i], err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	p.setWired(st)
	return nil
}

// consistent refuses a state meant for another host: one whose VTEP is
// not ours, or that names this host among its own peers.
func (p *Plane) consistent(st *netstate.Host) error {
	if len(st.Networks) > 0 && p.cfg.VTEP == "" {
		return errors.New("netplane: state has networks but the plane has no VTEP")
	}
	if st.VTEP != "" && st.VTEP != p.cfg.VTEP {
		return fmt.Errorf("netplane: state for VTEP %s (host %q), this host's is %s", st.VTEP, st.Host, p.cfg.VTEP)
	}
	for _, n := range st.Networks {
		for _, peer := range n.Peers {
			if peer.VTEP == p.cfg.VTEP || (st.Host != "" && peer.Host == st.Host) {
				return fmt.Errorf("netplane: network %s lists this host (%s, %s) as its own peer", n.ID, peer.Host, peer.VTEP)
			}
		}
	}
	return nil
}

func (p *Plane) setWired(st *netstate.Host) {
	w := map[string]wiredPort{}
	for _, port := range st.Ports {
		w[port.ID] = wiredPort{bridge: netstate.BridgeName(port.NetworkID), up: port.AdminUp}
	}
	p.wiredMu.Lock()
	p.wired = w
	p.wiredMu.Unlock()
}

// Wired reports whether every port's device is in place, as of the last
// Apply that succeeded and as the host has it now: the device exists, is
// on its network's bridge and is up (down for a port that is
// administratively down). The qemu driver waits on it before it starts a
// server.
func (p *Plane) Wired(portIDs ...string) bool {
	p.wiredMu.Lock()
	defer p.wiredMu.Unlock()
	if p.link == nil {
		return false
	}
	for _, id := range portIDs {
		w, ok := p.wired[id]
		if !ok || !p.linkWired(netstate.TapName(id), w) {
			return false
		}
	}
	return true
}

func (p *Plane) linkWired(name string, w wiredPort) bool {
	l, err := p.link.LinkByName(name)
	if err != nil {
		return false
	}
	br, err := p.link.LinkByName(w.bridge)
	if err != nil || l.Attrs().MasterIndex != br.Attrs().Index {
		return false
	}
	return (l.Attrs().Flags&net.FlagUp != 0) == w.up
}

// Close stops the parts' servers; the devices stay, so that guests keep
// their network while the agent restarts.
func (p *Plane) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	var errs []error
	for i, pt := range p.parts {
		if err := pt.close(); err != nil {
			errs = append(errs, fmt.Errorf("netplane: %s: %w", p.names[i], err))
		}
	}
	p.wiredMu.Lock()
	if p.link != nil {
		p.link.Close()
		p.link = nil
	}
	p.wiredMu.Unlock()
	return errors.Join(errs...)
}
