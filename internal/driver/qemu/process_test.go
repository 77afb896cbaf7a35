package qemu

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"nimbus/internal/driver"
)

// The tests in this file run real QEMU processes but no guest OS: a blank
// disk on which SeaBIOS finds nothing to boot. They cover the process
// side — start, QMP, pinning, pause, suspend to a file and back, hard
// power-off after a graceful one times out, re-attach after an agent
// restart, restart after a "host reboot", failures, destroy — in seconds.

func testLog(t *testing.T) *slog.Logger {
	if os.Getenv("NIMBUS_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// testHost is this machine as the tests present it: CPU 0 reserved for
// the host (and QEMU's emulator threads), the rest for servers.
func testHost() driver.Host {
	h := driver.Host{Name: "test-host", IP: "127.0.0.1", MemoryMB: 4096, DiskGB: 10}
	n := max(1, len(cpuList()))
	for i := 0; i < n; i++ {
		h.CPUs = append(h.CPUs, driver.CPU{ID: i, Siblings: []int{i}})
	}
	if n > 1 {
		h.ReservedCPUs = []int{0}
	}
	h.Normalize()
	return h
}

// cpuList is the CPUs this process may run on.
func cpuList() []int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return nil
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Cpus_allowed_list:"); ok {
			return parseList(strings.TrimSpace(v))
		}
	}
	return nil
}

func parseList(s string) []int {
	var out []int
	for _, part := range strings.Split(s, ",") {
		lo, hi, found := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			continue
		}
		b := a
		if found {
			b, _ = strconv.Atoi(hi)
		}
		for i := a; i <= b; i++ {
			out = append(out, i)
		}
	}
	return out
}

// powerEvents records what the power listener heard.
type powerEvents struct {
	mu  sync.Mutex
	got map[string][]driver.PowerState
	ch  chan struct{}
}

func newPowerEvents() *powerEvents {
	return &powerEvents{got: map[string][]driver.PowerState{}, ch: make(chan struct{}, 100)}
}

func (e *powerEvents) listen(id string, p driver.PowerState) {
	e.mu.Lock()
	e.got[id] = append(e.got[id], p)
	e.mu.Unlock()
	select {
	case e.ch <- struct{}{}:
	default:
	}
}

func (e *powerEvents) of(id string) []driver.PowerState {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]driver.PowerState(nil), e.got[id]...)
}

// waitFor polls cond until it holds or timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func newTestDriver(t *testing.T, dataDir string, store driver.ImageStore, mod func(*Config)) *Driver {
	t.Helper()
	cfg := Config{DataDir: dataDir, Host: testHost(), Sandbox: true, ShutdownTimeout: 30 * time.Second, Log: testLog(t),
		PortRange: [2]int{42000, 42999}}
	if mod != nil {
		mod(&cfg)
	}
	d, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	d.SetImageStore(store)
	t.Cleanup(func() { killLeftovers(dataDir) })
	return d
}

// killLeftovers kills the QEMUs a test left (Close leaves VMs running by
// design, and a failed test may not get to Destroy) and waits until they
// are reaped.
func killLeftovers(dataDir string) {
	dirs, _ := filepath.Glob(filepath.Join(dataDir, "instances", "*"))
	for _, dir := range dirs {
		pid := readPid(dir)
		if !qemuAlive(pid, dir) {
			continue
		}
		syscall.Kill(pid, syscall.SIGKILL)
		for i := 0; i < 100 && !gone(pid); i++ {
			time.Sleep(50 * time.Millisecond)
		}
	}
}

func pidOf(t *testing.T, d *Driver, id string) int {
	t.Helper()
	v := d.lookup(id)
	if v == nil {
		t.Fatalf("no server %s", id)
	}
	p := v.current()
	if p == nil {
		return 0
	}
	return p.pid
}

// gone reports whether pid has exited and been reaped (no zombie left).
func gone(pid int) bool {
	_, err := os.Stat("/proc/" + strconv.Itoa(pid))
	return errors.Is(err, os.ErrNotExist)
}

func wantState(t *testing.T, d *Driver, id string, want driver.PowerState) {
	t.Helper()
	got, err := d.State(context.Background(), id)
	if err != nil || got != want {
		t.Fatalf("State(%s) = %d, %v; want %d", id, got, err, want)
	}
}

