package compute_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"nimbus/internal/cloud"
	"nimbus/internal/compute"
	"nimbus/internal/store"
	"nimbus/internal/testenv"
)

// TestPlacementBusy: on PostgreSQL, a create that waits for its project's
// quota lock (held here by the test's transaction, in a region by the
// project's other creates) longer than the placement's budget answers 503 in Nova's
// shape with Retry-After 1, at the budget and not after, and writes
// nothing; once the lock is free the same create is accepted.
func TestPlacementBusy(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		if !strings.HasPrefix(dbURL, "postgres") {
			t.Skip("SQLite's writers queue in the store; there is no lock to wait for")
		}
		e := newEnv(t, dbURL)
		compute.SetPlaceBudget(t, 500*time.Millisecond)
		ctx := context.Background()
		project, err := e.c.Identity.ProjectByName(ctx, cloud.DemoProject)
		if err != nil {
			t.Fatal(err)
		}
		held, release, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
		go func() {
			done <- e.c.DB.Tx(ctx, func(tx *store.Tx) error {
				if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(?, hashtext(?))", compute.QuotaLock, project.ID); err != nil {
					return err
				}
				close(held)
				<-release
				return nil
			})
		}()
		<-held
		body := `{"server":{"name":"busy","imageRef":"` + e.imageID + `","flavorRef":"` + e.flavorID + `","networks":"auto"}}`
		start := time.Now()
		resp, raw := testenv.Do(t, e.client, "POST", e.c.ComputeURL+"/servers", e.demo, body,
			"OpenStack-API-Version", "compute 2.96")
		took := time.Since(start)
		close(release)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "1" ||
			!strings.Contains(raw, `"serviceUnavailable"`) || !strings.Contains(raw, "busy") {
			t.Fatalf("create behind a held quota lock: %d Retry-After %q %s", resp.StatusCode, resp.Header.Get("Retry-After"), raw)
		}
		if took > 5*time.Second {
			t.Errorf("answered after %s for a budget of 500 ms", took)
		}
		if list := e.must(200, "GET", "/servers?name=busy", e.demo, "", ""); len(list["servers"].([]any)) != 0 {
			t.Fatalf("a refused create left servers: %v", list)
		}
		e.must(202, "POST", "/servers", e.demo, "2.96", body)
	})
}
