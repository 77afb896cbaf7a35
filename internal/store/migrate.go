package store

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"
	"sort"
	"strings"
	"time"
)

// Migrations are plain SQL files named NNNN_name.sql, written in the subset of
// SQL that SQLite and PostgreSQL share (TEXT, BIGINT, INTEGER, no
// engine-specific defaults). A file may hold several statements separated by
// a line holding only "-- next".
//
//go:embed migrations/*.sql
var migrations embed.FS

// migrationLock is the PostgreSQL advisory lock key that serialises
// migrations when several controllers start on one database at once.
const migrationLock = 7_316_284_201

// migrationSteps are the migrations this binary knows, by name, and their
// names in the order they run.
func (db *DB) migrationSteps() (map[string]func(context.Context, *sql.Tx) error, []string, error) {
	files, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil {
		return nil, nil, err
	}
	steps := map[string]func(context.Context, *sql.Tx) error{}
	for _, path := range files {
		name := strings.TrimSuffix(strings.TrimPrefix(path, "migrations/"), ".sql")
		steps[name] = func(ctx context.Context, tx *sql.Tx) error { return runSQLFile(ctx, tx, path) }
	}
	for name, f := range goMigrations {
		if _, dup := steps[name]; dup {
			return nil, nil, fmt.Errorf("store: migration %s is both SQL and Go", name)
		}
		steps[name] = func(ctx context.Context, tx *sql.Tx) error { return f(ctx, tx, db.dialect) }
	}
	names := make([]string, 0, len(steps))
	for name := range steps {
		names = append(names, name)
	}
	sort.Strings(names)
	return steps, names, nil
}

func (db *DB) migrate(ctx context.Context) error {
	steps, names, err := db.migrationSteps()
	if err != nil {
		return err
	}

	conn, err := db.sql.Conn(ctx)
	if err != nil {
		return fmt.Errorf("store: migrate: %w", err)
	}
	defer conn.Close()
	if db.dialect == Postgres {
		if _, err := conn.ExecContext(ctx, "SELECT pg_advisory_lock($1)", migrationLock); err != nil {
			return fmt.Errorf("store: migrate lock: %w", err)
		}
		defer conn.ExecContext(context.Background(), "SELECT pg_advisory_unlock($1)", migrationLock) //nolint:errcheck
	}
	if _, err := conn.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		name TEXT PRIMARY KEY, applied_at TEXT NOT NULL)`); err != nil {
		return fmt.Errorf("store: migrate: %w", err)
	}
	applied := map[string]bool{}
	rows, err := conn.QueryContext(ctx, "SELECT name FROM schema_migrations")
	if err != nil {
		return fmt.Errorf("store: migrate: %w", err)
	}
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			rows.Close()
			return err
		}
		applied[n] = true
	}
	rows.Close()

	for _, name := range names {
		if applied[name] {
			continue
		}
		tx, err := conn.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if err := steps[name](ctx, tx); err != nil {
			tx.Rollback()
			return fmt.Errorf("store: migration %s: %w", name, err)
		}
		if _, err := tx.ExecContext(ctx, rebind(db.dialect, "INSERT INTO schema_migrations (name, applied_at) VALUES (?, ?)"),
			name, time.Now().UTC().Format(time.RFC3339)); err != nil {
			tx.Rollback()
			return err
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("store: migration %s: %w", name, err)
		}
	}
	return nil
}

// runSQLFile runs the statements of one embedded migration file.
func runSQLFile(ctx context.Context, tx *sql.Tx, path string) error {
	body, err := migrations.ReadFile(path)
	if err != nil {
		return err
	}
	for _, stmt := range strings.Split(string(body), "\n-- next\n") {
		if strings.TrimSpace(stmt) == "" {
			continue
		}
		if _, err := tx.ExecContext(ctx, stmt); err != nil {
			return err
		}
	}
	return nil
}
