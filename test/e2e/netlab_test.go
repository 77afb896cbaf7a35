package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/attachinterfaces"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/flavors"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/keypairs"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/services"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/projects"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/roles"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/users"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/floatingips"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/routers"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/security/groups"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/security/rules"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"
	"github.com/vishvananda/netns"

	"nimbus/internal/cloud"
	"nimbus/internal/netstate"
	"nimbus/internal/testenv"
)

// netlab is a small cloud built of network namespaces on this machine:
// an underlay bridge joins a controller and two hypervisor hosts, each
// host runs `nimbus agent --driver qemu --network-mode bridged`, and the
// first host also reaches a provider network where an "internet"
// namespace plays the provider's router and the rest of the world.
//
//	underlay 192.0.2.0/24:  ctl .1   hva .11   hvb .12
//	provider 198.51.100.0/24: internet .1 (the gateway), hva's prov0 (no address)
type netlab struct {
	t       *testing.T
	prefix  string
	bin     string
	dir     string
	ctlDir  string
	ns      map[string]string // role → namespace name
	ctl     *proc
	agents  map[string]*proc
	agArgs  map[string][]string
	c       *cloud.Cloud
	admin   *gophercloud.ProviderClient
	httpCli *http.Client
}

const (
	labAdminPassword = "admin-secret"
	labDemoPassword  = "demo-secret"
	labCtlIP         = "192.0.2.1"
	labInternetIP    = "198.51.100.1"
)

var labHosts = map[string]string{"hva": "192.0.2.11", "hvb": "192.0.2.12"}

// requireNetns skips (or, with NIMBUS_REQUIRE_NETNS=1, fails) where
// network namespaces cannot be made.
func requireNetns(t *testing.T) {
	t.Helper()
	name := fmt.Sprintf("nlprobe%d", os.Getpid())
	err := exec.Command("ip", "netns", "add", name).Run()
	if err == nil {
		err = exec.Command("ip", "netns", "del", name).Run()
	}
	if err != nil {
		if os.Getenv("NIMBUS_REQUIRE_NETNS") == "1" {
			t.Fatalf("cannot make network namespaces (NIMBUS_REQUIRE_NETNS=1): %v", err)
		}
		t.Skipf("cannot make network namespaces (needs root and iproute2): %v", err)
	}
}

