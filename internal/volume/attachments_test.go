package volume_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/attachments"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/volumes"

	"nimbus/internal/api"
	"nimbus/internal/driver"
	"nimbus/internal/store"
	"nimbus/internal/testenv"
	"nimbus/internal/volume"
)

// users are the attach tests' callers by token: two customers and an
// operator.
type users struct{}

func (users) Validate(_ context.Context, tok string) (*api.Caller, error) {
	switch tok {
	case "demo":
		return &api.Caller{UserID: "u1", ProjectID: "p1", Roles: []string{"member"}}, nil
	case "other":
		return &api.Caller{UserID: "u2", ProjectID: "p2", Roles: []string{"member"}}, nil
	case "admin":
		return &api.Caller{UserID: "u0", ProjectID: "p0", Roles: []string{"admin", "member"}}, nil
	}
	return nil, api.Unauthorized()
}

// exports stands in for internal/blockexport: it records what is served
// and fails when told to.
type exports struct {
	mu     sync.Mutex
	served map[string]string // name → path
	fail   error
}

func (x *exports) Export(_ context.Context, name, path string, ro bool) (driver.VolumeConn, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.fail != nil {
		return driver.VolumeConn{}, x.fail
	}
	x.served[name] = path
	return driver.VolumeConn{Driver: driver.VolumeNBD, Host: "10.0.0.1", Port: 10809, Export: name, PSKIdentity: "nimbus", PSKKey: "00ff"}, nil
}

func (x *exports) Unexport(_ context.Context, name string) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	delete(x.served, name)
	return nil
}

func (x *exports) Exports() []string {
	x.mu.Lock()
	defer x.mu.Unlock()
	var out []string
	for n := range x.served {
		out = append(out, n)
	}
	return out
}

func (x *exports) names() []string {
	n := x.Exports()
	slices.Sort(n)
	return n
}

// extended records what compute would be told.
type extended struct {
	mu    sync.Mutex
	calls []string
}

func (e *extended) VolumeExtended(_ context.Context, server, vol string, size int64) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.calls = append(e.calls, server+" "+vol+" "+time.Duration(size).String())
	return nil
}

func (e *extended) list() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.calls)
}

const localHost = "storage-1"

type attEnv struct {
	db  *store.DB
	svc *volume.Service
	srv *httptest.Server
	x   *exports
	ext *extended
	dir string
	// root is the test the services live as long as.
	root *testing.T
}

func newAttEnv(t *testing.T, dbURL string) *attEnv {
	ctx := context.Background()
	db, err := store.Open(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	e := &attEnv{db: db, x: &exports{served: map[string]string{}}, ext: &extended{}, dir: filepath.Join(t.TempDir(), "volumes"), root: t}
	e.svc = e.start()
	return e
}

// start makes a volume service on the env's database and data, as a
// controller start does, and runs it.
func (e *attEnv) start() *volume.Service {
	t := e.root
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	svc := volume.New(volume.Config{DB: e.db, DataDir: e.dir, Log: quiet, LocalHosts: []string{localHost}, Exporter: e.x})
	svc.SetExtender(e.ext)
	if err := svc.Bootstrap(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); svc.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	a := svc.API(users{}, "")
	a.Log = quiet
	if e.srv != nil {
		e.srv.Close()
	}
	e.srv = httptest.NewServer(a)
	t.Cleanup(e.srv.Close)
	return svc
}

func (e *attEnv) client(tok, mv string) *gophercloud.ServiceClient {
	pc := &gophercloud.ProviderClient{TokenID: tok, HTTPClient: *e.srv.Client()}
	return &gophercloud.ServiceClient{ProviderClient: pc, Endpoint: e.srv.URL + "/v3/", Type: "block-storage", Microversion: mv}
}

// call sends a raw request and checks its status.
func (e *attEnv) call(t *testing.T, method, path, tok, body string, want int, hdr ...string) map[string]any {
	t.Helper()
	resp, raw := testenv.Do(t, e.srv.Client(), method, e.srv.URL+path, tok, body, hdr...)
	testenv.MustStatus(t, resp, raw, want)
	var m map[string]any
	if raw != "" {
		_ = json.Unmarshal([]byte(raw), &m)
	}
	return m
}

func (e *attEnv) volume(t *testing.T, tok string) string {
	t.Helper()
	v, err := volumes.Create(context.Background(), e.client(tok, ""), volumes.CreateOpts{Size: 1}, nil).Extract()
	if err != nil {
		t.Fatal(err)
	}
	waitStatus(t, e.client(tok, ""), v.ID, "available")
	return v.ID
}

func (e *attEnv) status(t *testing.T, id string) string {
	t.Helper()
	v, err := volumes.Get(context.Background(), e.client("admin", ""), id).Extract()
	if err != nil {
		t.Fatal(err)
	}
	return v.Status
}

func (e *attEnv) reserve(t *testing.T, req volume.ReserveRequest) (volume.Attachment, error) {
	var a volume.Attachment
	err := e.db.Tx(context.Background(), func(tx *store.Tx) error {
		var err error
		a, err = e.svc.Reserve(context.Background(), tx, req)
		return err
	})
	return a, err
}

func (e *attEnv) tx(t *testing.T, f func(tx *store.Tx) error) {
	t.Helper()
	if err := e.db.Tx(context.Background(), f); err != nil {
		t.Fatal(err)
	}
}

func apiStatus(err error) int {
	var ae *api.Error
	if errors.As(err, &ae) {
		return ae.Status
	}
	return 0
}

func TestAttachments(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newAttEnv(t, dbURL)
		t.Run("StateMachine", e.testStateMachine)
		t.Run("ReserveErrors", e.testReserveErrors)
		t.Run("FailedStepsLeaveNothing", e.testFailedSteps)
		t.Run("Resync", e.testResync)
		t.Run("ExtendInUse", e.testExtendInUse)
		t.Run("DeleteTerminated", e.testDeleteTerminated)
		t.Run("AttachmentsAPI", e.testAttachmentsAPI)
		t.Run("LegacyActions", e.testLegacyActions)
	})
}

