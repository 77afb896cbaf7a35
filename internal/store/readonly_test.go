package store_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"nimbus/internal/store"
	"nimbus/internal/store/storetest"
)

// TestOpenReadOnly: a read-only handle reads, refuses every write on both
// engines, runs no migration, and says whether the schema is this
// binary's.
func TestOpenReadOnly(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, url string) {
		ctx := context.Background()
		db, err := store.Open(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		if _, err := db.Exec(ctx, "INSERT INTO billing_state (name, value) VALUES ('x', '1')"); err != nil {
			t.Fatal(err)
		}
		ro, err := store.OpenReadOnly(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer ro.Close()
		var v string
		if err := ro.QueryRow(ctx, "SELECT value FROM billing_state WHERE name = 'x'").Scan(&v); err != nil || v != "1" {
			t.Fatalf("read: %q %v", v, err)
		}
		if err := ro.SchemaCurrent(ctx); err != nil {
			t.Fatalf("a freshly migrated database: %v", err)
		}
		for _, q := range []string{"INSERT INTO billing_state (name, value) VALUES ('y', '2')",
			"UPDATE billing_state SET value = '3'", "DELETE FROM billing_state", "CREATE TABLE t (a INTEGER)"} {
			if _, err := ro.Exec(ctx, q); err == nil {
				t.Errorf("read-only handle ran %q", q)
			}
		}
		if err := ro.ReadTx(ctx, func(tx *store.Tx) error {
			_, err := tx.Exec(ctx, "UPDATE billing_state SET value = '4'")
			return err
		}); err == nil {
			t.Error("a write inside ReadTx went through")
		}
		if err := db.QueryRow(ctx, "SELECT value FROM billing_state WHERE name = 'x'").Scan(&v); err != nil || v != "1" {
			t.Fatalf("after refused writes: %q %v", v, err)
		}

		if _, err := db.Exec(ctx, "DELETE FROM schema_migrations WHERE name = '0065_compute_project_flavors'"); err != nil {
			t.Fatal(err)
		}
		if err := ro.SchemaCurrent(ctx); !errors.Is(err, store.ErrSchema) || !strings.Contains(err.Error(), "lacks migration 0065") {
			t.Errorf("a database behind: %v", err)
		}
		if _, err := db.Exec(ctx, "INSERT INTO schema_migrations (name, applied_at) VALUES ('0065_compute_project_flavors', 'x'), ('9999_future', 'x')"); err != nil {
			t.Fatal(err)
		}
		if err := ro.SchemaCurrent(ctx); !errors.Is(err, store.ErrSchema) || !strings.Contains(err.Error(), "9999_future") {
			t.Errorf("a database ahead: %v", err)
		}
	})
}

// TestReadTxSnapshot: what a ReadTx reads twice is the same while another
// connection commits in between, on both engines.
func TestReadTxSnapshot(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, url string) {
		ctx := context.Background()
		db, err := store.Open(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		ro, err := store.OpenReadOnly(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer ro.Close()
		count := func(q store.Querier) int {
			var n int
			if err := q.QueryRow(ctx, "SELECT COUNT(*) FROM billing_state").Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
		err = ro.ReadTx(ctx, func(tx *store.Tx) error {
			before := count(tx)
			if _, err := db.Exec(ctx, "INSERT INTO billing_state (name, value) VALUES ('during', '1')"); err != nil {
				return err
			}
			if after := count(tx); after != before {
				return fmt.Errorf("the snapshot moved: %d rows, then %d", before, after)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if n := count(ro); n != 1 {
			t.Fatalf("after the snapshot: %d rows, want the one inserted", n)
		}
	})
}

// TestBackupWhileWriting: Backup copies an SQLite database that
// another handle keeps writing; the copy opens, passes its check and
// holds a prefix of the writes (each a whole transaction).
func TestBackupWhileWriting(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	url := filepath.Join(dir, "nimbus.db")
	db, err := store.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	var written atomic.Int64
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			// Two rows per transaction: the copy must hold both or neither.
			err := db.Tx(ctx, func(tx *store.Tx) error {
				for _, k := range []string{"a", "b"} {
					if _, err := tx.Exec(ctx, "INSERT INTO billing_state (name, value) VALUES (?, 'v')", fmt.Sprintf("%s%06d", k, i)); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				t.Error(err)
				return
			}
			written.Store(int64(i + 1))
		}
	}()
	for deadline := time.Now().Add(10 * time.Second); written.Load() < 50; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the writer wrote fewer than 50 transactions in 10 s")
		}
	}
	copyPath := filepath.Join(dir, "copy.db")
	err = store.Backup(ctx, url, copyPath)
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Backup(ctx, url, copyPath); err == nil || !strings.Contains(err.Error(), "exists already") {
		t.Fatalf("a second backup over the first: %v", err)
	}
	cp, err := store.Open(ctx, copyPath)
	if err != nil {
		t.Fatal(err)
	}
	defer cp.Close()
	var a, b int
	if err := cp.QueryRow(ctx, "SELECT COUNT(*) FROM billing_state WHERE name LIKE 'a%'").Scan(&a); err != nil {
		t.Fatal(err)
	}
	if err := cp.QueryRow(ctx, "SELECT COUNT(*) FROM billing_state WHERE name LIKE 'b%'").Scan(&b); err != nil {
		t.Fatal(err)
	}
	if n := written.Load(); a != b || a < 50 || int64(a) > n {
		t.Fatalf("the copy holds %d a-rows and %d b-rows of %d transactions", a, b, n)
	}

	pg := "postgres://postgres@127.0.0.1:5432/none?sslmode=disable" // refused before any connection
	if err := store.Backup(ctx, pg, filepath.Join(dir, "pg.db")); err == nil || !strings.Contains(err.Error(), "pg_basebackup") {
		t.Fatalf("backup of PostgreSQL: %v", err)
	}
}
