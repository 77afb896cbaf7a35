package compute

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"nimbus/internal/driver"
	"nimbus/internal/driver/fake"
	"nimbus/internal/lease"
	"nimbus/internal/scheduler"
	"nimbus/internal/store"
	"nimbus/internal/store/storetest"
)

// TestStepTable: the step a server's recorded state asks for, "" when it
// rests. Lookups are by the exact (vm_state, task_state) first, then by
// the task under any vm_state; volume ops come before any task but a
// delete.
func TestStepTable(t *testing.T) {
	op := []volumeOp{{Kind: opAttach, AttachmentID: "a", VolumeID: "v"}}
	tests := []struct {
		vm, task string
		ops      []volumeOp
		deleted  bool
		want     string
	}{
		{vmActive, taskNone, nil, false, ""},
		{vmStopped, taskNone, nil, false, ""},
		{vmError, taskNone, nil, false, ""},
		{vmShelvedOffloaded, taskNone, nil, false, ""},
		{vmDeleted, taskNone, nil, true, ""},
		{vmActive, taskDeleting, nil, true, ""}, // deleted already: nothing owed
		{vmBuilding, taskNone, nil, false, "build"},
		{vmBuilding, taskScheduling, nil, false, "schedule"},
		{vmBuilding, taskSpawning, nil, false, "spawn"},
		{vmShelvedOffloaded, taskSpawning, nil, false, "unshelve-spawn"},
		{vmActive, taskSpawning, nil, false, "clear-unknown-task"},
		{vmActive, "migrating", nil, false, "clear-unknown-task"},
		{vmBuilding, taskDeleting, nil, false, "delete"},
		{vmError, taskDeleting, nil, false, "delete"},
		{vmActive, taskDeleting, op, false, "delete"}, // a delete removes every attachment itself
		{vmActive, taskNone, op, false, "volume-op"},
		{vmBuilding, taskSpawning, op, false, "volume-op"},
		{vmStopped, taskPoweringOn, nil, false, "power-on"},
		{vmActive, taskPoweringOff, nil, false, "power-off"},
		{vmError, taskPoweringOff, nil, false, "power-off"},
		{vmActive, taskRebootingHard, nil, false, "reboot-hard"},
		{vmShelved, taskUnshelving, nil, false, "unshelve"},
		{vmShelvedOffloaded, taskUnshelving, nil, false, "unshelve"},
		{vmShelved, taskShelvingOffloading, nil, false, "shelve-offload"},
		{vmActive, taskResizePrep, nil, false, "resize-prep"},
		{vmResized, taskResizeReverting, nil, false, "resize-revert"},
		{vmError, taskRebuilding, nil, false, "rebuild"},
		{vmStopped, taskRebuildSpawning, nil, false, "rebuild-spawn"},
		{vmPaused, taskImageSnapshot, nil, false, "snapshot"},
		{vmActive, taskImageBackup, nil, false, "backup"},
	}
	for _, tc := range tests {
		sv := &server{VMState: tc.vm, TaskState: tc.task, Deleted: tc.deleted, Doc: serverDoc{VolumeOps: tc.ops}}
		st, ok := stepFor(sv)
		if got := st.name; got != tc.want || ok != (tc.want != "") {
			t.Errorf("(%s, %q, %d ops, deleted %v): step %q (owed %v), want %q", tc.vm, tc.task, len(tc.ops), tc.deleted, got, ok, tc.want)
		}
		if workDue(sv) != (tc.want != "") {
			t.Errorf("(%s, %q): workDue %v", tc.vm, tc.task, workDue(sv))
		}
	}
}

