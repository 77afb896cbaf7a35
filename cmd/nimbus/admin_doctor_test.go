package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"nimbus/internal/store"
	"nimbus/internal/store/storetest"
)

// TestAdminDoctor: on both engines, doctor reports a database in order
// with exit status 0, names a broken invariant with its repair and exits
// non-zero, prints it as JSON too, bounds what it prints, refuses bad
// flags, and never migrates: a database behind this binary is refused and
// left as it was.
func TestAdminDoctor(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, dbURL string) {
		f := newAdminFixture(t, dbURL)
		ctx := context.Background()
		out, err := f.admin(t, "doctor")
		if err != nil || !strings.Contains(out, "no problems found") || !strings.Contains(out, "ok      claims-of-dead-servers") {
			t.Fatalf("doctor on a database in order: %v\n%s", err, out)
		}

		// Three claims whose servers do not exist.
		for _, id := range []string{"ghost-1", "ghost-2", "ghost-3"} {
			if _, err := f.db.Exec(ctx, "INSERT INTO compute_claims (server_id, host, cells, gpus, disk_gb, created_at) VALUES (?, 'hv-1', '[]', '[]', 0, ?)",
				id, store.FormatTime(time.Now())); err != nil {
				t.Fatal(err)
			}
		}
		out, err = f.admin(t, "doctor", "--max", "2")
		if err == nil || err.Error() != "admin doctor: 3 problem(s) found" {
			t.Fatalf("doctor with broken claims: %v", err)
		}
		for _, want := range []string{"BROKEN  claims-of-dead-servers", "claim ghost-1 on host hv-1", "no server ghost-1 exists",
			"mend: release it", "DELETE FROM compute_claims WHERE server_id = 'ghost-1'", "… and 1 more", "3 problem(s) found"} {
			if !strings.Contains(out, want) {
				t.Errorf("doctor output lacks %q:\n%s", want, out)
			}
		}
		var js struct {
			Checks []struct {
				Name     string
				Problems int
				Findings []struct{ Check, Subject, Problem, Repair string }
			}
			Problems int
		}
		out, err = f.admin(t, "doctor", "--json", "--max", "1")
		if err == nil {
			t.Fatal("doctor --json found nothing")
		}
		if err := json.Unmarshal([]byte(out), &js); err != nil {
			t.Fatalf("%v in %s", err, out)
		}
		if js.Problems != 3 || js.Checks[0].Name != "claims-of-dead-servers" || js.Checks[0].Problems != 3 || len(js.Checks[0].Findings) != 1 ||
			js.Checks[0].Findings[0].Repair == "" || len(js.Checks[1].Findings) != 0 {
			t.Errorf("doctor --json: %s", out)
		}

		for _, c := range []struct {
			args []string
			want string
		}{
			{[]string{"doctor", "--billing-hours", "0"}, "--billing-hours must be between 1 and"},
			{[]string{"doctor", "--billing-hours", "100000"}, "--billing-hours must be between 1 and"},
			{[]string{"doctor", "--silent-after", "0s"}, "must be positive"},
			{[]string{"doctor", "--max", "-1"}, "--max must not be negative"},
			{[]string{"doctor", "extra"}, "want no arguments"},
		} {
			if out, err := f.admin(t, c.args...); err == nil || !strings.Contains(err.Error(), c.want) || out != "" {
				t.Errorf("nimbus admin %v: %q %v, want an error containing %q", c.args, out, err, c.want)
			}
		}

		// A database behind this binary: refused, and not migrated.
		if _, err := f.db.Exec(ctx, "DELETE FROM schema_migrations WHERE name = '0065_compute_project_flavors'"); err != nil {
			t.Fatal(err)
		}
		if _, err := f.admin(t, "doctor"); err == nil || !strings.Contains(err.Error(), "lacks migration 0065_compute_project_flavors") {
			t.Errorf("doctor on a database behind: %v", err)
		}
		var n int
		if err := f.db.QueryRow(ctx, "SELECT COUNT(*) FROM schema_migrations WHERE name = '0065_compute_project_flavors'").Scan(&n); err != nil || n != 0 {
			t.Errorf("doctor migrated the database: %d %v", n, err)
		}
	})
	// No database where the data directory says.
	var errOut bytes.Buffer
	t.Setenv("NIMBUS_DATABASE_URL", "")
	if err := runAdmin(context.Background(), []string{"doctor", "--data-dir", t.TempDir()}, io.Discard, &errOut); err == nil ||
		!strings.Contains(err.Error(), "no Nimbus database") {
		t.Errorf("doctor without a database: %v", err)
	}
}
