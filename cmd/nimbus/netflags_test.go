package main

import (
	"errors"
	"flag"
	"io"
	"strings"
	"testing"

	"nimbus/internal/cloud"
)

// TestNetFlags: the data plane's flags as serve and the agent parse them:
// user mode is the default and takes no bridged flag; bridged mode wants
// the qemu driver, an underlay IPv4 address, at most one provider
// setting, a sane MTU and the right to administer the network.
func TestNetFlags(t *testing.T) {
	noAdmin := errors.New("this process lacks CAP_NET_ADMIN")
	cases := []struct {
		name   string
		args   []string
		drv    string
		hostIP string
		admin  error
		want   *cloud.NetworkOptions
		err    string // "" for none
	}{
		{name: "default: user mode", drv: "fake"},
		{name: "user mode, qemu", args: []string{"--network-mode", "user"}, drv: "qemu", hostIP: "192.0.2.10"},
		{name: "user mode refuses bridged flags", args: []string{"--provider-bridge", "br0"}, drv: "qemu", err: "--provider-bridge is for --network-mode bridged"},
		{name: "user mode refuses an MTU", args: []string{"--underlay-mtu", "9000"}, drv: "qemu", err: "--underlay-mtu is for --network-mode bridged"},
		{name: "unknown mode", args: []string{"--network-mode", "macvtap"}, drv: "qemu", err: `want user or bridged, not "macvtap"`},
		{name: "bridged, no provider", args: []string{"--network-mode", "bridged"}, drv: "qemu", hostIP: "192.0.2.10",
			want: &cloud.NetworkOptions{NamespacePrefix: "nimbus-"}},
		{name: "bridged gateway on a bridge", args: []string{"--network-mode", "bridged", "--provider-bridge", "br-ex", "--underlay-mtu", "9000"},
			drv: "qemu", hostIP: "192.0.2.10", want: &cloud.NetworkOptions{ProviderBridge: "br-ex", UnderlayMTU: 9000, NamespacePrefix: "nimbus-"}},
		{name: "bridged gateway on an interface", args: []string{"--network-mode", "bridged", "--provider-interface", "eth1"},
			drv: "qemu", hostIP: "192.0.2.10", want: &cloud.NetworkOptions{ProviderInterface: "eth1", NamespacePrefix: "nimbus-"}},
		{name: "a simulated host's namespaces", args: []string{"--network-mode", "bridged", "--netns-prefix", "h2-"},
			drv: "qemu", hostIP: "192.0.2.11", want: &cloud.NetworkOptions{NamespacePrefix: "h2-"}},
		{name: "bad namespace prefix", args: []string{"--network-mode", "bridged", "--netns-prefix", "../x"},
			drv: "qemu", hostIP: "192.0.2.11", err: `--netns-prefix: "../x"`},
		{name: "bridged with the fake driver", args: []string{"--network-mode", "bridged"}, drv: "fake", hostIP: "192.0.2.10",
			err: "needs --driver qemu: the fake driver runs no VMs"},
		{name: "bridged without --host-ip", args: []string{"--network-mode", "bridged"}, drv: "qemu", err: "needs --host-ip"},
		{name: "bridged on a host name", args: []string{"--network-mode", "bridged"}, drv: "qemu", hostIP: "host1.example", err: "needs --host-ip"},
		{name: "bridged on IPv6", args: []string{"--network-mode", "bridged"}, drv: "qemu", hostIP: "2001:db8::1", err: "needs --host-ip"},
		{name: "bridged on loopback", args: []string{"--network-mode", "bridged"}, drv: "qemu", hostIP: "127.0.0.1", err: "needs --host-ip"},
		{name: "both providers", args: []string{"--network-mode", "bridged", "--provider-bridge", "br-ex", "--provider-interface", "eth1"},
			drv: "qemu", hostIP: "192.0.2.10", err: "give one"},
		{name: "bad bridge name", args: []string{"--network-mode", "bridged", "--provider-bridge", "a-name-far-too-long"},
			drv: "qemu", hostIP: "192.0.2.10", err: "--provider-bridge: \"a-name-far-too-long\" is not an interface name"},
		{name: "bad interface name", args: []string{"--network-mode", "bridged", "--provider-interface", "eth0/1"},
			drv: "qemu", hostIP: "192.0.2.10", err: "--provider-interface: \"eth0/1\" is not an interface name"},
		{name: "MTU too small", args: []string{"--network-mode", "bridged", "--underlay-mtu", "600"}, drv: "qemu", hostIP: "192.0.2.10",
			err: "--underlay-mtu: 600"},
		{name: "not root", args: []string{"--network-mode", "bridged"}, drv: "qemu", hostIP: "192.0.2.10", admin: noAdmin,
			err: "run as root or with CAP_NET_ADMIN"},
		{name: "user mode needs no root", drv: "qemu", admin: noAdmin},
	}
	for _, withHostIP := range []bool{false, true} { // the agent, serve
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				fs := flag.NewFlagSet("t", flag.ContinueOnError)
				fs.SetOutput(io.Discard)
				var n netFlags
				n.register(fs, withHostIP)
				if err := fs.Parse(tc.args); err != nil {
					t.Fatal(err)
				}
				got, err := n.check(tc.drv, tc.hostIP, tc.admin)
				if tc.err != "" {
					if err == nil || !strings.Contains(err.Error(), tc.err) {
						t.Fatalf("got %+v, %v; want an error with %q", got, err, tc.err)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if (got == nil) != (tc.want == nil) || got != nil && *got != *tc.want {
					t.Errorf("got %+v, want %+v", got, tc.want)
				}
			})
		}
	}
	// serve has --host-ip of its own; the agent's is its driver's.
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	var n netFlags
	n.register(fs, true)
	if err := fs.Parse([]string{"--host-ip", "192.0.2.7"}); err != nil || n.hostIP != "192.0.2.7" {
		t.Errorf("serve's --host-ip: %q, %v", n.hostIP, err)
	}
	if fs := flag.NewFlagSet("agent", flag.ContinueOnError); func() bool { (&netFlags{}).register(fs, false); return fs.Lookup("host-ip") != nil }() {
		t.Error("the agent's --host-ip registered twice")
	}
}

// TestNetAdmin reads CAP_NET_ADMIN (bit 12) from a process's status.
func TestNetAdmin(t *testing.T) {
	cases := []struct {
		status string
		ok     bool
	}{
		{"Name:\tnimbus\nCapInh:\t0000000000000000\nCapEff:\t000001ffffffffff\n", true}, // root
		{"CapEff:\t0000000000001000\n", true},                                           // CAP_NET_ADMIN alone
		{"CapEff:\t0000000000000000\n", false},                                          // a user
		{"CapEff:\t00000000a80425fb\n", false},                                          // a container's default set
		{"CapPrm:\t0000000000001000\n", false},                                          // permitted, not effective
		{"CapEff:\tzz\n", false},
	}
	for _, c := range cases {
		if err := netAdminIn(strings.NewReader(c.status)); (err == nil) != c.ok {
			t.Errorf("%q: %v, want ok %v", c.status, err, c.ok)
		}
	}
}
