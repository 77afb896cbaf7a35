package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"

	"nimbus/internal/cloud"
	"nimbus/internal/testenv"
	regiontest "nimbus/internal/testenv/region"
)

// cutOff is how long TestAgentCutOff keeps the agent from the controller.
const cutOff = 2 * time.Minute

// TestAgentCutOff: an agent in its own network namespace, reaching the
// controller over a veth pair, is cut off for two minutes by an nftables
// drop while its process runs on. Meanwhile its servers show host_status
// UNKNOWN, a stop asked of one waits, a delete of another is done at once
// as Nova's local delete on a down host, and the API answers every request
// at once. Once the path is back everything converges by itself: the host
// up, the stop done, the deleted server's VM destroyed by the orphan
// sweep, exactly the VMs of live servers on the host.
func TestAgentCutOff(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary, and waits two minutes")
	}
	requireNetns(t)
	if _, err := exec.LookPath("nft"); err != nil {
		if os.Getenv("NIMBUS_REQUIRE_NETNS") == "1" {
			t.Fatal("nft is required (NIMBUS_REQUIRE_NETNS=1)")
		}
		t.Skip("no nft")
	}
	ctx := context.Background()
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	suffix := fmt.Sprint(os.Getpid() % 100000)
	ns, vh, va := "cut"+suffix, "cuth"+suffix, "cuta"+suffix
	const hostIP, agentIP = "10.251.7.1", "10.251.7.2"
	run("ip", "netns", "add", ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	run("ip", "link", "add", vh, "type", "veth", "peer", "name", va, "netns", ns)
	t.Cleanup(func() { exec.Command("ip", "link", "del", vh).Run() })
	run("ip", "addr", "add", hostIP+"/30", "dev", vh)
	run("ip", "link", "set", vh, "up")
	inNS := func(args ...string) []string { return append([]string{"ip", "netns", "exec", ns}, args...) }
	run(inNS("ip", "addr", "add", agentIP+"/30", "dev", va)...)
	run(inNS("ip", "link", "set", va, "up")...)
	run(inNS("ip", "link", "set", "lo", "up")...)

	// The controller listens everywhere; its certificate names the veth's
	// address, made before its first start.
	bin := buildNimbus(t)
	dir := t.TempDir()
	ctlDir := filepath.Join(dir, "controller")
	ports := freePorts(t, 9)
	env := []string{"NIMBUS_DATABASE_URL=", "NIMBUS_DATA_DIR="}
	ctl := startProc(t, "controller", bin, env, "serve", "--data-dir", ctlDir, "--no-local-agent",
		"--identity-port", ports[0], "--compute-port", ports[1], "--image-port", ports[2], "--network-port", ports[3],
		"--billing-port", ports[4], "--agent-port", ports[5], "--console-port", ports[6], "--volume-port", ports[7],
		"--panel-port", ports[8], "--down-after", "4s",
		"--admin-password", regionAdminPassword, "--demo-password", regionDemoPassword, "--log-level", "info")
	c := &cloud.Cloud{IdentityURL: "https://127.0.0.1:" + ports[0] + "/v3", CACertFile: filepath.Join(ctlDir, "ca.pem")}
	waitFor(t, 60*time.Second, "controller up", func() bool {
		if _, err := os.Stat(c.CACertFile); err != nil {
			return false
		}
		resp, err := testenv.HTTPClient(t, c).Get("https://127.0.0.1:" + ports[1] + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, ctl)

	out, err := exec.Command(bin, "admin", "host", "token", "--data-dir", ctlDir).Output()
	if err != nil {
		t.Fatalf("admin host token: %v", err)
	}
	agentDir := filepath.Join(dir, "agent")
	os.MkdirAll(agentDir, 0o700)
	fleetFile := filepath.Join(agentDir, "fleet.json")
	os.WriteFile(fleetFile, []byte(`[{"name":"hv-cut","vcpus":32,"memory_mb":65536,"disk_gb":2000}]`), 0o600)
	agent := startProc(t, "agent", "ip", append(env, "NIMBUS_AGENT_TOKEN="+strings.TrimSpace(string(out))),
		inNS(bin, "agent", "--controller", "https://"+hostIP+":"+ports[5], "--ca-cert", c.CACertFile,
			"--data-dir", agentDir, "--name", "hv-cut", "--fleet", fleetFile, "--fake-delay", "100ms", "--heartbeat", "250ms")[1:]...)

	admin := testenv.Compute(t, testenv.ProviderAs(t, c, cloud.AdminUser, regionAdminPassword, cloud.AdminProject), "2.16")
	hostState := func() string {
		var body struct {
			Services []struct{ Binary, Host, State string } `json:"services"`
		}
		if _, err := admin.Get(ctx, admin.ServiceURL("os-services"), &body, nil); err != nil {
			return ""
		}
		for _, s := range body.Services {
			if s.Binary == "nova-compute" && s.Host == "hv-cut" {
				return s.State
			}
		}
		return ""
	}
	waitFor(t, 30*time.Second, "hv-cut up", func() bool { return hostState() == "up" }, ctl, agent)

	demo := testenv.ProviderAs(t, c, cloud.DemoUser, regionDemoPassword, cloud.DemoProject)
	compute := testenv.Compute(t, demo, "")
	image, flavor, network := bootChoice(t, demo)
	stopped, deleted := createServer(t, compute, "cut-stop", image, flavor, network), createServer(t, compute, "cut-delete", image, flavor, network)
	for _, id := range []string{stopped, deleted} {
		waitFor(t, 60*time.Second, "server ACTIVE", func() bool { return serverAttrs(t, admin, id)["status"] == "ACTIVE" }, ctl, agent)
	}

	// The cut: the namespace drops everything, both ways.
	run(inNS("nft", "add", "table", "inet", "cut")...)
	for _, hook := range []string{"input", "output"} {
		run(inNS("nft", "add", "chain", "inet", "cut", hook, "{ type filter hook "+hook+" priority 0 ; policy drop ; }")...)
	}
	cutAt := time.Now()
	waitFor(t, 30*time.Second, "host_status UNKNOWN", func() bool {
		return serverAttrs(t, admin, stopped)["host_status"] == "UNKNOWN" && serverAttrs(t, admin, deleted)["host_status"] == "UNKNOWN"
	}, ctl, agent)
	unknownAfter := time.Since(cutAt)
	if err := servers.Stop(ctx, compute, stopped).ExtractErr(); err != nil {
		t.Fatalf("stop during the cut: %v", err)
	}
	if err := servers.Delete(ctx, compute, deleted).ExtractErr(); err != nil {
		t.Fatalf("delete during the cut: %v", err)
	}

	waitFor(t, 15*time.Second, "the local delete", func() bool {
		return gophercloud.ResponseCodeIs(servers.Get(ctx, compute, deleted).Err, http.StatusNotFound)
	}, ctl, agent)

	// Meanwhile: every request answered at once, the stop waiting.
	var looks, slow int
	worst := time.Duration(0)
	for time.Since(cutAt) < cutOff {
		start := time.Now()
		s := serverAttrs(t, admin, stopped)
		gone := gophercloud.ResponseCodeIs(servers.Get(ctx, compute, deleted).Err, http.StatusNotFound)
		d := time.Since(start) / 2
		looks += 2
		worst = max(worst, d)
		if d > 2*time.Second {
			slow++
		}
		if s["host_status"] != "UNKNOWN" || s["OS-EXT-STS:task_state"] != "powering-off" || s["status"] != "ACTIVE" {
			t.Errorf("the stopped server during the cut: %v/%v, host_status %v; want ACTIVE/powering-off (waiting for its host), UNKNOWN",
				s["status"], s["OS-EXT-STS:task_state"], s["host_status"])
		}
		if !gone {
			t.Errorf("the deleted server during the cut: still there, want 404 (a local delete)")
		}
		if t.Failed() {
			t.FailNow()
		}
		time.Sleep(5 * time.Second)
	}
	if slow > 0 {
		t.Errorf("%d of %d looks during the cut took over 2 s (worst %s)", slow, looks, worst)
	}

	// The path back: everything converges by itself.
	run(inNS("nft", "delete", "table", "inet", "cut")...)
	backAt := time.Now()
	waitFor(t, 60*time.Second, "hv-cut up again", func() bool { return hostState() == "up" }, ctl, agent)
	upAfter := time.Since(backAt)
	waitFor(t, 60*time.Second, "the stop done", func() bool {
		s := serverAttrs(t, admin, stopped)
		return s["status"] == "SHUTOFF" && s["OS-EXT-STS:task_state"] == nil && s["host_status"] == "UP"
	}, ctl, agent)
	waitFor(t, 90*time.Second, "the deleted server's VM destroyed", func() bool {
		vms := regiontest.FakeJournal(t, filepath.Join(agentDir, "fake-fleet.json"))
		_, ok := vms[stopped]
		return len(vms) == 1 && ok
	}, ctl, agent)
	convergedAfter := time.Since(backAt)
	t.Logf("cut off %s: host_status UNKNOWN after %s; %d looks, worst %s, %d over 2 s; after the path came back: host up in %s, work converged in %s",
		cutOff, unknownAfter.Round(100*time.Millisecond), looks, worst.Round(time.Millisecond), slow, upAfter.Round(100*time.Millisecond), convergedAfter.Round(100*time.Millisecond))
}
