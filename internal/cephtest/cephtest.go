// Package cephtest brings up a one-node Ceph cluster for tests. It is
// apart from testenv, which starts whole clouds: the rbd package's own
// tests need a cluster, and the cloud the volume service's rbd backend
// is part of imports rbd.
package cephtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Ceph is a one-node Ceph cluster for tests, made as
// /work/shared/ceph/one-node.sh makes one: a monitor, a manager and one
// BlueStore OSD on a sparse file, as plain processes in a temporary
// directory, the monitor on free ports of 127.0.0.1. It has three
// rbd-initialised pools, VolumesPool, BackupsPool and ImagesPool
// (Cinder's rbd_pool and backup_ceph_pool, Glance's rbd_store_pool),
// and a client with rbd caps on them (profile rbd), whose keyring is
// Keyring.
type Ceph struct {
	Dir      string   // the cluster's directory
	Conf     string   // ceph.conf: monitors and client settings, no keys
	Keyring  string   // the client's keyring (mode 0600)
	Client   string   // the client's name without "client." (for --id)
	Key      string   // the client's secret key (base64), as QEMU's key-secret wants it
	Monitors []string // the monitor's v1 address, "127.0.0.1:port"

	adminKeyring string
	procs        []*exec.Cmd // mon, mgr, osd
}

// The pools every test cluster has.
const (
	VolumesPool = "volumes"
	BackupsPool = "backups"
	ImagesPool  = "images"
)

// pools are the pools every test cluster has.
var pools = []string{VolumesPool, BackupsPool, ImagesPool}

// cephTools are the programs a test cluster needs (Debian's ceph-mon,
// ceph-mgr, ceph-osd and ceph-common).
var cephTools = []string{"ceph-mon", "ceph-mgr", "ceph-osd", "ceph", "ceph-authtool", "monmaptool", "rbd"}

// requireCeph reports whether NIMBUS_REQUIRE_CEPH=1 (as CI sets): then
// missing Ceph programs fail the test instead of skipping it.
func requireCeph() bool { return os.Getenv("NIMBUS_REQUIRE_CEPH") == "1" }

// checkCephTools skips (or fails) t when a Ceph program is missing.
func checkCephTools(t testing.TB) {
	t.Helper()
	for _, tool := range cephTools {
		if _, err := exec.LookPath(tool); err != nil {
			const install = "apt-get install ceph-mon ceph-mgr ceph-osd ceph-common"
			if requireCeph() {
				t.Fatalf("%s not found, and NIMBUS_REQUIRE_CEPH=1 requires Ceph (%s)", tool, install)
			}
			t.Skipf("skipping: %s not found (%s; NIMBUS_REQUIRE_CEPH=1 makes this a failure)", tool, install)
		}
	}
}

// StartCeph brings up a cluster of the test's own (about 6 s), torn down
// when the test ends. Tests of one package should rather share one
// through SharedCeph.
func StartCeph(t testing.TB) *Ceph {
	t.Helper()
	checkCephTools(t)
	dir, err := os.MkdirTemp("", "nimbus-ceph-")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	c, err := NewCeph(context.Background(), dir)
	if err != nil {
		os.RemoveAll(dir)
		t.Fatalf("starting Ceph: %v", err)
	}
	t.Logf("Ceph up in %v (%s)", time.Since(start).Round(time.Millisecond), dir)
	t.Cleanup(c.Close)
	return c
}

// sharedCeph is the process's one shared cluster.
var sharedCeph struct {
	sync.Mutex
	main    bool // CephMain runs the tests
	started bool
	ceph    *Ceph
	err     error
	took    time.Duration
}

// CephMain runs a test binary's tests (call it from TestMain:
// os.Exit(testenv.CephMain(m))) and afterwards tears down the cluster
// SharedCeph started, if any.
func CephMain(m *testing.M) int {
	sharedCeph.Lock()
	sharedCeph.main = true
	sharedCeph.Unlock()
	code := m.Run()
	sharedCeph.Lock()
	defer sharedCeph.Unlock()
	if sharedCeph.ceph != nil {
		sharedCeph.ceph.Close()
		sharedCeph.ceph = nil
	}
	return code
}

// SharedCeph returns the test binary's one cluster, bringing it up on
// first use; it lives until CephMain tears it down, so tests that share
// it must use image names of their own. It skips the test when Ceph's
// programs are missing, unless NIMBUS_REQUIRE_CEPH=1.
func SharedCeph(t testing.TB) *Ceph {
	t.Helper()
	checkCephTools(t)
	s := &sharedCeph
	s.Lock()
	defer s.Unlock()
	if !s.main {
		t.Fatal("testenv.SharedCeph needs TestMain to call testenv.CephMain, which tears the cluster down")
	}
	if !s.started {
		s.started = true
		dir, err := os.MkdirTemp("", "nimbus-ceph-")
		if err != nil {
			s.err = err
		} else {
			start := time.Now()
			s.ceph, s.err = NewCeph(context.Background(), dir)
			s.took = time.Since(start)
			if s.err != nil {
				os.RemoveAll(dir)
			} else {
				t.Logf("shared Ceph up in %v (%s)", s.took.Round(time.Millisecond), dir)
			}
		}
	}
	if s.err != nil {
		t.Fatalf("starting Ceph: %v", s.err)
	}
	return s.ceph
}

