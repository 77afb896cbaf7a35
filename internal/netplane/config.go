// Package netplane is a host's network data plane in bridged mode: it
// makes the Linux devices, nftables rules and namespaces that the
// controller's desired state (netstate.Host) describes, and removes what
// no entry of it explains. A tenant network is a bridge with a VXLAN
// device over the hosts' underlay; a server port is a tap on that bridge,
// filtered by its security groups; a DHCP namespace per network serves
// DHCP and the metadata proxy; a router is a namespace with NAT. Every
// device is made through netlink and every rule through nftables, in the
// host's network namespace (Config.NetNS), so that several simulated
// hosts fit on one machine.
package netplane

import (
	"context"
	"log/slog"

	"nimbus/internal/fleet/wire"
)

// Config is one host's data plane settings.
type Config struct {
	// NetNS is the path of the network namespace that is the host
	// (/run/netns/<name>, /proc/<pid>/ns/net); "" is the agent's own.
	NetNS string
	// Prefix starts the names of the namespaces this plane makes
	// (default "nimbus-"), so that simulated hosts on one machine do not
	// collide and each removes only its own.
	Prefix string
	// VTEP is the host's underlay IPv4 address (--host-ip), the local end
	// of its VXLAN tunnels.
	VTEP string
	// UnderlayMTU is the underlay's MTU (default: the MTU of the link that
	// holds VTEP).
	UnderlayMTU int
	// ProviderBridge is the host's bridge on the provider network, where
	// routers put their gateways; "" on a host that carries no routers.
	ProviderBridge string
	// Metadata answers guests' requests to 169.254.169.254; nil turns the
	// metadata proxy off.
	Metadata MetadataSource
	Log      *slog.Logger
}

// MetadataSource is the controller's metadata service as the agent
// reaches it.
type MetadataSource interface {
	Metadata(ctx context.Context, req wire.MetadataRequest) (wire.MetadataResponse, error)
}

// DefaultPrefix starts the names of a plane's namespaces.
const DefaultPrefix = "nimbus-"

func (c Config) prefix() string {
	if c.Prefix == "" {
		return DefaultPrefix
	}
	return c.Prefix
}
