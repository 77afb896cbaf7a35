package compute

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/driver"
	"nimbus/internal/image"
	"nimbus/internal/lease"
	"nimbus/internal/metering"
	"nimbus/internal/network"
	"nimbus/internal/store"
)

// The reconcile loop: API handlers write a server's intent (task_state,
// or vm_state building) and enqueue its id after commit; workers take ids
// from a deduplicating queue and walk each server through the driver one
// step at a time (steps.go), writing every state change in its own small
// transaction, until the server rests (no step is owed).
//
// The work is owned through the database, not by the controller that
// accepted the request: a worker walks a server only under the server's
// lease (internal/lease), renewed while the controller lives and checked
// by every commit, and gives it back when the server rests. Every
// controller looks every scanPeriod for servers that owe a step
// (work_due, written with the state) and whose lease no other live
// controller holds, so the work of a controller that died is picked up
// within the lease's TTL and one look; a restart finds its own at once.
// Every retry, of a failed commit, of a host that is down, of a build
// whose volumes are not ready, goes through the queue's per-key backoff.

// workerCount is how many servers are driven at once: PostgreSQL is bound
// by round trips and gains from more; SQLite has one writer and a pool of
// eight connections that the API needs too.
func (s *Service) workerCount() int {
	if s.db.Dialect() == store.Postgres {
		return 16
	}
	return 6
}

// enqueue asks the reconcile loop to look at a server: a new request,
// which also resets the server's retry backoff.
func (s *Service) enqueue(id string) { s.queue.Add(id) }

// Run drives the reconcile loop until ctx ends: it takes up the owed work
// it finds in the store, serves new requests, looks for owed work that no
// live controller holds every scanPeriod, and offers to run the instance
// sweep (once per instanceSync in the region).
func (s *Service) Run(ctx context.Context) {
	if s.ownLeases {
		// Renewed until the workers have stopped, then given back.
		lctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		done := make(chan struct{})
		go func() { defer close(done); s.leases.Run(lctx) }()
		defer func() { cancel(); <-done }()
	}
	s.queue.Work(s.workerCount(), func(id string) error { return s.reconcile(ctx, id) })
	s.runBackfills(ctx)
	if pn, ok := s.driver.(driver.PowerNotifier); ok {
		pn.SetPowerListener(func(id string, p driver.PowerState) {
			if ctx.Err() == nil {
				s.syncPower(ctx, id, p)
			}
		})
	}
	swept := make(chan struct{})
	go func() {
		defer close(swept)
		s.leases.Loop(ctx, lease.Job{Name: "compute-instance-sync", Next: lease.Every(instanceSync), Check: instanceSync,
			Run: s.syncInstances})
	}()
	t := time.NewTicker(s.scanEvery)
	defer t.Stop()
	for s.scan(ctx); ctx.Err() == nil; {
		select {
		case <-ctx.Done():
		case <-t.C:
			s.scan(ctx)
		}
	}
	s.queue.Shutdown()
	<-swept
}

// runBackfills gives servers made by older versions what they lack
// (usage periods, claims), on one controller at a time.
func (s *Service) runBackfills(ctx context.Context) {
	always := func(time.Time) time.Time { return time.Time{} }
	_, _, err := s.leases.RunJob(ctx, lease.Job{Name: "compute-backfill", Next: always, Run: func(ctx context.Context) error {
		if err := s.backfillMeter(ctx); err != nil {
			return fmt.Errorf("metering backfill: %w", err)
		}
		if err := s.backfillClaims(ctx); err != nil {
			return fmt.Errorf("claim backfill: %w", err)
		}
		return nil
	}})
	if err != nil && ctx.Err() == nil {
		s.log.Error("compute: backfill failed", "error", err)
	}
}

// serverLease names the lease that owns a server's work.
func serverLease(id string) string { return "server/" + id }

// scan pokes every server that owes a step and whose lease no other live
// controller holds: work left by a controller that died, or never
// enqueued (nova/compute/manager.py init_host resumes the same way, from
// task states, but only for its own host).
func (s *Service) scan(ctx context.Context) {
	ids, err := s.dueServers(ctx)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("reconcile: looking for owed work failed", "error", err)
		}
		return
	}
	if len(ids) == 0 {
		return
	}
	held, err := s.leases.HeldByOthers(ctx, serverLease(""))
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("reconcile: reading leases failed", "error", err)
		}
		return
	}
	for _, id := range ids {
		if !held[serverLease(id)] {
			s.queue.Poke(id)
		}
	}
}

