package netplane

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/vishvananda/netlink"

	"nimbus/internal/netstate"
)

func TestPlaneRefuses(t *testing.T) {
	c := twoHosts(t)
	A, B := c.hosts[0], c.hosts[1]
	n := c.addNet(401, "p1")
	c.addGuest(t, A, n, "10.0.0.1", "a1")
	c.addGuest(t, B, n, "10.0.0.2", "b1")
	good := c.state(A)
	before := links(t, A.ns)
	for _, tc := range []struct {
		name string
		edit func(st *netstate.Host)
		want string
	}{
		{"another host's VTEP", func(st *netstate.Host) { st.VTEP = B.vtep }, "VTEP"},
		{"itself as a peer", func(st *netstate.Host) {
			st.Networks[0].Peers = append(st.Networks[0].Peers, netstate.Peer{Host: A.name, VTEP: A.vtep})
		}, "own peer"},
		{"its name on another VTEP", func(st *netstate.Host) {
			st.Networks[0].Peers = append(st.Networks[0].Peers, netstate.Peer{Host: A.name, VTEP: "192.0.2.99"})
		}, "own peer"},
		{"MTU above the underlay's", func(st *netstate.Host) { st.Networks[0].MTU = 1451 }, "MTU 1451 exceeds"},
		{"invalid state", func(st *netstate.Host) { st.Ports[0].MAC = "nope" }, "bad MAC"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := clone(good)
			tc.edit(st)
			err := A.plane.Apply(context.Background(), st)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Apply: %v, want an error with %q", err, tc.want)
			}
			if got := links(t, A.ns); strings.Join(got, " ") != strings.Join(before, " ") {
				t.Errorf("a refused state changed the host: %v, was %v", got, before)
			}
		})
	}
	// The plane still works after refusing.
	if err := A.plane.Apply(context.Background(), good); err != nil {
		t.Fatal(err)
	}
}

// clone copies st deeply enough for the edits above.
func clone(st *netstate.Host) *netstate.Host {
	c := *st
	c.Networks = append([]netstate.Network(nil), st.Networks...)
	for i := range c.Networks {
		c.Networks[i].Peers = append([]netstate.Peer(nil), st.Networks[i].Peers...)
	}
	c.Ports = append([]netstate.Port(nil), st.Ports...)
	return &c
}

func TestPlaneConcurrentApply(t *testing.T) {
	c := twoHosts(t)
	A, B := c.hosts[0], c.hosts[1]
	n := c.addNet(501, "p1")
	a1 := c.addGuest(t, A, n, "10.0.0.1", "a1")
	c.addGuest(t, B, n, "10.0.0.2", "b1")
	st := c.state(A)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() { errs <- A.plane.Apply(context.Background(), st) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	// Idempotent: another Apply replaces nothing.
	h := nsH(t, A.ns)
	index := func() map[string]int {
		ls, err := h.LinkList()
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]int{}
		for _, l := range ls {
			m[l.Attrs().Name] = l.Attrs().Index
		}
		return m
	}
	was := index()
	if err := A.plane.Apply(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	for name, i := range index() {
		if was[name] != i {
			t.Errorf("%s was remade by an Apply with nothing to do", name)
		}
	}
	if got := fdbOf(t, A.ns, n.VNI); len(got) != 2 {
		t.Errorf("FDB after concurrent applies: %v", got)
	}
	if !A.plane.Wired(a1.port.ID) {
		t.Error("port not wired")
	}
}

func TestPlaneClose(t *testing.T) {
	c := twoHosts(t)
	A := c.hosts[0]
	n := c.addNet(601, "p1")
	a1 := c.addGuest(t, A, n, "10.0.0.1", "a1")
	c.apply(t)
	if err := A.plane.Close(); err != nil {
		t.Fatal(err)
	}
	// The devices stay for the guests; the plane is done.
	if got := links(t, A.ns); !strings.Contains(strings.Join(got, " "), netstate.TapName(a1.port.ID)) {
		t.Errorf("Close removed the port's device: %v", got)
	}
	if err := A.plane.Apply(context.Background(), c.state(A)); err == nil {
		t.Error("Apply after Close succeeded")
	}
	if A.plane.Wired(a1.port.ID) {
		t.Error("Wired after Close")
	}
}

func TestPlaneFailedStepRetried(t *testing.T) {
	c := twoHosts(t)
	A := c.hosts[0]
	n := c.addNet(651, "p1")
	a1 := c.addGuest(t, A, n, "10.0.0.1", "a1")
	// A port whose device name is taken by a bridge, which no bridge
	// takes as a port.
	bad := &guest{label: "bad", host: A, port: netstate.Port{ID: uuid.NewString(), NetworkID: n.ID, MAC: randomMAC(t), AdminUp: true}}
	c.guests = append(c.guests, bad)
	h := nsH(t, A.ns)
	if err := h.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: netstate.TapName(bad.port.ID)}}); err != nil {
		t.Fatal(err)
	}
	err := A.plane.Apply(context.Background(), c.state(A))
	if err == nil || !strings.Contains(err.Error(), "l2") || !strings.Contains(err.Error(), bad.port.ID) {
		t.Fatalf("Apply: %v, want an error naming l2 and port %s", err, bad.port.ID)
	}
	// The good port was wired all the same, but no Apply succeeded yet.
	tap, err := h.LinkByName(netstate.TapName(a1.port.ID))
	if err != nil || tap.Attrs().MasterIndex == 0 {
		t.Errorf("the good port was not wired: %v", err)
	}
	if A.plane.Wired(a1.port.ID) {
		t.Error("Wired before any Apply succeeded")
	}
	// The obstacle goes; the next Apply retries everything.
	if l, err := h.LinkByName(netstate.TapName(bad.port.ID)); err == nil {
		_ = h.LinkDel(l)
	}
	if err := A.plane.Apply(context.Background(), c.state(A)); err != nil {
		t.Fatal(err)
	}
	if !A.plane.Wired(a1.port.ID, bad.port.ID) {
		t.Error("ports not wired after the retry")
	}
}
