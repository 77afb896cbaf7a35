package qemu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"nimbus/internal/qmp"
)

// proc is one QEMU process of a server.
//
// The driver starts QEMU as its direct child (no -daemonize) in a process
// group of its own, so that a signal to the agent's group (Ctrl-C) does not
// reach the VMs, and a goroutine Waits on it so that it is reaped when it
// exits. A QEMU started by an earlier agent process is not our child: it is
// re-attached through its pid file and QMP socket, and its exit is seen by
// polling /proc (and the QMP socket's EOF).
//
// The agent does not become a child subreaper (PR_SET_CHILD_SUBREAPER): it
// has no grandchildren to adopt, since QEMU runs in the foreground as its
// child, and the QEMUs of an earlier agent process are not its descendants,
// so they would not be re-parented to it anyway. As a subreaper it would
// adopt every orphan of every process it starts (qemu-img, tests' helpers)
// without a Wait for them, which would leave zombies of its own. A
// re-attached QEMU that exits is reaped by the host's init; where init does
// not reap (some containers), it stays a zombie, which the liveness check
// counts as dead.
type proc struct {
	pid   int
	dir   string
	child bool // ours: a goroutine Waits on it

	exited   chan struct{} // closed once the process is gone
	exitOnce sync.Once
	exitErr  error // a child's Wait result, set before exited closes

	mon *qmp.Monitor // nil until QMP is up (or when re-attaching failed)

	// expect is set before the driver stops the process on purpose: its
	// exit is then no news for the power listener.
	expect atomic.Bool
	// guestOff is set when the guest shut itself down (SHUTDOWN event not
	// caused by the driver).
	guestOff atomic.Bool

	started time.Time
}

func (p *proc) markExited() { p.exitOnce.Do(func() { close(p.exited) }) }

// done reports whether the process has exited.
func (p *proc) done() bool {
	select {
	case <-p.exited:
		return true
	default:
	}
	if !p.child && !qemuAlive(p.pid, p.dir) {
		p.markExited()
		return true
	}
	return false
}

// wait waits up to timeout (0: until ctx ends) for the process to exit.
func (p *proc) wait(ctx context.Context, timeout time.Duration) bool {
	var tc <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		tc = t.C
	}
	var poll <-chan time.Time
	if !p.child {
		tk := time.NewTicker(50 * time.Millisecond)
		defer tk.Stop()
		poll = tk.C
	}
	for {
		if p.done() {
			return true
		}
		select {
		case <-p.exited:
			return true
		case <-poll:
		case <-tc:
			return p.done()
		case <-ctx.Done():
			return p.done()
		}
	}
}

// kill sends SIGKILL to the process if it is still the server's QEMU.
func (p *proc) kill() {
	if p.done() {
		return
	}
	if p.child || qemuAlive(p.pid, p.dir) {
		syscall.Kill(p.pid, syscall.SIGKILL)
	}
}

// closeMon closes the QMP connection, if any.
func (p *proc) closeMon() {
	if p.mon != nil {
		p.mon.Close()
	}
}

// qemuAlive reports whether pid is a live (not zombie) process whose
// command line names dir: the QEMU of that server directory, not a process
// that reused the pid.
func qemuAlive(pid int, dir string) bool {
	if pid <= 0 {
		return false
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the command name in parentheses, which may itself
	// contain ") ".
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 || i+2 >= len(stat) {
		return false
	}
	switch stat[i+2] {
	case 'Z', 'X', 'x':
		return false
	}
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return false
	}
	argv0, _, _ := bytes.Cut(cmdline, []byte{0})
	return bytes.Contains(argv0, []byte("qemu")) && bytes.Contains(cmdline, []byte(dir+"/"))
}

// readPid reads a QEMU pid file.
func readPid(dir string) int {
	b, err := os.ReadFile(filepath.Join(dir, pidFile))
	if err != nil {
		return 0
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0
	}
	return n
}

