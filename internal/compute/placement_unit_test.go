package compute

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/driver"
	"nimbus/internal/driver/fake"
	"nimbus/internal/image"
	"nimbus/internal/network"
	"nimbus/internal/scheduler"
	"nimbus/internal/store"
	"nimbus/internal/store/storetest"
	"nimbus/internal/workqueue"
)

// These tests drive placement, the reconcile queue and its steps on a real
// store with the fake driver and the small image and network services
// below, without a whole cloud.

// unitImages is an image service holding one public image.
type unitImages struct{ img *image.Image }

func (u *unitImages) Get(_ context.Context, _ string, _ bool, id string) (*image.Image, error) {
	if u.img != nil && id == u.img.ID {
		return u.img, nil
	}
	return nil, store.ErrNotFound
}
func (u *unitImages) List(context.Context, *api.Caller) ([]*image.Image, error) {
	return []*image.Image{u.img}, nil
}
func (u *unitImages) Delete(context.Context, string) error { return nil }
func (u *unitImages) FinishSnapshot(context.Context, string, string, io.Reader) error {
	return nil
}
func (u *unitImages) CreateSnapshot(context.Context, *store.Tx, string, string, map[string]string, *image.Image, string) (*image.Image, error) {
	return nil, errors.New("unitImages: no snapshots")
}
func (u *unitImages) CreateShelveImage(context.Context, *store.Tx, string, string, map[string]string, *image.Image, string) (*image.Image, error) {
	return nil, errors.New("unitImages: no shelve images")
}
func (u *unitImages) Backups(context.Context, string, string, string) ([]*image.Image, error) {
	return nil, nil
}

// unitNetworks is a network service with no ports whose ServerPorts fails
// while failPorts is above zero, counting calls per server.
type unitNetworks struct {
	mu        sync.Mutex
	failPorts map[string]int
	calls     map[string]int
}

var errPortsDown = errors.New("unitNetworks: ports unavailable")

func (u *unitNetworks) ServerPorts(_ context.Context, sv network.ServerRef) ([]network.ServerPort, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.calls[sv.ID]++
	if u.failPorts[sv.ID] > 0 {
		u.failPorts[sv.ID]--
		return nil, errPortsDown
	}
	return nil, nil
}
func (u *unitNetworks) CheckSecurityGroups(context.Context, string, []string) error { return nil }
func (u *unitNetworks) AutoNetwork(context.Context, string) (*network.Network, error) {
	return nil, store.ErrNotFound
}
func (u *unitNetworks) GetNetwork(context.Context, string, bool, string) (*network.Network, error) {
	return nil, store.ErrNotFound
}
func (u *unitNetworks) GetPort(context.Context, string, bool, string) (*network.Port, error) {
	return nil, store.ErrNotFound
}
func (u *unitNetworks) BindPort(context.Context, *store.Tx, string, string, string) error {
	return store.ErrNotFound
}
func (u *unitNetworks) CreateServerPort(context.Context, *store.Tx, string, string, string, string, []string) (*network.Port, error) {
	return nil, store.ErrNotFound
}
func (u *unitNetworks) AttachPublicIP(context.Context, *store.Tx, string, string, string) (string, error) {
	return "", store.ErrNotFound
}
func (u *unitNetworks) Addresses(context.Context, []network.ServerRef) (map[string]map[string][]network.Address, error) {
	return map[string]map[string][]network.Address{}, nil
}
func (u *unitNetworks) ReleaseServer(context.Context, *store.Tx, string) error  { return nil }
func (u *unitNetworks) ServerDeleting(context.Context, *store.Tx, string) error { return nil }
func (u *unitNetworks) MeterServerAddresses(context.Context, store.Querier, string, bool) error {
	return nil
}
func (u *unitNetworks) ServerInterfaces(context.Context, network.ServerRef) ([]network.Interface, error) {
	return nil, nil
}
func (u *unitNetworks) ReleasePort(context.Context, *store.Tx, string, string) error {
	return store.ErrNotFound
}
func (u *unitNetworks) NetworkChanged() {}

