package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"

	"nimbus/internal/cloud"
	"nimbus/internal/driver"
	"nimbus/internal/driver/fake"
	"nimbus/internal/store"
	"nimbus/internal/store/storetest"
	"nimbus/internal/testenv"
	regiontest "nimbus/internal/testenv/region"
)

// region is three controllers on one PostgreSQL database, each with its
// own data directory and ports but one CA, and one agent with two fake
// hosts that reaches them through one controller's agent API.
type region struct {
	t      *testing.T
	bin    string
	dbURL  string
	dirs   []string
	ports  [][]string
	ctls   []*proc
	agent  *proc
	agentD string
	client *http.Client
	// providers are the signed-in clients, by controller and user: one
	// each, so that polling does not open a connection per look.
	providers map[string]*gophercloud.ProviderClient
}

const (
	regionAdminPassword = "admin-secret"
	regionDemoPassword  = "demo-secret"
)

func buildNimbus(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "nimbus")
	if out, err := exec.Command("go", "build", "-o", bin, "nimbus/cmd/nimbus").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// regionDB is a fresh PostgreSQL database: the region's tests need one,
// and fail without one when NIMBUS_REQUIRE_POSTGRES=1.
func regionDB(t *testing.T) string {
	t.Helper()
	url, err := storetest.FreshPostgres(t)
	if err != nil {
		if os.Getenv("NIMBUS_REQUIRE_POSTGRES") == "1" {
			t.Fatalf("PostgreSQL is required: %v", err)
		}
		t.Skipf("no PostgreSQL: %v", err)
	}
	return url
}

// startRegion starts n controllers (the first alone, so that it makes
// the accounts and the CA the others share) and an agent with two fake
// hosts and a fake delay of fakeDelay connected to controller agentVia.
func startRegion(t *testing.T, n, agentVia int, fakeDelay string) *region {
	t.Helper()
	return startRegionHosts(t, n, agentVia, fakeDelay, 2)
}

