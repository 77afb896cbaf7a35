package qemu

import (
	"bytes"
	"context"
	"crypto/md5"
	"crypto/sha512"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"nimbus/internal/driver"
)

// needQEMU skips a test when QEMU's tools are missing, unless
// NIMBUS_REQUIRE_QEMU=1 makes that a failure (CI).
func needQEMU(t *testing.T, tools ...string) {
	t.Helper()
	if len(tools) == 0 {
		tools = []string{"qemu-system-x86_64", "qemu-img"}
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			if os.Getenv("NIMBUS_REQUIRE_QEMU") == "1" {
				t.Fatalf("%s is not installed and NIMBUS_REQUIRE_QEMU=1", tool)
			}
			t.Skipf("%s is not installed (apt-get install qemu-system-x86 qemu-utils; NIMBUS_REQUIRE_QEMU=1 makes this a failure)", tool)
		}
	}
}

// memStore is an ImageStore over files: images are served from their
// paths, uploads are written to dir and become images themselves.
type memStore struct {
	dir string

	mu      sync.Mutex
	files   map[string]string // image id → file
	opens   map[string]int
	uploads map[string]string // image id → disk format uploaded
	delay   time.Duration
}

func newMemStore(t *testing.T) *memStore {
	return &memStore{dir: t.TempDir(), files: map[string]string{}, opens: map[string]int{}, uploads: map[string]string{}}
}

func (s *memStore) add(id, path string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.files[id] = path
}

func (s *memStore) Open(ctx context.Context, id string) (io.ReadCloser, error) {
	s.mu.Lock()
	path, ok := s.files[id]
	s.opens[id]++
	delay := s.delay
	s.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("image %s: %w", id, os.ErrNotExist)
	}
	time.Sleep(delay)
	return os.Open(path)
}

func (s *memStore) Upload(ctx context.Context, id, diskFormat string, r io.Reader) error {
	path := filepath.Join(s.dir, id)
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.files[id] = path
	s.uploads[id] = diskFormat
	return nil
}

func (s *memStore) openCount(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.opens[id]
}

// refOf describes a file as the image service would: its md5 and sha512.
func refOf(t *testing.T, id, format, path string) driver.ImageRef {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m, s := md5.Sum(b), sha512.Sum512(b)
	return driver.ImageRef{ID: id, DiskFormat: format, Size: int64(len(b)),
		Checksum: hex.EncodeToString(m[:]), HashValue: hex.EncodeToString(s[:])}
}

func TestValidID(t *testing.T) {
	for id, ok := range map[string]bool{
		"0b9c5a53-3e0f-4c71-8a8e-3d1c2f0a9b7e": true,
		"0B9C5A53-3E0F-4C71-8A8E-3D1C2F0A9B7E": true,
		"":                                     false,
		"../../etc":                            false,
		"0b9c5a53-3e0f-4c71-8a8e-3d1c2f0a9b7e/..":       false,
		"{0b9c5a53-3e0f-4c71-8a8e-3d1c2f0a9b7e}":        false,
		"urn:uuid:0b9c5a53-3e0f-4c71-8a8e-3d1c2f0a9b7e": false,
	} {
		if validID(id) != ok {
			t.Errorf("validID(%q) = %v, want %v", id, !ok, ok)
		}
	}
}

