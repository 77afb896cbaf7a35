package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/services"

	"nimbus/internal/cloud"
	"nimbus/internal/testenv"
)

// previousRelease names the commit of the release before this one: the
// upgrade tests build it from git. It moves forward with each release.
const previousRelease = "testdata/previous-release"

// buildRelease builds nimbus at the commit previousRelease names (git
// archive of this repository, built with the module cache the tests
// share), and today's nimbus; it answers both binaries.
func buildRelease(t *testing.T) (old, cur string) {
	t.Helper()
	raw, err := os.ReadFile(previousRelease)
	if err != nil {
		t.Fatal(err)
	}
	commit := strings.TrimSpace(string(raw))
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	// From the top of the repository: git archive of a subdirectory holds
	// only that subdirectory.
	archive := exec.Command("sh", "-c", `cd "$(git rev-parse --show-toplevel)" && git archive --format=tar `+commit+" | tar -x -C "+src)
	if out, err := archive.CombinedOutput(); err != nil {
		t.Fatalf("git archive %s (the upgrade test needs the repository's history): %v\n%s", commit, err, out)
	}
	old, cur = filepath.Join(dir, "nimbus-old"), filepath.Join(dir, "nimbus")
	build := exec.Command("go", "build", "-o", old, "./cmd/nimbus")
	build.Dir = src
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", commit, err, out)
	}
	if out, err := exec.Command("go", "build", "-o", cur, "nimbus/cmd/nimbus").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return old, cur
}

// controllerArgs are the serve flags of a controller on ports of its own
// in dir.
func controllerArgs(dir string, ports []string, extra ...string) []string {
	return append([]string{"serve", "--data-dir", dir, "--listen", "127.0.0.1",
		"--identity-port", ports[0], "--compute-port", ports[1], "--image-port", ports[2], "--network-port", ports[3],
		"--billing-port", ports[4], "--agent-port", ports[5], "--console-port", ports[6], "--volume-port", ports[7],
		"--panel-port", ports[8], "--admin-password", "admin-secret", "--demo-password", "demo-secret", "--log-level", "warn"},
		extra...)
}

