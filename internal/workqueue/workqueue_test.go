package workqueue

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeClock records the retries a queue schedules; the test fires them.
type fakeClock struct {
	timers []*fakeTimer
}

type fakeTimer struct {
	d       time.Duration
	f       func()
	stopped bool
}

func (t *fakeTimer) Stop() bool { was := !t.stopped; t.stopped = true; return was }

func (c *fakeClock) afterFunc(d time.Duration, f func()) Timer {
	t := &fakeTimer{d: d, f: f}
	c.timers = append(c.timers, t)
	return t
}

func (c *fakeClock) delays() []time.Duration {
	var out []time.Duration
	for _, t := range c.timers {
		out = append(out, t.d)
	}
	return out
}

var errStep = errors.New("step failed")

// TestBackoff drives a queue step by step: "add K", "get K" (the next key
// handed out must be K), "done K ok|fail", "run K ok|fail" (get then done),
// "fire" (the newest live retry comes due), "fire-stopped" (a cancelled
// retry's timer fires anyway, as one racing its Stop does). It checks the
// delays scheduled, in order, and what is left queued.
func TestBackoff(t *testing.T) {
	ms := time.Millisecond
	fail := func(k string, n int) []string {
		var out []string
		for range n {
			out = append(out, "run "+k+" fail", "fire")
		}
		return out
	}
	tests := []struct {
		name       string
		steps      []string
		wantDelays []time.Duration
		wantQueued []string
	}{
		{
			name:       "a failing key backs off doubling to the cap",
			steps:      append([]string{"add a"}, fail("a", 9)...),
			wantDelays: []time.Duration{500 * ms, time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 32 * time.Second, time.Minute, time.Minute},
			wantQueued: []string{"a"},
		},
		{
			name:       "a success resets the backoff",
			steps:      append(append([]string{"add a"}, fail("a", 3)...), "run a ok", "add a", "run a fail"),
			wantDelays: []time.Duration{500 * ms, time.Second, 2 * time.Second, 500 * ms},
		},
		{
			name:       "a new request cancels the pending retry and resets the backoff",
			steps:      append(append([]string{"add a"}, fail("a", 2)...), "run a fail", "add a", "get a", "fire-stopped", "done a fail"),
			wantDelays: []time.Duration{500 * ms, time.Second, 2 * time.Second, 500 * ms},
		},
		{
			name:       "a request while the key is worked on hands it out again at once, reset",
			steps:      append(append([]string{"add a"}, fail("a", 2)...), "get a", "add a", "done a fail", "run a fail"),
			wantDelays: []time.Duration{500 * ms, time.Second, 500 * ms},
		},
		{
			name:       "keys back off independently",
			steps:      append(append([]string{"add a"}, fail("a", 3)...), "add b", "run a fail", "run b fail"),
			wantDelays: []time.Duration{500 * ms, time.Second, 2 * time.Second, 4 * time.Second, 500 * ms},
		},
		{
			name:       "a key is queued once however often it is added",
			steps:      []string{"add a", "add b", "add a", "add a"},
			wantQueued: []string{"a", "b"},
		},
		{
			name:       "a poke queues an idle key once",
			steps:      []string{"poke a", "poke a", "add b", "poke a"},
			wantQueued: []string{"a", "b"},
		},
		{
			name:       "a poke neither cuts a retry short nor resets the backoff",
			steps:      append(append([]string{"add a"}, fail("a", 2)...), "run a fail", "poke a", "fire", "run a fail"),
			wantDelays: []time.Duration{500 * ms, time.Second, 2 * time.Second, 4 * time.Second},
		},
		{
			name:       "a poke while the key is worked on does not hand it out again",
			steps:      []string{"add a", "get a", "poke a", "done a ok"},
			wantQueued: nil,
		},
		{
			name:       "a failing key waits its turn behind others",
			steps:      []string{"add a", "add b", "run a fail", "fire", "run b ok"},
			wantDelays: []time.Duration{500 * ms},
			wantQueued: []string{"a"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			clk := &fakeClock{}
			q := New(Config{Backoff: 500 * ms, MaxBackoff: time.Minute, AfterFunc: clk.afterFunc})
			for i, step := range tc.steps {
				if err := apply(q, clk, step); err != nil {
					t.Fatalf("step %d %q: %v", i, step, err)
				}
			}
			if got := clk.delays(); !slices.Equal(got, tc.wantDelays) {
				t.Errorf("delays %v, want %v", got, tc.wantDelays)
			}
			if !slices.Equal(q.order, tc.wantQueued) {
				t.Errorf("queued %v, want %v", q.order, tc.wantQueued)
			}
		})
	}
}

func apply(q *Queue, clk *fakeClock, step string) error {
	f := strings.Fields(step)
	switch f[0] {
	case "add":
		q.Add(f[1])
	case "poke":
		q.Poke(f[1])
	case "get":
		return get(q, f[1])
	case "done":
		q.Done(f[1], outcome(f[2]))
	case "run":
		if err := get(q, f[1]); err != nil {
			return err
		}
		q.Done(f[1], outcome(f[2]))
	case "fire", "fire-stopped":
		stopped := f[0] == "fire-stopped"
		for i := len(clk.timers) - 1; i >= 0; i-- {
			if tm := clk.timers[i]; tm.stopped == stopped {
				tm.stopped = true
				tm.f()
				return nil
			}
		}
		return errors.New("no such timer")
	}
	return nil
}

func outcome(s string) error {
	if s == "fail" {
		return errStep
	}
	return nil
}

// get takes the next key without blocking on an empty queue.
func get(q *Queue, want string) error {
	q.mu.Lock()
	n := len(q.order)
	q.mu.Unlock()
	if n == 0 {
		return errors.New("queue empty")
	}
	if k, _ := q.Get(); k != want {
		return errors.New("got " + k)
	}
	return nil
}

// TestWorkers runs real workers on short real delays: a key that fails
// three times is retried until it succeeds, another key is served in the
// meantime, and Shutdown returns once the work ends. Only counts and order
// are checked, never durations.
func TestWorkers(t *testing.T) {
	q := New(Config{Backoff: time.Millisecond, MaxBackoff: 4 * time.Millisecond})
	var mu sync.Mutex
	var log []string
	done := make(chan struct{})
	q.Work(2, func(key string) error {
		mu.Lock()
		defer mu.Unlock()
		log = append(log, key)
		if key == "a" && countOf(log, "a") <= 3 {
			return errStep
		}
		if key == "a" {
			close(done)
		}
		return nil
	})
	q.Add("a")
	q.Add("b")
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("key a never succeeded")
	}
	q.Shutdown()
	mu.Lock()
	defer mu.Unlock()
	if countOf(log, "a") != 4 || countOf(log, "b") != 1 {
		t.Fatalf("attempts %v: want a four times, b once", log)
	}
	q.Add("c") // after Shutdown: dropped
	if len(q.order) != 0 {
		t.Fatalf("queued after shutdown: %v", q.order)
	}
}

func countOf(xs []string, x string) int {
	n := 0
	for _, v := range xs {
		if v == x {
			n++
		}
	}
	return n
}
