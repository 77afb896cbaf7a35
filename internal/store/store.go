// Package store is Nimbus's database handle over SQLite (the embedded
// default) or PostgreSQL, with embedded migrations and transactions; its
// only queries are the migrations'.
//
// Every service keeps its state in tables created by the migrations in this
// package, reads and writes only its own (others' through their services),
// and changes them only inside DB.Tx, so a state change is all or nothing.
// Queries are written once with '?' placeholders; Rebind turns them into
// PostgreSQL's $n form.
package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	_ "modernc.org/sqlite" // registers the "sqlite" database/sql driver
)

// Dialect names the SQL engine behind a DB.
type Dialect string

// The engines Nimbus runs on.
const (
	SQLite   Dialect = "sqlite"
	Postgres Dialect = "postgres"
)

// ErrNotFound is returned when a row asked for by key does not exist.
var ErrNotFound = errors.New("not found")

// ErrConflict is returned when a write would break a uniqueness rule.
var ErrConflict = errors.New("conflict")

// DB is a handle on the Nimbus database.
type DB struct {
	sql     *sql.DB
	dialect Dialect
	stmts   stmtCache
	// writer holds this process's SQLite writes in line (see write);
	// nil on PostgreSQL, whose writers do not exclude one another.
	writer chan struct{}
}

// Open connects to the database named by url and runs the migrations.
// An url starting with postgres:// or postgresql:// selects PostgreSQL; anything
// else is a path to an SQLite file (an optional sqlite:// prefix is removed).
func Open(ctx context.Context, url string) (*DB, error) {
	db, err := open(url)
	if err != nil {
		return nil, err
	}
	if err := db.migrate(ctx); err != nil {
		db.Close()
		return nil, err
	}
	return db, nil
}

func open(url string) (*DB, error) {
	if strings.HasPrefix(url, "postgres://") || strings.HasPrefix(url, "postgresql://") {
		cfg, err := pgx.ParseConfig(url)
		if err != nil {
			return nil, fmt.Errorf("store: open postgres: %w", err)
		}
		sqldb := stdlib.OpenDB(*withDeadlines(cfg))
		sqldb.SetMaxOpenConns(32)
		sqldb.SetMaxIdleConns(32)
		sqldb.SetConnMaxIdleTime(5 * time.Minute)
		return &DB{sql: sqldb, dialect: Postgres}, nil
	}
	path := strings.TrimPrefix(url, "sqlite://")
	if path == "" {
		return nil, errors.New("store: empty database path")
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	// WAL lets readers run beside the one writer; _txlock=immediate takes the
	// write lock at BEGIN so two writers queue on busy_timeout instead of
	// failing half-way with SQLITE_BUSY on lock upgrade.
	dsn := "file:" + path + "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)" +
		"&_pragma=foreign_keys(1)&_pragma=synchronous(NORMAL)&_pragma=cache_size(-32768)&_txlock=immediate"
	sqldb, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("store: open sqlite: %w", err)
	}
	sqldb.SetMaxOpenConns(8)
	sqldb.SetMaxIdleConns(8)
	if err := sqldb.Ping(); err != nil {
		sqldb.Close()
		return nil, fmt.Errorf("store: open sqlite %s: %w", path, err)
	}
	// Keep the file private: it holds password hashes and customer data.
	_ = os.Chmod(path, 0o600)
	db := &DB{sql: sqldb, dialect: SQLite, writer: make(chan struct{}, 1)}
	db.startStmtCache()
	return db, nil
}

// Close closes the database.
func (db *DB) Close() error {
	if db.stmts.quit != nil {
		db.stmts.once.Do(func() { close(db.stmts.quit) })
		<-db.stmts.done
	}
	db.stmts.m.Range(func(q, st any) bool {
		st.(*sql.Stmt).Close()
		db.stmts.m.Delete(q)
		return true
	})
	return db.sql.Close()
}

// Dialect tells which engine the handle is on.
func (db *DB) Dialect() Dialect { return db.dialect }

// Rebind rewrites '?' placeholders into the engine's form.
func (db *DB) Rebind(q string) string { return rebind(db.dialect, q) }

