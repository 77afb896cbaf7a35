package cephtest

import (
	"context"
	"strings"
	"testing"
)

// TestCeph brings up a cluster of its own and checks what tests rely
// on: a healthy cluster, both pools usable by the client, and the
// client kept out of the cluster's administration.
func TestCeph(t *testing.T) {
	c := StartCeph(t)
	ctx := context.Background()
	client := []string{"--conf", c.Conf, "--keyring", c.Keyring, "--id", c.Client}

	out, err := c.run(ctx, "", "ceph", append(c.Admin(), "health")...)
	if err != nil || !strings.HasPrefix(out, "HEALTH_OK") {
		t.Errorf("ceph health = %q, %v; want HEALTH_OK", out, err)
	}
	for _, pool := range []string{VolumesPool, BackupsPool} {
		if _, err := c.run(ctx, "", "rbd", append(client, "create", "--size", "4M", pool+"/probe")...); err != nil {
			t.Errorf("client creates an image in %s: %v", pool, err)
		}
		out, err := c.run(ctx, "", "rbd", append(client, "ls", pool)...)
		if err != nil || strings.TrimSpace(out) != "probe" {
			t.Errorf("rbd ls %s = %q, %v", pool, out, err)
		}
	}
	if _, err := c.run(ctx, "", "ceph", append(client, "osd", "pool", "create", "other")...); err == nil {
		t.Error("the client created a pool; it should have rbd rights only")
	}
	if c.Key == "" || len(c.Monitors) != 1 {
		t.Errorf("Key %q, Monitors %v", c.Key, c.Monitors)
	}
}
