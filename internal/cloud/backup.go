package cloud

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"nimbus/internal/store"
	"nimbus/internal/volume"
)

// BackupOptions say what nimbus admin backup copies and where to.
type BackupOptions struct {
	DataDir     string
	DatabaseURL string // "": the data directory's SQLite file, as serve
	// Dest is a directory to make, or a file to make ending in .tar,
	// .tar.gz or .tgz. Neither may exist yet.
	Dest string
	// SkipImages and SkipVolumes leave out the file stores' data (images/;
	// volumes/ and backups/), for operators who copy them otherwise.
	SkipImages, SkipVolumes bool
}

// BackupManifest is what a backup holds and leaves out, written into it as
// BackupManifestFile.
type BackupManifest struct {
	CreatedAt time.Time `json:"created_at"`
	// Database is "sqlite" (copied, as nimbus.db) or "postgres" (not
	// copied: PostgreSQL has its own tools).
	Database  string        `json:"database"`
	Files     int           `json:"files"`
	Bytes     int64         `json:"bytes"` // data copied (a volume's holes not counted)
	Copied    []BackupEntry `json:"copied"`
	NotCopied []BackupEntry `json:"not_copied"`
}

// BackupEntry is one entry of the data directory: what it is, and for one
// not copied, why a restore does not need it.
type BackupEntry struct {
	Path  string `json:"path"`
	Files int    `json:"files,omitempty"`
	Bytes int64  `json:"bytes,omitempty"`
	Why   string `json:"why"`
}

// BackupManifestFile is the manifest's name in a backup.
const BackupManifestFile = "nimbus-backup.json"

// backupDB is the database copy's name in a backup: the name serve opens
// in a data directory (DatabaseURL), so a backup restored as a data
// directory is a whole controller.
const backupDB = "nimbus.db"

// dataRule is what a restore makes of one entry of the data directory.
type dataRule struct {
	name string
	copy bool
	why  string
	// volumes or images: left out by SkipVolumes or SkipImages.
	volumes, images bool
}

// dataRules are the data directory's entries as cloud.Start and the
// services lay it out; an entry not named here is not copied.
var dataRules = []dataRule{
	{name: "ca.pem", copy: true, why: "the CA that agents and clients trust: with another CA every enrolled agent refuses the controller"},
	{name: "ca-key.pem", copy: true, why: "the CA's key, which issues the server certificate for new addresses"},
	{name: "server.pem", copy: true, why: "the server certificate (issued again when it does not cover the new addresses)"},
	{name: "server-key.pem", copy: true, why: "the server certificate's key"},
	{name: "secrets.json", copy: true, why: "the generated passwords of the first accounts, from which clouds.yaml is written"},
	{name: "clouds.yaml", copy: true, why: "the operator's client configuration (written again at each start)"},
	{name: "admin-openrc.sh", copy: true, why: "the admin's openrc (written again at each start)"},
	{name: "demo-openrc.sh", copy: true, why: "the demo user's openrc (written again at each start)"},
	{name: "agent.json", copy: true, why: "the local agent's credential: the restored controller's local agent is the agent that presents its hosts"},
	{name: "agent-name", copy: true, why: "the local agent's name"},
	{name: "images", copy: true, images: true, why: "image data of the file store"},
	{name: "volumes", copy: true, volumes: true, why: "volume data and volume snapshots of the file backend (a volume a VM writes is copied as it is then: snapshot or back it up for a consistent copy)"},
	{name: "backups", copy: true, volumes: true, why: "volume backups of the file backend"},
	{name: "nimbus.db-wal", why: "the live database's write-ahead log: the copy is whole without it"},
	{name: "nimbus.db-shm", why: "the live database's shared-memory index"},
	{name: "exports", why: "volume exports to other hosts, made again at start"},
	{name: "qemu", why: "the local QEMU host's VMs (disks, image cache, sockets): a VM belongs to its host; keep its data with snapshots or volume backups"},
	{name: "fake-fleet.json", why: "the fake driver's VMs: the local host's state, as qemu/ is"},
	{name: "agent-ops.jsonl", why: "the local agent's journal of work on this machine's VMs"},
}

