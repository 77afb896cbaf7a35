// Package blockexport serves volume files to other hypervisor hosts as NBD
// exports over TLS with a pre-shared key, using qemu-storage-daemon (Debian
// package qemu-system-common).
//
// One daemon per export. One daemon driven over QMP (nbd-server-start once,
// block-export-add/-del per volume) cannot keep volumes apart: a daemon has a
// single NBD server, its tls-creds-psk object has one psk-file (GnuTLS re-reads
// it on every handshake, so keys could be added live) and its tls-authz is
// server-wide, while block-export-add has no per-export TLS or authz member
// (checked in query-qmp-schema of QEMU 7.2). Any identity in the file could
// therefore open any export name. So each export gets its own daemon whose
// psk-file holds only that export's identity and key, with an authz-simple
// on that identity as a second lock, listening on its own port. The cost is
// a few MiB of RSS per exported volume. The daemon's TLS credentials, like
// the VM's QEMU's, have the priority driver.NBDTLSPriority (AES-GCM before
// ChaCha20, which cost a third more CPU per 4 KiB request; see there).
//
// Ports: we bind Addr:0 (or the port the export had before, see below) in Go
// and hand the listening socket to the daemon as fd 3 (addr.type=fd), so the
// port is known without racing another process for it.
//
// State lives in Dir/<name>/: keys.psk (mode 0600), export.json (path, mode,
// port, identity), qsd.pid and qmp.sock. The daemons are our children and do
// not outlive a restart on purpose: New kills any daemon left by a previous
// process (found by its pid file) and the volume service re-exports what its
// attachments need. Export then reuses the recorded key and port when the
// path and mode are unchanged, so a client that reconnects (QEMU's nbd
// reconnect-delay) finds the export where it was. Unexport forgets the key:
// a later export gets a new one.
//
// The file is opened with cache.direct=on and aio=native (no host page cache
// between the guest and the disk); where O_DIRECT is refused (tmpfs) it falls
// back to the page cache with aio=threads. Image locking is off in the daemon:
// the volume service decides who opens a volume, and a live migration off the
// storage node needs the local QEMU and the export to hold the file at once.
package blockexport

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"nimbus/internal/driver"
	"nimbus/internal/qmp"
)

// Config configures an Exporter.
type Config struct {
	Dir  string       // state: one directory per export (keys, pid, QMP socket)
	Addr string       // IP address to listen on and to give clients
	Bin  string       // qemu-storage-daemon binary; "" = from PATH
	Log  *slog.Logger // nil: slog.Default()
}

// ErrConflict is returned by Export when the name is already exported with
// another path or mode.
var ErrConflict = errors.New("blockexport: name already exported with another path or mode")

// ErrClosed is returned by Export after Close.
var ErrClosed = errors.New("blockexport: exporter closed")

// startTimeout bounds a daemon's start when ctx has no earlier deadline.
const startTimeout = 30 * time.Second

// stopTimeout is how long a daemon gets after SIGTERM before SIGKILL.
const stopTimeout = 5 * time.Second

var validName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// Exporter runs the exports of one storage node. Safe for concurrent use.
type Exporter struct {
	dir  string
	addr string
	bin  string
	log  *slog.Logger

	mu     sync.Mutex
	closed bool
	exps   map[string]*export
}

// export is one name's daemon. mu serialises its start and stop so that one
// slow start does not hold up other names.
type export struct {
	mu   sync.Mutex
	gone bool // removed from Exporter.exps: look the name up again

	rec      record
	conn     driver.VolumeConn
	proc     *os.Process
	exited   chan struct{} // closed once the daemon has been reaped
	stopping *atomic.Bool  // we asked it to exit (don't log its exit as a failure)
}

// record is export.json; the key itself is only in keys.psk.
type record struct {
	Path     string `json:"path"`
	ReadOnly bool   `json:"read_only"`
	Port     int    `json:"port"`
	Identity string `json:"identity"`
}

