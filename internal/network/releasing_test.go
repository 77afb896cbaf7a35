package network_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"

	"nimbus/internal/cloud"
	"nimbus/internal/network"
	"nimbus/internal/store"
	"nimbus/internal/testenv"
)

// TestDeleteAfterServerDelete: a security group, subnet or network that
// only the ports of servers being deleted hold is deleted once compute
// releases them, not refused with a 409 for the race; a port that stays
// (not released, or a user's port kept) still is.
func TestDeleteAfterServerDelete(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		ctx := context.Background()
		svc := e.c.Networks
		defer network.SetReleasingWait(2 * time.Second)()

		// The rule, on the network service alone: a port of a server
		// whose delete was accepted.
		_, nw := e.do(t, "POST", "/v2.0/networks", e.demoTok, `{"network":{"name":"rel"}}`)
		netID := nw["network"].(map[string]any)["id"].(string)
		st, sub := e.do(t, "POST", "/v2.0/subnets", e.demoTok, fmt.Sprintf(`{"subnet":{"network_id":%q,"cidr":"10.77.0.0/24","ip_version":4}}`, netID))
		if st != 201 {
			t.Fatalf("subnet: %d %v", st, sub)
		}
		subID := sub["subnet"].(map[string]any)["id"].(string)
		_, sg := e.do(t, "POST", "/v2.0/security-groups", e.demoTok, `{"security_group":{"name":"rel"}}`)
		sgID := sg["security_group"].(map[string]any)["id"].(string)
		const server = "5a1d7c3e-0000-4000-8000-00000000e1e7"
		tx := func(f func(tx *store.Tx) error) {
			t.Helper()
			if err := e.c.DB.Tx(ctx, f); err != nil {
				t.Fatal(err)
			}
		}
		tx(func(tx *store.Tx) error {
			_, err := svc.CreateServerPort(ctx, tx, e.demoProject, netID, server, "", []string{sgID})
			return err
		})
		for _, p := range []string{"/v2.0/security-groups/" + sgID, "/v2.0/subnets/" + subID, "/v2.0/networks/" + netID} {
			if st, _ := e.do(t, "DELETE", p, e.demoTok, ""); st != http.StatusConflict {
				t.Fatalf("DELETE %s with a bound port: %d, want 409", p, st)
			}
		}
		tx(func(tx *store.Tx) error { return svc.ServerDeleting(ctx, tx, server) })
		start := time.Now()
		if st, _ := e.do(t, "DELETE", "/v2.0/security-groups/"+sgID, e.demoTok, ""); st != http.StatusConflict || time.Since(start) < 2*time.Second {
			t.Fatalf("DELETE of a group a never-released port holds: %d after %s, want 409 after the wait", st, time.Since(start))
		}
		go func() {
			time.Sleep(300 * time.Millisecond)
			if err := e.c.DB.Tx(ctx, func(tx *store.Tx) error { return svc.ReleaseServer(ctx, tx, server) }); err != nil {
				t.Error(err)
			}
		}()
		start = time.Now()
		for _, p := range []string{"/v2.0/security-groups/" + sgID, "/v2.0/subnets/" + subID, "/v2.0/networks/" + netID} {
			if st, body := e.do(t, "DELETE", p, e.demoTok, ""); st != http.StatusNoContent {
				t.Fatalf("DELETE %s once its port is released: %d %v", p, st, body)
			}
		}
		if d := time.Since(start); d < 300*time.Millisecond {
			t.Errorf("deleted in %s, before the port was released", d)
		}

		// The journey: a customer deletes a server and at once the
		// security group it used.
		_, sg = e.do(t, "POST", "/v2.0/security-groups", e.demoTok, `{"security_group":{"name":"journey"}}`)
		sgID = sg["security_group"].(map[string]any)["id"].(string)
		comp := testenv.Compute(t, testenv.Provider(t, e.c, cloud.DemoUser), "2.79")
		t.Cleanup(comp.ProviderClient.HTTPClient.CloseIdleConnections)
		var imageID string
		if err := e.c.DB.QueryRow(ctx, "SELECT id FROM images WHERE name = ?", "Debian 12").Scan(&imageID); err != nil {
			t.Fatal(err)
		}
		sv, err := servers.Create(ctx, comp, servers.CreateOpts{Name: "rel", ImageRef: imageID, FlavorRef: "2",
			Networks: "auto", SecurityGroups: []string{"journey"}}, nil).Extract()
		if err != nil {
			t.Fatal(err)
		}
		testenv.Eventually(t, 30*time.Second, "server ACTIVE", func() bool {
			s, err := servers.Get(ctx, comp, sv.ID).Extract()
			return err == nil && s.Status == "ACTIVE"
		})
		if err := servers.Delete(ctx, comp, sv.ID).ExtractErr(); err != nil {
			t.Fatal(err)
		}
		if st, body := e.do(t, "DELETE", "/v2.0/security-groups/"+sgID, e.demoTok, ""); st != http.StatusNoContent {
			t.Fatalf("DELETE of the deleted server's group: %d %v", st, body)
		}
	})
}
