// Package qmp is a small client for QEMU's machine protocol (QMP) over a unix
// socket: concurrent commands matched to replies by id, and asynchronous
// events queued without bound so that a slow consumer never stalls the
// connection's reader (the go-qemu failure: an undrained event channel blocked
// its reader and every later command hung).
package qmp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// Event is one asynchronous QMP event.
type Event struct {
	Name string          // "SHUTDOWN", "STOP", "RESUME", "POWERDOWN", "DEVICE_DELETED", …
	Data json.RawMessage // the event's data object (may be nil)
	Time time.Time       // from the event's timestamp (zero if it had none)
}

// Error is an error QEMU answered ({"error": {"class": …, "desc": …}}).
type Error struct {
	Class string `json:"class"`
	Desc  string `json:"desc"`
}

func (e *Error) Error() string { return "qmp: " + e.Class + ": " + e.Desc }

// ErrClosed is returned by calls on a monitor whose connection ended (QEMU
// exited or Close was called). Err and the errors of failed calls wrap it
// together with the cause (io.EOF, a reset, …).
var ErrClosed = errors.New("qmp: monitor connection closed")

// maxLine bounds one JSON line; a longer one is skipped, not buffered.
const maxLine = 16 << 20

var errLineTooLong = errors.New("qmp: line too long")

type response struct {
	ret json.RawMessage
	err error
}

// Monitor is one QMP connection. All methods are safe for concurrent use.
type Monitor struct {
	conn net.Conn
	wmu  sync.Mutex // serialises whole command lines on the socket

	mu         sync.Mutex
	nextID     uint64
	pending    map[uint64]chan response
	sinks      map[*sink]struct{}
	err        error // why the connection ended; nil while open
	closedByMe bool  // Close was called (Quit must not report that as success)

	events *sink // the Events() stream, fed since Dial
	done   chan struct{}
	wg     sync.WaitGroup // reader and sink pumps
}

// Dial connects to a QMP unix socket, reads the greeting and negotiates
// capabilities. While the socket does not exist yet or refuses connections
// (QEMU still starting), Dial retries until ctx ends, so give ctx a deadline.
func Dial(ctx context.Context, path string) (*Monitor, error) {
	conn, err := dialRetry(ctx, path)
	if err != nil {
		return nil, err
	}
	br := bufio.NewReaderSize(conn, 64<<10)
	if err := readGreeting(ctx, conn, br); err != nil {
		conn.Close()
		return nil, err
	}
	m := &Monitor{
		conn:    conn,
		pending: make(map[uint64]chan response),
		sinks:   make(map[*sink]struct{}),
		done:    make(chan struct{}),
	}
	m.events = m.newSink(nil)
	m.wg.Add(1)
	go m.read(br)
	if err := m.Execute(ctx, "qmp_capabilities", nil, nil); err != nil {
		m.Close()
		return nil, fmt.Errorf("qmp: negotiating capabilities: %w", err)
	}
	return m, nil
}

func dialRetry(ctx context.Context, path string) (net.Conn, error) {
	var d net.Dialer
	delay := 10 * time.Millisecond
	for {
		conn, err := d.DialContext(ctx, "unix", path)
		if err == nil {
			return conn, nil
		}
		// Not there yet, stale, or backlog full: QEMU is (re)starting.
		if !errors.Is(err, syscall.ENOENT) && !errors.Is(err, syscall.ECONNREFUSED) && !errors.Is(err, syscall.EAGAIN) {
			return nil, fmt.Errorf("qmp: dial %s: %w", path, err)
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("qmp: dial %s: %w (last: %v)", path, ctx.Err(), err)
		case <-t.C:
		}
		delay = min(2*delay, 100*time.Millisecond)
	}
}

// readGreeting reads the {"QMP": …} banner, honouring ctx through the
// connection's deadline.
func readGreeting(ctx context.Context, conn net.Conn, br *bufio.Reader) error {
	if dl, ok := ctx.Deadline(); ok {
		conn.SetReadDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { conn.SetReadDeadline(time.Unix(1, 0)) })
	line, err := readLine(br)
	if !stop() || ctx.Err() != nil {
		return fmt.Errorf("qmp: reading greeting: %w", ctx.Err())
	}
	conn.SetReadDeadline(time.Time{})
	if err != nil {
		return fmt.Errorf("qmp: reading greeting: %w", err)
	}
	var g map[string]json.RawMessage
	if json.Unmarshal(line, &g) != nil || g["QMP"] == nil {
		return fmt.Errorf("qmp: unexpected greeting %.100q", line)
	}
	return nil
}

