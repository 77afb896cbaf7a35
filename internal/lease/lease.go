// Package lease owns work through the database, so that work that must
// happen once happens once and outlives the controller that began it.
// A lease is a named row (migration 0070) held by one controller, the
// holder, until it expires; the holder renews every lease it holds in
// one statement every TTL/3, and a controller that dies stops renewing,
// so its leases fall free within TTL for any other to take. Each
// commit of owned work checks, in its own transaction, that its lease
// is still the holder's (Hold), so a holder that stalled past its
// expiry, and was overtaken, commits nothing.
//
// Why leases and not the engines' own locks: a PostgreSQL advisory lock
// lives as long as its session, which a controller cut off by the
// network keeps for the kernel's TCP timeouts (hours), and which a
// connection pool, or PgBouncer or HAProxy between the controller and
// the database, does not pin; SQLite, the embedded default, has none. A
// lease row is the same SQL on both engines, ends at a time the holder
// chose, and can be read by an operator (who holds what, till when).
// Work is found again from recorded state (compute's work_due, the
// jobs' last runs), not from a queue of its own: a lease only says who
// does it now.
//
// Holders are named by the controller (a stable id kept in its data
// directory), so a controller restarted at once takes its own leases
// back without waiting for them to expire. Times are the holders'
// clocks: controllers keep them within a few seconds of each other
// (NTP). A clock far ahead takes a lease early, and the fence makes
// that cost an attempt, never a second commit.
package lease

import (
	"context"
	crand "crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"log/slog"
	"math/rand/v2"
	"strings"
	"time"

	"nimbus/internal/store"
)

// DefaultTTL is how long a lease lasts unrenewed: a controller that dies
// loses its work to another within DefaultTTL and one look of theirs.
const DefaultTTL = 15 * time.Second

// ErrLost is returned by Hold when the lease is no longer the holder's:
// another controller took it after it expired.
var ErrLost = errors.New("lease: lost to another holder")

// Config sets up a Manager.
type Config struct {
	// Holder names this controller; empty: a random name.
	Holder string
	// TTL is how long a lease lasts unrenewed (default DefaultTTL).
	TTL time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
	Log *slog.Logger
}

// Manager takes, renews and gives back one controller's leases.
type Manager struct {
	db     *store.DB
	holder string
	ttl    time.Duration
	now    func() time.Time
	log    *slog.Logger
}

// New makes a Manager on db.
func New(db *store.DB, cfg Config) *Manager {
	m := &Manager{db: db, holder: cfg.Holder, ttl: cfg.TTL, now: cfg.Now, log: cfg.Log}
	if m.holder == "" {
		m.holder = NewHolder("")
	}
	if m.ttl <= 0 {
		m.ttl = DefaultTTL
	}
	if m.now == nil {
		m.now = time.Now
	}
	if m.log == nil {
		m.log = slog.Default()
	}
	return m
}

// NewHolder makes a holder name: prefix (a host name) and a random part.
func NewHolder(prefix string) string {
	b := make([]byte, 6)
	_, _ = crand.Read(b)
	if prefix == "" {
		return hex.EncodeToString(b)
	}
	return prefix + "-" + hex.EncodeToString(b)
}

// Holder is this controller's name in the leases it holds.
func (m *Manager) Holder() string { return m.holder }

// TTL is how long a lease lasts unrenewed.
func (m *Manager) TTL() time.Duration { return m.ttl }

func (m *Manager) expiry() string { return store.FormatTime(m.now().Add(m.ttl)) }

