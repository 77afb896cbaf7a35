package cloud

import (
	"context"
	"fmt"
	"net"
	"path/filepath"

	"nimbus/internal/blockexport"
)

// newVolumeExporter serves volume files to the hosts that are not the
// storage node's own, as NBD over TLS (internal/blockexport), on the
// address those hosts reach this machine at: the local host's address
// (serve's --host-ip), else the public host, when either is an IP
// address; else the listen address's loopback, which only this machine
// reaches.
func newVolumeExporter(cfg Config) (*blockexport.Exporter, error) {
	addr := loopback(cfg.Listen)
	for _, h := range []string{cfg.QEMU.IP, cfg.PublicHost} {
		if ip := net.ParseIP(h); ip != nil && !ip.IsUnspecified() {
			addr = h
			break
		}
	}
	x, err := blockexport.New(blockexport.Config{Dir: filepath.Join(cfg.DataDir, "exports"), Addr: addr,
		Log: cfg.Log.With("component", "blockexport")})
	if err != nil {
		return nil, fmt.Errorf("cloud: volume exports: %w", err)
	}
	return x, nil
}

// setLocalHosts tells the volume service which hosts are this machine's:
// the local agent's, whose servers open volume files directly. A
// controller without a local agent has none; every host gets exports.
func (c *Cloud) setLocalHosts(ctx context.Context) error {
	if c.localDriver == nil {
		return nil
	}
	hosts, err := c.localDriver.Hosts(ctx)
	if err != nil {
		return fmt.Errorf("cloud: the local agent's hosts: %w", err)
	}
	names := make([]string, 0, len(hosts))
	for _, h := range hosts {
		names = append(names, h.Name)
	}
	c.Volumes.SetLocalHosts(names)
	return nil
}
