package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/flavors"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/services"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/images"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"

	"nimbus/internal/agent"
	"nimbus/internal/cloud"
	"nimbus/internal/store"
	"nimbus/internal/testenv"
	regiontest "nimbus/internal/testenv/region"
)

// bootChoice picks what a customer would boot: a Linux image, the smallest
// flavor that holds it, the private network.
func bootChoice(t *testing.T, pc *gophercloud.ProviderClient) (image, flavor, network string) {
	t.Helper()
	ctx := context.Background()
	compute := testenv.Compute(t, pc, "")
	ic, err := openstack.NewImageV2(pc, gophercloud.EndpointOpts{})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := openstack.NewNetworkV2(pc, gophercloud.EndpointOpts{})
	if err != nil {
		t.Fatal(err)
	}
	ip, err := images.List(ic, images.ListOpts{}).AllPages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	imgs, _ := images.ExtractImages(ip)
	var img *images.Image
	for i := range imgs {
		if imgs[i].Properties["os_type"] == "linux" {
			img = &imgs[i]
			break
		}
	}
	if img == nil {
		t.Fatal("no Linux image")
	}
	fp, err := flavors.ListDetail(compute, nil).AllPages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fl, _ := flavors.ExtractFlavors(fp)
	best := -1
	for i, f := range fl {
		if f.Disk >= img.MinDiskGigabytes && f.RAM >= img.MinRAMMegabytes && f.ExtraSpecs == nil &&
			(best < 0 || f.VCPUs*100000+f.RAM < fl[best].VCPUs*100000+fl[best].RAM) {
			best = i
		}
	}
	if best < 0 {
		t.Fatal("no flavor holds the image")
	}
	np, err := networks.List(nc, networks.ListOpts{Name: "private"}).AllPages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	nets, _ := networks.ExtractNetworks(np)
	if len(nets) != 1 {
		t.Fatalf("%d private networks", len(nets))
	}
	return img.ID, fl[best].ID, nets[0].ID
}

func createServer(t *testing.T, compute *gophercloud.ServiceClient, name, image, flavor, network string) string {
	t.Helper()
	s, err := servers.Create(context.Background(), compute, servers.CreateOpts{Name: name, ImageRef: image, FlavorRef: flavor,
		Networks: []servers.Network{{UUID: network}}}, nil).Extract()
	if err != nil {
		t.Fatalf("create %s: %v", name, err)
	}
	return s.ID
}

// serverAttrs reads a server as an admin sees it at microversion 2.16
// (host_status) as raw JSON.
func serverAttrs(t *testing.T, admin *gophercloud.ServiceClient, id string) map[string]any {
	t.Helper()
	var body struct {
		Server map[string]any `json:"server"`
	}
	_, err := admin.Get(context.Background(), admin.ServiceURL("servers", id), &body, nil)
	if err != nil {
		t.Fatalf("get %s: %v", id, err)
	}
	return body.Server
}

