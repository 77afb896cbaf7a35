package fleet

import (
	"context"
	"strings"
	"sync"
	"time"

	"nimbus/internal/store"
)

// hub is what waits in this process: callers waiting for their ops'
// results, and agents' long-polls waiting for ops for their hosts. Work
// done here wakes them at once; work done by another controller sharing
// the database is found by the watcher's polling.
type hub struct {
	mu    sync.Mutex
	ops   map[string][]*opWaiter // op id → callers
	polls map[string]map[*pollWaiter]struct{}
	// announced holds the pending ops the polls have been told of, with
	// when they were made, so that the watcher wakes polls only for ops
	// it has not seen.
	announced map[string]time.Time
}

// opWaiter is a caller waiting for one op.
type opWaiter struct {
	id, host string
	since    time.Time    // when the wait began, before the op's insert
	ch       chan outcome // buffered: the first outcome wins
}

// pollWaiter is one agent's open long-poll.
type pollWaiter struct {
	hosts []string
	ch    chan struct{} // buffered: a wake-up is never lost
}

func newHub() *hub {
	return &hub{ops: map[string][]*opWaiter{}, polls: map[string]map[*pollWaiter]struct{}{}, announced: map[string]time.Time{}}
}

func (h *hub) waitOp(id, host string) *opWaiter {
	w := &opWaiter{id: id, host: host, since: time.Now(), ch: make(chan outcome, 1)}
	h.mu.Lock()
	h.ops[id] = append(h.ops[id], w)
	h.mu.Unlock()
	return w
}

func (h *hub) unwaitOp(w *opWaiter) {
	h.mu.Lock()
	defer h.mu.Unlock()
	ws := h.ops[w.id]
	for i, o := range ws {
		if o == w {
			ws = append(ws[:i], ws[i+1:]...)
			break
		}
	}
	if len(ws) == 0 {
		delete(h.ops, w.id)
	} else {
		h.ops[w.id] = ws
	}
}

// finished hands a finished op to its waiters here.
func (h *hub) finished(op *opRow) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, w := range h.ops[op.ID] {
		select {
		case w.ch <- outcome{op: op}:
		default:
		}
	}
}

// hostDown tells the waiters of ops on the given hosts that they are down.
func (h *hub) hostDown(down map[string]bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, ws := range h.ops {
		for _, w := range ws {
			if down[w.host] {
				select {
				case w.ch <- outcome{hostDown: true}:
				default:
				}
			}
		}
	}
}

// vanished tells the waiters of the given ops that their op is gone.
func (h *hub) vanished(ids []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, id := range ids {
		for _, w := range h.ops[id] {
			select {
			case w.ch <- outcome{vanished: true}:
			default:
			}
		}
	}
}

// waitedSince lists the op ids waited on here since before t.
func (h *hub) waitedSince(t time.Time) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for id, ws := range h.ops {
		for _, w := range ws {
			if w.since.Before(t) {
				out = append(out, id)
				break
			}
		}
	}
	return out
}

// waitedOps lists the op ids waited on here.
func (h *hub) waitedOps() []string { return h.waitedSince(time.Now().Add(time.Hour)) }

func (h *hub) addPoll(hosts []string) *pollWaiter {
	p := &pollWaiter{hosts: hosts, ch: make(chan struct{}, 1)}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, host := range hosts {
		m := h.polls[host]
		if m == nil {
			m = map[*pollWaiter]struct{}{}
			h.polls[host] = m
		}
		m[p] = struct{}{}
	}
	return p
}

func (h *hub) removePoll(p *pollWaiter) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, host := range p.hosts {
		if m := h.polls[host]; m != nil {
			delete(m, p)
			if len(m) == 0 {
				delete(h.polls, host)
			}
		}
	}
}

func (h *hub) hasPolls() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.polls) > 0
}

