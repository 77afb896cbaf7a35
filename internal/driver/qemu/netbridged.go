package qemu

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"nimbus/internal/driver"
	"nimbus/internal/netstate"
	"nimbus/internal/qmp"
)

// Wiring is the host's bridged data plane as the driver sees it: the
// agent's NetPlane, which keeps each port's tap on its network's bridge.
type Wiring interface {
	// Wired tells whether every port named is wired on this host.
	Wired(portIDs ...string) bool
	// Kick asks for the controller's state to be fetched and applied now.
	Kick()
	// Applied is the revision of the state last applied, -1 before the
	// agent applied any (it starts after the driver, and after a host
	// reboot the servers that should run wait for it).
	Applied() int64
}

// BridgedNet is the bridged data plane (--network-mode bridged): each
// port is the tap device netstate.TapName(port.ID) that the agent's data
// plane made on the port's network bridge, filtered by its security
// groups; the guest learns its address by DHCP there. Nothing is
// forwarded from host ports: users reach the guest at its own address
// (a floating IP in front of it, which compute lists first).
type BridgedNet struct {
	Wiring Wiring
	// WireTimeout bounds the wait for a server's ports before its QEMU
	// starts (default 30 s).
	WireTimeout time.Duration
	// vhost turns vhost-net on: KVM with /dev/vhost-net (set by New).
	vhost bool
}

var _ DataPlane = BridgedNet{}

// vhostNet is the kernel's virtio-net backend device.
const vhostNet = "/dev/vhost-net"

// withAccel is the data plane for accelerator accel: vhost-net under KVM
// where the host has it (under TCG the guest is too slow to gain by it).
func withAccel(p DataPlane, accel string) DataPlane {
	b, ok := p.(BridgedNet)
	if !ok {
		return p
	}
	b.vhost = accel == "kvm" && fileExists(vhostNet)
	return b
}

// Netdev returns the -netdev value for port on NIC nicID:
//
//	tap,id=<nicID>,ifname=<tap of port.ID>,script=no,downscript=no,vhost=on|off
//
// forwards are ignored: a bridged guest is reached at its address. The
// driver itself gives QEMU the tap's open file instead (passTaps).
func (b BridgedNet) Netdev(nicID string, port driver.Port, forwards map[int]int) (string, error) {
	if !isQEMUID(nicID) {
		return "", fmt.Errorf("qemu: bridged net: bad NIC id %q (want a letter, then letters, digits, '-' or '_')", nicID)
	}
	if !validPortID(port.ID) {
		return "", fmt.Errorf("qemu: bridged net: port id %q cannot name a tap device", port.ID)
	}
	vhost := "off"
	if b.vhost {
		vhost = "on"
	}
	return fmt.Sprintf("tap,id=%s,ifname=%s,script=no,downscript=no,vhost=%s", nicID, netstate.TapName(port.ID), vhost), nil
}

// The agent (root) opens each port's tap and hands QEMU the open file
// (-netdev tap,fd=N at start; QMP getfd then netdev_add tap,fd=NAME
// when hot-plugged), rather than QEMU attaching by name: the taps stay
// root's, and a QEMU that dropped to an unprivileged user (-runas)
// still gets taps made after it started, which it could not attach to
// itself (TUNSETIFF on another user's tap is EPERM).

// tunDevice is the kernel's tun/tap clone device.
const tunDevice = "/dev/net/tun"

// openTap attaches to the persistent tap name (made by the agent's data
// plane) and returns the open file: single queue, no packet info, with
// the virtio-net header QEMU's tap backend probes for (TUNGETIFF).
func openTap(name string) (*os.File, error) {
	// TUNSETIFF would make a new, unbridged tap of a name that is gone.
	if _, err := net.InterfaceByName(name); err != nil {
		return nil, fmt.Errorf("qemu: tap %s: %w", name, err)
	}
	fd, err := unix.Open(tunDevice, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("qemu: open %s: %w", tunDevice, err)
	}
	ifr, err := unix.NewIfreq(name)
	if err == nil {
		ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
		err = unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr)
	}
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("qemu: attach to tap %s: %w", name, err)
	}
	return os.NewFile(uintptr(fd), name), nil
}

