package lease

import (
	"context"
	"time"

	"nimbus/internal/store"
)

// Job is work one controller of a region does at a time, when it is due:
// a pass or sweep every controller offers to run, which runs once per
// period whichever controllers are alive.
type Job struct {
	// Name names the job and its lease ("job/" + Name).
	Name string
	// Next is when the job is due again after a run that started at last
	// (the zero time when it never ran).
	Next func(last time.Time) time.Time
	// Check bounds how long a controller waits before it looks again
	// whether the job is due: another may have run it, or died.
	Check time.Duration
	// Run does the job; an error leaves it due, tried at the next look.
	Run func(ctx context.Context) error
}

// Every is a Job's Next for a job due period after its last run.
func Every(period time.Duration) func(last time.Time) time.Time {
	return func(last time.Time) time.Time { return last.Add(period) }
}

// JobLease is the name of job's lease.
func JobLease(job string) string { return "job/" + job }

// LastRun is when job's last complete run started and how many complete
// runs it had; the zero time and 0 when it never ran.
func (m *Manager) LastRun(ctx context.Context, job string) (time.Time, int64, error) {
	var last string
	var runs int64
	err := m.db.QueryRow(ctx, "SELECT last_run, runs FROM lease_jobs WHERE name = ?", job).Scan(&last, &runs)
	if store.IsNoRows(err) {
		return time.Time{}, 0, nil
	}
	return store.ParseTime(last), runs, err
}

// RunJob runs j when it is due and its lease is free, and records the
// run in the same transaction that checks the lease is still held. It
// answers whether it ran j and when j is due next as far as it knows.
func (m *Manager) RunJob(ctx context.Context, j Job) (ran bool, next time.Time, err error) {
	last, _, err := m.LastRun(ctx, j.Name)
	if err != nil {
		return false, time.Time{}, err
	}
	if next = j.Next(last); m.now().Before(next) {
		return false, next, nil
	}
	name := JobLease(j.Name)
	if ok, err := m.Acquire(ctx, name); err != nil || !ok {
		return false, next, err
	}
	defer func() {
		if rerr := m.Release(context.WithoutCancel(ctx), m.db, name); rerr != nil {
			m.log.Warn("lease: giving a job's lease back failed", "job", j.Name, "error", rerr)
		}
	}()
	// Under the lease: another controller may have run it just now.
	if last, _, err = m.LastRun(ctx, j.Name); err != nil {
		return false, next, err
	}
	if next = j.Next(last); m.now().Before(next) {
		return false, next, nil
	}
	start := m.now()
	if err := j.Run(ctx); err != nil {
		return true, next, err
	}
	err = m.db.Tx(ctx, func(tx *store.Tx) error {
		if err := m.Hold(ctx, tx, name); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `INSERT INTO lease_jobs (name, last_run, runs, holder) VALUES (?, ?, 1, ?)
 ON CONFLICT (name) DO UPDATE SET last_run = excluded.last_run, runs = lease_jobs.runs + 1, holder = excluded.holder`,
			j.Name, store.FormatTime(start), m.holder)
		return err
	})
	return true, j.Next(start), err
}

// Loop offers to run j until ctx ends: it looks when j is due, and at
// least every j.Check.
func (m *Manager) Loop(ctx context.Context, j Job) {
	for {
		_, next, err := m.RunJob(ctx, j)
		if err != nil && ctx.Err() == nil {
			m.log.Error("lease: job failed", "job", j.Name, "error", err)
		}
		wait := jitter(j.Check)
		if err == nil {
			if d := next.Sub(m.now()); d < wait {
				wait = max(d, 0) + jitter(time.Second)/10
			}
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}
