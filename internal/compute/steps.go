package compute

import (
	"context"
	"time"

	"nimbus/internal/driver"
	"nimbus/internal/store"
)

// The life cycle as data. A server's recorded state, vm_state (the status
// the reconcile loop keeps) and task_state (the intent the API writes),
// chooses its next step through one table, as nova-compute's manager has
// one method per task state. A step is looked up by the exact pair first,
// then by its task state under any vm_state; the order of the entries does
// not matter, and a pair the table lacks is either at rest (no task) or a
// task this loop does not drive (cleared). The same lookup says whether a
// server owes work at all (stepFor(sv) != nil), which saveServer records
// as work_due: what any controller looks for.

// stepKey is the recorded state that chooses a step.
type stepKey struct{ vm, task string }

// anyVM stands for every vm_state in a stepKey.
const anyVM = "*"

// step is one unit of reconcile work: run drives the driver and commits
// the server's next state (or its failure) through commit or fail.
type step struct {
	name string
	run  func(s *Service, ctx context.Context, sv *server, started time.Time) error
}

// driverCall is a step's one call to the driver for server id.
type driverCall func(ctx context.Context, d driver.Driver, id string) error

// simple is a step that makes one driver call and, on success, leaves the
// server in vm_state vm with power state power and no task.
func simple(event string, call driverCall, vm string, power driver.PowerState) func(*Service, context.Context, *server, time.Time) error {
	return func(s *Service, ctx context.Context, sv *server, started time.Time) error {
		return s.simpleStep(ctx, sv, started, event, func() error { return call(ctx, s.driver, sv.ID) }, vm, power)
	}
}

// steps is the table: (vm_state, task_state) → step. Nova's task states
// (nova/compute/task_states.py) and the manager method each runs. It is
// filled in init: its steps save servers, and a save asks the table
// whether work is owed.
var steps map[stepKey]step

// Steps outside the table: volume ops, owed before any task but a delete
// (which removes every attachment itself), and a task this loop does not
// drive, cleared so that the server is usable.
var volumeOpStep, clearStep step

func init() {
	volumeOpStep = step{"volume-op", (*Service).volumeStep}
	clearStep = step{"clear-unknown-task", (*Service).stepClearTask}
	steps = map[stepKey]step{
		{anyVM, taskDeleting}: {"delete", (*Service).stepDelete},

		{vmBuilding, taskNone}:       {"build", (*Service).stepBuildStart},
		{vmBuilding, taskScheduling}: {"schedule", (*Service).stepSchedule},
		{vmBuilding, taskSpawning}:   {"spawn", (*Service).stepBuild},

		{anyVM, taskPoweringOff}: {"power-off", simple("compute_stop_instance",
			func(ctx context.Context, d driver.Driver, id string) error { return d.PowerOff(ctx, id, true) }, vmStopped, driver.Shutdown)},
		{anyVM, taskPoweringOn}: {"power-on", simple("compute_start_instance",
			func(ctx context.Context, d driver.Driver, id string) error { return d.PowerOn(ctx, id) }, vmActive, driver.Running)},
		{anyVM, taskRebooting}: {"reboot", simple("compute_reboot_instance",
			func(ctx context.Context, d driver.Driver, id string) error { return d.Reboot(ctx, id, false) }, vmActive, driver.Running)},
		{anyVM, taskRebootingHard}: {"reboot-hard", simple("compute_reboot_instance",
			func(ctx context.Context, d driver.Driver, id string) error { return d.Reboot(ctx, id, true) }, vmActive, driver.Running)},
		{anyVM, taskPausing}: {"pause", simple("compute_pause_instance",
			func(ctx context.Context, d driver.Driver, id string) error { return d.Pause(ctx, id) }, vmPaused, driver.Paused)},
		{anyVM, taskUnpausing}: {"unpause", simple("compute_unpause_instance",
			func(ctx context.Context, d driver.Driver, id string) error { return d.Unpause(ctx, id) }, vmActive, driver.Running)},
		{anyVM, taskSuspending}: {"suspend", simple("compute_suspend_instance",
			func(ctx context.Context, d driver.Driver, id string) error { return d.Suspend(ctx, id) }, vmSuspended, driver.Suspended)},
		{anyVM, taskResuming}: {"resume", simple("compute_resume_instance",
			func(ctx context.Context, d driver.Driver, id string) error { return d.Resume(ctx, id) }, vmActive, driver.Running)},

		{anyVM, taskShelving}:           {"shelve", (*Service).stepShelve},
		{anyVM, taskShelvingOffloading}: {"shelve-offload", (*Service).stepOffload},
		{anyVM, taskUnshelving}:         {"unshelve", (*Service).stepUnshelve},
		// An unshelve placed the server: its VM is made again.
		{vmShelvedOffloaded, taskSpawning}: {"unshelve-spawn", func(s *Service, ctx context.Context, sv *server, started time.Time) error {
			return s.stepSpawn(ctx, sv, started, "compute_unshelve_instance")
		}},

		{anyVM, taskResizePrep}:      {"resize-prep", (*Service).stepResizePrep},
		{anyVM, taskResizeMigrating}: {"resize", (*Service).stepResize},
		{anyVM, taskResizeFinish}:    {"resize-finish", (*Service).stepResizeFinish},
		{anyVM, taskResizeReverting}: {"resize-revert", (*Service).stepRevert},

		{anyVM, taskRebuilding}:      {"rebuild", (*Service).stepRebuild},
		{anyVM, taskRebuildSpawning}: {"rebuild-spawn", (*Service).stepRebuildSpawn},

		{anyVM, taskImageSnapshot}: {"snapshot", func(s *Service, ctx context.Context, sv *server, started time.Time) error {
			return s.stepSnapshot(ctx, sv, started, taskImageSnapshot)
		}},
		{anyVM, taskImageBackup}: {"backup", func(s *Service, ctx context.Context, sv *server, started time.Time) error {
			return s.stepSnapshot(ctx, sv, started, taskImageBackup)
		}},
	}
}