// freePorts returns n distinct free TCP ports on 127.0.0.1. Another
// process may take one before the monitor binds it; tests live with that.
func freePorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// cephConf is one-node.sh's configuration with the monitor on the given
// ports and every path under dir. FINDINGS.md says why each setting.
func cephConf(dir, fsid string, v2, v1 int) string {
	return fmt.Sprintf(`[global]
fsid = %[2]s
mon initial members = a
mon host = [v2:127.0.0.1:%[3]d,v1:127.0.0.1:%[4]d]
public addr = 127.0.0.1
cluster addr = 127.0.0.1
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
auth allow insecure global id reclaim = false
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
mon data avail warn = 2
mon data avail crit = 1
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mgr stats period = 1
mon mgr digest period = 1
paxos propose interval = 0.1
run dir = %[1]s/run
crash dir = %[1]s/crash
admin socket = %[1]s/run/$cluster-$name.asok
log file = %[1]s/log/$cluster-$name.log
mon cluster log file = %[1]s/log/$cluster.$channel.log
mon data = %[1]s/mon/$cluster-$id
mgr data = %[1]s/mgr/$cluster-$id
osd data = %[1]s/osd/$cluster-$id
[osd]
osd objectstore = bluestore
bluestore block create = true
bluestore block size = 10737418240
osd memory target = 1073741824
osd op num shards = 1
osd op num threads per shard = 2
`, dir, fsid, v2, v1)
}

// NewCeph brings up a cluster in dir (which it owns from then on; Close
// removes it). It takes about 6 s.
func NewCeph(ctx context.Context, dir string) (c *Ceph, err error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	c = &Ceph{
		Dir: dir, Conf: filepath.Join(dir, "ceph.conf"), Client: "nimbus",
		Keyring:      filepath.Join(dir, "ceph.client.nimbus.keyring"),
		adminKeyring: filepath.Join(dir, "ceph.client.admin.keyring"),
	}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	for _, d := range []string{"mon/ceph-a", "mgr/ceph-x", "osd", "run", "log", "crash"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	c.Monitors = []string{"127.0.0.1:" + strconv.Itoa(ports[1])}
	fsid := newUUID()
	if err := os.WriteFile(c.Conf, []byte(cephConf(dir, fsid, ports[0], ports[1])), 0o644); err != nil {
		return nil, err
	}
	run := func(stdin string, name string, args ...string) (string, error) {
		return c.run(ctx, stdin, name, args...)
	}
	admin := func(args ...string) (string, error) {
		return run("", "ceph", append([]string{"--conf", c.Conf, "--keyring", c.adminKeyring, "--id", "admin", "--connect-timeout", "5"}, args...)...)
	}
	monKeyring := filepath.Join(dir, "mon.keyring")
	monmap := filepath.Join(dir, "monmap")
	steps := [][]string{
		{"ceph-authtool", "--create-keyring", monKeyring, "--gen-key", "-n", "mon.", "--cap", "mon", "allow *"},
		{"ceph-authtool", "--create-keyring", c.adminKeyring, "--gen-key", "-n", "client.admin",
			"--cap", "mon", "allow *", "--cap", "osd", "allow *", "--cap", "mds", "allow *", "--cap", "mgr", "allow *"},
		{"ceph-authtool", monKeyring, "--import-keyring", c.adminKeyring},
		{"monmaptool", "--create", "--addv", "a", fmt.Sprintf("[v2:127.0.0.1:%d,v1:127.0.0.1:%d]", ports[0], ports[1]), "--fsid", fsid, monmap},
		{"ceph-mon", "--conf", c.Conf, "--mkfs", "-i", "a", "--monmap", monmap, "--keyring", monKeyring},
	}
	for _, s := range steps {
		if _, err := run("", s[0], s[1:]...); err != nil {
			return nil, err
		}
	}
	if err := c.daemon("mon", "ceph-mon", "-f", "--conf", c.Conf, "-i", "a"); err != nil {
		return nil, err
	}
	if err := waitFor(ctx, "the monitor", func() bool { _, err := admin("mon", "stat"); return err == nil }); err != nil {
		return nil, err
	}
	mgrKey, err := admin("auth", "get-or-create", "mgr.x", "mon", "allow profile mgr", "osd", "allow *", "mds", "allow *")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "mgr/ceph-x/keyring"), []byte(mgrKey), 0o600); err != nil {
		return nil, err
	}
	if err := c.daemon("mgr", "ceph-mgr", "-f", "--conf", c.Conf, "-i", "x"); err != nil {
		return nil, err
	}

	osdUUID := newUUID()
	osdKey, err := run("", "ceph-authtool", "--gen-print-key")
	if err != nil {
		return nil, err
	}
	osdKey = strings.TrimSpace(osdKey)
	out, err := run(`{"cephx_secret": "`+osdKey+`"}`, "ceph", "--conf", c.Conf, "--keyring", c.adminKeyring, "--id", "admin",
		"osd", "new", osdUUID, "-i", "-")
	if err != nil {
		return nil, err
	}
	id := strings.TrimSpace(out)
	osdDir := filepath.Join(dir, "osd", "ceph-"+id)
	if err := os.MkdirAll(osdDir, 0o755); err != nil {
		return nil, err
	}
	if _, err := run("", "ceph-authtool", "--create-keyring", filepath.Join(osdDir, "keyring"), "--name", "osd."+id, "--add-key", osdKey); err != nil {
		return nil, err
	}
	if _, err := run("", "ceph-osd", "--conf", c.Conf, "-i", id, "--mkfs", "--osd-uuid", osdUUID); err != nil {
		return nil, err
	}
	if err := c.daemon("osd", "ceph-osd", "-f", "--conf", c.Conf, "-i", id); err != nil {
		return nil, err
	}
	// Pools are monitor work: made while the OSD boots.
	for _, pool := range pools {
		if _, err := admin("osd", "pool", "create", pool, "8", "8"); err != nil {
			return nil, err
		}
	}
	if err := waitFor(ctx, "the OSD", func() bool {
		out, err := admin("osd", "stat", "--format", "json")
		var st struct {
			Up int `json:"num_up_osds"`
			In int `json:"num_in_osds"`
		}
		return err == nil && json.Unmarshal([]byte(out), &st) == nil && st.Up == 1 && st.In == 1
	}); err != nil {
		return nil, err
	}
	for _, pool := range pools {
		if _, err := run("", "rbd", "--conf", c.Conf, "--keyring", c.adminKeyring, "--id", "admin", "pool", "init", pool); err != nil {
			return nil, err
		}
	}
	// The client Cinder's deployment guides make, rbd profiles on its
	// pools only; Nimbus's image store reaches the images pool as the
	// same client.
	keyring, err := admin("auth", "get-or-create", "client."+c.Client, "mon", "profile rbd", "mgr", "profile rbd",
		"osd", "profile rbd pool="+VolumesPool+", profile rbd pool="+BackupsPool+", profile rbd pool="+ImagesPool)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(c.Keyring, []byte(keyring), 0o600); err != nil {
		return nil, err
	}
	key, err := admin("auth", "get-key", "client."+c.Client)
	if err != nil {
		return nil, err
	}
	c.Key = strings.TrimSpace(key)
	// The manager is not needed for rbd, but a cluster without one is
	// not healthy; wait so the first test does not race its start.
	if err := waitFor(ctx, "the manager", func() bool {
		out, err := admin("mgr", "stat", "--format", "json")
		var st struct {
			Available bool `json:"available"`
		}
		return err == nil && json.Unmarshal([]byte(out), &st) == nil && st.Available
	}); err != nil {
		return nil, err
	}
	return c, nil
}