// testStateMachine walks compute's flow: reserve, connect (local and
// remote), complete, detach and its roll back, disconnect, remove.
func (e *attEnv) testStateMachine(t *testing.T) {
	ctx := context.Background()
	server := "6f1c3a4e-0000-4000-8000-000000000001"
	v1, v2 := e.volume(t, "demo"), e.volume(t, "demo")
	a1, err := e.reserve(t, volume.ReserveRequest{ProjectID: "p1", VolumeID: v1, ServerID: server, Tag: "data", DeleteOnTermination: true})
	if err != nil {
		t.Fatal(err)
	}
	a2, err := e.reserve(t, volume.ReserveRequest{ProjectID: "p1", VolumeID: v2, ServerID: server})
	if err != nil {
		t.Fatal(err)
	}
	if a1.Device != "/dev/vdb" || a2.Device != "/dev/vdc" || a1.Status != volume.AttachReserved || a1.Mode != "rw" || a1.Tag != "data" {
		t.Errorf("reserved: %+v %+v", a1, a2)
	}
	if s := e.status(t, v1); s != volume.StatusReserved {
		t.Errorf("volume after reserve: %s", s)
	}

	// The storage node's host opens the file, with the type's QoS.
	conn, err := e.svc.Connect(ctx, a1.ID, localHost)
	if err != nil {
		t.Fatal(err)
	}
	want := driver.Volume{ID: v1, Device: "/dev/vdb", Conn: driver.VolumeConn{Driver: "file", Path: e.svc.DataPath(v1), SizeBytes: 1 << 30},
		Throttle: driver.Throttle{ReadIOPS: 70000, WriteIOPS: 60000}}
	if !reflect.DeepEqual(conn, want) {
		t.Errorf("local connection:\n got %+v\nwant %+v", conn, want)
	}
	if s := e.status(t, v1); s != volume.StatusAttaching {
		t.Errorf("volume after connect: %s", s)
	}
	// Another host gets an export named for the attachment.
	conn, err = e.svc.Connect(ctx, a2.ID, "compute-7")
	if err != nil {
		t.Fatal(err)
	}
	if conn.Conn.Driver != "nbd" || conn.Conn.Export != "att-"+a2.ID || conn.Conn.SizeBytes != 1<<30 {
		t.Errorf("remote connection: %+v", conn)
	}
	if got := e.x.names(); !slices.Equal(got, []string{"att-" + a2.ID}) {
		t.Errorf("exports: %v", got)
	}

	e.tx(t, func(tx *store.Tx) error { return e.svc.Complete(ctx, tx, a1.ID) })
	e.tx(t, func(tx *store.Tx) error { return e.svc.Complete(ctx, tx, a2.ID) })
	got, err := e.svc.Attachments(ctx, e.db, server)
	if err != nil {
		t.Fatal(err)
	}
	if l := got[server]; len(l) != 2 || l[0].ID != a1.ID || l[0].Status != volume.AttachAttached || l[0].Host != localHost ||
		l[0].AttachedAt.IsZero() || !l[0].DeleteOnTermination || l[1].Host != "compute-7" {
		t.Errorf("attachments: %+v", l)
	}

	// The volume view lists the attachment; the host is for admins.
	for _, tok := range []string{"demo", "admin"} {
		v, err := volumes.Get(ctx, e.client(tok, ""), v1).Extract()
		if err != nil {
			t.Fatal(err)
		}
		wantHost := map[string]string{"demo": "", "admin": localHost}[tok]
		if v.Status != "in-use" || len(v.Attachments) != 1 || v.Attachments[0].ServerID != server || v.Attachments[0].AttachmentID != a1.ID ||
			v.Attachments[0].Device != "/dev/vdb" || v.Attachments[0].VolumeID != v1 || v.Attachments[0].HostName != wantHost ||
			v.Attachments[0].AttachedAt.IsZero() || v.Multiattach || v.Metadata["attached_mode"] != "rw" {
			t.Errorf("%s sees %+v", tok, v)
		}
	}
	// An attached volume is not deleted, not even by force.
	e.call(t, "DELETE", "/v3/volumes/"+v1, "demo", "", 400)
	e.call(t, "DELETE", "/v3/volumes/"+v1+"?force=true", "admin", "", 400, "OpenStack-API-Version", "volume 3.23")

	steps := []struct {
		name   string
		f      func(tx *store.Tx) error
		status int // the *api.Error's, 0 for none
		vol    string
	}{
		{"begin", func(tx *store.Tx) error { return e.svc.BeginDetach(ctx, tx, a1.ID) }, 0, volume.StatusDetaching},
		{"begin again", func(tx *store.Tx) error { return e.svc.BeginDetach(ctx, tx, a1.ID) }, 400, volume.StatusDetaching},
		{"roll", func(tx *store.Tx) error { return e.svc.RollDetach(ctx, tx, a1.ID) }, 0, volume.StatusInUse},
		{"complete again", func(tx *store.Tx) error { return e.svc.Complete(ctx, tx, a1.ID) }, 0, volume.StatusInUse},
		{"begin", func(tx *store.Tx) error { return e.svc.BeginDetach(ctx, tx, a1.ID) }, 0, volume.StatusDetaching},
		{"flag", func(tx *store.Tx) error { return e.svc.SetDeleteOnTermination(ctx, tx, a1.ID, false) }, 0, volume.StatusDetaching},
		{"remove", func(tx *store.Tx) error { return e.svc.Remove(ctx, tx, a1.ID) }, 0, volume.StatusAvailable},
		{"remove again", func(tx *store.Tx) error { return e.svc.Remove(ctx, tx, a1.ID) }, 0, volume.StatusAvailable},
	}
	for _, st := range steps {
		err := e.db.Tx(ctx, st.f)
		if apiStatus(err) != st.status || (st.status == 0 && err != nil) {
			t.Errorf("%s: %v", st.name, err)
		}
		if s := e.status(t, v1); s != st.vol {
			t.Errorf("%s: volume %s, want %s", st.name, s, st.vol)
		}
	}
	if _, err := e.svc.AttachmentByID(ctx, e.db, a1.ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("removed attachment: %v", err)
	}
	if v, _ := volumes.Get(ctx, e.client("demo", ""), v1).Extract(); len(v.Attachments) != 0 || v.Metadata["attached_mode"] != "" {
		t.Errorf("after remove: %+v", v)
	}
	// Disconnect ends the export; a second one is nothing.
	for range 2 {
		if err := e.svc.Disconnect(ctx, a2.ID); err != nil {
			t.Fatal(err)
		}
	}
	if got := e.x.names(); len(got) != 0 {
		t.Errorf("exports after disconnect: %v", got)
	}
	a, err := e.svc.AttachmentByID(ctx, e.db, a2.ID)
	if err != nil || a.Host != "" || a.Status != volume.AttachAttached {
		t.Errorf("disconnected: %+v %v", a, err)
	}
	// A shelved server's attachment connects again on its new host.
	if _, err := e.svc.Connect(ctx, a2.ID, localHost); err != nil {
		t.Fatal(err)
	}
	e.tx(t, func(tx *store.Tx) error { return e.svc.BeginDetach(ctx, tx, a2.ID) })
	e.tx(t, func(tx *store.Tx) error { return e.svc.Remove(ctx, tx, a2.ID) })
	if s := e.status(t, v2); s != "available" {
		t.Errorf("v2: %s", s)
	}
}

