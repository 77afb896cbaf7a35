package cloud_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"nimbus/internal/cloud"
	"nimbus/internal/testenv"
)

// TestLaterControllerSecrets: a second controller started on the first's
// database with a data directory of its own never writes passwords the
// accounts do not have. Without the first's secrets.json its generated
// ones never reached the database: it writes none, and its client files
// hold no password; given the first's secrets.json it writes those.
func TestLaterControllerSecrets(t *testing.T) {
	var pg string
	for _, e := range testenv.Engines(t) {
		if e.Name == "postgres" {
			pg = e.URL
		}
	}
	if pg == "" {
		t.Skip("PostgreSQL not available (set NIMBUS_TEST_POSTGRES)")
	}
	generated := func(c *cloud.Config) { c.AdminPassword, c.DemoPassword = "", "" }
	first := testenv.StartCloud(t, pg, generated, func(c *cloud.Config) { c.NoLocalAgent = true })
	ctx := context.Background()
	login := func(c *cloud.Cloud, user, pw, project string) error {
		_, err := c.Identity.Issue(ctx, user, pw, project)
		return err
	}
	if err := login(first, cloud.AdminUser, first.Secrets.AdminPassword, cloud.AdminProject); err != nil {
		t.Fatalf("the first controller's admin password: %v", err)
	}

	later := testenv.StartCloud(t, pg, generated, func(c *cloud.Config) { c.NoLocalAgent = true })
	if s := later.Secrets; s.AdminPassword != "" || s.DemoPassword != "" {
		t.Errorf("a later controller keeps passwords the accounts never took: %+v", s)
	}
	for _, f := range []string{"secrets.json", "clouds.yaml", "admin-openrc.sh", "demo-openrc.sh"} {
		b, err := os.ReadFile(filepath.Join(later.Config.DataDir, f))
		if err != nil {
			t.Fatal(err)
		}
		for _, pw := range []string{first.Secrets.AdminPassword, first.Secrets.DemoPassword} {
			if strings.Contains(string(b), pw) {
				t.Errorf("%s holds the first controller's password it was never given", f)
			}
		}
	}

	withSecrets := testenv.StartCloud(t, pg, generated, func(c *cloud.Config) {
		c.NoLocalAgent = true
		b, err := os.ReadFile(filepath.Join(first.Config.DataDir, "secrets.json"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(c.DataDir, "secrets.json"), b, 0o600); err != nil {
			t.Fatal(err)
		}
	})
	if withSecrets.Secrets != first.Secrets {
		t.Errorf("a controller given the first's secrets.json has %+v, want %+v", withSecrets.Secrets, first.Secrets)
	}
	if err := login(withSecrets, cloud.DemoUser, withSecrets.Secrets.DemoPassword, cloud.DemoProject); err != nil {
		t.Errorf("its demo password: %v", err)
	}
}