func rebind(d Dialect, q string) string {
	if d != Postgres || !strings.Contains(q, "?") {
		return q
	}
	var b strings.Builder
	b.Grow(len(q) + 8)
	n := 0
	inStr := false
	for i := 0; i < len(q); i++ {
		c := q[i]
		switch {
		case c == '\'':
			inStr = !inStr
			b.WriteByte(c)
		case c == '?' && !inStr:
			n++
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

// Querier is what both a DB and a Tx offer for reading and writing.
type Querier interface {
	Exec(ctx context.Context, q string, args ...any) (sql.Result, error)
	Query(ctx context.Context, q string, args ...any) (*sql.Rows, error)
	QueryRow(ctx context.Context, q string, args ...any) *Row
	Dialect() Dialect
}

// Exec runs a statement outside any transaction.
func (db *DB) Exec(ctx context.Context, q string, args ...any) (sql.Result, error) {
	done, err := db.write(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	if st := db.stmt(q); st != nil {
		res, err := st.ExecContext(ctx, args...)
		return res, classify(err)
	}
	res, err := db.sql.ExecContext(ctx, db.Rebind(q), args...)
	return res, classify(err)
}

// Query runs a query outside any transaction.
func (db *DB) Query(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	if st := db.stmt(q); st != nil {
		return classifyRows(st.QueryContext(ctx, args...))
	}
	return classifyRows(db.sql.QueryContext(ctx, db.Rebind(q), args...))
}

// QueryRow runs a query that returns at most one row.
func (db *DB) QueryRow(ctx context.Context, q string, args ...any) *Row {
	if st := db.stmt(q); st != nil {
		return &Row{st.QueryRowContext(ctx, args...)}
	}
	return &Row{db.sql.QueryRowContext(ctx, db.Rebind(q), args...)}
}

// Row is the result of QueryRow: an sql.Row whose error is classified
// (ErrUnavailable, ErrConflict) as every other error of the store is.
type Row struct{ row *sql.Row }

// Scan copies the row's columns into dest; sql.ErrNoRows when there is
// no row.
func (r *Row) Scan(dest ...any) error { return classify(r.row.Scan(dest...)) }

// Err is the query's error, if any, without scanning.
func (r *Row) Err() error { return classify(r.row.Err()) }

func classifyRows(rows *sql.Rows, err error) (*sql.Rows, error) { return rows, classify(err) }

// stmtCacheMax bounds the prepared statements kept: queries built with a
// varying number of placeholders would otherwise grow the cache forever.
// stmtCacheMaxQuery keeps long query texts (a filter list a client made
// long) out of it, so that its memory stays small and it holds the queries
// that repeat.
const (
	stmtCacheMax      = 2000
	stmtCacheMaxQuery = 4096
)

// stmtCache keeps prepared statements by query text. database/sql prepares
// each on a connection the first time it runs there and reuses it after,
// also inside transactions (Tx.StmtContext), which spares SQLite a parse and
// plan per query. PostgreSQL needs none: pgx caches statements per
// connection itself.
//
// A miss never prepares in the caller: a caller inside a transaction holds
// a pooled connection, and preparing needs another, which under load could
// wait on the very connections that wait for this transaction's lock.
// Misses go to a background goroutine instead; the query runs unprepared
// this once.
type stmtCache struct {
	m    sync.Map // query -> *sql.Stmt
	n    atomic.Int64
	want chan string
	quit chan struct{}
	done chan struct{}
	once sync.Once
}

func (db *DB) startStmtCache() {
	db.stmts.want = make(chan string, 256)
	db.stmts.quit = make(chan struct{})
	db.stmts.done = make(chan struct{})
	go func() {
		defer close(db.stmts.done)
		for {
			var q string
			select {
			case <-db.stmts.quit:
				return
			case q = <-db.stmts.want:
			}
			if _, ok := db.stmts.m.Load(q); ok || db.stmts.n.Load() >= stmtCacheMax {
				continue
			}
			st, err := db.sql.Prepare(q)
			if err != nil {
				continue // the plain path reports the error
			}
			db.stmts.m.Store(q, st)
			db.stmts.n.Add(1)
		}
	}()
}

func (db *DB) stmt(q string) *sql.Stmt {
	if db.stmts.want == nil || len(q) > stmtCacheMaxQuery {
		return nil
	}
	if st, ok := db.stmts.m.Load(q); ok {
		return st.(*sql.Stmt)
	}
	if db.stmts.n.Load() < stmtCacheMax {
		select {
		case db.stmts.want <- q:
		default:
		}
	}
	return nil
}

// Tx is one open transaction.
type Tx struct {
	tx      *sql.Tx
	db      *DB
	dialect Dialect
	after   []func()
}

// Dialect tells which engine the transaction is on.
func (tx *Tx) Dialect() Dialect { return tx.dialect }

// LockTimeout bounds each lock wait in the rest of the transaction by d
// (at least a millisecond): a wait that outlasts it fails with ErrBusy.
// It changes nothing on SQLite, whose transactions do not wait on one
// another's locks.
func (tx *Tx) LockTimeout(ctx context.Context, d time.Duration) error {
	if tx.dialect != Postgres {
		return nil
	}
	// SET takes no placeholders; the value is a number formatted here.
	_, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", max(d.Milliseconds(), 1)))
	return err
}

// Exec runs a statement in the transaction.
func (tx *Tx) Exec(ctx context.Context, q string, args ...any) (sql.Result, error) {
	if st := tx.db.stmt(q); st != nil {
		res, err := tx.tx.StmtContext(ctx, st).ExecContext(ctx, args...)
		return res, classify(err)
	}
	res, err := tx.tx.ExecContext(ctx, rebind(tx.dialect, q), args...)
	return res, classify(err)
}

// Query runs a query in the transaction.
func (tx *Tx) Query(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	if st := tx.db.stmt(q); st != nil {
		return classifyRows(tx.tx.StmtContext(ctx, st).QueryContext(ctx, args...))
	}
	return classifyRows(tx.tx.QueryContext(ctx, rebind(tx.dialect, q), args...))
}

// QueryRow runs a query that returns at most one row in the transaction.
func (tx *Tx) QueryRow(ctx context.Context, q string, args ...any) *Row {
	if st := tx.db.stmt(q); st != nil {
		return &Row{tx.tx.StmtContext(ctx, st).QueryRowContext(ctx, args...)}
	}
	return &Row{tx.tx.QueryRowContext(ctx, rebind(tx.dialect, q), args...)}
}

// AfterCommit registers f to run once the transaction has committed, for work
// such as waking a reconcile loop that must not see uncommitted state.
func (tx *Tx) AfterCommit(f func()) { tx.after = append(tx.after, f) }

// Tx runs f in one transaction: committed when f returns nil, rolled back
// otherwise. Serialization failures on PostgreSQL are retried a few times.
func (db *DB) Tx(ctx context.Context, f func(tx *Tx) error) error {
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		err = db.tx(ctx, f)
		if !isRetryable(err) {
			return err
		}
		time.Sleep(time.Duration(attempt+1) * 5 * time.Millisecond)
	}
	return err
}

func (db *DB) tx(ctx context.Context, f func(tx *Tx) error) (err error) {
	turn, err := db.write(ctx)
	if err != nil {
		return err
	}
	ended := false
	done := func() {
		if !ended {
			ended = true
			turn()
		}
	}
	sqltx, err := db.sql.BeginTx(ctx, nil)
	if err != nil {
		done()
		return classify(fmt.Errorf("store: begin: %w", err))
	}
	tx := &Tx{tx: sqltx, db: db, dialect: db.dialect}
	defer func() {
		if p := recover(); p != nil {
			_ = sqltx.Rollback()
			done()
			panic(p)
		}
	}()
	if err := f(tx); err != nil {
		// A rollback that cannot reach the database says why f failed,
		// whatever f made of its error (rows read half-way, say).
		rerr := sqltx.Rollback()
		done()
		if IsUnavailable(rerr) && !IsUnavailable(err) {
			return fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
		return err
	}
	err = sqltx.Commit()
	// The turn ends before the AfterCommit work, which may write again.
	done()
	if err != nil {
		return classify(err)
	}
	for _, a := range tx.after {
		a()
	}
	return nil
}

// writeWait bounds how long a write waits for its turn, as SQLite's
// busy_timeout bounds a wait on another process's lock.
const writeWait = 10 * time.Second

// write waits for this process's turn to write to SQLite and returns what
// ends it. SQLite takes one writer at a time; left to itself, a writer that
// finds the lock taken sleeps 1, 2, 5, 10… ms before it looks again, so
// under load the lock sits free while writers sleep. In line here, the next
// writer starts the moment the last one commits, in the order they came.
// Other processes on the same file (nimbus admin) still queue on
// busy_timeout. On PostgreSQL it waits for nothing.
func (db *DB) write(ctx context.Context) (done func(), err error) {
	if db.writer == nil {
		return func() {}, nil
	}
	select {
	case db.writer <- struct{}{}:
		return db.wrote, nil
	default:
	}
	t := time.NewTimer(writeWait)
	defer t.Stop()
	select {
	case db.writer <- struct{}{}:
		return db.wrote, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-t.C:
		return nil, fmt.Errorf("store: %w: no turn to write in %s", ErrBusy, writeWait)
	}
}

func (db *DB) wrote() { <-db.writer }

// IsNoRows reports whether err means an empty result.
func IsNoRows(err error) bool { return errors.Is(err, sql.ErrNoRows) }

// RebindFor rewrites '?' placeholders for dialect d.
func RebindFor(d Dialect, q string) string { return rebind(d, q) }
