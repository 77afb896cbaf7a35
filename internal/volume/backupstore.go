package volume

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"github.com/google/uuid"
)

// BackupChunkSize is the size of the pieces a backup is cut into: each is
// stored once per content, named by its sha256.
const BackupChunkSize = 4 << 20

// BackupStore keeps volume backups in a directory apart from the volumes:
// chunks/<aa>/<sha256> holds each distinct chunk once, manifests/<backup
// id>.json lists a backup's chunks in order ("" for a chunk of zeros,
// which is not stored). A manifest, fsync'd and renamed into place after
// every chunk it names, is the commit point: a backup without one does
// not exist, whatever chunks a crash left.
type BackupStore struct {
	dir string
	// mu keeps a deletion's sweep from removing a chunk that a backup
	// being written found present and so did not write again.
	mu sync.RWMutex
}

// Manifest is one backup's list of chunks.
type Manifest struct {
	BackupID  string   `json:"backup_id"`
	ParentID  string   `json:"parent_id,omitempty"`
	Size      int64    `json:"size_bytes"`
	ChunkSize int64    `json:"chunk_size"`
	Chunks    []string `json:"chunks"`
	// Stored is how many of the chunks this backup wrote or, for an
	// incremental, found different from its parent's: Cinder's
	// object_count.
	Stored int `json:"stored"`
}

// NewBackupStore opens (making it if needed) a backup store at dir.
func NewBackupStore(dir string) *BackupStore { return &BackupStore{dir: dir} }

func (bs *BackupStore) manifestPath(id string) string {
	return filepath.Join(bs.dir, "manifests", id+".json")
}

func (bs *BackupStore) chunkPath(sum string) string {
	return filepath.Join(bs.dir, "chunks", sum[:2], sum)
}

// Manifest reads backup id's manifest; os.ErrNotExist when it has none.
func (bs *BackupStore) Manifest(id string) (*Manifest, error) {
	raw, err := os.ReadFile(bs.manifestPath(id))
	if err != nil {
		return nil, err
	}
	m := &Manifest{}
	if err := json.Unmarshal(raw, m); err != nil {
		return nil, fmt.Errorf("backup %s: bad manifest: %w", id, err)
	}
	return m, nil
}

// Create backs up the file at src as backup id. With a parent, a chunk
// whose hash equals the parent's at the same place is taken from the
// parent's manifest without being written. A backup already committed is
// left as it is, so that a create resumed after a crash is a no-op.
func (bs *BackupStore) Create(id, parentID, src string) (*Manifest, error) {
	if m, err := bs.Manifest(id); err == nil {
		return m, nil
	}
	bs.mu.RLock()
	defer bs.mu.RUnlock()
	var parent *Manifest
	if parentID != "" {
		var err error
		if parent, err = bs.Manifest(parentID); err != nil {
			return nil, fmt.Errorf("parent backup %s: %w", parentID, err)
		}
	}
	f, err := os.Open(src)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	m := &Manifest{BackupID: id, ParentID: parentID, Size: fi.Size(), ChunkSize: BackupChunkSize}
	buf := make([]byte, BackupChunkSize)
	for off, i := int64(0), 0; off < m.Size; off, i = off+BackupChunkSize, i+1 {
		n := min(BackupChunkSize, m.Size-off)
		sum, err := bs.readChunk(f, buf[:n], off)
		if err != nil {
			return nil, err
		}
		m.Chunks = append(m.Chunks, sum)
		if sum == "" || (parent != nil && i < len(parent.Chunks) && parent.Chunks[i] == sum) {
			continue
		}
		if err := bs.putChunk(sum, buf[:n]); err != nil {
			return nil, err
		}
		m.Stored++
	}
	if err := bs.writeManifest(m); err != nil {
		return nil, err
	}
	return m, nil
}

// readChunk reads the chunk at off into buf and answers its sha256, or ""
// when it is all zeros. A chunk wholly inside a hole of a sparse file is
// known to be zeros without reading it.
func (bs *BackupStore) readChunk(f *os.File, buf []byte, off int64) (string, error) {
	const seekData = 3 // SEEK_DATA
	if next, err := f.Seek(off, seekData); err == nil && next >= off+int64(len(buf)) {
		return "", nil
	} else if errors.Is(err, syscall.ENXIO) {
		return "", nil // no data from off to the end
	}
	if _, err := f.ReadAt(buf, off); err != nil && !errors.Is(err, io.EOF) {
		return "", err
	}
	if isZero(buf) {
		return "", nil
	}
	s := sha256.Sum256(buf)
	return hex.EncodeToString(s[:]), nil
}