// skipData reports whether a file inside a copied directory is work in
// progress rather than data: a temporary file a service renames into
// place when it is whole (".tmp"), the RBD backend's export scratch
// (".export-"), and the live copy a volume backup takes of an attached
// volume (volumes/snapshots/backup-<id>).
func skipData(rel string, d fs.DirEntry) bool {
	name := d.Name()
	return strings.Contains(name, ".tmp") || strings.HasPrefix(name, ".export-") ||
		(filepath.Dir(rel) == filepath.Join("volumes", "snapshots") && strings.HasPrefix(name, "backup-"))
}

// Backup copies what a restore of the controller on opt.DataDir needs into
// opt.Dest while the controller runs: first a consistent copy of an SQLite
// database (store.Backup), then the CA and keys, the secrets and client
// files, and the file stores' images, volumes and backups. Restored as a
// data directory (the directory itself, or the tar unpacked), it starts a
// controller with every account, server, ledger entry and image of the
// moment the database was copied. Files made after that moment are copied
// too (data no row names, harmless); data deleted during the copy may be
// missing from it.
//
// A backup is written beside Dest and renamed into place once whole, so
// that a backup that failed never looks like one that did.
func Backup(ctx context.Context, opt BackupOptions) (*BackupManifest, error) {
	data, err := filepath.Abs(opt.DataDir)
	if err != nil {
		return nil, err
	}
	dest, err := filepath.Abs(opt.Dest)
	if err != nil {
		return nil, err
	}
	if dest == data || strings.HasPrefix(dest, data+string(filepath.Separator)) {
		return nil, fmt.Errorf("backup: %s is inside the data directory %s: put the backup elsewhere", dest, data)
	}
	if _, err := os.Lstat(dest); err == nil {
		return nil, fmt.Errorf("backup: %s exists already", dest)
	}
	if fi, err := os.Stat(data); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("backup: no data directory at %s", data)
	}
	m := &BackupManifest{CreatedAt: time.Now().UTC(), Database: string(store.SQLite)}
	dbURL := DatabaseURL(data, opt.DatabaseURL)
	if strings.HasPrefix(dbURL, "postgres://") || strings.HasPrefix(dbURL, "postgresql://") {
		m.Database = string(store.Postgres)
	}

	partial := dest + ".partial"
	for _, p := range []string{partial, partial + ".db"} {
		if _, err := os.Lstat(p); err == nil {
			return nil, fmt.Errorf("backup: %s exists (a backup that was stopped?): remove it first", p)
		}
	}
	sink, err := newSink(partial)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			sink.abort()
			os.RemoveAll(partial)
		}
	}()
	if m.Database == string(store.SQLite) {
		if err := sink.database(ctx, dbURL, m); err != nil {
			return nil, err
		}
	} else {
		m.NotCopied = append(m.NotCopied, BackupEntry{Path: "database",
			Why: "PostgreSQL: copy it with pg_basebackup or pg_dump, or the HA engine's backups (docs/operator.md: Backups and restore)"})
	}
	if err := copyDataDir(ctx, data, opt, sink, m); err != nil {
		return nil, err
	}
	b, _ := json.MarshalIndent(m, "", "  ")
	if err := sink.bytes(BackupManifestFile, append(b, '\n')); err != nil {
		return nil, err
	}
	if err := sink.close(); err != nil {
		return nil, err
	}
	if err := os.Rename(partial, dest); err != nil {
		return nil, err
	}
	ok = true
	return m, nil
}

