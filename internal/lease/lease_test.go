package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"nimbus/internal/store"
	"nimbus/internal/store/storetest"
)

// clock is a settable clock shared by a test's managers.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func openDB(t *testing.T, url string) *store.DB {
	t.Helper()
	db, err := store.Open(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// TestLeaseLife walks leases through their rules, step by step, on both
// engines: "A acquire x ok|no", "A hold x ok|lost", "A giveback x
// ok|lost", "A release x",
// "A renew", "wait D" (the clock moves), "others A x,y" (what A sees
// held by others), "A releaseall".
func TestLeaseLife(t *testing.T) {
	tests := []struct {
		name  string
		steps []string
	}{
		{"a free lease is taken once", []string{"A acquire x ok", "B acquire x no", "A acquire x ok", "others B x", "others A -"}},
		{"an expired lease is taken over and the old holder is fenced", []string{
			"A acquire x ok", "wait 16s", "B acquire x ok", "A hold x lost", "A acquire x no", "B hold x ok", "others A x"}},
		{"a held lease does not expire while renewed", []string{
			"A acquire x ok", "wait 10s", "A renew", "wait 10s", "B acquire x no", "A hold x ok", "wait 10s", "B acquire x no"}},
		{"an expired lease not taken is still its holder's", []string{"A acquire x ok", "wait 20s", "A hold x ok", "B acquire x no"}},
		{"release frees only one's own lease", []string{
			"A acquire x ok", "B release x", "B acquire x no", "A release x", "B acquire x ok", "others A x"}},
		{"renew touches only one's own leases", []string{
			"A acquire x ok", "B acquire y ok", "wait 10s", "A renew", "wait 10s", "C acquire x no", "C acquire y ok"}},
		{"releaseall gives every lease back at once", []string{
			"A acquire x ok", "A acquire y ok", "B acquire z ok", "A releaseall", "C acquire x ok", "C acquire y ok", "C acquire z no"}},
		{"a restarted holder takes its leases back at once", []string{"A acquire x ok", "A' acquire x ok", "B acquire x no"}},
		{"giveback frees one's own lease and fences a lost one", []string{
			"A acquire x ok", "B giveback x lost", "B acquire x no", "A giveback x ok", "A giveback x lost", "B acquire x ok",
			"wait 16s", "C acquire x ok", "B giveback x lost", "others A x"}},
	}
	storetest.ForEachEngine(t, func(t *testing.T, url string) {
		db := openDB(t, url)
		for i, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				ctx := context.Background()
				clk := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
				ms := map[string]*Manager{}
				mgr := func(who string) *Manager {
					holder := fmt.Sprintf("%s-%d", who[:1], i) // A' is A restarted: the same holder
					if ms[who] == nil {
						ms[who] = New(db, Config{Holder: holder, Now: clk.now})
					}
					return ms[who]
				}
				name := func(n string) string { return fmt.Sprintf("t%d/%s", i, n) }
				for _, st := range tc.steps {
					var who, verb, arg, want string
					fmt.Sscan(st, &who, &verb, &arg, &want)
					if who == "wait" {
						d, _ := time.ParseDuration(verb)
						clk.add(d)
						continue
					}
					if who == "others" {
						got, err := mgr(verb).HeldByOthers(ctx, fmt.Sprintf("t%d/", i))
						if err != nil {
							t.Fatal(err)
						}
						var names []string
						for n := range got {
							names = append(names, n[len(name("")):])
						}
						if fmt.Sprint(names) != fmt.Sprint(wantList(arg)) {
							t.Fatalf("%s: got %v", st, names)
						}
						continue
					}
					m := mgr(who)
					switch verb {
					case "acquire":
						ok, err := m.Acquire(ctx, name(arg))
						if err != nil || ok != (want == "ok") {
							t.Fatalf("%s: got %v %v", st, ok, err)
						}
					case "hold":
						err := db.Tx(ctx, func(tx *store.Tx) error { return m.Hold(ctx, tx, name(arg)) })
						if (err == nil) != (want == "ok") || (err != nil && !errors.Is(err, ErrLost)) {
							t.Fatalf("%s: got %v", st, err)
						}
					case "giveback":
						err := db.Tx(ctx, func(tx *store.Tx) error { return m.GiveBack(ctx, tx, name(arg)) })
						if (err == nil) != (want == "ok") || (err != nil && !errors.Is(err, ErrLost)) {
							t.Fatalf("%s: got %v", st, err)
						}
					case "release":
						if err := m.Release(ctx, db, name(arg)); err != nil {
							t.Fatalf("%s: %v", st, err)
						}
					case "renew":
						if err := m.Renew(ctx); err != nil {
							t.Fatalf("%s: %v", st, err)
						}
					case "releaseall":
						if err := m.ReleaseAll(ctx); err != nil {
							t.Fatalf("%s: %v", st, err)
						}
					default:
						t.Fatalf("bad step %q", st)
					}
				}
			})
		}
	})
}

func wantList(s string) []string {
	if s == "-" {
		return nil
	}
	return []string{s}
}

// TestAcquireRace: controllers that try the same free or expired lease at
// the same moment, each on its own connection, leave it with exactly one.
func TestAcquireRace(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, url string) {
		ctx := context.Background()
		clk := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
		var ms []*Manager
		for i := range 8 {
			ms = append(ms, New(openDB(t, url), Config{Holder: fmt.Sprint("c", i), Now: clk.now}))
		}
		for round := range 20 {
			if round%2 == 1 {
				clk.add(DefaultTTL + time.Second) // the last winner's lease expires
			}
			var won atomic.Int32
			var wg sync.WaitGroup
			start := make(chan struct{})
			for _, m := range ms {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					ok, err := m.Acquire(ctx, fmt.Sprint("race/", round/2))
					if err != nil {
						t.Error(err)
					}
					if ok {
						won.Add(1)
					}
				}()
			}
			close(start)
			wg.Wait()
			if won.Load() != 1 {
				t.Fatalf("round %d: %d controllers hold the lease", round, won.Load())
			}
		}
	})
}