// logTail returns the last lines QEMU wrote to its log since offset, as
// the reason of a failed start.
func logTail(path string, offset int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	const max = 4096
	end, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return ""
	}
	start := max64(offset, end-max)
	b := make([]byte, end-start)
	n, _ := f.ReadAt(b, start)
	lines := strings.Split(strings.TrimSpace(string(b[:n])), "\n")
	var keep []string
	for _, l := range lines {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "# ") {
			continue
		}
		keep = append(keep, l)
	}
	if len(keep) > 8 {
		keep = keep[len(keep)-8:]
	}
	return strings.Join(keep, "; ")
}

func max64(a, b int64) int64 {
	if a > b {
		return a
	}
	return b
}

// qmpTimeout bounds how long QEMU has to open its QMP socket.
const qmpTimeout = 30 * time.Second

// errStartFailed marks a QEMU that did not come up; the message carries its
// reason from qemu.log.
var errStartFailed = errors.New("qemu did not start")

// launch starts QEMU for v's current state (incoming: a suspend state file
// to restore, "") and waits until its QMP monitor answers, pins its
// threads, and starts the watcher. On failure no process is left. Callers
// hold v's op lock.
func (d *Driver) launch(ctx context.Context, v *vm, incoming string) (*proc, error) {
	v.mu.Lock()
	st := v.st
	v.mu.Unlock()
	m, err := d.machine(v.id, v.dir, st, incoming)
	if err != nil {
		return nil, err
	}
	taps, err := d.passTaps(m, st.Spec.Ports)
	if err != nil {
		return nil, err
	}
	defer closeFiles(taps) // QEMU has its own copies once started
	args := Command(m)
	logPath := filepath.Join(v.dir, logFile)
	if fi, err := os.Stat(logPath); err == nil && fi.Size() > 1<<20 {
		os.Truncate(logPath, 0)
	}
	lf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("qemu: %w", err)
	}
	offset, _ := lf.Seek(0, io.SeekEnd)
	fmt.Fprintf(lf, "# %s starting: %s %s\n", time.Now().UTC().Format(time.RFC3339), d.cfg.Binary, strings.Join(args, " "))
	offset, _ = lf.Seek(0, io.SeekEnd)
	os.Remove(filepath.Join(v.dir, qmpSock))
	os.Remove(filepath.Join(v.dir, pidFile))

	cmd := exec.Command(d.cfg.Binary, args...)
	cmd.Dir = v.dir
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.ExtraFiles = taps
	err = cmd.Start()
	lf.Close()
	if err != nil {
		return nil, fmt.Errorf("qemu: start %s: %w", v.id, err)
	}
	p := &proc{pid: cmd.Process.Pid, dir: v.dir, child: true, exited: make(chan struct{}), started: time.Now()}
	go func() {
		// Reaps the process, whatever becomes of the driver: a QEMU that
		// outlives Close is still reaped when it exits.
		p.exitErr = cmd.Wait()
		p.markExited()
	}()
	fail := func(what string, err error) (*proc, error) {
		if p.mon != nil {
			p.mon.Close()
		}
		p.expect.Store(true)
		p.kill()
		<-p.exited
		reason := logTail(logPath, offset)
		if reason == "" && err != nil {
			reason = err.Error()
		} else if reason == "" {
			reason = fmt.Sprint(p.exitErr)
		}
		return nil, fmt.Errorf("qemu: server %s: %w: %s: %s", v.id, errStartFailed, what, reason)
	}

	dctx, cancel := context.WithTimeout(ctx, qmpTimeout)
	stop := make(chan struct{})
	go func() {
		select {
		case <-p.exited:
			cancel()
		case <-stop:
		}
	}()
	mon, err := qmp.Dial(dctx, filepath.Join(v.dir, qmpSock))
	close(stop)
	cancel()
	if err != nil {
		// A QEMU that failed writes its reason and exits: give it a moment.
		p.wait(ctx, 2*time.Second)
		return fail("no QMP", err)
	}
	p.mon = mon
	if err := d.pin(ctx, p, st.Pinning); err != nil {
		return fail("pinning", err)
	}
	if incoming != "" {
		if err := d.awaitIncoming(ctx, p); err != nil {
			return fail("restoring the suspended state", err)
		}
	} else if status, _, err := mon.Status(ctx); err != nil {
		return fail("query-status", err)
	} else if status == "prelaunch" {
		// QEMU ran with -S (so that the threads are pinned before the
		// guest runs).
		if err := mon.Cont(ctx); err != nil {
			return fail("cont", err)
		}
	}
	d.log.Info("qemu: started", "server", v.id, "pid", p.pid, "ms", time.Since(p.started).Milliseconds())
	d.attach(v, p)
	return p, nil
}