// copyDataDir copies the data directory's entries by dataRules.
func copyDataDir(ctx context.Context, data string, opt BackupOptions, sink backupSink, m *BackupManifest) error {
	entries, err := os.ReadDir(data)
	if err != nil {
		return err
	}
	rules := map[string]dataRule{}
	for _, r := range dataRules {
		rules[r.name] = r
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].Name() < entries[j].Name() })
	for _, e := range entries {
		r, known := rules[e.Name()]
		switch {
		case e.Name() == backupDB:
			continue // copied consistently, above
		case !known:
			m.NotCopied = append(m.NotCopied, BackupEntry{Path: e.Name(), Why: "not a file Nimbus keeps"})
			continue
		case !r.copy:
			m.NotCopied = append(m.NotCopied, BackupEntry{Path: e.Name(), Why: r.why})
			continue
		case (r.images && opt.SkipImages) || (r.volumes && opt.SkipVolumes):
			m.NotCopied = append(m.NotCopied, BackupEntry{Path: e.Name(), Why: "left out on request: " + r.why})
			continue
		}
		entry := BackupEntry{Path: e.Name(), Why: r.why}
		err := filepath.WalkDir(filepath.Join(data, e.Name()), func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				if errors.Is(err, fs.ErrNotExist) {
					return nil // deleted while the backup runs
				}
				return err
			}
			if err := ctx.Err(); err != nil {
				return err
			}
			rel, err := filepath.Rel(data, path)
			if err != nil {
				return err
			}
			if rel != e.Name() && skipData(rel, d) {
				if d.IsDir() {
					return filepath.SkipDir
				}
				return nil
			}
			switch {
			case d.IsDir():
				return sink.dir(rel)
			case d.Type().IsRegular():
				n, err := sink.file(ctx, rel, path)
				if errors.Is(err, fs.ErrNotExist) {
					return nil
				}
				entry.Files++
				entry.Bytes += n
				return err
			}
			return nil // sockets, links: nothing a restore reads
		})
		if err != nil {
			return fmt.Errorf("backup: %s: %w", e.Name(), err)
		}
		m.Copied = append(m.Copied, entry)
		m.Files += entry.Files
		m.Bytes += entry.Bytes
	}
	return nil
}

// backupSink is where a backup is written: a directory or a tar stream.
type backupSink interface {
	database(ctx context.Context, dbURL string, m *BackupManifest) error
	dir(rel string) error
	// file copies the file at src to rel and answers the bytes of data
	// written.
	file(ctx context.Context, rel, src string) (int64, error)
	bytes(rel string, b []byte) error
	close() error
	abort()
}

func newSink(partial string) (backupSink, error) {
	dest := strings.TrimSuffix(partial, ".partial")
	switch {
	case strings.HasSuffix(dest, ".tar"), strings.HasSuffix(dest, ".tar.gz"), strings.HasSuffix(dest, ".tgz"):
		f, err := os.OpenFile(partial, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return nil, fmt.Errorf("backup: %w", err)
		}
		s := &tarSink{f: f, scratch: partial + ".db"}
		var w io.Writer = f
		if !strings.HasSuffix(dest, ".tar") {
			s.gz = gzip.NewWriter(f)
			w = s.gz
		}
		s.out, s.tw = w, tar.NewWriter(w)
		return s, nil
	}
	if err := os.MkdirAll(filepath.Dir(partial), 0o700); err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	// The backup holds the CA key and passwords: the operator's alone.
	if err := os.Mkdir(partial, 0o700); err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	return &dirSink{root: partial}, nil
}

// dirSink writes a directory that is itself a data directory.
type dirSink struct{ root string }

func (s *dirSink) database(ctx context.Context, dbURL string, m *BackupManifest) error {
	if err := store.Backup(ctx, dbURL, filepath.Join(s.root, backupDB)); err != nil {
		return err
	}
	return addDBEntry(filepath.Join(s.root, backupDB), m)
}

func (s *dirSink) dir(rel string) error { return os.MkdirAll(filepath.Join(s.root, rel), 0o700) }

