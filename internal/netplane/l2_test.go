package netplane

import (
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/google/uuid"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"nimbus/internal/netstate"
)

// The simulated cloud: hosts are namespaces joined by a veth (the
// underlay, 192.0.2.0/24); a server is a "guest" namespace whose eth0 is
// the peer of a veth named TapName(port) in its host's namespace, which
// l2 adopts as the port's device. Every guest runs a UDP echo server that
// answers with its label, so a reply says who answered.

const (
	underlayDev = "und0"
	echoPort    = 7777
	testMTU     = 1450 // the underlay's 1500 less VXLAN's 50
)

type simHost struct {
	name  string
	ns    string
	vtep  string
	plane *Plane
}

type guest struct {
	label string
	ns    string
	host  *simHost
	port  netstate.Port
	ip    string
}

// cloud is the controller's side in miniature: networks and placed
// ports, from which each host's state is built with l2population peers.
type cloud struct {
	hosts  []*simHost
	nets   []netstate.Network
	guests []*guest
	groups []netstate.SecurityGroup // every host's, for ports with port security
}

// twoHosts makes two hosts joined by an underlay veth, each with a Plane.
func twoHosts(t testing.TB) *cloud {
	t.Helper()
	a, b := testNS(t), testNS(t)
	ha := nsH(t, a)
	bfd, err := netns.GetFromPath(b)
	if err != nil {
		t.Fatal(err)
	}
	defer bfd.Close()
	if err := ha.LinkAdd(&netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: underlayDev},
		PeerName:      underlayDev,
		PeerNamespace: netlink.NsFd(bfd),
	}); err != nil {
		t.Fatal(err)
	}
	c := &cloud{}
	for i, ns := range []string{a, b} {
		h := &simHost{name: fmt.Sprintf("host%d", i), ns: ns, vtep: fmt.Sprintf("192.0.2.%d", i+1)}
		bringUp(t, ns, underlayDev, h.vtep+"/24", nil)
		h.plane = newTestPlane(t, ns, h.vtep)
		c.hosts = append(c.hosts, h)
	}
	return c
}

