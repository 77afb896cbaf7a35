package netplane

import (
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"slices"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"nimbus/internal/netstate"
)

// l2 is the switching layer: a bridge per network with its VXLAN device,
// the VXLAN forwarding entries to the network's other hosts
// (l2population: no multicast, broadcasts only to hosts with the
// network), and a tap per server port on its network's bridge.
type l2 struct {
	cfg Config
	h   *netlink.Handle
}

// vxlanPort is the IANA VXLAN port, the same on every host.
const vxlanPort = 4789

// Names this part makes, matched strictly (the id-shaped suffix of a
// UUID, or a VNI), so that an operator's own tap0 or br-x is never ours.
var (
	tapRE    = regexp.MustCompile(`^` + netstate.TapPrefix + `[0-9a-f]{8}-[0-9a-f]{2}$`)
	bridgeRE = regexp.MustCompile(`^` + netstate.BridgePrefix + `[0-9a-f]{8}-[0-9a-f]{2}$`)
	vxlanRE  = regexp.MustCompile(`^` + netstate.VXLANPrefix + `[1-9][0-9]{0,7}$`)
)

func newL2(cfg Config) (part, error) {
	h, err := nsHandle(cfg.NetNS)
	if err != nil {
		return nil, err
	}
	return &l2{cfg: cfg, h: h}, nil
}

func (l *l2) close() error {
	l.h.Close()
	return nil
}

// apply wires every network and port of st, then removes the bridges,
// VXLAN devices and taps that st does not explain. A failed network or
// port does not stop the others; the error names each.
func (l *l2) apply(ctx context.Context, st *netstate.Host) error {
	if len(st.Networks) > 0 {
		if err := l.checkMTU(st.Networks); err != nil {
			return err
		}
	}
	nets := map[string]netstate.Network{}
	var errs []error
	for _, n := range st.Networks {
		if err := ctx.Err(); err != nil {
			return err
		}
		nets[n.ID] = n
		if err := l.network(n); err != nil {
			errs = append(errs, fmt.Errorf("network %s: %w", n.ID, err))
		}
	}
	var up []string
	for _, p := range st.Ports {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := l.port(p, nets[p.NetworkID]); err != nil {
			errs = append(errs, fmt.Errorf("port %s: %w", p.ID, err))
		} else if p.AdminUp {
			up = append(up, netstate.TapName(p.ID))
		}
	}
	l.awaitForwarding(ctx, up)
	if err := l.removeOrphans(st); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// checkMTU refuses a network whose frames, with the VXLAN header, would
// not fit the underlay.
func (l *l2) checkMTU(nets []netstate.Network) error {
	under, err := l.underlayMTU()
	if err != nil {
		return err
	}
	for _, n := range nets {
		if n.MTU > under-netstate.Overhead {
			return fmt.Errorf("network %s: MTU %d exceeds the underlay's %d less VXLAN's %d bytes (max %d)",
				n.ID, n.MTU, under, netstate.Overhead, under-netstate.Overhead)
		}
	}
	return nil
}

// underlayMTU is Config.UnderlayMTU or else the MTU of the link that holds
// the VTEP address.
func (l *l2) underlayMTU() (int, error) {
	if l.cfg.UnderlayMTU > 0 {
		return l.cfg.UnderlayMTU, nil
	}
	vtep := net.ParseIP(l.cfg.VTEP)
	addrs, err := l.h.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return 0, fmt.Errorf("list addresses: %w", err)
	}
	for _, a := range addrs {
		if a.IP.Equal(vtep) {
			link, err := l.h.LinkByIndex(a.LinkIndex)
			if err != nil {
				return 0, fmt.Errorf("underlay link of %s: %w", vtep, err)
			}
			return link.Attrs().MTU, nil
		}
	}
	return 0, fmt.Errorf("no link in the host namespace holds the VTEP address %s", vtep)
}

// network makes network n's bridge and VXLAN device and its forwarding
// entries.
func (l *l2) network(n netstate.Network) error {
	br, err := l.ensureLink(netstate.BridgeName(n.ID), isBridge, func(name string) error {
		return l.h.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name, MTU: n.MTU}, MulticastSnooping: new(false)})
	})
	if err != nil {
		return err
	}
	// No IGMP snooping (Neutron's default too): with it the bridge itself
	// would speak multicast router discovery onto the tenant network.
	if s := br.(*netlink.Bridge).MulticastSnooping; s == nil || *s {
		if err := l.h.BridgeSetMcastSnoop(br, false); err != nil {
			return fmt.Errorf("%s: multicast snooping off: %w", br.Attrs().Name, err)
		}
	}
	if err := l.setup(br, n.MTU, nil, 0, true); err != nil {
		return err
	}
	vx, err := l.ensureLink(netstate.VXLANName(n.VNI), l.isOurVXLAN(n.VNI), func(name string) error {
		return l.h.LinkAdd(&netlink.Vxlan{
			LinkAttrs: netlink.LinkAttrs{Name: name, MTU: n.MTU},
			VxlanId:   int(n.VNI),
			SrcAddr:   net.ParseIP(l.cfg.VTEP),
			Port:      vxlanPort,
			Learning:  false,
		})
	})
	if err != nil {
		return err
	}
	if err := l.setup(vx, n.MTU, nil, br.Attrs().Index, true); err != nil {
		return err
	}
	return l.fdb(n, vx)
}

