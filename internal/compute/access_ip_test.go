package compute_test

import (
	"context"
	"testing"

	"nimbus/internal/testenv"
)

// TestAccessIPShowsPublicAddress: a server with a public address shows it
// as Nova's accessIPv4, so that `openstack server show` says where it is
// reached, unless its owner set accessIPv4 themselves.
func TestAccessIPShowsPublicAddress(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		e.flavorID = "d1.2g.local.ipv4"
		for _, tc := range []struct {
			name, extra string
			own         bool
		}{
			{"public address", "", false},
			{"the owner's own", `,"accessIPv4":"192.0.2.7"`, true},
		} {
			sv := e.wait(e.create(e.demo, "2.96", tc.extra), e.demo, "ACTIVE")
			var floating string
			for _, addrs := range sv["addresses"].(map[string]any) {
				for _, a := range addrs.([]any) {
					if am := a.(map[string]any); am["OS-EXT-IPS:type"] == "floating" {
						floating = am["addr"].(string)
					}
				}
			}
			want := floating
			if tc.own {
				want = "192.0.2.7"
			}
			if floating == "" || sv["accessIPv4"] != want {
				t.Errorf("%s: accessIPv4 %v, floating %q; want %q", tc.name, sv["accessIPv4"], floating, want)
			}
		}
		// Both public addresses are NATed by one router Nimbus made for
		// the project: its gateway on public, an interface on private.
		var routers, onPrivate int
		if err := e.c.DB.QueryRow(context.Background(), `SELECT COUNT(*) FROM routers r JOIN networks n ON n.id = r.gw_network_id
			WHERE r.name = 'public-router' AND n.builtin = 'public'`).Scan(&routers); err != nil {
			t.Fatal(err)
		}
		if err := e.c.DB.QueryRow(context.Background(), `SELECT COUNT(*) FROM ports p JOIN routers r ON r.id = p.bound_device
			JOIN networks n ON n.id = p.network_id WHERE p.bound_by = 'router' AND p.device_owner = 'network:router_interface'
			AND n.name = 'private' AND r.name = 'public-router'`).Scan(&onPrivate); err != nil {
			t.Fatal(err)
		}
		if routers != 1 || onPrivate != 1 {
			t.Errorf("public-router: %d with a gateway on public, %d interfaces on private; want 1 and 1", routers, onPrivate)
		}
		e.flavorID = "2"
		if sv := e.wait(e.create(e.demo, "2.96", ""), e.demo, "ACTIVE"); sv["accessIPv4"] != "" {
			t.Errorf("a server without a public address shows accessIPv4 %v", sv["accessIPv4"])
		}
	})
}
