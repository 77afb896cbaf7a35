package netplane

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"nimbus/internal/netstate"
)

// The firewall lab: a host namespace with a bridge and three stand-in
// VMs, each a guest namespace whose eth0 is the peer of a veth named
// TapName(port) on the bridge. Guests are 10.0.0.1-3 on one network;
// every guest listens on TCP 22, 23 and 80 and UDP 53, 68 and 5000.

const (
	fwWait  = 400 * time.Millisecond // how long a probe waits for an answer
	fwSpoof = "10.0.0.99"            // an address no port owns
)

type fwGuest struct {
	ns   string
	port netstate.Port // zero for a device that is not a server port
	ip   string
	mac  string
	// udp counts datagrams received per UDP port.
	udp map[int]*atomic.Int64
}

type fwLab struct {
	host   string
	fw     part
	guests []*fwGuest
	st     netstate.Host
}

func fwPortID(i int) string { return fmt.Sprintf("fwport%d-0000-4000-8000-000000000000", i) }
func fwMAC(i int) string    { return fmt.Sprintf("fa:16:3e:00:00:%02x", i+1) }

// newFWLab builds the lab; every port starts with port security on and no
// security group.
func newFWLab(t *testing.T) *fwLab {
	return newFWLabOn(t, []fwSpot{{"fwnet-1", "10.0.0.1"}, {"fwnet-1", "10.0.0.2"}, {"fwnet-1", "10.0.0.3"}})
}

// fwSpot is where a lab guest sits: its network and address.
type fwSpot struct{ network, ip string }

// newFWLabOn builds a lab with a guest per spot, a bridge per network.
func newFWLabOn(t *testing.T, spots []fwSpot) *fwLab {
	t.Helper()
	l := &fwLab{host: testNS(t)}
	h, err := nsHandle(l.host)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	bridges := map[string]netlink.Link{}
	for i, sp := range spots {
		br := bridges[sp.network]
		if br == nil {
			br = &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: netstate.BridgeName(sp.network)}}
			if err := h.LinkAdd(br); err != nil {
				t.Fatal(err)
			}
			if err := h.LinkSetUp(br); err != nil {
				t.Fatal(err)
			}
			bridges[sp.network] = br
			l.st.Networks = append(l.st.Networks,
				netstate.Network{ID: sp.network, VNI: uint32(4242 + len(bridges)), MTU: 1450})
		}
		g := l.addGuest(t, h, br, i, sp)
		l.guests = append(l.guests, g)
		l.st.Ports = append(l.st.Ports, g.port)
	}
	fw, err := newFirewall(Config{NetNS: l.host})
	if err != nil {
		t.Fatal(err)
	}
	l.fw = fw
	return l
}

func (l *fwLab) addGuest(t *testing.T, h *netlink.Handle, br netlink.Link, i int, sp fwSpot) *fwGuest {
	t.Helper()
	port := netstate.Port{ID: fwPortID(i), NetworkID: sp.network, MAC: fwMAC(i), AdminUp: true,
		PortSecurity: true, IPs: []netstate.FixedIP{{SubnetID: "fwsub", IP: sp.ip}}}
	g := plug(t, h, br, netstate.TapName(port.ID), sp.ip, port.MAC)
	g.port = port
	return g
}

// plug puts a new namespace on bridge br through a veth whose bridge end
// is dev, its eth0 with address ip/24 and MAC mac, serving.
func plug(t *testing.T, h *netlink.Handle, br netlink.Link, dev, ip, mac string) *fwGuest {
	t.Helper()
	name := testName(t, "g")
	path, err := ensureNamedNS(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = deleteNamedNS(name) })
	gns, err := netns.GetFromPath(path)
	if err != nil {
		t.Fatal(err)
	}
	defer gns.Close()
	g := &fwGuest{ns: path, ip: ip, mac: mac, udp: map[int]*atomic.Int64{}}
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: dev, MasterIndex: br.Attrs().Index},
		PeerName: "eth0", PeerNamespace: netlink.NsFd(gns)}
	if err := h.LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetUp(veth); err != nil {
		t.Fatal(err)
	}
	gh, err := nsHandle(path)
	if err != nil {
		t.Fatal(err)
	}
	defer gh.Close()
	eth, err := gh.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	hw, _ := net.ParseMAC(mac)
	addr, _ := netlink.ParseAddr(ip + "/24")
	for _, err := range []error{gh.LinkSetHardwareAddr(eth, hw), gh.AddrAdd(eth, addr), gh.LinkSetUp(eth)} {
		if err != nil {
			t.Fatal(err)
		}
	}
	g.serve(t)
	return g
}

