package netplane

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"nimbus/internal/netstate"
)

const testMAC = "fa:16:3e:00:00:05"

func testLease() *dhcpLease {
	return &dhcpLease{
		IP: netip.MustParseAddr("10.0.0.5"), Mask: netip.MustParsePrefix("10.0.0.0/24"),
		Server: netip.MustParseAddr("10.0.0.2"), Router: netip.MustParseAddr("10.0.0.1"),
		DNS:      []netip.Addr{netip.MustParseAddr("192.0.2.53")},
		Routes:   []classlessRoute{{metadataAddr, netip.MustParseAddr("10.0.0.2")}},
		Hostname: "vm-one", MTU: 1450,
	}
}

func testRequest(typ byte, opts map[byte][]byte) *dhcpMessage {
	m := &dhcpMessage{Op: bootRequest, HType: 1, HLen: 6, XID: 42,
		CIAddr: netip.IPv4Unspecified(), YIAddr: netip.IPv4Unspecified(),
		SIAddr: netip.IPv4Unspecified(), GIAddr: netip.IPv4Unspecified(),
		Options: map[byte][]byte{optMessageType: {typ}}}
	mac, _ := net.ParseMAC(testMAC)
	copy(m.CHAddr[:], mac)
	for k, v := range opts {
		m.Options[k] = v
	}
	return m
}

func ip4(s string) []byte { return optAddrs(netip.MustParseAddr(s)) }

func TestDHCPReply(t *testing.T) {
	leases := map[string]*dhcpLease{testMAC: testLease()}
	withCI := func(m *dhcpMessage, ci string) *dhcpMessage { m.CIAddr = netip.MustParseAddr(ci); return m }
	unknown := testRequest(dhcpDiscover, nil)
	unknown.CHAddr[5] = 0x99
	relayed := testRequest(dhcpDiscover, nil)
	relayed.GIAddr = netip.MustParseAddr("10.9.9.9")
	reply := testRequest(dhcpDiscover, nil)
	reply.Op = bootReply
	notEther := testRequest(dhcpDiscover, nil)
	notEther.HType = 6
	leaseOpts := []byte{optSubnetMask, optRouter, optDNS, optHostname, optMTU, optLeaseTime, optServerID, optRenewalTime, optRebindingTime, optClasslessRoute}
	for _, c := range []struct {
		name   string
		req    *dhcpMessage
		typ    byte // 0: no answer
		yiaddr string
		opts   []byte // present
		absent []byte
	}{
		{"discover", testRequest(dhcpDiscover, nil), dhcpOffer, "10.0.0.5", leaseOpts, nil},
		{"unknown MAC", unknown, 0, "", nil, nil},
		{"relayed", relayed, 0, "", nil, nil},
		{"a reply", reply, 0, "", nil, nil},
		{"not Ethernet", notEther, 0, "", nil, nil},
		{"request", testRequest(dhcpRequest, map[byte][]byte{optRequestedIP: ip4("10.0.0.5"), optServerID: ip4("10.0.0.2")}), dhcpAck, "10.0.0.5", leaseOpts, nil},
		{"request to another server", testRequest(dhcpRequest, map[byte][]byte{optRequestedIP: ip4("10.0.0.5"), optServerID: ip4("10.0.0.3")}), 0, "", nil, nil},
		{"request for another address", testRequest(dhcpRequest, map[byte][]byte{optRequestedIP: ip4("10.0.0.9")}), dhcpNak, "0.0.0.0", []byte{optServerID, optMessage}, []byte{optLeaseTime, optSubnetMask}},
		{"renewing", withCI(testRequest(dhcpRequest, nil), "10.0.0.5"), dhcpAck, "10.0.0.5", leaseOpts, nil},
		{"renewing another address", withCI(testRequest(dhcpRequest, nil), "10.0.0.9"), dhcpNak, "0.0.0.0", nil, nil},
		{"inform", withCI(testRequest(dhcpInform, nil), "10.0.0.5"), dhcpAck, "0.0.0.0", []byte{optSubnetMask, optRouter, optMTU, optClasslessRoute, optServerID}, []byte{optLeaseTime, optRenewalTime}},
		{"release", withCI(testRequest(dhcpRelease, nil), "10.0.0.5"), 0, "", nil, nil},
		{"decline", testRequest(dhcpDecline, map[byte][]byte{optRequestedIP: ip4("10.0.0.5")}), 0, "", nil, nil},
		{"BOOTP", testRequest(0, nil), 0, "", nil, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := dhcpReply(c.req, leases)
			if c.typ == 0 {
				if got != nil {
					t.Fatalf("answered %+v, want no answer", got)
				}
				return
			}
			if got == nil {
				t.Fatal("no answer")
			}
			if got.msgType() != c.typ || got.YIAddr.String() != c.yiaddr || got.XID != 42 || got.Op != bootReply || got.CHAddr != c.req.CHAddr {
				t.Fatalf("type %d yiaddr %s xid %d op %d, want type %d yiaddr %s", got.msgType(), got.YIAddr, got.XID, got.Op, c.typ, c.yiaddr)
			}
			for _, o := range c.opts {
				if _, ok := got.Options[o]; !ok {
					t.Errorf("option %d missing", o)
				}
			}
			for _, o := range c.absent {
				if _, ok := got.Options[o]; ok {
					t.Errorf("option %d present", o)
				}
			}
			if c.typ == dhcpNak && got.Flags&flagBroadcast == 0 {
				t.Error("NAK not broadcast")
			}
		})
	}
	// The values of an ACK, as a client reads them.
	ack := dhcpReply(testRequest(dhcpRequest, map[byte][]byte{optRequestedIP: ip4("10.0.0.5")}), leases)
	for code, want := range map[byte][]byte{
		optSubnetMask: {255, 255, 255, 0}, optRouter: ip4("10.0.0.1"), optDNS: ip4("192.0.2.53"),
		optHostname: []byte("vm-one"), optMTU: {0x05, 0xaa}, optLeaseTime: optU32(600),
		optRenewalTime: optU32(300), optRebindingTime: optU32(525), optServerID: ip4("10.0.0.2"),
		optClasslessRoute: {32, 169, 254, 169, 254, 10, 0, 0, 2},
	} {
		if got := ack.Options[code]; !bytes.Equal(got, want) {
			t.Errorf("option %d = %v, want %v", code, got, want)
		}
	}
}

