package cloud

import (
	"context"
	"fmt"
	"net"
	"path/filepath"

	"nimbus/internal/blockexport"
	"nimbus/internal/rbd"
	"nimbus/internal/volume"
)

// VolumeOptions choose where block storage keeps the volumes' data.
type VolumeOptions struct {
	// Backend is "file" (the default): volumes are files in the data
	// directory, served to other hosts over NBD; or "rbd": volumes are
	// RBD images in a Ceph pool, which every host's QEMU opens itself.
	Backend string
	// RBD is how the rbd backend reaches Ceph.
	RBD RBDOptions
}

// RBDOptions are the rbd backend's Ceph settings, Cinder's rbd_* and
// backup_ceph_* options.
type RBDOptions struct {
	Conf    string // ceph.conf: the monitors (rbd_ceph_conf; default /etc/ceph/ceph.conf)
	Keyring string // the client's keyring (default /etc/ceph/ceph.client.<user>.keyring)
	User    string // the client's name without "client." (rbd_user; default cinder)
	// Pool holds the volumes (rbd_pool; default volumes), BackupPool the
	// backups (backup_ceph_pool; default backups).
	Pool, BackupPool string
}

// Volume backends.
const (
	VolumeBackendFile = "file"
	VolumeBackendRBD  = "rbd"
)

// volumeConfig is the volume service's config for cfg's backend, less
// the services it is given in Start, and the file backend's exporter.
func volumeConfig(cfg Config) (volume.Config, *blockexport.Exporter, error) {
	vcfg := volume.Config{DataDir: filepath.Join(cfg.DataDir, "volumes"), Log: cfg.Log.With("component", "volume")}
	switch cfg.Volumes.Backend {
	case "", VolumeBackendFile:
		exports, err := newVolumeExporter(cfg)
		if err != nil {
			return vcfg, nil, err
		}
		vcfg.Exporter = exports
		return vcfg, exports, nil
	case VolumeBackendRBD:
		o := cfg.Volumes.RBD.withDefaults()
		vols, err := rbd.New(rbd.Config{Conf: o.Conf, Keyring: o.Keyring, User: o.User, Pool: o.Pool})
		if err != nil {
			return vcfg, nil, fmt.Errorf("cloud: rbd volume backend: %w", err)
		}
		if vcfg.RBDBackups, err = vols.InPool(o.BackupPool); err != nil {
			return vcfg, nil, fmt.Errorf("cloud: rbd backup pool: %w", err)
		}
		vcfg.RBD = vols
		return vcfg, nil, nil
	}
	return vcfg, nil, fmt.Errorf("cloud: unknown volume backend %q (file or rbd)", cfg.Volumes.Backend)
}

func (o RBDOptions) withDefaults() RBDOptions {
	if o.Conf == "" {
		o.Conf = "/etc/ceph/ceph.conf"
	}
	if o.User == "" {
		o.User = "cinder"
	}
	if o.Keyring == "" {
		o.Keyring = "/etc/ceph/ceph.client." + o.User + ".keyring"
	}
	if o.Pool == "" {
		o.Pool = "volumes"
	}
	if o.BackupPool == "" {
		o.BackupPool = "backups"
	}
	return o
}

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
