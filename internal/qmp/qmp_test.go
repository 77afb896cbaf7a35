package qmp

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// fakeConn is the server side of one QMP connection in the fake server.
type fakeConn struct {
	t   *testing.T
	c   net.Conn
	br  *bufio.Reader
	wmu sync.Mutex
}

type request struct {
	Execute   string          `json:"execute"`
	Arguments json.RawMessage `json:"arguments"`
	ID        json.RawMessage `json:"id"`
}

// send writes raw lines, each terminated by "\n" unless it already ends in "\n".
func (f *fakeConn) send(lines ...string) {
	f.wmu.Lock()
	defer f.wmu.Unlock()
	for _, l := range lines {
		if !strings.HasSuffix(l, "\n") {
			l += "\n"
		}
		if _, err := io.WriteString(f.c, l); err != nil {
			return // the client went away; the test itself reports what matters
		}
	}
}

func (f *fakeConn) reply(r request, ret string) {
	f.send(fmt.Sprintf(`{"return": %s, "id": %s}`, ret, r.ID))
}

func (f *fakeConn) replyErr(r request, class, desc string) {
	f.send(fmt.Sprintf(`{"id": %s, "error": {"class": %q, "desc": %q}}`, r.ID, class, desc))
}

func (f *fakeConn) event(name, data string) {
	f.send(fmt.Sprintf(`{"timestamp": {"seconds": 1700000000, "microseconds": 5}, "event": %q, "data": %s}`, name, data))
}

// recv reads the next command; ok is false when the client has gone.
func (f *fakeConn) recv() (r request, ok bool) {
	line, err := f.br.ReadBytes('\n')
	if err != nil {
		return r, false
	}
	if err := json.Unmarshal(line, &r); err != nil {
		f.t.Errorf("fake server: bad command line %q: %v", line, err)
		return r, false
	}
	return r, true
}

// handshake sends the greeting and answers qmp_capabilities.
func (f *fakeConn) handshake() bool {
	f.send(`{"QMP": {"version": {"qemu": {"micro": 22, "minor": 2, "major": 7}}, "capabilities": ["oob"]}}`)
	r, ok := f.recv()
	if !ok {
		return false
	}
	if r.Execute != "qmp_capabilities" {
		f.t.Errorf("first command %q, want qmp_capabilities", r.Execute)
	}
	f.reply(r, "{}")
	return true
}

// serveAt runs serve for each connection to a unix socket at path. Cleanup
// closes the listener and connections and waits for the handlers.
func serveAt(t *testing.T, path string, serve func(f *fakeConn)) {
	t.Helper()
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				defer c.Close()
				serve(&fakeConn{t: t, c: c, br: bufio.NewReader(c)})
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
}

// fakeServer serves a fresh socket: the handshake, then handle for each command.
func fakeServer(t *testing.T, handle func(f *fakeConn, r request)) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "qmp.sock")
	serveAt(t, path, func(f *fakeConn) {
		if !f.handshake() {
			return
		}
		for {
			r, ok := f.recv()
			if !ok {
				return
			}
			handle(f, r)
		}
	})
	return path
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