// testNetwork is a network with one DHCP-enabled IPv4 subnet, an IPv6
// one, and a port with an address on each.
func testNetwork(id string) (netstate.Network, netstate.Port) {
	n := netstate.Network{
		ID: id, VNI: 100, MTU: 1450,
		Subnets: []netstate.Subnet{
			{ID: "v4", CIDR: "10.0.0.0/24", Gateway: "10.0.0.1", DNS: []string{"192.0.2.53", "2001:db8::53"}, EnableDHCP: true,
				Routes: []netstate.Route{{Destination: "172.16.0.0/12", NextHop: "10.0.0.254"}, {Destination: "2001:db8:1::/48", NextHop: "2001:db8::1"}}},
			{ID: "v6", CIDR: "2001:db8::/64", Gateway: "2001:db8::1", EnableDHCP: true},
		},
		DHCP: &netstate.DHCPPort{MAC: "fa:16:3e:00:00:02", IPs: []netstate.FixedIP{{SubnetID: "v6", IP: "2001:db8::2"}, {SubnetID: "v4", IP: "10.0.0.2"}}},
	}
	p := netstate.Port{ID: "port-one", NetworkID: id, Hostname: "vm-one", MAC: strings.ToUpper(testMAC), AdminUp: true,
		IPs: []netstate.FixedIP{{SubnetID: "v6", IP: "2001:db8::5"}, {SubnetID: "v4", IP: "10.0.0.5"}}}
	return n, p
}