// run runs a Ceph program with the cluster's configuration in its
// environment and returns its standard output, or an error with its
// standard error.
func (c *Ceph) run(ctx context.Context, stdin, name string, args ...string) (string, error) {
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(cctx, name, args...)
	cmd.Env = append(os.Environ(), "CEPH_CONF="+c.Conf)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, lastLines(stderr.String(), 10))
	}
	return stdout.String(), nil
}

// daemon starts a Ceph daemon in the foreground (-f), logging to
// log/<what>.out. The kernel kills it should the test binary die
// before Close.
func (c *Ceph) daemon(what, name string, args ...string) error {
	out, err := os.Create(filepath.Join(c.Dir, "log", what+".out"))
	if err != nil {
		return err
	}
	defer out.Close()
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), "CEPH_CONF="+c.Conf)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %v", name, err)
	}
	c.procs = append(c.procs, cmd)
	return nil
}

// Close kills the daemons, OSD first, and removes the cluster's
// directory. The data is thrown away, so there is no clean shutdown.
func (c *Ceph) Close() {
	for i := len(c.procs) - 1; i >= 0; i-- {
		p := c.procs[i]
		p.Process.Kill()
		p.Wait()
	}
	c.procs = nil
	if c.Dir != "" {
		os.RemoveAll(c.Dir)
	}
}

// Admin returns the arguments that make a ceph or rbd command act as
// client.admin on this cluster, for tests that need more rights than
// the client has.
func (c *Ceph) Admin() []string {
	return []string{"--conf", c.Conf, "--keyring", c.adminKeyring, "--id", "admin"}
}

// waitFor polls ok until it holds or ctx ends.
func waitFor(ctx context.Context, what string, ok func() bool) error {
	for !ok() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
	return nil
}

// newUUID returns a random UUID (version 4).
func newUUID() string {
	b := make([]byte, 16)
	rand.Read(b)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:])
}

// lastLines returns the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