// dueServers are the servers that owe a step.
func (s *Service) dueServers(ctx context.Context) ([]string, error) {
	rows, err := s.db.Query(ctx, `SELECT id FROM compute_servers WHERE work_due = 1`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}

// Periods of the loop's background work.
const (
	// stepRetry is how soon a step that failed to commit (the store or a
	// collaborator failed, not the driver), found its host down or its
	// volumes not ready is tried again; each failure in a row of the same
	// server doubles it, up to stepRetryMax.
	stepRetry    = 500 * time.Millisecond
	stepRetryMax = time.Minute
	// instanceSync is how often the driver's view of the VMs is squared
	// with the store, as nova's _sync_power_states and
	// _cleanup_running_deleted_instances do.
	instanceSync = 30 * time.Second
	// scanPeriod is how often a controller looks for owed work no live
	// controller holds. With lease.DefaultTTL, the work of a controller
	// that died is taken up within 20 s.
	scanPeriod = 5 * time.Second
)

// syncInstances destroys VMs whose server is gone and syncs the power state
// of servers at rest with what the driver sees.
func (s *Service) syncInstances(ctx context.Context) error {
	insts, err := s.driver.List(ctx)
	if err != nil {
		return fmt.Errorf("driver list: %w", err)
	}
	live := map[string]bool{}
	rows, err := s.db.Query(ctx, `SELECT id FROM compute_servers WHERE deleted = 0`)
	if err != nil {
		return fmt.Errorf("server list: %w", err)
	}
	for rows.Next() {
		var id string
		if rows.Scan(&id) == nil {
			live[id] = true
		}
	}
	rows.Close()
	seen := map[string]driver.Instance{}
	for _, in := range insts {
		seen[in.ID] = in
		if !live[in.ID] {
			// A VM whose server is gone: destroy it.
			if err := s.driver.Destroy(ctx, in.ID); err != nil {
				s.log.Warn("reconcile: destroy orphan failed", "server", in.ID, "error", err)
			}
		}
	}
	// Servers that should run: sync power states as Nova's periodic task does.
	rows, err = s.db.Query(ctx, `SELECT id, power_state FROM compute_servers WHERE deleted=0 AND task_state='' AND host<>''
 AND vm_state IN (?,?,?,?)`, vmActive, vmStopped, vmPaused, vmSuspended)
	if err != nil {
		return err
	}
	type ps struct {
		id    string
		power int
	}
	var check []ps
	for rows.Next() {
		var p ps
		if rows.Scan(&p.id, &p.power) == nil {
			check = append(check, p)
		}
	}
	rows.Close()
	for _, p := range check {
		in, ok := seen[p.id]
		power := driver.NoState
		if ok {
			power = in.Power
		}
		if int(power) != p.power {
			s.syncPower(ctx, p.id, power)
		}
	}
	return nil
}

// syncPower records a server's power state as the driver sees it, when the
// server is at rest (nova _sync_instance_power_state): a VM found stopped
// while its server should run leaves the server stopped too.
func (s *Service) syncPower(ctx context.Context, id string, power driver.PowerState) {
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		sv, err := s.loadServer(ctx, tx, id, true)
		if err != nil || sv.TaskState != "" || sv.Deleted || sv.Host == "" || sv.Power == int(power) {
			return err
		}
		sv.Power = int(power)
		if sv.VMState == vmActive && (power == driver.Shutdown || power == driver.Crashed) {
			sv.VMState = vmStopped
		}
		return s.saveServer(ctx, tx, sv)
	})
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		s.log.Warn("reconcile: power sync failed", "server", id, "error", err)
	}
}

// stepResult is what a driver step asks to write.
type stepResult func(tx *store.Tx, sv *server) error

// Outcomes of a walk that are not failures.
var (
	// errMore ends a walk that took maxSteps steps: the server is handed
	// out again at once, behind the others queued.
	errMore = errors.New("more steps owed")
	// errWaitHost ends a walk whose step found the server's host down
	// (its agent is not reporting): the work waits for it through the
	// queue's backoff rather than fail the server, as nova-compute picks
	// its queue up when it comes back.
	errWaitHost = errors.New("host down")
)

// maxSteps bounds one walk, so that a server with a long life cycle does
// not hold a worker from the others.
const maxSteps = 32

