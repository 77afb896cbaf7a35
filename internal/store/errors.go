package store

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// ErrUnavailable is returned when the database cannot serve now: it is
// down or unreachable, restarting, or failing over (the server reached is
// a standby, or a primary shutting down). It is the service's fault, not
// the caller's: the APIs answer 503 with Retry-After, and the pool
// reconnects by itself once a primary takes connections again.
var ErrUnavailable = errors.New("database unavailable")

// ErrStorageFull is returned when a write finds no room: the file system
// under the database or the data directory is full (ENOSPC, SQLite's
// SQLITE_FULL, PostgreSQL's disk_full). Like ErrUnavailable it is the
// service's fault and passes once the operator frees space: the APIs
// answer 503 with Retry-After, and nothing needs restarting.
var ErrStorageFull = errors.New("storage full")

// ErrBusy is returned when a statement waited for a lock longer than its
// transaction allows (PostgreSQL's lock_timeout, lock_not_available): other
// requests hold what it needs. Like ErrUnavailable it is no fault of the
// caller's: the APIs answer 503 with a short Retry-After.
var ErrBusy = errors.New("database busy")

// errKind is what an engine error means to Nimbus.
type errKind int

const (
	kindOther       errKind = iota
	kindConflict            // a uniqueness rule: ErrConflict
	kindRetry               // a serialization failure or deadlock: run the transaction again
	kindUnavailable         // the database is away: ErrUnavailable
	kindFull                // no room to write: ErrStorageFull
	kindBusy                // a lock wait outlasted its bound: ErrBusy
)

// kindOf is the one rule that reads engine errors; classify, Tx's retry
// and IsUnavailable all ask it.
func kindOf(err error) errKind {
	if err == nil {
		return kindOther
	}
	if errors.Is(err, ErrUnavailable) {
		return kindUnavailable
	}
	if errors.Is(err, ErrStorageFull) || errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return kindFull
	}
	if errors.Is(err, ErrConflict) {
		return kindConflict
	}
	if errors.Is(err, ErrBusy) {
		return kindBusy
	}
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return postgresKind(pg.Code)
	}
	var lite *sqlite.Error
	if errors.As(err, &lite) {
		return sqliteKind(lite.Code())
	}
	if connectionLost(err) {
		return kindUnavailable
	}
	return textKind(err.Error())
}

// textKind reads an error a caller flattened with %v, which keeps only
// its text, as the rule before kindOf did: a conflict or a retry.
func textKind(msg string) errKind {
	has := func(subs ...string) bool {
		for _, s := range subs {
			if strings.Contains(msg, s) {
				return true
			}
		}
		return false
	}
	switch {
	case has("SQLSTATE 23505", "UNIQUE constraint failed", "duplicate key value"):
		return kindConflict
	case has("SQLSTATE 40001", "SQLSTATE 40P01", "database is locked", "SQLITE_BUSY"):
		return kindRetry
	case has("SQLSTATE 53100", "database or disk is full", "no space left on device"):
		return kindFull
	case has("SQLSTATE 55P03"):
		return kindBusy
	}
	return kindOther
}

// postgresKind reads a SQLSTATE (PostgreSQL's errcodes appendix).
func postgresKind(code string) errKind {
	switch {
	case code == "23505": // unique_violation
		return kindConflict
	case code == "40001" || code == "40P01": // serialization_failure, deadlock_detected
		return kindRetry
	case code == "53100": // disk_full
		return kindFull
	case code == "55P03": // lock_not_available: lock_timeout passed
		return kindBusy
	case strings.HasPrefix(code, "08"), // connection_exception and its kinds
		code == "57P01", // admin_shutdown: a fast shutdown, or Patroni demoting the primary
		code == "57P02", // crash_shutdown: another backend crashed
		code == "57P03", // cannot_connect_now: starting up, or in recovery
		code == "25006", // read_only_sql_transaction: a standby, or a demoted primary
		code == "53300": // too_many_connections
		return kindUnavailable
	}
	return kindOther
}

// sqliteKind reads an SQLite result code, extended or primary.
func sqliteKind(code int) errKind {
	switch {
	case code == sqlite3.SQLITE_CONSTRAINT_UNIQUE, code == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY:
		return kindConflict
	case code&0xff == sqlite3.SQLITE_BUSY, code&0xff == sqlite3.SQLITE_LOCKED:
		return kindRetry
	case code&0xff == sqlite3.SQLITE_FULL:
		return kindFull
	}
	return kindOther
}

// connectionLost tells whether err is the connection to the database
// failing rather than a statement: a connection that could not be made, a
// socket error, the server gone mid-answer, or a pooled connection
// already closed. A caller's cancelled context is not among them: that
// client went away.
//
// pgx reports a server gone mid-message as a bare io.ErrUnexpectedEOF
// (pgproto3 turns every EOF into it), and database/sql hands it on
// unwrapped through Rows.Err, so the bare error counts. Elsewhere it
// would mean a request body cut short, which api's decoding answers with
// 400 before it could reach here.
func connectionLost(err error) bool {
	var connect *pgconn.ConnectError
	var netErr net.Error
	switch {
	case errors.Is(err, context.Canceled):
		return false
	case errors.As(err, &connect), errors.Is(err, driver.ErrBadConn), errors.Is(err, pgconn.ErrConnClosed):
		return true
	case errors.As(err, &netErr), errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EPIPE), errors.Is(err, io.ErrUnexpectedEOF):
		return true
	case pgconn.Timeout(err):
		return true // a round trip to the server outlived its deadline
	}
	return false
}

// classify maps engine errors onto the package's sentinels, keeping the
// engine's error in the chain.
func classify(err error) error {
	switch kindOf(err) {
	case kindConflict:
		if errors.Is(err, ErrConflict) {
			return err
		}
		return fmt.Errorf("%w: %w", ErrConflict, err)
	case kindUnavailable:
		if errors.Is(err, ErrUnavailable) {
			return err
		}
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	case kindFull:
		if errors.Is(err, ErrStorageFull) {
			return err
		}
		return fmt.Errorf("%w: %w", ErrStorageFull, err)
	case kindBusy:
		if errors.Is(err, ErrBusy) {
			return err
		}
		return fmt.Errorf("%w: %w", ErrBusy, err)
	}
	return err
}

func isRetryable(err error) bool { return kindOf(err) == kindRetry }

// IsUnavailable tells whether err means the database is away (see
// ErrUnavailable), whether or not the store classified it: errors read
// from rows reach callers as the driver gave them.
func IsUnavailable(err error) bool { return kindOf(err) == kindUnavailable }

// IsFull tells whether err means there was no room to write (see
// ErrStorageFull): the database's or any file the service writes.
func IsFull(err error) bool { return kindOf(err) == kindFull }

// IsServiceFault tells whether err is the database failing the caller
// through no fault of the caller's, and passing by itself: away, full or
// busy. A front end answers it 503; work hit by it is tried again later.
func IsServiceFault(err error) bool {
	switch kindOf(err) {
	case kindUnavailable, kindFull, kindBusy:
		return true
	}
	return false
}

// IsBusy tells whether err is a lock wait that outlasted its transaction's
// bound (see ErrBusy and LockTimeout).
func IsBusy(err error) bool { return kindOf(err) == kindBusy }