// New prepares Dir and kills daemons a previous process left running.
func New(cfg Config) (*Exporter, error) {
	if cfg.Dir == "" {
		return nil, errors.New("blockexport: Config.Dir is empty")
	}
	ip := net.ParseIP(cfg.Addr)
	if ip == nil || ip.IsUnspecified() {
		return nil, fmt.Errorf("blockexport: Config.Addr %q: need an IP address clients can reach", cfg.Addr)
	}
	bin := cfg.Bin
	if bin == "" {
		bin = "qemu-storage-daemon"
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		return nil, fmt.Errorf("blockexport: %w (Debian package qemu-system-common)", err)
	}
	log := cfg.Log
	if log == nil {
		log = slog.Default()
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("blockexport: %w", err)
	}
	e := &Exporter{dir: cfg.Dir, addr: ip.String(), bin: path, log: log, exps: map[string]*export{}}
	if err := e.reapStale(); err != nil {
		return nil, err
	}
	return e, nil
}

// Export makes path available as NBD export name and returns how another
// host reaches it. It is idempotent: while name is exported with the same
// path and mode it returns the same connection; with another path or mode it
// fails with ErrConflict (Unexport first). SizeBytes is the file's size now;
// the export keeps that size until it is exported again.
func (e *Exporter) Export(ctx context.Context, name, path string, readOnly bool) (driver.VolumeConn, error) {
	if !validName.MatchString(name) {
		return driver.VolumeConn{}, fmt.Errorf("blockexport: invalid export name %q", name)
	}
	if !filepath.IsAbs(path) {
		return driver.VolumeConn{}, fmt.Errorf("blockexport: path %q is not absolute", path)
	}
	var conn driver.VolumeConn
	err := e.locked(name, true, func(x *export) error {
		var err error
		conn, err = e.ensure(ctx, name, x, path, readOnly)
		if err != nil && x.proc == nil {
			e.drop(name, x) // nothing runs for it (a conflict leaves the running export be)
		}
		return err
	})
	return conn, err
}

// locked runs f with name's entry locked, creating the entry if needed
// (failing with ErrClosed after Close when create is set).
func (e *Exporter) locked(name string, create bool, f func(*export) error) error {
	for {
		e.mu.Lock()
		if create && e.closed {
			e.mu.Unlock()
			return ErrClosed
		}
		x := e.exps[name]
		if x == nil {
			x = &export{}
			e.exps[name] = x
		}
		e.mu.Unlock()

		x.mu.Lock()
		if x.gone {
			x.mu.Unlock()
			continue
		}
		err := f(x)
		x.mu.Unlock()
		return err
	}
}

// ensure starts x's daemon unless it runs already. Caller holds x.mu.
func (e *Exporter) ensure(ctx context.Context, name string, x *export, path string, readOnly bool) (driver.VolumeConn, error) {
	if x.proc != nil {
		select {
		case <-x.exited:
			e.log.Warn("blockexport: restarting exited daemon", "export", name)
			x.proc = nil
		default:
			if x.rec.Path != path || x.rec.ReadOnly != readOnly {
				return driver.VolumeConn{}, ErrConflict
			}
			return x.conn, nil
		}
	}
	return e.start(ctx, name, x, path, readOnly)
}

// drop removes x from the map. Caller holds x.mu.
func (e *Exporter) drop(name string, x *export) {
	x.gone = true
	e.mu.Lock()
	if e.exps[name] == x {
		delete(e.exps, name)
	}
	e.mu.Unlock()
}

// Unexport stops name's daemon and forgets its key. An unknown name is not
// an error.
func (e *Exporter) Unexport(ctx context.Context, name string) error {
	if !validName.MatchString(name) {
		return nil // cannot have been exported
	}
	return e.locked(name, false, func(x *export) error {
		err := e.stop(ctx, name, x)
		// Also when nothing ran (exported before a restart and not since):
		// the key must not come back with a later export.
		if rmErr := os.RemoveAll(filepath.Join(e.dir, name)); rmErr != nil {
			err = errors.Join(err, fmt.Errorf("blockexport: %w", rmErr))
		}
		e.drop(name, x)
		return err
	})
}

// Exports returns the names exported now, sorted.
func (e *Exporter) Exports() []string {
	e.mu.Lock()
	xs := make(map[string]*export, len(e.exps))
	for n, x := range e.exps {
		xs[n] = x
	}
	e.mu.Unlock()
	var names []string
	for n, x := range xs {
		x.mu.Lock()
		if !x.gone && x.proc != nil {
			select {
			case <-x.exited:
			default:
				names = append(names, n)
			}
		}
		x.mu.Unlock()
	}
	slices.Sort(names)
	return names
}