func dial(t *testing.T, path string) *Monitor {
	t.Helper()
	m, err := Dial(ctxT(t, 5*time.Second), path)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// next receives one event or fails after a timeout.
func next(t *testing.T, ch <-chan Event) (Event, bool) {
	t.Helper()
	select {
	case ev, ok := <-ch:
		return ev, ok
	case <-time.After(5 * time.Second):
		t.Fatal("timed out waiting for an event")
		return Event{}, false
	}
}

func TestExecute(t *testing.T) {
	replies := map[string]string{
		"query-version": `{"return": {"qemu": {"major": 7, "minor": 2}}, "id": ID}`,
		"fail":          `{"id": ID, "error": {"class": "GenericError", "desc": "boom"}}`,
		"bad-error":     `{"error": "oops", "id": ID}`,
		"no-return":     `{"id": ID}`,
		"string":        `{"return": "text", "id": ID}`,
	}
	path := fakeServer(t, func(f *fakeConn, r request) {
		if r.Execute == "echo" { // the arguments back, "none" when omitted
			if r.Arguments == nil {
				f.reply(r, `"none"`)
			} else {
				f.reply(r, string(r.Arguments))
			}
			return
		}
		f.send(strings.ReplaceAll(replies[r.Execute], "ID", string(r.ID)))
	})
	m := dial(t, path)

	type version struct{ QEMU struct{ Major, Minor int } }
	for _, tc := range []struct {
		name    string
		command string
		args    any
		result  any
		want    any    // expected *result
		wantErr string // substring; "" = success
		class   string // expected *Error class
	}{
		{name: "return decoded", command: "query-version", result: new(version),
			want: version{QEMU: struct{ Major, Minor int }{7, 2}}},
		{name: "arguments marshalled", command: "echo", args: map[string]int{"a": 1}, result: new(map[string]int),
			want: map[string]int{"a": 1}},
		{name: "nil arguments omitted", command: "echo", result: new(string), want: "none"},
		{name: "nil result ignores return", command: "query-version"},
		{name: "qemu error", command: "fail", wantErr: "boom", class: "GenericError"},
		{name: "malformed error object", command: "bad-error", wantErr: "malformed", class: "GenericError"},
		{name: "reply without return", command: "no-return", wantErr: "without return"},
		{name: "return of wrong type", command: "string", result: new(version), wantErr: "decoding return"},
		{name: "unmarshalable arguments", command: "echo", args: func() {}, wantErr: "unsupported type"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := m.Execute(ctxT(t, 5*time.Second), tc.command, tc.args, tc.result)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("Execute: %v", err)
				}
				if tc.want != nil {
					got, _ := json.Marshal(tc.result)
					want, _ := json.Marshal(tc.want)
					if string(got) != string(want) {
						t.Fatalf("result %s, want %s", got, want)
					}
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
			}
			qe, isQMP := errors.AsType[*Error](err)
			if isQMP != (tc.class != "") || (isQMP && qe.Class != tc.class) {
				t.Fatalf("error %#v: want *Error of class %q", err, tc.class)
			}
		})
	}
}

// Twenty commands in flight at once, answered in reverse order with events in
// between: every caller gets its own reply.
func TestConcurrentExecuteOutOfOrder(t *testing.T) {
	const n = 20
	path := filepath.Join(t.TempDir(), "qmp.sock")
	serveAt(t, path, func(f *fakeConn) {
		if !f.handshake() {
			return
		}
		var reqs []request
		for len(reqs) < n {
			r, ok := f.recv()
			if !ok {
				return
			}
			reqs = append(reqs, r)
		}
		for i := len(reqs) - 1; i >= 0; i-- {
			f.event("TICK", fmt.Sprintf(`{"i": %d}`, i))
			f.reply(reqs[i], string(reqs[i].Arguments))
		}
		f.recv() // wait for the client to go
	})
	m := dial(t, path)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			var got struct{ N int }
			if err := m.Execute(ctxT(t, 5*time.Second), "echo", map[string]int{"n": i}, &got); err != nil {
				t.Errorf("goroutine %d: %v", i, err)
			} else if got.N != i {
				t.Errorf("goroutine %d got reply for %d", i, got.N)
			}
		})
	}
	wg.Wait()
	for range n {
		if ev, _ := next(t, m.Events()); ev.Name != "TICK" {
			t.Fatalf("event %q, want TICK", ev.Name)
		}
	}
}

// 10,000 events nobody reads must not hold up replies; they then arrive in order.
func TestEventFloodDoesNotBlockAndKeepsOrder(t *testing.T) {
	const n = 10000
	path := fakeServer(t, func(f *fakeConn, r request) {
		if r.Execute == "flood" {
			var b strings.Builder // one write: far more than any socket buffer
			for i := range n {
				fmt.Fprintf(&b, `{"timestamp": {"seconds": 1700000000, "microseconds": 5}, "event": "TICK", "data": {"seq": %d}}`+"\n", i)
			}
			f.send(b.String())
		}
		f.reply(r, "{}")
	})
	m := dial(t, path)
	sub, cancel := m.Subscribe("TICK") // also unread during the flood
	defer cancel()
	if err := m.Execute(ctxT(t, 10*time.Second), "flood", nil, nil); err != nil {
		t.Fatalf("flood: %v", err)
	}
	if err := m.Execute(ctxT(t, 10*time.Second), "ping", nil, nil); err != nil {
		t.Fatalf("ping after flood: %v", err)
	}
	for _, ch := range []<-chan Event{m.Events(), sub} {
		for i := range n {
			ev, ok := next(t, ch)
			var d struct{ Seq int }
			if !ok || json.Unmarshal(ev.Data, &d) != nil || d.Seq != i {
				t.Fatalf("event %d: got %q %s (ok=%v)", i, ev.Name, ev.Data, ok)
			}
			if want := time.Unix(1700000000, 5000); !ev.Time.Equal(want) {
				t.Fatalf("time %v, want %v", ev.Time, want)
			}
		}
	}
	if first, again := m.Events(), m.Events(); first != again {
		t.Fatal("Events returned different channels")
	}
}