func startNetlab(t *testing.T) *netlab {
	t.Helper()
	requireNetns(t)
	var b [2]byte
	rand.Read(b[:])
	l := &netlab{t: t, prefix: "nl" + hex.EncodeToString(b[:]), dir: t.TempDir(), ns: map[string]string{},
		agents: map[string]*proc{}, agArgs: map[string][]string{}}
	for _, role := range []string{"ul", "ctl", "hva", "hvb", "pub", "inet"} {
		l.ns[role] = l.prefix + "-" + role
		l.ip("netns", "add", l.ns[role])
		name := l.ns[role]
		t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
		l.ip("-n", l.ns[role], "link", "set", "lo", "up")
	}
	// A VM outlives its agent by design, so a test that stops half-way
	// would leave its hosts' QEMU (and storage daemons) running: whatever
	// still runs from the lab's directory goes when the agents have.
	t.Cleanup(func() { killUnder(l.dir) })
	// The underlay.
	l.ip("-n", l.ns["ul"], "link", "add", "br0", "type", "bridge")
	l.ip("-n", l.ns["ul"], "link", "set", "br0", "up")
	nodes := map[string]string{"ctl": labCtlIP, "hva": labHosts["hva"], "hvb": labHosts["hvb"]}
	for role, addr := range nodes {
		l.ip("-n", l.ns["ul"], "link", "add", "u-"+role, "type", "veth", "peer", "name", "eth0", "netns", l.ns[role])
		l.ip("-n", l.ns["ul"], "link", "set", "u-"+role, "master", "br0", "up")
		l.ip("-n", l.ns[role], "addr", "add", addr+"/24", "dev", "eth0")
		l.ip("-n", l.ns[role], "link", "set", "eth0", "up")
	}
	// The provider network: the internet namespace and hva's uplink.
	l.ip("-n", l.ns["pub"], "link", "add", "brp", "type", "bridge")
	l.ip("-n", l.ns["pub"], "link", "set", "brp", "up")
	l.ip("-n", l.ns["pub"], "link", "add", "p-inet", "type", "veth", "peer", "name", "eth0", "netns", l.ns["inet"])
	l.ip("-n", l.ns["pub"], "link", "set", "p-inet", "master", "brp", "up")
	l.ip("-n", l.ns["inet"], "addr", "add", labInternetIP+"/24", "dev", "eth0")
	l.ip("-n", l.ns["inet"], "link", "set", "eth0", "up")
	l.ip("-n", l.ns["pub"], "link", "add", "p-hva", "type", "veth", "peer", "name", "prov0", "netns", l.ns["hva"])
	l.ip("-n", l.ns["pub"], "link", "set", "p-hva", "master", "brp", "up")
	l.ip("-n", l.ns["hva"], "link", "set", "prov0", "up")

	l.bin = filepath.Join(l.dir, "nimbus")
	if out, err := exec.Command("go", "build", "-o", l.bin, "nimbus/cmd/nimbus").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	l.ctlDir = filepath.Join(l.dir, "controller")
	env := []string{"NIMBUS_DATABASE_URL=", "NIMBUS_DATA_DIR="}
	// nsenter switches only the network namespace: `ip netns exec` would
	// also give the process a mount namespace of its own, hiding the
	// namespaces an agent makes from everyone else.
	l.ctl = startProc(t, "controller", "nsenter", env, "--net="+l.nsPath("ctl"), l.bin, "serve",
		"--data-dir", l.ctlDir, "--listen", labCtlIP, "--public-host", labCtlIP, "--no-local-agent", "--down-after", "6s",
		"--admin-password", labAdminPassword, "--demo-password", labDemoPassword, "--log-level", "warn",
		"--public-cidr", "198.51.100.0/24", "--public-gateway", labInternetIP, "--public-pool", "198.51.100.100-198.51.100.150")
	l.c = &cloud.Cloud{IdentityURL: "https://" + labCtlIP + ":5000/v3", CACertFile: filepath.Join(l.ctlDir, "ca.pem")}
	waitFor(t, 60*time.Second, "controller up", func() bool {
		if _, err := os.Stat(l.c.CACertFile); err != nil {
			return false
		}
		if l.httpCli == nil {
			l.httpCli = testenv.HTTPClient(t, l.c)
			l.httpCli.Transport.(*http.Transport).DialContext = nsDial(l.nsPath("ctl"))
		}
		resp, err := l.httpCli.Get("https://" + labCtlIP + ":8774/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, l.ctl)

	for _, h := range []string{"hva", "hvb"} {
		out, err := exec.Command(l.bin, "admin", "host", "token", "--data-dir", l.ctlDir).Output()
		if err != nil {
			t.Fatalf("admin host token: %v", err)
		}
		dir := filepath.Join(l.dir, h)
		os.MkdirAll(dir, 0o700)
		args := []string{"--net=" + l.nsPath(h), l.bin, "agent", "--controller", "https://" + labCtlIP + ":8790",
			"--ca-cert", l.c.CACertFile, "--data-dir", dir, "--name", h, "--driver", "qemu", "--heartbeat", "1s",
			"--accel", "auto", "--reserved-cpus", "none", "--reserved-memory-mb", "-1",
			"--network-mode", "bridged", "--host-ip", labHosts[h], "--netns-prefix", l.prefix + h + "-",
			// As an operator runs it: QEMU drops to an unprivileged user.
			"--qemu-user", "nobody"}
		if h == "hva" {
			args = append(args, "--provider-interface", "prov0")
		}
		l.agArgs[h] = args
		l.agents[h] = startProc(t, h, "nsenter", append(env, "NIMBUS_AGENT_TOKEN="+strings.TrimSpace(string(out))), args...)
	}
	l.admin = l.provider("admin", labAdminPassword, cloud.AdminProject)
	return l
}

// waitHostsUp waits until the controller has both hosts' compute services up.
func (l *netlab) waitHostsUp(ctx context.Context) {
	l.t.Helper()
	adm := testenv.Compute(l.t, l.admin, "2.79")
	waitFor(l.t, 60*time.Second, "both hosts up", func() bool {
		pages, err := services.List(adm, services.ListOpts{Binary: "nova-compute"}).AllPages(ctx)
		if err != nil {
			return false
		}
		svcs, _ := services.ExtractServices(pages)
		up := 0
		for _, s := range svcs {
			if (s.Host == "hva" || s.Host == "hvb") && s.State == "up" {
				up++
			}
		}
		return up == 2
	}, l.ctl, l.agents["hva"], l.agents["hvb"])
}

// killUnder kills every process whose command line names a path under dir.
func killUnder(dir string) {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(cmd, []byte(dir+"/")) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// ip runs iproute2's ip (test topology only: the product uses netlink).
func (l *netlab) ip(args ...string) {
	l.t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		l.t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// in runs a command inside a role's namespace and returns its output.
func (l *netlab) in(role string, args ...string) (string, error) {
	out, err := exec.Command("ip", append([]string{"netns", "exec", l.ns[role]}, args...)...).CombinedOutput()
	return string(out), err
}

func (l *netlab) nsPath(role string) string { return "/run/netns/" + l.ns[role] }

// provider authenticates as user through the controller's namespace.
func (l *netlab) provider(user, password, project string) *gophercloud.ProviderClient {
	l.t.Helper()
	pc, err := openstack.NewClient(l.c.IdentityURL)
	if err != nil {
		l.t.Fatal(err)
	}
	pc.HTTPClient = *l.httpCli
	if err := openstack.Authenticate(context.Background(), pc, gophercloud.AuthOptions{
		IdentityEndpoint: l.c.IdentityURL, Username: user, Password: password,
		DomainID: "default", TenantName: project, AllowReauth: true,
	}); err != nil {
		l.t.Fatalf("authenticate %s: %v", user, err)
	}
	return pc
}

// restartAgent kills host h's agent and starts it again.
func (l *netlab) restartAgent(h string) {
	l.agents[h].stop(l.t, 9)
	l.agents[h] = startProc(l.t, h+" again", "nsenter", []string{"NIMBUS_DATABASE_URL=", "NIMBUS_DATA_DIR="}, l.agArgs[h]...)
}

// nsDial makes connections from inside namespace path: the socket is
// made on a thread switched there, and stays there.
func nsDial(path string) testenv.Dial {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		type result struct {
			c   net.Conn
			err error
		}
		ch := make(chan result, 1)
		go func() {
			runtime.LockOSThread()
			orig, err := netns.Get()
			if err != nil {
				ch <- result{nil, err}
				return
			}
			target, err := netns.GetFromPath(path)
			if err != nil {
				ch <- result{nil, err}
				return
			}
			defer target.Close()
			if err := netns.Set(target); err != nil {
				ch <- result{nil, err}
				return
			}
			var d net.Dialer
			c, err := d.DialContext(ctx, network, addr)
			if netns.Set(orig) == nil {
				runtime.UnlockOSThread() // else the thread dies with this goroutine
			}
			ch <- result{c, err}
		}()
		r := <-ch
		return r.c, r.err
	}
}

// labTenant is one project of the lab: its clients, key and what it made.
type labTenant struct {
	q       *qemuCloud
	network *gophercloud.ServiceClient
	netID   string // its "private" network
	subID   string
	sgSSH   string // a group allowing SSH from anywhere
	ruleSSH string
	router  string
	image   string
}

func (l *netlab) tenant(ctx context.Context, guest testenv.Guest, pc *gophercloud.ProviderClient) *labTenant {
	t := l.t
	t.Helper()
	q := &qemuCloud{t: t, admin: l.admin, demo: pc, guest: guest}
	q.compute = testenv.Compute(t, pc, "2.79")
	var err error
	if q.image, err = openstack.NewImageV2(pc, gophercloud.EndpointOpts{}); err != nil {
		t.Fatal(err)
	}
	nc, err := openstack.NewNetworkV2(pc, gophercloud.EndpointOpts{})
	if err != nil {
		t.Fatal(err)
	}
	signer, pub := testenv.NewSSHKey(t)
	q.key = signer
	if _, err := keypairs.Create(ctx, q.compute, keypairs.CreateOpts{Name: "e2e", PublicKey: pub}).Extract(); err != nil {
		t.Fatal(err)
	}
	tn := &labTenant{q: q, network: nc, image: q.uploadGuest(ctx)}
	nets, err := networks.List(nc, networks.ListOpts{Name: "private"}).AllPages(ctx)
	must(t, err)
	all, err := networks.ExtractNetworks(nets)
	must(t, err)
	if len(all) != 1 || len(all[0].Subnets) != 1 {
		t.Fatalf("private networks: %+v", all)
	}
	tn.netID, tn.subID = all[0].ID, all[0].Subnets[0]
	sg, err := groups.Create(ctx, nc, groups.CreateOpts{Name: "ssh"}).Extract()
	must(t, err)
	tn.sgSSH = sg.ID
	tn.ruleSSH = tn.allowSSH(ctx)
	pub0 := networkNamed(ctx, t, nc, "public")
	r, err := routers.Create(ctx, nc, routers.CreateOpts{Name: "r", GatewayInfo: &routers.GatewayInfo{NetworkID: pub0}}).Extract()
	must(t, err)
	tn.router = r.ID
	_, err = routers.AddInterface(ctx, nc, r.ID, routers.AddInterfaceOpts{SubnetID: tn.subID}).Extract()
	must(t, err)
	return tn
}

func (tn *labTenant) allowSSH(ctx context.Context) string {
	r, err := rules.Create(ctx, tn.network, rules.CreateOpts{SecGroupID: tn.sgSSH, Direction: rules.DirIngress,
		EtherType: rules.EtherType4, Protocol: rules.ProtocolTCP, PortRangeMin: 22, PortRangeMax: 22, RemoteIPPrefix: "0.0.0.0/0"}).Extract()
	must(tn.q.t, err)
	return r.ID
}

// boot creates a server with the default and ssh groups (on a host other
// than those of avoid) and waits for ACTIVE; it returns the server, its
// fixed IP and its host.
func (tn *labTenant) boot(ctx context.Context, l *netlab, name, flavor string, avoid ...string) (id, ip, host string) {
	tn.q.t.Helper()
	var hints servers.SchedulerHintOptsBuilder
	if len(avoid) > 0 {
		hints = servers.SchedulerHintOpts{DifferentHost: avoid}
	}
	return tn.bootWith(ctx, l, name, flavor, hints)
}

// bootWith is boot with the scheduler hints given (nil: none).
func (tn *labTenant) bootWith(ctx context.Context, l *netlab, name, flavor string, hints servers.SchedulerHintOptsBuilder) (id, ip, host string) {
	t := tn.q.t
	t.Helper()
	opts := servers.CreateOpts{Name: name, ImageRef: tn.image, FlavorRef: flavor,
		Networks: []servers.Network{{UUID: tn.netID}}, SecurityGroups: []string{"default", tn.sgSSH}}
	sv, err := servers.Create(ctx, tn.q.compute, keypairs.CreateOptsExt{CreateOptsBuilder: opts, KeyName: "e2e"}, hints).Extract()
	if err != nil {
		t.Fatalf("create %s: %v", name, err)
	}
	tn.q.waitStatus(ctx, sv.ID, "ACTIVE")
	adm := testenv.Compute(t, l.admin, "2.79")
	var got struct {
		Server map[string]any `json:"server"`
	}
	if _, err := adm.Get(ctx, adm.ServiceURL("servers", sv.ID), &got, nil); err != nil {
		t.Fatal(err)
	}
	host, _ = got.Server["OS-EXT-SRV-ATTR:host"].(string)
	addrs, _ := got.Server["addresses"].(map[string]any)
	for _, v := range addrs {
		for _, a := range v.([]any) {
			m := a.(map[string]any)
			if m["OS-EXT-IPS:type"] == "fixed" {
				ip = m["addr"].(string)
			}
		}
	}
	if ip == "" || host == "" {
		t.Fatalf("server %s: no fixed IP or host in %v", name, got.Server)
	}
	return sv.ID, ip, host
}

// addrsInUse are the fixed IPs of the ports on tn's private network
// (servers', DHCP's, the router's).
func (tn *labTenant) addrsInUse(ctx context.Context) map[string]bool {
	tn.q.t.Helper()
	pages, err := ports.List(tn.network, ports.ListOpts{NetworkID: tn.netID}).AllPages(ctx)
	must(tn.q.t, err)
	ps, err := ports.ExtractPorts(pages)
	must(tn.q.t, err)
	in := map[string]bool{}
	for _, p := range ps {
		for _, ip := range p.FixedIPs {
			in[ip.IPAddress] = true
		}
	}
	return in
}

// floatingIP gives server id's port a floating IP and returns it.
func (tn *labTenant) floatingIP(ctx context.Context, serverID string) string {
	t := tn.q.t
	t.Helper()
	pages, err := ports.List(tn.network, ports.ListOpts{DeviceID: serverID}).AllPages(ctx)
	must(t, err)
	ps, err := ports.ExtractPorts(pages)
	must(t, err)
	if len(ps) != 1 {
		t.Fatalf("server %s has %d ports", serverID, len(ps))
	}
	pub := networkNamed(ctx, t, tn.network, "public")
	f, err := floatingips.Create(ctx, tn.network, floatingips.CreateOpts{FloatingNetworkID: pub, PortID: ps[0].ID}).Extract()
	must(t, err)
	return f.FloatingIP
}

func networkNamed(ctx context.Context, t *testing.T, nc *gophercloud.ServiceClient, name string) string {
	t.Helper()
	pages, err := networks.List(nc, networks.ListOpts{Name: name}).AllPages(ctx)
	must(t, err)
	all, err := networks.ExtractNetworks(pages)
	must(t, err)
	if len(all) != 1 {
		t.Fatalf("%d networks named %s", len(all), name)
	}
	return all[0].ID
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// sshFrom runs command on the guest at addr, connecting from the
// internet namespace.
func (l *netlab) sshFrom(ctx context.Context, tn *labTenant, addr, command string) (string, error) {
	cctx, cancel := context.WithTimeout(ctx, vmTimeout)
	defer cancel()
	out, err := testenv.SSHVia(cctx, nsDial(l.nsPath("inet")), addr+":22", "root", tn.q.key, command)
	return strings.TrimSpace(out), err
}

// tcpOpen says whether a TCP connection from the internet namespace to
// addr opens within d.
func (l *netlab) tcpOpen(addr string, d time.Duration) bool {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	c, err := nsDial(l.nsPath("inet"))(ctx, "tcp", addr)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// TestBridgedNetwork is issue 13's walk through the bridged data plane
// with real VMs on two simulated hosts: private traffic across hosts,
// isolation of two projects with the same CIDR, a floating IP reached
// from the internet and cut by its security group within a second, SNAT,
// DHCP, the metadata service, anti-spoofing, an agent restart and a host
// that lost its wiring, and nothing left behind.
func TestBridgedNetwork(t *testing.T) {
	if testing.Short() {
		t.Skip("boots VMs in a lab of network namespaces")
	}
	guest := testenv.TestGuest(t)
	l := startNetlab(t)
	ctx := context.Background()
	adm := testenv.Compute(t, l.admin, "2.79")
	l.waitHostsUp(ctx)

	// A second project, with a user of its own.
	idc, err := openstack.NewIdentityV3(l.admin, gophercloud.EndpointOpts{})
	must(t, err)
	proj, err := projects.Create(ctx, idc, projects.CreateOpts{Name: "lab-b", DomainID: "default"}).Extract()
	must(t, err)
	u, err := users.Create(ctx, idc, users.CreateOpts{Name: "lab-b", Password: "lab-b-secret", DomainID: "default", DefaultProjectID: proj.ID}).Extract()
	must(t, err)
	rp, err := roles.List(idc, roles.ListOpts{Name: "member"}).AllPages(ctx)
	must(t, err)
	rl, err := roles.ExtractRoles(rp)
	must(t, err)
	if len(rl) != 1 {
		t.Fatalf("roles named member: %+v", rl)
	}
	must(t, roles.Assign(ctx, idc, rl[0].ID, roles.AssignOpts{UserID: u.ID, ProjectID: proj.ID}).ExtractErr())
	// The service is prepaid: the operator credits the new customer.
	l.credit(proj.ID, 100000)

	a := l.tenant(ctx, guest, l.provider(cloud.DemoUser, labDemoPassword, cloud.DemoProject))
	b := l.tenant(ctx, guest, l.provider("lab-b", "lab-b-secret", "lab-b"))
	flavor := a.q.flavor(ctx, "lab.1c", 1, 256, 1)
	// web's flavor comes with a public IPv4 address, as the spec sells.
	public := a.q.flavor(ctx, "lab.1c.ipv4", 1, 256, 1)
	if _, err := flavors.CreateExtraSpecs(ctx, adm, public, flavors.ExtraSpecsOpts{"nimbus:public_ipv4": "true"}).Extract(); err != nil {
		t.Fatal(err)
	}

	web, webIP, webHost := a.boot(ctx, l, "web", public)
	db, dbIP, dbHost := a.boot(ctx, l, "db", flavor, web)
	other, otherIP, _ := b.boot(ctx, l, "other", flavor)
	if webHost == dbHost {
		t.Fatalf("web and db both on %s despite different_host", webHost)
	}
	// GET /servers/{id}/access gives web's public address first, port 22.
	webAccess, _ := a.q.access(ctx, web)
	webFIP, ok := strings.CutSuffix(webAccess, ":22")
	if !ok || !strings.HasPrefix(webFIP, "198.51.100.") {
		t.Fatalf("web's access: %s, want its public address on port 22", webAccess)
	}
	otherFIP := b.floatingIP(ctx, other)
	for _, ip := range []string{webIP, dbIP, otherIP} {
		if !strings.HasPrefix(ip, "10.0.0.") {
			t.Fatalf("fixed IP %s outside both projects' 10.0.0.0/24", ip)
		}
	}

	// From the internet, SSH reaches web at its floating IP; the guest
	// learnt its address and the network's MTU by DHCP, and reads its own
	// instance id, not another's, from the metadata service.
	out, err := l.sshFrom(ctx, a, webFIP, "ip -4 -o addr show dev eth0; cat /sys/class/net/eth0/mtu; wget -qO- http://169.254.169.254/openstack/latest/meta_data.json")
	if err != nil {
		t.Fatalf("ssh to web at %s: %v\n%s\n%s", webFIP, err, l.agents[webHost].tail(), l.ctl.tail())
	}
	if !strings.Contains(out, " "+webIP+"/24 ") || !strings.Contains(out, "\n1450\n") {
		t.Errorf("web's DHCP lease: want %s/24 and MTU 1450, got:\n%s", webIP, out)
	}
	if !strings.Contains(out, `"uuid":"`+web+`"`) || strings.Contains(out, db) {
		t.Errorf("metadata from web: want its own uuid %s only, got:\n%s", web, out)
	}

	// web and db, on different hosts, reach each other by private IP:
	// ping, and SSH to db through web.
	if out, err := l.sshFrom(ctx, a, webFIP, "ping -c 2 -W 2 "+dbIP); err != nil {
		t.Errorf("web → db ping: %v\n%s", err, out)
	}
	jump, err := testenv.SSHClient(ctx, nsDial(l.nsPath("inet")), webFIP+":22", "root", a.q.key)
	must(t, err)
	defer jump.Close()
	jctx, cancel := context.WithTimeout(ctx, vmTimeout)
	hn, err := testenv.SSHVia(jctx, jump.DialContext, dbIP+":22", "root", a.q.key, "hostname; ping -c 2 -W 2 "+labInternetIP+" >/dev/null && echo internet-ok")
	cancel()
	if err != nil || !strings.Contains(hn, "db") || !strings.Contains(hn, "internet-ok") {
		t.Errorf("ssh web → db (%s), db → internet: %v\n%s", dbIP, err, hn)
	}
	// db has no floating IP: the internet cannot reach it even with a
	// route to the private network through the router.
	if l.tcpOpen(dbIP+":22", 2*time.Second) {
		t.Errorf("the internet reached db's private address %s", dbIP)
	}

	// Block storage over the network (issue 14): a volume written in web
	// on one host is read back in db on the other, each over NBD from the
	// controller.
	l.volumeAcrossHosts(ctx, a, labVM{id: web, run: func(c string) (string, error) { return l.sshFrom(ctx, a, webFIP, c) }},
		l.vmVia(a, jump.DialContext, db, dbIP))

	// The other project's server, same CIDR, same hosts: nothing crosses.
	// Each address is tried on its own (a shell's "ping a; ping b" fails
	// only with the last), except one that a port of the other project's
	// network has too (addresses are drawn at random in each project:
	// the other server's, its DHCP ports'), which answers there.
	inA, inB := a.addrsInUse(ctx), b.addrsInUse(ctx)
	t.Logf("private addresses: web %s, db %s, other %s", webIP, dbIP, otherIP)
	for _, ip := range []string{webIP, dbIP} {
		if inB[ip] {
			t.Logf("%s is in use in the other project's network too: not tried from there", ip)
			continue
		}
		if out, err := l.sshFrom(ctx, b, otherFIP, "ping -c 2 -W 2 "+ip); err == nil {
			t.Errorf("other project reached %s (web or db):\n%s", ip, out)
		}
	}
	if inA[otherIP] {
		t.Logf("%s is in use in web's network too: not tried from there", otherIP)
	} else {
		if out, err := l.sshFrom(ctx, a, webFIP, "ping -c 2 -W 2 "+otherIP); err == nil {
			t.Errorf("web reached the other project's %s:\n%s", otherIP, out)
		}
	}

	// Spoofing: a source address or MAC that is not the port's gets
	// nothing through (the normal path works before and after).
	spoof := fmt.Sprintf(`ip addr add 10.0.0.222/24 dev eth0; ping -c 2 -W 2 -I 10.0.0.222 %[1]s && echo ip-spoof-passed; ip addr del 10.0.0.222/24 dev eth0;
(mac=$(cat /sys/class/net/eth0/address); ip link set eth0 address 02:de:ad:be:ef:01; ping -c 2 -W 2 %[1]s >/tmp/mac-spoof 2>&1 && echo passed >>/tmp/mac-spoof; ip link set eth0 address $mac) >/dev/null 2>&1 &
sleep 8; cat /tmp/mac-spoof; ping -c 1 -W 2 %[1]s >/dev/null && echo normal-ok`, dbIP)
	out, err = l.sshFrom(ctx, a, webFIP, spoof)
	if err != nil || strings.Contains(out, "ip-spoof-passed") || strings.Contains(out, "passed") || !strings.Contains(out, "normal-ok") {
		t.Errorf("spoofing from web: %v\n%s", err, out)
	}

	// The security group: without the SSH rule the floating IP's port 22
	// is cut within a second; with it back it opens within a second.
	if !l.tcpOpen(webFIP+":22", 5*time.Second) {
		t.Fatal("web's SSH port closed before the rule was removed")
	}
	must(t, rules.Delete(ctx, a.network, a.ruleSSH).ExtractErr())
	time.Sleep(time.Second)
	if l.tcpOpen(webFIP+":22", 2*time.Second) {
		t.Error("web's SSH port still open a second after its rule went")
	}
	a.ruleSSH = a.allowSSH(ctx)
	time.Sleep(time.Second)
	if !l.tcpOpen(webFIP+":22", 2*time.Second) {
		t.Error("web's SSH port closed a second after its rule came back")
	}

	// An agent restart, then a host that lost every device and rule
	// (as after a reboot; its VMs kept running here): the agent rebuilds
	// the wiring from the controller's state.
	pathsOK := func(what string) {
		t.Helper()
		var out string
		var err error
		waitFor(t, 30*time.Second, what, func() bool {
			out, err = l.sshFrom(ctx, a, webFIP, "ping -c 1 -W 1 "+dbIP+" >/dev/null && echo ok")
			return err == nil && out == "ok"
		})
	}
	l.restartAgent(dbHost)
	pathsOK("web → db after " + dbHost + "'s agent restarted")
	l.agents[dbHost].stop(t, 9)
	l.wipeHost(dbHost)
	l.agents[dbHost] = startProc(t, dbHost+" after wipe", "nsenter", []string{"NIMBUS_DATABASE_URL=", "NIMBUS_DATA_DIR="}, l.agArgs[dbHost]...)
	pathsOK("web → db after " + dbHost + " lost its wiring")

	// NIC hot-plug on running servers whose QEMU runs as nobody (the
	// agent hands it each tap open, as it cannot attach to root's taps,
	// least of all those made after it started): web gets an interface
	// on a second network by net_id, db by a port made first; both learn
	// their addresses there by DHCP and reach each other. db's NIC from
	// the command line then goes (reached over the second network
	// afterwards), then web's hot-plugged one: each leaves the guest and
	// its tap leaves the host.
	hotplugStart := time.Now()
	if uid := qemuUID(web); uid != "65534" {
		t.Errorf("web's QEMU runs as uid %q, want nobody's 65534 (--qemu-user nobody)", uid)
	}
	net2, err := networks.Create(ctx, a.network, networks.CreateOpts{Name: "second"}).Extract()
	must(t, err)
	noGateway := ""
	_, err = subnets.Create(ctx, a.network, subnets.CreateOpts{NetworkID: net2.ID, CIDR: "10.1.0.0/24",
		IPVersion: gophercloud.IPv4, GatewayIP: &noGateway}).Extract()
	must(t, err)
	webIf, err := attachinterfaces.Create(ctx, a.q.compute, web, attachinterfaces.CreateOpts{NetworkID: net2.ID}).Extract()
	if err != nil {
		t.Fatalf("attach an interface on the second network to web: %v\n%s", err, l.agents[webHost].tail())
	}
	dbPort, err := ports.Create(ctx, a.network, ports.CreateOpts{NetworkID: net2.ID}).Extract()
	must(t, err)
	if _, err := attachinterfaces.Create(ctx, a.q.compute, db, attachinterfaces.CreateOpts{PortID: dbPort.ID}).Extract(); err != nil {
		t.Fatalf("attach port %s to db: %v\n%s", dbPort.ID, err, l.agents[dbHost].tail())
	}
	if len(webIf.FixedIPs) != 1 || len(dbPort.FixedIPs) != 1 {
		t.Fatalf("second network's addresses: web %+v, db %+v", webIf.FixedIPs, dbPort.FixedIPs)
	}
	webIP2, dbIP2 := webIf.FixedIPs[0].IPAddress, dbPort.FixedIPs[0].IPAddress
	// The guest's pciehp may take a moment to show eth1; the test guest
	// runs DHCP on eth0 only by itself.
	const dhcpEth1 = `i=0; while [ ! -e /sys/class/net/eth1 ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
udhcpc -i eth1 -n -q -t 10 -T 1 -s /usr/share/udhcpc/default.script >/dev/null 2>&1; ip -4 -o addr show dev eth1`
	if out, err := l.sshFrom(ctx, a, webFIP, dhcpEth1); err != nil || !strings.Contains(out, " "+webIP2+"/24 ") {
		t.Fatalf("web's eth1: want %s/24 by DHCP: %v\n%s", webIP2, err, out)
	}
	jump2, err := testenv.SSHClient(ctx, nsDial(l.nsPath("inet")), webFIP+":22", "root", a.q.key)
	must(t, err)
	defer jump2.Close()
	viaWeb := func(addr, command string) (string, error) {
		jctx, cancel := context.WithTimeout(ctx, vmTimeout)
		defer cancel()
		out, err := testenv.SSHVia(jctx, jump2.DialContext, addr+":22", "root", a.q.key, command)
		return strings.TrimSpace(out), err
	}
	if out, err := viaWeb(dbIP, dhcpEth1); err != nil || !strings.Contains(out, " "+dbIP2+"/24 ") {
		t.Fatalf("db's eth1: want %s/24 by DHCP: %v\n%s", dbIP2, err, out)
	}
	if out, err := l.sshFrom(ctx, a, webFIP, "ping -c 2 -W 2 "+dbIP2); err != nil {
		t.Errorf("web → db on the second network: %v\n%s", err, out)
	}
	// db's NIC of the command line (its first port, eth0) goes.
	dbPorts, err := ports.List(a.network, ports.ListOpts{DeviceID: db, NetworkID: a.netID}).AllPages(ctx)
	must(t, err)
	dbFirst, err := ports.ExtractPorts(dbPorts)
	must(t, err)
	if len(dbFirst) != 1 {
		t.Fatalf("db has %d ports on the private network", len(dbFirst))
	}
	must(t, attachinterfaces.Delete(ctx, a.q.compute, db, dbFirst[0].ID).ExtractErr())
	if out, err := viaWeb(dbIP2, "ls /sys/class/net | tr '\\n' ' '"); err != nil || out != "eth1 lo" {
		t.Errorf("db's interfaces after its first NIC was detached: %v: %q, want eth1 and lo", err, out)
	}
	l.waitNoTap(dbHost, dbFirst[0].ID)
	// web's hot-plugged NIC goes.
	must(t, attachinterfaces.Delete(ctx, a.q.compute, web, webIf.PortID).ExtractErr())
	if out, err := l.sshFrom(ctx, a, webFIP, "ls /sys/class/net | tr '\\n' ' '"); err != nil || strings.TrimSpace(out) != "eth0 lo" {
		t.Errorf("web's interfaces after its second NIC was detached: %v: %q, want eth0 and lo", err, out)
	}
	l.waitNoTap(webHost, webIf.PortID)
	t.Logf("NIC hot-plug steps took %v", time.Since(hotplugStart).Round(100*time.Millisecond))

	// The other project's server goes first, to leave each host room for
	// one more dedicated vCPU.
	must(t, servers.Delete(ctx, b.q.compute, other).ExtractErr())
	waitGone(t, b.q.compute, other)
	// A network-disk server's root is a volume like the one above: it
	// moves, shelved, to the other host, with its data and no image
	// uploaded.
	l.networkDiskAcrossHosts(ctx, a, jump2.DialContext, [2]string{webHost, dbHost})

	// Delete everything: no device, rule or namespace is left on a host.
	for _, id := range []string{web, db} {
		must(t, servers.Delete(ctx, a.q.compute, id).ExtractErr())
	}
	for _, id := range []string{web, db} {
		waitGone(t, a.q.compute, id)
	}
	must(t, ports.Delete(ctx, a.network, dbPort.ID).ExtractErr())
	must(t, networks.Delete(ctx, a.network, net2.ID).ExtractErr())
	for _, tn := range []*labTenant{a, b} {
		fp, err := floatingips.List(tn.network, floatingips.ListOpts{}).AllPages(ctx)
		must(t, err)
		fs, _ := floatingips.ExtractFloatingIPs(fp)
		for _, f := range fs {
			must(t, floatingips.Delete(ctx, tn.network, f.ID).ExtractErr())
		}
		_, err = routers.RemoveInterface(ctx, tn.network, tn.router, routers.RemoveInterfaceOpts{SubnetID: tn.subID}).Extract()
		must(t, err)
		must(t, routers.Delete(ctx, tn.network, tn.router).ExtractErr())
		must(t, networks.Delete(ctx, tn.network, tn.netID).ExtractErr())
	}
	waitFor(t, 30*time.Second, "hosts clean", func() bool { return l.leftovers() == "" })
	if left := l.leftovers(); left != "" {
		t.Errorf("left behind:\n%s", left)
	}
}

// waitNoTap waits until port portID's tap is gone from host h.
func (l *netlab) waitNoTap(h, portID string) {
	l.t.Helper()
	tap := netstate.TapName(portID)
	waitFor(l.t, 10*time.Second, "tap "+tap+" gone from "+h, func() bool {
		_, err := l.in(h, "ip", "link", "show", tap)
		return err != nil
	})
}

// qemuUID is the user id the QEMU of server id runs as ("" when none is
// found): its process names the server's directory.
func qemuUID(id string) string {
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !strings.Contains(string(cmd), "qemu") || !strings.Contains(string(cmd), "/"+id+"/") {
			continue
		}
		st, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(st), "\n") {
			if f := strings.Fields(line); len(f) > 1 && f[0] == "Uid:" {
				return f[1]
			}
		}
	}
	return ""
}

// ourLink matches the names the data plane gives links.
func ourLink(name string) bool {
	for _, p := range []string{"tap", "nbr", "nvx", "ndh", "nrt", "ngw"} {
		if strings.HasPrefix(name, p) && name != "nbr-provider" {
			return true
		}
	}
	return false
}

// wipeHost removes, as a reboot would, every link, rule and namespace the
// data plane made on host h (taps excepted: the VMs hold them here).
func (l *netlab) wipeHost(h string) {
	out, _ := l.in(h, "ip", "-o", "link", "show")
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		name := strings.SplitN(strings.TrimSuffix(f[1], ":"), "@", 2)[0]
		if ourLink(name) && !strings.HasPrefix(name, "tap") {
			l.in(h, "ip", "link", "del", name)
		}
	}
	l.in(h, "nft", "flush", "ruleset")
	for _, n := range l.namespacesOf(h) {
		exec.Command("ip", "netns", "del", n).Run()
	}
}

// namespacesOf lists the named namespaces host h's agent made.
func (l *netlab) namespacesOf(h string) []string {
	ents, _ := os.ReadDir("/run/netns")
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), l.prefix+h+"-") {
			out = append(out, e.Name())
		}
	}
	return out
}