func isZero(b []byte) bool {
	var zero [4096]byte
	for len(b) > 0 {
		n := min(len(b), len(zero))
		if !bytes.Equal(b[:n], zero[:n]) {
			return false
		}
		b = b[n:]
	}
	return true
}

// putChunk stores data under its hash unless a chunk of that hash is
// there: written to a temporary file, fsync'd and renamed, so a chunk's
// name always holds all of it.
func (bs *BackupStore) putChunk(sum string, data []byte) error {
	path := bs.chunkPath(sum)
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return writeSynced(path, data)
}

// writeSynced writes data to path through a fsync'd temporary file and a
// rename, then fsyncs the directory so the rename survives a crash.
func writeSynced(path string, data []byte) error {
	tmp := path + ".tmp-" + uuid.NewString()[:8]
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return syncDir(filepath.Dir(path))
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

func (bs *BackupStore) writeManifest(m *Manifest) error {
	raw, err := json.Marshal(m)
	if err != nil {
		return err
	}
	path := bs.manifestPath(m.BackupID)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return writeSynced(path, raw)
}

// Restore writes backup id's data over the file at dst from its start,
// sparse: a chunk of zeros becomes a hole. Each chunk is checked against
// its hash, so a damaged store fails the restore instead of corrupting the
// volume.
func (bs *BackupStore) Restore(id, dst string) error {
	m, err := bs.Manifest(id)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(dst, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if fi.Size() < m.Size {
		return fmt.Errorf("volume file is %d bytes, smaller than the backup's %d", fi.Size(), m.Size)
	}
	for i, sum := range m.Chunks {
		off := int64(i) * m.ChunkSize
		n := min(m.ChunkSize, m.Size-off)
		if err := bs.restoreChunk(f, sum, off, n); err != nil {
			return fmt.Errorf("backup %s chunk %d: %w", id, i, err)
		}
	}
	return f.Sync()
}

func (bs *BackupStore) restoreChunk(f *os.File, sum string, off, n int64) error {
	if sum == "" {
		return zeroRange(f, off, n)
	}
	data, err := os.ReadFile(bs.chunkPath(sum))
	if err != nil {
		return err
	}
	if s := sha256.Sum256(data); hex.EncodeToString(s[:]) != sum || int64(len(data)) != n {
		return errors.New("chunk does not match its hash")
	}
	_, err = f.WriteAt(data, off)
	return err
}

// zeroRange makes n bytes at off read as zeros: a punched hole, or zeros
// written where the file system cannot punch.
func zeroRange(f *os.File, off, n int64) error {
	const punchHole, keepSize = 0x2, 0x1 // FALLOC_FL_PUNCH_HOLE, FALLOC_FL_KEEP_SIZE
	if syscall.Fallocate(int(f.Fd()), punchHole|keepSize, off, n) == nil {
		return nil
	}
	_, err := f.WriteAt(make([]byte, n), off)
	return err
}

// Delete removes backup id: its manifest first (after which it no longer
// exists), then the chunks no other manifest names. A backup without a
// manifest (one whose create failed) may have left chunks no manifest
// names; its deletion sweeps every such chunk.
func (bs *BackupStore) Delete(id string) error {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	m, err := bs.Manifest(id)
	if errors.Is(err, os.ErrNotExist) {
		return bs.sweep(nil)
	}
	if err != nil {
		return err
	}
	if err := os.Remove(bs.manifestPath(id)); err != nil {
		return err
	}
	return bs.sweep(m.Chunks)
}

// sweep removes the chunks of candidates (nil: every chunk) that no
// manifest names. Called with mu held for writing.
func (bs *BackupStore) sweep(candidates []string) error {
	used, err := bs.referenced()
	if err != nil {
		return err
	}
	if candidates == nil {
		paths, err := filepath.Glob(filepath.Join(bs.dir, "chunks", "*", "*"))
		if err != nil {
			return err
		}
		for _, p := range paths {
			candidates = append(candidates, filepath.Base(p))
		}
	}
	for _, sum := range candidates {
		if len(sum) < 2 || used[sum] {
			continue
		}
		// Temporary files left by a crash go too (their names are not hashes).
		if err := os.Remove(bs.chunkPath(sum)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

// referenced is every chunk some manifest names.
func (bs *BackupStore) referenced() (map[string]bool, error) {
	paths, err := filepath.Glob(filepath.Join(bs.dir, "manifests", "*.json"))
	if err != nil {
		return nil, err
	}
	used := map[string]bool{}
	for _, p := range paths {
		raw, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		var m Manifest
		if err := json.Unmarshal(raw, &m); err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		for _, c := range m.Chunks {
			used[c] = true
		}
	}
	return used, nil
}