// Close stops every daemon. The keys and ports stay recorded so that a next
// process re-exporting the same volumes gives the same connections.
func (e *Exporter) Close() error {
	e.mu.Lock()
	e.closed = true
	xs := make(map[string]*export, len(e.exps))
	for n, x := range e.exps {
		xs[n] = x
	}
	e.mu.Unlock()
	var errs []error
	for n, x := range xs {
		x.mu.Lock()
		if !x.gone {
			errs = append(errs, e.stop(context.Background(), n, x))
			e.drop(n, x)
		}
		x.mu.Unlock()
	}
	return errors.Join(errs...)
}

// start runs a daemon for name. Caller holds x.mu and x.proc is nil.
func (e *Exporter) start(ctx context.Context, name string, x *export, path string, readOnly bool) (driver.VolumeConn, error) {
	direct, size, err := probe(path, readOnly)
	if err != nil {
		return driver.VolumeConn{}, err
	}
	dir := filepath.Join(e.dir, name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return driver.VolumeConn{}, fmt.Errorf("blockexport: %w", err)
	}
	rec, key := e.loadRecord(dir, path, readOnly)
	ln, err := e.listen(rec.Port)
	if err != nil {
		return driver.VolumeConn{}, err
	}
	rec.Port = ln.Addr().(*net.TCPAddr).Port
	lnFile, err := ln.File()
	ln.Close() // lnFile is a dup: the socket stays open for the daemon
	if err != nil {
		return driver.VolumeConn{}, fmt.Errorf("blockexport: %w", err)
	}
	defer lnFile.Close()
	if err := writeState(dir, rec, key); err != nil {
		return driver.VolumeConn{}, err
	}

	sock := filepath.Join(dir, "qmp.sock")
	pidFile := filepath.Join(dir, "qsd.pid")
	os.Remove(sock)
	args, err := daemonArgs(name, dir, rec, direct, sock, pidFile)
	if err != nil {
		return driver.VolumeConn{}, err
	}
	cmd := exec.Command(e.bin, args...)
	out := &tailBuffer{max: 4 << 10}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.ExtraFiles = []*os.File{lnFile} // fd 3
	if err := cmd.Start(); err != nil {
		return driver.VolumeConn{}, fmt.Errorf("blockexport: starting %s: %w", e.bin, err)
	}
	exited, stopping := make(chan struct{}), new(atomic.Bool)
	go func() {
		err := cmd.Wait()
		close(exited)
		if !stopping.Load() {
			e.log.Error("blockexport: daemon exited", "export", name, "err", err, "output", out.String())
		}
	}()
	x.proc, x.exited, x.stopping = cmd.Process, exited, stopping
	x.rec = rec

	if err := waitReady(ctx, sock, exited); err != nil {
		e.stop(context.Background(), name, x)
		return driver.VolumeConn{}, fmt.Errorf("blockexport: export %s did not start: %w; daemon said: %s",
			name, err, strings.TrimSpace(out.String()))
	}
	x.conn = driver.VolumeConn{
		Driver:      driver.VolumeNBD,
		Host:        e.addr,
		Port:        rec.Port,
		Export:      name,
		PSKIdentity: rec.Identity,
		PSKKey:      key,
		SizeBytes:   size,
	}
	e.log.Info("blockexport: exported", "export", name, "path", path, "read_only", readOnly,
		"port", rec.Port, "direct_io", direct, "pid", cmd.Process.Pid)
	return x.conn, nil
}