func TestSubscribe(t *testing.T) {
	path := fakeServer(t, func(f *fakeConn, r request) {
		if r.Execute == "go" {
			f.event("RESUME", "{}")
			f.event("STOP", "{}")
			f.event("SHUTDOWN", `{"guest": true, "reason": "guest-shutdown"}`)
		}
		f.reply(r, "{}")
	})
	m := dial(t, path)
	stops, cancelStops := m.Subscribe("STOP")
	two, cancelTwo := m.Subscribe("STOP", "RESUME")
	defer cancelTwo()
	all, cancelAll := m.Subscribe()
	defer cancelAll()
	// Nobody reads Events() here: the subscriptions must not care.
	if err := m.Execute(ctxT(t, 5*time.Second), "go", nil, nil); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name string
		ch   <-chan Event
		want []string
	}{
		{"one name", stops, []string{"STOP"}},
		{"two names", two, []string{"RESUME", "STOP"}},
		{"all", all, []string{"RESUME", "STOP", "SHUTDOWN"}},
	} {
		for _, w := range tc.want {
			if ev, _ := next(t, tc.ch); ev.Name != w {
				t.Fatalf("%s: got %q, want %q", tc.name, ev.Name, w)
			}
		}
	}
	cancelStops()
	cancelStops() // idempotent
	if _, ok := next(t, stops); ok {
		t.Fatal("cancelled subscription still open")
	}

	// WaitEvent skips what it was not asked for.
	if err := m.Execute(ctxT(t, 5*time.Second), "go", nil, nil); err != nil {
		t.Fatal(err)
	}
	ev, err := WaitEvent(ctxT(t, 5*time.Second), all, "SHUTDOWN")
	if err != nil || ev.Name != "SHUTDOWN" || !strings.Contains(string(ev.Data), "guest-shutdown") {
		t.Fatalf("WaitEvent = %+v, %v", ev, err)
	}
	if _, err := WaitEvent(ctxT(t, 50*time.Millisecond), all, "NEVER"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitEvent timeout: %v", err)
	}

	// Events() saw everything since Dial, in order.
	for _, w := range []string{"RESUME", "STOP", "SHUTDOWN", "RESUME", "STOP", "SHUTDOWN"} {
		if ev, _ := next(t, m.Events()); ev.Name != w {
			t.Fatalf("Events: got %q, want %q", ev.Name, w)
		}
	}
}

// Junk on the wire is skipped; the reader keeps going.
func TestMalformedLines(t *testing.T) {
	huge := `{"event": "HUGE", "data": "` + strings.Repeat("x", maxLine) + `"}`
	path := fakeServer(t, func(f *fakeConn, r request) {
		f.send(
			"garbage", "", "\r", "[1,2]", "null", `{"id": "abc", "return": {}}`, `{"id": 999999, "return": {}}`,
			`{"return": {}}`, `{"event": 5}`, `{"QMP": {}}`, `{"id": -1, "error": {}}`, `{"unknown": true}`,
			`{"event": "X", "timestamp": "yesterday", "data": null}`, huge,
			"{\"event\": \"OK\", \"data\": {\"a\": 1}}\r\n",
		)
		f.send(fmt.Sprintf("{\"return\": {\"fine\": true}, \"id\": %s}\r\n", r.ID))
	})
	m := dial(t, path)
	var got struct{ Fine bool }
	if err := m.Execute(ctxT(t, 10*time.Second), "anything", nil, &got); err != nil || !got.Fine {
		t.Fatalf("Execute = %v, %v", got, err)
	}
	ev, _ := next(t, m.Events())
	if ev.Name != "X" || ev.Data != nil || !ev.Time.IsZero() {
		t.Fatalf("first event %+v, want X with no data or time", ev)
	}
	if ev, _ = next(t, m.Events()); ev.Name != "OK" || string(ev.Data) != `{"a": 1}` {
		t.Fatalf("second event %+v, want OK (HUGE skipped)", ev)
	}
}

