// Package netstate is the wire form of one host's network data plane: what
// the controller wants wired there — the host's ports and their networks,
// the security groups that filter them, and, on a gateway host, the
// routers with their floating IPs. The network service builds it from the
// store (internal/network), the agent's data plane applies it
// (internal/netplane); a host's whole state travels at once, so that an
// agent that lost every device (a reboot) rebuilds from one answer and
// removes whatever no entry explains.
package netstate

import (
	"fmt"
	"net"
	"net/netip"
)

// Host is the desired network state of one hypervisor host.
type Host struct {
	Host string `json:"host"`
	// Revision rises with every change to the controller's network state;
	// an agent long-polls for a revision above the one it applied.
	Revision int64 `json:"revision"`
	// VTEP is this host's underlay address, the local end of its VXLAN
	// tunnels (the agent's --host-ip).
	VTEP string `json:"vtep"`

	Networks       []Network       `json:"networks"`
	Ports          []Port          `json:"ports"`
	SecurityGroups []SecurityGroup `json:"security_groups"`
	// Routers are those placed on this host (a gateway host: one whose
	// agent reaches the provider network).
	Routers []Router `json:"routers"`
}

// Network is a tenant network present on the host: it has ports here, or
// a router here has an interface on it.
type Network struct {
	ID        string `json:"id"`
	ProjectID string `json:"project_id"`
	// VNI is the network's VXLAN segment (Neutron's segmentation_id).
	VNI uint32 `json:"vni"`
	// MTU is the network's MTU, the underlay's less the VXLAN overhead;
	// guests learn it by DHCP.
	MTU     int      `json:"mtu"`
	Subnets []Subnet `json:"subnets"`
	// DHCP is this host's DHCP and metadata endpoint on the network, nil
	// when no subnet has DHCP on.
	DHCP *DHCPPort `json:"dhcp,omitempty"`
	// Peers are the other hosts that have the network (ports or a router):
	// the only hosts its broadcasts are sent to (l2population).
	Peers []Peer `json:"peers"`
}

// Subnet is an IPv4 or IPv6 subnet of a network.
type Subnet struct {
	ID         string   `json:"id"`
	CIDR       string   `json:"cidr"`
	Gateway    string   `json:"gateway_ip,omitempty"` // "" when the subnet has none
	DNS        []string `json:"dns_nameservers,omitempty"`
	Routes     []Route  `json:"host_routes,omitempty"`
	EnableDHCP bool     `json:"enable_dhcp"`
}

// Route is a destination prefix and the address it goes through.
type Route struct {
	Destination string `json:"destination"`
	NextHop     string `json:"nexthop"`
}

// DHCPPort is the address a host's DHCP server and metadata proxy use on a
// network: one IP per DHCP-enabled subnet, and a MAC of its own.
type DHCPPort struct {
	MAC string    `json:"mac_address"`
	IPs []FixedIP `json:"fixed_ips"`
}

// Peer is another host on a network: where its VXLAN tunnel ends and which
// MACs live behind it.
type Peer struct {
	Host string   `json:"host"`
	VTEP string   `json:"vtep"`
	MACs []string `json:"macs"`
}

// FixedIP is one address of a port on one subnet.
type FixedIP struct {
	SubnetID string `json:"subnet_id"`
	IP       string `json:"ip_address"`
}

// AddressPair is an extra address a port may send from
// (allowed_address_pairs): an IP or a CIDR, and a MAC ("" for the port's
// own).
type AddressPair struct {
	IP  string `json:"ip_address"`
	MAC string `json:"mac_address,omitempty"`
}

// Port is one server NIC on the host.
type Port struct {
	ID        string    `json:"id"`
	NetworkID string    `json:"network_id"`
	ServerID  string    `json:"device_id"`
	Hostname  string    `json:"hostname,omitempty"` // told by DHCP
	MAC       string    `json:"mac_address"`
	IPs       []FixedIP `json:"fixed_ips"`
	AdminUp   bool      `json:"admin_state_up"`
	// PortSecurity off lifts anti-spoofing and the security groups.
	PortSecurity   bool          `json:"port_security_enabled"`
	SecurityGroups []string      `json:"security_groups"`
	AllowedPairs   []AddressPair `json:"allowed_address_pairs,omitempty"`
}

// SecurityGroup is a group some port on the host is in, or one that a
// rule of such a group names as its remote group.
type SecurityGroup struct {
	ID       string `json:"id"`
	Stateful bool   `json:"stateful"`
	Rules    []Rule `json:"rules"`
	// Members are the fixed IPs (and allowed address pairs) of every
	// port in the group on any host: what remote_group_id matches.
	Members []string `json:"members"`
}

// Rule is one security group rule, as Neutron stores it.
type Rule struct {
	ID        string `json:"id"`
	Direction string `json:"direction"` // "ingress" or "egress"
	Ethertype string `json:"ethertype"` // "IPv4" or "IPv6"
	// Protocol is "" for any, a name (tcp, udp, icmp, ipv6-icmp, …) or
	// an IP protocol number.
	Protocol string `json:"protocol,omitempty"`
	// PortMin and PortMax are the port range for tcp/udp/sctp (0: any),
	// or ICMP type and code (-1 or 0 and unset: any).
	PortMin        *int   `json:"port_range_min,omitempty"`
	PortMax        *int   `json:"port_range_max,omitempty"`
	RemoteIPPrefix string `json:"remote_ip_prefix,omitempty"`
	RemoteGroupID  string `json:"remote_group_id,omitempty"`
}