// readLine returns the next line without its terminator. The slice may alias
// the reader's buffer: use it before the next call.
func readLine(br *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		frag, err := br.ReadSlice('\n')
		if len(line)+len(frag) > maxLine {
			for err == bufio.ErrBufferFull {
				_, err = br.ReadSlice('\n')
			}
			if err != nil {
				return nil, err
			}
			return nil, errLineTooLong
		}
		if err == nil && line == nil {
			return bytes.TrimRight(frag, "\r\n"), nil
		}
		line = append(line, frag...)
		if err != bufio.ErrBufferFull {
			return bytes.TrimRight(line, "\r\n"), err
		}
	}
}

// read is the connection's only reader. It never blocks on anyone: replies go
// to 1-buffered channels, events to unbounded per-sink queues.
func (m *Monitor) read(br *bufio.Reader) {
	defer m.wg.Done()
	for {
		line, err := readLine(br)
		if err == errLineTooLong {
			continue
		}
		if err != nil {
			m.fail(err)
			return
		}
		m.handle(line)
	}
}

func (m *Monitor) handle(line []byte) {
	var msg map[string]json.RawMessage
	if len(bytes.TrimSpace(line)) == 0 || json.Unmarshal(line, &msg) != nil {
		return // not a JSON object: ignore rather than die
	}
	if raw, ok := msg["event"]; ok {
		var ev Event
		if json.Unmarshal(raw, &ev.Name) != nil {
			return
		}
		if d := msg["data"]; len(d) > 0 && string(d) != "null" {
			ev.Data = d
		}
		var ts struct{ Seconds, Microseconds int64 }
		if json.Unmarshal(msg["timestamp"], &ts) == nil && ts.Seconds > 0 {
			ev.Time = time.Unix(ts.Seconds, ts.Microseconds*1000)
		}
		m.dispatch(ev)
		return
	}
	id, err := strconv.ParseUint(string(msg["id"]), 10, 64)
	if err != nil {
		return // no id or not ours (e.g. an id-less parse error)
	}
	var r response
	if raw, ok := msg["error"]; ok {
		e := new(Error)
		if json.Unmarshal(raw, e) != nil {
			e = &Error{Class: "GenericError", Desc: "malformed error reply: " + string(raw)}
		}
		r.err = e
	} else if raw, ok := msg["return"]; ok {
		r.ret = raw
	} else {
		r.err = fmt.Errorf("qmp: reply without return or error: %.200s", line)
	}
	m.mu.Lock()
	ch := m.pending[id]
	delete(m.pending, id)
	m.mu.Unlock()
	if ch != nil { // nil: the caller gave up; drop the late reply
		ch <- r
	}
}

// fail ends the connection once: pending calls get ErrClosed, sinks drain and
// close, Done closes.
func (m *Monitor) fail(cause error) {
	m.mu.Lock()
	if m.err != nil {
		m.mu.Unlock()
		return
	}
	if cause == ErrClosed {
		m.err = ErrClosed
	} else {
		m.err = fmt.Errorf("%w: %w", ErrClosed, cause)
	}
	for id, ch := range m.pending {
		ch <- response{err: m.err}
		delete(m.pending, id)
	}
	for s := range m.sinks {
		s.end()
	}
	m.mu.Unlock()
	m.conn.Close()
	close(m.done)
}

// Execute runs one command with optional arguments (nil for none, else
// marshalled to the "arguments" object) and unmarshals "return" into result
// when result is non-nil. A cancelled wait returns ctx.Err() and the late
// reply is dropped. Errors QEMU answered are *Error.
func (m *Monitor) Execute(ctx context.Context, command string, args, result any) error {
	return m.execute(ctx, command, args, result, nil)
}