// TestUpgradeBeforeFleet: an install made before the fleet existed — its
// servers running, no fleet rows, no agent files — starts with the local
// agent, whose first report tells the controller where every VM is, so
// that work on them reaches their hosts.
func TestUpgradeBeforeFleet(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		c := testenv.StartCloud(t, dbURL)
		pc := testenv.Provider(t, c, cloud.DemoUser)
		compute := testenv.Compute(t, pc, "")
		image, flavor, network := bootChoice(t, pc)
		a := createServer(t, compute, "old-a", image, flavor, network)
		b := createServer(t, compute, "old-b", image, flavor, network)
		waitStatus(t, compute, a, "ACTIVE")
		waitStatus(t, compute, b, "ACTIVE")
		cfg := c.Config
		c.Close()

		// What an older version left: no fleet tables' rows, no agent.
		db, err := openDB(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		for _, table := range []string{"fleet_ops", "fleet_instances", "fleet_hosts", "fleet_agents", "fleet_tokens"} {
			if _, err := db.Exec(ctx, "DELETE FROM "+table); err != nil {
				t.Fatal(err)
			}
		}
		db.Close()
		for _, f := range []string{agent.IdentityFile, agent.JournalFile} {
			os.Remove(filepath.Join(cfg.DataDir, f))
		}

		c2 := testenv.StartCloud(t, dbURL, func(nc *cloud.Config) { nc.DataDir = cfg.DataDir })
		pc = testenv.Provider(t, c2, cloud.DemoUser)
		compute = testenv.Compute(t, pc, "")
		for _, id := range []string{a, b} {
			s, err := servers.Get(ctx, compute, id).Extract()
			if err != nil || s.Status != "ACTIVE" || s.PowerState != servers.RUNNING {
				t.Fatalf("server %s after the upgrade: %+v %v", id, s, err)
			}
		}
		if err := servers.Stop(ctx, compute, a).ExtractErr(); err != nil {
			t.Fatal(err)
		}
		waitStatus(t, compute, a, "SHUTOFF")
		if p, _ := c2.Fake.State(ctx, a); p != 4 {
			t.Fatalf("the VM of the stopped server is in power state %d", p)
		}
		if err := servers.Delete(ctx, compute, b).ExtractErr(); err != nil {
			t.Fatal(err)
		}
		waitGone(t, compute, b)
		if _, err := c2.Fake.State(ctx, b); err == nil {
			t.Fatal("the deleted server's VM is still on its host")
		}
	})
}

// TestRogueAgent: an enrolled agent speaks only for its own hosts and the
// servers compute placed there. Its heartbeat naming a customer's server
// on another agent's host changes neither the server's host nor its power
// state, it cannot read the server's image (no op of its names it), nor
// upload into an image that names the server as its instance; neither can
// the server's own host's agent, for an image no pending snapshot names.
func TestRogueAgent(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		c := testenv.StartCloud(t, dbURL)
		demo := testenv.Provider(t, c, cloud.DemoUser)
		compute := testenv.Compute(t, demo, "")
		admin := testenv.Compute(t, testenv.Provider(t, c, cloud.AdminUser), "2.16")
		image, flavor, network := bootChoice(t, demo)
		id := createServer(t, compute, "victim", image, flavor, network)
		waitStatus(t, compute, id, "ACTIVE")
		host := serverAttrs(t, admin, id)["OS-EXT-SRV-ATTR:host"]

		hc := testenv.HTTPClient(t, c)
		call := func(cred, method, path, body string) (int, string) {
			t.Helper()
			req, err := http.NewRequest(method, c.AgentURL+path, strings.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			if cred != "" {
				req.Header.Set("Authorization", "Bearer "+cred)
			}
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		}
		tok, err := c.Fleet.CreateToken(ctx, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		st, body := call("", "POST", "/v1/agent/enrol", `{"token":"`+tok+`","name":"rogue"}`)
		var enrolled struct{ Credential string }
		if json.Unmarshal([]byte(body), &enrolled); st != http.StatusCreated || enrolled.Credential == "" {
			t.Fatalf("enrol: %d %s", st, body)
		}
		rogue := enrolled.Credential
		if st, body := call(rogue, "PUT", "/v1/agent/hosts", `{"hosts":[{"name":"rogue-host","vcpus":4,"memory_mb":4096,"up":true}]}`); st != http.StatusOK {
			t.Fatalf("hosts: %d %s", st, body)
		}
		for _, h := range []string{"rogue-host", fmt.Sprint(host)} {
			hb := fmt.Sprintf(`{"observed":%d,"hosts":[{"name":"rogue-host","up":true}],"instances":[{"id":%q,"host":%q,"power_state":4}]}`,
				time.Now().UnixNano(), id, h)
			if st, body := call(rogue, "POST", "/v1/agent/heartbeat", hb); st != http.StatusOK {
				t.Fatalf("heartbeat: %d %s", st, body)
			}
		}
		attrs := serverAttrs(t, admin, id)
		if attrs["OS-EXT-SRV-ATTR:host"] != host || attrs["status"] != "ACTIVE" || fmt.Sprint(attrs["OS-EXT-STS:power_state"]) != "1" {
			t.Fatalf("after the rogue's heartbeats: host %v (was %v), status %v, power %v", attrs["OS-EXT-SRV-ATTR:host"], host,
				attrs["status"], attrs["OS-EXT-STS:power_state"])
		}
		var fleetHost string
		if err := c.DB.QueryRow(ctx, "SELECT host FROM fleet_instances WHERE server_id = ?", id).Scan(&fleetHost); err != nil || fleetHost != host {
			t.Fatalf("the fleet has the VM on %q (%v), want %v", fleetHost, err, host)
		}
		// Work on the server still reaches its own host.
		if err := servers.Stop(ctx, compute, id).ExtractErr(); err != nil {
			t.Fatal(err)
		}
		waitStatus(t, compute, id, "SHUTOFF")
		if p, err := c.Fake.State(ctx, id); err != nil || p != 4 {
			t.Fatalf("the VM after stop: %v %v", p, err)
		}

		if st, body := call(rogue, "GET", "/v1/agent/images/"+image, ""); st != http.StatusNotFound {
			t.Errorf("the rogue read the server's image: %d %.80s", st, body)
		}
		ic, err := openstack.NewImageV2(demo, gophercloud.EndpointOpts{})
		if err != nil {
			t.Fatal(err)
		}
		forged, err := images.Create(ctx, ic, images.CreateOpts{Name: "forged", ContainerFormat: "bare", DiskFormat: "qcow2",
			Properties: map[string]string{"instance_uuid": id}}).Extract()
		if err != nil {
			t.Fatal(err)
		}
		local, err := agent.LoadIdentity(c.Config.DataDir)
		if err != nil {
			t.Fatal(err)
		}
		for who, cred := range map[string]string{"the rogue": rogue, "the server's host's agent": local.Credential} {
			if st, body := call(cred, "PUT", "/v1/agent/images/"+forged.ID+"?disk_format=qcow2", "forged data"); st != http.StatusForbidden {
				t.Errorf("%s uploaded into an image no snapshot names: %d %s", who, st, body)
			}
		}
		if got, err := images.Get(ctx, ic, forged.ID).Extract(); err != nil || got.Status != images.ImageStatusQueued {
			t.Errorf("the forged image: %+v %v", got, err)
		}
	})
}