// TestEveryTaskHasAStep: every task state compute writes is driven by a
// step of its own, under every vm_state an action may leave it in, so
// that none falls through to being cleared.
func TestEveryTaskHasAStep(t *testing.T) {
	tasks := []string{taskScheduling, taskSpawning, taskPoweringOff, taskPoweringOn, taskRebooting, taskRebootingHard,
		taskPausing, taskUnpausing, taskSuspending, taskResuming, taskShelving, taskShelvingOffloading, taskUnshelving,
		taskResizePrep, taskResizeMigrating, taskResizeFinish, taskResizeReverting, taskRebuilding, taskRebuildSpawning,
		taskImageSnapshot, taskImageBackup, taskDeleting}
	for _, task := range tasks {
		found := false
		for k := range steps {
			found = found || k.task == task
		}
		if !found {
			t.Errorf("task %q has no step", task)
		}
	}
	// The vm_states each action accepts (actionRules) keep its task's step.
	actionTask := map[string]string{"start": taskPoweringOn, "stop": taskPoweringOff, "reboot": taskRebooting,
		"reboot_hard": taskRebootingHard, "pause": taskPausing, "unpause": taskUnpausing, "suspend": taskSuspending,
		"resume": taskResuming, "shelve": taskShelving, "shelve_offload": taskShelvingOffloading, "unshelve": taskUnshelving,
		"resize": taskResizePrep, "revertResize": taskResizeReverting, "rebuild": taskRebuilding,
		"createImage": taskImageSnapshot, "createBackup": taskImageBackup}
	for action, task := range actionTask {
		for _, vm := range actionRules[action].vmStates {
			st, ok := stepFor(&server{VMState: vm, TaskState: task})
			if !ok || st.name == clearStep.name {
				t.Errorf("%s from %s (task %s): step %q", action, vm, task, st.name)
			}
		}
	}
}

// stepEnv is n compute controllers on one store (each with its own leases
// under its own holder name) and one fake fleet, with a fast look for
// owed work.
type stepEnv struct {
	*unitEnv
	svcs []*Service
}

func newStepEnv(t *testing.T, dbURL string, n int, ttl, delay time.Duration, now func() time.Time) *stepEnv {
	t.Helper()
	e := &stepEnv{unitEnv: newUnitEnv(t, dbURL, unitHost("u-1"), unitHost("u-2"))}
	drv, err := fake.New(fake.Config{Hosts: []driver.Host{unitHost("u-1"), unitHost("u-2")}, Delay: delay})
	if err != nil {
		t.Fatal(err)
	}
	e.drv = drv
	for i := range n {
		db, err := store.Open(t.Context(), dbURL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		m := lease.New(db, lease.Config{Holder: string(rune('a' + i)), TTL: ttl, Now: now})
		s := New(Deps{DB: db, Driver: e.drv, Images: &unitImages{img: e.img}, Networks: e.nets, Leases: m,
			Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
		s.scanEvery = 100 * time.Millisecond
		e.svcs = append(e.svcs, s)
	}
	return e
}

// run runs s's reconcile loop and renews its leases until the returned
// crash is called, which stops both as a killed controller stops: its
// leases are left to expire.
func run(t *testing.T, s *Service) (crash func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.Run(ctx) }()
	go func() {
		tick := time.NewTicker(s.leases.TTL() / 3)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				s.leases.Renew(ctx)
			}
		}
	}()
	var once sync.Once
	crash = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(crash)
	return crash
}