// TestHoldFencesTakeover: a holder whose lease expired and who commits
// under Hold keeps it; a controller trying to take it meanwhile waits for
// that commit and is refused, so the two never both commit.
func TestHoldFencesTakeover(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, url string) {
		ctx := context.Background()
		clk := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
		a := New(openDB(t, url), Config{Holder: "a", Now: clk.now})
		b := New(openDB(t, url), Config{Holder: "b", Now: clk.now})
		if ok, err := a.Acquire(ctx, "x"); !ok || err != nil {
			t.Fatal(ok, err)
		}
		clk.add(DefaultTTL + time.Second)
		held := make(chan struct{})
		commit := make(chan struct{})
		var bGot bool
		var bErr error
		done := make(chan struct{})
		go func() {
			<-held
			bGot, bErr = b.Acquire(ctx, "x")
			close(done)
		}()
		err := a.db.Tx(ctx, func(tx *store.Tx) error {
			if err := a.Hold(ctx, tx, "x"); err != nil {
				return err
			}
			close(held)
			go func() { time.Sleep(200 * time.Millisecond); close(commit) }()
			<-commit
			select {
			case <-done:
				return errors.New("the takeover did not wait for the holder's commit")
			default:
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		<-done
		if bErr != nil || bGot {
			t.Fatalf("takeover during the holder's fenced commit: got %v %v", bGot, bErr)
		}
	})
}

// TestJobOncePerPeriod: controllers offering the same job at once run it
// once; it is not due again until its period has passed since that run;
// a failed run leaves it due.
func TestJobOncePerPeriod(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, url string) {
		ctx := context.Background()
		clk := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
		var runs atomic.Int32
		var fail atomic.Bool
		job := Job{Name: "sweep", Next: Every(time.Minute), Check: time.Second, Run: func(context.Context) error {
			runs.Add(1)
			time.Sleep(50 * time.Millisecond) // the others arrive while it runs
			if fail.Load() {
				return errors.New("failed")
			}
			return nil
		}}
		var ms []*Manager
		for i := range 3 {
			ms = append(ms, New(openDB(t, url), Config{Holder: fmt.Sprint("c", i), Now: clk.now}))
		}
		offer := func() {
			var wg sync.WaitGroup
			for _, m := range ms {
				wg.Add(1)
				go func() { defer wg.Done(); m.RunJob(ctx, job) }()
			}
			wg.Wait()
		}
		expect := func(what string, want int32, wantRuns int64) {
			t.Helper()
			if got := runs.Load(); got != want {
				t.Fatalf("%s: the job ran %d times, want %d", what, got, want)
			}
			_, n, err := ms[0].LastRun(ctx, "sweep")
			if err != nil || n != wantRuns {
				t.Fatalf("%s: %d runs recorded (%v), want %d", what, n, err, wantRuns)
			}
		}
		offer()
		expect("three controllers at once", 1, 1)
		offer()
		clk.add(59 * time.Second)
		offer()
		expect("within the period", 1, 1)
		clk.add(time.Second)
		offer()
		expect("a period later", 2, 2)
		clk.add(time.Minute)
		fail.Store(true)
		offer()
		// At least one controller tried; no failed run is recorded.
		if got := runs.Load(); got < 3 {
			t.Fatalf("a failing job ran %d times in all", got)
		}
		_, n, _ := ms[0].LastRun(ctx, "sweep")
		if n != 2 {
			t.Fatalf("a failed run was recorded: %d runs", n)
		}
		fail.Store(false)
		before := runs.Load()
		offer()
		expect("after the failure", before+1, 3)
	})
}

// TestTakeFree: in the transaction that writes new work, the free leases
// of a batch are taken at once; one held by anyone, even expired, is
// left to Acquire; a rolled-back transaction takes nothing.
func TestTakeFree(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, url string) {
		ctx := context.Background()
		db := openDB(t, url)
		clk := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
		a := New(db, Config{Holder: "a", Now: clk.now})
		b := New(db, Config{Holder: "b", Now: clk.now})
		if ok, err := a.Acquire(ctx, "x"); !ok || err != nil {
			t.Fatal(ok, err)
		}
		clk.add(DefaultTTL + time.Second) // a's lease on x has expired
		var names []string
		for i := range 450 { // more than one statement's worth
			names = append(names, fmt.Sprint("n", i))
		}
		var taken []string
		err := db.Tx(ctx, func(tx *store.Tx) error {
			var err error
			taken, err = b.TakeFree(ctx, tx, append([]string{"x"}, names...)...)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(taken) != fmt.Sprint(names) {
			t.Fatalf("took %d leases (first %v), want the %d free ones", len(taken), taken[:min(3, len(taken))], len(names))
		}
		if ok, _ := a.Acquire(ctx, "n7"); ok {
			t.Fatal("a took a lease b had taken")
		}
		if ok, _ := b.Acquire(ctx, "x"); !ok {
			t.Fatal("the expired lease was not left to Acquire")
		}
		errRollback := errors.New("rollback")
		err = db.Tx(ctx, func(tx *store.Tx) error {
			if _, err := a.TakeFree(ctx, tx, "gone"); err != nil {
				return err
			}
			return errRollback
		})
		if !errors.Is(err, errRollback) {
			t.Fatal(err)
		}
		if ok, _ := b.Acquire(ctx, "gone"); !ok {
			t.Fatal("a rolled-back TakeFree held its lease")
		}
	})
}
