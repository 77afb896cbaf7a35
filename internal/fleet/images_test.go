package fleet_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"nimbus/internal/driver"
	"nimbus/internal/fleet"
	"nimbus/internal/fleet/wire"
	"nimbus/internal/store"
	"nimbus/internal/store/storetest"
)

// memImages is an image service holding data in memory: "base" is active,
// "snap" is a snapshot of server s1 waiting for data.
type memImages struct {
	mu     sync.Mutex
	data   map[string][]byte
	format map[string]string
	of     map[string]string // snapshot → server
	direct map[string]*driver.ImageDirect
}

func (m *memImages) Direct(ctx context.Context, id string) (*driver.ImageDirect, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.data[id]; !ok {
		return nil, store.ErrNotFound
	}
	return m.direct[id], nil
}

func (m *memImages) Open(ctx context.Context, id string) (io.ReadCloser, int64, string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.data[id]
	if !ok {
		return nil, 0, "", store.ErrNotFound
	}
	return io.NopCloser(bytes.NewReader(b)), int64(len(b)), m.format[id], nil
}

func (m *memImages) SnapshotOf(ctx context.Context, id string) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.of[id]
	if !ok {
		return "", store.ErrNotFound
	}
	return s, nil
}

func (m *memImages) FinishSnapshot(ctx context.Context, id, format string, r io.Reader) error {
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, done := m.data[id]; done {
		return errors.New("already active")
	}
	m.data[id], m.format[id] = b, format
	return nil
}

// TestImageTransfer checks the agent API's image endpoints: an agent
// reads only the images its hosts' pending ops name (others are 404 as if
// they did not exist); only the agent compute asked for a server's
// snapshot stores it, into the image compute made for it, while compute
// has the server on that agent's host; no credential, no image.
func TestImageTransfer(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		logs := &logBuffer{}
		c := newController(t, dbURL, fleet.Config{Log: slog.New(slog.NewTextHandler(logs, nil))})
		data := map[string][]byte{}
		format := map[string]string{}
		for _, id := range []string{"base", "kernel", "ramdisk", "other"} {
			data[id], format[id] = []byte(id+" bytes"), "qcow2"
		}
		// snap is compute's snapshot of s1; forged is a customer's image
		// naming s1 as its instance_uuid, which no snapshot op names.
		im := &memImages{data: data, format: format, of: map[string]string{"snap": "s1", "forged": "s1", "base": ""},
			direct: map[string]*driver.ImageDirect{"base": {Conn: driver.VolumeConn{Driver: driver.VolumeRBD, Pool: "images",
				Image: "base", User: "nimbus", Key: "a2V5", Monitors: []string{"192.0.2.1:6789"}, SizeBytes: 10}, Snapshot: "snap"}}}
		c.svc.SetImages(im)
		pl := &placements{}
		c.svc.SetPlacements(pl)
		pl.set("s1", "hv-a")
		idA, a := enrolAgent(t, c, "a", "hv-a")
		_, b := enrolAgent(t, c, "b", "hv-b")
		anon := newAgentClient(t, c, "")
		agents := map[string]*agentClient{"a": a, "b": b, "": anon}

		// call runs a driver call in the background and answers the op
		// agent a got for it, and a func that finishes it.
		call := func(f func() error) (wire.Op, func()) {
			t.Helper()
			done := make(chan error, 1)
			go func() { done <- f() }()
			ops, err := c.svc.Poll(ctx, idA, nil, 5*time.Second)
			if err != nil || len(ops) != 1 {
				t.Fatalf("poll: %+v %v", ops, err)
			}
			return ops[0], func() {
				t.Helper()
				if _, err := c.svc.Record(ctx, idA, []wire.Result{{OpID: ops[0].ID, OK: true, Result: json.RawMessage(`{"size_bytes":1}`)}}); err != nil {
					t.Fatal(err)
				}
				if err := <-done; err != nil {
					t.Fatal(err)
				}
			}
		}
		type tc struct {
			name, method, image, agent, body string
			want                             int
		}
		run := func(cases []tc) {
			t.Helper()
			for _, tc := range cases {
				st, body := agents[tc.agent].do(tc.method, wire.PathImages+tc.image, tc.body)
				if st != tc.want {
					t.Errorf("%s: status %d (%s), want %d", tc.name, st, body, tc.want)
				}
				img, direct := strings.CutSuffix(tc.image, "?"+wire.QueryDirect)
				switch {
				case st == 200 && direct:
					var d driver.ImageDirect
					if err := json.Unmarshal([]byte(body), &d); err != nil || d.Conn.Image != img || d.Snapshot != "snap" || d.Conn.Key == "" {
						t.Errorf("%s: got %q (%v)", tc.name, body, err)
					}
				case st == 200 && body != tc.image+" bytes":
					t.Errorf("%s: got %q", tc.name, body)
				}
			}
		}

		_, finish := call(func() error {
			return c.svc.Spawn(ctx, driver.Spec{ServerID: "s1", Host: "hv-a", ImageID: "base",
				Image: driver.ImageRef{ID: "base", KernelID: "kernel", RamdiskID: "ramdisk"}})
		})
		run([]tc{
			{"read without credential", "GET", "base", "", "", 401},
			{"the spawning host reads its image", "GET", "base", "a", "", 200},
			{"and its kernel", "GET", "kernel", "a", "", 200},
			{"and its ramdisk", "GET", "ramdisk", "a", "", 200},
			{"an image no op names", "GET", "other", "a", "", 404},
			{"another agent reads the image", "GET", "base", "b", "", 404},
			{"unknown image", "GET", "nope", "a", "", 404},
			{"bad method", "DELETE", "base", "a", "", 405},
			{"where the host reads its image itself", "GET", "base?" + wire.QueryDirect, "a", "", 200},
			{"an image the host reads only through the API", "GET", "kernel?" + wire.QueryDirect, "a", "", 204},
			{"where an image no op names is", "GET", "other?" + wire.QueryDirect, "a", "", 404},
			{"where another agent's image is", "GET", "base?" + wire.QueryDirect, "b", "", 404},
		})
		finish()
		run([]tc{{"the image once the spawn is done", "GET", "base", "a", "", 404}})

		_, finish = call(func() error { _, err := c.svc.Snapshot(ctx, "s1", "snap"); return err })
		run([]tc{
			{"not a snapshot", "PUT", "base?disk_format=qcow2", "a", "x", 403},
			{"another agent's server", "PUT", "snap?disk_format=qcow2", "b", "stolen", 403},
			{"an image the pending snapshot is not", "PUT", "forged?disk_format=qcow2", "a", "forged", 403},
		})
		pl.set("s1", "hv-b") // compute has moved the server
		run([]tc{{"a server compute has elsewhere", "PUT", "snap?disk_format=qcow2", "a", "moved", 403}})
		pl.set("s1", "hv-a")
		run([]tc{{"the server's agent", "PUT", "snap?disk_format=qcow2", "a", "snapshot bytes", 204}})
		finish()
		if got := string(im.data["snap"]); got != "snapshot bytes" || im.format["snap"] != "qcow2" {
			t.Errorf("snapshot stored %q as %q", got, im.format["snap"])
		}
		if _, ok := im.data["forged"]; ok {
			t.Error("the forged image got data")
		}
		for _, want := range []string{"image read refused", "snapshot upload refused"} {
			if !strings.Contains(logs.String(), want) {
				t.Errorf("no %q logged", want)
			}
		}
	})
}