// waitHealthy waits for a controller's compute API.
func waitHealthy(t *testing.T, c *cloud.Cloud, computePort string, procs ...*proc) {
	t.Helper()
	waitFor(t, 60*time.Second, "controller up", func() bool {
		if _, err := os.Stat(c.CACertFile); err != nil {
			return false
		}
		resp, err := testenv.HTTPClient(t, c).Get("https://127.0.0.1:" + computePort + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, procs...)
}

// TestUpgradeFromPreviousRelease: a cloud of the previous release with
// servers running (SQLite, the local fake agent), stopped and started
// again by today's binary on the same data directory, keeps every server
// running, every ledger entry and the demo account; the servers answer to
// actions and new ones are made. Then today's controller serves the
// previous release's agent (the order docs/operator.md gives: controllers,
// then agents), which runs a new server.
func TestUpgradeFromPreviousRelease(t *testing.T) {
	if testing.Short() {
		t.Skip("builds two releases")
	}
	ctx := context.Background()
	old, cur := buildRelease(t)
	dir := t.TempDir()
	ctlDir := filepath.Join(dir, "controller")
	ports := freePorts(t, 9)
	env := []string{"NIMBUS_DATABASE_URL=", "NIMBUS_DATA_DIR="}
	c := &cloud.Cloud{IdentityURL: "https://127.0.0.1:" + ports[0] + "/v3", CACertFile: filepath.Join(ctlDir, "ca.pem")}

	before := startProc(t, "previous release", old, env, controllerArgs(ctlDir, ports, "--fake-delay", "100ms")...)
	waitHealthy(t, c, ports[1], before)
	demo := testenv.ProviderAs(t, c, cloud.DemoUser, "demo-secret", cloud.DemoProject)
	compute := testenv.Compute(t, demo, "")
	image, flavor, network := bootChoice(t, demo)
	var ids []string
	for i := range 3 {
		ids = append(ids, createServer(t, compute, fmt.Sprintf("kept-%d", i), image, flavor, network))
	}
	for _, id := range ids {
		waitStatus(t, compute, id, "ACTIVE")
	}
	if err := servers.Stop(ctx, compute, ids[2]).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, compute, ids[2], "SHUTOFF")
	hc := testenv.HTTPClient(t, c)
	billing := "https://127.0.0.1:" + ports[4]
	resp, raw := testenv.Do(t, hc, "GET", billing+"/v1/ledger?limit=1000", demo.Token(), "")
	testenv.MustStatus(t, resp, raw, http.StatusOK)
	ledger := raw
	before.stop(t, syscall.SIGTERM)

	after := startProc(t, "this release", cur, env, controllerArgs(ctlDir, ports, "--fake-delay", "100ms")...)
	waitHealthy(t, c, ports[1], after)
	demo = testenv.ProviderAs(t, c, cloud.DemoUser, "demo-secret", cloud.DemoProject)
	compute = testenv.Compute(t, demo, "")
	for i, id := range ids {
		want := "ACTIVE"
		if i == 2 {
			want = "SHUTOFF"
		}
		s, err := servers.Get(ctx, compute, id).Extract()
		if err != nil || s.Status != want {
			t.Fatalf("server %s after the upgrade: %+v %v; want %s", id, s, err, want)
		}
	}
	resp, raw = testenv.Do(t, hc, "GET", billing+"/v1/ledger?limit=1000", demo.Token(), "")
	testenv.MustStatus(t, resp, raw, http.StatusOK)
	for _, id := range entryIDs(ledger) {
		if !strings.Contains(raw, id) {
			t.Fatalf("ledger entry %s is gone after the upgrade", id)
		}
	}
	if err := servers.Start(ctx, compute, ids[2]).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	waitStatus(t, compute, ids[2], "ACTIVE")
	fresh := createServer(t, compute, "after-upgrade", image, flavor, network)
	waitStatus(t, compute, fresh, "ACTIVE")
	after.stop(t, syscall.SIGTERM)

	// Today's controller without its local agent, and the previous
	// release's agent on a host of its own.
	ctl := startProc(t, "controller", cur, env, controllerArgs(ctlDir, ports, "--no-local-agent", "--down-after", "4s")...)
	waitHealthy(t, c, ports[1], ctl)
	out, err := exec.Command(cur, "admin", "host", "token", "--data-dir", ctlDir).Output()
	if err != nil {
		t.Fatalf("admin host token: %v", err)
	}
	agentDir := filepath.Join(dir, "old-agent")
	os.MkdirAll(agentDir, 0o700)
	fleetFile := filepath.Join(agentDir, "fleet.json")
	os.WriteFile(fleetFile, []byte(`[{"name":"hv-old","vcpus":32,"memory_mb":65536,"disk_gb":2000}]`), 0o600)
	ag := startProc(t, "agent of the previous release", old, append(env, "NIMBUS_AGENT_TOKEN="+strings.TrimSpace(string(out))),
		"agent", "--controller", "https://127.0.0.1:"+ports[5], "--ca-cert", c.CACertFile, "--data-dir", agentDir,
		"--name", "hv-old", "--fleet", fleetFile, "--fake-delay", "100ms", "--heartbeat", "250ms")
	admin := testenv.Compute(t, testenv.ProviderAs(t, c, cloud.AdminUser, "admin-secret", cloud.AdminProject), "2.16")
	waitFor(t, 30*time.Second, "the old agent's host up", func() bool {
		pages, err := services.List(admin, services.ListOpts{Binary: "nova-compute", Host: "hv-old"}).AllPages(ctx)
		if err != nil {
			return false
		}
		svcs, _ := services.ExtractServices(pages)
		return len(svcs) == 1 && svcs[0].State == "up"
	}, ctl, ag)
	compute = testenv.Compute(t, testenv.ProviderAs(t, c, cloud.DemoUser, "demo-secret", cloud.DemoProject), "")
	onOld := createServer(t, compute, "on-the-old-agent", image, flavor, network)
	waitStatus(t, compute, onOld, "ACTIVE")
	if host := serverAttrs(t, admin, onOld)["OS-EXT-SRV-ATTR:host"]; host != "hv-old" {
		t.Fatalf("the new server is on %v, not the old agent's host", host)
	}
}

// entryIDs are the ids of the entries in a ledger page's JSON.
func entryIDs(raw string) []string {
	var ids []string
	for _, part := range strings.Split(raw, `"id":"`)[1:] {
		if i := strings.IndexByte(part, '"'); i > 0 {
			ids = append(ids, part[:i])
		}
	}
	return ids
}
