package compute

import (
	"testing"

	"nimbus/internal/api"
)

// TestAllows: the rule the API applies to an action (checkState) answers
// the panel's question too: which actions a server's state allows now.
func TestAllows(t *testing.T) {
	t.Parallel()
	active := ServerState{VMState: vmActive, Launched: true}
	for _, tc := range []struct {
		name   string
		action string
		st     ServerState
		admin  bool
		want   bool
	}{
		{"stop an active server", "stop", active, false, true},
		{"start an active server", "start", active, false, false},
		{"start a stopped server", "start", ServerState{VMState: vmStopped, Launched: true}, false, true},
		{"stop a server in error", "stop", ServerState{VMState: vmError, Launched: true}, false, true},
		{"reboot soft in error", "reboot", ServerState{VMState: vmError, Launched: true}, false, false},
		{"reboot hard in error", "reboot_hard", ServerState{VMState: vmError, Launched: true}, false, true},
		{"stop while powering off", "stop", ServerState{VMState: vmActive, TaskState: taskPoweringOff, Launched: true}, false, false},
		{"start a never launched server", "start", ServerState{VMState: vmStopped}, false, false},
		{"stop a locked server", "stop", ServerState{VMState: vmActive, Launched: true, Locked: true}, false, false},
		{"an admin stops a locked server", "stop", ServerState{VMState: vmActive, Launched: true, Locked: true}, true, true},
		{"confirm a resize", "confirmResize", ServerState{VMState: vmResized, Launched: true}, false, true},
		{"unshelve an offloaded server", "unshelve", ServerState{VMState: vmShelvedOffloaded, Launched: true}, false, true},
		{"delete while building", "delete", ServerState{VMState: vmBuilding, TaskState: taskSpawning}, false, true},
		{"an action with no rule", "fly", active, true, false},
	} {
		if got := Allows(tc.action, tc.st, tc.admin); got != tc.want {
			t.Errorf("%s: Allows = %v, want %v", tc.name, got, tc.want)
		}
		// The API refuses exactly what Allows does not allow.
		if _, ok := actionRules[tc.action]; ok {
			sv := &server{ID: "s", VMState: tc.st.VMState, TaskState: tc.st.TaskState, Locked: tc.st.Locked}
			if tc.st.Launched {
				sv.LaunchedAt = timePtr(sv.CreatedAt)
			}
			c := &api.Caller{}
			if tc.admin {
				c.Roles = []string{api.RoleAdmin}
			}
			if err := checkState(sv, tc.action, c); (err == nil) != tc.want {
				t.Errorf("%s: checkState = %v, Allows = %v", tc.name, err, tc.want)
			}
		}
	}
}