// reconcile takes server id's lease and walks the server until it rests,
// then gives the lease back. A server whose lease another controller
// holds is left to it. An error asks the queue to try again after the
// server's backoff, the lease kept meanwhile: the work stays this
// controller's, and another's only if this one dies.
func (s *Service) reconcile(ctx context.Context, id string) error {
	if _, taken := s.owned.LoadAndDelete(id); !taken {
		ok, err := s.leases.Acquire(ctx, serverLease(id))
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			s.log.Error("reconcile: taking the lease failed", "server", id, "error", err)
			return err
		}
		if !ok {
			return nil // another controller owns the work
		}
	}
	err := s.walk(ctx, id)
	switch {
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return nil // shutting down: resumed by the next owner
	case errors.Is(err, lease.ErrLost):
		s.log.Info("reconcile: the server's lease went to another controller", "server", id)
		return nil
	case errors.Is(err, errMore):
		s.queue.Add(id)
		return nil
	case errors.Is(err, errWaitHost), errors.Is(err, errWaitVolumes):
		s.log.Info("reconcile: step waits", "server", id, "for", err.Error())
		return err
	}
	// The store or a collaborator failed, not the driver: the queue
	// tries the same step again after the server's backoff rather than
	// give up.
	s.log.Error("reconcile: step failed to commit", "server", id, "error", err)
	return err
}

// walk runs the steps server id's recorded state asks for until it rests
// (the lease given back) or maxSteps were taken (errMore).
func (s *Service) walk(ctx context.Context, id string) error {
	defer s.fresh.Delete(id)
	for range maxSteps {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var sv *server
		var err error
		if v, ok := s.fresh.LoadAndDelete(id); ok {
			sv = v.(*server)
		} else {
			sv, err = s.loadServer(ctx, s.db, id, false)
		}
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return err
		}
		st, owed := step{}, false
		if err == nil {
			st, owed = stepFor(sv)
		}
		if !owed && err == nil && sv.released {
			return nil // the step's commit gave the lease back with the server at rest
		}
		if !owed {
			rested, err := s.rest(ctx, id)
			if err != nil || rested {
				return err
			}
			continue // new intent arrived meanwhile
		}
		if err := s.runStep(ctx, sv, st); err != nil {
			return err
		}
	}
	return errMore
}

// runStep runs st for sv, keyed for the driver by the server, its task and
// its intent's id, so that the same step asked again (after a restart, or
// by the controller that took the server over) finds the same work on its
// host instead of starting it twice.
func (s *Service) runStep(ctx context.Context, sv *server, st step) error {
	ctx = driver.WithOpKey(ctx, sv.ID+"/"+sv.TaskState+"/"+sv.Doc.TaskID)
	return st.run(s, ctx, sv, s.now())
}

// rest gives server id's lease back if the stored server owes no step,
// read under the row's lock: an intent committed meanwhile keeps the lease
// and is walked, and one committed after finds the lease free.
func (s *Service) rest(ctx context.Context, id string) (bool, error) {
	rested := false
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		rested = false
		q := `SELECT work_due FROM compute_servers WHERE id = ?`
		if tx.Dialect() == store.Postgres {
			q += " FOR UPDATE"
		}
		var due int
		if err := tx.QueryRow(ctx, q, id).Scan(&due); err != nil && !store.IsNoRows(err) {
			return err
		}
		if due != 0 {
			return nil
		}
		rested = true
		return s.leases.Release(ctx, tx, serverLease(id))
	})
	return rested, err
}

// commit writes a step's result if the server still has the task state the
// step worked on and its lease is still this controller's: a newer intent
// (such as a delete during a build) wins, and so does a controller that
// took the server over. A result that leaves the server at rest gives the
// lease back in the same transaction.
func (s *Service) commit(ctx context.Context, id, task string, f stepResult) error {
	var written *server
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		written = nil
		sv, err := s.loadServer(ctx, tx, id, true)
		if err != nil {
			return err
		}
		if sv.TaskState != task || sv.Deleted {
			return s.leases.Hold(ctx, tx, serverLease(id))
		}
		if err := f(tx, sv); err != nil {
			return err
		}
		// The lease fences the write: lost, nothing commits.
		hold := s.leases.Hold
		if sv.released = !workDue(sv); sv.released {
			hold = s.leases.GiveBack
		}
		if err := hold(ctx, tx, serverLease(id)); err != nil {
			return err
		}
		written = sv
		return nil
	})
	if err == nil && written != nil {
		s.fresh.Store(id, written)
	}
	return err
}

// finish closes the action and writes the server in tx.
func (s *Service) finish(ctx context.Context, tx store.Querier, sv *server, event string, started time.Time, failure error) error {
	if err := s.finishAction(ctx, tx, sv.ID, sv.Doc.RequestID, event, sv.Host, started, failure); err != nil {
		return err
	}
	return s.saveServer(ctx, tx, sv)
}

// retry runs a driver call with backoff for transient failures.
func retry(ctx context.Context, f func() error) error {
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		if err = f(); err == nil || errors.Is(err, context.Canceled) || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(25<<(2*attempt)) * time.Millisecond):
		}
	}
	return err
}