func TestDHCPLeases(t *testing.T) {
	n, p := testNetwork("net-1")
	other := p
	other.ID, other.NetworkID, other.MAC = "port-two", "net-2", "fa:16:3e:00:00:06"
	noDHCP := p
	noDHCP.ID, noDHCP.MAC, noDHCP.IPs = "port-three", "fa:16:3e:00:00:07", []netstate.FixedIP{{SubnetID: "v6", IP: "2001:db8::7"}}
	st := &netstate.Host{Networks: []netstate.Network{n}, Ports: []netstate.Port{p, other, noDHCP}}
	got := dhcpLeases(st, &st.Networks[0], slog.New(slog.DiscardHandler))
	want := &dhcpLease{
		IP: netip.MustParseAddr("10.0.0.5"), Mask: netip.MustParsePrefix("10.0.0.0/24"),
		Server: netip.MustParseAddr("10.0.0.2"), Router: netip.MustParseAddr("10.0.0.1"),
		DNS: []netip.Addr{netip.MustParseAddr("192.0.2.53")},
		Routes: []classlessRoute{
			{netip.MustParsePrefix("172.16.0.0/12"), netip.MustParseAddr("10.0.0.254")},
			{metadataAddr, netip.MustParseAddr("10.0.0.2")},
			{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParseAddr("10.0.0.1")},
		},
		Hostname: "vm-one", MTU: 1450,
	}
	if len(got) != 1 || !reflect.DeepEqual(got[testMAC], want) {
		t.Fatalf("leases %+v, want only %s: %+v", got, testMAC, want)
	}

	// A subnet's own default route and no gateway: no second default, no
	// router option.
	st.Networks[0].Subnets[0].Gateway = ""
	st.Networks[0].Subnets[0].Routes = []netstate.Route{{Destination: "0.0.0.0/0", NextHop: "10.0.0.254"}}
	l := dhcpLeases(st, &st.Networks[0], slog.New(slog.DiscardHandler))[testMAC]
	if l.Router.IsValid() || len(l.Routes) != 2 || l.Routes[0].NextHop != netip.MustParseAddr("10.0.0.254") {
		t.Errorf("lease %+v", l)
	}
	// DHCP off on the subnet: no lease.
	st.Networks[0].Subnets[0].EnableDHCP = false
	if l := dhcpLeases(st, &st.Networks[0], slog.New(slog.DiscardHandler)); len(l) != 0 {
		t.Errorf("leases with DHCP off: %+v", l)
	}
}

