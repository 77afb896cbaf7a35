package compute

import (
	"slices"
	"strings"
	"time"

	"nimbus/internal/api"
)

// Nova's vm_state values (nova/compute/vm_states.py).
const (
	vmActive           = "active"
	vmBuilding         = "building"
	vmPaused           = "paused"
	vmSuspended        = "suspended"
	vmStopped          = "stopped"
	vmRescued          = "rescued"
	vmResized          = "resized"
	vmSoftDeleted      = "soft-delete"
	vmDeleted          = "deleted"
	vmError            = "error"
	vmShelved          = "shelved"
	vmShelvedOffloaded = "shelved_offloaded"
)

// Nova's task_state values used here (nova/compute/task_states.py); "" is null.
const (
	taskNone               = ""
	taskScheduling         = "scheduling"
	taskSpawning           = "spawning"
	taskPoweringOff        = "powering-off"
	taskPoweringOn         = "powering-on"
	taskRebooting          = "rebooting"
	taskRebootingHard      = "rebooting_hard"
	taskPausing            = "pausing"
	taskUnpausing          = "unpausing"
	taskSuspending         = "suspending"
	taskResuming           = "resuming"
	taskShelving           = "shelving"
	taskShelvingOffloading = "shelving_offloading"
	taskUnshelving         = "unshelving"
	taskResizePrep         = "resize_prep"
	taskResizeMigrating    = "resize_migrating"
	taskResizeFinish       = "resize_finish"
	taskResizeReverting    = "resize_reverting"
	taskRebuilding         = "rebuilding"
	taskRebuildSpawning    = "rebuild_spawning"
	taskImageSnapshot      = "image_snapshot"
	taskImageBackup        = "image_backup"
	taskDeleting           = "deleting"
)

// stateMap is nova/api/openstack/common.py _STATE_MAP: vm_state → task_state
// → status, with "default" for any other task state.
var stateMap = map[string]map[string]string{
	vmActive: {
		"default":   "ACTIVE",
		"rebooting": "REBOOT", "reboot_pending": "REBOOT", "reboot_started": "REBOOT",
		"rebooting_hard": "HARD_REBOOT", "reboot_pending_hard": "HARD_REBOOT", "reboot_started_hard": "HARD_REBOOT",
		"updating_password": "PASSWORD",
		"rebuilding":        "REBUILD", "rebuild_block_device_mapping": "REBUILD", "rebuild_spawning": "REBUILD",
		"migrating":   "MIGRATING",
		"resize_prep": "RESIZE", "resize_migrating": "RESIZE", "resize_migrated": "RESIZE", "resize_finish": "RESIZE",
	},
	vmBuilding: {"default": "BUILD"},
	vmStopped: {
		"default":     "SHUTOFF",
		"resize_prep": "RESIZE", "resize_migrating": "RESIZE", "resize_migrated": "RESIZE", "resize_finish": "RESIZE",
		"rebuilding": "REBUILD", "rebuild_block_device_mapping": "REBUILD", "rebuild_spawning": "REBUILD",
	},
	vmResized:          {"default": "VERIFY_RESIZE", "resize_reverting": "REVERT_RESIZE"},
	vmPaused:           {"default": "PAUSED", "migrating": "MIGRATING"},
	vmSuspended:        {"default": "SUSPENDED"},
	vmRescued:          {"default": "RESCUE"},
	vmError:            {"default": "ERROR", "rebuilding": "REBUILD", "rebuild_block_device_mapping": "REBUILD", "rebuild_spawning": "REBUILD"},
	vmDeleted:          {"default": "DELETED"},
	vmSoftDeleted:      {"default": "SOFT_DELETED"},
	vmShelved:          {"default": "SHELVED"},
	vmShelvedOffloaded: {"default": "SHELVED_OFFLOADED"},
}

// statusOf is the API status of a vm_state/task_state pair.
func statusOf(vm, task string) string {
	m, ok := stateMap[vm]
	if !ok {
		return "UNKNOWN"
	}
	if s, ok := m[task]; ok && task != "" {
		return s
	}
	return m["default"]
}

// stateFilter is one (vm_state, task_states) clause of a status filter; nil
// tasks means any task state.
type stateFilter struct {
	vm    string
	tasks []string
}

