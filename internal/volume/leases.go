package volume

import (
	"context"
	"errors"
	"slices"
	"strings"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/lease"
	"nimbus/internal/store"
)

// The data work of volumes, snapshots and backups is owned through the
// region's leases (internal/lease), as compute owns a server's steps: the
// controller working on an item holds the lease "volume/<key>" while the
// item's status asks for work, and gives it back when the item rests. A
// controller that dies stops renewing its leases; every controller's scan
// finds such work again from the items' statuses and takes it. Outcomes
// are written only from the status the work began at (setStatus's from),
// so two controllers never both record one.

// leasePrefix names the leases of volume work; backupKey prefixes a
// backup's id in them (a snapshot's is snapKey, a volume's its bare id).
const (
	leasePrefix = "volume/"
	backupKey   = "backup:"
)

// scanPeriod is how often a controller looks for work no one holds.
const scanPeriod = 5 * time.Second

var (
	// errHeldElsewhere: another live controller holds the item's work; it
	// is looked at again after the key's backoff, by when it may be done.
	errHeldElsewhere = errors.New("volume: another controller holds the work")
	// errStillDue: the work ran without error but the item still asks for
	// work (its status changed meanwhile); it runs again, lease kept.
	errStillDue = errors.New("volume: the item still owes work")
)

// workKind is a table whose rows' statuses ask for data work.
type workKind struct {
	prefix, table string
	statuses      []string
}

var workKinds = []workKind{
	{snapKey, "volume_snapshots", []string{SnapCreating, SnapDeleting}},
	{backupKey, "volume_backups", []string{backupCreating, backupRestoring, backupDeleting}},
	{"", "volumes", []string{StatusCreating, StatusExtending, StatusDeleting, StatusUploading}},
}

// kindOf is the kind of a work key and the item's id.
func kindOf(key string) (workKind, string) {
	for _, k := range workKinds {
		if id, ok := strings.CutPrefix(key, k.prefix); ok {
			return k, id
		}
	}
	panic("unreachable: the volumes' kind has no prefix")
}

// SetLeases shares the region's leases with the volume service; without
// them (a service on its own) every item's work is this controller's.
func (s *Service) SetLeases(m *lease.Manager) { s.leases = m }

// owned runs work for key under its lease, and gives the lease back once
// the item rests. An error keeps the lease: the queue tries again here.
func (s *Service) owned(ctx context.Context, key string, work func(context.Context) error) error {
	if s.leases == nil {
		return work(ctx)
	}
	name := leasePrefix + key
	ok, err := s.leases.Acquire(ctx, name)
	switch {
	case ctx.Err() != nil:
		return nil
	case err != nil:
		s.log.Warn("volume: taking the work's lease failed", "work", key, "error", err)
		return err
	case !ok:
		return errHeldElsewhere
	}
	if err := work(ctx); err != nil || ctx.Err() != nil {
		return err
	}
	if due, err := s.due(ctx, key); err != nil {
		return err
	} else if due {
		return errStillDue
	}
	return s.leases.Release(ctx, s.db, name)
}

// due reports whether key's item still asks for work.
func (s *Service) due(ctx context.Context, key string) (bool, error) {
	k, id := kindOf(key)
	var status string
	err := s.db.QueryRow(ctx, "SELECT status FROM "+k.table+" WHERE id = ?", id).Scan(&status)
	if store.IsNoRows(err) {
		return false, nil
	}
	return slices.Contains(k.statuses, status), err
}

// enqueue hands key to its queue.
func (s *Service) enqueue(key string) {
	if id, ok := strings.CutPrefix(key, backupKey); ok {
		s.backupQueue.Add(id)
		return
	}
	s.queue.Add(key)
}

// scan queues the work items ask for. At start (all) it queues every
// one: this controller's own from before a restart, others' which their
// holders keep (Acquire leaves them). Afterwards it queues only work no
// one holds that has rested a lease's length: left by a controller that
// died, not work another controller is about to take.
func (s *Service) scan(ctx context.Context, all bool) {
	held := map[string]bool{}
	cut := ""
	if !all && s.leases != nil {
		var err error
		if held, err = s.leases.Held(ctx, leasePrefix); err != nil {
			if ctx.Err() == nil {
				s.log.Warn("volume: reading leases failed", "error", err)
			}
			return
		}
		cut = store.FormatTime(s.now().Add(-s.leases.TTL()))
	}
	for _, k := range workKinds {
		q := "SELECT id FROM " + k.table + " WHERE status IN (" + api.Placeholders(len(k.statuses)) + ")"
		args := make([]any, 0, len(k.statuses)+1)
		for _, st := range k.statuses {
			args = append(args, st)
		}
		if cut != "" {
			q += " AND updated_at < ?"
			args = append(args, cut)
		}
		ids, err := s.ids(ctx, q, args...)
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("volume: looking for owed work failed", "table", k.table, "error", err)
			}
			continue
		}
		for _, id := range ids {
			if !held[leasePrefix+k.prefix+id] {
				s.enqueue(k.prefix + id)
			}
		}
	}
}

func (s *Service) ids(ctx context.Context, q string, args ...any) ([]string, error) {
	rows, err := s.db.Query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}