// ExecuteWithFile runs a command as Execute does, with file's descriptor
// sent along (SCM_RIGHTS on the command's line), as QMP's getfd and
// add-fd take it: getfd {"fdname": NAME} gives a later command, say
// netdev_add's tap fd=NAME, a file that QEMU could not open itself (a
// tap only root may attach to, once QEMU runs as an unprivileged user).
// file stays open here: the caller closes its copy when the call is done.
func (m *Monitor) ExecuteWithFile(ctx context.Context, command string, args, result any, file *os.File) error {
	if file == nil {
		return fmt.Errorf("qmp: %s: no file to send", command)
	}
	return m.execute(ctx, command, args, result, file)
}

func (m *Monitor) execute(ctx context.Context, command string, args, result any, file *os.File) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	if m.err != nil {
		err := m.err
		m.mu.Unlock()
		return err
	}
	m.nextID++
	id := m.nextID
	ch := make(chan response, 1)
	m.pending[id] = ch
	m.mu.Unlock()
	forget := func() {
		m.mu.Lock()
		delete(m.pending, id)
		m.mu.Unlock()
	}

	line, err := json.Marshal(struct {
		Execute   string `json:"execute"`
		Arguments any    `json:"arguments,omitempty"`
		ID        uint64 `json:"id"`
	}{command, args, id})
	if err != nil {
		forget()
		return fmt.Errorf("qmp: %s: %w", command, err)
	}
	if err := m.write(ctx, append(line, '\n'), file); err != nil {
		forget()
		return err
	}

	select {
	case r := <-ch:
		if r.err != nil {
			return r.err
		}
		if result != nil {
			if err := json.Unmarshal(r.ret, result); err != nil {
				return fmt.Errorf("qmp: %s: decoding return: %w", command, err)
			}
		}
		return nil
	case <-ctx.Done():
		forget()
		return ctx.Err()
	}
}

// write sends one line, with file's descriptor when file is not nil,
// giving up when ctx ends. A line cut short would desynchronise the
// stream, so a partial write ends the connection.
func (m *Monitor) write(ctx context.Context, line []byte, file *os.File) error {
	m.wmu.Lock()
	defer m.wmu.Unlock()
	dl, _ := ctx.Deadline()
	m.conn.SetWriteDeadline(dl)
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		m.conn.SetWriteDeadline(time.Unix(1, 0))
		close(fired)
	})
	var n int
	var err error
	if file != nil {
		n, err = m.writeFile(line, file)
	} else {
		n, err = m.conn.Write(line)
	}
	if !stop() {
		<-fired // don't let a late deadline hit the next writer
	}
	if err == nil {
		return nil
	}
	if n == 0 && ctx.Err() != nil {
		return ctx.Err()
	}
	m.fail(err)
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.err
}

// writeFile writes line with file's descriptor as ancillary data of its
// first bytes, where QEMU's monitor picks it up for the command.
func (m *Monitor) writeFile(line []byte, file *os.File) (int, error) {
	uc, ok := m.conn.(*net.UnixConn)
	if !ok {
		return 0, errors.New("qmp: passing a file needs a unix socket")
	}
	raw, err := file.SyscallConn()
	if err != nil {
		return 0, err
	}
	var n int
	var werr error
	err = raw.Control(func(fd uintptr) {
		n, _, werr = uc.WriteMsgUnix(line, syscall.UnixRights(int(fd)), nil)
	})
	if err == nil {
		err = werr
	}
	if err == nil && n < len(line) {
		// The descriptor went with the first bytes; the rest follows.
		var k int
		k, err = m.conn.Write(line[n:])
		n += k
	}
	return n, err
}

// Done is closed when the connection ends (QEMU exited, socket closed, or Close).
func (m *Monitor) Done() <-chan struct{} { return m.done }

// Err is why the connection ended (nil while it is open). It wraps ErrClosed.
func (m *Monitor) Err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.err
}

// Close ends the connection, drops undelivered events, closes every event
// channel and waits until the monitor's goroutines have stopped.
func (m *Monitor) Close() error {
	m.mu.Lock()
	m.closedByMe = true
	m.mu.Unlock()
	m.fail(ErrClosed)
	m.mu.Lock()
	for s := range m.sinks {
		s.stop()
		delete(m.sinks, s)
	}
	m.mu.Unlock()
	m.wg.Wait()
	return nil
}