func (e *attEnv) testReserveErrors(t *testing.T) {
	server, other := "6f1c3a4e-0000-4000-8000-000000000002", "6f1c3a4e-0000-4000-8000-000000000003"
	v1, v2 := e.volume(t, "demo"), e.volume(t, "demo")
	a, err := e.reserve(t, volume.ReserveRequest{ProjectID: "p1", VolumeID: v1, ServerID: server, Device: "/dev/vdd"})
	if err != nil || a.Device != "/dev/vdd" {
		t.Fatalf("%+v %v", a, err)
	}
	cases := []struct {
		name string
		req  volume.ReserveRequest
		want int
	}{
		{"another project's volume", volume.ReserveRequest{ProjectID: "p2", VolumeID: v2, ServerID: other}, 404},
		{"no such volume", volume.ReserveRequest{ProjectID: "p1", VolumeID: "nope", ServerID: other}, 404},
		{"already attached here", volume.ReserveRequest{ProjectID: "p1", VolumeID: v1, ServerID: server}, 400},
		{"reserved for another server", volume.ReserveRequest{ProjectID: "p1", VolumeID: v1, ServerID: other}, 400},
		{"device in use", volume.ReserveRequest{ProjectID: "p1", VolumeID: v2, ServerID: server, Device: "/dev/vdd"}, 400},
		{"boot disk's device", volume.ReserveRequest{ProjectID: "p1", VolumeID: v2, ServerID: server, Device: "/dev/vda"}, 400},
		{"bad device", volume.ReserveRequest{ProjectID: "p1", VolumeID: v2, ServerID: server, Device: "/etc/passwd"}, 400},
	}
	for _, c := range cases {
		if _, err := e.reserve(t, c.req); apiStatus(err) != c.want {
			t.Errorf("%s: %v, want %d", c.name, err, c.want)
		}
	}
	// An admin reserves any project's volume; the next free name skips vdd.
	b, err := e.reserve(t, volume.ReserveRequest{ProjectID: "p0", Admin: true, VolumeID: v2, ServerID: server})
	if err != nil || b.Device != "/dev/vdb" {
		t.Errorf("admin: %+v %v", b, err)
	}
	e.tx(t, func(tx *store.Tx) error { return e.svc.Remove(context.Background(), tx, a.ID) })
	e.tx(t, func(tx *store.Tx) error { return e.svc.Remove(context.Background(), tx, b.ID) })
}