// The server dies mid-command after a last event: the call fails with
// ErrClosed, Done and Err report it, the last event is still delivered.
func TestServerClosesMidCommand(t *testing.T) {
	path := fakeServer(t, func(f *fakeConn, r request) {
		f.event("SHUTDOWN", `{"guest": false}`)
		f.c.Close()
	})
	m := dial(t, path)
	err := m.Execute(ctxT(t, 5*time.Second), "quit-ish", nil, nil)
	if !errors.Is(err, ErrClosed) {
		t.Fatalf("Execute = %v, want ErrClosed", err)
	}
	select {
	case <-m.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done not closed")
	}
	if err := m.Err(); !errors.Is(err, ErrClosed) || !errors.Is(err, io.EOF) {
		t.Fatalf("Err = %v, want ErrClosed wrapping EOF", err)
	}
	if ev, ok := next(t, m.Events()); !ok || ev.Name != "SHUTDOWN" {
		t.Fatalf("last event %+v %v", ev, ok)
	}
	if _, ok := next(t, m.Events()); ok {
		t.Fatal("Events not closed after EOF")
	}
	if err := m.Execute(t.Context(), "again", nil, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Execute after EOF = %v", err)
	}
	if ch, cancel := m.Subscribe(); true {
		defer cancel()
		if _, ok := next(t, ch); ok {
			t.Fatal("Subscribe after EOF gave an open channel")
		}
	}
}

func TestContextCancel(t *testing.T) {
	release := make(chan struct{})
	path := fakeServer(t, func(f *fakeConn, r request) {
		if r.Execute == "slow" {
			<-release
			f.reply(r, `{"late": true}`) // dropped: its caller gave up
			return
		}
		f.reply(r, "{}")
	})
	m := dial(t, path)

	pre, cancel := context.WithCancel(t.Context())
	cancel()
	if err := m.Execute(pre, "ping", nil, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("pre-cancelled: %v", err)
	}
	start := time.Now()
	if err := m.Execute(ctxT(t, 50*time.Millisecond), "slow", nil, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("slow: %v, want DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("cancel took %v", d)
	}
	close(release)
	var r map[string]bool
	if err := m.Execute(ctxT(t, 5*time.Second), "ping", nil, &r); err != nil || r["late"] {
		t.Fatalf("after cancel: %v %v", r, err)
	}
}

func TestQuit(t *testing.T) {
	for _, tc := range []struct {
		name    string
		serve   func(f *fakeConn, r request)
		wantErr bool
	}{
		{"reply then close", func(f *fakeConn, r request) {
			f.event("SHUTDOWN", `{"guest": false, "reason": "host-qmp-quit"}`)
			f.reply(r, "{}")
			f.c.Close()
		}, false},
		{"close before reply", func(f *fakeConn, r request) { f.c.Close() }, false},
		{"refused", func(f *fakeConn, r request) { f.replyErr(r, "GenericError", "no") }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := dial(t, fakeServer(t, tc.serve))
			err := m.Quit(ctxT(t, 5*time.Second))
			if tc.wantErr {
				if _, ok := errors.AsType[*Error](err); !ok {
					t.Fatalf("Quit = %v, want *Error", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Quit = %v", err)
			}
			select {
			case <-m.Done():
			default:
				t.Fatal("Quit returned before Done")
			}
		})
	}
	t.Run("after Close", func(t *testing.T) {
		m := dial(t, fakeServer(t, func(f *fakeConn, r request) { f.reply(r, "{}") }))
		m.Close()
		if err := m.Quit(t.Context()); !errors.Is(err, ErrClosed) {
			t.Fatalf("Quit after Close = %v, want ErrClosed", err)
		}
	})
}

func TestDial(t *testing.T) {
	t.Run("retries until the socket appears", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "qmp.sock")
		// First a stale socket (ECONNREFUSED), later a live one.
		ln, err := net.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		ln.(*net.UnixListener).SetUnlinkOnClose(false)
		ln.Close()
		serveAt(t, path+".new", func(f *fakeConn) {
			if f.handshake() {
				f.recv()
			}
		})
		// The live socket replaces the stale one later (rename keeps it listening).
		time.AfterFunc(200*time.Millisecond, func() {
			if err := os.Rename(path+".new", path); err != nil {
				t.Error(err)
			}
		})
		m := dial(t, path)
		if m.Err() != nil {
			t.Fatal(m.Err())
		}
	})
	for _, tc := range []struct {
		name  string
		serve func(f *fakeConn) // nil: no socket at all
		want  string
	}{
		{"no socket", nil, "deadline exceeded"},
		{"not QMP", func(f *fakeConn) { f.send(`{"hello": 1}`); f.recv() }, "unexpected greeting"},
		{"silent server", func(f *fakeConn) { f.recv() }, "greeting"},
		{"capabilities refused", func(f *fakeConn) {
			f.send(`{"QMP": {}}`)
			if r, ok := f.recv(); ok {
				f.replyErr(r, "CommandNotFound", "nope")
				f.recv()
			}
		}, "negotiating capabilities"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "qmp.sock")
			if tc.serve != nil {
				serveAt(t, path, tc.serve)
			}
			start := time.Now()
			m, err := Dial(ctxT(t, 300*time.Millisecond), path)
			if err == nil {
				m.Close()
				t.Fatal("Dial succeeded")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Dial = %v, want %q", err, tc.want)
			}
			if d := time.Since(start); d > 3*time.Second {
				t.Fatalf("Dial took %v", d)
			}
		})
	}
}