// spec is what the driver needs to build sv's VM: the server, its flavor,
// the claim it holds on its host, its boot image, its ports and its
// volumes, connected for its host.
func (s *Service) spec(ctx context.Context, sv *server) (driver.Spec, error) {
	f := sv.Doc.Flavor
	sp := driver.Spec{ServerID: sv.ID, Name: sv.Name, Hostname: sv.Hostname, ProjectID: sv.ProjectID, Host: sv.Host,
		Zone: sv.AZ, VCPUs: f.VCPUs, MemoryMB: f.RAM, DiskGB: f.diskGB(), ImageID: sv.ImageRef,
		OSType: sv.Doc.OSType, KeyName: sv.KeyName, PublicKey: sv.Doc.PublicKey, AdminPass: sv.Doc.AdminPass,
		Metadata: sv.Doc.Metadata, ConfigDrive: sv.Doc.ConfigDrive, LaunchIndex: sv.LaunchIndex,
		ReservationID: sv.ReservationID}
	if sp.OSType == "" {
		sp.OSType = "linux"
	}
	if sv.Doc.UserData != nil {
		if b, err := base64Decode(*sv.Doc.UserData); err == nil {
			sp.UserData = b
		}
	}
	if img := sv.Doc.Shelved.ImageID; img != "" && sv.VMState == vmShelvedOffloaded {
		sp.ImageID = img
	}
	sp.DiskType, sp.DiskIOPS = diskThrottle(f)

	c, ok, err := loadClaim(ctx, s.db, sv.ID)
	if err != nil {
		return sp, err
	}
	if ok {
		for _, cl := range c.Cells {
			sp.Cells = append(sp.Cells, driver.Cell{Node: cl.Node, CPUs: cl.CPUs, MemoryMB: cl.MemoryMB})
		}
		sp.GPUs = c.GPUs
	}

	if sv.volumeBacked() {
		// The boot volume holds the data; its image, when the owner may
		// still read it, describes the guest (hw_ properties), as Nova
		// reads a volume's image metadata.
		sp.ImageID = sv.ImageRef
		if sp.ImageID == "" {
			sp.ImageID = sv.Doc.BootImage
		}
	}
	if sp.ImageID != "" {
		img, err := s.bootImage(ctx, sv.ProjectID, sp.ImageID)
		if err != nil && sv.volumeBacked() && errors.Is(err, errImageUnusable) {
			img, err = nil, nil
		}
		if err != nil {
			return sp, err
		}
		sp.Image = driver.ImageRef{ID: sp.ImageID}
		if img != nil {
			sp.Image = imageRef(img)
			if img.Properties["img_config_drive"] == "mandatory" {
				sp.ConfigDrive = true
			}
		}
	}

	ports, err := s.networks.ServerPorts(ctx, network.ServerRef{ID: sv.ID, ProjectID: sv.ProjectID})
	if err != nil {
		return sp, err
	}
	for _, p := range ports {
		sp.Ports = append(sp.Ports, driver.Port{ID: p.ID, NetworkID: p.NetworkID, MAC: p.MAC, IP: p.IP,
			CIDR: p.CIDR, Gateway: p.Gateway, DNS: p.DNS, MTU: p.MTU})
		if p.IP != "" {
			sp.FixedIPs = append(sp.FixedIPs, p.IP)
		}
	}
	if sp.Volumes, err = s.specVolumes(ctx, sv); err != nil {
		return sp, err
	}
	return sp, bootSpec(sv, &sp)
}

// errImageUnusable is wrapped by spec's errors for an image the server's
// project may not read: the step fails with the reason instead of retrying.
var errImageUnusable = errors.New("image unusable")

// bootImage is the image a server boots, with the rights of the server's
// own project at the moment of use, and so is every image it names for
// the hypervisor (kernel_id, ramdisk_id): an image's properties are its
// owner's to write, so they may name anyone's image. An image deleted
// since the server was made gives nil: its host may still have it cached,
// and the driver says so if it has not.
func (s *Service) bootImage(ctx context.Context, project, id string) (*image.Image, error) {
	img, err := s.readableImage(ctx, project, id)
	if err != nil || img == nil {
		return nil, err
	}
	for _, k := range []string{"kernel_id", "ramdisk_id"} {
		ref := img.Properties[k]
		if ref == "" {
			continue
		}
		part, err := s.readableImage(ctx, project, ref)
		if err != nil && !errors.Is(err, errImageUnusable) {
			return nil, err
		}
		if part == nil {
			return nil, fmt.Errorf("%w: the %s %s of image %s could not be found", errImageUnusable, k, ref, id)
		}
	}
	return img, nil
}

