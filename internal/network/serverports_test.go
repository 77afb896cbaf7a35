package network_test

import (
	"context"
	"errors"
	"testing"

	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/floatingips"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"

	"nimbus/internal/network"
	"nimbus/internal/store"
	"nimbus/internal/testenv"
)

// TestReleasePort takes single ports away from a server, as a NIC detach
// does: the user's port is unbound and loses its floating IP, the port
// made for the server is deleted, and a port of another server is not
// touched.
func TestReleasePort(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		ctx := context.Background()
		svc := e.c.Networks
		const server, other = "5a1d7c3e-0000-4000-8000-000000000001", "5a1d7c3e-0000-4000-8000-000000000002"
		nets := func(name string) string {
			pages, err := networks.List(e.demo, networks.ListOpts{Name: name}).AllPages(ctx)
			if err != nil {
				t.Fatal(err)
			}
			l, err := networks.ExtractNetworks(pages)
			if err != nil || len(l) != 1 {
				t.Fatalf("network %s: %v %v", name, l, err)
			}
			return l[0].ID
		}
		private, public := nets("private"), nets("public")
		priv, err := networks.Get(ctx, e.demo, private).Extract()
		if err != nil {
			t.Fatal(err)
		}
		e.routeToPublic(t, priv.Subnets[0])
		own, err := ports.Create(ctx, e.demo, ports.CreateOpts{NetworkID: private}).Extract()
		if err != nil {
			t.Fatal(err)
		}
		fip, err := floatingips.Create(ctx, e.demo, floatingips.CreateOpts{FloatingNetworkID: public, PortID: own.ID}).Extract()
		if err != nil {
			t.Fatal(err)
		}
		var made *network.Port
		err = e.c.DB.Tx(ctx, func(tx *store.Tx) error {
			if err := svc.BindPort(ctx, tx, e.demoProject, own.ID, server); err != nil {
				return err
			}
			made, err = svc.CreateServerPort(ctx, tx, e.demoProject, private, server, "", nil)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		ref := network.ServerRef{ID: server, ProjectID: e.demoProject}
		ifs, err := svc.ServerInterfaces(ctx, ref)
		if err != nil || len(ifs) != 2 || ifs[0].PortID != own.ID || ifs[1].PortID != made.ID ||
			ifs[0].Status != "ACTIVE" || ifs[0].MAC != own.MACAddress || len(ifs[1].FixedIPs) != 1 {
			t.Fatalf("interfaces %+v %v", ifs, err)
		}
		if l, _ := svc.ServerInterfaces(ctx, network.ServerRef{ID: server, ProjectID: e.adminProject}); len(l) != 0 {
			t.Errorf("another project sees the server's interfaces: %+v", l)
		}

		release := func(serverID, portID string) error {
			return e.c.DB.Tx(ctx, func(tx *store.Tx) error { return svc.ReleasePort(ctx, tx, serverID, portID) })
		}
		if err := release(other, own.ID); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("release from another server: %v", err)
		}
		if err := release(server, own.ID); err != nil {
			t.Fatal(err)
		}
		p, err := ports.Get(ctx, e.demo, own.ID).Extract()
		if err != nil || p.DeviceID != "" || p.DeviceOwner != "" || p.Status != "DOWN" {
			t.Errorf("released user port %+v %v", p, err)
		}
		if f, err := floatingips.Get(ctx, e.demo, fip.ID).Extract(); err != nil || f.PortID != "" {
			t.Errorf("floating IP after release %+v %v", f, err)
		}
		if err := release(server, made.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := ports.Get(ctx, e.demo, made.ID).Extract(); err == nil {
			t.Error("the port made for the server outlived its release")
		}
		if l, err := svc.ServerInterfaces(ctx, ref); err != nil || len(l) != 0 {
			t.Errorf("interfaces after release %+v %v", l, err)
		}
	})
}
