package netplane

import (
	"context"
	"fmt"
	"os"
	"reflect"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"nimbus/internal/netstate"
)

// The firewall part enforces security groups and anti-spoofing on the
// host's server ports with nftables, in two tables of its own, both named
// "nimbus" (every other table is left alone):
//
//   - bridge nimbus, prerouting at -200 ("spoof"): every frame a secured
//     port sends is checked against the port's MACs and addresses (fixed
//     IPs and allowed address pairs), and DHCP-server replies and router
//     advertisements from it are dropped, before anything else sees it.
//   - inet nimbus, prerouting (reached through br_netfilter, which gives
//     the bridge, not the port, as the input device): each network's
//     bridged packets get the network's conntrack zone, so that two
//     projects' identical addresses never share a connection, and after
//     conntrack, a mark bit (markEstablished) when they belong to an
//     established or related connection. The bridge family has no
//     conntrack here; the mark carries the state over.
//   - bridge nimbus, forward at 100 ("egress") and 110 ("ingress"), after
//     br_netfilter's own forward hook (0), where both the input and the
//     output bridge port are known: a secured port's sends pass its
//     egress chain, frames to it its ingress chain. The rules of a
//     security group live once, in a chain per group and direction that
//     the ports jump to, and a remote group is a set of member addresses
//     per group and family, so a membership change is a set's content.
//     The egress base chain also isolates DHCP: no frame crosses between
//     a DHCP veth (ndh*) and a VXLAN device (nvx*).
//
// Every apply replaces both tables whole in one nftables transaction:
// the change is atomic, takes effect when apply returns, and conntrack
// entries (kept by the kernel, not the tables) survive it; when the
// rules changed, the entries of connections they no longer allow are
// deleted (firewall_conntrack.go).
type firewall struct {
	cfg Config
	// last is the ruleset of the last apply that fully succeeded (the
	// Plane serialises apply).
	last *fwRuleset
}

// tableName names both of the firewall's tables.
const tableName = "nimbus"

// markEstablished is the meta mark bit the inet chain sets on packets of
// established or related connections for the bridge chains to read.
const markEstablished = 0x00100000

func newFirewall(cfg Config) (part, error) {
	return &firewall{cfg: cfg}, nil
}

func (f *firewall) apply(ctx context.Context, st *netstate.Host) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	rs, err := compileFirewall(st)
	if err != nil {
		return err
	}
	for _, msg := range rs.skipped {
		if f.cfg.Log != nil {
			f.cfg.Log.Warn("netplane: firewall: rule not enforced", "why", msg)
		}
	}
	if err := inNS(f.cfg.NetNS, enableBridgeNF); err != nil {
		return err
	}
	// The socket is made in the host namespace and then used from any
	// thread: a transaction's many acknowledgements are read without
	// holding a thread locked in the namespace.
	opts := []nftables.ConnOption{nftables.WithSockOptions(bigBuffers)}
	if f.cfg.NetNS != "" {
		ns, err := openNS(f.cfg.NetNS)
		if err != nil {
			return fmt.Errorf("netplane: namespace %s: %w", f.cfg.NetNS, err)
		}
		defer ns.Close()
		opts = append(opts, nftables.WithNetNSFd(int(ns)))
	}
	c, err := nftables.New(opts...)
	if err != nil {
		return fmt.Errorf("netplane: nftables: %w", err)
	}
	rs.program(c)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("netplane: firewall: apply ruleset: %w", err)
	}
	if !reflect.DeepEqual(rs, f.last) {
		if err := revokeConnections(f.cfg.NetNS, rs); err != nil {
			return err
		}
	}
	f.last = rs
	return nil
}

// close has nothing to stop: the rules stay, like the devices.
func (f *firewall) close() error { return nil }

// enableBridgeNF makes bridged IPv4 and IPv6 traverse the inet hooks
// (conntrack, zones), a per-namespace switch; the caller is in the host
// namespace.
func enableBridgeNF() error {
	for _, k := range []string{"bridge-nf-call-iptables", "bridge-nf-call-ip6tables"} {
		if err := os.WriteFile("/proc/sys/net/bridge/"+k, []byte("1\n"), 0o644); err != nil {
			return fmt.Errorf("netplane: firewall: enable %s: %w", k, err)
		}
	}
	return nil
}

// nlBuffer bounds the netlink socket's buffers: a whole ruleset goes out
// in one message and the kernel acknowledges each of its parts, more
// than the default buffers hold for a few hundred rules.
const nlBuffer = 64 << 20

// bigBuffers raises the socket's buffers past the system's limits
// (SO_*BUFFORCE, which CAP_NET_ADMIN allows, as nft does).
func bigBuffers(c *netlink.Conn) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = rc.Control(func(fd uintptr) {
		for _, opt := range []int{unix.SO_SNDBUFFORCE, unix.SO_RCVBUFFORCE} {
			if e := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, opt, nlBuffer); e != nil {
				serr = fmt.Errorf("netplane: firewall: netlink buffer: %w", e)
			}
		}
	})
	if err != nil {
		return err
	}
	return serr
}