func newTestPlane(t testing.TB, ns, vtep string) *Plane {
	t.Helper()
	p, err := New(Config{NetNS: ns, Prefix: testName(t, "-"), VTEP: vtep})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// nsH is a netlink handle in ns, closed at the end of the test.
func nsH(t testing.TB, ns string) *netlink.Handle {
	t.Helper()
	h, err := nsHandle(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

// bringUp gives link name in ns an address (and a MAC) and sets it up.
func bringUp(t testing.TB, ns, name, cidr string, mac net.HardwareAddr) {
	t.Helper()
	h, err := nsHandle(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	link, err := h.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	if mac != nil {
		if err := h.LinkSetHardwareAddr(link, mac); err != nil {
			t.Fatal(err)
		}
	}
	addr, err := netlink.ParseAddr(cidr)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.AddrAdd(link, addr); err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetUp(link); err != nil {
		t.Fatal(err)
	}
}

func randomMAC(t testing.TB) string {
	t.Helper()
	b := make([]byte, 3)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("fa:16:3e:%02x:%02x:%02x", b[0], b[1], b[2])
}

// addNet adds a tenant network to the cloud.
func (c *cloud) addNet(vni uint32, project string) netstate.Network {
	n := netstate.Network{ID: uuid.NewString(), ProjectID: project, VNI: vni, MTU: testMTU}
	c.nets = append(c.nets, n)
	return n
}

// addGuest places a server with address ip (a /24) on network n at host
// h: its guest namespace, its veth, its echo server.
func (c *cloud) addGuest(t testing.TB, h *simHost, n netstate.Network, ip, label string) *guest {
	t.Helper()
	g := &guest{label: label, host: h, ip: ip, port: netstate.Port{
		ID: uuid.NewString(), NetworkID: n.ID, MAC: randomMAC(t), AdminUp: true,
		IPs: []netstate.FixedIP{{IP: ip}},
	}}
	g.ns = testNS(t)
	c.plug(t, g)
	serveEcho(t, g)
	c.guests = append(c.guests, g)
	return g
}

// plug makes g's device: a veth TapName(port) in its host's namespace
// with eth0 in the guest's.
func (c *cloud) plug(t testing.TB, g *guest) {
	t.Helper()
	gfd, err := netns.GetFromPath(g.ns)
	if err != nil {
		t.Fatal(err)
	}
	defer gfd.Close()
	h, err := nsHandle(g.host.ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := h.LinkAdd(&netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: netstate.TapName(g.port.ID), MTU: testMTU},
		PeerName:      "eth0",
		PeerNamespace: netlink.NsFd(gfd),
		PeerMTU:       testMTU,
	}); err != nil {
		t.Fatal(err)
	}
	mac, _ := net.ParseMAC(g.port.MAC)
	bringUp(t, g.ns, "eth0", g.ip+"/24", mac)
}

// remove takes g's port out of the cloud.
func (c *cloud) remove(g *guest) {
	c.guests = slices.DeleteFunc(c.guests, func(x *guest) bool { return x == g })
}

// state is host h's desired state: the networks its ports are on, each
// with the other hosts that have it and their MACs.
func (c *cloud) state(h *simHost) *netstate.Host {
	st := &netstate.Host{Host: h.name, VTEP: h.vtep}
	for _, n := range c.nets {
		here := false
		peers := map[*simHost]*netstate.Peer{}
		for _, g := range c.guests {
			if g.port.NetworkID != n.ID {
				continue
			}
			if g.host == h {
				here = true
				continue
			}
			p := peers[g.host]
			if p == nil {
				p = &netstate.Peer{Host: g.host.name, VTEP: g.host.vtep}
				peers[g.host] = p
			}
			p.MACs = append(p.MACs, g.port.MAC)
		}
		if !here {
			continue
		}
		for _, other := range c.hosts {
			if p := peers[other]; p != nil {
				n.Peers = append(n.Peers, *p)
			}
		}
		st.Networks = append(st.Networks, n)
	}
	for _, g := range c.guests {
		if g.host == h {
			st.Ports = append(st.Ports, g.port)
		}
	}
	st.SecurityGroups = c.groups
	return st
}

// apply applies every host's state.
func (c *cloud) apply(t testing.TB) {
	t.Helper()
	for _, h := range c.hosts {
		if err := h.plane.Apply(context.Background(), c.state(h)); err != nil {
			t.Fatalf("%s: %v", h.name, err)
		}
	}
}

// serveEcho answers every UDP datagram to g's echo port with g's label.
func serveEcho(t testing.TB, g *guest) {
	t.Helper()
	var pc net.PacketConn
	if err := inNS(g.ns, func() (err error) {
		pc, err = net.ListenPacket("udp4", fmt.Sprintf(":%d", echoPort))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pc.Close() })
	go func() {
		buf := make([]byte, 64)
		for {
			_, addr, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = pc.WriteTo([]byte(g.label), addr)
		}
	}()
}

// reach sends echo requests from g to ip until one is answered or within
// passes, and returns the label of who answered ("" for nobody).
func reach(t testing.TB, g *guest, ip string, within time.Duration) string {
	t.Helper()
	var pc net.PacketConn
	if err := inNS(g.ns, func() (err error) {
		pc, err = net.ListenPacket("udp4", ":0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	dst := &net.UDPAddr{IP: net.ParseIP(ip), Port: echoPort}
	buf := make([]byte, 64)
	for end := time.Now().Add(within); time.Now().Before(end); {
		_, _ = pc.WriteTo([]byte("ping"), dst)
		_ = pc.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
		if n, _, err := pc.ReadFrom(buf); err == nil {
			return string(buf[:n])
		}
	}
	return ""
}

// links is the set of link names in ns.
func links(t testing.TB, ns string) []string {
	t.Helper()
	h, err := nsHandle(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ls, err := h.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range ls {
		names = append(names, l.Attrs().Name)
	}
	slices.Sort(names)
	return names
}

// fdbOf is the VXLAN device's own forwarding entries in ns, "MAC>VTEP".
func fdbOf(t testing.TB, ns string, vni uint32) []string {
	t.Helper()
	h, err := nsHandle(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	vx, err := h.LinkByName(netstate.VXLANName(vni))
	if err != nil {
		t.Fatal(err)
	}
	es, err := h.NeighList(vx.Attrs().Index, unix.AF_BRIDGE)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		if e.Flags&netlink.NTF_SELF != 0 && e.IP != nil {
			out = append(out, e.HardwareAddr.String()+">"+e.IP.String())
		}
	}
	slices.Sort(out)
	return out
}

func TestL2OwnNames(t *testing.T) {
	for _, tc := range []struct {
		name string
		ours bool
	}{
		{netstate.TapName("0123abcd-ef01-2345-6789-abcdef012345"), true},
		{netstate.BridgeName("0123abcd-ef01-2345-6789-abcdef012345"), true},
		{netstate.VXLANName(1), true},
		{netstate.VXLANName(netstate.MaxVNI), true},
		{"tap0", false},
		{"tap0123abcd", false},
		{"tap0123abcd-e", false},
		{"tap0123ABCD-ef", false},
		{"nbr-op", false},
		{"nvx0", false},
		{"nvxlan", false},
		{"br-op", false},
		{netstate.DHCPPrefix + "0123abcd-ef", false}, // the DHCP part's, not ours
	} {
		got := tapRE.MatchString(tc.name) || bridgeRE.MatchString(tc.name) || vxlanRE.MatchString(tc.name)
		if got != tc.ours {
			t.Errorf("%q: ours = %v, want %v", tc.name, got, tc.ours)
		}
	}
}

func TestL2TwoHosts(t *testing.T) {
	c := twoHosts(t)
	A, B := c.hosts[0], c.hosts[1]
	// Two projects with the same CIDR and addresses on both hosts, and a
	// network only host A has.
	n1, n2, n3 := c.addNet(101, "p1"), c.addNet(102, "p2"), c.addNet(103, "p1")
	a1 := c.addGuest(t, A, n1, "10.0.0.1", "a1")
	b1 := c.addGuest(t, B, n1, "10.0.0.2", "b1")
	a2 := c.addGuest(t, A, n2, "10.0.0.1", "a2")
	b2 := c.addGuest(t, B, n2, "10.0.0.2", "b2")
	c.addGuest(t, B, n2, "10.0.0.9", "b2x")
	c.addGuest(t, A, n3, "10.0.0.3", "a3")
	c.apply(t)
	c.apply(t) // idempotent

	for _, tc := range []struct {
		from *guest
		ip   string
		want string
	}{
		{a1, "10.0.0.2", "b1"},
		{b1, "10.0.0.1", "a1"},
		{a2, "10.0.0.2", "b2"},
		{b2, "10.0.0.1", "a2"},
		{a1, "10.0.0.9", ""}, // on the other project's network only
		{a1, "10.0.0.3", ""}, // another network of the same project
	} {
		within := 3 * time.Second
		if tc.want == "" {
			within = 500 * time.Millisecond
		}
		if got := reach(t, tc.from, tc.ip, within); got != tc.want {
			t.Errorf("%s → %s: answered by %q, want %q", tc.from.label, tc.ip, got, tc.want)
		}
	}

	t.Run("devices", func(t *testing.T) {
		h := nsH(t, A.ns)
		br, err := h.LinkByName(netstate.BridgeName(n1.ID))
		if err != nil {
			t.Fatal(err)
		}
		vx, err := h.LinkByName(netstate.VXLANName(n1.VNI))
		if err != nil {
			t.Fatal(err)
		}
		tap, err := h.LinkByName(netstate.TapName(a1.port.ID))
		if err != nil {
			t.Fatal(err)
		}
		v := vx.(*netlink.Vxlan)
		v6, err := h.AddrList(br, netlink.FAMILY_V6)
		if err != nil {
			t.Fatal(err)
		}
		wantMAC := "fe" + a1.port.MAC[2:]
		for _, chk := range []struct {
			what      string
			got, want any
		}{
			{"bridge MTU", br.Attrs().MTU, testMTU},
			{"bridge up", br.Attrs().Flags&net.FlagUp != 0, true},
			{"bridge IGMP snooping", *br.(*netlink.Bridge).MulticastSnooping, false},
			{"bridge IPv6 addresses", len(v6), 0},
			{"vxlan VNI", v.VxlanId, 101},
			{"vxlan local", v.SrcAddr.String(), A.vtep},
			{"vxlan port", v.Port, 4789},
			{"vxlan learning", v.Learning, false},
			{"vxlan MTU", v.MTU, testMTU},
			{"vxlan master", v.MasterIndex, br.Attrs().Index},
			{"vxlan up", v.Flags&net.FlagUp != 0, true},
			{"tap MAC", tap.Attrs().HardwareAddr.String(), wantMAC},
			{"tap MTU", tap.Attrs().MTU, testMTU},
			{"tap master", tap.Attrs().MasterIndex, br.Attrs().Index},
			{"tap up", tap.Attrs().Flags&net.FlagUp != 0, true},
		} {
			if chk.got != chk.want {
				t.Errorf("%s = %v, want %v", chk.what, chk.got, chk.want)
			}
		}
	})

	t.Run("fdb", func(t *testing.T) {
		for _, tc := range []struct {
			host *simHost
			vni  uint32
			want []string
		}{
			{A, n1.VNI, []string{"00:00:00:00:00:00>" + B.vtep, b1.port.MAC + ">" + B.vtep}},
			{B, n1.VNI, []string{"00:00:00:00:00:00>" + A.vtep, a1.port.MAC + ">" + A.vtep}},
			{A, n3.VNI, nil}, // B has no port on n3: no entry to it
		} {
			want := slices.Sorted(slices.Values(tc.want))
			if got := fdbOf(t, tc.host.ns, tc.vni); !slices.Equal(got, want) {
				t.Errorf("%s VNI %d: FDB %v, want %v", tc.host.name, tc.vni, got, want)
			}
		}
		if slices.Contains(links(t, B.ns), netstate.VXLANName(n3.VNI)) {
			t.Error("host B has network 3 without a port on it")
		}
	})

	t.Run("wired", func(t *testing.T) {
		if !A.plane.Wired(a1.port.ID, a2.port.ID) {
			t.Error("A's ports not wired")
		}
		if A.plane.Wired(a1.port.ID, b1.port.ID) {
			t.Error("B's port wired on A")
		}
	})

	t.Run("port removed", func(t *testing.T) {
		c.remove(b1)
		c.apply(t)
		if slices.Contains(links(t, B.ns), netstate.TapName(b1.port.ID)) {
			t.Error("the removed port's device is still there")
		}
		if got := reach(t, a1, "10.0.0.2", 500*time.Millisecond); got != "" {
			t.Errorf("the removed port still answers: %q", got)
		}
		if got := fdbOf(t, A.ns, n1.VNI); slices.ContainsFunc(got, func(e string) bool { return strings.HasPrefix(e, b1.port.MAC) }) {
			t.Errorf("host A still forwards the removed port's MAC: %v", got)
		}
		if slices.Contains(links(t, B.ns), netstate.BridgeName(n1.ID)) {
			t.Error("host B kept network 1 after its last port went")
		}
		if got := reach(t, a2, "10.0.0.2", 3*time.Second); got != "b2" {
			t.Errorf("the other network broke: a2 → b2 answered by %q", got)
		}
	})

	t.Run("admin down", func(t *testing.T) {
		a2.port.AdminUp = false
		c.apply(t)
		if got := reach(t, b2, "10.0.0.1", 500*time.Millisecond); got != "" {
			t.Errorf("an administratively down port answers: %q", got)
		}
		a2.port.AdminUp = true
		c.apply(t)
		if got := reach(t, b2, "10.0.0.1", 3*time.Second); got != "a2" {
			t.Errorf("port back up: answered by %q, want a2", got)
		}
	})
}

func TestL2EmptyStateRemovesOnlyOurs(t *testing.T) {
	c := twoHosts(t)
	A := c.hosts[0]
	n := c.addNet(201, "p1")
	c.addGuest(t, A, n, "10.0.0.1", "a1")
	c.addGuest(t, c.hosts[1], n, "10.0.0.2", "b1")
	c.apply(t)
	name := filepath.Base(A.ns)
	// An operator's own devices, named close to ours.
	for _, args := range [][]string{
		{"tuntap", "add", "tap0", "mode", "tap"},
		{"link", "add", "br-op", "type", "bridge"},
		{"link", "add", "tap0123abcd", "type", "bridge"},
		{"link", "add", "nbr-op", "type", "bridge"},
	} {
		if out, err := exec.Command("ip", append([]string{"-n", name}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	if err := A.plane.Apply(context.Background(), &netstate.Host{Host: A.name, VTEP: A.vtep}); err != nil {
		t.Fatal(err)
	}
	want := []string{"br-op", "lo", "nbr-op", "tap0", "tap0123abcd", underlayDev}
	if got := links(t, A.ns); !slices.Equal(got, want) {
		t.Errorf("links after an empty state: %v, want %v", got, want)
	}
}

func TestL2RebuildsAfterReboot(t *testing.T) {
	c := twoHosts(t)
	A, B := c.hosts[0], c.hosts[1]
	n := c.addNet(301, "p1")
	a1 := c.addGuest(t, A, n, "10.0.0.1", "a1")
	b1 := c.addGuest(t, B, n, "10.0.0.2", "b1")
	c.apply(t)

	// The reboot: every device but the underlay goes, guests' too.
	h := nsH(t, A.ns)
	ls, err := h.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range ls {
		if n := l.Attrs().Name; n != "lo" && n != underlayDev {
			if err := h.LinkDel(l); err != nil && !isNotFound(err) {
				t.Fatal(err)
			}
		}
	}
	if A.plane.Wired(a1.port.ID) {
		t.Error("Wired with the device gone")
	}
	c.apply(t)
	want := []string{"lo", netstate.BridgeName(n.ID), netstate.TapName(a1.port.ID), underlayDev, netstate.VXLANName(n.VNI)}
	slices.Sort(want)
	if got := links(t, A.ns); !slices.Equal(got, want) {
		t.Fatalf("links after the rebuild: %v, want %v", got, want)
	}
	if !A.plane.Wired(a1.port.ID) {
		t.Error("the rebuilt tap is not wired")
	}
	// The port's device is now a tap of its own, which QEMU must be able
	// to open as it does: -netdev tap,ifname=…,script=no,downscript=no.
	if err := openTap(A.ns, netstate.TapName(a1.port.ID)); err != nil {
		t.Errorf("QEMU could not open the tap: %v", err)
	}
	if got := fdbOf(t, A.ns, n.VNI); len(got) != 2 {
		t.Errorf("FDB after the rebuild: %v", got)
	}

	// The server comes back on the host: its device replaces the tap.
	tap, err := h.LinkByName(netstate.TapName(a1.port.ID))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.LinkDel(tap); err != nil {
		t.Fatal(err)
	}
	c.plug(t, a1)
	c.apply(t)
	if got := reach(t, b1, "10.0.0.1", 3*time.Second); got != "a1" {
		t.Errorf("b1 → a1 after the rebuild answered by %q", got)
	}
}

// openTap attaches to tap name in ns as QEMU does (IFF_TAP, IFF_NO_PI,
// IFF_VNET_HDR, one queue) and lets go.
func openTap(ns, name string) error {
	return inNS(ns, func() error {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		var req struct {
			name  [unix.IFNAMSIZ]byte
			flags uint16
			_     [22]byte
		}
		copy(req.name[:], name)
		req.flags = unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TUNSETIFF, uintptr(unsafe.Pointer(&req))); errno != 0 {
			return errno
		}
		return nil
	})
}

func TestL2ReplacesForeignDevices(t *testing.T) {
	c := twoHosts(t)
	A, B := c.hosts[0], c.hosts[1]
	n1, n2 := c.addNet(901, "p1"), c.addNet(902, "p1")
	for _, n := range []netstate.Network{n1, n2} {
		c.addGuest(t, A, n, "10.0.0.1", "a")
		c.addGuest(t, B, n, "10.0.0.2", "b")
	}
	name := filepath.Base(A.ns)
	// Devices with our names that are not what we would make: a VXLAN
	// device that learns, one on another VTEP, a bridge that is a veth.
	for _, args := range [][]string{
		{"link", "add", netstate.VXLANName(n1.VNI), "type", "vxlan", "id", "901", "local", A.vtep, "dstport", "4789", "learning"},
		{"link", "add", netstate.VXLANName(n2.VNI), "type", "vxlan", "id", "902", "local", "192.0.2.77", "dstport", "4789", "nolearning"},
		{"link", "add", netstate.BridgeName(n2.ID), "type", "veth", "peer", "name", "xpeer0"},
	} {
		if out, err := exec.Command("ip", append([]string{"-n", name}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	c.apply(t)
	h := nsH(t, A.ns)
	for _, n := range []netstate.Network{n1, n2} {
		vx, err := h.LinkByName(netstate.VXLANName(n.VNI))
		if err != nil {
			t.Fatal(err)
		}
		if v := vx.(*netlink.Vxlan); v.Learning || v.SrcAddr.String() != A.vtep {
			t.Errorf("VNI %d: learning %v, local %s: the foreign device was kept", n.VNI, v.Learning, v.SrcAddr)
		}
		br, err := h.LinkByName(netstate.BridgeName(n.ID))
		if err != nil {
			t.Fatal(err)
		}
		if br.Type() != "bridge" || vx.Attrs().MasterIndex != br.Attrs().Index {
			t.Errorf("network %s: bridge is a %s, VXLAN master %d", n.ID, br.Type(), vx.Attrs().MasterIndex)
		}
	}
	if slices.Contains(links(t, A.ns), "xpeer0") {
		t.Error("the foreign veth's peer is left")
	}
}
