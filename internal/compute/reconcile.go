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
	"nimbus/internal/metering"
	"nimbus/internal/network"
	"nimbus/internal/store"
)

// The reconcile loop: API handlers write a server's intent (vm_state and
// task_state) and enqueue its id after commit; workers take ids from a
// deduplicating queue and walk each server through the driver one step at
// a time, writing every state change in its own small transaction, until
// the server rests (task_state null). A restart re-enqueues every server
// with a task state, so an interrupted task resumes where it was.

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

// Run drives the reconcile loop until ctx ends: it resumes every unfinished
// task found in the store, then serves new ones.
func (s *Service) Run(ctx context.Context) {
	s.queue.Work(s.workerCount(), func(id string) error { return s.reconcile(ctx, id) })
	if err := s.backfillMeter(ctx); err != nil && ctx.Err() == nil {
		s.log.Error("metering: backfill failed", "error", err)
	}
	if err := s.backfillClaims(ctx); err != nil && ctx.Err() == nil {
		s.log.Error("scheduler: claim backfill failed", "error", err)
	}
	if pn, ok := s.driver.(driver.PowerNotifier); ok {
		pn.SetPowerListener(func(id string, p driver.PowerState) {
			if ctx.Err() == nil {
				s.syncPower(ctx, id, p)
			}
		})
	}
	s.resume(ctx)
	tick := time.NewTicker(instanceSync)
	defer tick.Stop()
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case <-tick.C:
			s.syncInstances(ctx)
		}
	}
	s.queue.Shutdown()
}

// resume enqueues servers with unfinished tasks and squares the driver's
// view with the store (nova/compute/manager.py init_host and
// _sync_power_states).
func (s *Service) resume(ctx context.Context) {
	// Servers with volume ops owed hold them in their document.
	rows, err := s.db.Query(ctx, `SELECT id FROM compute_servers WHERE deleted=0 AND (task_state<>'' OR vm_state=?
 OR doc LIKE ?)`, vmBuilding, `%"volume_ops":[%`)
	if err != nil {
		s.log.Error("reconcile: resume query failed", "error", err)
		return
	}
	var ids []string
	for rows.Next() {
		var id string
		if rows.Scan(&id) == nil {
			ids = append(ids, id)
		}
	}
	rows.Close()
	for _, id := range ids {
		s.enqueue(id)
	}
	s.syncInstances(ctx)
}

// Periods of the loop's background work.
const (
	// hostDownRetry is how soon a step that found its host down looks again.
	hostDownRetry = 5 * time.Second
	// stepRetry is how soon a step that failed to commit (the store or a
	// collaborator failed, not the driver) is tried again; each failure
	// in a row of the same server doubles it, up to stepRetryMax.
	stepRetry    = 500 * time.Millisecond
	stepRetryMax = time.Minute
	// instanceSync is how often the driver's view of the VMs is squared
	// with the store, as nova's _sync_power_states and
	// _cleanup_running_deleted_instances do.
	instanceSync = 30 * time.Second
)

// syncInstances destroys VMs whose server is gone and syncs the power state
// of servers at rest with what the driver sees.
func (s *Service) syncInstances(ctx context.Context) {
	insts, err := s.driver.List(ctx)
	if err != nil {
		s.log.Warn("reconcile: driver list failed", "error", err)
		return
	}
	live := map[string]bool{}
	rows, err := s.db.Query(ctx, `SELECT id FROM compute_servers WHERE deleted = 0`)
	if err != nil {
		s.log.Warn("reconcile: server list failed", "error", err)
		return
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
		return
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

// reconcile walks one server until it rests or ctx ends. An error asks
// the queue to try the server again after its backoff.
func (s *Service) reconcile(ctx context.Context, id string) error {
	defer s.fresh.Delete(id)
	for i := 0; i < 32 && ctx.Err() == nil; i++ {
		var sv *server
		var err error
		if v, ok := s.fresh.LoadAndDelete(id); ok {
			sv = v.(*server)
		} else {
			sv, err = s.loadServer(ctx, s.db, id, false)
		}
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil // shutting down: resumed at the next start
			}
			s.log.Error("reconcile: load failed", "server", id, "error", err)
			return err
		}
		if sv.Deleted {
			return nil
		}
		// Volume ops come before any task step (a delete removes every
		// attachment itself).
		if len(sv.Doc.VolumeOps) > 0 && sv.TaskState != taskDeleting {
			if err := s.volumeStep(ctx, sv); err != nil {
				if ctx.Err() != nil || errors.Is(err, errWaitHost) {
					return nil
				}
				s.log.Error("reconcile: volume op failed to commit", "server", id, "error", err)
				return err
			}
			continue
		}
		if sv.TaskState == "" && sv.VMState != vmBuilding {
			return nil
		}
		if more, err := s.step(ctx, sv); !more {
			return err
		}
	}
	return nil
}