// announce wakes the polls of host for a new op, once per op.
func (h *hub) announce(id, host string, created time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.announced[id]; ok {
		return
	}
	h.announced[id] = created
	for p := range h.polls[host] {
		select {
		case p.ch <- struct{}{}:
		default:
		}
	}
}

// forget drops announcements older than cutoff.
func (h *hub) forget(cutoff time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for id, t := range h.announced {
		if t.Before(cutoff) {
			delete(h.announced, id)
		}
	}
}

// announceLookback is how far back the watcher looks for pending ops made
// by other controllers: longer than any insert's commit takes, so that an
// op committed late is still found.
const announceLookback = 10 * time.Second

// Run keeps the fleet going until ctx ends: it polls the database for
// what other controllers did while anything waits here, fails calls whose
// host went down, and sweeps old ops, tokens and destroyed instances.
func (s *Service) Run(ctx context.Context) {
	t := time.NewTicker(s.cfg.PollInterval)
	defer t.Stop()
	var lastDown, lastLost, lastSweep time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now := s.now()
		if err := s.watchResults(ctx); err != nil && ctx.Err() == nil {
			s.log.Warn("fleet: polling results failed", "error", err)
		}
		if err := s.watchOps(ctx, now); err != nil && ctx.Err() == nil {
			s.log.Warn("fleet: polling ops failed", "error", err)
		}
		if now.Sub(lastDown) >= time.Second {
			lastDown = now
			if err := s.watchHosts(ctx, now); err != nil && ctx.Err() == nil {
				s.log.Warn("fleet: polling hosts failed", "error", err)
			}
		}
		// Commit latency is wall time, whatever the service's clock says.
		if wall := time.Now(); wall.Sub(lastLost) >= s.cfg.LostCheck {
			lastLost = wall
			if err := s.watchLost(ctx); err != nil && ctx.Err() == nil {
				s.log.Warn("fleet: looking for lost ops failed", "error", err)
			}
		}
		if now.Sub(lastSweep) >= time.Minute {
			lastSweep = now
			if err := s.sweep(ctx, now); err != nil && ctx.Err() == nil {
				s.log.Warn("fleet: sweep failed", "error", err)
			}
		}
	}
}

// inChunks calls f with the ids in chunks of at most 500, each as query
// arguments after lead, with as many placeholders: an IN list that stays
// under every engine's parameter cap.
func inChunks(ids []string, lead []any, f func(chunk []string, args []any, marks string) error) error {
	for len(ids) > 0 {
		chunk := ids[:min(len(ids), 500)]
		ids = ids[len(chunk):]
		args := append(make([]any, 0, len(lead)+len(chunk)), lead...)
		for _, id := range chunk {
			args = append(args, id)
		}
		if err := f(chunk, args, placeholders(len(chunk))); err != nil {
			return err
		}
	}
	return nil
}

// watchResults finds results posted to other controllers for ops waited
// on here.
func (s *Service) watchResults(ctx context.Context) error {
	return inChunks(s.hub.waitedOps(), []any{statePending}, func(_ []string, args []any, marks string) error {
		rows, err := s.db.Query(ctx, "SELECT "+opColumns+" FROM fleet_ops o WHERE state <> ? AND id IN ("+marks+")", args...)
		if err != nil {
			return err
		}
		var done []*opRow
		for rows.Next() {
			op, err := scanOp(rows)
			if err != nil {
				rows.Close()
				return err
			}
			done = append(done, op)
		}
		rows.Close()
		for _, op := range done {
			s.hub.finished(op)
		}
		return nil
	})
}