// serve starts the guest's listeners.
func (g *fwGuest) serve(t *testing.T) {
	t.Helper()
	err := inNS(g.ns, func() error {
		for _, p := range []int{22, 23, 80} {
			ln, err := net.Listen("tcp4", fmt.Sprintf(":%d", p))
			if err != nil {
				return err
			}
			t.Cleanup(func() { ln.Close() })
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					_, _ = c.Write([]byte("ok"))
					c.Close()
				}
			}()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []int{53, 68, 5000} {
		g.listenUDP(t, p)
	}
}

// listenUDP starts a UDP server on port p that counts what it gets and
// answers it.
func (g *fwGuest) listenUDP(t *testing.T, p int) {
	t.Helper()
	err := inNS(g.ns, func() error {
		pc, err := net.ListenPacket("udp4", fmt.Sprintf(":%d", p))
		if err != nil {
			return err
		}
		t.Cleanup(func() { pc.Close() })
		n := &atomic.Int64{}
		g.udp[p] = n
		go func() {
			buf := make([]byte, 1500)
			for {
				_, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				n.Add(1)
				_, _ = pc.WriteTo([]byte("ok"), from)
			}
		}()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func (l *fwLab) apply(t *testing.T) {
	t.Helper()
	if err := l.fw.apply(context.Background(), &l.st); err != nil {
		t.Fatal(err)
	}
}

// tcp reports whether guest from completes a TCP exchange with guest to.
func (l *fwLab) tcp(from, to, port int) bool {
	ok := false
	_ = inNS(l.guests[from].ns, func() error {
		c, err := net.DialTimeout("tcp4", net.JoinHostPort(l.guests[to].ip, fmt.Sprint(port)), fwWait)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(fwWait))
		buf := make([]byte, 2)
		_, err = c.Read(buf)
		ok = err == nil && string(buf) == "ok"
		return nil
	})
	return ok
}

// udp reports whether guest from gets an answer to a datagram to guest to.
func (l *fwLab) udp(from, to, port int) bool {
	ok := false
	_ = inNS(l.guests[from].ns, func() error {
		c, err := net.Dial("udp4", net.JoinHostPort(l.guests[to].ip, fmt.Sprint(port)))
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(fwWait))
		if _, err := c.Write([]byte("hi")); err != nil {
			return err
		}
		buf := make([]byte, 2)
		_, err = c.Read(buf)
		ok = err == nil
		return nil
	})
	return ok
}

// udpSession opens a UDP socket from guest from to guest to's port and
// returns an exchange over it: one datagram out, whether an answer came.
func (l *fwLab) udpSession(t *testing.T, from, to, port int) func() bool {
	t.Helper()
	var c net.Conn
	err := inNS(l.guests[from].ns, func() (err error) {
		c, err = net.Dial("udp4", net.JoinHostPort(l.guests[to].ip, fmt.Sprint(port)))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	buf := make([]byte, 2)
	return func() bool {
		_ = c.SetDeadline(time.Now().Add(fwWait))
		if _, err := c.Write([]byte("hi")); err != nil {
			return false
		}
		_, err := c.Read(buf)
		return err == nil
	}
}

// udpPush has guest from open a UDP flow to a new server on guest to
// and returns a push: the server sends a datagram back over the flow on
// its own, and whether it arrived is reported.
func (l *fwLab) udpPush(t *testing.T, from, to int) func() bool {
	t.Helper()
	var srv net.PacketConn
	var c net.Conn
	err := inNS(l.guests[to].ns, func() (err error) {
		srv, err = net.ListenPacket("udp4", ":6002")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	err = inNS(l.guests[from].ns, func() (err error) {
		c, err = net.Dial("udp4", net.JoinHostPort(l.guests[to].ip, "6002"))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.Write([]byte("hi")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	_ = srv.SetReadDeadline(time.Now().Add(fwWait))
	_, peer, err := srv.ReadFrom(buf)
	if err != nil {
		t.Fatalf("flow from guest %d to guest %d: %v", from, to, err)
	}
	return func() bool {
		if _, err := srv.WriteTo([]byte("ok"), peer); err != nil {
			return false
		}
		_ = c.SetReadDeadline(time.Now().Add(fwWait))
		_, err := c.Read(buf)
		return err == nil
	}
}

// ping reports whether guest from gets an ICMP echo reply from guest to.
func (l *fwLab) ping(from, to int) bool {
	ok := false
	_ = inNS(l.guests[from].ns, func() error {
		c, err := net.ListenPacket("ip4:icmp", "0.0.0.0")
		if err != nil {
			return err
		}
		defer c.Close()
		id := uint16(os.Getpid())
		msg := []byte{8, 0, 0, 0, byte(id >> 8), byte(id), 0, 1, 'n', 'b'}
		binary.BigEndian.PutUint16(msg[2:], icmpChecksum(msg))
		dst := &net.IPAddr{IP: net.ParseIP(l.guests[to].ip)}
		if _, err := c.WriteTo(msg, dst); err != nil {
			return err
		}
		_ = c.SetReadDeadline(time.Now().Add(fwWait))
		buf := make([]byte, 1500)
		for {
			n, peer, err := c.ReadFrom(buf)
			if err != nil {
				return err
			}
			if n >= 8 && buf[0] == 0 && peer.String() == l.guests[to].ip {
				ok = true
				return nil
			}
		}
	})
	return ok
}

func icmpChecksum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

// sendFrom has guest from send one datagram to guest to's UDP port dport
// from address src (added to its eth0 when it is not its own) and source
// port sport, with a static neighbour entry so that no ARP is needed,
// and reports whether it arrived.
func (l *fwLab) sendFrom(t *testing.T, from, to int, src string, sport, dport int) bool {
	t.Helper()
	g, dst := l.guests[from], l.guests[to]
	gh, err := nsHandle(g.ns)
	if err != nil {
		t.Fatal(err)
	}
	defer gh.Close()
	eth, err := gh.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	if src != g.ip {
		addr, _ := netlink.ParseAddr(src + "/32")
		addr.Flags = 0x80 // IFA_F_NODAD
		if err := gh.AddrReplace(eth, addr); err != nil {
			t.Fatal(err)
		}
	}
	mac, _ := net.ParseMAC(dst.mac)
	if err := gh.NeighSet(&netlink.Neigh{LinkIndex: eth.Attrs().Index, State: netlink.NUD_PERMANENT,
		IP: net.ParseIP(dst.ip), HardwareAddr: mac}); err != nil {
		t.Fatal(err)
	}
	before := dst.udp[dport].Load()
	err = inNS(g.ns, func() error {
		c, err := net.DialUDP("udp4", &net.UDPAddr{IP: net.ParseIP(src), Port: sport},
			&net.UDPAddr{IP: net.ParseIP(dst.ip), Port: dport})
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte("spoof"))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(fwWait)
	for time.Now().Before(deadline) {
		if dst.udp[dport].Load() > before {
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return false
}

// claim has guest i take address ip as well (nothing in the state
// changes) and reports whether a datagram guest from sends to ip reaches
// it: that needs guest i's ARP answer for ip.
func (l *fwLab) claim(t *testing.T, i, from int, ip string) bool {
	t.Helper()
	gh, err := nsHandle(l.guests[i].ns)
	if err != nil {
		t.Fatal(err)
	}
	defer gh.Close()
	eth, err := gh.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := netlink.ParseAddr(ip + "/32")
	if err := gh.AddrReplace(eth, addr); err != nil {
		t.Fatal(err)
	}
	before := l.guests[i].udp[5000].Load()
	err = inNS(l.guests[from].ns, func() error {
		c, err := net.Dial("udp4", net.JoinHostPort(ip, "5000"))
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write([]byte("hi"))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * fwWait) // ARP's first try, then the datagram
	for time.Now().Before(deadline) {
		if l.guests[i].udp[5000].Load() > before {
			return true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return false
}

// setMAC gives guest i's eth0 another MAC, one the port does not own.
func (l *fwLab) setMAC(t *testing.T, i int, mac string) {
	t.Helper()
	gh, err := nsHandle(l.guests[i].ns)
	if err != nil {
		t.Fatal(err)
	}
	defer gh.Close()
	eth, err := gh.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	hw, _ := net.ParseMAC(mac)
	if err := gh.LinkSetHardwareAddr(eth, hw); err != nil {
		t.Fatal(err)
	}
}

// Security group rule builders.

func ptr(v int) *int { return &v }

func sgRule(dir, proto string, lo, hi int, prefix, group string) netstate.Rule {
	r := netstate.Rule{ID: fmt.Sprintf("%s-%s-%d-%s-%s", dir, proto, lo, prefix, group), Direction: dir,
		Ethertype: "IPv4", Protocol: proto, RemoteIPPrefix: prefix, RemoteGroupID: group}
	if lo != 0 {
		r.PortMin, r.PortMax = ptr(lo), ptr(hi)
	}
	return r
}

var (
	allEgress  = sgRule("egress", "", 0, 0, "", "")
	allIngress = sgRule("ingress", "", 0, 0, "", "")
)

// group sets the lab's groups and which group each port is in ("" for
// none).
func (l *fwLab) groups(sgs []netstate.SecurityGroup, member ...string) {
	l.st.SecurityGroups = sgs
	for i := range l.st.Ports {
		l.st.Ports[i].SecurityGroups = nil
		if i < len(member) && member[i] != "" {
			l.st.Ports[i].SecurityGroups = []string{member[i]}
		}
	}
}

func sg(id string, rules ...netstate.Rule) netstate.SecurityGroup {
	return netstate.SecurityGroup{ID: id, Stateful: true, Rules: rules}
}

// expect checks a probe's outcome. A probe that must get through is
// tried up to three times: on a busy machine the first packet after an
// apply can miss the probe's short wait (ARP, a SYN retransmitted), and
// a later success still proves the path is open. One that must not get
// through is tried once: a success is never a timing accident.
func expect(t *testing.T, what string, probe func() bool, want bool) {
	t.Helper()
	got := probe()
	for try := 1; want && !got && try < 3; try++ {
		got = probe()
	}
	if got != want {
		t.Errorf("%s: got through %v, want %v", what, got, want)
	}
}

func TestFirewall(t *testing.T) {
	// open is a group that lets everything in and out: the receiving
	// side of the probes that test the sender.
	open := sg("open", allIngress, allEgress)
	cases := []struct {
		name string
		run  func(t *testing.T, l *fwLab)
	}{
		{"default deny ingress", func(t *testing.T, l *fwLab) {
			l.groups([]netstate.SecurityGroup{sg("web", allEgress), open}, "web", "open")
			l.apply(t)
			expect(t, "tcp 1→0:22", func() bool { return l.tcp(1, 0, 22) }, false)
			expect(t, "udp 1→0:53", func() bool { return l.udp(1, 0, 53) }, false)
			expect(t, "ping 1→0", func() bool { return l.ping(1, 0) }, false)
			expect(t, "ping 0→1 (reply allowed)", func() bool { return l.ping(0, 1) }, true)
		}},
		{"tcp 22 from a prefix", func(t *testing.T, l *fwLab) {
			l.groups([]netstate.SecurityGroup{
				sg("ssh", allEgress, sgRule("ingress", "tcp", 22, 22, "10.0.0.2/32", "")), open,
			}, "ssh", "open", "open")
			l.apply(t)
			expect(t, "tcp 10.0.0.2→:22", func() bool { return l.tcp(1, 0, 22) }, true)
			expect(t, "tcp 10.0.0.2→:23", func() bool { return l.tcp(1, 0, 23) }, false)
			expect(t, "tcp 10.0.0.3→:22", func() bool { return l.tcp(2, 0, 22) }, false)
			expect(t, "udp 10.0.0.2→:53", func() bool { return l.udp(1, 0, 53) }, false)
		}},
		{"udp and icmp rules", func(t *testing.T, l *fwLab) {
			l.groups([]netstate.SecurityGroup{
				sg("svc", allEgress, sgRule("ingress", "udp", 53, 53, "", ""),
					netstate.Rule{ID: "echo", Direction: "ingress", Ethertype: "IPv4", Protocol: "icmp",
						PortMin: ptr(8), PortMax: ptr(0)}), open,
			}, "svc", "open")
			l.apply(t)
			expect(t, "udp :53", func() bool { return l.udp(1, 0, 53) }, true)
			expect(t, "udp :5000", func() bool { return l.udp(1, 0, 5000) }, false)
			expect(t, "ping", func() bool { return l.ping(1, 0) }, true)
		}},
		{"remote group membership", func(t *testing.T, l *fwLab) {
			srv := sg("srv", allEgress, sgRule("ingress", "tcp", 22, 22, "", "cli"))
			cli := sg("cli", allEgress, allIngress)
			l.groups([]netstate.SecurityGroup{srv, cli}, "srv", "cli", "open")
			l.st.SecurityGroups = append(l.st.SecurityGroups, open)
			l.apply(t)
			expect(t, "non-member 10.0.0.2", func() bool { return l.tcp(1, 0, 22) }, false)
			l.st.SecurityGroups[1].Members = []string{"10.0.0.2"}
			l.apply(t)
			expect(t, "member 10.0.0.2", func() bool { return l.tcp(1, 0, 22) }, true)
			expect(t, "non-member 10.0.0.3", func() bool { return l.tcp(2, 0, 22) }, false)
			l.st.SecurityGroups[1].Members = nil
			l.apply(t)
			expect(t, "removed member 10.0.0.2", func() bool { return l.tcp(1, 0, 22) }, false)
		}},
		{"stateful", func(t *testing.T, l *fwLab) {
			l.groups([]netstate.SecurityGroup{sg("out", allEgress), open}, "out", "open")
			l.apply(t)
			expect(t, "outbound tcp and its reply", func() bool { return l.tcp(0, 1, 80) }, true)
			expect(t, "outbound udp and its reply", func() bool { return l.udp(0, 1, 53) }, true)
			expect(t, "inbound new tcp", func() bool { return l.tcp(1, 0, 80) }, false)
		}},
		{"stateless group", func(t *testing.T, l *fwLab) {
			out := sg("out", allEgress)
			out.Stateful = false
			l.groups([]netstate.SecurityGroup{out, open}, "out", "open")
			l.apply(t)
			expect(t, "outbound tcp, reply not allowed by a rule", func() bool { return l.tcp(0, 1, 80) }, false)
			l.st.SecurityGroups[0].Rules = append(out.Rules, sgRule("ingress", "tcp", 0, 0, "10.0.0.2/32", ""))
			l.apply(t)
			expect(t, "reply allowed by a rule", func() bool { return l.tcp(0, 1, 80) }, true)
		}},
		{"egress restricted", func(t *testing.T, l *fwLab) {
			l.groups([]netstate.SecurityGroup{sg("web-out", sgRule("egress", "tcp", 80, 80, "", "")), open},
				"web-out", "open")
			l.apply(t)
			expect(t, "egress tcp 80", func() bool { return l.tcp(0, 1, 80) }, true)
			expect(t, "egress tcp 22", func() bool { return l.tcp(0, 1, 22) }, false)
			expect(t, "egress udp 53", func() bool { return l.udp(0, 1, 53) }, false)
			expect(t, "egress ping", func() bool { return l.ping(0, 1) }, false)
		}},
		{"no group sends nothing", func(t *testing.T, l *fwLab) {
			l.groups([]netstate.SecurityGroup{open}, "", "open")
			l.apply(t)
			expect(t, "egress tcp", func() bool { return l.tcp(0, 1, 80) }, false)
			expect(t, "ingress tcp", func() bool { return l.tcp(1, 0, 80) }, false)
		}},
		{"rule removed cuts new connections", func(t *testing.T, l *fwLab) {
			l.groups([]netstate.SecurityGroup{sg("ssh", allEgress, sgRule("ingress", "tcp", 22, 22, "", "")), open},
				"ssh", "open")
			l.apply(t)
			expect(t, "with the rule", func() bool { return l.tcp(1, 0, 22) }, true)
			l.st.SecurityGroups[0].Rules = []netstate.Rule{allEgress}
			l.apply(t)
			expect(t, "right after removal", func() bool { return l.tcp(1, 0, 22) }, false)
			l.st.SecurityGroups[0].Rules = append(l.st.SecurityGroups[0].Rules, sgRule("ingress", "tcp", 22, 22, "", ""))
			l.apply(t)
			expect(t, "added back", func() bool { return l.tcp(1, 0, 22) }, true)
		}},
		{"rule removed cuts established flows", func(t *testing.T, l *fwLab) {
			dns := func(prefix string) netstate.Rule { return sgRule("ingress", "udp", 53, 53, prefix, "") }
			l.groups([]netstate.SecurityGroup{sg("dns", allEgress, dns("10.0.0.2/32"), dns("10.0.0.3/32")), open},
				"dns", "open", "open")
			l.apply(t)
			from2, from3 := l.udpSession(t, 1, 0, 53), l.udpSession(t, 2, 0, 53)
			push := l.udpPush(t, 0, 1) // what 10.0.0.2 sends back passes only as established
			expect(t, "flow from 10.0.0.2", func() bool { return from2() }, true)
			expect(t, "flow from 10.0.0.3", func() bool { return from3() }, true)
			expect(t, "outbound flow to 10.0.0.2, pushed back", func() bool { return push() }, true)
			l.st.SecurityGroups[0].Rules = []netstate.Rule{allEgress, dns("10.0.0.3/32")}
			l.apply(t)
			expect(t, "flow from 10.0.0.2 after its rule went", func() bool { return from2() }, false)
			expect(t, "flow from 10.0.0.3, still allowed", func() bool { return from3() }, true)
			expect(t, "outbound flow to 10.0.0.2, pushed back after the change", func() bool { return push() }, true)
		}},
		{"spoofed source IP", func(t *testing.T, l *fwLab) {
			l.groups([]netstate.SecurityGroup{open}, "open", "open")
			l.apply(t)
			expect(t, "own address", func() bool { return l.sendFrom(t, 0, 1, l.guests[0].ip, 4000, 5000) }, true)
			expect(t, "foreign address", func() bool { return l.sendFrom(t, 0, 1, fwSpoof, 4000, 5000) }, false)
			expect(t, "another port's address", func() bool { return l.sendFrom(t, 0, 1, l.guests[2].ip, 4000, 5000) }, false)
		}},
		{"spoofed MAC", func(t *testing.T, l *fwLab) {
			l.groups([]netstate.SecurityGroup{open}, "open", "open")
			l.apply(t)
			l.setMAC(t, 0, "fa:16:3e:99:99:99")
			expect(t, "foreign MAC", func() bool { return l.sendFrom(t, 0, 1, l.guests[0].ip, 4000, 5000) }, false)
			expect(t, "foreign MAC, tcp", func() bool { return l.tcp(0, 1, 80) }, false)
			l.setMAC(t, 0, fwMAC(0))
			expect(t, "own MAC again", func() bool { return l.sendFrom(t, 0, 1, l.guests[0].ip, 4000, 5000) }, true)
		}},
		{"allowed address pairs", func(t *testing.T, l *fwLab) {
			l.groups([]netstate.SecurityGroup{open}, "open", "open")
			l.st.Ports[0].AllowedPairs = []netstate.AddressPair{{IP: "10.0.0.96/28"}}
			l.apply(t)
			expect(t, "pair address", func() bool { return l.sendFrom(t, 0, 1, fwSpoof, 4000, 5000) }, true)
			expect(t, "outside the pair", func() bool { return l.sendFrom(t, 0, 1, "10.0.0.200", 4000, 5000) }, false)
			l.st.Ports[0].AllowedPairs = []netstate.AddressPair{{IP: "10.0.0.200", MAC: "fa:16:3e:aa:aa:aa"}}
			l.apply(t)
			l.setMAC(t, 0, "fa:16:3e:aa:aa:aa")
			expect(t, "pair with its MAC", func() bool { return l.sendFrom(t, 0, 1, "10.0.0.200", 4000, 5000) }, true)
			expect(t, "old pair", func() bool { return l.sendFrom(t, 0, 1, fwSpoof, 4000, 5000) }, false)
			l.st.Ports[0].AllowedPairs = []netstate.AddressPair{{IP: "0.0.0.0/0", MAC: "fa:16:3e:aa:aa:aa"}}
			l.apply(t)
			expect(t, "any address (0.0.0.0/0)", func() bool { return l.sendFrom(t, 0, 1, fwSpoof, 4000, 5000) }, true)
		}},
		{"ARP for a foreign address", func(t *testing.T, l *fwLab) {
			l.groups([]netstate.SecurityGroup{open}, "open", "open", "open")
			l.apply(t)
			expect(t, "answer for 10.0.0.99", func() bool { return l.claim(t, 0, 1, fwSpoof) }, false)
			l.st.Ports[2].AllowedPairs = []netstate.AddressPair{{IP: "10.0.0.98"}}
			l.apply(t)
			expect(t, "answer for an allowed pair", func() bool { return l.claim(t, 2, 1, "10.0.0.98") }, true)
		}},
		{"port security off", func(t *testing.T, l *fwLab) {
			l.groups([]netstate.SecurityGroup{open}, "", "open")
			l.st.Ports[0].PortSecurity = false
			l.apply(t)
			expect(t, "spoofed source", func() bool { return l.sendFrom(t, 0, 1, fwSpoof, 4000, 5000) }, true)
			expect(t, "inbound without a group", func() bool { return l.tcp(1, 0, 22) }, true)
			expect(t, "outbound without a group", func() bool { return l.tcp(0, 1, 22) }, true)
		}},
		{"fake DHCP server", func(t *testing.T, l *fwLab) {
			l.groups([]netstate.SecurityGroup{open}, "open", "open")
			l.apply(t)
			expect(t, "udp 67→68", func() bool { return l.sendFrom(t, 0, 1, l.guests[0].ip, 67, 68) }, false)
			expect(t, "udp 66→68 (control)", func() bool { return l.sendFrom(t, 0, 1, l.guests[0].ip, 66, 68) }, true)
			// The receiver's own rules let no UDP in: only the DHCP
			// namespace's replies pass regardless.
			l.st.SecurityGroups = append(l.st.SecurityGroups, sg("out", allEgress))
			l.st.Ports[1].SecurityGroups = []string{"out"}
			l.st.Ports[2].PortSecurity = false
			l.apply(t)
			expect(t, "udp 67→68 from a port without security", func() bool { return l.sendFrom(t, 2, 1, l.guests[2].ip, 67, 68) }, false)
		}},
	}
	for _, c := range cases {
		t.Run(strings.ReplaceAll(c.name, " ", "_"), func(t *testing.T) {
			t.Parallel()
			c.run(t, newFWLab(t))
		})
	}
}

// TestFirewallConntrackZones: two networks on one host with the same
// addresses. A flow in one must not open the other: without a zone per
// network, a datagram on the second that looks like the first flow's
// reply would pass as established.
func TestFirewallConntrackZones(t *testing.T) {
	l := newFWLabOn(t, []fwSpot{
		{"fwnet-a", "10.0.0.1"}, {"fwnet-a", "10.0.0.2"},
		{"fwnet-b", "10.0.0.1"}, {"fwnet-b", "10.0.0.2"},
	})
	l.groups([]netstate.SecurityGroup{sg("out", allEgress), sg("open", allIngress, allEgress)},
		"out", "open", "out", "open")
	l.apply(t)
	l.guests[1].listenUDP(t, 6001)
	l.guests[2].listenUDP(t, 6000)
	expect(t, "flow 10.0.0.1:6000→10.0.0.2:6001 on network a", func() bool { return l.sendFrom(t, 0, 1, "10.0.0.1", 6000, 6001) }, true)
	expect(t, "its reply's twin on network b", func() bool { return l.sendFrom(t, 3, 2, "10.0.0.2", 6001, 6000) }, false)
}

// TestFirewallTables: apply owns only the "nimbus" tables; a state with
// nothing on the host leaves none of them behind, and other tables are
// never touched.
func TestFirewallTables(t *testing.T) {
	l := newFWLab(t)
	ns, err := openNS(l.host)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	c, err := nftables.New(nftables.WithNetNSFd(int(ns)))
	if err != nil {
		t.Fatal(err)
	}
	foreign := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "operator"})
	c.AddChain(&nftables.Chain{Table: foreign, Name: "input", Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter})
	if err := c.Flush(); err != nil {
		t.Fatal(err)
	}
	tables := func() []string {
		ts, err := c.ListTables()
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, tb := range ts {
			out = append(out, fmt.Sprintf("%d/%s", tb.Family, tb.Name))
		}
		slices.Sort(out)
		return out
	}
	l.groups([]netstate.SecurityGroup{sg("open", allIngress, allEgress)}, "open", "open", "open")
	l.apply(t)
	l.apply(t)                                             // a second apply over the first
	want := []string{"1/nimbus", "1/operator", "7/nimbus"} // inet, inet, bridge
	if got := tables(); !slices.Equal(got, want) {
		t.Errorf("tables after apply = %v, want %v", got, want)
	}
	l.st = netstate.Host{}
	l.apply(t)
	if got := tables(); !slices.Equal(got, []string{"1/operator"}) {
		t.Errorf("tables after an empty state = %v, want only the operator's", got)
	}
	if chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet); err != nil || len(chains) != 1 {
		t.Errorf("operator's chains = %d (%v), want 1", len(chains), err)
	}
}

// addIPv6 gives guest i the address fd00::i+1 (no duplicate address
// detection, so it is usable at once) and the port the same fixed IP.
func (l *fwLab) addIPv6(t *testing.T, i int) string {
	t.Helper()
	ip := fmt.Sprintf("fd00::%d", i+1)
	gh, err := nsHandle(l.guests[i].ns)
	if err != nil {
		t.Fatal(err)
	}
	defer gh.Close()
	eth, err := gh.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	addr, _ := netlink.ParseAddr(ip + "/64")
	addr.Flags = 0x02 // IFA_F_NODAD
	if err := gh.AddrAdd(eth, addr); err != nil {
		t.Fatal(err)
	}
	l.st.Ports[i].IPs = append(l.st.Ports[i].IPs, netstate.FixedIP{SubnetID: "fwsub6", IP: ip})
	return ip
}

// icmp6 has guest from send an ICMPv6 message of type typ from its
// IPv6 address to guest to's (with a static neighbour entry, so no
// neighbour discovery is needed) and reports whether it arrived.
func (l *fwLab) icmp6(t *testing.T, from, to int, typ byte) bool {
	t.Helper()
	src, dst := fmt.Sprintf("fd00::%d", from+1), fmt.Sprintf("fd00::%d", to+1)
	gh, err := nsHandle(l.guests[from].ns)
	if err != nil {
		t.Fatal(err)
	}
	defer gh.Close()
	eth, err := gh.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	mac, _ := net.ParseMAC(l.guests[to].mac)
	if err := gh.NeighSet(&netlink.Neigh{LinkIndex: eth.Attrs().Index, State: netlink.NUD_PERMANENT,
		IP: net.ParseIP(dst), HardwareAddr: mac}); err != nil {
		t.Fatal(err)
	}
	var rx net.PacketConn
	if err := inNS(l.guests[to].ns, func() (err error) {
		rx, err = net.ListenPacket("ip6:ipv6-icmp", dst)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer rx.Close()
	err = inNS(l.guests[from].ns, func() error {
		c, err := net.ListenPacket("ip6:ipv6-icmp", src)
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.WriteTo([]byte{typ, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, &net.IPAddr{IP: net.ParseIP(dst)})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = rx.SetReadDeadline(time.Now().Add(fwWait))
	buf := make([]byte, 1500)
	for {
		n, _, err := rx.ReadFrom(buf)
		if err != nil {
			return false
		}
		if n > 0 && buf[0] == typ {
			return true
		}
	}
}

// TestFirewallIPv6: IPv6 rules match IPv6, a guest cannot pose as a
// router, and an IPv6 source it does not own gets nothing through.
func TestFirewallIPv6(t *testing.T) {
	l := newFWLab(t)
	open6 := sg("open6", netstate.Rule{ID: "in6", Direction: "ingress", Ethertype: "IPv6", Protocol: "icmp",
		RemoteIPPrefix: "fd00::1/128"},
		netstate.Rule{ID: "out6", Direction: "egress", Ethertype: "IPv6"})
	none := sg("none", netstate.Rule{ID: "out6", Direction: "egress", Ethertype: "IPv6"})
	l.groups([]netstate.SecurityGroup{open6, none}, "open6", "open6", "none")
	l.addIPv6(t, 0)
	l.addIPv6(t, 1)
	l.addIPv6(t, 2)
	l.apply(t)
	const experimental = 200 // an ICMPv6 type nothing answers
	expect(t, "icmpv6 0→1 allowed by an IPv6 rule", func() bool { return l.icmp6(t, 0, 1, experimental) }, true)
	expect(t, "icmpv6 0→2 (no ingress rule)", func() bool { return l.icmp6(t, 0, 2, experimental) }, false)
	expect(t, "icmpv6 2→1 (outside the rule's prefix)", func() bool { return l.icmp6(t, 2, 1, experimental) }, false)
	expect(t, "router advertisement 0→1", func() bool { return l.icmp6(t, 0, 1, 134) }, false)
	expect(t, "redirect 0→1", func() bool { return l.icmp6(t, 0, 1, 137) }, false)
	l.st.Ports[0].IPs = l.st.Ports[0].IPs[:1] // fd00::1 no longer the port's
	l.apply(t)
	expect(t, "icmpv6 from an address the port lost", func() bool { return l.icmp6(t, 0, 1, experimental) }, false)
}

// TestFirewallDHCPIsolation: frames between a DHCP veth (ndh*) and a VXLAN
// device (nvx*) are dropped both ways; both still reach server ports.
func TestFirewallDHCPIsolation(t *testing.T) {
	l := newFWLabOn(t, []fwSpot{{"fwnet-1", "10.0.0.1"}})
	h, err := nsHandle(l.host)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	br, err := h.LinkByName(netstate.BridgeName("fwnet-1"))
	if err != nil {
		t.Fatal(err)
	}
	l.guests = append(l.guests,
		plug(t, h, br, dhcpVethName("fwnet-1"), "10.0.0.2", "fa:16:3e:00:00:d1"),
		plug(t, h, br, netstate.VXLANName(l.st.Networks[0].VNI), "10.0.0.3", "fa:16:3e:00:00:e1"))
	l.groups([]netstate.SecurityGroup{sg("open", allIngress, allEgress)}, "open")
	l.apply(t)
	const dhcp, vxlan = 1, 2
	expect(t, "DHCP → VXLAN", func() bool { return l.sendFrom(t, dhcp, vxlan, "10.0.0.2", 4000, 5000) }, false)
	expect(t, "VXLAN → DHCP", func() bool { return l.sendFrom(t, vxlan, dhcp, "10.0.0.3", 4000, 5000) }, false)
	expect(t, "DHCP → server port", func() bool { return l.sendFrom(t, dhcp, 0, "10.0.0.2", 4000, 5000) }, true)
	expect(t, "VXLAN → server port", func() bool { return l.sendFrom(t, vxlan, 0, "10.0.0.3", 4000, 5000) }, true)
	// A port whose rules let nothing in still gets its DHCP replies.
	l.groups([]netstate.SecurityGroup{sg("out", allEgress)}, "out")
	l.apply(t)
	expect(t, "DHCP reply → closed port", func() bool { return l.sendFrom(t, dhcp, 0, "10.0.0.2", 67, 68) }, true)
	expect(t, "other udp → closed port", func() bool { return l.sendFrom(t, dhcp, 0, "10.0.0.2", 4000, 5000) }, false)
}

// TestFirewallIntervals: prefixes become disjoint ranges, each closed by
// the address after it unless it runs to the top of the family.
func TestFirewallIntervals(t *testing.T) {
	cases := []struct {
		in   []string
		want string
	}{
		{[]string{"10.0.0.5/32"}, "10.0.0.5 [10.0.0.6"},
		{[]string{"10.0.0.5/32", "10.0.0.0/24"}, "10.0.0.0 [10.0.1.0"},
		{[]string{"10.0.0.4/31", "10.0.0.6/31"}, "10.0.0.4 [10.0.0.8"},
		{[]string{"10.0.0.1/32", "10.0.0.3/32"}, "10.0.0.1 [10.0.0.2 10.0.0.3 [10.0.0.4"},
		{[]string{"0.0.0.0/0", "10.0.0.1/32"}, "0.0.0.0"},
		{[]string{"255.255.255.255/32"}, "255.255.255.255"},
		{[]string{"fd00::/64", "fd00::1/128"}, "fd00:: [fd00:0:0:1::"},
	}
	for _, c := range cases {
		var ps []netip.Prefix
		for _, s := range c.in {
			ps = append(ps, netip.MustParsePrefix(s))
		}
		var got []string
		for _, e := range intervalElems(ps) {
			a, _ := netip.AddrFromSlice(e.Key)
			if e.IntervalEnd {
				got = append(got, "["+a.String())
			} else {
				got = append(got, a.String())
			}
		}
		if g := strings.Join(got, " "); g != c.want {
			t.Errorf("intervalElems(%v) = %q, want %q", c.in, g, c.want)
		}
	}
}

// TestFirewallCompileRule: Neutron's rule fields as the firewall reads
// them.
func TestFirewallCompileRule(t *testing.T) {
	cases := []struct {
		rule netstate.Rule
		want string // fwRule's fields, or the error
	}{
		{netstate.Rule{Ethertype: "IPv4", Protocol: "tcp", PortMin: ptr(22), PortMax: ptr(22)}, "2048 6 [22 22] <nil>"},
		{netstate.Rule{Ethertype: "IPv4", Protocol: "udp", PortMin: ptr(1000)}, "2048 17 [1000 1000] <nil>"},
		{netstate.Rule{Ethertype: "IPv4", Protocol: "6"}, "2048 6 <nil> <nil>"},
		{netstate.Rule{Ethertype: "IPv4"}, "2048 -1 <nil> <nil>"},
		{netstate.Rule{Ethertype: "IPv4", Protocol: "icmp", PortMin: ptr(8), PortMax: ptr(0)}, "2048 1 <nil> [8 0]"},
		{netstate.Rule{Ethertype: "IPv4", Protocol: "icmp", PortMin: ptr(-1)}, "2048 1 <nil> <nil>"},
		{netstate.Rule{Ethertype: "IPv6", Protocol: "icmp", PortMin: ptr(128)}, "34525 58 <nil> [128 -1]"},
		{netstate.Rule{Ethertype: "IPv4", Protocol: "tcp", PortMin: ptr(90), PortMax: ptr(80)}, "bad port range 90-80"},
		{netstate.Rule{Ethertype: "IPv4", Protocol: "bogus"}, `unknown protocol "bogus"`},
		{netstate.Rule{Ethertype: "IPv6", RemoteIPPrefix: "10.0.0.0/8"}, "remote prefix 10.0.0.0/8 is not IPv6"},
	}
	for _, c := range cases {
		r, err := compileRule(c.rule)
		got := fmt.Sprintf("%d %d %v %v", r.ether, r.proto, deref(r.ports), deref(r.icmp))
		if err != nil {
			got = err.Error()
		}
		if got != c.want {
			t.Errorf("compileRule(%+v) = %q, want %q", c.rule, got, c.want)
		}
	}
}

func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}
