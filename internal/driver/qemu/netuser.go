package qemu

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sort"
	"strings"

	"nimbus/internal/driver"
)

// UserNet is the user-mode (slirp) data plane: each VM has its own private
// network carrying its port's subnet; the guest gets exactly the port's
// fixed IP, gateway and DNS by DHCP, and SSH (22) or RDP (3389) is
// forwarded from a host port.
//
// Slirp plays the gateway (host=) and a DNS proxy (dns=) that forwards to
// the host's resolver; its DHCP server hands the first client dhcpstart,
// which is the port's fixed IP since the guest is the only client. The
// guest cannot reach other VMs and nothing reaches the guest but the
// forwarded ports. IPv4 only: slirp's IPv6 is turned off.
type UserNet struct {
	ListenAddr string // host address the forwards bind (default 0.0.0.0)
	AccessHost string // the host name/address users connect to (shown by Access)
}

var _ DataPlane = UserNet{}

// Netdev returns the -netdev value for port on NIC nicID:
//
//	user,id=<nicID>,net=<CIDR>,host=<gateway>,dhcpstart=<fixed IP>,dns=<dns>,ipv6=off,restrict=off[,hostfwd=tcp:<ListenAddr>:<host port>-<fixed IP>:<guest port>…]
//
// forwards maps guest ports to host ports (sorted by guest port in the
// result). The DNS address slirp answers on must lie inside the subnet and
// differ from the gateway and the guest: it is the port's first DNS
// nameserver when that qualifies, else the subnet's .3 (as slirp's own
// default 10.0.2.3), else the last usable address, else the first free one.
// Slirp answers there itself and forwards the queries to the host's
// resolver. A port without a gateway gets the first free address as
// slirp's host address (slirp always advertises a router). A port with
// neither CIDR nor IP (a server without ports) gets slirp's defaults
// (10.0.2.0/24, the guest at 10.0.2.15).
func (u UserNet) Netdev(nicID string, port driver.Port, forwards map[int]int) (string, error) {
	if !isQEMUID(nicID) {
		return "", fmt.Errorf("qemu: user net: bad NIC id %q (want a letter, then letters, digits, '-' or '_')", nicID)
	}
	if port.MAC != "" || port.CIDR != "" || port.IP != "" {
		if hw, err := net.ParseMAC(port.MAC); err != nil || len(hw) != 6 {
			return "", fmt.Errorf("qemu: user net: port %s: bad MAC address %q", port.ID, port.MAC)
		}
	}
	listen := u.ListenAddr
	if listen == "" {
		listen = "0.0.0.0"
	}
	if a, err := netip.ParseAddr(listen); err != nil || !a.Is4() {
		return "", fmt.Errorf("qemu: user net: bad listen address %q (want an IPv4 address)", listen)
	}
	if port.CIDR == "" && port.IP == "" {
		// No addressing (a server without ports): slirp's defaults, the
		// guest gets 10.0.2.15, where the forwards go.
		var b strings.Builder
		fmt.Fprintf(&b, "user,id=%s,ipv6=off,restrict=off", nicID)
		if err := hostfwds(&b, listen, "", forwards); err != nil {
			return "", err
		}
		return b.String(), nil
	}
	prefix, err := netip.ParsePrefix(port.CIDR)
	if err != nil {
		return "", fmt.Errorf("qemu: user net: port %s: bad CIDR %q: %v", port.ID, port.CIDR, err)
	}
	if !prefix.Addr().Is4() {
		return "", fmt.Errorf("qemu: user net: port %s: subnet %s is not IPv4 (user-mode networking is IPv4 only)", port.ID, port.CIDR)
	}
	prefix = prefix.Masked()
	if prefix.Bits() > 29 {
		return "", fmt.Errorf("qemu: user net: port %s: subnet %s is too small (slirp needs a gateway, a DNS address and the guest: /29 or larger)", port.ID, prefix)
	}
	ip, err := netip.ParseAddr(port.IP)
	if err != nil || !ip.Is4() {
		return "", fmt.Errorf("qemu: user net: port %s: bad IPv4 fixed IP %q", port.ID, port.IP)
	}
	if !usable(prefix, ip) {
		return "", fmt.Errorf("qemu: user net: port %s: fixed IP %s is not a usable address of %s", port.ID, ip, prefix)
	}
	taken := map[netip.Addr]bool{ip: true}
	var gw netip.Addr
	if port.Gateway != "" {
		gw, err = netip.ParseAddr(port.Gateway)
		if err != nil || !gw.Is4() {
			return "", fmt.Errorf("qemu: user net: port %s: bad IPv4 gateway %q", port.ID, port.Gateway)
		}
		if !usable(prefix, gw) {
			return "", fmt.Errorf("qemu: user net: port %s: gateway %s is not a usable address of %s", port.ID, gw, prefix)
		}
		if gw == ip {
			return "", fmt.Errorf("qemu: user net: port %s: gateway %s is the fixed IP", port.ID, gw)
		}
	} else {
		gw = firstFree(prefix, taken)
	}
	taken[gw] = true
	dns := pickDNS(prefix, port.DNS, taken)
	if !dns.IsValid() {
		return "", fmt.Errorf("qemu: user net: port %s: no free address in %s for slirp's DNS", port.ID, prefix)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "user,id=%s,net=%s,host=%s,dhcpstart=%s,dns=%s,ipv6=off,restrict=off", nicID, prefix, gw, ip, dns)
	if err := hostfwds(&b, listen, ip.String(), forwards); err != nil {
		return "", err
	}
	return b.String(), nil
}