// tapNetdev is the -netdev value of NIC nicID on a tap QEMU inherits as
// descriptor fd; with vhost on, QEMU opens /dev/vhost-net itself, still
// privileged at that point.
func (b BridgedNet) tapNetdev(nicID string, fd int) string {
	vhost := "off"
	if b.vhost {
		vhost = "on"
	}
	return fmt.Sprintf("tap,id=%s,fd=%d,vhost=%s", nicID, fd, vhost)
}

// passTaps opens the taps of m's NICs (ports, in NIC order, as machine
// made them) and points their -netdev at the descriptors QEMU inherits:
// files[i] is descriptor 3+i in QEMU (exec.Cmd.ExtraFiles). The caller
// closes the files once QEMU has started. Not bridged: nothing.
func (d *Driver) passTaps(m *Machine, ports []driver.Port) (files []*os.File, err error) {
	b, ok := d.cfg.Net.(BridgedNet)
	if !ok {
		return nil, nil
	}
	if len(ports) != len(m.NICs) {
		return nil, fmt.Errorf("qemu: server %s: %d NICs for %d ports", m.ID, len(m.NICs), len(ports))
	}
	defer func() {
		if err != nil {
			closeFiles(files)
			files = nil
		}
	}()
	for i, port := range ports {
		f, err := openTap(netstate.TapName(port.ID))
		if err != nil {
			return files, fmt.Errorf("qemu: server %s: port %s: %w", m.ID, port.ID, err)
		}
		files = append(files, f)
		m.NICs[i].Netdev = b.tapNetdev(m.NICs[i].ID, 2+len(files))
	}
	return files, nil
}

func closeFiles(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

// plugTap adds the netdev nid of port's tap to a live QEMU: the tap's
// file (and /dev/vhost-net's, with vhost, as an unprivileged QEMU
// cannot open it either) by getfd, then netdev_add, which takes them.
func (b BridgedNet) plugTap(ctx context.Context, mon *qmp.Monitor, nid string, port driver.Port) error {
	tap, err := openTap(netstate.TapName(port.ID))
	if err != nil {
		return err
	}
	defer tap.Close()
	args := map[string]any{"type": "tap", "id": nid, "fd": nid, "vhost": b.vhost}
	names := []string{nid}
	// A name left by an attempt cut short is replaced by getfd.
	if err := mon.ExecuteWithFile(ctx, "getfd", map[string]string{"fdname": nid}, nil, tap); err != nil {
		return fmt.Errorf("getfd: %w", err)
	}
	if b.vhost {
		vf, err := os.OpenFile(vhostNet, os.O_RDWR, 0)
		if err != nil {
			closeFDs(ctx, mon, names)
			return fmt.Errorf("qemu: %w", err)
		}
		defer vf.Close()
		vname := nid + "-vhost"
		if err := mon.ExecuteWithFile(ctx, "getfd", map[string]string{"fdname": vname}, nil, vf); err != nil {
			closeFDs(ctx, mon, names)
			return fmt.Errorf("getfd: %w", err)
		}
		names = append(names, vname)
		args["vhostfd"] = vname
	}
	if err := mon.Execute(ctx, "netdev_add", args, nil); err != nil {
		// netdev_add took what it used; drop what it did not.
		closeFDs(ctx, mon, names)
		return fmt.Errorf("netdev_add: %w", err)
	}
	return nil
}

// closeFDs drops descriptors named by getfd; names already taken or
// gone are fine.
func closeFDs(ctx context.Context, mon *qmp.Monitor, names []string) {
	ctx = context.WithoutCancel(ctx)
	for _, n := range names {
		_ = mon.Execute(ctx, "closefd", map[string]string{"fdname": n}, nil)
	}
}

// validPortID is a port id that makes a tap name QEMU's option parser
// and the kernel both take: letters, digits and '-' (Neutron's UUIDs).
func validPortID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-') {
			return false
		}
	}
	return true
}

