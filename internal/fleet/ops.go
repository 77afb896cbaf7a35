package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"

	"nimbus/internal/driver"
	"nimbus/internal/fleet/wire"
	"nimbus/internal/store"
)

// Op states.
const (
	statePending = "pending"
	stateDone    = "done"
	stateFailed  = "failed"
)

// opRow is the part of a fleet_ops row a caller needs.
type opRow struct {
	ID, Key, Host, ServerID, Kind, State string
	Result                               json.RawMessage
	Error, ErrorCode                     string
	Created                              time.Time
}

const opColumns = "o.id, o.op_key, o.host, o.server_id, o.kind, o.state, o.result, o.error, o.error_code, o.created_at"

func scanOp(row interface{ Scan(...any) error }) (*opRow, error) {
	var o opRow
	var result, created string
	if err := row.Scan(&o.ID, &o.Key, &o.Host, &o.ServerID, &o.Kind, &o.State, &result, &o.Error, &o.ErrorCode, &created); err != nil {
		if store.IsNoRows(err) {
			return nil, store.ErrNotFound
		}
		return nil, err
	}
	if result != "" {
		o.Result = json.RawMessage(result)
	}
	o.Created = store.ParseTime(created)
	return &o, nil
}

// outcome is how an op a caller waits on ended: finished (op set), its
// host went down, or its row vanished (a commit lost in a failover).
type outcome struct {
	op       *opRow
	hostDown bool
	vanished bool
}

// call runs one driver call as an op on the server's host and waits for
// it. toHost is the host for spawn and resize; other calls go where the
// server's VM is.
func (s *Service) call(ctx context.Context, kind, serverID, toHost string, args any) (json.RawMessage, error) {
	if serverID == "" {
		return nil, errors.New("fleet: no server id")
	}
	host := toHost
	if host == "" {
		var gone int
		err := s.db.QueryRow(ctx, "SELECT host, gone FROM fleet_instances WHERE server_id = ?", serverID).Scan(&host, &gone)
		if store.IsNoRows(err) || (err == nil && gone != 0) {
			return nil, driver.ErrNotFound
		}
		if err != nil {
			return nil, fmt.Errorf("fleet: %s %s: %w", kind, serverID, err)
		}
	}
	h, err := s.host(ctx, host)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("fleet: %s %s: no host %q is registered", kind, serverID, host)
	}
	if err != nil {
		return nil, fmt.Errorf("fleet: %s %s: %w", kind, serverID, err)
	}
	if !s.isUp(h, s.now()) {
		return nil, driver.ErrHostDown
	}
	var argsJSON []byte
	if args != nil {
		if argsJSON, err = json.Marshal(args); err != nil {
			return nil, fmt.Errorf("fleet: %s %s: %w", kind, serverID, err)
		}
	}
	// One step may ask for several kinds of work (a shelve snapshots, then
	// powers off): the caller's key names the step, the kind the work.
	key := driver.OpKey(ctx)
	if key != "" {
		key += "/" + kind
	}
	w, op, err := s.submit(ctx, key, host, serverID, kind, argsJSON)
	if err != nil {
		return nil, fmt.Errorf("fleet: %s %s: %w", kind, serverID, err)
	}
	if op.State != statePending {
		s.hub.unwaitOp(w)
		return opResult(op)
	}
	return s.wait(ctx, w, op, key != "")
}

// attemptKey is the op key of the n-th attempt at the caller's key: the
// key itself first, then key#2, key#3… after failures.
func attemptKey(key string, n int) string {
	if n == 1 {
		return key
	}
	return key + "#" + strconv.Itoa(n)
}

// submit finds the op the caller's key names (pending, or done without
// error) or inserts a new one, and registers a waiter for it before any
// result can arrive. An op whose key failed before gets a new attempt, so
// that a retry retries.
func (s *Service) submit(ctx context.Context, key, host, serverID, kind string, args []byte) (*opWaiter, *opRow, error) {
	if key == "" {
		id := uuid.NewString()
		w := s.hub.waitOp(id, host)
		op, err := s.insert(ctx, id, id, host, serverID, kind, args)
		if err != nil {
			s.hub.unwaitOp(w)
			return nil, nil, err
		}
		return w, op, nil
	}
	conflicts := 0
	for n := 1; n <= 1000; n++ {
		k := attemptKey(key, n)
		op, err := scanOp(s.db.QueryRow(ctx, "SELECT "+opColumns+" FROM fleet_ops o WHERE op_key = ?", k))
		if errors.Is(err, store.ErrNotFound) {
			id := uuid.NewString()
			w := s.hub.waitOp(id, host)
			op, err = s.insert(ctx, id, k, host, serverID, kind, args)
			if errors.Is(err, store.ErrConflict) && conflicts < 5 {
				// Another caller (another controller) made this attempt
				// just now: wait for theirs.
				s.hub.unwaitOp(w)
				conflicts++
				n--
				continue
			}
			if err != nil {
				s.hub.unwaitOp(w)
				return nil, nil, err
			}
			return w, op, nil
		}
		if err != nil {
			return nil, nil, err
		}
		if op.ServerID != serverID || op.Kind != kind {
			return nil, nil, fmt.Errorf("op key %q was used for %s of server %s", key, op.Kind, op.ServerID)
		}
		if op.State == stateFailed {
			continue
		}
		// Pending or done: this is the caller's op. Register, then read
		// it again so that a result that landed in between is not missed.
		w := s.hub.waitOp(op.ID, op.Host)
		again, err := scanOp(s.db.QueryRow(ctx, "SELECT "+opColumns+" FROM fleet_ops o WHERE id = ?", op.ID))
		if err != nil {
			s.hub.unwaitOp(w)
			return nil, nil, err
		}
		return w, again, nil
	}
	return nil, nil, fmt.Errorf("op key %q failed too often", key)
}

