package cloud

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"nimbus/internal/driver"
	"nimbus/internal/fleet"
	"nimbus/internal/netstate"
	"nimbus/internal/network"
	"nimbus/internal/store"
	"nimbus/internal/store/storetest"
)

// TestDataPlaneWakesOnlyChangedHosts: a poll waiting on h1 sleeps
// through a change on h2 that builds h1's state to the same content, wakes
// within a second of a change to h1's content, and is then answered from
// the state the shared build kept.
func TestDataPlaneWakesOnlyChangedHosts(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		db, err := store.Open(ctx, dbURL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		net := network.New(db)
		if err := net.Bootstrap(ctx); err != nil {
			t.Fatal(err)
		}
		d := newDataPlane(net, nil, nil)
		d.fleetHosts = func(context.Context) ([]driver.Host, error) {
			return []driver.Host{
				{Name: "h1", IP: "192.0.2.1", NetworkMode: "bridged", Up: true},
				{Name: "h2", IP: "192.0.2.2", NetworkMode: "bridged", Up: true},
			}, nil
		}
		// server puts a server of project with a port on its private
		// network on host.
		server := func(project, host string) {
			t.Helper()
			if err := net.EnsureDefaults(ctx, project); err != nil {
				t.Fatal(err)
			}
			priv, err := net.AutoNetwork(ctx, project)
			if err != nil {
				t.Fatal(err)
			}
			id := project + "-" + host + "-" + time.Now().Format("150405.000000000")
			err = db.Tx(ctx, func(tx *store.Tx) error {
				if _, err := tx.Exec(ctx, `INSERT INTO compute_servers (id, project_id, user_id, name, vm_state, host,
					flavor_id, reservation_id, hostname, created_at, updated_at, doc)
					VALUES (?, ?, 'u', 'vm', 'active', ?, '1', 'r', 'vm', '2026-01-01T00:00:00Z', '2026-01-01T00:00:00Z', '{}')`,
					id, project, host); err != nil {
					return err
				}
				_, err := net.CreateServerPort(ctx, tx, project, priv.ID, id, "", nil)
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		server("proj-a", "h1")
		held, err := d.HostState(ctx, "h1")
		if err != nil || len(held.Ports) != 1 {
			t.Fatalf("h1: %+v %v", held, err)
		}
		// The agent API's loop (fleet's handleNetState): wait, look again,
		// answer on new content. returns counts the waits that ended.
		woke := make(chan time.Time, 1)
		var returns atomic.Int32
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		go func() {
			st, sum := held, fleet.Digest(held)
			for wctx.Err() == nil {
				d.WaitHost(wctx, "h1", st)
				returns.Add(1)
				var err error
				if st, err = d.HostState(wctx, "h1"); err != nil {
					return
				}
				if fleet.Digest(st) != sum {
					woke <- time.Now()
					return
				}
			}
		}()
		time.Sleep(300 * time.Millisecond)
		before := returns.Load() // the first build made the DHCP port: one more look

		server("proj-b", "h2") // another project's network: nothing of it on h1
		select {
		case <-woke:
			t.Fatal("answered on a change that left h1's content as it was")
		case <-time.After(time.Second):
		}
		if n := returns.Load() - before; n != 0 {
			t.Errorf("the poll looked again %d times on a change not its host's", n)
		}
		changed := time.Now()
		server("proj-a", "h2") // a peer on h1's network
		var at time.Time
		select {
		case at = <-woke:
		case <-time.After(5 * time.Second):
			t.Fatal("not woken by a change to h1's content")
		}
		if d := at.Sub(changed); d > time.Second {
			t.Errorf("woken %v after the change", d)
		}
		st, err := d.HostState(ctx, "h1")
		if err != nil || st.Revision <= held.Revision || len(st.Networks) != 1 || len(st.Networks[0].Peers) != 1 {
			t.Fatalf("h1 after the change: %+v %v", st, err)
		}
		d.mu.Lock()
		kept := d.built["h1"].st
		d.mu.Unlock()
		if kept.Revision != st.Revision {
			t.Errorf("answered revision %d, kept %d: not the shared build's state", st.Revision, kept.Revision)
		}
		st.Revision = 0 // the caller's copy
		if kept.Revision == 0 {
			t.Error("a caller changed the kept state")
		}
		var _ *netstate.Host = st
	})
}