// testFailedSteps: a reserve whose transaction fails, and a connect whose
// export fails, leave no row, no status and no export behind.
func (e *attEnv) testFailedSteps(t *testing.T) {
	ctx := context.Background()
	server := "6f1c3a4e-0000-4000-8000-000000000004"
	v := e.volume(t, "demo")
	boom := errors.New("boom")
	err := e.db.Tx(ctx, func(tx *store.Tx) error {
		if _, err := e.svc.Reserve(ctx, tx, volume.ReserveRequest{ProjectID: "p1", VolumeID: v, ServerID: server}); err != nil {
			return err
		}
		return boom // compute's next step failed
	})
	if !errors.Is(err, boom) {
		t.Fatal(err)
	}
	if got, _ := e.svc.Attachments(ctx, e.db, server); len(got[server]) != 0 || e.status(t, v) != "available" {
		t.Errorf("after a failed reserve: %v, %s", got, e.status(t, v))
	}
	a, err := e.reserve(t, volume.ReserveRequest{ProjectID: "p1", VolumeID: v, ServerID: server})
	if err != nil {
		t.Fatal(err)
	}
	e.x.mu.Lock()
	e.x.fail = errors.New("no port")
	e.x.mu.Unlock()
	if _, err := e.svc.Connect(ctx, a.ID, "compute-9"); err == nil {
		t.Error("connect with a failing export succeeded")
	}
	e.x.mu.Lock()
	e.x.fail = nil
	e.x.mu.Unlock()
	got, _ := e.svc.AttachmentByID(ctx, e.db, a.ID)
	if got.Host != "" || got.Status != volume.AttachReserved || e.status(t, v) != "reserved" || len(e.x.names()) != 0 {
		t.Errorf("after a failed connect: %+v %s %v", got, e.status(t, v), e.x.names())
	}
	// A removed attachment cannot be connected, and its export stops.
	if _, err := e.svc.Connect(ctx, a.ID, "compute-9"); err != nil {
		t.Fatal(err)
	}
	e.tx(t, func(tx *store.Tx) error { return e.svc.Remove(ctx, tx, a.ID) })
	if _, err := e.svc.Connect(ctx, a.ID, "compute-9"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("connect of a removed attachment: %v", err)
	}
	if n := e.x.names(); len(n) != 0 {
		t.Errorf("export outlived its attachment: %v", n)
	}
}

