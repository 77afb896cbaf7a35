// Package workqueue is the queue that the background workers of compute
// (the reconcile loop, one key per server) and of volumes (one key per
// volume) take their work from.
//
// A key is queued at most once, and one worker holds it at a time: a key
// added while a worker holds it is handed out again when that worker is
// done. A key whose work failed comes back after a delay of its own, which
// doubles with each failure in a row up to a cap, so that one failing key
// neither spins nor holds back the others; a success, or a new request for
// the key (Add), starts it again from the shortest delay.
package workqueue

import (
	"sync"
	"time"
)

// Timer is a scheduled retry; Stop cancels it.
type Timer interface{ Stop() bool }

// Config sets a queue's retry delays.
type Config struct {
	// Backoff is the delay before the first retry of a failed key; each
	// further failure in a row doubles it, up to MaxBackoff.
	Backoff, MaxBackoff time.Duration
	// AfterFunc runs f after d (nil: time.AfterFunc); tests give a fake
	// clock here.
	AfterFunc func(d time.Duration, f func()) Timer
}

// Queue is a deduplicating FIFO of keys with per-key backoff. Its zero
// value is not usable; make one with New.
type Queue struct {
	cfg Config

	mu      sync.Mutex
	cond    *sync.Cond
	order   []string
	queued  map[string]bool
	running map[string]bool
	again   map[string]bool   // added while running: hand out again
	fails   map[string]int    // failures in a row, per key
	retries map[string]*retry // pending retries, per key
	closed  bool

	workers sync.WaitGroup
}

// retry is one pending retry; a timer that fires after being replaced
// finds its retry gone from the map and does nothing.
type retry struct{ t Timer }

// New makes a queue.
func New(cfg Config) *Queue {
	if cfg.AfterFunc == nil {
		cfg.AfterFunc = func(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }
	}
	if cfg.MaxBackoff < cfg.Backoff {
		cfg.MaxBackoff = cfg.Backoff
	}
	q := &Queue{cfg: cfg, queued: map[string]bool{}, running: map[string]bool{}, again: map[string]bool{},
		fails: map[string]int{}, retries: map[string]*retry{}}
	q.cond = sync.NewCond(&q.mu)
	return q
}

// Add queues key as a new request: at once, with its backoff reset and any
// pending retry of it cancelled.
func (q *Queue) Add(key string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return
	}
	delete(q.fails, key)
	q.cancelRetry(key)
	q.push(key)
}

// Poke queues key if nothing is under way for it: not queued, not being
// worked on, not waiting for a retry. A periodic look for owed work
// (level-triggered, from recorded state) pokes what it finds, so that it
// neither resets a failing key's backoff nor hands out a key twice.
func (q *Queue) Poke(key string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed || q.queued[key] || q.running[key] || q.retries[key] != nil {
		return
	}
	q.push(key)
}

// push queues key unless it is queued already; a key being worked on is
// marked to be handed out again. Called with mu held.
func (q *Queue) push(key string) {
	switch {
	case q.running[key]:
		q.again[key] = true
	case !q.queued[key]:
		q.queued[key] = true
		q.order = append(q.order, key)
		q.cond.Signal()
	}
}

func (q *Queue) cancelRetry(key string) {
	if r := q.retries[key]; r != nil {
		r.t.Stop()
		delete(q.retries, key)
	}
}

// Get blocks for the next key; ok is false once the queue is shut down.
// The caller must call Done with the key when its work ends.
func (q *Queue) Get() (key string, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.order) == 0 && !q.closed {
		q.cond.Wait()
	}
	if q.closed {
		return "", false
	}
	key = q.order[0]
	q.order = q.order[1:]
	delete(q.queued, key)
	q.running[key] = true
	return key, true
}

// Done ends the work on key that Get handed out. A key added meanwhile is
// queued again at once, as a new request; otherwise a failure (err not
// nil) retries the key after its backoff, and a success resets it.
func (q *Queue) Done(key string, err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.running, key)
	again := q.again[key]
	delete(q.again, key)
	switch {
	case q.closed:
	case again:
		delete(q.fails, key)
		q.push(key)
	case err == nil:
		delete(q.fails, key)
	default:
		d := q.delay(q.fails[key])
		q.fails[key]++
		q.cancelRetry(key)
		r := &retry{}
		q.retries[key] = r
		r.t = q.cfg.AfterFunc(d, func() { q.fire(key, r) })
	}
}

// fire queues a key whose retry is due, keeping its failure count.
func (q *Queue) fire(key string, r *retry) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed || q.retries[key] != r {
		return // cancelled, or replaced by a newer retry
	}
	delete(q.retries, key)
	q.push(key)
}

// delay is the backoff after n earlier failures in a row.
func (q *Queue) delay(n int) time.Duration {
	d := q.cfg.Backoff
	for ; n > 0 && d < q.cfg.MaxBackoff; n-- {
		d *= 2
	}
	return min(d, q.cfg.MaxBackoff)
}

// Work starts n workers that take keys and run work on each, retrying a
// key whose work returns an error. They stop at Shutdown.
func (q *Queue) Work(n int, work func(key string) error) {
	for range n {
		q.workers.Add(1)
		go func() {
			defer q.workers.Done()
			for {
				key, ok := q.Get()
				if !ok {
					return
				}
				q.Done(key, work(key))
			}
		}()
	}
}

// Shutdown stops handing out keys, cancels pending retries and waits for
// the workers' current work to end. Keys still queued are dropped: their
// owners find them again from the store (compute looks for owed work
// every few seconds, from recorded state).
func (q *Queue) Shutdown() {
	q.mu.Lock()
	q.closed = true
	for key := range q.retries {
		q.cancelRetry(key)
	}
	q.mu.Unlock()
	q.cond.Broadcast()
	q.workers.Wait()
}