func (s *dirSink) file(ctx context.Context, rel, src string) (int64, error) {
	dst := filepath.Join(s.root, rel)
	if err := volume.CopyFile(ctx, src, dst); err != nil {
		return 0, err
	}
	return allocated(dst)
}

func (s *dirSink) bytes(rel string, b []byte) error {
	return os.WriteFile(filepath.Join(s.root, rel), b, 0o600)
}

func (s *dirSink) close() error { return syncDir(s.root) }
func (s *dirSink) abort()       {}

// tarSink writes a tar file (gzip-compressed for .tar.gz and .tgz) whose
// entries are relative to the data directory; sparse files keep their
// holes (backup_sparse.go).
type tarSink struct {
	f       *os.File
	gz      *gzip.Writer
	out     io.Writer // the stream under tw (f, or gz)
	tw      *tar.Writer
	scratch string // the database copy before it goes into the tar
}

func (s *tarSink) database(ctx context.Context, dbURL string, m *BackupManifest) error {
	defer os.Remove(s.scratch)
	if err := store.Backup(ctx, dbURL, s.scratch); err != nil {
		return err
	}
	if err := addDBEntry(s.scratch, m); err != nil {
		return err
	}
	_, err := s.file(ctx, backupDB, s.scratch)
	return err
}

func (s *tarSink) dir(rel string) error {
	return s.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: filepath.ToSlash(rel) + "/", Mode: 0o700, ModTime: time.Now()})
}

func (s *tarSink) file(ctx context.Context, rel, src string) (int64, error) {
	f, err := os.Open(src)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	name := filepath.ToSlash(rel)
	if allocatedBytes(fi) < fi.Size()-sparseWorthIt && len(name) < 80 {
		ext, err := dataExtents(f, fi.Size())
		if err != nil {
			return 0, err
		}
		if err := s.tw.Flush(); err != nil { // at a block boundary: the entry goes in as raw blocks
			return 0, err
		}
		return writeSparse(ctx, s.out, name, f, fi.Size(), ext, fi.ModTime())
	}
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o600, Size: fi.Size(), ModTime: fi.ModTime()}
	if err := s.tw.WriteHeader(hdr); err != nil {
		return 0, err
	}
	// A file that shrank while copied (none Nimbus keeps does: data files
	// are renamed into place whole) fails the backup rather than pad it.
	n, err := io.CopyN(s.tw, &ctxReader{ctx: ctx, r: f}, fi.Size())
	if err != nil {
		return n, fmt.Errorf("%s changed while copied: %w", rel, err)
	}
	return n, nil
}

func (s *tarSink) bytes(rel string, b []byte) error {
	if err := s.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: rel, Mode: 0o600, Size: int64(len(b)), ModTime: time.Now()}); err != nil {
		return err
	}
	_, err := s.tw.Write(b)
	return err
}

func (s *tarSink) close() error {
	if err := s.tw.Close(); err != nil {
		return err
	}
	if s.gz != nil {
		if err := s.gz.Close(); err != nil {
			return err
		}
	}
	if err := s.f.Sync(); err != nil {
		return err
	}
	return s.f.Close()
}

func (s *tarSink) abort() {
	s.f.Close()
	os.Remove(s.scratch)
}

// ctxReader stops a long copy when ctx ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

func addDBEntry(path string, m *BackupManifest) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	m.Copied = append(m.Copied, BackupEntry{Path: backupDB, Files: 1, Bytes: fi.Size(),
		Why: "the database: a consistent copy of one instant, taken while the controller runs"})
	m.Files++
	m.Bytes += fi.Size()
	return nil
}

// allocated is the data a file holds on disk (its holes not counted).
func allocated(path string) (int64, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	return min(fi.Size(), allocatedBytes(fi)), nil
}

func allocatedBytes(fi os.FileInfo) int64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Blocks * 512
	}
	return fi.Size()
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