// watchLost ends the waits of ops that are no longer in the database. Only
// a commit lost with a database primary can do that (the sweep deletes
// only finished ops): the op's agent may never have seen it, or may have
// run it and had its result refused as unknown. Either way no result will
// come, and the caller asks again rather than wait for OpTimeout.
func (s *Service) watchLost(ctx context.Context) error {
	ids := s.hub.waitedSince(time.Now().Add(-s.cfg.LostCheck))
	return inChunks(ids, nil, func(chunk []string, args []any, marks string) error {
		rows, err := s.db.Query(ctx, "SELECT id FROM fleet_ops WHERE id IN ("+marks+")", args...)
		if err != nil {
			return err
		}
		found := make(map[string]bool, len(chunk))
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return err
			}
			found[id] = true
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		var lost []string
		for _, id := range chunk {
			if !found[id] {
				lost = append(lost, id)
			}
		}
		if len(lost) > 0 {
			s.log.Warn("fleet: ops lost from the database; their callers ask again", "ops", len(lost))
			s.hub.vanished(lost)
		}
		return nil
	})
}

// watchOps wakes the long-polls here for pending ops other controllers
// made.
func (s *Service) watchOps(ctx context.Context, now time.Time) error {
	s.hub.forget(now.Add(-3 * announceLookback))
	if !s.hub.hasPolls() {
		return nil
	}
	rows, err := s.db.Query(ctx, "SELECT id, host, created_at FROM fleet_ops WHERE state = ? AND created_at >= ?",
		statePending, store.FormatTime(now.Add(-announceLookback)))
	if err != nil {
		return err
	}
	type found struct {
		id, host string
		created  time.Time
	}
	var fs []found
	for rows.Next() {
		var f found
		var created string
		if err := rows.Scan(&f.id, &f.host, &created); err != nil {
			rows.Close()
			return err
		}
		f.created = store.ParseTime(created)
		fs = append(fs, f)
	}
	rows.Close()
	for _, f := range fs {
		s.hub.announce(f.id, f.host, f.created)
	}
	return rows.Err()
}

// watchHosts ends the waits of ops whose host is down.
func (s *Service) watchHosts(ctx context.Context, now time.Time) error {
	if len(s.hub.waitedOps()) == 0 {
		return nil
	}
	hs, err := s.loadHosts(ctx, s.db)
	if err != nil {
		return err
	}
	down := map[string]bool{}
	for _, h := range hs {
		if !s.isUp(h, now) {
			down[h.Name] = true
		}
	}
	if len(down) > 0 {
		s.hub.hostDown(down)
	}
	return nil
}

// opRetention is how long finished ops with a caller's key are kept: a
// caller asking again with the same key within it gets the recorded
// result.
const opRetention = 24 * time.Hour

// sweep fails pending ops older than OpTimeout (nobody waits for them any
// more), and deletes finished ops, used or expired tokens and destroyed
// instances once they can no longer matter.
func (s *Service) sweep(ctx context.Context, now time.Time) error {
	ts := store.FormatTime(now)
	if _, err := s.db.Exec(ctx, `UPDATE fleet_ops SET state = ?, error = ?, error_code = ?, done_at = ?, args = '{}'
 WHERE state = ? AND created_at < ?`, stateFailed, "expired: no agent took it in time", "failed", ts,
		statePending, store.FormatTime(now.Add(-s.cfg.OpTimeout))); err != nil {
		return err
	}
	// An op without a caller's key (its key is its id) is never asked for
	// again: once finished it is kept only for the operator's eyes.
	if _, err := s.db.Exec(ctx, `DELETE FROM fleet_ops WHERE state <> ? AND (created_at < ? OR (op_key = id AND created_at < ?))`,
		statePending, store.FormatTime(now.Add(-opRetention)), store.FormatTime(now.Add(-time.Hour))); err != nil {
		return err
	}
	if _, err := s.db.Exec(ctx, "DELETE FROM fleet_tokens WHERE expires_at < ?", store.FormatTime(now.Add(-7*24*time.Hour))); err != nil {
		return err
	}
	_, err := s.db.Exec(ctx, "DELETE FROM fleet_instances WHERE gone = 1 AND updated_at < ?", store.FormatTime(now.Add(-time.Hour)))
	return err
}

func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?,", n), ",")
}