// unitHost is a host with room for two unitFlavor servers: four pCPUs
// (one socket of three cores, the first kept for the host).
func unitHost(name string) driver.Host {
	h := driver.Host{Name: name, IP: "192.0.2.1", MemoryMB: 8192, DiskGB: 100, Zone: "nova", Up: true}
	fake.Topology(&h, 1, 3, 1)
	return h
}

var unitFlavor = flavorSnap{ID: "u2", Name: "u2", VCPUs: 2, RAM: 1024, Disk: 10, ExtraSpecs: map[string]string{}}

type unitEnv struct {
	db   *store.DB
	drv  *fake.Driver
	nets *unitNetworks
	img  *image.Image
}

func newUnitEnv(t *testing.T, dbURL string, hosts ...driver.Host) *unitEnv {
	t.Helper()
	db, err := store.Open(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	drv, err := fake.New(fake.Config{Hosts: hosts})
	if err != nil {
		t.Fatal(err)
	}
	return &unitEnv{db: db, drv: drv, img: &image.Image{ID: "11111111-2222-3333-4444-555555555555", Name: "unit", Status: "active"},
		nets: &unitNetworks{failPorts: map[string]int{}, calls: map[string]int{}}}
}

// service is one compute controller on the env's store and fleet.
func (e *unitEnv) service() *Service {
	return New(Deps{DB: e.db, Driver: e.drv, Images: &unitImages{img: e.img}, Networks: e.nets,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
}

// job places up to most unitFlavor servers, at least least, keeping the
// first keep claims (all when keep < 0) under fresh keys.
func job(t *testing.T, s *Service, least, most, keep int) (*placeJob, *[]string) {
	t.Helper()
	j, err := s.newPlaceJob(t.Context(), placeRequest{}, unitFlavor, least, most)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	j.write = func(_ *store.Tx, claims []scheduler.Claim, _ map[string]string) ([]string, error) {
		keys = keys[:0]
		n := len(claims)
		if keep >= 0 {
			n = min(n, keep)
		}
		for range n {
			keys = append(keys, newUUID())
		}
		return keys, nil
	}
	return j, &keys
}

func storedClaims(t *testing.T, db *store.DB) int {
	t.Helper()
	var n int
	if err := db.QueryRow(t.Context(), `SELECT COUNT(*) FROM compute_claims`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestPlaceJob: the one placement path keeps as many as fit up to most,
// places none when fewer than least fit, stores only the claims its write
// keeps and gives the others back to the scheduler.
func TestPlaceJob(t *testing.T) {
	tests := []struct {
		name              string
		least, most, keep int
		wantErr           error
		wantKept          int
		// thenFit is how many more servers fit afterwards: what was not
		// kept went back to the scheduler.
		thenFit int
	}{
		{name: "as many as fit up to max", least: 1, most: 10, keep: -1, wantKept: 4, thenFit: 0},
		{name: "no more than max", least: 1, most: 3, keep: -1, wantKept: 3, thenFit: 1},
		{name: "fewer than min fit: none placed", least: 5, most: 6, keep: -1, wantErr: errNoValidHost, thenFit: 4},
		{name: "exactly min fit", least: 4, most: 4, keep: -1, wantKept: 4, thenFit: 0},
		{name: "claims the write does not keep are released", least: 1, most: 4, keep: 1, wantKept: 1, thenFit: 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			storetest.ForEachEngine(t, func(t *testing.T, dbURL string) {
				e := newUnitEnv(t, dbURL, unitHost("u-1"), unitHost("u-2"))
				s := e.service()
				j, keys := job(t, s, tc.least, tc.most, tc.keep)
				err := s.place(t.Context(), j)
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("place: %v, want %v", err, tc.wantErr)
				}
				if err == nil && len(*keys) != tc.wantKept {
					t.Fatalf("kept %d, want %d", len(*keys), tc.wantKept)
				}
				if n := storedClaims(t, e.db); n != tc.wantKept {
					t.Fatalf("%d claims stored, want %d", n, tc.wantKept)
				}
				more, keys2 := job(t, s, 0, 10, -1)
				if err := s.place(t.Context(), more); err != nil {
					t.Fatal(err)
				}
				if len(*keys2) != tc.thenFit {
					t.Fatalf("%d more fit afterwards, want %d", len(*keys2), tc.thenFit)
				}
			})
		})
	}
}

// TestPlaceJobShort: a job that records its own failure sees fewer claims
// than it needs, and none of them is stored.
func TestPlaceJobShort(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newUnitEnv(t, dbURL, unitHost("u-1"))
		s := e.service()
		j, _ := job(t, s, 3, 3, 0)
		j.recordShort = true
		var seen []int
		write := j.write
		j.write = func(tx *store.Tx, claims []scheduler.Claim, zones map[string]string) ([]string, error) {
			seen = append(seen, len(claims))
			return write(tx, claims, zones)
		}
		if err := s.place(t.Context(), j); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(seen, []int{2}) || storedClaims(t, e.db) != 0 {
			t.Fatalf("write saw %v claims, %d stored: want [2], 0", seen, storedClaims(t, e.db))
		}
	})
}

// TestPlaceStaleSnapshot: two controllers share a store. The second fills
// the host after the first loaded its snapshot; the store refuses the
// first's claim, which reloads and finds no valid host instead of
// over-committing.
func TestPlaceStaleSnapshot(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newUnitEnv(t, dbURL, unitHost("u-1"))
		a, b := e.service(), e.service()
		if _, err := a.schedState(t.Context()); err != nil {
			t.Fatal(err)
		}
		jb, kb := job(t, b, 2, 2, -1)
		if err := b.place(t.Context(), jb); err != nil || len(*kb) != 2 {
			t.Fatalf("second controller: %v, %d placed", err, len(*kb))
		}
		calls := 0
		ja, _ := job(t, a, 1, 1, -1)
		write := ja.write
		ja.write = func(tx *store.Tx, claims []scheduler.Claim, zones map[string]string) ([]string, error) {
			calls++
			return write(tx, claims, zones)
		}
		if err := a.place(t.Context(), ja); !errors.Is(err, errNoValidHost) {
			t.Fatalf("stale controller: %v, want errNoValidHost", err)
		}
		if calls != 1 || storedClaims(t, e.db) != 2 {
			t.Fatalf("%d transactions, %d claims: want 1 refused, 2 stored", calls, storedClaims(t, e.db))
		}
	})
}

