package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"regexp"
	"strconv"
	"strings"

	"nimbus/internal/agent"
	"nimbus/internal/cloud"
	"nimbus/internal/netplane"
)

// netFlags are the data plane's flags, the same for "nimbus serve" (its
// local agent) and "nimbus agent".
type netFlags struct {
	mode                              string
	providerBridge, providerInterface string
	underlayMTU                       int
	nsPrefix                          string
	// hostIP is serve's --host-ip; the agent has its own, which the qemu
	// driver's host address shares.
	hostIP string
}

// register adds the flags to fs; withHostIP adds --host-ip too (serve,
// whose local agent has no other).
func (n *netFlags) register(fs *flag.FlagSet, withHostIP bool) {
	fs.StringVar(&n.mode, "network-mode", "user", "how servers' ports are wired: user (user-mode networking: one forwarded SSH/RDP port per server, no root needed) or bridged (taps on Linux bridges, VXLAN between hosts, security groups, routers and floating IPs: needs --driver qemu, root, and --host-ip)")
	fs.StringVar(&n.providerBridge, "provider-bridge", "", "bridged mode: an existing bridge on the provider network; the host then carries routers and floating IPs (a gateway host)")
	fs.StringVar(&n.providerInterface, "provider-interface", "", "bridged mode: an interface on the provider network; the agent makes bridge "+agent.ProviderBridgeName+" and enslaves it, moving no address: put the host's own provider address on "+agent.ProviderBridgeName+", not on the interface (a gateway host, as --provider-bridge)")
	fs.IntVar(&n.underlayMTU, "underlay-mtu", 0, "bridged mode: the underlay's MTU; tenant networks get 50 less for the VXLAN header (default: the MTU of the link holding --host-ip)")
	fs.StringVar(&n.nsPrefix, "netns-prefix", netplane.DefaultPrefix, "bridged mode: how the names of the agent's network namespaces (DHCP, routers) start; give each simulated host on one machine its own")
	if withHostIP {
		fs.StringVar(&n.hostIP, "host-ip", "", "qemu driver: the local agent's host address; in bridged mode its IPv4 address on the underlay, where VXLAN tunnels end (default: --public-host)")
	}
}

// options checks the flags for driver drv and host address hostIP: nil
// for user-mode networking.
func (n *netFlags) options(drv, hostIP string) (*cloud.NetworkOptions, error) {
	return n.check(drv, hostIP, netAdmin())
}

// check is options, with admin the answer to whether this process may
// administer the network (nil: it may).
func (n *netFlags) check(drv, hostIP string, admin error) (*cloud.NetworkOptions, error) {
	switch n.mode {
	case "user":
		for _, f := range []struct {
			set  bool
			name string
		}{{n.providerBridge != "", "--provider-bridge"}, {n.providerInterface != "", "--provider-interface"}, {n.underlayMTU != 0, "--underlay-mtu"}} {
			if f.set {
				return nil, fmt.Errorf("%s is for --network-mode bridged", f.name)
			}
		}
		return nil, nil
	case "bridged":
	default:
		return nil, fmt.Errorf("--network-mode: want user or bridged, not %q", n.mode)
	}
	if drv != "qemu" {
		return nil, fmt.Errorf("--network-mode bridged needs --driver qemu: the %s driver runs no VMs to wire", drv)
	}
	if a, err := netip.ParseAddr(hostIP); err != nil || !a.Is4() || a.IsLoopback() || a.IsUnspecified() {
		return nil, fmt.Errorf("--network-mode bridged needs --host-ip, this host's IPv4 address on the underlay (where its VXLAN tunnels end), not %q", hostIP)
	}
	if n.providerBridge != "" && n.providerInterface != "" {
		return nil, errors.New("--provider-bridge and --provider-interface: give one (the bridge on the provider network, or the interface the agent bridges)")
	}
	for _, f := range []struct{ name, v string }{{"--provider-bridge", n.providerBridge}, {"--provider-interface", n.providerInterface}} {
		if f.v != "" && !linkName(f.v) {
			return nil, fmt.Errorf("%s: %q is not an interface name (1 to 15 characters, no '/', ':' or spaces)", f.name, f.v)
		}
	}
	if !nsPrefixRE.MatchString(n.nsPrefix) {
		return nil, fmt.Errorf("--netns-prefix: %q is not 1 to 32 letters, digits, '-' or '_'", n.nsPrefix)
	}
	if n.underlayMTU != 0 && (n.underlayMTU < 1280 || n.underlayMTU > 65535) {
		return nil, fmt.Errorf("--underlay-mtu: %d is not an MTU from 1280 to 65535", n.underlayMTU)
	}
	if admin != nil {
		return nil, fmt.Errorf("--network-mode bridged makes bridges, taps and nftables rules: run as root or with CAP_NET_ADMIN (%v)", admin)
	}
	return &cloud.NetworkOptions{UnderlayMTU: n.underlayMTU, ProviderBridge: n.providerBridge, ProviderInterface: n.providerInterface,
		NamespacePrefix: n.nsPrefix}, nil
}

// nsPrefixRE is a namespace name prefix: a file name in /run/netns.
var nsPrefixRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,32}$`)

// linkName is a name Linux takes for a network device.
func linkName(s string) bool {
	return len(s) >= 1 && len(s) <= 15 && s != "." && s != ".." && !strings.ContainsAny(s, "/: \t\n")
}

// capNetAdmin is CAP_NET_ADMIN's bit in the capability sets.
const capNetAdmin = 12

// netAdmin is nil when this process has CAP_NET_ADMIN (root has it),
// else why not.
func netAdmin() error {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return fmt.Errorf("reading the process's capabilities: %w", err)
	}
	defer f.Close()
	return netAdminIn(f)
}

// netAdminIn is netAdmin from a /proc/<pid>/status.
func netAdminIn(status io.Reader) error {
	sc := bufio.NewScanner(status)
	for sc.Scan() {
		hex, ok := strings.CutPrefix(sc.Text(), "CapEff:")
		if !ok {
			continue
		}
		caps, err := strconv.ParseUint(strings.TrimSpace(hex), 16, 64)
		if err != nil {
			return fmt.Errorf("reading the process's capabilities: %w", err)
		}
		if caps&(1<<capNetAdmin) == 0 {
			return errors.New("this process lacks CAP_NET_ADMIN")
		}
		return nil
	}
	return errors.New("the process's capabilities are not in its status")
}
