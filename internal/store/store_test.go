package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"nimbus/internal/store"
	"nimbus/internal/store/storetest"
)

func TestRebind(t *testing.T) {
	tests := []struct{ in, want string }{
		{"SELECT 1", "SELECT 1"},
		{"SELECT * FROM t WHERE a = ? AND b = ?", "SELECT * FROM t WHERE a = $1 AND b = $2"},
		{"SELECT '?' FROM t WHERE a = ?", "SELECT '?' FROM t WHERE a = $1"},
	}
	for _, tt := range tests {
		if got := store.RebindFor(store.Postgres, tt.in); got != tt.want {
			t.Errorf("rebind(%q) = %q, want %q", tt.in, got, tt.want)
		}
		if got := store.RebindFor(store.SQLite, tt.in); got != tt.in {
			t.Errorf("sqlite rebind changed %q to %q", tt.in, got)
		}
	}
}

// TestTxAllOrNothing checks on both engines that a failed transaction leaves
// nothing behind, that a unique violation is ErrConflict, and that opening
// the database again does not re-run migrations.
func TestTxAllOrNothing(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, url string) {
		ctx := context.Background()
		db, err := store.Open(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		boom := errors.New("boom")
		err = db.Tx(ctx, func(tx *store.Tx) error {
			if _, err := tx.Exec(ctx, "INSERT INTO settings (name, value) VALUES (?, ?)", "a", "1"); err != nil {
				return err
			}
			return boom
		})
		if !errors.Is(err, boom) {
			t.Fatalf("Tx returned %v, want boom", err)
		}
		var n int
		if err := db.QueryRow(ctx, "SELECT COUNT(*) FROM settings WHERE name = ?", "a").Scan(&n); err != nil || n != 0 {
			t.Fatalf("rolled-back row visible: n=%d err=%v", n, err)
		}

		committed := false
		err = db.Tx(ctx, func(tx *store.Tx) error {
			tx.AfterCommit(func() { committed = true })
			_, err := tx.Exec(ctx, "INSERT INTO settings (name, value) VALUES (?, ?)", "b", "1")
			return err
		})
		if err != nil || !committed {
			t.Fatalf("commit: err=%v afterCommit ran=%v", err, committed)
		}
		err = db.Tx(ctx, func(tx *store.Tx) error {
			_, err := tx.Exec(ctx, "INSERT INTO settings (name, value) VALUES (?, ?)", "b", "2")
			return err
		})
		if !errors.Is(err, store.ErrConflict) {
			t.Fatalf("duplicate insert: %v, want ErrConflict", err)
		}
		db.Close()

		db2, err := store.Open(ctx, url)
		if err != nil {
			t.Fatalf("reopen: %v", err)
		}
		defer db2.Close()
		if err := db2.QueryRow(ctx, "SELECT COUNT(*) FROM settings").Scan(&n); err != nil || n != 1 {
			t.Fatalf("after reopen: n=%d err=%v", n, err)
		}
	})
}

// TestUnavailable: on a real PostgreSQL, a connection the server ends
// under a transaction (as a failover or a fast shutdown does: SQLSTATE
// 57P01) and a server that cannot be reached both come out as
// ErrUnavailable, and the pool serves again on a new connection.
func TestUnavailable(t *testing.T) {
	var url string
	for _, e := range storetest.Engines(t) {
		if e.Name == "postgres" {
			url = e.URL
		}
	}
	if url == "" {
		t.Skip("no PostgreSQL")
	}
	ctx := context.Background()
	db, err := store.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.Tx(ctx, func(tx *store.Tx) error {
		var pid int
		if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
			return err
		}
		if _, err := db.Exec(ctx, "SELECT pg_terminate_backend(?)", pid); err != nil {
			t.Fatalf("terminate: %v", err)
		}
		var one int
		return tx.QueryRow(ctx, "SELECT 1").Scan(&one)
	})
	if !errors.Is(err, store.ErrUnavailable) || !store.IsUnavailable(err) {
		t.Fatalf("query on a terminated connection: %v, want ErrUnavailable", err)
	}
	var one int
	if err := db.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
		t.Fatalf("after: %v", err)
	}

	_, err = store.Open(ctx, "postgres://nobody@127.0.0.1:1/none?connect_timeout=2")
	if !store.IsUnavailable(err) {
		t.Fatalf("open of an unreachable server: %v, want unavailable", err)
	}
}

// TestLockTimeout: on a real PostgreSQL, a transaction whose lock wait
// outlasts its LockTimeout fails with ErrBusy, leaving the holder be; on
// SQLite LockTimeout changes nothing.
func TestLockTimeout(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, url string) {
		ctx := context.Background()
		db, err := store.Open(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if db.Dialect() != store.Postgres {
			if err := db.Tx(ctx, func(tx *store.Tx) error { return tx.LockTimeout(ctx, time.Millisecond) }); err != nil {
				t.Fatalf("LockTimeout on %s: %v", db.Dialect(), err)
			}
			return
		}
		held, release := make(chan struct{}), make(chan struct{})
		done := make(chan error, 1)
		go func() {
			done <- db.Tx(ctx, func(tx *store.Tx) error {
				if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(4242)"); err != nil {
					return err
				}
				close(held)
				<-release
				return nil
			})
		}()
		<-held
		start := time.Now()
		err = db.Tx(ctx, func(tx *store.Tx) error {
			if err := tx.LockTimeout(ctx, 200*time.Millisecond); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(4242)")
			return err
		})
		waited := time.Since(start)
		close(release)
		if !errors.Is(err, store.ErrBusy) || !store.IsBusy(err) {
			t.Fatalf("a lock wait past LockTimeout: %v, want ErrBusy", err)
		}
		if waited > 5*time.Second {
			t.Errorf("gave up after %s", waited)
		}
		if err := <-done; err != nil {
			t.Fatalf("the holder: %v", err)
		}
	})
}