// Access is empty: bridged mode forwards no host port; access lists the
// server's own address instead.
func (b BridgedNet) Access(forwards map[int]int) []driver.Access { return nil }

// access lists SSH (22), or RDP (3389) for Windows, at the primary
// port's fixed IP.
func (b BridgedNet) access(spec driver.Spec) []driver.Access {
	if len(spec.Ports) == 0 || spec.Ports[0].IP == "" {
		return nil
	}
	a := driver.Access{Protocol: "ssh", Host: spec.Ports[0].IP, Port: 22}
	if strings.EqualFold(spec.OSType, "windows") {
		a.Protocol, a.Port = "rdp", 3389
	}
	return []driver.Access{a}
}

// wireWait is how often the wait for a server's ports looks again, and
// wireKick how often it asks the agent's loop to fetch again.
const (
	wireWait = 50 * time.Millisecond
	wireKick = 3 * time.Second
	// wireFirst bounds the wait for the agent's first applied state.
	wireFirst = 5 * time.Minute
)

// waitWired waits until the data plane has wired ports, kicking the
// agent's loop so that it does not wait for its next long-poll answer:
// up to WireTimeout once the agent has applied a state, and up to
// wireFirst for its first one.
func (b BridgedNet) waitWired(ctx context.Context, ports []driver.Port) error {
	if len(ports) == 0 {
		return nil
	}
	if b.Wiring == nil {
		return fmt.Errorf("qemu: bridged networking without a data plane (the agent's --network-mode bridged)")
	}
	ids := make([]string, len(ports))
	for i, p := range ports {
		ids[i] = p.ID
	}
	if b.Wiring.Wired(ids...) {
		return nil
	}
	timeout := b.WireTimeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	first := time.NewTimer(wireFirst)
	defer first.Stop()
	var deadline <-chan time.Time // runs once the agent applied a state
	tick := time.NewTicker(wireWait)
	defer tick.Stop()
	b.Wiring.Kick()
	kicked := time.Now()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline:
			return fmt.Errorf("qemu: ports %s were not wired on this host within %s: the agent has not applied a network state with them (see its log for why)",
				strings.Join(ids, ", "), timeout)
		case <-first.C:
			if deadline == nil {
				return fmt.Errorf("qemu: ports %s: the agent applied no network state within %s (see its log for why)",
					strings.Join(ids, ", "), wireFirst)
			}
		case <-tick.C:
		}
		if deadline == nil && b.Wiring.Applied() >= 0 {
			deadline = time.After(timeout)
		}
		if b.Wiring.Wired(ids...) {
			return nil
		}
		if time.Since(kicked) >= wireKick {
			b.Wiring.Kick()
			kicked = time.Now()
		}
	}
}

// forwarding tells whether the data plane forwards host ports to guests
// (user-mode networking), so that the driver claims one per server.
func (d *Driver) forwarding() bool {
	_, bridged := d.cfg.Net.(BridgedNet)
	return !bridged
}

// wire waits until v's ports are wired, in bridged mode.
func (d *Driver) wire(ctx context.Context, v *vm) error {
	b, ok := d.cfg.Net.(BridgedNet)
	if !ok {
		return nil
	}
	v.mu.Lock()
	ports := v.st.Spec.Ports
	v.mu.Unlock()
	start := time.Now()
	if err := b.waitWired(ctx, ports); err != nil {
		return fmt.Errorf("qemu: server %s: %w", v.id, err)
	}
	if ms := time.Since(start).Milliseconds(); ms > 0 {
		d.log.Debug("qemu: ports wired", "server", v.id, "waited_ms", ms)
	}
	return nil
}

// access lists how to reach a server with record st.
func (d *Driver) access(st state) []driver.Access {
	if b, ok := d.cfg.Net.(BridgedNet); ok {
		return b.access(st.Spec)
	}
	return d.cfg.Net.Access(st.Forwards)
}
