package panel

import (
	"reflect"
	"slices"
	"testing"
)

// TestAllowed: the page offers the buttons compute's state rules allow,
// from what the API shows of the server; a reboot when either kind is
// allowed (an ERROR server takes a hard one).
func TestAllowed(t *testing.T) {
	t.Parallel()
	at := "2026-11-29T06:00:00.000000"
	task := "powering-off"
	for _, tc := range []struct {
		name string
		s    apiServer
		want []string
	}{
		{"active", apiServer{VMState: "active", Launched: &at}, []string{"delete", "reboot", "rebuild", "resize", "shelve", "stop"}},
		{"stopped", apiServer{VMState: "stopped", Launched: &at}, []string{"delete", "reboot", "rebuild", "resize", "shelve", "start"}},
		{"error", apiServer{VMState: "error", Launched: &at}, []string{"delete", "reboot", "rebuild", "stop"}},
		{"powering off", apiServer{VMState: "active", Task: &task, Launched: &at}, []string{"delete"}},
		{"resized", apiServer{VMState: "resized", Launched: &at}, []string{"confirm-resize", "delete", "revert-resize"}},
		{"offloaded", apiServer{VMState: "shelved_offloaded", Launched: &at}, []string{"delete", "unshelve"}},
		{"locked", apiServer{VMState: "active", Launched: &at, Locked: true}, nil},
		{"building", apiServer{VMState: "building"}, []string{"delete"}},
	} {
		var got []string
		for action, ok := range allowed(&tc.s) {
			if ok {
				got = append(got, action)
			}
		}
		slices.Sort(got)
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}