// daemonArgs builds the command line. Options are processed in order and
// the QMP monitor comes last, so a QMP answer means the export is up.
func daemonArgs(name, dir string, rec record, direct bool, sock, pidFile string) ([]string, error) {
	aio := "threads"
	if direct {
		aio = "native"
	}
	parts := []any{
		map[string]any{"qom-type": "tls-creds-psk", "id": "tls0", "endpoint": "server", "dir": dir,
			"priority": driver.NBDTLSPriority},
		map[string]any{"qom-type": "authz-simple", "id": "authz0", "identity": rec.Identity},
		map[string]any{
			"driver": "file", "node-name": "vol", "filename": rec.Path,
			"aio": aio, "cache": map[string]any{"direct": direct},
			"read-only": rec.ReadOnly, "discard": "unmap", "locking": "off",
		},
		map[string]any{
			"addr":      map[string]any{"type": "fd", "str": "3"},
			"tls-creds": "tls0", "tls-authz": "authz0",
		},
		map[string]any{"type": "nbd", "id": "exp0", "node-name": "vol", "name": name, "writable": !rec.ReadOnly},
	}
	js := make([]string, len(parts))
	for i, p := range parts {
		b, err := json.Marshal(p)
		if err != nil {
			return nil, fmt.Errorf("blockexport: %w", err)
		}
		js[i] = string(b)
	}
	return []string{
		"--pidfile", pidFile,
		"--object", js[0],
		"--object", js[1],
		"--blockdev", js[2],
		"--nbd-server", js[3],
		"--export", js[4],
		// QemuOpts syntax (no JSON for --chardev): a comma is written ",,".
		"--chardev", "socket,id=qmp,server=on,wait=off,path=" + strings.ReplaceAll(sock, ",", ",,"),
		"--monitor", "chardev=qmp",
	}, nil
}

// waitReady dials the daemon's QMP socket and checks that the export is
// listed, giving up when the daemon exits or ctx (at most startTimeout) ends.
func waitReady(ctx context.Context, sock string, exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	go func() {
		select {
		case <-exited:
			cancel()
		case <-ctx.Done():
		}
	}()
	m, err := qmp.Dial(ctx, sock)
	if err != nil {
		select {
		case <-exited:
			return errors.New("daemon exited")
		default:
			return err
		}
	}
	defer m.Close()
	var exps []struct {
		ID string `json:"id"`
	}
	if err := m.Execute(ctx, "query-block-exports", nil, &exps); err != nil {
		return err
	}
	if len(exps) != 1 || exps[0].ID != "exp0" {
		return fmt.Errorf("query-block-exports: %+v", exps)
	}
	return nil
}

// stop ends x's daemon: SIGTERM (QEMU closes the export and exits), SIGKILL
// after stopTimeout or when ctx ends. Caller holds x.mu.
func (e *Exporter) stop(ctx context.Context, name string, x *export) error {
	if x.proc == nil {
		return nil
	}
	x.stopping.Store(true)
	proc, exited := x.proc, x.exited
	x.proc = nil
	proc.Signal(syscall.SIGTERM)
	t := time.NewTimer(stopTimeout)
	defer t.Stop()
	select {
	case <-exited:
		e.log.Info("blockexport: unexported", "export", name)
		return nil
	case <-t.C:
	case <-ctx.Done():
	}
	proc.Kill()
	<-exited
	e.log.Warn("blockexport: daemon killed after SIGTERM timeout", "export", name)
	return nil
}

// probe checks that path opens in the wanted mode, whether it takes O_DIRECT
// (tmpfs refuses it with EINVAL) and its size (Seek also works for block
// devices, whose Stat size is 0).
func probe(path string, readOnly bool) (direct bool, size int64, err error) {
	flag := os.O_RDWR
	if readOnly {
		flag = os.O_RDONLY
	}
	f, err := openDirect(path, flag)
	direct = err == nil
	if errors.Is(err, syscall.EINVAL) {
		f, err = os.OpenFile(path, flag, 0)
	}
	if err != nil {
		return false, 0, fmt.Errorf("blockexport: %w", err)
	}
	defer f.Close()
	size, err = f.Seek(0, io.SeekEnd)
	if err != nil {
		return false, 0, fmt.Errorf("blockexport: %w", err)
	}
	return direct, size, nil
}

// openDirect opens with O_DIRECT; tests replace it.
var openDirect = openDirectReal

func openDirectReal(path string, flag int) (*os.File, error) {
	return os.OpenFile(path, flag|syscall.O_DIRECT, 0)
}

// loadRecord returns the recorded identity, key and port for dir when they
// were for the same path and mode, else a fresh identity and key and port 0.
func (e *Exporter) loadRecord(dir, path string, readOnly bool) (record, string) {
	var rec record
	b, err := os.ReadFile(filepath.Join(dir, "export.json"))
	if err == nil && json.Unmarshal(b, &rec) == nil && rec.Path == path && rec.ReadOnly == readOnly {
		if psk, err := os.ReadFile(filepath.Join(dir, "keys.psk")); err == nil {
			id, key, ok := strings.Cut(strings.TrimSpace(string(psk)), ":")
			if ok && id == rec.Identity && validKey(key) {
				return rec, key
			}
		}
	}
	raw := make([]byte, 32)
	rand.Read(raw)
	return record{Path: path, ReadOnly: readOnly, Identity: "nimbus-" + filepath.Base(dir)}, hex.EncodeToString(raw)
}

