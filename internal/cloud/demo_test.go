package cloud_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"nimbus/internal/cloud"
	"nimbus/internal/store"
	"nimbus/internal/testenv"
)

// TestDemoOnce: the demo customer is made on the first start only. One the
// operator deleted stays deleted across restarts (it was made again at
// every start), and clouds.yaml stops offering it; --no-demo makes none.
func TestDemoOnce(t *testing.T) {
	ctx := context.Background()
	c := testenv.StartCloud(t, "")
	hc := testenv.HTTPClient(t, c)
	admin := testenv.Token(t, c, cloud.AdminUser)
	p, err := c.Identity.ProjectByName(ctx, cloud.DemoProject)
	if err != nil || !c.HasDemo {
		t.Fatalf("no demo project on the first start: %v", err)
	}
	u, err := c.Identity.UserByName(ctx, cloud.DemoUser)
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/users/" + u.ID, "/projects/" + p.ID} {
		resp, raw := testenv.Do(t, hc, "DELETE", c.IdentityURL+path, admin, "")
		testenv.MustStatus(t, resp, raw, http.StatusNoContent)
	}
	cfg := c.Config
	c.Close()

	c2 := testenv.StartCloud(t, "", func(nc *cloud.Config) { nc.DataDir = cfg.DataDir })
	if _, err := c2.Identity.ProjectByName(ctx, cloud.DemoProject); !errors.Is(err, store.ErrNotFound) || c2.HasDemo {
		t.Fatalf("the deleted demo project came back: %v", err)
	}
	noDemoFiles(t, c2)

	c3 := testenv.StartCloud(t, "", func(nc *cloud.Config) { nc.NoDemo = true })
	if _, err := c3.Identity.ProjectByName(ctx, cloud.DemoProject); !errors.Is(err, store.ErrNotFound) || c3.HasDemo {
		t.Fatalf("--no-demo made a demo project: %v", err)
	}
	noDemoFiles(t, c3)
}

// noDemoFiles checks that the client files offer no demo customer.
func noDemoFiles(t *testing.T, c *cloud.Cloud) {
	t.Helper()
	y, err := os.ReadFile(c.CloudsFile)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(y), "nimbus-demo") || !strings.Contains(string(y), "nimbus-admin") {
		t.Fatalf("clouds.yaml:\n%s", y)
	}
	if _, err := os.Stat(filepath.Join(c.Config.DataDir, "demo-openrc.sh")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("demo-openrc.sh: %v", err)
	}
}