func isBridge(link netlink.Link) bool { return link.Type() == "bridge" }

// isOurVXLAN tells whether a link is the VXLAN device this host wants for
// vni; one made with another VTEP (the host's address changed) or by
// hand is replaced.
func (l *l2) isOurVXLAN(vni uint32) func(netlink.Link) bool {
	vtep := net.ParseIP(l.cfg.VTEP)
	return func(link netlink.Link) bool {
		vx, ok := link.(*netlink.Vxlan)
		return ok && vx.VxlanId == int(vni) && vx.SrcAddr.Equal(vtep) && vx.Port == vxlanPort && !vx.Learning
	}
}

// ensureLink returns link name, made by create when it is missing or is
// not what ok accepts (it is deleted first).
func (l *l2) ensureLink(name string, ok func(netlink.Link) bool, create func(name string) error) (netlink.Link, error) {
	link, err := l.h.LinkByName(name)
	if err == nil && ok(link) {
		return link, nil
	}
	if err == nil {
		if err := l.h.LinkDel(link); err != nil {
			return nil, fmt.Errorf("replace %s: %w", name, err)
		}
	} else if !isNotFound(err) {
		return nil, fmt.Errorf("look up %s: %w", name, err)
	}
	if err := create(name); err != nil {
		return nil, fmt.Errorf("make %s: %w", name, err)
	}
	link, err = l.h.LinkByName(name)
	if err != nil {
		return nil, fmt.Errorf("look up %s: %w", name, err)
	}
	return link, nil
}

func isNotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf)
}

// setup brings a device to its wanted MTU, MAC (when mac is not nil),
// master (when master is not 0) and up or down state, changing only what
// differs. IPv6 address generation is turned off first: the host has no
// business on a tenant network, and a link-local address would make it
// reachable there and let it send router and neighbour solicitations.
func (l *l2) setup(link netlink.Link, mtu int, mac net.HardwareAddr, master int, up bool) error {
	a := link.Attrs()
	// Best effort: a kernel without IPv6 refuses it and needs none.
	_ = l.h.LinkSetIP6AddrGenMode(link, 1) // IN6_ADDR_GEN_MODE_NONE
	if a.MTU != mtu {
		if err := l.h.LinkSetMTU(link, mtu); err != nil {
			return fmt.Errorf("%s: set MTU %d: %w", a.Name, mtu, err)
		}
	}
	if mac != nil && a.HardwareAddr.String() != mac.String() {
		if err := l.h.LinkSetHardwareAddr(link, mac); err != nil {
			return fmt.Errorf("%s: set MAC %s: %w", a.Name, mac, err)
		}
	}
	if master != 0 && a.MasterIndex != master {
		if err := l.h.LinkSetMasterByIndex(link, master); err != nil {
			return fmt.Errorf("%s: set master: %w", a.Name, err)
		}
	}
	isUp := a.Flags&net.FlagUp != 0
	switch {
	case up && !isUp:
		if err := l.h.LinkSetUp(link); err != nil {
			return fmt.Errorf("%s: set up: %w", a.Name, err)
		}
	case !up && isUp:
		if err := l.h.LinkSetDown(link); err != nil {
			return fmt.Errorf("%s: set down: %w", a.Name, err)
		}
	}
	return nil
}

// fdbKey is one VXLAN forwarding entry: a MAC behind a remote VTEP.
type fdbKey struct{ mac, vtep string }

var zeroMAC = net.HardwareAddr{0, 0, 0, 0, 0, 0}

// fdb makes n's VXLAN forwarding entries those of its peers: an all-zeros
// entry per peer, so that broadcasts and unknown unicast go to exactly
// the hosts with the network, and an entry per MAC behind each peer.
func (l *l2) fdb(n netstate.Network, vx netlink.Link) error {
	want := map[fdbKey]bool{}
	macAt := map[string]string{} // one VTEP per MAC, as the kernel keeps it
	for _, p := range n.Peers {
		vtep := net.ParseIP(p.VTEP).String()
		want[fdbKey{zeroMAC.String(), vtep}] = true
		for _, m := range p.MACs {
			hw, err := net.ParseMAC(m)
			if err != nil {
				return fmt.Errorf("peer %s: bad MAC %q", p.Host, m)
			}
			macAt[hw.String()] = vtep
		}
	}
	for mac, vtep := range macAt {
		want[fdbKey{mac, vtep}] = true
	}
	have, err := l.h.NeighList(vx.Attrs().Index, unix.AF_BRIDGE)
	if err != nil {
		return fmt.Errorf("%s: list FDB: %w", vx.Attrs().Name, err)
	}
	for _, e := range have {
		// The VXLAN device's own entries (NTF_SELF with a remote), not
		// the bridge's learned ones for this port.
		if e.Flags&netlink.NTF_SELF == 0 || e.IP == nil {
			continue
		}
		k := fdbKey{e.HardwareAddr.String(), e.IP.String()}
		if want[k] {
			delete(want, k)
			continue
		}
		if err := l.h.NeighDel(&e); err != nil {
			return fmt.Errorf("%s: remove FDB %s → %s: %w", vx.Attrs().Name, k.mac, k.vtep, err)
		}
	}
	for k := range want {
		hw, _ := net.ParseMAC(k.mac)
		e := &netlink.Neigh{
			LinkIndex:    vx.Attrs().Index,
			Family:       unix.AF_BRIDGE,
			Flags:        netlink.NTF_SELF,
			State:        netlink.NUD_PERMANENT | netlink.NUD_NOARP,
			HardwareAddr: hw,
			IP:           net.ParseIP(k.vtep),
		}
		add := l.h.NeighSet
		if k.mac == zeroMAC.String() {
			add = l.h.NeighAppend // one all-zeros entry per peer
		}
		if err := add(e); err != nil {
			return fmt.Errorf("%s: add FDB %s → %s: %w", vx.Attrs().Name, k.mac, k.vtep, err)
		}
	}
	return nil
}