// stepFor is the step sv's recorded state asks for; ok is false when the
// server rests (or is gone).
func stepFor(sv *server) (st step, ok bool) {
	switch {
	case sv.Deleted:
		return step{}, false
	case len(sv.Doc.VolumeOps) > 0 && sv.TaskState != taskDeleting:
		return volumeOpStep, true
	}
	if st, ok := steps[stepKey{sv.VMState, sv.TaskState}]; ok {
		return st, true
	}
	if st, ok := steps[stepKey{anyVM, sv.TaskState}]; ok {
		return st, true
	}
	if sv.TaskState == taskNone {
		return step{}, false
	}
	return clearStep, true
}

// workDue reports whether sv owes the reconcile loop a step.
func workDue(sv *server) bool {
	_, ok := stepFor(sv)
	return ok
}

// stepBuildStart moves a build made without a task to its first one: a
// placed server spawns, one not placed yet is scheduled.
func (s *Service) stepBuildStart(ctx context.Context, sv *server, _ time.Time) error {
	return s.commit(ctx, sv.ID, taskNone, func(tx *store.Tx, cur *server) error {
		cur.TaskState = taskSpawning
		if cur.Host == "" {
			cur.TaskState = taskScheduling
		}
		return s.saveServer(ctx, tx, cur)
	})
}

// stepBuild brings a placed build's volumes first, then spawns it.
func (s *Service) stepBuild(ctx context.Context, sv *server, started time.Time) error {
	if sv.needsAttach() {
		return s.stepBlockDevices(ctx, sv, started)
	}
	return s.stepSpawn(ctx, sv, started, "compute_build_and_run_instance")
}

func (s *Service) stepResizePrep(ctx context.Context, sv *server, _ time.Time) error {
	return s.commit(ctx, sv.ID, taskResizePrep, func(tx *store.Tx, cur *server) error {
		cur.TaskState = taskResizeMigrating
		return s.saveServer(ctx, tx, cur)
	})
}

func (s *Service) stepResizeFinish(ctx context.Context, sv *server, started time.Time) error {
	return s.commit(ctx, sv.ID, taskResizeFinish, func(tx *store.Tx, cur *server) error {
		cur.VMState, cur.TaskState = vmResized, ""
		return s.finish(ctx, tx, cur, "compute_finish_resize", started, nil)
	})
}

// stepClearTask clears a task state this loop does not drive.
func (s *Service) stepClearTask(ctx context.Context, sv *server, _ time.Time) error {
	s.log.Warn("reconcile: unknown task state cleared", "server", sv.ID, "vm_state", sv.VMState, "task_state", sv.TaskState)
	return s.commit(ctx, sv.ID, sv.TaskState, func(tx *store.Tx, cur *server) error {
		cur.TaskState = ""
		return s.saveServer(ctx, tx, cur)
	})
}