func affinity(t *testing.T, tid int) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(tid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Cpus_allowed_list:"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

func TestProcessLifecycle(t *testing.T) {
	needQEMU(t)
	ctx := context.Background()
	goroutines := runtime.NumGoroutine()
	dir := t.TempDir()
	blank := filepath.Join(t.TempDir(), "blank.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", blank, "64M").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v %s", err, out)
	}
	store := newMemStore(t)
	store.add("blank", blank)
	events := newPowerEvents()
	d := newTestDriver(t, dir, store, func(c *Config) { c.ShutdownTimeout = 2 * time.Second })
	defer func() { d.Close() }()
	d.SetPowerListener(events.listen)

	host := testHost()
	pcpu := host.CPUs[len(host.CPUs)-1].ID
	id := uuid.NewString()
	spec := driver.Spec{ServerID: id, Name: "blank, with a comma", VCPUs: 1, MemoryMB: 64, DiskGB: 0,
		Image: refOf(t, "blank", "qcow2", blank), Cells: []driver.Cell{{Node: 0, CPUs: []int{pcpu}, MemoryMB: 64}},
		Ports: []driver.Port{{ID: "p1", MAC: "52:54:00:00:00:01", IP: "10.0.0.5", CIDR: "10.0.0.0/24", Gateway: "10.0.0.1"}}}
	start := time.Now()
	if err := d.Spawn(ctx, spec); err != nil {
		t.Fatalf("Spawn: %v", err)
	}
	t.Logf("spawn → QMP up: %v", time.Since(start))
	wantState(t, d, id, driver.Running)
	if err := d.Spawn(ctx, spec); err != nil {
		t.Fatalf("Spawn again: %v", err)
	}
	pid := pidOf(t, d, id)
	vdir := filepath.Join(dir, "instances", id)
	if fi, err := os.Stat(vdir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("server dir: %v %v", fi, err)
	}
	if fi, err := os.Stat(filepath.Join(vdir, diskFile)); err != nil || fi.Size() == 0 {
		t.Fatalf("disk: %v", err)
	}

	// Pinning: the vCPU on its pCPU, the other threads on the reserved CPU.
	v := d.lookup(id)
	tids, err := v.current().mon.VCPUThreads(ctx)
	if err != nil || len(tids) != 1 {
		t.Fatalf("VCPUThreads = %v, %v", tids, err)
	}
	if got := affinity(t, tids[0]); got != strconv.Itoa(pcpu) {
		t.Errorf("vCPU thread affinity %q, want %d", got, pcpu)
	}
	if len(host.ReservedCPUs) > 0 {
		if got := affinity(t, pid); got != "0" {
			t.Errorf("main thread affinity %q, want 0", got)
		}
	}
	acc, err := d.Access(ctx, id)
	if err != nil || len(acc) != 1 || acc[0].Protocol != "ssh" || acc[0].Port < 42000 || acc[0].Port > 42999 || acc[0].Host != "127.0.0.1" {
		t.Fatalf("Access = %+v, %v", acc, err)
	}
	list, _ := d.List(ctx)
	if len(list) != 1 || list[0].ID != id || list[0].Power != driver.Running || list[0].Host != "test-host" {
		t.Errorf("List = %+v", list)
	}
	hosts, _ := d.Hosts(ctx)
	if len(hosts) != 1 || hosts[0].Hypervisor == "" || hosts[0].Version < 1000000 || !hosts[0].Up {
		t.Errorf("Hosts = %+v", hosts)
	}
	t.Logf("host: %s %d (%s)", hosts[0].Hypervisor, hosts[0].Version, d.accelReason)

	// Pause and unpause, twice each (idempotent).
	for range 2 {
		if err := d.Pause(ctx, id); err != nil {
			t.Fatalf("Pause: %v", err)
		}
		wantState(t, d, id, driver.Paused)
	}
	for range 2 {
		if err := d.Unpause(ctx, id); err != nil {
			t.Fatalf("Unpause: %v", err)
		}
		wantState(t, d, id, driver.Running)
	}

	// Suspend to a file, resume from it.
	start = time.Now()
	if err := d.Suspend(ctx, id); err != nil {
		t.Fatalf("Suspend: %v", err)
	}
	t.Logf("suspend: %v", time.Since(start))
	wantState(t, d, id, driver.Shutdown)
	if !gone(pid) {
		t.Errorf("QEMU %d still there after suspend", pid)
	}
	if fi, err := os.Stat(filepath.Join(vdir, suspendFile)); err != nil || fi.Size() < 64<<10 {
		t.Fatalf("suspend state: %v %v", fi, err)
	}
	if err := d.Suspend(ctx, id); err != nil {
		t.Fatalf("Suspend again: %v", err)
	}
	start = time.Now()
	if err := d.Resume(ctx, id); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	t.Logf("resume: %v", time.Since(start))
	wantState(t, d, id, driver.Running)
	if fileExists(filepath.Join(vdir, suspendFile)) {
		t.Error("suspend state left after resume")
	}
	if err := d.Resume(ctx, id); err != nil {
		t.Fatalf("Resume again: %v", err)
	}

	// A graceful power-off of a guest that does not react: hard after
	// the timeout.
	pid = pidOf(t, d, id)
	start = time.Now()
	if err := d.PowerOff(ctx, id, true); err != nil {
		t.Fatalf("PowerOff: %v", err)
	}
	if el := time.Since(start); el < 2*time.Second || el > 15*time.Second {
		t.Errorf("graceful power-off of a deaf guest took %v", el)
	}
	wantState(t, d, id, driver.Shutdown)
	if !gone(pid) {
		t.Errorf("QEMU %d not reaped", pid)
	}
	if err := d.PowerOff(ctx, id, false); err != nil {
		t.Fatalf("PowerOff again: %v", err)
	}
	if err := d.PowerOn(ctx, id); err != nil {
		t.Fatalf("PowerOn: %v", err)
	}
	wantState(t, d, id, driver.Running)
	if err := d.Reboot(ctx, id, true); err != nil {
		t.Fatalf("hard Reboot: %v", err)
	}
	wantState(t, d, id, driver.Running)

	// Resize a running server: it stops, its disk grows, it starts with
	// the new memory.
	pid = pidOf(t, d, id)
	before, err := d.info(ctx, filepath.Join(vdir, diskFile), "qcow2", true)
	if err != nil {
		t.Fatal(err)
	}
	bigger := spec
	bigger.MemoryMB, bigger.DiskGB = 96, 1
	bigger.Cells = []driver.Cell{{Node: 0, CPUs: []int{pcpu}, MemoryMB: 96}}
	if err := d.Resize(ctx, bigger); err != nil {
		t.Fatalf("Resize: %v", err)
	}
	wantState(t, d, id, driver.Running)
	if newPid := pidOf(t, d, id); newPid == pid || !gone(pid) {
		t.Errorf("resize kept QEMU %d (now %d)", pid, newPid)
	}
	if cmdline, _ := os.ReadFile("/proc/" + strconv.Itoa(pidOf(t, d, id)) + "/cmdline"); !strings.Contains(string(cmdline), "\x00-m\x0096\x00") {
		t.Errorf("QEMU after resize: %q", cmdline)
	}
	if in, err := d.info(ctx, filepath.Join(vdir, diskFile), "qcow2", true); err != nil || in.VirtualSize != 1<<30 {
		t.Errorf("disk after resize: %d bytes, %v", in.VirtualSize, err)
	}
	// Revert: the disk the resize kept comes back, and is kept no more.
	reverted := spec
	reverted.Revert = true
	if err := d.Resize(ctx, reverted); err != nil {
		t.Fatalf("Resize (revert): %v", err)
	}
	if in, _ := d.info(ctx, filepath.Join(vdir, diskFile), "qcow2", true); in.VirtualSize != before.VirtualSize {
		t.Errorf("disk after revert: %d bytes, want %d", in.VirtualSize, before.VirtualSize)
	}
	if _, err := os.Stat(filepath.Join(vdir, keptFile)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the kept disk outlived the revert: %v", err)
	}
	if len(events.of(id)) != 0 {
		t.Errorf("the listener heard of the driver's own changes: %v", events.of(id))
	}

	// Agent restart: a new driver re-attaches the running QEMU.
	pid = pidOf(t, d, id)
	port := acc[0].Port
	d.Close()
	d = newTestDriver(t, dir, store, func(c *Config) { c.ShutdownTimeout = 2 * time.Second })
	d.SetPowerListener(events.listen)
	wantState(t, d, id, driver.Running)
	if got := pidOf(t, d, id); got != pid {
		t.Fatalf("re-attached pid %d, want %d", got, pid)
	}
	if acc, _ := d.Access(ctx, id); len(acc) != 1 || acc[0].Port != port {
		t.Errorf("Access after re-attach = %+v, want port %d", acc, port)
	}
	if err := d.Pause(ctx, id); err != nil {
		t.Fatalf("Pause re-attached: %v", err)
	}
	wantState(t, d, id, driver.Paused)
	if err := d.Unpause(ctx, id); err != nil {
		t.Fatalf("Unpause re-attached: %v", err)
	}
	// QEMU dies behind the driver's back: the listener hears Shutdown.
	syscall.Kill(pid, syscall.SIGKILL)
	waitFor(t, 10*time.Second, "the listener to hear of the dead QEMU", func() bool {
		ev := events.of(id)
		return len(ev) > 0 && ev[len(ev)-1] == driver.Shutdown
	})
	wantState(t, d, id, driver.Shutdown)
	if err := d.PowerOn(ctx, id); err != nil {
		t.Fatalf("PowerOn: %v", err)
	}

	// Host reboot: the QEMU dies while no agent runs; the next start
	// brings it back.
	pid = pidOf(t, d, id)
	d.Close()
	syscall.Kill(pid, syscall.SIGKILL)
	waitFor(t, 10*time.Second, "the killed QEMU to be reaped", func() bool { return gone(pid) })
	d = newTestDriver(t, dir, store, func(c *Config) { c.ShutdownTimeout = 2 * time.Second })
	waitFor(t, 30*time.Second, "the server to run again", func() bool {
		p, _ := d.State(ctx, id)
		return p == driver.Running
	})
	if got := pidOf(t, d, id); got == pid || got == 0 {
		t.Fatalf("pid after restart %d (was %d)", got, pid)
	}

	// Destroy leaves nothing.
	pid = pidOf(t, d, id)
	if err := d.Destroy(ctx, id); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	if !gone(pid) {
		t.Errorf("QEMU %d left after destroy", pid)
	}
	if _, err := os.Stat(vdir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("server dir left: %v", err)
	}
	if err := d.Destroy(ctx, id); err != nil {
		t.Errorf("Destroy again: %v", err)
	}
	if _, err := d.State(ctx, id); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("State after destroy: %v", err)
	}
	if err := d.PowerOn(ctx, id); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("PowerOn after destroy: %v", err)
	}

	// Nothing of the driver runs on once its VMs are gone and it is closed.
	d.Close()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > goroutines && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > goroutines {
		buf := make([]byte, 1<<20)
		t.Errorf("%d goroutines left (%d before):\n%s", n, goroutines, buf[:runtime.Stack(buf, true)])
	}
}

