package network_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"nimbus/internal/network"
	"nimbus/internal/testenv"
)

// TestPublicSubnetFollowsProvider: a cloud started again with another
// provider network moves the public subnet there, but not while a public
// address outside the new range is in use.
func TestPublicSubnetFollowsProvider(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		e := newEnv(t, dbURL)
		pub := networkByName(t, e.admin, network.PublicNetwork)
		code, body := e.do(t, http.MethodPost, "/v2.0/floatingips", e.demoTok, `{"floatingip": {"floating_network_id": "`+pub.ID+`"}}`)
		if code != http.StatusCreated {
			t.Fatalf("floating IP: %d %v", code, body)
		}
		fip := body["floatingip"].(map[string]any)["id"].(string)
		moved := network.Provider{CIDR: "198.51.100.0/24", Gateway: "198.51.100.1", Pools: []string{"198.51.100.50-198.51.100.60"}}
		e.c.Networks.SetProvider(moved)
		if err := e.c.Networks.Bootstrap(ctx); err == nil || !strings.Contains(err.Error(), "in use outside") {
			t.Fatalf("moved with a floating IP in use: %v", err)
		}
		if code, body := e.do(t, http.MethodDelete, "/v2.0/floatingips/"+fip, e.demoTok, ""); code != http.StatusNoContent {
			t.Fatalf("delete floating IP: %d %v", code, body)
		}
		if err := e.c.Networks.Bootstrap(ctx); err != nil {
			t.Fatal(err)
		}
		var cidr, gw, pools string
		if err := e.c.DB.QueryRow(ctx, "SELECT cidr, gateway_ip, allocation_pools FROM subnets WHERE name = 'public-subnet'").Scan(&cidr, &gw, &pools); err != nil {
			t.Fatal(err)
		}
		if cidr != moved.CIDR || gw != moved.Gateway || !strings.Contains(pools, `"198.51.100.50"`) {
			t.Fatalf("public subnet is %s gw %s pools %s, want %+v", cidr, gw, pools, moved)
		}
		// The next floating IP comes from the new pool.
		code, body = e.do(t, http.MethodPost, "/v2.0/floatingips", e.demoTok, `{"floatingip": {"floating_network_id": "`+pub.ID+`"}}`)
		if code != http.StatusCreated || !strings.HasPrefix(body["floatingip"].(map[string]any)["floating_ip_address"].(string), "198.51.100.") {
			t.Fatalf("floating IP after the move: %d %v", code, body)
		}
	})
}