func validKey(k string) bool {
	b, err := hex.DecodeString(k)
	return err == nil && len(b) == 32
}

// listen binds Addr:port, falling back to a free port when the recorded one
// is taken.
func (e *Exporter) listen(port int) (*net.TCPListener, error) {
	addr := net.JoinHostPort(e.addr, strconv.Itoa(port))
	ln, err := net.Listen("tcp", addr)
	if err != nil && port != 0 {
		e.log.Warn("blockexport: recorded port taken, using another", "addr", addr, "err", err)
		ln, err = net.Listen("tcp", net.JoinHostPort(e.addr, "0"))
	}
	if err != nil {
		return nil, fmt.Errorf("blockexport: %w", err)
	}
	if err := noDelay(ln.(*net.TCPListener)); err != nil {
		ln.Close()
		return nil, fmt.Errorf("blockexport: %w", err)
	}
	return ln.(*net.TCPListener), nil
}

// writeState writes keys.psk (GnuTLS psk-file: "identity:hexkey") and
// export.json, each atomically and mode 0600.
func writeState(dir string, rec record, key string) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("blockexport: %w", err)
	}
	if err := writeFileAtomic(filepath.Join(dir, "keys.psk"), []byte(rec.Identity+":"+key+"\n")); err != nil {
		return err
	}
	return writeFileAtomic(filepath.Join(dir, "export.json"), b)
}

func writeFileAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("blockexport: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("blockexport: %w", err)
	}
	return nil
}

// reapStale kills the daemons named by Dir/*/qsd.pid. A pid is only
// signalled when its command line names that pid file, so a recycled pid of
// an unrelated process is left alone.
func (e *Exporter) reapStale() error {
	pidFiles, err := filepath.Glob(filepath.Join(e.dir, "*", "qsd.pid"))
	if err != nil {
		return fmt.Errorf("blockexport: %w", err)
	}
	for _, pf := range pidFiles {
		b, err := os.ReadFile(pf)
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err == nil && pid > 0 && isOurDaemon(pid, pf) {
			e.log.Warn("blockexport: killing daemon left by a previous process", "pid", pid, "pid_file", pf)
			if err := killWait(pid); err != nil {
				return err
			}
		}
		os.Remove(pf)
		os.Remove(filepath.Join(filepath.Dir(pf), "qmp.sock"))
	}
	return nil
}

func isOurDaemon(pid int, pidFile string) bool {
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return false
	}
	return slices.Contains(strings.Split(string(cmdline), "\x00"), pidFile)
}

// killWait sends SIGTERM, then SIGKILL, and waits until pid is gone (or a
// zombie, which its new parent reaps).
func killWait(pid int) error {
	proc := "/proc/" + strconv.Itoa(pid)
	gone := func() bool {
		stat, err := os.ReadFile(proc + "/stat")
		if err != nil {
			return true
		}
		// "pid (comm) S ...": the state follows the last ')'. A zombie
		// leader may still have threads that hold the files (the listening
		// socket), so also wait for them. (Not the cmdline: it empties
		// when the process drops its memory, before its files.)
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 || i+2 >= len(stat) || stat[i+2] != 'Z' {
			return false
		}
		tasks, err := os.ReadDir(proc + "/task")
		return err != nil || len(tasks) <= 1
	}
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		if err := syscall.Kill(pid, sig); err != nil {
			if errors.Is(err, syscall.ESRCH) {
				return nil
			}
			return fmt.Errorf("blockexport: killing stale daemon %d: %w", pid, err)
		}
		for deadline := time.Now().Add(stopTimeout); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if gone() {
				return nil
			}
		}
	}
	return fmt.Errorf("blockexport: stale daemon %d survived SIGKILL", pid)
}

// tailBuffer keeps the last max bytes written (the daemon's messages).
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append(t.b[:0], t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}