// commit writes a step's result if the server still has the task state the
// step worked on: a newer intent (such as a delete during a build) wins.
func (s *Service) commit(ctx context.Context, id, task string, f stepResult) error {
	var written *server
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		written = nil
		sv, err := s.loadServer(ctx, tx, id, true)
		if err != nil {
			return err
		}
		if sv.TaskState != task || sv.Deleted {
			return nil
		}
		if err := f(tx, sv); err != nil {
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
// release also frees its host and network (a build that never ran).
func (s *Service) fail(ctx context.Context, sv *server, task, event string, started time.Time, cause error, release bool) error {
	if ctx.Err() != nil {
		return ctx.Err() // shutting down: the step resumes after a restart
	}
	if errors.Is(cause, driver.ErrHostDown) {
		// The host's agent is not reporting: the work waits for it rather
		// than fail the server (nova-compute picks its queue up when it
		// comes back).
		s.log.Info("reconcile: host down, step waits", "server", sv.ID, "task", task, "host", sv.Host)
		id := sv.ID
		time.AfterFunc(hostDownRetry, func() {
			if ctx.Err() == nil {
				s.enqueue(id)
			}
		})
		return nil
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

// step performs the next step for sv; it reports whether to look again,
// and the error of a step that failed to commit.
func (s *Service) step(ctx context.Context, sv *server) (bool, error) {
	started := s.now()
	task := sv.TaskState
	ctx = driver.WithOpKey(ctx, sv.ID+"/"+task+"/"+sv.Doc.TaskID)
	var err error
	switch {
	case task == taskDeleting:
		err = s.stepDelete(ctx, sv, started)
	case sv.VMState == vmBuilding && task == taskScheduling:
		err = s.stepSchedule(ctx, sv, started)
	case sv.VMState == vmBuilding && task == taskNone:
		err = s.commit(ctx, sv.ID, task, func(tx *store.Tx, cur *server) error {
			cur.TaskState = taskSpawning
			if cur.Host == "" {
				cur.TaskState = taskScheduling
			}
			return s.saveServer(ctx, tx, cur)
		})
	case sv.VMState == vmBuilding && task == taskSpawning && sv.needsAttach():
		err = s.stepBlockDevices(ctx, sv, started)
	case sv.VMState == vmBuilding && task == taskSpawning:
		err = s.stepSpawn(ctx, sv, started, "compute_build_and_run_instance")
	case task == taskPoweringOff:
		err = s.simpleStep(ctx, sv, started, "compute_stop_instance", func() error { return s.driver.PowerOff(ctx, sv.ID, true) }, vmStopped, driver.Shutdown)
	case task == taskPoweringOn:
		err = s.simpleStep(ctx, sv, started, "compute_start_instance", func() error { return s.driver.PowerOn(ctx, sv.ID) }, vmActive, driver.Running)
	case task == taskRebooting:
		err = s.simpleStep(ctx, sv, started, "compute_reboot_instance", func() error { return s.driver.Reboot(ctx, sv.ID, false) }, vmActive, driver.Running)
	case task == taskRebootingHard:
		err = s.simpleStep(ctx, sv, started, "compute_reboot_instance", func() error { return s.driver.Reboot(ctx, sv.ID, true) }, vmActive, driver.Running)
	case task == taskPausing:
		err = s.simpleStep(ctx, sv, started, "compute_pause_instance", func() error { return s.driver.Pause(ctx, sv.ID) }, vmPaused, driver.Paused)
	case task == taskUnpausing:
		err = s.simpleStep(ctx, sv, started, "compute_unpause_instance", func() error { return s.driver.Unpause(ctx, sv.ID) }, vmActive, driver.Running)
	case task == taskSuspending:
		err = s.simpleStep(ctx, sv, started, "compute_suspend_instance", func() error { return s.driver.Suspend(ctx, sv.ID) }, vmSuspended, driver.Suspended)
	case task == taskResuming:
		err = s.simpleStep(ctx, sv, started, "compute_resume_instance", func() error { return s.driver.Resume(ctx, sv.ID) }, vmActive, driver.Running)
	case task == taskShelving:
		err = s.stepShelve(ctx, sv, started)
	case task == taskShelvingOffloading:
		err = s.stepOffload(ctx, sv, started)
	case task == taskUnshelving:
		err = s.stepUnshelve(ctx, sv, started)
	case sv.VMState == vmShelvedOffloaded && task == taskSpawning:
		err = s.stepSpawn(ctx, sv, started, "compute_unshelve_instance")
	case task == taskResizePrep:
		err = s.commit(ctx, sv.ID, task, func(tx *store.Tx, cur *server) error {
			cur.TaskState = taskResizeMigrating
			return s.saveServer(ctx, tx, cur)
		})
	case task == taskResizeMigrating:
		err = s.stepResize(ctx, sv, started)
	case task == taskResizeFinish:
		err = s.commit(ctx, sv.ID, task, func(tx *store.Tx, cur *server) error {
			cur.VMState, cur.TaskState = vmResized, ""
			return s.finish(ctx, tx, cur, "compute_finish_resize", started, nil)
		})
	case task == taskResizeReverting:
		err = s.stepRevert(ctx, sv, started)
	case task == taskRebuilding:
		err = s.stepRebuild(ctx, sv, started)
	case task == taskRebuildSpawning:
		err = s.stepRebuildSpawn(ctx, sv, started)
	case task == taskImageSnapshot:
		err = s.stepSnapshot(ctx, sv, started, taskImageSnapshot)
	case task == taskImageBackup:
		err = s.stepSnapshot(ctx, sv, started, taskImageBackup)
	default:
		// A task this loop does not drive: clear it so the server is usable.
		s.log.Warn("reconcile: unknown task state cleared", "server", sv.ID, "vm_state", sv.VMState, "task_state", task)
		err = s.commit(ctx, sv.ID, task, func(tx *store.Tx, cur *server) error {
			cur.TaskState = ""
			return s.saveServer(ctx, tx, cur)
		})
	}
	if errors.Is(err, errWaitVolumes) {
		id := sv.ID
		time.AfterFunc(volumeWait, func() {
			if ctx.Err() == nil {
				s.enqueue(id)
			}
		})
		return false, nil
	}
	if err != nil {
		if ctx.Err() != nil {
			return false, nil // shutting down: resumed at the next start
		}
		// The store or a collaborator failed, not the driver: the queue
		// tries the same step again after the server's backoff rather
		// than give up.
		s.log.Error("reconcile: step failed to commit", "server", sv.ID, "task", task, "error", err)
		return false, err
	}
	return true, nil
}
