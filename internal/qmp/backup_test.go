package qmp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestBackup drives Backup against a fake QEMU: the commands it sends,
// the target file made the node's size, the job's end it waits for
// (another job's end is not its own), and the target node (and
// descriptor set) removed whatever the outcome.
func TestBackup(t *testing.T) {
	for _, tc := range []struct {
		name    string
		file    bool
		refuse  bool   // blockdev-backup fails
		end     string // what the job's end event says: "ok", "error", "short", "never"
		cancel  bool   // the caller gives up while the job runs
		wantErr string
		want    []string
	}{
		{name: "by path", end: "ok",
			want: []string{"blockdev-add /srv/t", "blockdev-backup", "blockdev-del"}},
		{name: "by descriptor", file: true, end: "ok",
			want: []string{"add-fd", "blockdev-add /dev/fdset/7", "blockdev-backup", "blockdev-del", "remove-fd 7"}},
		{name: "job fails", end: "error", wantErr: "No space left on device",
			want: []string{"blockdev-add /srv/t", "blockdev-backup", "blockdev-del"}},
		{name: "job stops short", end: "short", wantErr: "stopped at 512 of 4096",
			want: []string{"blockdev-add /srv/t", "blockdev-backup", "blockdev-del"}},
		{name: "refused", file: true, refuse: true, wantErr: "blockdev-backup",
			want: []string{"add-fd", "blockdev-add /dev/fdset/7", "blockdev-backup", "blockdev-del", "remove-fd 7"}},
		{name: "cancelled", end: "never", cancel: true, wantErr: context.Canceled.Error(),
			want: []string{"blockdev-add /srv/t", "blockdev-backup", "block-job-cancel", "blockdev-del"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var got []string
			started := make(chan struct{})
			path := fakeServer(t, func(f *fakeConn, r request) {
				var args map[string]any
				json.Unmarshal(r.Arguments, &args)
				// Recorded before the answer, which may end the call.
				rec := r.Execute
				switch r.Execute {
				case "blockdev-add":
					rec += " " + args["file"].(map[string]any)["filename"].(string)
				case "remove-fd":
					rec += fmt.Sprint(" ", args["fdset-id"])
				}
				if rec != "query-named-block-nodes" {
					mu.Lock()
					got = append(got, rec)
					mu.Unlock()
				}
				switch r.Execute {
				case "query-named-block-nodes":
					f.reply(r, `[{"node-name": "other", "image": {"virtual-size": 1}}, {"node-name": "disk0", "image": {"virtual-size": 8192}}]`)
				case "add-fd":
					f.reply(r, `{"fdset-id": 7, "fd": 30}`)
				case "blockdev-backup":
					if args["sync"] != "full" || args["device"] != "disk0" || args["target"] == nil {
						t.Errorf("blockdev-backup %v", args)
					}
					if tc.refuse {
						f.replyErr(r, "GenericError", "Source and target image have different sizes")
						break
					}
					f.reply(r, `{}`)
					job := args["job-id"].(string)
					f.event("BLOCK_JOB_COMPLETED", `{"device": "other", "len": 1, "offset": 0, "type": "backup"}`)
					switch tc.end {
					case "ok":
						f.event("BLOCK_JOB_COMPLETED", fmt.Sprintf(`{"device": %q, "len": 4096, "offset": 4096, "type": "backup"}`, job))
					case "error":
						f.event("BLOCK_JOB_COMPLETED", fmt.Sprintf(`{"device": %q, "len": 4096, "offset": 512, "error": "No space left on device", "type": "backup"}`, job))
					case "short":
						f.event("BLOCK_JOB_COMPLETED", fmt.Sprintf(`{"device": %q, "len": 4096, "offset": 512, "type": "backup"}`, job))
					}
					close(started)
				case "block-job-cancel":
					f.reply(r, `{}`)
					f.event("BLOCK_JOB_CANCELLED", fmt.Sprintf(`{"device": %q, "len": 4096, "offset": 512, "type": "backup"}`, args["device"]))
				default:
					f.reply(r, `{}`)
				}
			})
			m := dial(t, path)
			ctx, cancel := context.WithCancel(ctxT(t, 10*time.Second))
			defer cancel()
			if tc.cancel {
				go func() {
					<-started
					time.Sleep(50 * time.Millisecond)
					cancel()
				}()
			}
			file := filepath.Join(t.TempDir(), "t")
			f, err := os.Create(file)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			target := BackupTarget{Path: file}
			if tc.file {
				target = BackupTarget{File: f}
			}
			err = m.Backup(ctx, "disk0", target)
			if fi, _ := os.Stat(file); fi.Size() != 8192 {
				t.Errorf("the target is %d bytes, want the node's 8192", fi.Size())
			}
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("Backup: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("Backup: %v, want an error with %q", err, tc.wantErr)
			}
			if tc.cancel && !errors.Is(err, context.Canceled) {
				t.Errorf("Backup: %v, want context.Canceled", err)
			}
			mu.Lock()
			defer mu.Unlock()
			for i, w := range tc.want {
				tc.want[i] = strings.ReplaceAll(w, "/srv/t", file)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("commands:\n got %q\nwant %q", got, tc.want)
			}
		})
	}
}