// proc is a nimbus process the test runs.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

func startProc(t *testing.T, name, bin string, env []string, args ...string) *proc {
	t.Helper()
	logFile := filepath.Join(t.TempDir(), name+".log")
	f, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{name: name, cmd: cmd, log: logFile, done: make(chan struct{})}
	go func() { cmd.Wait(); f.Close(); close(p.done) }()
	t.Cleanup(func() { p.stop(t, syscall.SIGKILL) })
	return p
}

// stop sends sig and waits for the process to end.
func (p *proc) stop(t *testing.T, sig syscall.Signal) {
	t.Helper()
	select {
	case <-p.done:
		return
	default:
	}
	p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
		t.Errorf("%s did not stop on %v", p.name, sig)
	}
}

// tail is the end of the process's log, for failure messages.
func (p *proc) tail() string {
	b, _ := os.ReadFile(p.log)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return p.name + ":\n  " + strings.Join(lines[max(0, len(lines)-15):], "\n  ")
}

func freePorts(t *testing.T, n int) []string {
	t.Helper()
	var lns []net.Listener
	var out []string
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		out = append(out, strconv.Itoa(ln.Addr().(*net.TCPAddr).Port))
	}
	for _, ln := range lns {
		ln.Close()
	}
	return out
}

// TestAgentsAsProcesses runs a controller with --no-local-agent and two
// agents as real processes on loopback, with one fake host each. While
// servers are being created, one agent is killed (-9) and restarted and
// the controller is restarted; every server still becomes ACTIVE, spawned
// exactly once. An agent killed for longer than --down-after shows its
// compute service down and its servers' host_status UNKNOWN.
func TestAgentsAsProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	ctx := context.Background()
	dir := t.TempDir()
	bin := filepath.Join(dir, "nimbus")
	build := exec.Command("go", "build", "-o", bin, "nimbus/cmd/nimbus")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}

	ctlDir := filepath.Join(dir, "controller")
	ports := freePorts(t, 8)
	serveArgs := []string{"serve", "--data-dir", ctlDir, "--listen", "127.0.0.1", "--no-local-agent",
		"--identity-port", ports[0], "--compute-port", ports[1], "--image-port", ports[2], "--network-port", ports[3],
		"--billing-port", ports[4], "--agent-port", ports[5], "--console-port", ports[6], "--volume-port", ports[7], "--down-after", "4s",
		"--admin-password", "admin-secret", "--demo-password", "demo-secret", "--log-level", "warn"}
	env := []string{"NIMBUS_DATABASE_URL=", "NIMBUS_DATA_DIR="}
	ctl := startProc(t, "controller", bin, env, serveArgs...)
	c := &cloud.Cloud{IdentityURL: "https://127.0.0.1:" + ports[0] + "/v3", CACertFile: filepath.Join(ctlDir, "ca.pem")}
	healthy := func() bool {
		if _, err := os.Stat(c.CACertFile); err != nil {
			return false
		}
		resp, err := testenv.HTTPClient(t, c).Get("https://127.0.0.1:" + ports[1] + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}
	waitFor(t, 30*time.Second, "controller up", healthy, ctl)

	// Two hosts, each with its own agent enrolled by a one-time token.
	agentDir := map[string]string{}
	agentArgs := map[string][]string{}
	agents := map[string]*proc{}
	for _, h := range []string{"hv-a", "hv-b"} {
		out, err := exec.Command(bin, "admin", "host", "token", "--data-dir", ctlDir).Output()
		if err != nil {
			t.Fatalf("admin host token: %v", err)
		}
		tok := strings.TrimSpace(string(out))
		agentDir[h] = filepath.Join(dir, h)
		os.MkdirAll(agentDir[h], 0o700)
		fleetFile := filepath.Join(agentDir[h], "fleet.json")
		os.WriteFile(fleetFile, []byte(`[{"name":"`+h+`","vcpus":32,"memory_mb":65536,"disk_gb":2000}]`), 0o600)
		agentArgs[h] = []string{"agent", "--controller", "https://127.0.0.1:" + ports[5], "--ca-cert", c.CACertFile,
			"--data-dir", agentDir[h], "--name", h, "--fleet", fleetFile, "--fake-delay", "100ms", "--heartbeat", "250ms"}
		agents[h] = startProc(t, h, bin, append(env, "NIMBUS_AGENT_TOKEN="+tok), agentArgs[h]...)
	}

	admin := testenv.Compute(t, testenv.ProviderAs(t, c, cloud.AdminUser, "admin-secret", cloud.AdminProject), "2.16")
	computeState := func() map[string]string {
		pages, err := services.List(admin, services.ListOpts{Binary: "nova-compute"}).AllPages(ctx)
		if err != nil {
			return nil
		}
		svcs, _ := services.ExtractServices(pages)
		out := map[string]string{}
		for _, s := range svcs {
			out[s.Host] = s.State
		}
		return out
	}
	bothUp := func() bool {
		st := computeState()
		return st["hv-a"] == "up" && st["hv-b"] == "up"
	}
	waitFor(t, 20*time.Second, "both hosts up in os-services", bothUp, ctl, agents["hv-a"], agents["hv-b"])

	demo := testenv.ProviderAs(t, c, cloud.DemoUser, "demo-secret", cloud.DemoProject)
	compute := testenv.Compute(t, demo, "")
	image, flavor, network := bootChoice(t, demo)
	var ids []string
	for i := range 4 {
		ids = append(ids, createServer(t, compute, fmt.Sprintf("e2e-%d", i), image, flavor, network))
	}
	// A spawn takes 300 ms: some are under way on hv-a when its agent dies.
	agents["hv-a"].stop(t, syscall.SIGKILL)
	agents["hv-a"] = startProc(t, "hv-a again", bin, env, agentArgs["hv-a"]...)
	for i := 4; i < 8; i++ {
		ids = append(ids, createServer(t, compute, fmt.Sprintf("e2e-%d", i), image, flavor, network))
	}
	// And the controller restarts while those build.
	ctl.stop(t, syscall.SIGTERM)
	ctl = startProc(t, "controller again", bin, env, serveArgs...)
	waitFor(t, 30*time.Second, "controller back", healthy, ctl)

	for _, id := range ids {
		ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		err := servers.WaitForStatus(ctx, compute, id, "ACTIVE")
		cancel()
		if err != nil {
			s, _ := servers.Get(context.Background(), compute, id).Extract()
			t.Fatalf("server %s not ACTIVE: %v (%+v)\n%s\n%s\n%s", id, err, s, ctl.tail(), agents["hv-a"].tail(), agents["hv-b"].tail())
		}
	}
	if !bothUp() {
		t.Fatalf("os-services: %v", computeState())
	}

	// Each server's VM exists on exactly one host and booted once.
	vms := map[string]map[string]regiontest.JournalVM{}
	for h, d := range agentDir {
		vms[h] = regiontest.FakeJournal(t, filepath.Join(d, "fake-fleet.json"))
	}
	onHost := map[string]string{}
	for _, id := range ids {
		found := 0
		for h, m := range vms {
			if vm, ok := m[id]; ok {
				found++
				onHost[id] = h
				if vm.Boots != 1 || vm.Host != h {
					t.Errorf("server %s on %s: %+v, want one boot", id, h, vm)
				}
			}
		}
		if found != 1 {
			t.Errorf("server %s has a VM on %d hosts", id, found)
		}
		if got := serverAttrs(t, admin, id)["OS-EXT-SRV-ATTR:host"]; got != onHost[id] {
			t.Errorf("server %s: compute says host %v, its VM is on %s", id, got, onHost[id])
		}
	}
	t.Logf("servers per host: hv-a %d, hv-b %d", len(vms["hv-a"]), len(vms["hv-b"]))
	// How often compute asked for each spawn: more than once for those the
	// controller's restart cut short (compute asks again, without an op key
	// yet, and the agent's driver finds the VM there).
	if db, err := store.Open(ctx, filepath.Join(ctlDir, "nimbus.db")); err == nil {
		rows, err := db.Query(ctx, "SELECT state, COUNT(*) FROM fleet_ops WHERE kind = 'spawn' GROUP BY state")
		if err == nil {
			var summary []string
			for rows.Next() {
				var st string
				var n int
				rows.Scan(&st, &n)
				summary = append(summary, fmt.Sprintf("%s %d", st, n))
			}
			rows.Close()
			t.Logf("spawn ops for %d servers: %s", len(ids), strings.Join(summary, ", "))
		}
		db.Close()
	}

	// hv-b's agent dies for good: after --down-after its compute service is
	// down and its servers' host is UNKNOWN, their power state the last known.
	agents["hv-b"].stop(t, syscall.SIGKILL)
	waitFor(t, 20*time.Second, "hv-b down in os-services", func() bool { return computeState()["hv-b"] == "down" }, ctl)
	if st := computeState(); st["hv-a"] != "up" {
		t.Errorf("os-services after hv-b died: %v", st)
	}
	for _, id := range ids {
		s := serverAttrs(t, admin, id)
		want := "UP"
		if onHost[id] == "hv-b" {
			want = "UNKNOWN"
		}
		if s["host_status"] != want || s["status"] != "ACTIVE" || fmt.Sprint(s["OS-EXT-STS:power_state"]) != "1" {
			t.Errorf("server %s on %s: host_status %v (want %s), status %v, power %v", id, onHost[id], s["host_status"], want,
				s["status"], s["OS-EXT-STS:power_state"])
		}
	}
	ctl.stop(t, syscall.SIGTERM)
	agents["hv-a"].stop(t, syscall.SIGTERM)
}

// waitFor polls cond every 100 ms for up to d; on failure it shows the
// processes' logs.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool, procs ...*proc) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			var logs []string
			for _, p := range procs {
				logs = append(logs, p.tail())
			}
			t.Fatalf("%s: not within %s\n%s", what, d, strings.Join(logs, "\n"))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func openDB(ctx context.Context, cfg cloud.Config) (*store.DB, error) {
	return store.Open(ctx, cfg.DatabaseURL)
}