// port wires server port p: its tap (or the device of that name that
// exists, adopted) on n's bridge.
func (l *l2) port(p netstate.Port, n netstate.Network) error {
	br, err := l.h.LinkByName(netstate.BridgeName(n.ID))
	if err != nil {
		return fmt.Errorf("bridge of network %s: %w", n.ID, err)
	}
	name := netstate.TapName(p.ID)
	dev, err := l.ensureLink(name, func(netlink.Link) bool { return true }, l.makeTap)
	if err != nil {
		return err
	}
	mac, err := tapMAC(p.MAC)
	if err != nil {
		return err
	}
	return l.setup(dev, n.MTU, mac, br.Attrs().Index, p.AdminUp)
}

// awaitForwarding waits, a bounded time, until the ports with a carrier
// (a veth, a tap QEMU holds) are operationally up. The kernel marks them
// so, and only then lets the bridge forward to them, from a deferred
// work item; a frame sent before is dropped, and the ARP request it was
// costs the sender a second's retry.
func (l *l2) awaitForwarding(ctx context.Context, names []string) {
	const limit = time.Second
	for end := time.Now().Add(limit); len(names) > 0 && time.Now().Before(end) && ctx.Err() == nil; {
		names = slices.DeleteFunc(names, func(name string) bool {
			link, err := l.h.LinkByName(name)
			if err != nil {
				return true
			}
			carrier := link.Attrs().RawFlags&unix.IFF_LOWER_UP != 0
			return !carrier || link.Attrs().OperState == netlink.OperUp
		})
		if len(names) > 0 {
			time.Sleep(time.Millisecond)
		}
	}
}

// makeTap makes a persistent, single-queue tap that QEMU opens with
// -netdev tap,ifname=NAME,script=no,downscript=no (vnet_hdr on or off: a
// persistent tap takes the features of whoever attaches). /dev/net/tun
// makes it in the namespace of the thread that opens it, hence inNS.
func (l *l2) makeTap(name string) error {
	return inNS(l.cfg.NetNS, func() error {
		return l.h.LinkAdd(&netlink.Tuntap{
			LinkAttrs: netlink.LinkAttrs{Name: name},
			Mode:      netlink.TUNTAP_MODE_TAP,
			Flags:     netlink.TUNTAP_NO_PI | netlink.TUNTAP_VNET_HDR | netlink.TUNTAP_TUN_EXCL,
		})
	})
}

// tapMAC is the host side's MAC for a port: the guest's with the first
// byte 0xfe, as libvirt does, so that the bridge never takes the tap for
// the guest and never takes the tap's MAC as its own.
func tapMAC(portMAC string) (net.HardwareAddr, error) {
	hw, err := net.ParseMAC(portMAC)
	if err != nil || len(hw) != 6 {
		return nil, fmt.Errorf("bad MAC %q", portMAC)
	}
	hw[0] = 0xfe
	return hw, nil
}

// removeOrphans deletes the taps, VXLAN devices and bridges named like
// ours that st does not explain, taps first so that a bridge goes empty.
func (l *l2) removeOrphans(st *netstate.Host) error {
	keep := map[string]bool{}
	for _, n := range st.Networks {
		keep[netstate.BridgeName(n.ID)] = true
		keep[netstate.VXLANName(n.VNI)] = true
	}
	for _, p := range st.Ports {
		keep[netstate.TapName(p.ID)] = true
	}
	links, err := l.h.LinkList()
	if err != nil {
		return fmt.Errorf("list links: %w", err)
	}
	var errs []error
	for _, re := range []*regexp.Regexp{tapRE, vxlanRE, bridgeRE} {
		for _, link := range links {
			name := link.Attrs().Name
			if keep[name] || !re.MatchString(name) {
				continue
			}
			if err := l.h.LinkDel(link); err != nil && !isNotFound(err) {
				errs = append(errs, fmt.Errorf("remove %s: %w", name, err))
			}
		}
	}
	return errors.Join(errs...)
}