// insert records a new op (for spawn and resize with the server's host, in
// the same transaction) and wakes the agent's long-polls here.
func (s *Service) insert(ctx context.Context, id, key, host, serverID, kind string, args []byte) (*opRow, error) {
	now := s.now()
	ts := store.FormatTime(now)
	if args == nil {
		args = []byte("{}")
	}
	err := s.writes.do(ctx, func(ctx context.Context, tx *store.Tx) error {
		if kind == wire.KindSpawn || kind == wire.KindResize {
			// Recorded before the op runs, so that a later destroy finds
			// the host even after a failed spawn. On another host the VM
			// is reported by another agent, whose clock orders its reports
			// afresh: the old one's must not outrank it.
			if _, err := tx.Exec(ctx, `INSERT INTO fleet_instances (server_id, host, power, observed, gone, updated_at)
 VALUES (?, ?, 0, 0, 0, ?) ON CONFLICT (server_id) DO UPDATE SET host = excluded.host, gone = 0, updated_at = excluded.updated_at,
 observed = CASE WHEN fleet_instances.host = excluded.host THEN fleet_instances.observed ELSE 0 END`,
				serverID, host, ts); err != nil {
				return err
			}
		}
		_, err := tx.Exec(ctx, `INSERT INTO fleet_ops (id, op_key, host, server_id, kind, args, state, created_at)
 VALUES (?, ?, ?, ?, ?, ?, ?, ?)`, id, key, host, serverID, kind, string(args), statePending, ts)
		return err
	})
	if err != nil {
		return nil, err
	}
	s.hub.announce(id, host, now)
	return &opRow{ID: id, Key: key, Host: host, ServerID: serverID, Kind: kind, State: statePending, Created: now}, nil
}

// wait waits for op's outcome: its result, its host going down, its
// timeout or the caller giving up.
func (s *Service) wait(ctx context.Context, w *opWaiter, op *opRow, keyed bool) (json.RawMessage, error) {
	defer s.hub.unwaitOp(w)
	timer := time.NewTimer(time.Until(op.Created.Add(s.cfg.OpTimeout)))
	defer timer.Stop()
	select {
	case out := <-w.ch:
		if out.vanished {
			return nil, fmt.Errorf("fleet: %s %s: op %s is no longer recorded (lost in a database failover); ask again", op.Kind, op.ServerID, op.ID)
		}
		if !out.hostDown {
			return opResult(out.op)
		}
		if keyed {
			// The caller will ask again with the same key once the host
			// is back, and find this op still pending.
			return nil, driver.ErrHostDown
		}
		// Nobody can come back for an op without a key: withdraw it so
		// that it does not run when the host returns, unless it finished.
		if done, err := s.withdraw(op.ID, "host "+op.Host+" went down"); err == nil && done != nil && done.State != stateFailed {
			return opResult(done)
		}
		return nil, driver.ErrHostDown
	case <-ctx.Done():
		// The op stays pending: a controller shutting down resumes the
		// step after its restart.
		return nil, ctx.Err()
	case <-timer.C:
		msg := fmt.Sprintf("timed out after %s waiting for the agent of host %s", s.cfg.OpTimeout, op.Host)
		done, err := s.withdraw(op.ID, msg)
		if err != nil {
			return nil, fmt.Errorf("fleet: %s %s: %w", op.Kind, op.ServerID, err)
		}
		return opResult(done)
	}
}

// withdraw marks a pending op failed with msg and answers the op as it now
// stands (finished by its agent meanwhile, or failed by this).
func (s *Service) withdraw(id, msg string) (*opRow, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := s.db.Exec(ctx, `UPDATE fleet_ops SET state = ?, error = ?, error_code = ?, done_at = ?, args = '{}'
 WHERE id = ? AND state = ?`, stateFailed, msg, wire.CodeFailed, store.FormatTime(s.now()), id, statePending); err != nil {
		return nil, err
	}
	return scanOp(s.db.QueryRow(ctx, "SELECT "+opColumns+" FROM fleet_ops o WHERE id = ?", id))
}

// opResult turns a finished op into the driver call's answer.
func opResult(op *opRow) (json.RawMessage, error) {
	switch op.State {
	case stateDone:
		return op.Result, nil
	case stateFailed:
		switch op.ErrorCode {
		case wire.CodeNotFound:
			return nil, driver.ErrNotFound
		case wire.CodeHostDown:
			return nil, driver.ErrHostDown
		case wire.CodeNoConsole:
			return nil, driver.ErrNoConsole
		case wire.CodeNotRunning:
			return nil, driver.ErrNotRunning
		}
		return nil, &OpError{Host: op.Host, Msg: op.Error}
	}
	return nil, fmt.Errorf("fleet: op %s is still %s", op.ID, op.State)
}

// OpError is a driver error an agent reported, or an op that timed out.
// Its text is the driver's own, so that a fault shows what the hypervisor
// said.
type OpError struct {
	Host string
	Msg  string
}

func (e *OpError) Error() string { return e.Msg }