func TestTypedHelpers(t *testing.T) {
	var (
		mu    sync.Mutex
		tried []string
	)
	path := fakeServer(t, func(f *fakeConn, r request) {
		switch r.Execute {
		case "query-status":
			f.reply(r, `{"status": "paused", "singlestep": false, "running": false}`)
		case "query-cpus-fast":
			f.reply(r, `[{"cpu-index": 1, "thread-id": 202}, {"cpu-index": 0, "thread-id": 101}]`)
		case "query-kvm":
			f.reply(r, `{"enabled": true, "present": true}`)
		case "stop", "cont", "system_powerdown", "system_reset":
			f.reply(r, "{}")
		case "block_set_io_throttle":
			var a map[string]any
			json.Unmarshal(r.Arguments, &a)
			id := a["id"].(string)
			mu.Lock()
			tried = append(tried, fmt.Sprintf("%s %v/%v/%v/%v/%v/%v", id, a["bps"], a["bps_rd"], a["bps_wr"], a["iops"], a["iops_rd"], a["iops_wr"]))
			mu.Unlock()
			switch id {
			case "vd-dev/virtio-backend", "sd-dev", "/machine/peripheral/x":
				f.reply(r, "{}")
			case "vd-dev", "sd-dev/virtio-backend", "gone/virtio-backend":
				f.replyErr(r, "DeviceNotFound", "Device '"+id+"' not found")
			default:
				f.replyErr(r, "GenericError", "Device does not have a block device backend")
			}
		default:
			f.replyErr(r, "CommandNotFound", r.Execute)
		}
	})
	m := dial(t, path)
	ctx := ctxT(t, 5*time.Second)

	if s, running, err := m.Status(ctx); s != "paused" || running || err != nil {
		t.Errorf("Status = %q %v %v", s, running, err)
	}
	if tids, err := m.VCPUThreads(ctx); fmt.Sprint(tids) != "[101 202]" || err != nil {
		t.Errorf("VCPUThreads = %v %v, want by cpu-index", tids, err)
	}
	if on, err := m.KVMEnabled(ctx); !on || err != nil {
		t.Errorf("KVMEnabled = %v %v", on, err)
	}
	for name, f := range map[string]func(context.Context) error{
		"Stop": m.Stop, "Cont": m.Cont, "SystemPowerdown": m.SystemPowerdown, "SystemReset": m.SystemReset,
	} {
		if err := f(ctx); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}

	for _, tc := range []struct {
		qdev    string
		r, w    int
		tried   []string
		wantErr bool
	}{
		{"vd-dev", 50, 20, []string{"vd-dev/virtio-backend 0/0/0/0/50/20"}, false},
		{"sd-dev", 7, 0, []string{"sd-dev/virtio-backend 0/0/0/0/7/0", "sd-dev 0/0/0/0/7/0"}, false},
		{"/machine/peripheral/x", 1, 2, []string{"/machine/peripheral/x 0/0/0/0/1/2"}, false},
		{"gone", 1, 1, []string{"gone/virtio-backend 0/0/0/0/1/1", "gone 0/0/0/0/1/1"}, true},
	} {
		mu.Lock()
		tried = nil
		mu.Unlock()
		err := m.SetIOThrottle(ctx, tc.qdev, tc.r, tc.w)
		mu.Lock()
		got := fmt.Sprint(tried)
		mu.Unlock()
		if (err != nil) != tc.wantErr || got != fmt.Sprint(tc.tried) {
			t.Errorf("SetIOThrottle(%q) = %v, tried %s, want %v", tc.qdev, err, got, tc.tried)
		}
	}
}

