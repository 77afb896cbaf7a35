package netplane

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"nimbus/internal/netstate"
)

// BenchmarkPortToTraffic times, with a network already wired on two
// hosts, a new port from Apply (on both hosts at once, as their agents
// would) to the first echo reply from its guest across the VXLAN. The
// guest's device exists beforehand, as a VM's would (its boot is not
// counted).
func BenchmarkPortToTraffic(b *testing.B) {
	c := twoHosts(b)
	A, B := c.hosts[0], c.hosts[1]
	n := c.addNet(701, "p1")
	c.addGuest(b, A, n, "10.0.0.1", "a1")
	b1 := c.addGuest(b, B, n, "10.0.0.2", "b1")
	c.apply(b)
	if reach(b, b1, "10.0.0.1", 3*time.Second) != "a1" {
		b.Fatal("the network does not carry traffic")
	}
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		b.StopTimer()
		// A fresh address each time: b1's ARP cache keeps the last one.
		g := c.addGuest(b, A, n, fmt.Sprintf("10.0.0.%d", 10+i%240), fmt.Sprintf("new%d", i))
		b.StartTimer()
		applyAll(b, c)
		awaitOperUp(b, g.ns, "eth0")
		if got := reach(b, b1, g.ip, 3*time.Second); got != g.label {
			b.Fatalf("new port answered by %q", got)
		}
		b.StopTimer()
		c.remove(g)
		applyAll(b, c)
		b.StartTimer()
	}
	b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/op")
}

// awaitOperUp waits until link name in ns is operationally up: a veth
// standing in for a VM has its own link activation, which a VM's NIC does
// not share, and a frame it sends before then is dropped.
func awaitOperUp(b *testing.B, ns, name string) {
	h, err := nsHandle(ns)
	if err != nil {
		b.Fatal(err)
	}
	defer h.Close()
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(100 * time.Microsecond) {
		if l, err := h.LinkByName(name); err == nil && l.Attrs().OperState == netlink.OperUp {
			return
		}
	}
	b.Fatalf("%s never came up", name)
}

// applyAll applies every host's state at once.
func applyAll(b *testing.B, c *cloud) {
	var wg sync.WaitGroup
	errs := make([]error, len(c.hosts))
	for i, h := range c.hosts {
		wg.Go(func() { errs[i] = h.plane.Apply(context.Background(), c.state(h)) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkThroughput compares TCP bulk transfer between two guests on
// different hosts, through bridge, VXLAN over a veth underlay and the
// nftables of their security group (stateful, anti-spoofing), with the
// same transfer over a plain veth pair between two namespaces.
func BenchmarkThroughput(b *testing.B) {
	const size = 256 << 20
	c := twoHosts(b)
	A, B := c.hosts[0], c.hosts[1]
	n := c.addNet(801, "p1")
	a1 := c.addGuest(b, A, n, "10.0.0.1", "a1")
	b1 := c.addGuest(b, B, n, "10.0.0.2", "b1")
	c.groups = []netstate.SecurityGroup{{ID: "sg-bench", Stateful: true, Rules: []netstate.Rule{
		{ID: "in-tcp", Direction: "ingress", Ethertype: "IPv4", Protocol: "tcp", RemoteIPPrefix: "10.0.0.0/24"},
		{ID: "in-udp", Direction: "ingress", Ethertype: "IPv4", Protocol: "udp", RemoteIPPrefix: "10.0.0.0/24"},
		{ID: "out", Direction: "egress", Ethertype: "IPv4"},
	}}}
	for _, g := range []*guest{a1, b1} {
		g.port.PortSecurity, g.port.SecurityGroups = true, []string{"sg-bench"}
	}
	c.apply(b)
	if reach(b, a1, b1.ip, 3*time.Second) != "b1" {
		b.Fatal("the network does not carry traffic")
	}
	p, q := vethPair(b)

	var vx, plain time.Duration
	for b.Loop() {
		vx += transfer(b, a1.ns, b1.ns, b1.ip, size)
		plain += transfer(b, p, q, "198.51.100.2", size)
	}
	mbps := func(d time.Duration) float64 { return float64(b.N) * size / (1 << 20) / d.Seconds() }
	b.ReportMetric(mbps(vx), "vxlan-MB/s")
	b.ReportMetric(mbps(plain), "veth-MB/s")
	b.ReportMetric(100*mbps(vx)/mbps(plain), "vxlan/veth-%")
}

// vethPair makes two namespaces joined by a veth, 198.51.100.1 and .2.
func vethPair(b *testing.B) (string, string) {
	p, q := testNS(b), testNS(b)
	qfd, err := netns.GetFromPath(q)
	if err != nil {
		b.Fatal(err)
	}
	defer qfd.Close()
	h := nsH(b, p)
	if err := h.LinkAdd(&netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: "eth0"},
		PeerName:      "eth0",
		PeerNamespace: netlink.NsFd(qfd),
	}); err != nil {
		b.Fatal(err)
	}
	bringUp(b, p, "eth0", "198.51.100.1/24", nil)
	bringUp(b, q, "eth0", "198.51.100.2/24", nil)
	return p, q
}

// transfer sends size bytes over TCP from namespace from to ip in
// namespace to and returns how long the receiver took to read them.
func transfer(b *testing.B, from, to, ip string, size int64) time.Duration {
	var ln net.Listener
	if err := inNS(to, func() (err error) { ln, err = net.Listen("tcp4", ip+":0"); return err }); err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	done := make(chan time.Duration, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			done <- 0
			return
		}
		defer conn.Close()
		start := time.Now()
		if n, _ := io.Copy(io.Discard, conn); n != size {
			done <- 0
			return
		}
		done <- time.Since(start)
	}()
	var conn net.Conn
	if err := inNS(from, func() (err error) { conn, err = net.Dial("tcp4", ln.Addr().String()); return err }); err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 1<<20)
	for sent := int64(0); sent < size; sent += int64(len(buf)) {
		if _, err := conn.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	_ = conn.Close()
	d := <-done
	if d == 0 {
		b.Fatal("transfer incomplete")
	}
	return d
}