// TestStartFailures: an image that is not what it claims, and a QEMU that
// refuses to start, fail the spawn with the reason and leave no process.
func TestStartFailures(t *testing.T) {
	needQEMU(t)
	ctx := context.Background()
	dir := t.TempDir()
	store := newMemStore(t)
	d := newTestDriver(t, dir, store, nil)
	defer d.Close()

	// Garbage labelled qcow2.
	junk := filepath.Join(t.TempDir(), "junk")
	os.WriteFile(junk, []byte(strings.Repeat("not an image\n", 1000)), 0o600)
	store.add("junk", junk)
	id := uuid.NewString()
	err := d.Spawn(ctx, driver.Spec{ServerID: id, VCPUs: 1, MemoryMB: 64, Image: refOf(t, "junk", "qcow2", junk)})
	if err == nil || !strings.Contains(err.Error(), "raw, not its disk_format qcow2") {
		t.Errorf("Spawn of junk: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "instances", id)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("failed spawn left its directory: %v", err)
	}
	if _, err := d.State(ctx, id); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("State of a failed spawn: %v", err)
	}

	// A qcow2 with an impossible header: qemu-img says why.
	good := filepath.Join(t.TempDir(), "good.qcow2")
	exec.Command("qemu-img", "create", "-q", "-f", "qcow2", good, "64M").Run()
	b, _ := os.ReadFile(good)
	corrupt := filepath.Join(t.TempDir(), "corrupt.qcow2")
	b[23] = 40 // cluster_bits
	os.WriteFile(corrupt, b, 0o600)
	store.add("corrupt", corrupt)
	id = uuid.NewString()
	err = d.Spawn(ctx, driver.Spec{ServerID: id, VCPUs: 1, MemoryMB: 64, Image: refOf(t, "corrupt", "qcow2", corrupt)})
	t.Logf("corrupt qcow2: %v", err)
	if err == nil || !strings.Contains(err.Error(), "luster size") {
		t.Fatalf("Spawn of a corrupt qcow2: %v", err)
	}
	if p := readPid(filepath.Join(dir, "instances", id)); p != 0 && !gone(p) {
		t.Errorf("QEMU %d left behind", p)
	}
	d.Destroy(ctx, id)

	// QEMU itself refuses (more memory than it can take): the reason is
	// QEMU's, and no process is left.
	store.add("good", good)
	id = uuid.NewString()
	err = d.Spawn(ctx, driver.Spec{ServerID: id, VCPUs: 1, MemoryMB: 64 << 30, Image: refOf(t, "good", "qcow2", good)})
	t.Logf("huge VM: %v", err)
	if err == nil || !strings.Contains(err.Error(), "qemu-system-x86_64") {
		t.Errorf("Spawn of an impossible VM: %v", err)
	}
	if !errors.Is(err, errStartFailed) {
		t.Errorf("not a start failure: %v", err)
	}
	if p := readPid(filepath.Join(dir, "instances", id)); p != 0 && !gone(p) {
		t.Errorf("QEMU %d left behind", p)
	}
	if err := d.Destroy(ctx, id); err != nil {
		t.Errorf("Destroy: %v", err)
	}
	if ents, _ := os.ReadDir(filepath.Join(dir, "instances")); len(ents) != 0 {
		t.Errorf("instances left: %v", ents)
	}
}