// TestDHCPNamespace runs the part on a host namespace with a network's
// bridge and a guest namespace joined to it, and busybox udhcpc (the
// test guest's client) in the guest.
func TestDHCPNamespace(t *testing.T) {
	if _, err := exec.LookPath("busybox"); err != nil {
		t.Skip("busybox not installed (apt-get install busybox): it is the DHCP client this test runs")
	}
	hostPath := testNS(t)
	host, err := nsHandle(hostPath)
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	const netID = "5e7d1c2a-9b3f-4f0e-8a6d-2c4b1e0f9d3a"
	n, port := testNetwork(netID)
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: netstate.BridgeName(netID), MTU: n.MTU}}
	if err := host.LinkAdd(br); err != nil {
		t.Fatal(err)
	}
	if err := host.LinkSetUp(br); err != nil {
		t.Fatal(err)
	}
	guest, guestPath := testGuest(t, host, br, port.MAC)

	src := &testMetadata{}
	cfg := Config{NetNS: hostPath, Prefix: testName(t, "-"), Metadata: src}
	pt, err := newDHCP(cfg)
	if err != nil {
		t.Fatal(err)
	}
	d := pt.(*dhcpPart)
	nsName := d.nsName(netID)
	t.Cleanup(func() {
		_ = d.apply(context.Background(), &netstate.Host{})
		_ = d.close()
		_ = deleteNamedNS(nsName)
	})
	st := &netstate.Host{Host: "host-a", Networks: []netstate.Network{n}, Ports: []netstate.Port{port}}
	apply := func() {
		t.Helper()
		if err := d.apply(context.Background(), st); err != nil {
			t.Fatal(err)
		}
	}
	apply()
	first, err := host.LinkByName(dhcpVethName(netID))
	if err != nil {
		t.Fatal(err)
	}
	server := d.nets[nsName].server
	// An address SLAAC would add is none of the part's business.
	ipIn(t, nsName, "addr", "add", "2001:db8::99/64", "dev", dhcpIfName, "valid_lft", "300", "preferred_lft", "300")
	apply() // idempotent: nothing rewired, servers kept
	if again, err := host.LinkByName(dhcpVethName(netID)); err != nil || again.Attrs().Index != first.Attrs().Index || d.nets[nsName].server != server {
		t.Fatalf("second apply rewired the network: %v", err)
	}

	lease := udhcpc(t, guest, true)
	for k, want := range map[string]string{
		"ip": "10.0.0.5", "subnet": "255.255.255.0", "mask": "24", "router": "10.0.0.1", "mtu": "1450",
		"hostname": "vm-one", "dns": "192.0.2.53", "serverid": "10.0.0.2", "lease": "600",
		"staticroutes": "172.16.0.0/12 10.0.0.254 169.254.169.254/32 10.0.0.2 0.0.0.0/0 10.0.0.1",
	} {
		if got := strings.TrimSpace(lease[k]); got != want {
			t.Errorf("lease %s = %q, want %q", k, got, want)
		}
	}

	t.Run("unknown MAC gets no answer", func(t *testing.T) {
		g, err := nsHandle(guestPath)
		if err != nil {
			t.Fatal(err)
		}
		defer g.Close()
		l, err := g.LinkByName("eth0")
		if err != nil {
			t.Fatal(err)
		}
		other, _ := net.ParseMAC("fa:16:3e:00:00:99")
		mine, _ := net.ParseMAC(port.MAC)
		if err := g.LinkSetHardwareAddr(l, other); err != nil {
			t.Fatal(err)
		}
		defer func() { _ = g.LinkSetHardwareAddr(l, mine) }()
		if lease := udhcpc(t, guest, false); lease != nil {
			t.Fatalf("unknown MAC got a lease: %v", lease)
		}
	})

	t.Run("port update changes the next lease", func(t *testing.T) {
		st.Ports[0].IPs[1].IP, st.Ports[0].Hostname = "10.0.0.6", "vm-renamed"
		apply()
		lease := udhcpc(t, guest, true)
		if lease["ip"] != "10.0.0.6" || lease["hostname"] != "vm-renamed" {
			t.Fatalf("lease after update: ip %q hostname %q", lease["ip"], lease["hostname"])
		}
	})

	t.Run("metadata", func(t *testing.T) {
		for _, a := range []string{"10.0.0.6/24", "10.0.0.77/24"} {
			ipIn(t, guest, "addr", "add", a, "dev", "eth0")
		}
		ipIn(t, guest, "route", "add", "169.254.169.254/32", "via", "10.0.0.2")
		for _, from := range []string{"10.0.0.6", "10.0.0.77"} {
			body := metadataGet(t, guestPath, from, "/openstack/latest/meta_data.json?x=1")
			want := "host-a " + netID + " " + from + " GET /openstack/latest/meta_data.json?x=1"
			if body != want {
				t.Errorf("from %s: %q, want %q", from, body, want)
			}
		}
	})

	t.Run("renewal is answered at the client's address", func(t *testing.T) {
		// As systemd-networkd renews: unicast from a socket bound to the
		// leased address, which a broadcast answer would miss.
		var conn *net.UDPConn
		if err := inNS(guestPath, func() error {
			var err error
			conn, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.ParseIP("10.0.0.6"), Port: 68})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		req := testRequest(dhcpRequest, nil)
		req.CIAddr = netip.MustParseAddr("10.0.0.6")
		if _, err := conn.WriteToUDP(req.encode(), &net.UDPAddr{IP: net.ParseIP("10.0.0.2"), Port: 67}); err != nil {
			t.Fatal(err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(3 * time.Second))
		buf := make([]byte, 1500)
		n, err := conn.Read(buf)
		if err != nil {
			t.Fatalf("no answer to the renewal: %v", err)
		}
		ack, err := decodeDHCP(buf[:n])
		if err != nil || ack.msgType() != dhcpAck || ack.YIAddr.String() != "10.0.0.6" || ack.XID != req.XID {
			t.Fatalf("answer %+v, %v", ack, err)
		}
	})

	t.Run("changed DHCP port is rewired", func(t *testing.T) {
		st.Networks[0].DHCP = &netstate.DHCPPort{MAC: "fa:16:3e:00:00:03", IPs: []netstate.FixedIP{{SubnetID: "v4", IP: "10.0.0.3"}}}
		apply()
		inner, err := nsHandle(d.nets[nsName].path)
		if err != nil {
			t.Fatal(err)
		}
		defer inner.Close()
		l, err := inner.LinkByName(dhcpIfName)
		if err != nil || l.Attrs().HardwareAddr.String() != "fa:16:3e:00:00:03" {
			t.Fatalf("DHCP device %v, %v", l, err)
		}
		lease := udhcpc(t, guest, true)
		if lease["serverid"] != "10.0.0.3" || !strings.Contains(lease["staticroutes"], "169.254.169.254/32 10.0.0.3") {
			t.Fatalf("lease after rewiring: %v", lease)
		}
		ipIn(t, guest, "route", "replace", "169.254.169.254/32", "via", "10.0.0.3")
		if body := metadataGet(t, guestPath, "10.0.0.6", "/latest/meta-data/"); !strings.HasSuffix(body, "10.0.0.6 GET /latest/meta-data/") {
			t.Errorf("metadata after rewiring: %q", body)
		}
	})

	t.Run("a new part adopts the namespace", func(t *testing.T) {
		// An agent restart: the devices stay, the servers start anew.
		before, err := host.LinkByName(dhcpVethName(netID))
		if err != nil {
			t.Fatal(err)
		}
		if err := d.close(); err != nil {
			t.Fatal(err)
		}
		pt, err := newDHCP(cfg)
		if err != nil {
			t.Fatal(err)
		}
		d = pt.(*dhcpPart)
		apply()
		if after, err := host.LinkByName(dhcpVethName(netID)); err != nil || after.Attrs().Index != before.Attrs().Index {
			t.Fatalf("veth made anew (%v)", err)
		}
		if lease := udhcpc(t, guest, true); lease["ip"] != "10.0.0.6" {
			t.Fatalf("lease after restart: %v", lease)
		}
	})

	t.Run("empty state removes everything", func(t *testing.T) {
		// What a previous run left that no network explains goes too.
		stale := cfg.prefix() + "dhcp-stale"
		if _, err := ensureNamedNS(stale); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = deleteNamedNS(stale) })
		if err := host.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: netstate.DHCPPrefix + "stale"}, PeerName: "ndhpeer"}); err != nil {
			t.Fatal(err)
		}
		if err := d.apply(context.Background(), &netstate.Host{}); err != nil {
			t.Fatal(err)
		}
		for _, ns := range []string{nsName, stale} {
			if _, err := os.Stat(filepath.Join(namedNSDir, ns)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("namespace %s still there: %v", ns, err)
			}
		}
		for _, l := range []string{dhcpVethName(netID), netstate.DHCPPrefix + "stale"} {
			if _, err := host.LinkByName(l); err == nil {
				t.Errorf("veth %s still there", l)
			}
		}
		if len(d.nets) != 0 {
			t.Errorf("servers left: %v", d.nets)
		}
	})
}