// statusFilters maps a status back through stateMap, as Nova's
// task_and_vm_state_from_status does; ok is false for an unknown status.
func statusFilters(status string) (out []stateFilter, ok bool) {
	status = strings.ToUpper(status)
	for vm, m := range stateMap {
		var tasks, others []string
		for task, st := range m {
			if task == "default" {
				continue
			}
			if st == status {
				tasks = append(tasks, task)
			} else {
				others = append(others, task)
			}
		}
		if m["default"] == status {
			// Nova's mapping gives the vm_state with any task state for
			// the default status (SHUTOFF = stopped, whatever the task).
			out = append(out, stateFilter{vm: vm})
		} else if len(tasks) > 0 {
			out = append(out, stateFilter{vm: vm, tasks: tasks})
		}
		_ = others
	}
	slices.SortFunc(out, func(a, b stateFilter) int { return strings.Compare(a.vm, b.vm) })
	return out, len(out) > 0
}

// actionRule is what check_instance_state asks of a server for one action
// (nova/compute/api.py): allowed vm_states, allowed task states (nil means
// only null), whether launched_at must be set, and whether a lock blocks it.
type actionRule struct {
	vmStates     []string
	taskStates   []string // nil → task_state must be null; anyTask → any
	anyTask      bool
	mustLaunched bool
	lockChecked  bool
}

var rebootHardTasks = []string{"", "rebooting", "reboot_pending", "reboot_started", "resuming",
	"rebooting_hard", "unpausing", "pausing", "suspending"}

// actionRules is the one table of allowed states per action (api-facts §2.6).
var actionRules = map[string]actionRule{
	"start":              {vmStates: []string{vmStopped}, mustLaunched: true, lockChecked: true},
	"stop":               {vmStates: []string{vmActive, vmError}, mustLaunched: true, lockChecked: true},
	"reboot":             {vmStates: []string{vmActive}, mustLaunched: true, lockChecked: true},
	"reboot_hard":        {vmStates: []string{vmActive, vmStopped, vmPaused, vmSuspended, vmError}, taskStates: rebootHardTasks, mustLaunched: true, lockChecked: true},
	"pause":              {vmStates: []string{vmActive}, mustLaunched: true, lockChecked: true},
	"unpause":            {vmStates: []string{vmPaused}, mustLaunched: true, lockChecked: true},
	"suspend":            {vmStates: []string{vmActive}, mustLaunched: true, lockChecked: true},
	"resume":             {vmStates: []string{vmSuspended}, mustLaunched: true, lockChecked: true},
	"shelve":             {vmStates: []string{vmActive, vmStopped, vmPaused, vmSuspended}, mustLaunched: true, lockChecked: true},
	"shelve_offload":     {vmStates: []string{vmShelved}, mustLaunched: true, lockChecked: true},
	"unshelve":           {vmStates: []string{vmShelved, vmShelvedOffloaded}, mustLaunched: true, lockChecked: true},
	"resize":             {vmStates: []string{vmActive, vmStopped}, mustLaunched: true, lockChecked: true},
	"confirmResize":      {vmStates: []string{vmResized}, mustLaunched: true, lockChecked: false},
	"revertResize":       {vmStates: []string{vmResized}, mustLaunched: true, lockChecked: true},
	"rebuild":            {vmStates: []string{vmActive, vmStopped, vmError}, mustLaunched: true, lockChecked: true},
	"createImage":        {vmStates: []string{vmActive, vmStopped, vmPaused, vmSuspended}, mustLaunched: true, lockChecked: false},
	"createBackup":       {vmStates: []string{vmActive, vmStopped, vmPaused, vmSuspended}, mustLaunched: true, lockChecked: false},
	"update_metadata":    {vmStates: []string{vmActive, vmPaused, vmSuspended, vmStopped}, mustLaunched: true, lockChecked: true},
	"delete_metadata":    {vmStates: []string{vmActive, vmPaused, vmSuspended, vmStopped}, mustLaunched: true, lockChecked: true},
	"lock":               {anyTask: true},
	"unlock":             {anyTask: true},
	"delete":             {anyTask: true, lockChecked: true},
	"get_console_output": {},
	"changePassword":     {vmStates: []string{vmActive}, mustLaunched: true, lockChecked: true},
	"attach_interface":   {vmStates: []string{vmActive, vmPaused, vmStopped}, mustLaunched: true, lockChecked: true},
	"detach_interface":   {vmStates: []string{vmActive, vmPaused, vmStopped}, mustLaunched: true, lockChecked: true},
	"update_tags":        {vmStates: []string{vmActive, vmPaused, vmSuspended, vmStopped, vmShelved, vmShelvedOffloaded}},
	"delete_tags":        {vmStates: []string{vmActive, vmPaused, vmSuspended, vmStopped, vmShelved, vmShelvedOffloaded}},
	// nova/compute/api.py attach_volume, detach_volume, swap_volume.
	"attach_volume": {vmStates: []string{vmActive, vmPaused, vmStopped, vmResized, vmSoftDeleted, vmShelved, vmShelvedOffloaded}, mustLaunched: true, lockChecked: true},
	"detach_volume": {vmStates: []string{vmActive, vmPaused, vmStopped, vmResized, vmSoftDeleted, vmShelved, vmShelvedOffloaded}, mustLaunched: true, lockChecked: true},
	"swap_volume":   {vmStates: []string{vmActive, vmPaused, vmResized}, mustLaunched: true, lockChecked: true},
}

