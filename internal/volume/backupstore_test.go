package volume_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"nimbus/internal/store"
	"nimbus/internal/testenv"
	"nimbus/internal/volume"
)

// TestBackupStore: chunks of zeros are holes, a short last chunk is kept
// whole, a restore overwrites garbage with the exact bytes, a damaged
// chunk fails the restore, chunks a crash left without a manifest are not
// a backup and go when that backup is deleted, and deleting the last
// backup empties the store.
func TestBackupStore(t *testing.T) {
	dir := t.TempDir()
	bs := volume.NewBackupStore(filepath.Join(dir, "store"))
	const cs = volume.BackupChunkSize
	src := filepath.Join(dir, "src")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	for off, seed := range map[int64]byte{0: 1, 3 * cs: 2} {
		if _, err := f.WriteAt(pattern(seed, cs), off); err != nil {
			t.Fatal(err)
		}
	}
	// Chunk 1 is written zeros, chunk 2 a hole, chunk 4 one byte.
	if _, err := f.WriteAt(make([]byte, cs), cs); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{7}, 4*cs); err != nil {
		t.Fatal(err)
	}
	f.Close()
	want, _ := os.ReadFile(src)

	m, err := bs.Create("a", "", src)
	if err != nil {
		t.Fatal(err)
	}
	holes := []bool{}
	for _, c := range m.Chunks {
		holes = append(holes, c == "")
	}
	if m.Stored != 3 || !slices.Equal(holes, []bool{false, true, true, false, false}) || m.Size != 4*cs+1 {
		t.Fatalf("manifest: stored %d, holes %v, size %d", m.Stored, holes, m.Size)
	}
	chunks := filepath.Join(dir, "store", "chunks", "*", "*")
	if n := countFiles(t, chunks); n != 3 {
		t.Fatalf("%d chunks stored, want 3", n)
	}

	dst := filepath.Join(dir, "dst")
	if err := os.WriteFile(dst, bytes.Repeat([]byte{0xff}, len(want)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := bs.Restore("a", dst); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(dst); !bytes.Equal(got, want) {
		t.Fatal("restored bytes differ from the source")
	}

	// A crash mid-create: chunks and a temporary file, no manifest.
	orphan := filepath.Join(dir, "store", "chunks", "ab", strings.Repeat("ab", 32))
	if err := os.MkdirAll(filepath.Dir(orphan), 0o700); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{orphan, orphan + ".tmp-1234"} {
		if err := os.WriteFile(p, []byte("half"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := bs.Manifest("b"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a backup without a manifest: %v", err)
	}
	if err := bs.Delete("b"); err != nil {
		t.Fatal(err)
	}
	if n := countFiles(t, chunks); n != 3 {
		t.Fatalf("after sweeping %d chunk files remain, want a's 3", n)
	}

	// A damaged chunk is found by its hash.
	if err := os.WriteFile(filepath.Join(dir, "store", "chunks", m.Chunks[3][:2], m.Chunks[3]), pattern(9, cs), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := bs.Restore("a", dst); err == nil || !strings.Contains(err.Error(), "does not match") {
		t.Fatalf("restore from a damaged chunk: %v", err)
	}

	if err := bs.Delete("a"); err != nil {
		t.Fatal(err)
	}
	if n := countFiles(t, chunks) + countFiles(t, filepath.Join(dir, "store", "manifests", "*")); n != 0 {
		t.Fatalf("%d files remain after deleting every backup", n)
	}
}

// oneService is a volume service on its own, over HTTP, as the one user.
type oneService struct {
	t   *testing.T
	srv *httptest.Server
	svc *volume.Service
}

// serviceConfig is a volume service's config on a fresh database and
// data directory.
func serviceConfig(t *testing.T, dbURL string) (volume.Config, *store.DB, string) {
	db, err := store.Open(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	root := t.TempDir()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	return volume.Config{DB: db, DataDir: filepath.Join(root, "volumes"), Log: quiet}, db, root
}

func startService(t *testing.T, cfg volume.Config) *oneService {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	svc := volume.New(cfg)
	t.Cleanup(svc.Close)
	if err := svc.Bootstrap(ctx); err != nil {
		t.Fatal(err)
	}
	a := svc.API(oneUser{}, "")
	a.Log = cfg.Log
	srv := httptest.NewServer(a)
	t.Cleanup(srv.Close)
	go svc.Run(ctx)
	return &oneService{t: t, srv: srv, svc: svc}
}

func (o *oneService) stop() { o.srv.Close(); o.svc.Close() }

// call sends a request, checks its status and answers the body.
func (o *oneService) call(method, path, body string, want int) string {
	o.t.Helper()
	resp, raw := testenv.Do(o.t, o.srv.Client(), method, o.srv.URL+path, "tok", body)
	testenv.MustStatus(o.t, resp, raw, want)
	return raw
}

func (o *oneService) waitFor(path, status string) {
	o.t.Helper()
	var raw string
	for i := 0; i < 500; i++ {
		_, raw = testenv.Do(o.t, o.srv.Client(), "GET", o.srv.URL+path, "tok", "")
		if strings.Contains(raw, `"status":"`+status+`"`) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	o.t.Fatalf("%s never reached %q: %s", path, status, raw)
}

// idIn is the 36-character id after "key":" in a JSON answer.
func idIn(raw, key string) string {
	i := strings.Index(raw, `"`+key+`":"`)
	return raw[i+len(key)+4:][:36]
}

// TestBackupResume: a backup whose controller stopped before its manifest
// was written is still creating, its volume backing-up; the next start
// makes it and frees the volume.
func TestBackupResume(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		cfg, db, root := serviceConfig(t, dbURL)
		o := startService(t, cfg)
		vol := idIn(o.call("POST", "/v3/volumes", `{"volume":{"size":1}}`, 202), "id")
		o.waitFor("/v3/volumes/"+vol, "available")
		im := image{}
		im.write(t, filepath.Join(root, "volumes", vol), 5*mib, pattern(5, mib))
		bk := idIn(o.call("POST", "/v3/backups", `{"backup":{"volume_id":"`+vol+`"}}`, 202), "id")
		o.waitFor("/v3/backups/"+bk, "available")
		o.stop()

		// As if the controller had stopped before the commit point.
		manifest := filepath.Join(root, "backups", "manifests", bk+".json")
		if err := os.Remove(manifest); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec(ctx, "UPDATE volume_backups SET status = 'creating' WHERE id = ?", bk); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec(ctx, "UPDATE volumes SET status = 'backing-up' WHERE id = ?", vol); err != nil {
			t.Fatal(err)
		}
		o = startService(t, cfg)
		o.waitFor("/v3/backups/"+bk, "available")
		o.waitFor("/v3/volumes/"+vol, "available")
		if _, err := os.Stat(manifest); err != nil {
			t.Fatalf("the resumed backup has no manifest: %v", err)
		}
		restored := idIn(o.call("POST", "/v3/backups/"+bk+"/restore", `{"restore":null}`, 202), "volume_id")
		o.waitFor("/v3/volumes/"+restored, "available")
		im.check(t, filepath.Join(root, "volumes", restored), 1<<30)
	})
}

// TestBackupBusyVolume: while its copy runs (held here on a volume file
// that is a FIFO) the volume is backing-up, and neither deleted, backed
// up again nor restored onto; once the copy ends it is available.
func TestBackupBusyVolume(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		cfg, _, root := serviceConfig(t, dbURL)
		o := startService(t, cfg)
		vol := idIn(o.call("POST", "/v3/volumes", `{"volume":{"size":1}}`, 202), "id")
		o.waitFor("/v3/volumes/"+vol, "available")
		other := idIn(o.call("POST", "/v3/volumes", `{"volume":{"size":1}}`, 202), "id")
		o.waitFor("/v3/volumes/"+other, "available")
		full := idIn(o.call("POST", "/v3/backups", `{"backup":{"volume_id":"`+other+`"}}`, 202), "id")
		o.waitFor("/v3/backups/"+full, "available")

		path := filepath.Join(root, "volumes", vol)
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mkfifo(path, 0o600); err != nil {
			t.Fatal(err)
		}
		// Opening the FIFO's other end lets the copy read an empty file;
		// without a reader waiting it does nothing, so release tries for
		// up to wait (the worker may not have opened it yet).
		release := func(wait time.Duration) {
			for end := time.Now().Add(wait); ; time.Sleep(20 * time.Millisecond) {
				if f, err := os.OpenFile(path, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
					f.Close()
					return
				}
				if time.Now().After(end) {
					return
				}
			}
		}
		t.Cleanup(func() { release(0) })
		bk := idIn(o.call("POST", "/v3/backups", `{"backup":{"volume_id":"`+vol+`"}}`, 202), "id")
		o.waitFor("/v3/volumes/"+vol, "backing-up")
		o.waitFor("/v3/backups/"+bk, "creating")
		o.call("DELETE", "/v3/volumes/"+vol, "", 400)
		o.call("POST", "/v3/backups", `{"backup":{"volume_id":"`+vol+`"}}`, 400)
		o.call("POST", "/v3/backups/"+full+"/restore", `{"restore":{"volume_id":"`+vol+`"}}`, 400)
		o.call("DELETE", "/v3/backups/"+bk, "", 400)
		release(10 * time.Second)
		o.waitFor("/v3/backups/"+bk, "available")
		o.waitFor("/v3/volumes/"+vol, "available")
	})
}
