package compute_test

import (
	"testing"

	"nimbus/internal/testenv"
)

// TestRevertRestoresDisk: a resize that grows the disk keeps the old one
// (Nova's <instance>_resize), so a revert brings the server back ACTIVE
// with its old flavor and its old disk; a confirmed resize keeps the new
// disk.
func TestRevertRestoresDisk(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		id := e.create(e.demo, "2.96", "") // m1.small: 20 GB
		e.wait(id, e.demo, "ACTIVE")
		disk := func() int {
			t.Helper()
			spec, ok := e.c.Fake.Spec(id)
			if !ok {
				t.Fatalf("the fake driver has no server %s", id)
			}
			return spec.DiskGB
		}
		if got := disk(); got != 20 {
			t.Fatalf("disk before the resize: %d GB", got)
		}
		for _, step := range []struct {
			finish, status string
			flavor         string
			disk           int
		}{
			{`{"revertResize":null}`, "ACTIVE", "m1.small", 20},
			{`{"confirmResize":null}`, "ACTIVE", "m1.medium", 40},
		} {
			e.action(id, e.demo, "2.96", `{"resize":{"flavorRef":"3"}}`, 202) // m1.medium: 40 GB
			e.wait(id, e.demo, "VERIFY_RESIZE")
			if got := disk(); got != 40 {
				t.Fatalf("disk after the resize: %d GB", got)
			}
			want := 202
			if step.finish == `{"confirmResize":null}` {
				want = 204
			}
			e.action(id, e.demo, "2.96", step.finish, want)
			s := e.wait(id, e.demo, step.status)
			if f := s["flavor"].(map[string]any)["original_name"]; f != step.flavor {
				t.Errorf("after %s: flavor %v, want %s", step.finish, f, step.flavor)
			}
			if got := disk(); got != step.disk {
				t.Errorf("after %s: disk %d GB, want %d", step.finish, got, step.disk)
			}
		}
	})
}