// TestWorkDueRecorded: every save records whether the server owes a step,
// as stepFor says, and the controllers' look for owed work finds exactly
// those; migration 0071's backfill says the same of each.
func TestWorkDueRecorded(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newStepEnv(t, dbURL, 1, 0, 0, nil)
		s := e.svcs[0]
		ctx := t.Context()
		states := []struct {
			vm, task string
			ops      bool
			deleted  bool
		}{
			{vmBuilding, taskScheduling, false, false}, {vmBuilding, taskNone, false, false}, {vmActive, taskNone, false, false},
			{vmActive, taskNone, true, false}, {vmStopped, taskPoweringOn, false, false}, {vmError, taskNone, false, false},
			{vmDeleted, taskNone, false, true}, {vmShelvedOffloaded, taskNone, false, false}, {vmActive, "migrating", false, false},
		}
		want := map[string]bool{}
		for _, st := range states {
			sv := unitServer(t, s, e.img.ID)
			err := s.db.Tx(ctx, func(tx *store.Tx) error {
				cur, err := s.loadServer(ctx, tx, sv.ID, true)
				if err != nil {
					return err
				}
				cur.VMState, cur.TaskState, cur.Deleted = st.vm, st.task, st.deleted
				if st.ops {
					cur.Doc.VolumeOps = []volumeOp{{Kind: opDetach, AttachmentID: "a", VolumeID: "v"}}
				}
				want[cur.ID] = workDue(cur)
				return s.saveServer(ctx, tx, cur)
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		check := func(what string) {
			t.Helper()
			ids, err := s.dueServers(ctx)
			if err != nil {
				t.Fatal(err)
			}
			for id, due := range want {
				if slices.Contains(ids, id) != due {
					t.Errorf("%s: server %s due %v, want %v", what, id, !due, due)
				}
			}
		}
		check("saved")
		// Migration 0071's backfill, run again on the same rows.
		if _, err := s.db.Exec(ctx, "UPDATE compute_servers SET work_due = 0"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.db.Exec(ctx, `UPDATE compute_servers SET work_due = 1 WHERE deleted = 0
 AND (task_state <> '' OR vm_state = 'building' OR doc LIKE '%"volume_ops":[%')`); err != nil {
			t.Fatal(err)
		}
		check("migration backfill")
	})
}

// TestTakeoverWhileRunning: two controllers run side by side; the one
// building a server dies mid-spawn, its lease left behind. The other
// finds the owed work once the lease expires and builds it; the server
// ends active on one host with one claim. Today's code (work in the
// memory of the controller that accepted it) leaves it building for
// ever: only a restart of the dead one resumed it.
func TestTakeoverWhileRunning(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, dbURL string) {
		const ttl = time.Second
		e := newStepEnv(t, dbURL, 2, ttl, 200*time.Millisecond, nil) // a spawn takes 600 ms
		a, b := e.svcs[0], e.svcs[1]
		crashA := run(t, a)
		sv := unitServer(t, a, e.img.ID)
		a.enqueue(sv.ID)
		// a takes the work, places the server and starts its spawn.
		waitFor(t, 10*time.Second, func() bool {
			cur, err := a.loadServer(t.Context(), a.db, sv.ID, false)
			return err == nil && cur.TaskState == taskSpawning
		})
		holder := leaseHolder(t, a.db, serverLease(sv.ID))
		if holder != "a" {
			t.Fatalf("the server's lease is %q's, want a's", holder)
		}
		run(t, b)
		// a dies: its work stops, its lease stays (no one gives it back).
		crashA()
		died := time.Now()
		waitActive(t, b, sv.ID)
		took := time.Since(died)
		if took > ttl+2*time.Second {
			t.Errorf("b finished the build %s after a died", took)
		}
		// The lease goes back once b sees the server rest.
		waitFor(t, 5*time.Second, func() bool { return leaseHolder(t, b.db, serverLease(sv.ID)) == "" })
		cur, _ := b.loadServer(t.Context(), b.db, sv.ID, false)
		c, ok, err := loadClaim(t.Context(), b.db, sv.ID)
		if err != nil || !ok || c.Host != cur.Host {
			t.Fatalf("claim %+v %v %v, server on %q", c, ok, err, cur.Host)
		}
		if _, err := e.drv.State(t.Context(), sv.ID); err != nil {
			t.Fatalf("no VM: %v", err)
		}
	})
}

// TestStepsFenced: a controller whose lease on a server was taken over
// (it stalled past the lease's expiry) commits nothing: not a step's
// result, not a placement, not a volume op's end. The new holder does.
func TestStepsFenced(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, dbURL string) {
		ctx := t.Context()
		var mu sync.Mutex
		now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
		e := newStepEnv(t, dbURL, 2, time.Second, 0, clock)
		a, b := e.svcs[0], e.svcs[1]
		sv := unitServer(t, a, e.img.ID)
		if ok, err := a.leases.Acquire(ctx, serverLease(sv.ID)); !ok || err != nil {
			t.Fatal(ok, err)
		}
		mu.Lock()
		now = now.Add(2 * time.Second)
		mu.Unlock()
		if ok, err := b.leases.Acquire(ctx, serverLease(sv.ID)); !ok || err != nil {
			t.Fatal("b could not take the expired lease", ok, err)
		}
		for _, rest := range []bool{false, true} { // keeping the lease, giving it back
			err := a.commit(ctx, sv.ID, taskScheduling, func(tx *store.Tx, cur *server) error {
				cur.VMState = vmError
				if rest {
					cur.TaskState = taskNone
				}
				return a.saveServer(ctx, tx, cur)
			})
			if !errors.Is(err, lease.ErrLost) {
				t.Fatalf("a's commit after losing the lease (at rest %v): %v", rest, err)
			}
			if cur, err := a.loadServer(ctx, a.db, sv.ID, false); err != nil || cur.VMState == vmError {
				t.Fatalf("a's commit after losing the lease (at rest %v) wrote the server: %v", rest, err)
			}
		}
		err := a.placeOne(ctx, sv, taskScheduling, func(*store.Tx, *server, scheduler.Claim) error { return nil })
		if !errors.Is(err, lease.ErrLost) {
			t.Fatalf("a's placement after losing the lease: %v", err)
		}
		sv.Doc.VolumeOps = []volumeOp{{Kind: opDetach, AttachmentID: "x", VolumeID: "v"}}
		if err := a.endVolumeOp(ctx, sv.ID, sv.Doc.VolumeOps[0], now, nil, nil); !errors.Is(err, lease.ErrLost) {
			t.Fatalf("a's volume op after losing the lease: %v", err)
		}
		// b, the holder, commits.
		if err := b.commit(ctx, sv.ID, taskScheduling, func(tx *store.Tx, cur *server) error {
			cur.TaskState = taskNone
			cur.VMState = vmError
			return b.saveServer(ctx, tx, cur)
		}); err != nil {
			t.Fatal(err)
		}
		if _, ok, _ := loadClaim(ctx, b.db, sv.ID); ok {
			t.Fatal("a's placement left a claim")
		}
	})
}

