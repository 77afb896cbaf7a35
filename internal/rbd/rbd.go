// Package rbd keeps volumes as Ceph RBD images: the volume service's Ceph
// backend, doing what Cinder's RBD driver (cinder/volume/drivers/rbd.py)
// and the RBD half of its Ceph backup driver do.
//
// It drives Debian's command-line tools (rbd, ceph, qemu-img) with
// --conf, --keyring and --id rather than linking librbd: go-ceph needs
// cgo and the librados/librbd headers at build time, which would end
// Nimbus's one static, cgo-free binary and tie every build to one Ceph
// release. Each call starts a process (about 20 ms against a local
// cluster), which volume operations can afford; the data path never
// goes through here, since QEMU opens images itself with librbd (see
// Conn and ImageOpts).
//
// Policies, as Cinder's driver has them:
//   - Images are named volume-<uuid> (volume_name_template) and
//     snapshots snapshot-<uuid>; backup images and snapshots follow the
//     Ceph backup driver (volume-<uuid>.backup.base, backup.<uuid>.snap.<time>).
//   - Snapshots are protected when made, so they can be cloned.
//   - CloneFromSnapshot makes a copy-on-write clone and flattens it only
//     with Config.FlattenFromSnapshot (rbd_flatten_volume_from_snapshot,
//     default off): deleting such a snapshot is refused while clones
//     depend on it, as is deleting a volume that has snapshots.
//   - CloneVolume snapshots the source as <dest>.clone_snap and clones
//     that; when the source already has MaxCloneDepth ancestors the clone
//     is flattened and the snapshot dropped (rbd_max_clone_depth, 5).
//     Deleting a source whose clones still hang on it renames it to
//     <name>.deleted; deleting the last such clone removes it.
package rbd

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Config is how to reach one pool of a Ceph cluster.
type Config struct {
	Conf    string // ceph.conf path (monitors)
	Keyring string // the client's keyring
	User    string // the client's name without "client." (rbd_user)
	Pool    string // the pool volumes live in (rbd_pool)
	// Key is the client's secret, handed to QEMU in Conn; read from
	// Keyring when empty.
	Key string
	// Monitors are the monitors' addresses ("host:port") handed to
	// QEMU in Conn; asked of the cluster (ceph mon dump) when empty.
	Monitors []string
	// Timeout bounds each metadata command (create, snapshot, ...);
	// default 2 minutes. LongTimeout bounds those that copy data
	// (flatten, copy, import, export); default 6 hours.
	Timeout, LongTimeout time.Duration
	// MaxCloneDepth is rbd_max_clone_depth: how many ancestors a clone
	// may have before CloneVolume flattens it; 0 means the default, 5,
	// and a negative value full copies instead of clones.
	MaxCloneDepth int
	// FlattenFromSnapshot is rbd_flatten_volume_from_snapshot.
	FlattenFromSnapshot bool
}

// Store is one pool's volumes. Its methods are safe for concurrent use;
// two operations on the same image are the caller's to serialise.
type Store struct {
	cfg Config
}

// New returns a store for cfg's pool. It does not contact the cluster.
func New(cfg Config) (*Store, error) {
	if cfg.Conf == "" || cfg.User == "" || cfg.Pool == "" {
		return nil, fmt.Errorf("rbd: config needs conf, user and pool")
	}
	if !poolRE.MatchString(cfg.Pool) {
		return nil, fmt.Errorf("rbd: invalid pool name %q", cfg.Pool)
	}
	if cfg.Key == "" && cfg.Keyring != "" {
		key, err := readKey(cfg.Keyring, cfg.User)
		if err != nil {
			return nil, err
		}
		cfg.Key = key
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Minute
	}
	if cfg.LongTimeout <= 0 {
		cfg.LongTimeout = 6 * time.Hour
	}
	if cfg.MaxCloneDepth == 0 {
		cfg.MaxCloneDepth = 5
	}
	return &Store{cfg: cfg}, nil
}

// InPool returns a store on another pool of the same cluster with the
// same client (the backup pool, say).
func (s *Store) InPool(pool string) (*Store, error) {
	if !poolRE.MatchString(pool) {
		return nil, fmt.Errorf("rbd: invalid pool name %q", pool)
	}
	cfg := s.cfg
	cfg.Pool = pool
	return &Store{cfg: cfg}, nil
}

// Pool is the store's pool.
func (s *Store) Pool() string { return s.cfg.Pool }

// readKey finds client.<user>'s key in a keyring file.
func readKey(keyring, user string) (string, error) {
	f, err := os.Open(keyring)
	if err != nil {
		return "", fmt.Errorf("rbd: %v", err)
	}
	defer f.Close()
	section := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]") {
			section = line[1 : len(line)-1]
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if ok && section == "client."+user && strings.TrimSpace(k) == "key" {
			return strings.TrimSpace(v), nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("rbd: %s: %v", keyring, err)
	}
	return "", fmt.Errorf("rbd: %s has no key for client.%s", keyring, user)
}

// Errors callers tell apart with errors.Is.
var (
	ErrNotFound = errors.New("not found")
	ErrExists   = errors.New("already exists")
	// ErrBusy: snapshots or clones depend on it, or a client has it open.
	ErrBusy    = errors.New("in use")
	ErrInvalid = errors.New("invalid request")
)

// CmdError is a failed command: what ran and what it said.
type CmdError struct {
	Args   []string // the command (never holds a key)
	Stderr string   // its last lines of standard error
	Errno  syscall.Errno
	Err    error // how it ended (exit status, timeout)
}

func (e *CmdError) Error() string {
	return fmt.Sprintf("%s: %v: %s", strings.Join(e.Args, " "), e.Err, e.Stderr)
}

