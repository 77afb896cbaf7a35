package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
)

// OpenReadOnly connects to the database named by url (as Open reads it)
// for reading only: it runs no migrations, creates no SQLite file, and
// the engine itself refuses writes (SQLite's query_only, PostgreSQL's
// default_transaction_read_only), so that an operator's checks and copies
// cannot change a database a controller is serving, whatever its version.
func OpenReadOnly(ctx context.Context, dbURL string) (*DB, error) {
	if strings.HasPrefix(dbURL, "postgres://") || strings.HasPrefix(dbURL, "postgresql://") {
		u, err := url.Parse(dbURL)
		if err != nil {
			return nil, fmt.Errorf("store: database url: %w", err)
		}
		q := u.Query()
		q.Set("default_transaction_read_only", "on") // pgx sends unknown parameters as run-time settings
		u.RawQuery = q.Encode()
		sqldb, err := sql.Open("pgx", u.String())
		if err != nil {
			return nil, fmt.Errorf("store: open postgres: %w", err)
		}
		sqldb.SetMaxOpenConns(4)
		if err := sqldb.PingContext(ctx); err != nil {
			sqldb.Close()
			return nil, fmt.Errorf("store: open postgres: %w", err)
		}
		return &DB{sql: sqldb, dialect: Postgres}, nil
	}
	path := strings.TrimPrefix(dbURL, "sqlite://")
	if path == "" {
		return nil, errors.New("store: empty database path")
	}
	// mode=rw opens an existing file only; the WAL files may still be
	// made, which readers of a WAL database need.
	dsn := "file:" + path + "?mode=rw&_pragma=busy_timeout(10000)&_pragma=query_only(1)"
	sqldb, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("store: open sqlite: %w", err)
	}
	sqldb.SetMaxOpenConns(4)
	if err := sqldb.PingContext(ctx); err != nil {
		sqldb.Close()
		return nil, fmt.Errorf("store: open sqlite %s: %w", path, err)
	}
	return &DB{sql: sqldb, dialect: SQLite}, nil
}

// ErrSchema is a database whose migrations are not those this binary
// knows: older (not migrated yet) or newer (migrated by a later version).
var ErrSchema = errors.New("store: schema")

// SchemaCurrent reports, as ErrSchema, a database whose applied migrations
// are not exactly those this binary knows: its queries would read tables
// as they are not.
func (db *DB) SchemaCurrent(ctx context.Context) error {
	_, names, err := db.migrationSteps()
	if err != nil {
		return err
	}
	applied := map[string]bool{}
	rows, err := db.sql.QueryContext(ctx, "SELECT name FROM schema_migrations")
	if err != nil {
		return fmt.Errorf("%w: no migrations recorded (not a Nimbus database?): %v", ErrSchema, err)
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
	if err := rows.Err(); err != nil {
		return err
	}
	for _, n := range names {
		if !applied[n] {
			return fmt.Errorf("%w: the database lacks migration %s: it is older than this nimbus (start this version's nimbus serve on it once, or use the nimbus that serves it)", ErrSchema, n)
		}
		delete(applied, n)
	}
	for n := range applied {
		return fmt.Errorf("%w: the database has migration %s, which this nimbus does not know: use the nimbus that serves it", ErrSchema, n)
	}
	return nil
}

// ReadTx runs f in one read-only transaction that sees a single snapshot
// of the database (PostgreSQL REPEATABLE READ; an SQLite read transaction,
// which in WAL mode blocks no writer), so that what f compares across
// tables was true at one instant. It is always rolled back.
func (db *DB) ReadTx(ctx context.Context, f func(tx *Tx) error) error {
	opts := &sql.TxOptions{ReadOnly: true}
	if db.dialect == Postgres {
		opts.Isolation = sql.LevelRepeatableRead
	}
	sqltx, err := db.sql.BeginTx(ctx, opts)
	if err != nil {
		return fmt.Errorf("store: begin: %w", err)
	}
	defer sqltx.Rollback() //nolint:errcheck // read only: nothing to keep
	return f(&Tx{tx: sqltx, db: db, dialect: db.dialect})
}

// Backup writes a consistent copy of the SQLite database at dbURL (as
// Open reads it) to path, a file that must not exist yet, while
// controllers go on reading and writing it: VACUUM INTO reads one snapshot
// (in WAL mode it holds up no writer) and writes it compacted, with every
// index. It runs no migration: the copy is the database as it is. The
// copy is checked (quick_check) and flushed to disk before Backup
// returns. PostgreSQL has its own tools (pg_basebackup, pg_dump): it is
// refused.
func Backup(ctx context.Context, dbURL, path string) error {
	if strings.HasPrefix(dbURL, "postgres://") || strings.HasPrefix(dbURL, "postgresql://") {
		return errors.New("store: backup copies SQLite databases; back PostgreSQL up with pg_basebackup or pg_dump")
	}
	if _, err := os.Lstat(path); err == nil {
		return fmt.Errorf("store: backup: %s exists already", path)
	}
	src := strings.TrimPrefix(dbURL, "sqlite://")
	// VACUUM INTO writes, so this handle is not query_only; mode=rw
	// still never creates the source.
	c, err := sql.Open("sqlite", "file:"+src+"?mode=rw&_pragma=busy_timeout(10000)")
	if err != nil {
		return fmt.Errorf("store: backup: %w", err)
	}
	defer c.Close()
	if _, err := c.ExecContext(ctx, "VACUUM INTO ?", path); err != nil {
		os.Remove(path)
		return fmt.Errorf("store: backup of %s: %w", src, err)
	}
	if err := checkCopy(ctx, path); err != nil {
		return fmt.Errorf("store: backup: the copy %s fails its check: %w", path, err)
	}
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// checkCopy runs SQLite's quick_check on the file at path.
func checkCopy(ctx context.Context, path string) error {
	c, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	if err != nil {
		return err
	}
	defer c.Close()
	var res string
	if err := c.QueryRowContext(ctx, "PRAGMA quick_check").Scan(&res); err != nil {
		return err
	}
	if res != "ok" {
		return errors.New(res)
	}
	return nil
}