// testResync: a restarted controller serves again what attachments are
// connected elsewhere, and stops what none explains.
func (e *attEnv) testResync(t *testing.T) {
	ctx := context.Background()
	server := "6f1c3a4e-0000-4000-8000-000000000005"
	v := e.volume(t, "demo")
	a, err := e.reserve(t, volume.ReserveRequest{ProjectID: "p1", VolumeID: v, ServerID: server})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.Connect(ctx, a.ID, "compute-3"); err != nil {
		t.Fatal(err)
	}
	e.tx(t, func(tx *store.Tx) error { return e.svc.Complete(ctx, tx, a.ID) })
	// The daemon restarted: its exports are gone, and a stale one is left.
	e.x.mu.Lock()
	e.x.served = map[string]string{"att-stale": "/x"}
	e.x.mu.Unlock()
	e.svc = e.start()
	deadline := time.Now().Add(10 * time.Second)
	for !slices.Equal(e.x.names(), []string{"att-" + a.ID}) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := e.x.names(); !slices.Equal(got, []string{"att-" + a.ID}) {
		t.Errorf("exports after restart: %v", got)
	}
	if err := e.svc.Disconnect(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	e.tx(t, func(tx *store.Tx) error { return e.svc.Remove(ctx, tx, a.ID) })
}

// testExtendInUse: from 3.42 an in-use volume grows and its server is
// told; before, it is refused.
func (e *attEnv) testExtendInUse(t *testing.T) {
	ctx := context.Background()
	server := "6f1c3a4e-0000-4000-8000-000000000006"
	v := e.volume(t, "demo")
	a, err := e.reserve(t, volume.ReserveRequest{ProjectID: "p1", VolumeID: v, ServerID: server})
	if err != nil {
		t.Fatal(err)
	}
	e.tx(t, func(tx *store.Tx) error { return e.svc.Complete(ctx, tx, a.ID) })
	e.call(t, "POST", "/v3/volumes/"+v+"/action", "demo", `{"os-extend":{"new_size":2}}`, 400, "OpenStack-API-Version", "volume 3.41")
	e.call(t, "POST", "/v3/volumes/"+v+"/action", "demo", `{"os-extend":{"new_size":2}}`, 202, "OpenStack-API-Version", "volume 3.42")
	got := waitStatus(t, e.client("demo", ""), v, "in-use")
	if got.Size != 2 || fileSize(t, e.svc.DataPath(v)) != 2<<30 {
		t.Errorf("extended: size %d, file %d", got.Size, fileSize(t, e.svc.DataPath(v)))
	}
	want := server + " " + v + " " + time.Duration(2<<30).String()
	if calls := e.ext.list(); !slices.Contains(calls, want) {
		t.Errorf("extender told %v, want %q", calls, want)
	}
	e.tx(t, func(tx *store.Tx) error { return e.svc.Remove(ctx, tx, a.ID) })
}

func (e *attEnv) testDeleteTerminated(t *testing.T) {
	ctx := context.Background()
	server := "6f1c3a4e-0000-4000-8000-000000000007"
	v := e.volume(t, "demo")
	a, err := e.reserve(t, volume.ReserveRequest{ProjectID: "p1", VolumeID: v, ServerID: server, DeleteOnTermination: true})
	if err != nil {
		t.Fatal(err)
	}
	e.tx(t, func(tx *store.Tx) error { return e.svc.Complete(ctx, tx, a.ID) })
	// Still attached: kept.
	e.tx(t, func(tx *store.Tx) error { return e.svc.DeleteTerminated(ctx, tx, v) })
	if s := e.status(t, v); s != "in-use" {
		t.Fatalf("attached volume: %s", s)
	}
	e.tx(t, func(tx *store.Tx) error {
		if err := e.svc.Remove(ctx, tx, a.ID); err != nil {
			return err
		}
		return e.svc.DeleteTerminated(ctx, tx, v)
	})
	waitGone(t, e.client("demo", ""), v)
	e.tx(t, func(tx *store.Tx) error { return e.svc.DeleteTerminated(ctx, tx, v) }) // gone: nothing
}

// testAttachmentsAPI drives /v3/attachments with gophercloud.
func (e *attEnv) testAttachmentsAPI(t *testing.T) {
	ctx := context.Background()
	server := "6f1c3a4e-0000-4000-8000-000000000008"
	v := e.volume(t, "demo")
	demo, admin := e.client("demo", "3.44"), e.client("admin", "3.44")

	e.call(t, "GET", "/v3/attachments", "demo", "", 404, "OpenStack-API-Version", "volume 3.26")
	e.call(t, "POST", "/v3/attachments", "demo", `{"attachment":{"volume_uuid":"`+v+`"}}`, 404, "OpenStack-API-Version", "volume 3.26")
	for _, c := range []struct{ body string }{
		{`{"attachment":{}}`},
		{`{"attachment":{"volume_uuid":"nope"}}`},
		{`{"attachment":{"volume_uuid":"` + v + `","instance_uuid":"x"}}`},
		{`{"attachment":{"volume_uuid":"` + v + `","mode":"ro"}}`}, // mode is 3.54's
		{`{"attachment":{"volume_uuid":"` + v + `","connector":"x"}}`},
		{`{"attachment":"x"}`},
	} {
		e.call(t, "POST", "/v3/attachments", "demo", c.body, 400, "OpenStack-API-Version", "volume 3.44")
	}
	e.call(t, "POST", "/v3/attachments", "demo", `{"attachment":{"volume_uuid":"`+newUUID()+`"}}`, 404, "OpenStack-API-Version", "volume 3.44")
	e.call(t, "POST", "/v3/attachments", "other", `{"attachment":{"volume_uuid":"`+v+`"}}`, 404, "OpenStack-API-Version", "volume 3.44")
	// A customer's connector is refused: no export nor file path for them.
	e.call(t, "POST", "/v3/attachments", "demo", `{"attachment":{"volume_uuid":"`+v+`","connector":{"host":"evil"}}}`, 403,
		"OpenStack-API-Version", "volume 3.44")
	if s := e.status(t, v); s != "available" {
		t.Fatalf("after refused creates: %s", s)
	}

	att, err := attachments.Create(ctx, demo, attachments.CreateOpts{VolumeUUID: v, InstanceUUID: server}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	if att.Status != "reserved" || att.Instance != server || att.VolumeID != v || att.AttachMode != "rw" || att.ConnectionInfo != nil {
		t.Errorf("created: %+v", att)
	}
	if e.status(t, v) != "reserved" {
		t.Errorf("volume: %s", e.status(t, v))
	}
	// A record only: compute's view of the server has nothing.
	if got, _ := e.svc.Attachments(ctx, e.db, server); len(got[server]) != 0 {
		t.Errorf("an API record reached compute: %v", got)
	}
	if _, err := attachments.Create(ctx, demo, attachments.CreateOpts{VolumeUUID: v, InstanceUUID: server}).Extract(); !gophercloud.ResponseCodeIs(err, 400) {
		t.Errorf("second create: %v", err)
	}
	got, err := attachments.Get(ctx, demo, att.ID).Extract()
	if err != nil || got.ID != att.ID || got.Status != "reserved" {
		t.Errorf("get: %+v %v", got, err)
	}
	if _, err := attachments.Get(ctx, e.client("other", "3.44"), att.ID).Extract(); !gophercloud.ResponseCodeIs(err, 404) {
		t.Errorf("other project's get: %v", err)
	}
	pages, err := attachments.List(demo, attachments.ListOpts{VolumeID: v}).AllPages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	list, _ := attachments.ExtractAttachments(pages)
	if len(list) != 1 || list[0].ID != att.ID {
		t.Errorf("list: %+v", list)
	}
	m := e.call(t, "GET", "/v3/attachments/detail?instance_id="+server, "demo", "", 200, "OpenStack-API-Version", "volume 3.27")
	if l := m["attachments"].([]any); len(l) != 1 || l[0].(map[string]any)["attach_mode"] != "rw" {
		t.Errorf("detail: %v", m)
	}
	if m := e.call(t, "GET", "/v3/attachments", "other", "", 200, "OpenStack-API-Version", "volume 3.27"); len(m["attachments"].([]any)) != 0 {
		t.Errorf("other project lists %v", m)
	}

	// Connecting: a customer may not; an admin gets the export.
	if _, err := attachments.Update(ctx, demo, att.ID, attachments.UpdateOpts{Connector: map[string]any{"host": "compute-2"}}).Extract(); !gophercloud.ResponseCodeIs(err, 403) {
		t.Errorf("customer's connector: %v", err)
	}
	e.call(t, "PUT", "/v3/attachments/"+att.ID, "admin", `{"attachment":{}}`, 400, "OpenStack-API-Version", "volume 3.44")
	up, err := attachments.Update(ctx, admin, att.ID, attachments.UpdateOpts{Connector: map[string]any{"host": "compute-2"}}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	data, _ := up.ConnectionInfo["data"].(map[string]any)
	if up.Status != "attaching" || up.ConnectionInfo["driver_volume_type"] != "nbd" || data["export"] != "att-"+att.ID || data["access_mode"] != "rw" {
		t.Errorf("connection: %+v", up)
	}
	if err := attachments.Complete(ctx, e.client("demo", "3.43"), att.ID).ExtractErr(); !gophercloud.ResponseCodeIs(err, 404) {
		t.Errorf("complete at 3.43: %v", err)
	}
	if err := attachments.Complete(ctx, demo, att.ID).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	vol, _ := volumes.Get(ctx, demo, v).Extract()
	if vol.Status != "in-use" || len(vol.Attachments) != 1 || vol.Attachments[0].ServerID != server {
		t.Errorf("completed: %+v", vol)
	}
	if err := attachments.Delete(ctx, demo, att.ID).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	if e.status(t, v) != "available" || len(e.x.names()) != 0 {
		t.Errorf("after delete: %s, exports %v", e.status(t, v), e.x.names())
	}
	if err := attachments.Delete(ctx, demo, att.ID).ExtractErr(); !gophercloud.ResponseCodeIs(err, 404) {
		t.Errorf("delete again: %v", err)
	}

	// mode from 3.54; rw on a read-only volume is refused.
	e.call(t, "POST", "/v3/volumes/"+v+"/action", "demo", `{"os-update_readonly_flag":{"readonly":true}}`, 202)
	if _, err := attachments.Create(ctx, e.client("demo", "3.54"), attachments.CreateOpts{VolumeUUID: v, InstanceUUID: server, Mode: "rw"}).Extract(); !gophercloud.ResponseCodeIs(err, 400) {
		t.Errorf("rw on read-only: %v", err)
	}
	ro, err := attachments.Create(ctx, e.client("demo", "3.54"), attachments.CreateOpts{VolumeUUID: v, InstanceUUID: server}).Extract()
	if err != nil || ro.AttachMode != "ro" {
		t.Fatalf("read-only: %+v %v", ro, err)
	}
	if err := attachments.Delete(ctx, demo, ro.ID).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	e.call(t, "POST", "/v3/volumes/"+v+"/action", "demo", `{"os-update_readonly_flag":{"readonly":false}}`, 202)

	// Compute's attachments are compute's: 409 to delete or complete here.
	a, err := e.reserve(t, volume.ReserveRequest{ProjectID: "p1", VolumeID: v, ServerID: server})
	if err != nil {
		t.Fatal(err)
	}
	for _, tok := range []string{"demo", "admin"} {
		if err := attachments.Delete(ctx, e.client(tok, "3.44"), a.ID).ExtractErr(); !gophercloud.ResponseCodeIs(err, 409) {
			t.Errorf("%s deleting compute's attachment: %v", tok, err)
		}
	}
	if err := attachments.Complete(ctx, demo, a.ID).ExtractErr(); !gophercloud.ResponseCodeIs(err, 409) {
		t.Errorf("completing compute's attachment: %v", err)
	}
	e.tx(t, func(tx *store.Tx) error { return e.svc.Remove(ctx, tx, a.ID) })
}

// testLegacyActions drives os-reserve … os-detach as Tempest's
// test_volumes_actions and test_volumes_negative do.
func (e *attEnv) testLegacyActions(t *testing.T) {
	ctx := context.Background()
	server := "6f1c3a4e-0000-4000-8000-000000000009"
	v := e.volume(t, "demo")
	demo := e.client("demo", "")
	missing := newUUID()

	if err := volumes.Reserve(ctx, demo, v).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	if s := e.status(t, v); s != "attaching" {
		t.Errorf("reserved: %s", s)
	}
	if err := volumes.Reserve(ctx, demo, v).ExtractErr(); !gophercloud.ResponseCodeIs(err, 400) {
		t.Errorf("reserve twice: %v", err)
	}
	if err := volumes.Unreserve(ctx, demo, v).ExtractErr(); err != nil || e.status(t, v) != "available" {
		t.Errorf("unreserve: %v %s", err, e.status(t, v))
	}
	for name, err := range map[string]error{
		"reserve":   volumes.Reserve(ctx, demo, missing).ExtractErr(),
		"unreserve": volumes.Unreserve(ctx, demo, missing).ExtractErr(),
		"attach":    volumes.Attach(ctx, demo, missing, volumes.AttachOpts{InstanceUUID: server, MountPoint: "/dev/vdc"}).ExtractErr(),
		"detach":    volumes.Detach(ctx, demo, missing, volumes.DetachOpts{}).ExtractErr(),
		"other's":   volumes.Reserve(ctx, e.client("other", ""), v).ExtractErr(),
	} {
		if !gophercloud.ResponseCodeIs(err, 404) {
			t.Errorf("%s of a missing volume: %v", name, err)
		}
	}
	for _, body := range []string{
		`{"os-attach":{"instance_uuid":"` + server + `"}}`,
		`{"os-attach":{"mountpoint":"/dev/vdb"}}`,
		`{"os-attach":{"instance_uuid":"` + server + `","mountpoint":"/dev/vdb","mode":"xx"}}`,
		`{"os-attach":{"instance_uuid":"x","mountpoint":"/dev/vdb"}}`,
	} {
		e.call(t, "POST", "/v3/volumes/"+v+"/action", "demo", body, 400)
	}

	// Attach straight from available, as Tempest does.
	if err := volumes.Attach(ctx, demo, v, volumes.AttachOpts{InstanceUUID: server, MountPoint: "/dev/vdb", Mode: "rw"}).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	got := waitStatus(t, demo, v, "in-use")
	if len(got.Attachments) != 1 || got.Attachments[0].ServerID != server || got.Attachments[0].Device != "/dev/vdb" {
		t.Errorf("attached: %+v", got.Attachments)
	}
	// A record only: the server (whoever's it is) gets nothing.
	if m, _ := e.svc.Attachments(ctx, e.db, server); len(m[server]) != 0 {
		t.Errorf("os-attach reached compute: %v", m)
	}
	if err := volumes.BeginDetaching(ctx, demo, v).ExtractErr(); err != nil || e.status(t, v) != "detaching" {
		t.Errorf("begin detaching: %v %s", err, e.status(t, v))
	}
	if err := volumes.BeginDetaching(ctx, demo, v).ExtractErr(); !gophercloud.ResponseCodeIs(err, 400) {
		t.Errorf("begin detaching twice: %v", err)
	}
	e.call(t, "POST", "/v3/volumes/"+v+"/action", "demo", `{"os-roll_detaching":{}}`, 202)
	if s := e.status(t, v); s != "in-use" {
		t.Errorf("rolled: %s", s)
	}
	// Customers get no connection; admins get the hypervisor's.
	conn := volumes.InitializeConnectionOpts{Host: "compute-4", IP: "10.0.0.4"}
	if _, err := volumes.InitializeConnection(ctx, demo, v, conn).Extract(); !gophercloud.ResponseCodeIs(err, 403) {
		t.Errorf("customer's initialize_connection: %v", err)
	}
	info, err := volumes.InitializeConnection(ctx, e.client("admin", ""), v, conn).Extract()
	if err != nil || info["driver_volume_type"] != "nbd" {
		t.Fatalf("admin's initialize_connection: %v %v", info, err)
	}
	if len(e.x.names()) != 1 {
		t.Errorf("exports: %v", e.x.names())
	}
	if err := volumes.TerminateConnection(ctx, e.client("admin", ""), v, volumes.TerminateConnectionOpts{Host: "compute-4"}).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	if len(e.x.names()) != 0 {
		t.Errorf("exports after terminate: %v", e.x.names())
	}
	if err := volumes.Detach(ctx, demo, v, volumes.DetachOpts{AttachmentID: "nope"}).ExtractErr(); !gophercloud.ResponseCodeIs(err, 404) {
		t.Errorf("detach of a missing attachment: %v", err)
	}
	if err := volumes.Detach(ctx, demo, v, volumes.DetachOpts{}).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	if got := waitStatus(t, demo, v, "available"); len(got.Attachments) != 0 {
		t.Errorf("detached: %+v", got.Attachments)
	}
	// Read-only: rw refused.
	e.call(t, "POST", "/v3/volumes/"+v+"/action", "demo", `{"os-update_readonly_flag":{"readonly":true}}`, 202)
	e.call(t, "POST", "/v3/volumes/"+v+"/action", "demo", `{"os-attach":{"instance_uuid":"`+server+`","mountpoint":"/dev/vdb","mode":"rw"}}`, 400)
	e.call(t, "POST", "/v3/volumes/"+v+"/action", "demo", `{"os-update_readonly_flag":{"readonly":false}}`, 202)

	// The classic legacy flow: reserve, connect, attach, then an admin's
	// force detach of a volume reset to error.
	adm := e.client("admin", "")
	if err := volumes.Reserve(ctx, adm, v).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	if _, err := volumes.InitializeConnection(ctx, adm, v, conn).Extract(); err != nil {
		t.Fatal(err)
	}
	if err := volumes.Attach(ctx, adm, v, volumes.AttachOpts{InstanceUUID: server, MountPoint: "/dev/vdc"}).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	got = waitStatus(t, demo, v, "in-use")
	if len(got.Attachments) != 1 || got.Attachments[0].Device != "/dev/vdc" {
		t.Fatalf("legacy attach: %+v", got.Attachments)
	}
	e.call(t, "POST", "/v3/volumes/"+v+"/action", "admin", `{"os-reset_status":{"status":"error"}}`, 202)
	body := `{"os-force_detach":{"attachment_id":"` + got.Attachments[0].AttachmentID + `","connector":null}}`
	e.call(t, "POST", "/v3/volumes/"+v+"/action", "demo", body, 403)
	e.call(t, "POST", "/v3/volumes/"+v+"/action", "admin", body, 202)
	if got := waitStatus(t, demo, v, "available"); len(got.Attachments) != 0 || len(e.x.names()) != 0 {
		t.Errorf("force detached: %+v, exports %v", got.Attachments, e.x.names())
	}
	// Nothing to detach: an error volume stays as it is.
	e.call(t, "POST", "/v3/volumes/"+v+"/action", "admin", `{"os-reset_status":{"status":"error"}}`, 202)
	e.call(t, "POST", "/v3/volumes/"+v+"/action", "admin", `{"os-force_detach":{}}`, 202)
	if s := e.status(t, v); s != "error" {
		t.Errorf("force detach of nothing: %s", s)
	}
	e.call(t, "POST", "/v3/volumes/"+v+"/action", "admin", `{"os-reset_status":{"status":"available"}}`, 202)

	// Compute's attachment: os-detach and os-begin_detaching are 409.
	a, err := e.reserve(t, volume.ReserveRequest{ProjectID: "p1", VolumeID: v, ServerID: server})
	if err != nil {
		t.Fatal(err)
	}
	e.tx(t, func(tx *store.Tx) error { return e.svc.Complete(ctx, tx, a.ID) })
	if err := volumes.Detach(ctx, demo, v, volumes.DetachOpts{}).ExtractErr(); !gophercloud.ResponseCodeIs(err, 409) {
		t.Errorf("os-detach of compute's: %v", err)
	}
	if err := volumes.BeginDetaching(ctx, demo, v).ExtractErr(); !gophercloud.ResponseCodeIs(err, 409) {
		t.Errorf("os-begin_detaching of compute's: %v", err)
	}
	e.tx(t, func(tx *store.Tx) error { return e.svc.Remove(ctx, tx, a.ID) })
}

func newUUID() string { return uuid.NewString() }