// startRegionHosts is startRegion with hosts fake hosts (hv-a, hv-b, then
// hv-2, hv-3, …), each of two NUMA nodes of 17 pCPUs.
func startRegionHosts(t *testing.T, n, agentVia int, fakeDelay string, hostCount int) *region {
	t.Helper()
	r := &region{t: t, bin: buildNimbus(t), dbURL: regionDB(t), providers: map[string]*gophercloud.ProviderClient{}}
	base := t.TempDir()
	for i := range n {
		r.dirs = append(r.dirs, filepath.Join(base, fmt.Sprint("ctl", i)))
		r.ports = append(r.ports, freePorts(t, 9))
	}
	r.ctls = make([]*proc, n)
	r.startController(0)
	for i := 1; i < n; i++ {
		os.MkdirAll(r.dirs[i], 0o700)
		for _, f := range []string{"ca.pem", "ca-key.pem"} {
			b, err := os.ReadFile(filepath.Join(r.dirs[0], f))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(r.dirs[i], f), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		r.startController(i)
	}

	out, err := exec.Command(r.bin, "admin", "host", "token", "--data-dir", r.dirs[0], "--database-url", r.dbURL).Output()
	if err != nil {
		t.Fatalf("admin host token: %v", err)
	}
	r.agentD = filepath.Join(base, "agent")
	os.MkdirAll(r.agentD, 0o700)
	var hosts []driver.Host
	names := []string{"hv-a", "hv-b"}
	for i := 2; i < hostCount; i++ {
		names = append(names, fmt.Sprint("hv-", i))
	}
	for _, name := range names[:hostCount] {
		h := driver.Host{Name: name, IP: "192.0.2.50", MemoryMB: 256 * 1024, DiskGB: 4000, Zone: "nova",
			Hypervisor: "fake", Version: 1000, Up: true}
		fake.Topology(&h, 2, 17, 1)
		hosts = append(hosts, h)
	}
	fleet, _ := json.Marshal(hosts)
	fleetFile := filepath.Join(r.agentD, "fleet.json")
	os.WriteFile(fleetFile, fleet, 0o600)
	r.agent = startProc(t, "agent", r.bin, []string{"NIMBUS_DATABASE_URL=", "NIMBUS_AGENT_TOKEN=" + strings.TrimSpace(string(out))},
		"agent", "--controller", "https://127.0.0.1:"+r.ports[agentVia][5], "--ca-cert", filepath.Join(r.dirs[0], "ca.pem"),
		"--data-dir", r.agentD, "--name", "agent", "--fleet", fleetFile, "--fake-delay", fakeDelay, "--heartbeat", "500ms")
	r.client = testenv.HTTPClient(t, r.cloud(0))
	for i := range r.ctls {
		waitFor(t, 60*time.Second, fmt.Sprint("the agent's hosts in controller ", i, "'s os-services"), func() bool {
			return r.hostsUp(i) == hostCount
		}, r.ctls[i], r.agent)
	}
	return r
}

func (r *region) startController(i int) {
	p := r.ports[i]
	args := []string{"serve", "--data-dir", r.dirs[i], "--database-url", r.dbURL, "--listen", "127.0.0.1", "--no-local-agent",
		"--identity-port", p[0], "--compute-port", p[1], "--image-port", p[2], "--network-port", p[3],
		"--billing-port", p[4], "--agent-port", p[5], "--console-port", p[6], "--volume-port", p[7], "--panel-port", p[8],
		"--admin-password", regionAdminPassword, "--demo-password", regionDemoPassword, "--log-level", "info"}
	r.ctls[i] = startProc(r.t, fmt.Sprint("controller ", i), r.bin, []string{"NIMBUS_DATABASE_URL=", "NIMBUS_DATA_DIR="}, args...)
	c := r.cloud(i)
	waitFor(r.t, 60*time.Second, fmt.Sprint("controller ", i, " up"), func() bool {
		if _, err := os.Stat(c.CACertFile); err != nil {
			return false
		}
		resp, err := testenv.HTTPClient(r.t, c).Get("https://127.0.0.1:" + p[1] + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, r.ctls[i])
}

// cloud is what the test's clients need of controller i.
func (r *region) cloud(i int) *cloud.Cloud {
	return &cloud.Cloud{IdentityURL: "https://127.0.0.1:" + r.ports[i][0] + "/v3", CACertFile: filepath.Join(r.dirs[0], "ca.pem")}
}

// hostsUp counts the compute services up as controller i sees them.
func (r *region) hostsUp(i int) int {
	admin := r.compute(i, cloud.AdminUser, "2.16")
	var body struct {
		Services []struct{ Binary, State string } `json:"services"`
	}
	if _, err := admin.Get(context.Background(), admin.ServiceURL("os-services"), &body, nil); err != nil {
		return 0
	}
	n := 0
	for _, s := range body.Services {
		if s.Binary == "nova-compute" && s.State == "up" {
			n++
		}
	}
	return n
}

func (r *region) compute(i int, user, microversion string) *gophercloud.ServiceClient {
	return testenv.Compute(r.t, r.provider(i, user), microversion)
}

// provider is user signed in through controller i.
func (r *region) provider(i int, user string) *gophercloud.ProviderClient {
	k := fmt.Sprint(i, "/", user)
	if pc := r.providers[k]; pc != nil {
		return pc
	}
	pw, project := regionDemoPassword, cloud.DemoProject
	if user == cloud.AdminUser {
		pw, project = regionAdminPassword, cloud.AdminProject
	}
	r.providers[k] = testenv.ProviderAs(r.t, r.cloud(i), user, pw, project)
	return r.providers[k]
}

// credit tops the demo project up through controller i's billing API, as
// the operator does (the service is prepaid).
func (r *region) credit(i int, amount int64) {
	r.t.Helper()
	admin := r.provider(i, cloud.AdminUser)
	project := r.demoProject()
	body := fmt.Sprintf(`{"topup": {"amount": %d, "reference": "region test"}}`, amount)
	req, _ := http.NewRequest("POST", "https://127.0.0.1:"+r.ports[i][4]+"/v1/accounts/"+project+"/topups", strings.NewReader(body))
	req.Header.Set("X-Auth-Token", admin.Token())
	req.Header.Set("Content-Type", "application/json")
	resp, err := r.client.Do(req)
	if err != nil {
		r.t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		b, _ := io.ReadAll(resp.Body)
		r.t.Fatalf("credit: %d %s", resp.StatusCode, b)
	}
}

// demoProject is the demo project's id.
func (r *region) demoProject() string {
	r.t.Helper()
	db, err := store.Open(context.Background(), r.dbURL)
	if err != nil {
		r.t.Fatal(err)
	}
	defer db.Close()
	var project string
	if err := db.QueryRow(context.Background(), "SELECT id FROM projects WHERE name = ?", cloud.DemoProject).Scan(&project); err != nil {
		r.t.Fatal(err)
	}
	return project
}

// quota sets the demo project's instance and core quotas through
// controller i, as the operator does.
func (r *region) quota(i, instances, cores int) {
	r.t.Helper()
	admin := r.compute(i, cloud.AdminUser, "")
	body := map[string]any{"quota_set": map[string]any{"instances": instances, "cores": cores, "ram": cores * 4096}}
	if _, err := admin.Put(context.Background(), admin.ServiceURL("os-quota-sets", r.demoProject()), body, nil,
		&gophercloud.RequestOpts{OkCodes: []int{200}}); err != nil {
		r.t.Fatalf("quota: %v", err)
	}
}

func (r *region) logs() string {
	var out []string
	for _, p := range append(slices.Clone(r.ctls), r.agent) {
		out = append(out, p.tail())
	}
	return strings.Join(out, "\n")
}

// TestControllerKilledMidBuild: 20 servers made in one request through
// one of three controllers, which is killed (-9) a second later while
// their spawns (9 s each on the fake hosts) are under way. Every server
// ends ACTIVE through the survivors within takeoverBound of the kill:
// the dead controller's leases expire (lease.DefaultTTL, 15 s) and a
// survivor's look for owed work (every 5 s) takes them; the spawns
// already sent to the agent are found again by their op keys, not made
// twice. Afterwards: exactly one VM per server, each booted once; every
// claim belongs to a live server; no pCPU is held by two VMs. Then the
// same for their deletes, through a second controller killed mid-way:
// each server shows task_state deleting until the last controller has
// finished, and answers 404 only with its ports and claims released.
func TestControllerKilledMidBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	const takeoverBound = 40 * time.Second
	ctx := context.Background()
	r := startRegion(t, 3, 2, "3s")
	r.credit(1, 10_000_000)
	r.quota(2, 100, 400)
	demo := r.compute(0, cloud.DemoUser, "")
	image, _, network := bootChoice(t, r.provider(0, cloud.DemoUser))
	flavor := "d2.4g.local" // two dedicated vCPUs: pinned pCPUs that a double claim would show

	res := servers.Create(ctx, demo, servers.CreateOpts{Name: "takeover", ImageRef: image, FlavorRef: flavor,
		Networks: []servers.Network{{UUID: network}}, Min: 20, Max: 20}, nil)
	if res.Err != nil {
		t.Fatalf("create: %v", res.Err)
	}
	time.Sleep(time.Second)
	r.ctls[0].stop(t, syscall.SIGKILL)
	killed := time.Now()

	survivor := r.compute(1, cloud.DemoUser, "")
	var ids []string
	activeAt := map[string]time.Duration{}
	deadline := killed.Add(takeoverBound + 20*time.Second)
	for len(ids) == 0 || len(activeAt) < len(ids) {
		if time.Now().After(deadline) {
			break
		}
		pages, err := servers.List(survivor, servers.ListOpts{Name: "takeover"}).AllPages(ctx)
		if err == nil {
			all, _ := servers.ExtractServers(pages)
			ids = ids[:0]
			for _, s := range all {
				ids = append(ids, s.ID)
				if _, seen := activeAt[s.ID]; !seen && s.Status == "ACTIVE" {
					activeAt[s.ID] = time.Since(killed)
				}
				if s.Status == "ERROR" {
					t.Fatalf("server %s in ERROR: %+v", s.ID, s.Fault)
				}
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
	if len(ids) != 20 || len(activeAt) != 20 {
		t.Fatalf("%d servers, %d ACTIVE %s after the kill\n%s", len(ids), len(activeAt), time.Since(killed).Round(time.Second), r.logs())
	}
	var last time.Duration
	for _, d := range activeAt {
		last = max(last, d)
	}
	t.Logf("all 20 ACTIVE %.1f s after the kill (bound %s)", last.Seconds(), takeoverBound)
	if last > takeoverBound {
		t.Errorf("the last server took %s after the kill, over %s", last.Round(100*time.Millisecond), takeoverBound)
	}

	// One VM per server, booted once, its pCPUs its own.
	vms := regiontest.FakeJournal(t, filepath.Join(r.agentD, "fake-fleet.json"))
	active := map[string]bool{}
	for _, id := range ids {
		active[id] = true
	}
	regiontest.CheckVMs(t, vms, active)
	pinned := 0
	for _, vm := range vms {
		for _, c := range vm.Spec.Cells {
			pinned += len(c.CPUs)
		}
	}
	if len(vms) != 20 || pinned != 40 {
		t.Errorf("%d VMs on the fake fleet pinning %d pCPUs, for 20 servers of 2", len(vms), pinned)
	}
	regiontest.CheckClaims(t, r.dbURL, 20, 40)

	// Their deletes, accepted by another controller killed half a second
	// later (a VM's destroy takes 3 s): each server shows its task
	// deleting until the last survivor has released what it held, and
	// answers 404 only then.
	deleter := r.compute(1, cloud.DemoUser, "")
	for _, id := range ids {
		if err := servers.Delete(ctx, deleter, id).ExtractErr(); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(500 * time.Millisecond)
	r.ctls[1].stop(t, syscall.SIGKILL)
	killed = time.Now()
	last = 0
	watcher := r.compute(2, cloud.DemoUser, "")
	nc, err := openstack.NewNetworkV2(r.provider(2, cloud.DemoUser), gophercloud.EndpointOpts{})
	if err != nil {
		t.Fatal(err)
	}
	gone := map[string]bool{}
	for len(gone) < len(ids) {
		if time.Since(killed) > takeoverBound+20*time.Second {
			t.Fatalf("%d of %d servers gone %s after the second kill\n%s", len(gone), len(ids), time.Since(killed).Round(time.Second), r.logs())
		}
		for _, id := range ids {
			if gone[id] {
				continue
			}
			s, err := servers.Get(ctx, watcher, id).Extract()
			if err == nil {
				if s.TaskState != "deleting" {
					t.Errorf("server %s after its delete: %s/%s", id, s.Status, s.TaskState)
				}
				continue
			}
			if !gophercloud.ResponseCodeIs(err, http.StatusNotFound) {
				continue // the survivor busy: look again
			}
			gone[id] = true
			last = time.Since(killed)
			if p := serverPorts(t, nc, id); len(p) != 0 {
				t.Errorf("server %s answers 404 and still holds ports %v", id, p)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("all 20 deleted %.1f s after the second kill (bound %s)", last.Seconds(), takeoverBound)
	if last > takeoverBound {
		t.Errorf("the last delete took %s after the kill, over %s", last.Round(100*time.Millisecond), takeoverBound)
	}
	if vms := regiontest.FakeJournal(t, filepath.Join(r.agentD, "fake-fleet.json")); len(vms) != 0 {
		t.Errorf("%d VMs left on the fake fleet after every server was deleted", len(vms))
	}
	regiontest.CheckClaims(t, r.dbURL, 0, 0)
}