// TestInstanceSyncOncePerRegion: controllers running side by side square
// the driver's view with the store once per instanceSync between them,
// not once each. Today's code runs it on every controller (and at every
// start).
func TestInstanceSyncOncePerRegion(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newStepEnv(t, dbURL, 3, 0, 0, nil)
		var lists atomic.Int32
		for _, s := range e.svcs {
			s.driver = &countingDriver{Driver: e.drv, lists: &lists}
			run(t, s)
		}
		time.Sleep(1500 * time.Millisecond)
		if n := lists.Load(); n != 1 {
			t.Fatalf("the driver's VMs were listed %d times by 3 controllers in 1.5 s, want once", n)
		}
	})
}

// countingDriver counts List calls: one per instance sync.
type countingDriver struct {
	*fake.Driver
	lists *atomic.Int32
}

func (d *countingDriver) List(ctx context.Context) ([]driver.Instance, error) {
	d.lists.Add(1)
	return d.Driver.List(ctx)
}

func leaseHolder(t *testing.T, db *store.DB, name string) string {
	t.Helper()
	var h string
	err := db.QueryRow(t.Context(), "SELECT holder FROM leases WHERE name = ?", name).Scan(&h)
	if err != nil && !store.IsNoRows(err) {
		t.Fatal(err)
	}
	return h
}

func waitFor(t *testing.T, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in time")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestStoreFaultRetried: a spawn that fails because this controller's
// database failed it (away in a failover, here four times running, more
// than one walk's retries) is tried again after the server's backoff, not
// recorded as the server's fault: the server ends ACTIVE with one VM,
// booted once, and nothing destroyed it in between.
func TestStoreFaultRetried(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newStepEnv(t, dbURL, 1, 0, 0, nil)
		s := e.svcs[0]
		drv := &storeFaultDriver{Driver: e.drv, fail: 4}
		s.driver = drv
		run(t, s)
		sv := unitServer(t, s, e.img.ID)
		s.enqueue(sv.ID)
		waitActive(t, s, sv.ID)
		if drv.failed.Load() != 4 || drv.destroyed.Load() != 0 {
			t.Errorf("%d spawns failed, %d destroys; want 4 and 0", drv.failed.Load(), drv.destroyed.Load())
		}
		if p, err := e.drv.State(t.Context(), sv.ID); err != nil || p != driver.Running {
			t.Fatalf("the VM: %v %v", p, err)
		}
	})
}

// storeFaultDriver fails its first fail spawns as the fleet does when its
// database is away.
type storeFaultDriver struct {
	*fake.Driver
	fail              int64
	failed, destroyed atomic.Int64
}

func (d *storeFaultDriver) Spawn(ctx context.Context, spec driver.Spec) error {
	if d.failed.Load() < d.fail {
		d.failed.Add(1)
		return fmt.Errorf("fleet: spawn %s: %w", spec.ServerID, store.ErrUnavailable)
	}
	return d.Driver.Spawn(ctx, spec)
}

func (d *storeFaultDriver) Destroy(ctx context.Context, id string) error {
	d.destroyed.Add(1)
	return d.Driver.Destroy(ctx, id)
}