// attach makes p v's process and starts watching it.
func (d *Driver) attach(v *vm, p *proc) {
	v.mu.Lock()
	v.proc = p
	v.mu.Unlock()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		// An op that outlived Close: the process runs on unwatched, as
		// all do after Close.
		return
	}
	d.wg.Add(1)
	go d.watch(v, p)
}

// pin confines QEMU's threads: all of them (the emulator and I/O threads)
// to the host's reserved CPUs when there are any, then each vCPU thread to
// its pCPU (the spec's cells in order) or, for a server without pinning,
// to every CPU that is not reserved.
func (d *Driver) pin(ctx context.Context, p *proc, pcpus []int) error {
	reserved := d.cfg.Host.ReservedCPUs
	var shared []int
	if len(reserved) > 0 {
		res := map[int]bool{}
		for _, c := range reserved {
			res[c] = true
		}
		for _, c := range d.cfg.Host.CPUs {
			if !res[c.ID] {
				shared = append(shared, c.ID)
			}
		}
	}
	if len(reserved) == 0 && len(pcpus) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	tids, err := p.mon.VCPUThreads(ctx)
	if err != nil {
		return err
	}
	if len(reserved) > 0 {
		tasks, err := os.ReadDir("/proc/" + strconv.Itoa(p.pid) + "/task")
		if err != nil {
			return err
		}
		for _, t := range tasks {
			tid, err := strconv.Atoi(t.Name())
			if err != nil {
				continue
			}
			if err := setAffinity(tid, reserved); err != nil && !errors.Is(err, unix.ESRCH) {
				d.log.Warn("qemu: pinning emulator thread", "pid", p.pid, "tid", tid, "cpus", reserved, "error", err)
			}
		}
	}
	// Under single-threaded TCG several vCPUs share one thread: it gets
	// the union of their pCPUs.
	want := map[int][]int{}
	var order []int
	for i, tid := range tids {
		if _, ok := want[tid]; !ok {
			order = append(order, tid)
		}
		switch {
		case len(pcpus) > 0 && i < len(pcpus):
			want[tid] = append(want[tid], pcpus[i])
		case len(shared) > 0:
			want[tid] = append(want[tid], shared...)
		}
	}
	for _, tid := range order {
		if len(want[tid]) == 0 {
			continue
		}
		if err := setAffinity(tid, want[tid]); err != nil {
			return fmt.Errorf("pinning vCPU thread %d to CPUs %v: %w", tid, want[tid], err)
		}
	}
	return nil
}

func setAffinity(tid int, cpus []int) error {
	var set unix.CPUSet
	set.Zero()
	for _, c := range cpus {
		set.Set(c)
	}
	return unix.SchedSetaffinity(tid, &set)
}

// awaitIncoming waits until QEMU has loaded a suspended state (QEMU stays
// paused after it, as the state was saved paused) and then runs the guest.
func (d *Driver) awaitIncoming(ctx context.Context, p *proc) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	for {
		var mig struct {
			Status string `json:"status"`
		}
		if err := p.mon.Execute(ctx, "query-migrate", nil, &mig); err != nil {
			return err
		}
		status, _, err := p.mon.Status(ctx)
		if err != nil {
			return err
		}
		switch {
		case mig.Status == "failed" || mig.Status == "cancelled":
			return fmt.Errorf("incoming migration %s", mig.Status)
		case status == "inmigrate" || status == "restore-vm" || mig.Status == "active" || mig.Status == "setup":
			// still loading
		case status == "paused" || status == "prelaunch" || status == "postmigrate":
			return p.mon.Cont(ctx)
		case status == "running":
			return nil
		default:
			return fmt.Errorf("after restoring, QEMU is %q", status)
		}
		select {
		case <-time.After(50 * time.Millisecond):
		case <-p.exited:
			return errors.New("QEMU exited while restoring")
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