// Acquire takes lease name for this controller: a new one, one it holds
// already (renewed), or one whose holder let it expire. It reports
// whether the lease is this controller's now.
func (m *Manager) Acquire(ctx context.Context, name string) (bool, error) {
	now := store.FormatTime(m.now())
	res, err := m.db.Exec(ctx, `INSERT INTO leases (name, holder, expires_at, acquired_at) VALUES (?, ?, ?, ?)
 ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at,
 acquired_at = CASE WHEN leases.holder = excluded.holder THEN leases.acquired_at ELSE excluded.acquired_at END
 WHERE leases.holder = excluded.holder OR leases.expires_at < ?`, name, m.holder, m.expiry(), now, now)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

// TakeFree takes, in q's transaction, those of names that no one holds,
// and answers them: the transaction that writes new work can own it at
// once, without a statement of its own. A name held by anyone, even
// expired, is left to Acquire.
func (m *Manager) TakeFree(ctx context.Context, q store.Querier, names ...string) ([]string, error) {
	var taken []string
	now, exp := store.FormatTime(m.now()), m.expiry()
	for len(names) > 0 {
		n := min(len(names), 200) // under every engine's parameter cap
		var b strings.Builder
		args := make([]any, 0, 4*n)
		b.WriteString("INSERT INTO leases (name, holder, expires_at, acquired_at) VALUES ")
		for i, name := range names[:n] {
			if i > 0 {
				b.WriteString(",")
			}
			b.WriteString("(?,?,?,?)")
			args = append(args, name, m.holder, exp, now)
		}
		b.WriteString(" ON CONFLICT (name) DO NOTHING RETURNING name")
		rows, err := q.Query(ctx, b.String(), args...)
		if err != nil {
			return nil, err
		}
		for rows.Next() {
			var name string
			if err := rows.Scan(&name); err != nil {
				rows.Close()
				return nil, err
			}
			taken = append(taken, name)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, err
		}
		names = names[n:]
	}
	return taken, nil
}

// Hold fences a commit of owned work: in q's transaction it renews lease
// name, and answers ErrLost when the lease is no longer this
// controller's. On PostgreSQL the renewal locks the row until q commits,
// so that no one takes the lease in between.
func (m *Manager) Hold(ctx context.Context, q store.Querier, name string) error {
	return fenced(q.Exec(ctx, "UPDATE leases SET expires_at = ? WHERE name = ? AND holder = ?", m.expiry(), name, m.holder))
}

// Release gives lease name back, in q's transaction when q is one; a
// lease that is another's is left alone.
func (m *Manager) Release(ctx context.Context, q store.Querier, name string) error {
	_, err := q.Exec(ctx, "DELETE FROM leases WHERE name = ? AND holder = ?", name, m.holder)
	return err
}

// GiveBack is Hold and Release in one statement, for the transaction
// that leaves the lease's work done: it gives lease name back, or answers
// ErrLost, and the transaction must not commit, when this controller no
// longer holds it.
func (m *Manager) GiveBack(ctx context.Context, q store.Querier, name string) error {
	return fenced(q.Exec(ctx, "DELETE FROM leases WHERE name = ? AND holder = ?", name, m.holder))
}

// fenced answers ErrLost when a statement on this holder's lease touched no
// row: the lease is another's, or gone.
func fenced(res sql.Result, err error) error {
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil {
		return err
	} else if n == 0 {
		return ErrLost
	}
	return nil
}

// ReleaseAll gives back every lease this controller holds, as it stops:
// others take the work at once instead of after the leases expire.
func (m *Manager) ReleaseAll(ctx context.Context) error {
	_, err := m.db.Exec(ctx, "DELETE FROM leases WHERE holder = ?", m.holder)
	return err
}

// Renew extends every lease this controller holds.
func (m *Manager) Renew(ctx context.Context) error {
	_, err := m.db.Exec(ctx, "UPDATE leases SET expires_at = ? WHERE holder = ?", m.expiry(), m.holder)
	return err
}

// HeldByOthers is the set of leases named prefix… that another
// controller holds and has not let expire: the work it owns now.
func (m *Manager) HeldByOthers(ctx context.Context, prefix string) (map[string]bool, error) {
	return m.held(ctx, prefix, m.holder)
}

// Held is the set of leases named prefix… that any controller, this one
// included, holds and has not let expire.
func (m *Manager) Held(ctx context.Context, prefix string) (map[string]bool, error) {
	return m.held(ctx, prefix, "")
}

// held is the set of live leases named prefix…, less those of holder
// except (none when "").
func (m *Manager) held(ctx context.Context, prefix, except string) (map[string]bool, error) {
	rows, err := m.db.Query(ctx, "SELECT name FROM leases WHERE name LIKE ? AND holder <> ? AND expires_at >= ?",
		prefix+"%", except, store.FormatTime(m.now()))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]bool{}
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			return nil, err
		}
		out[n] = true
	}
	return out, rows.Err()
}

// Run renews this controller's leases every TTL/3 until ctx ends, then
// gives them all back.
func (m *Manager) Run(ctx context.Context) {
	t := time.NewTicker(m.ttl / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if err := m.ReleaseAll(rctx); err != nil {
				m.log.Warn("lease: giving leases back failed", "error", err)
			}
			cancel()
			return
		case <-t.C:
			if err := m.Renew(ctx); err != nil && ctx.Err() == nil {
				m.log.Warn("lease: renewal failed", "error", err)
			}
		}
	}
}

// jitter spreads d by up to a tenth either way, so that controllers
// started together do not look at once for ever.
func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return d
	}
	return d - d/10 + rand.N(d/5+1)
}