// TestRunAs runs QEMU as an unprivileged user (only as root): it starts,
// suspends to a file and restores from it (both need QEMU, no longer root,
// to reach into the server directory), and stops.
func TestRunAs(t *testing.T) {
	needQEMU(t)
	if os.Geteuid() != 0 {
		t.Skip("not root")
	}
	if _, err := user.Lookup("nobody"); err != nil {
		t.Skip("no user nobody")
	}
	ctx := context.Background()
	dir := t.TempDir()
	// The test's temporary directories are 0700: let nobody pass.
	for p := dir; p != os.TempDir() && p != "/"; p = filepath.Dir(p) {
		os.Chmod(p, 0o711)
	}
	blank := filepath.Join(t.TempDir(), "blank.qcow2")
	exec.Command("qemu-img", "create", "-q", "-f", "qcow2", blank, "64M").Run()
	store := newMemStore(t)
	store.add("blank", blank)
	d := newTestDriver(t, dir, store, func(c *Config) { c.RunAs = "nobody"; c.ShutdownTimeout = time.Second })
	defer d.Close()
	id := uuid.NewString()
	if err := d.Spawn(ctx, driver.Spec{ServerID: id, VCPUs: 1, MemoryMB: 64, Image: refOf(t, "blank", "qcow2", blank)}); err != nil {
		t.Fatalf("Spawn: %v", err)
	}
	pid := pidOf(t, d, id)
	st, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if !strings.Contains(string(st), "\nUid:\t65534\t65534\t65534\t65534\n") {
		t.Errorf("QEMU does not run as nobody:\n%s", st)
	}
	if err := d.Suspend(ctx, id); err != nil {
		t.Fatalf("Suspend: %v", err)
	}
	if err := d.Resume(ctx, id); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	wantState(t, d, id, driver.Running)
	if err := d.PowerOff(ctx, id, false); err != nil {
		t.Fatalf("PowerOff: %v", err)
	}
	if err := d.Destroy(ctx, id); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
}
