package fleet_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net/http"
	"os"
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

// TestImageTransfer checks the agent API's image endpoints: any agent
// reads an image; only the agent whose host has the server stores its
// snapshot; no credential, no image.
func TestImageTransfer(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		c := newController(t, dbURL, fleet.Config{})
		im := &memImages{data: map[string][]byte{"base": []byte("qcow2 bytes")}, format: map[string]string{"base": "qcow2"},
			of: map[string]string{"snap": "s1", "base": ""}}
		c.svc.SetImages(im)
		creds := map[string]string{}
		for _, a := range []struct{ agent, host string }{{"a", "hv-a"}, {"b", "hv-b"}} {
			id, cred, err := c.svc.NewAgent(ctx, a.agent)
			if err != nil {
				t.Fatal(err)
			}
			creds[a.agent] = cred
			if _, err := c.svc.Register(ctx, id, []driver.Host{{Name: a.host, VCPUs: 4, MemoryMB: 4096, Up: true}}); err != nil {
				t.Fatal(err)
			}
			hb := wire.Heartbeat{Observed: time.Now().UnixNano(), Hosts: []wire.HostStatus{{Name: a.host, Up: true}}}
			if a.agent == "a" {
				hb.Instances = []wire.Instance{{ID: "s1", Host: "hv-a", Power: driver.Running}}
			}
			if _, err := c.svc.Heartbeat(ctx, id, hb); err != nil {
				t.Fatal(err)
			}
		}
		pem, err := os.ReadFile(c.ca)
		if err != nil {
			t.Fatal(err)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(pem)
		client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
		do := func(method, image, cred, body string) (int, string, http.Header) {
			t.Helper()
			req, _ := http.NewRequest(method, c.srv.URL+wire.PathImages+image, strings.NewReader(body))
			if cred != "" {
				req.Header.Set("Authorization", "Bearer "+cred)
			}
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b), resp.Header
		}
		cases := []struct {
			name, method, image, agent, body string
			want                             int
		}{
			{"read without credential", "GET", "base", "", "", 401},
			{"any agent reads", "GET", "base", "b", "", 200},
			{"unknown image", "GET", "nope", "a", "", 404},
			{"not a snapshot", "PUT", "base?disk_format=qcow2", "a", "x", 403},
			{"another agent's server", "PUT", "snap?disk_format=qcow2", "b", "stolen", 403},
			{"the server's agent", "PUT", "snap?disk_format=qcow2", "a", "snapshot bytes", 204},
			{"bad method", "DELETE", "base", "a", "", 405},
		}
		for _, tc := range cases {
			st, body, hdr := do(tc.method, tc.image, creds[tc.agent], tc.body)
			if st != tc.want {
				t.Errorf("%s: status %d (%s), want %d", tc.name, st, body, tc.want)
			}
			if tc.want == 200 && (body != "qcow2 bytes" || hdr.Get(wire.HeaderDiskFormat) != "qcow2") {
				t.Errorf("%s: got %q, format %q", tc.name, body, hdr.Get(wire.HeaderDiskFormat))
			}
		}
		if got := string(im.data["snap"]); got != "snapshot bytes" || im.format["snap"] != "qcow2" {
			t.Errorf("snapshot stored %q as %q", got, im.format["snap"])
		}
	})
}