// testGuest is a stand-in VM: a namespace whose eth0, with MAC mac, is
// joined to bridge br of the host namespace by a veth.
func testGuest(t *testing.T, host *netlink.Handle, br netlink.Link, mac string) (name, path string) {
	t.Helper()
	name = testName(t, "g")
	path, err := ensureNamedNS(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = deleteNamedNS(name) })
	hw, _ := net.ParseMAC(mac)
	ns, err := openNS(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "gst0", MTU: br.Attrs().MTU, MasterIndex: br.Attrs().Index},
		PeerName: "eth0", PeerHardwareAddr: hw, PeerNamespace: netlink.NsFd(ns)}
	if err := host.LinkAdd(v); err != nil {
		t.Fatal(err)
	}
	if err := host.LinkSetUp(v); err != nil {
		t.Fatal(err)
	}
	ipIn(t, name, "link", "set", "eth0", "up")
	return name, path
}

func ipIn(t *testing.T, ns string, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", append([]string{"-n", ns}, args...)...).CombinedOutput(); err != nil {
		t.Fatalf("ip %v: %v: %s", args, err, out)
	}
}

// udhcpc runs busybox udhcpc once in guest namespace ns and returns what
// its script was told on "bound", nil when it got no lease.
func udhcpc(t *testing.T, ns string, want bool) map[string]string {
	t.Helper()
	dir := t.TempDir()
	out := filepath.Join(dir, "env")
	script := filepath.Join(dir, "script")
	if err := os.WriteFile(script, []byte("#!/bin/sh\n[ \"$1\" = bound ] && env >"+out+"\nexit 0\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	tries := "2"
	if want {
		tries = "5"
	}
	cmd := exec.Command("ip", "netns", "exec", ns, "busybox", "udhcpc", "-f", "-q", "-n", "-i", "eth0",
		"-t", tries, "-T", "1", "-s", script)
	msg, err := cmd.CombinedOutput()
	b, rerr := os.ReadFile(out)
	if err != nil || rerr != nil {
		if want {
			t.Fatalf("udhcpc: %v, %v: %s", err, rerr, msg)
		}
		return nil
	}
	env := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			env[k] = v
		}
	}
	return env
}