// hostfwds appends the hostfwd options, sorted by guest port (guest ""
// is slirp's first DHCP address).
func hostfwds(b *strings.Builder, listen, guest string, forwards map[int]int) error {
	for _, g := range sortedKeys(forwards) {
		h := forwards[g]
		if g < 1 || g > 65535 || h < 1 || h > 65535 {
			return fmt.Errorf("qemu: user net: bad forward host port %d → guest port %d", h, g)
		}
		fmt.Fprintf(b, ",hostfwd=tcp:%s:%d-%s:%d", listen, h, guest, g)
	}
	return nil
}

// Access lists the forwarded SSH (guest port 22) and RDP (3389) ports,
// sorted by guest port; other forwards are not logins and are left out.
// Host is AccessHost, else ListenAddr when it is a specific address, else
// this host's name. User is left for the caller (the image's login).
func (u UserNet) Access(forwards map[int]int) []driver.Access {
	host := u.AccessHost
	if host == "" {
		if a, err := netip.ParseAddr(u.ListenAddr); err == nil && !a.IsUnspecified() {
			host = u.ListenAddr
		} else if h, err := os.Hostname(); err == nil {
			host = h
		}
	}
	var out []driver.Access
	for _, g := range sortedKeys(forwards) {
		var proto string
		switch g {
		case 22:
			proto = "ssh"
		case 3389:
			proto = "rdp"
		default:
			continue
		}
		out = append(out, driver.Access{Protocol: proto, Host: host, Port: forwards[g]})
	}
	return out
}

func sortedKeys(m map[int]int) []int {
	keys := make([]int, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Ints(keys)
	return keys
}

// isQEMUID reports whether s is a valid QEMU id (QemuOpts id_wellformed).
func isQEMUID(s string) bool {
	if s == "" {
		return false
	}
	for i, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z':
		case i > 0 && (r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.'):
		default:
			return false
		}
	}
	return true
}

// usable reports whether a is in p and neither its network nor its
// broadcast address.
func usable(p netip.Prefix, a netip.Addr) bool {
	return p.Contains(a) && a != p.Addr() && a != broadcast(p)
}

func broadcast(p netip.Prefix) netip.Addr {
	b := p.Addr().As4()
	v := binary.BigEndian.Uint32(b[:]) | (1<<(32-p.Bits()) - 1)
	binary.BigEndian.PutUint32(b[:], v)
	return netip.AddrFrom4(b)
}

// nth is the address n after p's network address.
func nth(p netip.Prefix, n uint32) netip.Addr {
	b := p.Addr().As4()
	binary.BigEndian.PutUint32(b[:], binary.BigEndian.Uint32(b[:])+n)
	return netip.AddrFrom4(b)
}

func firstFree(p netip.Prefix, taken map[netip.Addr]bool) netip.Addr {
	for a := p.Addr().Next(); usable(p, a); a = a.Next() {
		if !taken[a] {
			return a
		}
	}
	return netip.Addr{}
}

// pickDNS chooses slirp's DNS address (see Netdev).
func pickDNS(p netip.Prefix, nameservers []string, taken map[netip.Addr]bool) netip.Addr {
	free := func(a netip.Addr) bool { return a.IsValid() && usable(p, a) && !taken[a] }
	if len(nameservers) > 0 {
		if a, err := netip.ParseAddr(nameservers[0]); err == nil && free(a) {
			return a
		}
	}
	if a := nth(p, 3); free(a) {
		return a
	}
	if a := broadcast(p).Prev(); free(a) {
		return a
	}
	return firstFree(p, taken)
}