// unitServer stores a server being built, not yet placed.
func unitServer(t *testing.T, s *Service, img string) *server {
	t.Helper()
	now := s.now()
	id := newUUID()
	sv := &server{ID: id, ProjectID: "p1", UserID: "u1", Name: "unit-" + id[:4], VMState: vmBuilding,
		TaskState: taskScheduling, FlavorID: unitFlavor.ID, ImageRef: img, ReservationID: "r-unit",
		Hostname: "unit", VCPUs: unitFlavor.VCPUs, MemoryMB: unitFlavor.RAM, DiskGB: unitFlavor.Disk,
		CreatedAt: now, UpdatedAt: now,
		Doc: serverDoc{Flavor: unitFlavor, Metadata: map[string]string{}, DiskConfig: "MANUAL", TaskID: newUUID(),
			InstanceName: "instance-" + id[:8], RequestID: "req-unit"}}
	err := s.db.Tx(t.Context(), func(tx *store.Tx) error { return s.insertServer(t.Context(), tx, sv) })
	if err != nil {
		t.Fatal(err)
	}
	return sv
}

// TestPlaceOne: placing an existing server writes its host and claim in
// one transaction, unless its task moved on meanwhile (or its lease went
// to another controller: TestStepsFenced).
func TestPlaceOne(t *testing.T) {
	for _, tc := range []struct {
		name     string
		task     string // the task placeOne expects
		wantHost bool
	}{
		{"placed", taskScheduling, true},
		{"task moved on: nothing written", taskUnshelving, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			storetest.ForEachEngine(t, func(t *testing.T, dbURL string) {
				e := newUnitEnv(t, dbURL, unitHost("u-1"))
				s := e.service()
				sv := unitServer(t, s, e.img.ID)
				// A step runs under the server's lease (reconcile).
				if ok, err := s.leases.Acquire(t.Context(), serverLease(sv.ID)); !ok || err != nil {
					t.Fatal(ok, err)
				}
				err := s.placeOne(t.Context(), sv, tc.task, func(tx *store.Tx, cur *server, c scheduler.Claim) error {
					placed(cur, c, "nova")
					cur.TaskState = taskSpawning
					return s.saveServer(t.Context(), tx, cur)
				})
				if err != nil {
					t.Fatal(err)
				}
				got, err := s.loadServer(t.Context(), s.db, sv.ID, false)
				if err != nil {
					t.Fatal(err)
				}
				_, claimed, err := loadClaim(t.Context(), s.db, sv.ID)
				if err != nil {
					t.Fatal(err)
				}
				if (got.Host == "u-1") != tc.wantHost || claimed != tc.wantHost {
					t.Fatalf("host %q, claimed %v; want placed %v", got.Host, claimed, tc.wantHost)
				}
			})
		})
	}
}