// Router is a router placed on this host: a network namespace with its
// gateway on the provider network and an interface on each attached
// subnet.
type Router struct {
	ID        string `json:"id"`
	ProjectID string `json:"project_id"`
	// Gateway is nil for a router without an external gateway.
	Gateway    *Gateway          `json:"gateway,omitempty"`
	Interfaces []RouterInterface `json:"interfaces"`
	// Routes are the router's extra routes.
	Routes      []Route      `json:"routes,omitempty"`
	FloatingIPs []FloatingIP `json:"floating_ips,omitempty"`
}

// Gateway is a router's port on the provider network.
type Gateway struct {
	MAC string `json:"mac_address"`
	// IP is the router's address on the provider network, CIDR the
	// provider subnet (e.g. 203.0.113.0/24), NextHop the provider's own
	// gateway.
	IP         string `json:"ip_address"`
	CIDR       string `json:"cidr"`
	NextHop    string `json:"nexthop,omitempty"`
	EnableSNAT bool   `json:"enable_snat"`
}

// RouterInterface is a router's port on a tenant subnet.
type RouterInterface struct {
	PortID    string `json:"port_id"`
	NetworkID string `json:"network_id"`
	SubnetID  string `json:"subnet_id"`
	MAC       string `json:"mac_address"`
	IP        string `json:"ip_address"`
	CIDR      string `json:"cidr"`
}

// FloatingIP is 1:1 NAT between a public address and a fixed IP behind the
// router.
type FloatingIP struct {
	ID      string `json:"id"`
	Address string `json:"floating_ip_address"`
	FixedIP string `json:"fixed_ip_address"`
	PortID  string `json:"port_id"`
}

// Overhead is what VXLAN over IPv4 adds to a frame (outer IPv4 20, UDP 8,
// VXLAN 8, inner Ethernet 14): a tenant network's MTU is the underlay's
// less this.
const Overhead = 50

// Device names. Linux allows 15 bytes; Neutron's own scheme ("tap" and
// the first 11 characters of the port id) keeps them unique in practice
// and lets an operator find a port's device by its id.
const (
	TapPrefix    = "tap" // a server port's tap device
	BridgePrefix = "nbr" // a network's bridge
	VXLANPrefix  = "nvx" // a network's VXLAN device
	DHCPPrefix   = "ndh" // the host end of a DHCP namespace's veth
	RouterPrefix = "nrt" // the host end of a router interface's veth
	// Namespaces have no length limit but follow the same scheme.
	DHCPNamespacePrefix   = "nimbus-dhcp-"
	RouterNamespacePrefix = "nimbus-router-"
)

// TapName is the tap device of port id, the name QEMU opens.
func TapName(portID string) string { return TapPrefix + ShortID(portID) }

// BridgeName is network id's bridge on a host.
func BridgeName(networkID string) string { return BridgePrefix + ShortID(networkID) }

// VXLANName is the VXLAN device of segment vni.
func VXLANName(vni uint32) string { return fmt.Sprintf("%s%d", VXLANPrefix, vni) }

// ShortID is the part of an id that device and namespace names carry.
func ShortID(id string) string { return id[:min(len(id), 11)] }

// MaxVNI is the largest VXLAN network identifier (24 bits).
const MaxVNI = 1<<24 - 1

// Validate refuses a state that no controller makes: an agent checks it
// before it touches a device.
func (h *Host) Validate() error {
	nets := map[string]bool{}
	vnis := map[uint32]bool{}
	for _, n := range h.Networks {
		if n.ID == "" || nets[n.ID] {
			return fmt.Errorf("netstate: network %q missing or repeated", n.ID)
		}
		if n.VNI == 0 || n.VNI > MaxVNI || vnis[n.VNI] {
			return fmt.Errorf("netstate: network %s: VNI %d out of range or repeated", n.ID, n.VNI)
		}
		nets[n.ID], vnis[n.VNI] = true, true
		if n.MTU < 576 || n.MTU > 9000 {
			return fmt.Errorf("netstate: network %s: MTU %d out of range", n.ID, n.MTU)
		}
		for _, s := range n.Subnets {
			if _, err := netip.ParsePrefix(s.CIDR); err != nil {
				return fmt.Errorf("netstate: subnet %s: %v", s.ID, err)
			}
		}
		for _, p := range n.Peers {
			if _, err := netip.ParseAddr(p.VTEP); err != nil {
				return fmt.Errorf("netstate: network %s: peer %s: %v", n.ID, p.Host, err)
			}
		}
	}
	for _, p := range h.Ports {
		if !nets[p.NetworkID] {
			return fmt.Errorf("netstate: port %s: network %s not in the state", p.ID, p.NetworkID)
		}
		if hw, err := net.ParseMAC(p.MAC); err != nil || len(hw) != 6 {
			return fmt.Errorf("netstate: port %s: bad MAC %q", p.ID, p.MAC)
		}
		for _, ip := range p.IPs {
			if _, err := netip.ParseAddr(ip.IP); err != nil {
				return fmt.Errorf("netstate: port %s: %v", p.ID, err)
			}
		}
	}
	return nil
}