func TestParseVersion(t *testing.T) {
	for in, want := range map[string]int{
		"QEMU emulator version 7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+b3)\nCopyright": 7002022,
		"QEMU emulator version 8.2.0":  8002000,
		"QEMU emulator version 10.1":   10001000,
		"QEMU emulator version 6.2.94": 6002094,
	} {
		got, err := parseVersion(in)
		if err != nil || got != want {
			t.Errorf("parseVersion(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	if _, err := parseVersion("nonsense"); err == nil {
		t.Error("parseVersion(nonsense) did not fail")
	}
}

func TestPinning(t *testing.T) {
	spec := driver.Spec{VCPUs: 3, Cells: []driver.Cell{{Node: 0, CPUs: []int{4, 5}}, {Node: 1, CPUs: []int{9}}}}
	if got := pinning(spec); fmt.Sprint(got) != "[4 5 9]" {
		t.Errorf("pinning = %v", got)
	}
	spec.VCPUs = 4 // cells do not cover the vCPUs: float
	if got := pinning(spec); got != nil {
		t.Errorf("pinning of partial cells = %v", got)
	}
}

func TestTailLines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "serial.log")
	var b bytes.Buffer
	for i := 1; i <= 1000; i++ {
		fmt.Fprintf(&b, "line %d\r\n", i)
		if i%100 == 0 {
			b.WriteByte(0)
		}
	}
	if err := os.WriteFile(path, b.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := tailLines(path, 3, 1<<20)
	if err != nil || got != "line 998\nline 999\nline 1000\n" {
		t.Errorf("tail 3 = %q, %v", got, err)
	}
	all, _ := tailLines(path, 0, 1<<20)
	if !strings.HasPrefix(all, "line 1\n") || strings.Count(all, "\n") != 1000 || strings.ContainsAny(all, "\x00\r") {
		t.Errorf("tail all: %d lines, starts %q", strings.Count(all, "\n"), all[:20])
	}
	capped, _ := tailLines(path, 0, 100)
	if !strings.HasSuffix(capped, "line 1000\n") || len(capped) > 100 || strings.HasPrefix(capped, "ine") {
		t.Errorf("capped tail = %q", capped)
	}
	// A partial last line is kept.
	os.WriteFile(path, []byte("a\nb\nprompt# "), 0o600)
	if got, _ := tailLines(path, 2, 1<<20); got != "b\nprompt# \n" {
		t.Errorf("tail with partial line = %q", got)
	}
	os.WriteFile(path, nil, 0o600)
	if got, _ := tailLines(path, 5, 1<<20); got != "" {
		t.Errorf("tail of empty = %q", got)
	}
}

func TestStateAtomic(t *testing.T) {
	dir := t.TempDir()
	st := state{Spec: driver.Spec{ServerID: "x", UserData: []byte("secret"), AdminPass: "pw"}, Power: wantRunning,
		Forwards: map[int]int{22: 20022}, Pinning: []int{1}}
	if err := writeState(dir, st); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(filepath.Join(dir, stateFile))
	if bytes.Contains(raw, []byte("secret")) || bytes.Contains(raw, []byte(`"pw"`)) {
		t.Errorf("state.json keeps secrets: %s", raw)
	}
	got, err := readState(dir)
	if err != nil || got.Forwards[22] != 20022 || got.Power != wantRunning || fmt.Sprint(got.Pinning) != "[1]" {
		t.Errorf("readState = %+v, %v", got, err)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 {
		t.Errorf("temporary files left: %v", ents)
	}
	if fi, _ := os.Stat(filepath.Join(dir, stateFile)); fi.Mode().Perm() != 0o600 {
		t.Errorf("state.json mode %v", fi.Mode())
	}
}

func TestPortPool(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	busy := l.Addr().(*net.TCPAddr).Port
	p := newPortPool(busy, busy+2, "127.0.0.1")
	p.claim("a", map[int]int{22: busy + 1})
	got, err := p.take("b")
	if err != nil || got != busy+2 {
		// busy is bound by someone else, busy+1 is a's.
		if err == nil && !portFree("127.0.0.1", got) {
			t.Fatalf("take = %d (busy %d)", got, busy)
		}
		if err != nil {
			t.Skipf("port %d taken by another process: %v", busy+2, err)
		}
	}
	if _, err := p.take("c"); !errors.Is(err, errNoPorts) {
		t.Errorf("take from a full range: %v", err)
	}
	p.release("a")
	if got, err := p.take("c"); err != nil || got != busy+1 {
		t.Errorf("take after release = %d, %v", got, err)
	}
}

// TestPortPoolKeepsServerPort: a server placed again — unshelved, on another
// pool (another host or a restarted agent) with the same range — gets the
// port it had while that port is free; another server holding it moves it
// elsewhere only until it is released.
func TestPortPoolKeepsServerPort(t *testing.T) {
	const lo, hi = 20000, 29999
	for _, id := range []string{"0b6c3c52-4d1e-4a53-9a38-1f0c2b7e9d10", "a", "server-with-a-long-id-0000000000000000"} {
		t.Run(id, func(t *testing.T) {
			first := newPortPool(lo, hi, "127.0.0.1")
			want, err := first.take(id)
			if err != nil {
				t.Fatal(err)
			}
			if want < lo || want > hi {
				t.Fatalf("take = %d, outside %d-%d", want, lo, hi)
			}
			first.release(id) // shelve
			for i := 0; i < 20; i++ {
				if _, err := first.take(fmt.Sprintf("other-%d", i)); err != nil {
					t.Fatal(err)
				}
			}
			if got, err := first.take(id); err != nil || got != want {
				t.Errorf("unshelve on the same host: port %d, %v; want %d", got, err, want)
			}
			other := newPortPool(lo, hi, "127.0.0.1")
			if got, err := other.take(id); err != nil || got != want {
				t.Errorf("unshelve on another host: port %d, %v; want %d", got, err, want)
			}
			held := newPortPool(lo, hi, "127.0.0.1")
			held.claim("holder", map[int]int{22: want})
			if got, err := held.take(id); err != nil || got == want {
				t.Errorf("take while %d is held = %d, %v; want another port", want, got, err)
			}
			held.release(id)
			held.release("holder")
			if got, err := held.take(id); err != nil || got != want {
				t.Errorf("take once %d is free again = %d, %v", want, got, err)
			}
		})
	}
}

func TestImageCache(t *testing.T) {
	needQEMU(t, "qemu-img")
	dir := t.TempDir()
	img := filepath.Join(dir, "base.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", img, "64M").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v %s", err, out)
	}
	store := newMemStore(t)
	store.add("img", img)
	store.delay = 200 * time.Millisecond
	d := &Driver{cfg: Config{QemuImg: "qemu-img"}, cache: newImageCache(filepath.Join(dir, "cache"), "qemu-img", nil)}
	ref := refOf(t, "img", "qcow2", img)

	// Concurrent spawns of one image download it once.
	var wg sync.WaitGroup
	var fails atomic.Int32
	paths := make([]string, 5)
	for i := range paths {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := d.cache.get(context.Background(), store, ref)
			if err != nil {
				t.Error(err)
				fails.Add(1)
			}
			paths[i] = p
		}()
	}
	wg.Wait()
	if n := store.openCount("img"); n != 1 {
		t.Errorf("downloaded %d times", n)
	}
	for _, p := range paths[1:] {
		if p != paths[0] {
			t.Errorf("paths differ: %v", paths)
		}
	}
	if fi, err := os.Stat(paths[0]); err != nil || fi.Mode().Perm() != 0o444 {
		t.Errorf("cached base: %v, %v", fi, err)
	}
	if !strings.HasSuffix(paths[0], "sha512-"+ref.HashValue) {
		t.Errorf("cache name %s", paths[0])
	}
	format, size, err := d.checkImage(context.Background(), paths[0], "qcow2")
	if err != nil || format != "qcow2" || size != 64<<20 {
		t.Errorf("checkImage = %s %d %v", format, size, err)
	}

	// A checksum mismatch leaves nothing in the cache.
	bad := ref
	bad.ID, bad.HashValue = "img", ""
	bad.Checksum = strings.Repeat("0", 32)
	if _, err := d.cache.get(context.Background(), store, bad); err == nil || !strings.Contains(err.Error(), "md5") {
		t.Errorf("bad checksum: %v", err)
	}
	ents, _ := os.ReadDir(d.cache.dir)
	if len(ents) != 1 {
		t.Errorf("cache holds %d files after a bad download", len(ents))
	}

	// The format must be what disk_format says, and a qcow2 must stand
	// alone.
	if _, _, err := d.checkImage(context.Background(), paths[0], "raw"); err == nil {
		t.Error("a qcow2 passed as raw")
	}
	overlay := filepath.Join(dir, "overlay.qcow2")
	exec.Command("qemu-img", "create", "-q", "-f", "qcow2", "-F", "qcow2", "-b", img, overlay).Run()
	if _, _, err := d.checkImage(context.Background(), overlay, "qcow2"); err == nil || !strings.Contains(err.Error(), "backing") {
		t.Errorf("qcow2 with a backing file: %v", err)
	}
	raw := filepath.Join(dir, "raw.img")
	os.WriteFile(raw, make([]byte, 1<<20), 0o600)
	if f, _, err := d.checkImage(context.Background(), raw, "raw"); err != nil || f != "raw" {
		t.Errorf("raw image: %s %v", f, err)
	}
	if _, _, err := d.checkImage(context.Background(), raw, "vmdk"); err == nil {
		t.Error("vmdk accepted")
	}
}

