package fleet

import (
	"context"
	"sync"
	"time"

	"nimbus/internal/store"
)

// committer runs the fleet's small, frequent writes (new ops, results)
// together: while one transaction commits, the next writes queue, and one
// transaction then commits them all. On SQLite, with one writer at a time,
// this keeps the fleet from adding a writer per op to the queue compute's
// own writes wait in; on PostgreSQL it saves commits.
//
// Commits are synchronous: an agent acts on what they record (it runs an
// op it was given, forgets a result it was told is stored), so a commit
// must survive the database primary's death as any client's write does.
type committer struct {
	db    *store.DB
	mu    sync.Mutex
	queue []*commitItem
	busy  bool
}

type commitItem struct {
	f    func(ctx context.Context, tx *store.Tx) error
	done chan error
}

// do runs f in a transaction shared with other writes. f may run more than
// once (a retried or split batch), so it must start from scratch each
// time. When ctx ends first, f may still commit.
func (c *committer) do(ctx context.Context, f func(ctx context.Context, tx *store.Tx) error) error {
	it := &commitItem{f: f, done: make(chan error, 1)}
	c.mu.Lock()
	c.queue = append(c.queue, it)
	lead := !c.busy
	c.busy = true
	c.mu.Unlock()
	if lead {
		go c.lead()
	}
	select {
	case err := <-it.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// lead commits batches until the queue is empty.
func (c *committer) lead() {
	for {
		c.mu.Lock()
		batch := c.queue
		c.queue = nil
		if len(batch) == 0 {
			c.busy = false
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		c.run(batch)
	}
}

// maxBatchWait bounds one batch's transaction.
const maxBatchWait = 30 * time.Second

func (c *committer) run(batch []*commitItem) {
	ctx, cancel := context.WithTimeout(context.Background(), maxBatchWait)
	defer cancel()
	err := c.db.Tx(ctx, func(tx *store.Tx) error {
		for _, it := range batch {
			if err := it.f(ctx, tx); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil || len(batch) == 1 {
		for _, it := range batch {
			it.done <- err
		}
		return
	}
	// One write failed the batch (a key another controller took, say):
	// run each alone, so that the others commit and it gets its own error.
	for _, it := range batch {
		it.done <- c.db.Tx(ctx, func(tx *store.Tx) error { return it.f(ctx, tx) })
	}
}
