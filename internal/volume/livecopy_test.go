package volume_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"nimbus/internal/driver"
	"nimbus/internal/store"
	"nimbus/internal/testenv"
	"nimbus/internal/volume"
)

// copier stands in for compute's live copy: it writes its mark at the
// start of the target (so the copy shows it went through it), or fails
// with err.
type copier struct {
	mu    sync.Mutex
	err   error
	calls []string // "server volume"
	sizes []int64  // the targets' sizes when called
}

var liveMark = []byte("copied live by the VM's QEMU")

func (c *copier) CopyVolumeLive(_ context.Context, server, vol, target string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls = append(c.calls, server+" "+vol)
	fi, err := os.Stat(target)
	if err != nil {
		return err
	}
	c.sizes = append(c.sizes, fi.Size())
	if c.err != nil {
		return c.err
	}
	f, err := os.OpenFile(target, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.WriteAt(liveMark, 0)
	return err
}

func (c *copier) set(err error) (calls []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	calls, c.calls, c.err = c.calls, nil, err
	return calls
}

// exportMark is what the stand-in export daemon's live copy writes.
var exportMark = []byte("copied live by the export's daemon")

// Backup makes the test exporter a live one: it writes its mark at the
// start of the target, for an export it serves.
func (x *exports) Backup(_ context.Context, name, target string) error {
	x.mu.Lock()
	_, ok := x.served[name]
	x.mu.Unlock()
	if !ok {
		return errors.New("not exported")
	}
	f, err := os.OpenFile(target, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.WriteAt(exportMark, 0)
	return err
}

// TestLiveCopy: a snapshot (force) of an in-use volume is copied by the
// process that writes it — compute's VM on the storage node's own host,
// the export's daemon for another host — and by the file when no VM runs
// (ErrNotRunning); a failed live copy fails the snapshot; a forced backup
// of an in-use volume reads a temporary live copy, removed after. With
// Cinder's status rules and messages.
func TestLiveCopy(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		e := newAttEnv(t, dbURL)
		cp := &copier{}
		e.svc.SetLiveCopier(cp)
		server := "6f1c3a4e-0000-4000-8000-0000000000c1"
		v := e.volume(t, "demo")
		fileMark := []byte("written to the file")
		f, err := os.OpenFile(e.svc.DataPath(v), os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteAt(fileMark, 0)
		f.Close()
		a, err := e.reserve(t, volume.ReserveRequest{ProjectID: "p1", VolumeID: v, ServerID: server})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := e.svc.Connect(ctx, a.ID, localHost); err != nil {
			t.Fatal(err)
		}
		e.tx(t, func(tx *store.Tx) error { return e.svc.Complete(ctx, tx, a.ID) })

		// Cinder's rules (cinder/volume/api.py create_snapshot_in_db).
		e.call(t, "POST", "/v3/snapshots", "demo", fmt.Sprintf(`{"snapshot":{"volume_id":%q}}`, v), 400)
		m := e.call(t, "POST", "/v3/snapshots", "demo", fmt.Sprintf(`{"snapshot":{"volume_id":%q,"force":false}}`, v), 400)
		if got := m["badRequest"].(map[string]any)["message"]; got != "Invalid volume: Volume "+v+" status must be available, but current status is: in-use." {
			t.Errorf("in-use without force: %v", got)
		}
		e.call(t, "POST", "/v3/snapshots", "other", fmt.Sprintf(`{"snapshot":{"volume_id":%q,"force":true}}`, v), 404)

		snap := func(tok string, want string) string {
			t.Helper()
			m := e.call(t, "POST", "/v3/snapshots", tok, fmt.Sprintf(`{"snapshot":{"volume_id":%q,"force":true}}`, v), 202)
			id := m["snapshot"].(map[string]any)["id"].(string)
			waitSnap(t, e.client(tok, ""), id, want)
			return id
		}
		startsWith := func(path string, b []byte) bool {
			t.Helper()
			got := make([]byte, len(b))
			f, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			f.ReadAt(got, 0)
			return bytes.Equal(got, b)
		}
		snapPath := func(id string) string { return filepath.Join(filepath.Dir(e.svc.DataPath(v)), "snapshots", id) }

		t.Run("local VM", func(t *testing.T) {
			id := snap("demo", "available")
			if calls := cp.set(nil); len(calls) != 1 || calls[0] != server+" "+v {
				t.Errorf("live copies: %v", calls)
			}
			if cp.sizes[len(cp.sizes)-1] != 1<<30 {
				t.Errorf("the target was %d bytes, want the volume's", cp.sizes[len(cp.sizes)-1])
			}
			if !startsWith(snapPath(id), liveMark) || fileSize(t, snapPath(id)) != 1<<30 {
				t.Error("the snapshot is not the live copy")
			}
			if left, _ := filepath.Glob(snapPath(id) + ".*"); len(left) > 0 {
				t.Errorf("left: %v", left)
			}
		})
		t.Run("no VM runs", func(t *testing.T) {
			cp.set(fmt.Errorf("compute: %w", driver.ErrNotRunning))
			id := snap("demo", "available")
			if calls := cp.set(nil); len(calls) != 1 {
				t.Errorf("live copies: %v", calls)
			}
			if !startsWith(snapPath(id), fileMark) {
				t.Error("the snapshot is not the file's copy")
			}
		})
		t.Run("live copy fails", func(t *testing.T) {
			cp.set(errors.New("qmp: the job failed"))
			snap("admin", "error")
			cp.set(nil)
		})
		t.Run("forced backup", func(t *testing.T) {
			e.call(t, "POST", "/v3/backups", "demo", fmt.Sprintf(`{"backup":{"volume_id":%q}}`, v), 400)
			m := e.call(t, "POST", "/v3/backups", "demo", fmt.Sprintf(`{"backup":{"volume_id":%q,"force":true}}`, v), 202)
			id := m["backup"].(map[string]any)["id"].(string)
			waitBackup(t, e.client("demo", ""), id, "available")
			if calls := cp.set(nil); len(calls) != 1 || calls[0] != server+" "+v {
				t.Errorf("live copies: %v", calls)
			}
			if left, _ := filepath.Glob(filepath.Join(filepath.Dir(e.svc.DataPath(v)), "snapshots", "backup-*")); len(left) > 0 {
				t.Errorf("temporary snapshot left: %v", left)
			}
			if s := e.status(t, v); s != "in-use" {
				t.Errorf("volume after the backup: %s", s)
			}
			m = e.call(t, "POST", "/v3/backups/"+id+"/restore", "demo", `{"restore":{"name":"r"}}`, 202)
			r := m["restore"].(map[string]any)["volume_id"].(string)
			waitStatus(t, e.client("demo", ""), r, "available")
			if !startsWith(e.svc.DataPath(r), liveMark) {
				t.Error("the backup is not of the live copy")
			}
		})
		t.Run("remote VM", func(t *testing.T) {
			if err := e.svc.Disconnect(ctx, a.ID); err != nil {
				t.Fatal(err)
			}
			if _, err := e.svc.Connect(ctx, a.ID, "compute-9"); err != nil {
				t.Fatal(err)
			}
			id := snap("demo", "available")
			if calls := cp.set(nil); len(calls) != 0 {
				t.Errorf("compute copied a remote host's volume: %v", calls)
			}
			if !startsWith(snapPath(id), exportMark) {
				b := make([]byte, 40)
				f, _ := os.Open(snapPath(id))
				f.ReadAt(b, 0)
				f.Close()
				t.Errorf("the snapshot is not the export's live copy: %q", strings.TrimRight(string(b), "\x00"))
			}
		})
	})
}
