package store

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestKindOf is the one rule that reads engine errors.
func TestKindOf(t *testing.T) {
	pg := func(code string) error { return fmt.Errorf("store: x: %w", &pgconn.PgError{Code: code}) }
	tests := []struct {
		name string
		err  error
		want errKind
	}{
		{"nil", nil, kindOther},
		{"plain", errors.New("boom"), kindOther},
		{"not found", ErrNotFound, kindOther},
		{"unique violation", pg("23505"), kindConflict},
		{"already a conflict", fmt.Errorf("%w: x", ErrConflict), kindConflict},
		{"foreign key", pg("23503"), kindOther},
		{"serialization failure", pg("40001"), kindRetry},
		{"deadlock", pg("40P01"), kindRetry},
		{"admin shutdown (failover, fast stop)", pg("57P01"), kindUnavailable},
		{"crash shutdown", pg("57P02"), kindUnavailable},
		{"starting up", pg("57P03"), kindUnavailable},
		{"connection failure", pg("08006"), kindUnavailable},
		{"a standby: read-only transaction", pg("25006"), kindUnavailable},
		{"too many connections", pg("53300"), kindUnavailable},
		{"syntax error", pg("42601"), kindOther},
		{"connect refused", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, kindUnavailable},
		{"reset", fmt.Errorf("read: %w", syscall.ECONNRESET), kindUnavailable},
		{"server gone mid-answer", io.ErrUnexpectedEOF, kindUnavailable},
		{"bad pooled connection", driver.ErrBadConn, kindUnavailable},
		{"closed pooled connection", fmt.Errorf("x: %w", pgconn.ErrConnClosed), kindUnavailable},
		{"already unavailable", fmt.Errorf("%w: x", ErrUnavailable), kindUnavailable},
		{"caller went away", fmt.Errorf("%w: %w", context.Canceled, io.ErrUnexpectedEOF), kindOther},
		{"flattened unique violation", fmt.Errorf("x: %v", &pgconn.PgError{Code: "23505"}), kindConflict},
		{"flattened SQLite conflict", errors.New("x: constraint failed: UNIQUE constraint failed: t.a (2067)"), kindConflict},
		{"flattened SQLite busy", errors.New("x: database is locked (5) (SQLITE_BUSY)"), kindRetry},
		{"disk full", pg("53100"), kindFull},
		{"no space left on device", fmt.Errorf("write x: %w", syscall.ENOSPC), kindFull},
		{"over quota", fmt.Errorf("write x: %w", syscall.EDQUOT), kindFull},
		{"already full", fmt.Errorf("%w: x", ErrStorageFull), kindFull},
		{"flattened SQLite full", errors.New("x: database or disk is full (13)"), kindFull},
		{"lock timeout", pg("55P03"), kindBusy},
		{"already busy", fmt.Errorf("%w: x", ErrBusy), kindBusy},
		{"flattened lock timeout", errors.New("x: canceling statement due to lock timeout (SQLSTATE 55P03)"), kindBusy},
	}
	for _, tt := range tests {
		if got := kindOf(tt.err); got != tt.want {
			t.Errorf("%s: kindOf(%v) = %d, want %d", tt.name, tt.err, got, tt.want)
		}
		fault := tt.want == kindUnavailable || tt.want == kindFull || tt.want == kindBusy
		if got := IsServiceFault(tt.err); got != fault {
			t.Errorf("%s: IsServiceFault = %v, want %v", tt.name, got, fault)
		}
	}
}

// TestClassifyKeepsCause: a classified error is the sentinel and still
// the engine's error.
func TestClassifyKeepsCause(t *testing.T) {
	pe := &pgconn.PgError{Code: "57P01"}
	err := classify(pe)
	var got *pgconn.PgError
	if !errors.Is(err, ErrUnavailable) || !errors.As(err, &got) || got != pe {
		t.Fatalf("classify(%v) = %v", pe, err)
	}
	if again := classify(err); again != err {
		t.Errorf("classified twice: %v", again)
	}
}