// readableImage is image id as project may read it; nil when it no longer
// exists at all, errImageUnusable when it exists but is not the project's
// to read.
func (s *Service) readableImage(ctx context.Context, project, id string) (*image.Image, error) {
	img, err := s.images.Get(ctx, project, false, id)
	if err == nil {
		return img, nil
	}
	if !errors.Is(err, store.ErrNotFound) {
		return nil, err
	}
	if _, err := s.images.Get(ctx, "", true, id); errors.Is(err, store.ErrNotFound) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("%w: image %s could not be found", errImageUnusable, id)
}

// specFailed ends a step whose spec could not be made: an unusable image
// fails the server with the reason (release as for the step's own
// failure); any other error is retried.
func (s *Service) specFailed(ctx context.Context, sv *server, task, event string, started time.Time, err error, release bool) error {
	if !errors.Is(err, errImageUnusable) {
		return err
	}
	return s.fail(ctx, sv, task, event, started, err, release)
}

// imageRef is what a driver needs of an image.
func imageRef(img *image.Image) driver.ImageRef {
	ref := driver.ImageRef{ID: img.ID, Name: img.Name, DiskFormat: img.DiskFormat, Size: img.Size,
		Checksum: img.Checksum, KernelID: img.Properties["kernel_id"], RamdiskID: img.Properties["ramdisk_id"],
		CommandLine: img.Properties["os_command_line"]}
	if img.OSHashAlgo == "sha512" {
		ref.HashValue = img.OSHashValue
	}
	for k, v := range img.Properties {
		// nimbus_placeholder: a driver that needs image data refuses it.
		if strings.HasPrefix(k, "hw_") || k == "nimbus_placeholder" {
			if ref.Properties == nil {
				ref.Properties = map[string]string{}
			}
			ref.Properties[k] = v
		}
	}
	return ref
}

// Boot disk throttles by disk type (the service description's figures),
// which an operator changes per flavor with Nova's libvirt extra specs
// quota:disk_read_iops_sec and quota:disk_write_iops_sec.
var diskIOPS = map[string]driver.IOPS{
	"local":   {Read: 75000, Write: 20000},
	"network": {Read: 70000, Write: 60000},
}

// diskThrottle is a flavor's boot disk type and IOPS limits.
func diskThrottle(f flavorSnap) (string, driver.IOPS) {
	typ := f.ExtraSpecs["nimbus:disk_type"]
	if typ == "" {
		typ = "local"
	}
	iops := diskIOPS[typ]
	if n, err := strconv.Atoi(f.ExtraSpecs["quota:disk_read_iops_sec"]); err == nil && n >= 0 {
		iops.Read = n
	}
	if n, err := strconv.Atoi(f.ExtraSpecs["quota:disk_write_iops_sec"]); err == nil && n >= 0 {
		iops.Write = n
	}
	return typ, iops
}

// fail puts a server in ERROR with a fault after a failed driver step;
// release also frees its host and network (a build that never ran). A
// host that is down, or a database that failed the step, leaves the step
// to be tried again instead.
func (s *Service) fail(ctx context.Context, sv *server, task, event string, started time.Time, cause error, release bool) error {
	if ctx.Err() != nil {
		return ctx.Err() // shutting down: the step resumes after a restart
	}
	if errors.Is(cause, driver.ErrHostDown) {
		return fmt.Errorf("%w: %s (%s)", errWaitHost, sv.Host, task)
	}
	if store.IsServiceFault(cause) {
		return cause // tried again after the server's backoff
	}
	s.log.Warn("reconcile: step failed", "server", sv.ID, "task", task, "error", cause)
	msg, code := cause.Error(), 500
	var ae *api.Error
	if errors.As(cause, &ae) {
		code, msg = ae.Status, ae.Message
	}
	return s.commit(ctx, sv.ID, task, func(tx *store.Tx, cur *server) error {
		cur.VMState, cur.TaskState = vmError, ""
		cur.Doc.Fault = &faultDoc{Code: code, Message: msg, Details: cause.Error(), Created: s.now()}
		if release {
			if err := s.networks.ReleaseServer(ctx, tx, cur.ID); err != nil {
				return err
			}
			if err := s.releaseServer(ctx, tx, cur.ID); err != nil {
				return err
			}
			cur.Host, cur.Power = "", int(driver.NoState)
			// A build that never booted is never billed.
			if cur.LaunchedAt == nil {
				if err := metering.Drop(ctx, tx, cur.ID, cur.CreatedAt); err != nil {
					return err
				}
			}
		}
		return s.finish(ctx, tx, cur, event, started, cause)
	})
}