// actionNames are the action names Nova puts in its 409 messages where they
// differ from the rule key (shelve.py, server_metadata.py).
var actionNames = map[string]string{
	"reboot_hard": "reboot", "shelve_offload": "shelveOffload",
	"update_metadata": "update metadata", "delete_metadata": "delete metadata",
	"update_tags": "update tags", "delete_tags": "delete tags",
}

// checkState applies actionRules[action] to a server: 409 with Nova's
// message for a wrong state, "Instance <id> is locked" for a non-admin on a
// locked server (nova/api/openstack/common.py
// raise_http_conflict_for_instance_invalid_state; compute/api.py
// check_instance_lock).
func checkState(sv *server, action string, caller *api.Caller) error {
	st := ServerState{VMState: sv.VMState, TaskState: sv.TaskState, Launched: sv.LaunchedAt != nil, Locked: sv.Locked}
	return st.check(sv.ID, action, caller.IsAdmin())
}

// ServerState is what Nova's state rules read of a server: its vm_state
// and task_state ("" for null), whether it was ever launched, whether it
// is locked.
type ServerState struct {
	VMState, TaskState string
	Launched, Locked   bool
}

// Allows reports whether action (a key of actionRules: "start", "reboot",
// "confirmResize"…) may run on a server in state st for an admin or not:
// the rule the API applies, which the panel asks before it offers a button.
func Allows(action string, st ServerState, admin bool) bool {
	if _, ok := actionRules[action]; !ok {
		return false
	}
	return st.check("", action, admin) == nil
}

// check is checkState on a server's state; id names it in the messages.
func (st ServerState) check(id, action string, admin bool) error {
	rule, ok := actionRules[action]
	if !ok {
		panic("compute: no state rule for " + action)
	}
	name := action
	if n, ok := actionNames[action]; ok {
		name = n
	}
	if rule.lockChecked && st.Locked && !admin {
		return api.Conflict("Instance %s is locked", id)
	}
	if rule.vmStates != nil && !slices.Contains(rule.vmStates, st.VMState) {
		return api.Conflict("Cannot '%s' instance %s while it is in vm_state %s", name, id, st.VMState)
	}
	if !rule.anyTask {
		allowed := rule.taskStates
		if allowed == nil {
			allowed = []string{""}
		}
		if !slices.Contains(allowed, st.TaskState) {
			return api.Conflict("Cannot '%s' instance %s while it is in task_state %s", name, id, nullStr(st.TaskState))
		}
	}
	if rule.mustLaunched && !st.Launched {
		return api.Conflict("Cannot '%s' instance %s while it is in launched_at None", name, id)
	}
	return nil
}

func nullStr(s string) string {
	if s == "" {
		return "None"
	}
	return s
}

// timePtr returns a pointer to t.
func timePtr(t time.Time) *time.Time { return &t }