func TestTailOfQEMULog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "qemu.log")
	os.WriteFile(path, []byte("old failure\n# 2026 starting: qemu ...\nqemu-system-x86_64: -blockdev x: Could not open 'x': No such file\n"), 0o600)
	off := int64(len("old failure\n"))
	if got := logTail(path, off); got != "qemu-system-x86_64: -blockdev x: Could not open 'x': No such file" {
		t.Errorf("logTail = %q", got)
	}
}

// directStore is a memStore that also says where the host reads images
// itself.
type directStore struct {
	*memStore
	direct *driver.ImageDirect
	err    error
}

func (s *directStore) Direct(ctx context.Context, id string) (*driver.ImageDirect, error) {
	return s.direct, s.err
}

// TestImageCacheDirectFallback: an image the store says the host reads
// itself is downloaded through Open when that cannot be done, and the
// cache holds the same checked data either way.
func TestImageCacheDirectFallback(t *testing.T) {
	needQEMU(t, "qemu-img")
	dir := t.TempDir()
	img := filepath.Join(dir, "base.raw")
	if err := os.WriteFile(img, bytes.Repeat([]byte("nimbus"), 1000), 0o600); err != nil {
		t.Fatal(err)
	}
	rbdConn := driver.VolumeConn{Driver: driver.VolumeRBD, Pool: "images", Image: "img", User: "nimbus",
		Monitors: []string{"192.0.2.1:6789"}, SizeBytes: 6000}
	for _, tc := range []struct {
		name   string
		direct *driver.ImageDirect
		err    error
	}{
		{"no direct way", nil, nil},
		{"the store fails to say", nil, errors.New("controller answered 500")},
		{"a key that is no key", &driver.ImageDirect{Conn: func() driver.VolumeConn { c := rbdConn; c.Key = "not base64!"; return c }(), Snapshot: "snap"}, nil},
		{"no snapshot", &driver.ImageDirect{Conn: func() driver.VolumeConn { c := rbdConn; c.Key = "a2V5"; return c }()}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ms := newMemStore(t)
			ms.add("img", img)
			store := &directStore{memStore: ms, direct: tc.direct, err: tc.err}
			cache := newImageCache(filepath.Join(t.TempDir(), "cache"), "qemu-img", nil)
			ref := refOf(t, "img", "raw", img)
			p, err := cache.get(context.Background(), store, ref)
			if err != nil {
				t.Fatal(err)
			}
			if got, _ := os.ReadFile(p); !bytes.Equal(got, bytes.Repeat([]byte("nimbus"), 1000)) {
				t.Errorf("cached %d bytes, not the image", len(got))
			}
			if n := ms.openCount("img"); n != 1 {
				t.Errorf("downloaded %d times, want once", n)
			}
			if left, _ := filepath.Glob(filepath.Join(cache.dir, ".*")); len(left) > 0 {
				t.Errorf("left in the cache: %v", left)
			}
		})
	}
}