// After Close, or after EOF once the consumers drained, no goroutine is left.
func TestNoGoroutineLeak(t *testing.T) {
	waitGoroutines := func(t *testing.T, base int) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for runtime.NumGoroutine() > base {
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<16)
				t.Fatalf("%d goroutines, want <= %d:\n%s", runtime.NumGoroutine(), base, buf[:runtime.Stack(buf, true)])
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	serve := func(f *fakeConn, r request) {
		f.event("E", "{}")
		if r.Execute == "bye" {
			f.c.Close()
			return
		}
		f.reply(r, "{}")
	}

	t.Run("Close with unread events and subscriptions", func(t *testing.T) {
		base := runtime.NumGoroutine()
		t.Run("inner", func(t *testing.T) {
			m := dial(t, fakeServer(t, serve))
			m.Subscribe("E")
			m.Subscribe()
			for range 3 {
				if err := m.Execute(ctxT(t, 5*time.Second), "x", nil, nil); err != nil {
					t.Fatal(err)
				}
			}
			if err := m.Close(); err != nil {
				t.Fatal(err)
			}
			if _, ok := next(t, m.Events()); ok {
				t.Fatal("Events open after Close")
			}
		})
		waitGoroutines(t, base)
	})
	t.Run("EOF then drained", func(t *testing.T) {
		base := runtime.NumGoroutine()
		t.Run("inner", func(t *testing.T) {
			m, err := Dial(ctxT(t, 5*time.Second), fakeServer(t, serve))
			if err != nil {
				t.Fatal(err)
			}
			sub, _ := m.Subscribe()
			m.Execute(ctxT(t, 5*time.Second), "bye", nil, nil)
			for _, ch := range []<-chan Event{m.Events(), sub} {
				for range ch {
				}
			}
			// No Close: the connection's end plus drained channels must suffice.
		})
		waitGoroutines(t, base)
	})
}

// TestExecuteWithFile sends a pipe's write end with a command: the server
// gets it as SCM_RIGHTS with the command's line, and what it writes there
// comes out of the read end.
func TestExecuteWithFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "qmp.sock")
	serveAt(t, path, func(f *fakeConn) {
		if !f.handshake() {
			return
		}
		line, oob := make([]byte, 4096), make([]byte, 64)
		n, oobn, _, _, err := f.c.(*net.UnixConn).ReadMsgUnix(line, oob)
		if err != nil {
			t.Errorf("fake server: %v", err)
			return
		}
		var r request
		if err := json.Unmarshal(line[:n], &r); err != nil || r.Execute != "getfd" {
			t.Errorf("fake server: got %q (%v), want one getfd line", line[:n], err)
			return
		}
		msgs, err := syscall.ParseSocketControlMessage(oob[:oobn])
		if err != nil || len(msgs) != 1 {
			f.replyErr(r, "GenericError", "No file descriptor supplied via SCM_RIGHTS")
			return
		}
		fds, err := syscall.ParseUnixRights(&msgs[0])
		if err != nil || len(fds) != 1 {
			f.replyErr(r, "GenericError", "No file descriptor supplied via SCM_RIGHTS")
			return
		}
		file := os.NewFile(uintptr(fds[0]), "sent")
		file.WriteString("through")
		file.Close()
		f.reply(r, "{}")
		for {
			r, ok := f.recv()
			if !ok {
				return
			}
			f.reply(r, "{}")
		}
	})
	m := dial(t, path)
	ctx := ctxT(t, 5*time.Second)
	rd, wr, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	err = m.ExecuteWithFile(ctx, "getfd", map[string]string{"fdname": "x"}, nil, wr)
	wr.Close()
	if err != nil {
		t.Fatalf("ExecuteWithFile: %v", err)
	}
	got, err := io.ReadAll(rd)
	if err != nil || string(got) != "through" {
		t.Fatalf("read %q, %v; want what the server wrote to the file sent", got, err)
	}
	// The connection goes on as before.
	if err := m.Execute(ctx, "query-status", nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := m.ExecuteWithFile(ctx, "getfd", nil, nil, nil); err == nil {
		t.Fatal("ExecuteWithFile without a file succeeded")
	}
}
