package netplane

import (
	"testing"

	"github.com/vishvananda/netlink"
)

func TestInNS(t *testing.T) {
	path := testNS(t)
	h, err := nsHandle(path)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := h.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "nbrtest"}}); err != nil {
		t.Fatal(err)
	}
	// Made in the test namespace, seen from inside it, not from ours.
	if err := inNS(path, func() error { _, err := netlink.LinkByName("nbrtest"); return err }); err != nil {
		t.Fatalf("bridge not seen inside the namespace: %v", err)
	}
	if _, err := netlink.LinkByName("nbrtest"); err == nil {
		t.Fatal("bridge leaked into the test's own namespace")
	}
}
