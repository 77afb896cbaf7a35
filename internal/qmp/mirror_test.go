package qmp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestMirror drives Mirror against a fake QEMU: the switch asked for
// only once the job is ready (another job's events are not its own), a
// job that fails or is refused, and a caller that gives up before the
// switch (the job cancelled with force) or after it (a success).
func TestMirror(t *testing.T) {
	for _, tc := range []struct {
		name     string
		refuse   string // the command QEMU refuses
		ready    bool   // the job becomes ready
		end      string // after block-job-complete: "ok", "error", "never"
		cancelAt string // the caller gives up after this command
		wantErr  string
		want     []string
	}{
		{name: "switched", ready: true, end: "ok",
			want: []string{"blockdev-mirror", "block-job-complete"}},
		{name: "refused", refuse: "blockdev-mirror", wantErr: "Source and target image have different sizes",
			want: []string{"blockdev-mirror"}},
		{name: "fails before ready", ready: false, end: "error", wantErr: "Input/output error",
			want: []string{"blockdev-mirror"}},
		{name: "switch fails", ready: true, end: "error", wantErr: "Input/output error",
			want: []string{"blockdev-mirror", "block-job-complete"}},
		{name: "complete refused", ready: true, refuse: "block-job-complete", wantErr: "block-job-complete",
			want: []string{"blockdev-mirror", "block-job-complete", "block-job-cancel"}},
		{name: "cancelled before ready", cancelAt: "blockdev-mirror", wantErr: context.Canceled.Error(),
			want: []string{"blockdev-mirror", "block-job-cancel"}},
		{name: "cancelled after switch", ready: true, end: "ok-late", cancelAt: "block-job-complete",
			want: []string{"blockdev-mirror", "block-job-complete", "block-job-cancel"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var got []string
			gaveUp := make(chan string, 4)
			path := fakeServer(t, func(f *fakeConn, r request) {
				var args map[string]any
				json.Unmarshal(r.Arguments, &args)
				mu.Lock()
				got = append(got, r.Execute)
				mu.Unlock()
				if r.Execute == tc.refuse {
					f.replyErr(r, "GenericError", "Source and target image have different sizes")
					return
				}
				switch r.Execute {
				case "blockdev-mirror":
					if args["sync"] != "full" || args["device"] != "old" || args["target"] != "new" {
						t.Errorf("blockdev-mirror %v", args)
					}
					f.reply(r, `{}`)
					job := args["job-id"].(string)
					f.event("BLOCK_JOB_READY", `{"device": "other", "len": 1, "offset": 1, "type": "mirror"}`)
					switch {
					case tc.ready:
						f.event("BLOCK_JOB_READY", fmt.Sprintf(`{"device": %q, "len": 4096, "offset": 4096, "type": "mirror"}`, job))
					case tc.end == "error":
						f.event("BLOCK_JOB_COMPLETED", fmt.Sprintf(`{"device": %q, "len": 4096, "offset": 512, "error": "Input/output error", "type": "mirror"}`, job))
					}
				case "block-job-complete":
					f.reply(r, `{}`)
					job := args["device"].(string)
					switch tc.end {
					case "ok":
						f.event("BLOCK_JOB_COMPLETED", fmt.Sprintf(`{"device": %q, "len": 4096, "offset": 4096, "type": "mirror"}`, job))
					case "error":
						f.event("BLOCK_JOB_COMPLETED", fmt.Sprintf(`{"device": %q, "len": 4096, "offset": 4096, "error": "Input/output error", "type": "mirror"}`, job))
					}
				case "block-job-cancel":
					if args["force"] != true {
						t.Errorf("block-job-cancel %v: want force", args)
					}
					job := args["device"].(string)
					if tc.end == "ok-late" {
						// Too late to cancel: the switch is under way.
						f.replyErr(r, "GenericError", "Job 'x' in state 'pending' cannot accept command verb 'cancel'")
						f.event("BLOCK_JOB_COMPLETED", fmt.Sprintf(`{"device": %q, "len": 4096, "offset": 4096, "type": "mirror"}`, job))
						return
					}
					f.reply(r, `{}`)
					f.event("BLOCK_JOB_CANCELLED", fmt.Sprintf(`{"device": %q, "len": 4096, "offset": 512, "type": "mirror"}`, job))
					return
				default:
					f.reply(r, `{}`)
				}
				if r.Execute == tc.cancelAt {
					gaveUp <- r.Execute
				}
			})
			m := dial(t, path)
			ctx, cancel := context.WithCancel(ctxT(t, 10*time.Second))
			defer cancel()
			go func() {
				<-gaveUp
				cancel()
			}()
			err := m.Mirror(ctx, "old", "new")
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("Mirror: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("Mirror: %v, want an error with %q", err, tc.wantErr)
			}
			if tc.cancelAt == "blockdev-mirror" && !errors.Is(err, context.Canceled) {
				t.Errorf("Mirror: %v, want context.Canceled", err)
			}
			mu.Lock()
			defer mu.Unlock()
			if !slices.Equal(got, tc.want) {
				t.Errorf("commands:\n got %q\nwant %q", got, tc.want)
			}
		})
	}
}