// recordingClock runs retries soon and records the delays asked for.
type recordingClock struct {
	mu     sync.Mutex
	delays []time.Duration
}

func (c *recordingClock) afterFunc(d time.Duration, f func()) workqueue.Timer {
	c.mu.Lock()
	c.delays = append(c.delays, d)
	c.mu.Unlock()
	return time.AfterFunc(time.Millisecond, f)
}

// TestReconcileBackoff runs the reconcile loop: a server whose step fails
// (its ports cannot be read) is retried with a backoff that doubles per
// failure until the step succeeds, while another server is built at once.
func TestReconcileBackoff(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newUnitEnv(t, dbURL, unitHost("u-1"))
		s := e.service()
		clk := &recordingClock{}
		s.queue = workqueue.New(workqueue.Config{Backoff: stepRetry, MaxBackoff: stepRetryMax, AfterFunc: clk.afterFunc})
		flaky, fine := unitServer(t, s, e.img.ID), unitServer(t, s, e.img.ID)
		e.nets.failPorts[flaky.ID] = 3
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); s.Run(ctx) }()
		t.Cleanup(func() { cancel(); <-done })
		for _, id := range []string{flaky.ID, fine.ID} {
			waitActive(t, s, id)
		}
		e.nets.mu.Lock()
		calls := map[string]int{"flaky": e.nets.calls[flaky.ID], "fine": e.nets.calls[fine.ID]}
		e.nets.mu.Unlock()
		if calls["flaky"] != 4 || calls["fine"] != 1 {
			t.Fatalf("ports read %v: want flaky 4 (3 failures), fine 1", calls)
		}
		clk.mu.Lock()
		defer clk.mu.Unlock()
		want := []time.Duration{stepRetry, 2 * stepRetry, 4 * stepRetry}
		if !slices.Equal(clk.delays, want) {
			t.Fatalf("retry delays %v, want %v", clk.delays, want)
		}
	})
}

func waitActive(t *testing.T, s *Service, id string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		sv, err := s.loadServer(t.Context(), s.db, id, false)
		if err != nil {
			t.Fatal(err)
		}
		if sv.VMState == vmActive && sv.TaskState == "" {
			return
		}
		if sv.VMState == vmError || time.Now().After(deadline) {
			t.Fatalf("server %s: %s/%s, want active", id, sv.VMState, sv.TaskState)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestPlaceHostUpElsewhere: a host that came up through another
// controller (its agent registered there) is placed on at once, not after
// this controller's host cache expires: a placement that falls short
// reloads from the store.
func TestPlaceHostUpElsewhere(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newUnitEnv(t, dbURL, unitHost("u-1"))
		e.drv.SetHostUp("u-1", false)
		a := e.service()
		for range 2 { // the first look makes the host's service row, which drops the cache
			if _, err := a.schedState(t.Context()); err != nil {
				t.Fatal(err)
			}
		}
		e.drv.SetHostUp("u-1", true)
		j, keys := job(t, a, 1, 1, -1)
		if err := a.place(t.Context(), j); err != nil || len(*keys) != 1 {
			t.Fatalf("host up elsewhere: %v, %d placed; want 1", err, len(*keys))
		}
	})
}
