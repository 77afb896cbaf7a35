package store_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
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

// TestWritersInLine: writers that find another's transaction open wait
// their turn and all commit once it ends; a writer whose context ends
// while it waits gives up with that context's error, writing nothing; a
// transaction that panics, and one whose AfterCommit writes again, leave
// the next writer free to go (on SQLite a turn kept by mistake would hold
// every later write for writeWait and fail it).
func TestWritersInLine(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, url string) {
		ctx := context.Background()
		db, err := store.Open(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		set := func(ctx context.Context, tx *store.Tx, name string) error {
			_, err := tx.Exec(ctx, "INSERT INTO settings (name, value) VALUES (?, '1')", name)
			return err
		}
		held, release := make(chan struct{}), make(chan struct{})
		holder := make(chan error, 1)
		go func() {
			holder <- db.Tx(ctx, func(tx *store.Tx) error {
				if err := set(ctx, tx, "holder"); err != nil {
					return err
				}
				close(held)
				<-release
				return nil
			})
		}()
		<-held

		if db.Dialect() == store.SQLite {
			short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			err := db.Tx(short, func(tx *store.Tx) error { return set(short, tx, "impatient") })
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("a writer whose context ended in line: %v, want its context's error", err)
			}
		}

		const writers = 8
		errs := make(chan error, writers)
		for i := range writers {
			go func() {
				errs <- db.Tx(ctx, func(tx *store.Tx) error {
					tx.AfterCommit(func() {
						if _, err := db.Exec(ctx, "UPDATE settings SET value = '2' WHERE name = ?", fmt.Sprint("w", i)); err != nil {
							t.Errorf("a write after commit: %v", err)
						}
					})
					return set(ctx, tx, fmt.Sprint("w", i))
				})
			}()
		}
		time.Sleep(50 * time.Millisecond)
		close(release)
		if err := <-holder; err != nil {
			t.Fatalf("the holder: %v", err)
		}
		for range writers {
			if err := <-errs; err != nil {
				t.Fatalf("a writer in line: %v", err)
			}
		}

		func() {
			defer func() { recover() }()
			db.Tx(ctx, func(tx *store.Tx) error { panic("boom") })
		}()
		start := time.Now()
		if err := db.Tx(ctx, func(tx *store.Tx) error { return set(ctx, tx, "after-panic") }); err != nil {
			t.Fatalf("a write after a panicking transaction: %v", err)
		}
		if waited := time.Since(start); waited > 5*time.Second {
			t.Errorf("a write after a panicking transaction waited %s", waited)
		}

		var n, two int
		if err := db.QueryRow(ctx, "SELECT COUNT(*), COALESCE(SUM(CASE WHEN value = '2' THEN 1 ELSE 0 END), 0) FROM settings WHERE name LIKE 'w%' OR name IN ('holder', 'impatient', 'after-panic')").Scan(&n, &two); err != nil {
			t.Fatal(err)
		}
		if n != writers+2 || two != writers {
			t.Errorf("%d rows (%d updated after commit), want %d (%d)", n, two, writers+2, writers)
		}
	})
}

// BenchmarkConcurrentWrites: small write transactions from many
// goroutines at once, as a create's requests and its reconcile steps make.
func BenchmarkConcurrentWrites(b *testing.B) {
	for _, e := range storetest.Engines(b) {
		b.Run(e.Name, func(b *testing.B) { benchWrites(b, e.URL) })
	}
}

func benchWrites(b *testing.B, url string) {
	ctx := context.Background()
	db, err := store.Open(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	// b.N grows over calls on the same database: each call its own names.
	run := time.Now().UnixNano()
	var seq atomic.Int64
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			name := fmt.Sprint("bench-", run, "-", seq.Add(1))
			if err := db.Tx(ctx, func(tx *store.Tx) error {
				var n int
				if err := tx.QueryRow(ctx, "SELECT COUNT(*) FROM settings WHERE name = ?", name).Scan(&n); err != nil {
					return err
				}
				_, err := tx.Exec(ctx, "INSERT INTO settings (name, value) VALUES (?, '1')", name)
				return err
			}); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