func (e *CmdError) Unwrap() error { return e.Err }

// Is maps the errno rbd reports ("(2) No such file or directory") onto
// the package's errors.
func (e *CmdError) Is(target error) bool {
	switch target {
	case ErrNotFound:
		return e.Errno == syscall.ENOENT
	case ErrExists:
		return e.Errno == syscall.EEXIST
	case ErrBusy:
		return e.Errno == syscall.EBUSY || e.Errno == syscall.ENOTEMPTY
	case ErrInvalid:
		return e.Errno == syscall.EINVAL
	}
	return false
}

// errnoRE finds the errno in Ceph tools' messages, "(2) No such file".
var errnoRE = regexp.MustCompile(`\((\d+)\) [A-Z]`)

// cmd is one command to run.
type cmd struct {
	name   string
	args   []string
	long   bool // copies data: LongTimeout
	stdin  io.Reader
	stdout io.Writer // nil: captured and returned
}

// run runs c under its timeout and returns its standard output.
func (s *Store) run(ctx context.Context, c cmd) ([]byte, error) {
	timeout := s.cfg.Timeout
	if c.long {
		timeout = s.cfg.LongTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	x := exec.CommandContext(ctx, c.name, c.args...)
	// A killed rbd's children (none today) must not hold the pipes open.
	x.WaitDelay = 5 * time.Second
	x.Stdin = c.stdin
	var stdout bytes.Buffer
	var stderr tailBuffer
	x.Stdout = &stdout
	if c.stdout != nil {
		x.Stdout = c.stdout
	}
	x.Stderr = &stderr
	err := x.Run()
	if err == nil {
		return stdout.Bytes(), nil
	}
	if ctx.Err() != nil {
		err = fmt.Errorf("%v after %v: %w", err, timeout, ctx.Err())
	}
	return nil, cmdError(append([]string{c.name}, c.args...), &stderr, err)
}

// cmdError is a failed command's error, with the errno its last
// message names.
func cmdError(args []string, stderr *tailBuffer, err error) *CmdError {
	msg := stderr.text()
	e := &CmdError{Args: args, Stderr: msg, Err: err}
	if m := errnoRE.FindAllStringSubmatch(msg, -1); m != nil {
		n, _ := strconv.Atoi(m[len(m)-1][1])
		e.Errno = syscall.Errno(n)
	}
	return e
}

// rbd runs the rbd tool as the store's client.
func (s *Store) rbd(ctx context.Context, args ...string) ([]byte, error) {
	return s.run(ctx, cmd{name: "rbd", args: s.rbdArgs(args...)})
}

func (s *Store) rbdArgs(args ...string) []string {
	return append([]string{"--conf", s.cfg.Conf, "--keyring", s.cfg.Keyring, "--id", s.cfg.User}, args...)
}

// tailBuffer keeps the last 4 KiB written to it, without the
// harmless noise FINDINGS.md lists.
type tailBuffer struct{ b []byte }

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > 4096 {
		t.b = t.b[len(t.b)-4096:]
	}
	return len(p), nil
}

func (t *tailBuffer) text() string {
	var keep []string
	for _, l := range strings.Split(string(t.b), "\n") {
		if l = strings.TrimSpace(l); l == "" || strings.Contains(l, "F_SET_FILE_RW_HINT") || strings.Contains(l, "set_numa_affinity") {
			continue
		}
		keep = append(keep, l)
	}
	return strings.Join(keep, "; ")
}

// Names. Images and snapshots carry Cinder's names, so an operator who
// knows Cinder's pools finds their way; anything else is refused before
// it reaches a command line.
const uuidPat = `[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`

var (
	poolRE  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$`)
	imageRE = regexp.MustCompile(`^volume-` + uuidPat + `(\.backup\.base|\.backup\.` + uuidPat + `)?$`)
	snapRE  = regexp.MustCompile(`^(snapshot-` + uuidPat + `|backup\.` + uuidPat + `\.snap\.[0-9]+(\.[0-9]+)?)$`)
	// backupSnapRE: snapshots the backup driver leaves on a volume, which
	// go with it (Cinder's _delete_backup_snaps).
	backupSnapRE = regexp.MustCompile(`^backup\.` + uuidPat + `\.snap\.`)
)

// VolumeName is volume id's image (Cinder's volume_name_template).
func VolumeName(id string) string { return "volume-" + id }

// SnapshotName is snapshot id's name (snapshot_name_template).
func SnapshotName(id string) string { return "snapshot-" + id }

// BackupBaseName is the backup pool's image holding volume id's
// backups, one snapshot each (the Ceph backup driver's base image).
func BackupBaseName(volumeID string) string { return "volume-" + volumeID + ".backup.base" }

// BackupSnapName is backup id's snapshot, on the volume and on its
// base image (the Ceph backup driver's "backup.<id>.snap.<time>").
func BackupSnapName(backupID string, t time.Time) string {
	return fmt.Sprintf("backup.%s.snap.%d", backupID, t.Unix())
}

func checkImage(name string) error {
	if !imageRE.MatchString(name) {
		return fmt.Errorf("rbd: image name %q is not volume-<uuid>: %w", name, ErrInvalid)
	}
	return nil
}

func checkSnap(name string) error {
	if !snapRE.MatchString(name) {
		return fmt.Errorf("rbd: snapshot name %q is not snapshot-<uuid> or backup.<uuid>.snap.<time>: %w", name, ErrInvalid)
	}
	return nil
}

// spec is pool/image[@snap].
func (s *Store) spec(image string, snap ...string) string {
	if len(snap) > 0 && snap[0] != "" {
		return s.cfg.Pool + "/" + image + "@" + snap[0]
	}
	return s.cfg.Pool + "/" + image
}