// leftovers describes what the data plane left on the hosts.
func (l *netlab) leftovers() string {
	var b strings.Builder
	for _, h := range []string{"hva", "hvb"} {
		out, _ := l.in(h, "ip", "-o", "link", "show")
		for _, line := range strings.Split(out, "\n") {
			if f := strings.Fields(line); len(f) > 1 && ourLink(strings.SplitN(strings.TrimSuffix(f[1], ":"), "@", 2)[0]) {
				fmt.Fprintf(&b, "%s: link %s\n", h, f[1])
			}
		}
		if rs, _ := l.in(h, "nft", "list", "ruleset"); strings.Contains(rs, "\trule") || strings.Contains(rs, "ether saddr") || strings.Contains(rs, "dnat") {
			fmt.Fprintf(&b, "%s: nftables rules:\n%s\n", h, rs)
		}
		for _, n := range l.namespacesOf(h) {
			fmt.Fprintf(&b, "%s: namespace %s\n", h, n)
		}
	}
	return b.String()
}

// credit credits project with amount minor units as the operator would (a
// manual top-up through the billing API): the service is prepaid, and a
// new project starts at zero.
func (l *netlab) credit(project string, amount int64) {
	l.t.Helper()
	body := fmt.Sprintf(`{"topup": {"amount": %d, "reference": "lab"}}`, amount)
	req, err := http.NewRequest("POST", "https://"+labCtlIP+":8889/v1/accounts/"+project+"/topups", strings.NewReader(body))
	must(l.t, err)
	req.Header.Set("X-Auth-Token", l.admin.Token())
	req.Header.Set("Content-Type", "application/json")
	resp, err := l.httpCli.Do(req)
	must(l.t, err)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		b, _ := io.ReadAll(resp.Body)
		l.t.Fatalf("credit %s: %d %s", project, resp.StatusCode, b)
	}
}
