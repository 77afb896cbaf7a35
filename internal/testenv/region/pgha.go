package region

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Cluster is PostgreSQL made highly available as docs/operator.md has it:
// three etcd members and three Patroni nodes, from deploy/region's
// etcd.conf.yml and patroni.yml, all on loopback.
type Cluster struct {
	Etcd  []*Proc
	Nodes []*Node
	// URL is the controllers' multi-host URL: the nodes in turn, the one
	// that takes writes (target_session_attrs=read-write).
	URL string
	// SuperPassword is the postgres role's.
	SuperPassword string
	as            As
	t             testing.TB
}

// Node is one Patroni and its PostgreSQL.
type Node struct {
	Name            string
	PGPort, APIPort int
	DataDir         string
	Patroni         *Proc
	config          string
	cluster         *Cluster
}

// StartCluster brings the cluster up from nothing: etcd, then the first
// Patroni, which initialises the primary, then the two others, which
// clone it and stream from it, one of them synchronously; then the
// controllers' role and database from nimbus-db.sql.
func StartCluster(t testing.TB) *Cluster {
	t.Helper()
	Need(t, "NIMBUS_REQUIRE_PGHA", "etcd", "patroni", pgBin("initdb"))
	as := Postgres(t)
	root := OwnedDir(t, as, "nimbus-pgha-")
	c := &Cluster{SuperPassword: secret(), as: as, t: t}

	var members, hosts []string
	clientPorts := make([]int, 3)
	peerPorts := make([]int, 3)
	for i := range 3 {
		clientPorts[i], peerPorts[i] = FreePort(t, "127.0.0.1"), FreePort(t, "127.0.0.1")
		members = append(members, fmt.Sprintf("etcd%d=http://127.0.0.1:%d", i+1, peerPorts[i]))
		hosts = append(hosts, fmt.Sprintf("127.0.0.1:%d", clientPorts[i]))
	}
	for i := range 3 {
		dir := filepath.Join(root, fmt.Sprintf("etcd%d", i+1))
		mkdirAs(t, as, dir)
		cfg := Render(t, "deploy/region/etcd.conf.yml", dir, map[string]string{
			"ETCD_NAME": fmt.Sprintf("etcd%d", i+1), "ETCD_ADDR": "127.0.0.1", "ETCD_DATA_DIR": filepath.Join(dir, "data"),
			"ETCD_CLIENT_PORT": strconv.Itoa(clientPorts[i]), "ETCD_PEER_PORT": strconv.Itoa(peerPorts[i]),
			"ETCD_CLUSTER": strings.Join(members, ","),
		})
		chownAs(t, as, cfg)
		c.Etcd = append(c.Etcd, Start(t, fmt.Sprintf("etcd%d", i+1), as, nil, "etcd", "--config-file", cfg))
	}
	WaitFor(t, 60*time.Second, "etcd healthy", func() bool {
		for _, h := range hosts {
			if httpStatus("http://"+h+"/health") != http.StatusOK {
				return false
			}
		}
		return true
	}, c.Etcd...)

	repl, api := secret(), secret()
	var urlHosts []string
	for i := range 3 {
		n := &Node{Name: fmt.Sprintf("pg%d", i+1), PGPort: FreePort(t, "127.0.0.1"), APIPort: FreePort(t, "127.0.0.1"), cluster: c}
		dir := filepath.Join(root, n.Name)
		mkdirAs(t, as, dir)
		n.DataDir = filepath.Join(dir, "data")
		n.config = Render(t, "deploy/region/patroni.yml", dir, map[string]string{
			"PG_NAME": n.Name, "PG_ADDR": "127.0.0.1", "PG_PORT": strconv.Itoa(n.PGPort), "PG_API_PORT": strconv.Itoa(n.APIPort),
			"PG_DATA_DIR": n.DataDir, "PG_BIN_DIR": filepath.Dir(pgBin("postgres")), "PG_SOCKET_DIR": dir,
			"PG_NETWORK": "127.0.0.1/32", "ETCD_HOSTS": strings.Join(hosts, ","),
			"PG_SUPERUSER_PASSWORD": c.SuperPassword, "PG_REPLICATION_PASSWORD": repl, "PATRONI_API_PASSWORD": api,
		})
		chownAs(t, as, n.config)
		c.Nodes = append(c.Nodes, n)
		urlHosts = append(urlHosts, fmt.Sprintf("127.0.0.1:%d", n.PGPort))
	}
	t.Cleanup(c.stopAll)
	c.Nodes[0].Start()
	WaitFor(t, 90*time.Second, "pg1 the primary", func() bool { return c.Nodes[0].Role() == "primary" }, c.Nodes[0].Patroni)
	c.Nodes[1].Start()
	c.Nodes[2].Start()
	c.WaitSynchronous(t, 120*time.Second)

	dbPassword := secret()
	run(t, as, []string{"PGPASSWORD=" + c.SuperPassword}, pgBin("psql"), "-h", "127.0.0.1", "-p", strconv.Itoa(c.Nodes[0].PGPort),
		"-U", "postgres", "-d", "postgres", "-v", "ON_ERROR_STOP=1", "-v", "password="+dbPassword,
		"-f", RepoFile(t, "deploy/region/nimbus-db.sql"))
	c.URL = fmt.Sprintf("postgres://nimbus:%s@%s/nimbus?target_session_attrs=read-write&connect_timeout=3",
		dbPassword, strings.Join(urlHosts, ","))
	return c
}

// Start starts the node's Patroni.
func (n *Node) Start() {
	n.Patroni = Start(n.cluster.t, "patroni-"+n.Name, n.cluster.as, nil, "patroni", n.config)
}

// Role is the node's role as its Patroni tells it ("primary", "replica";
// "" when it does not answer).
func (n *Node) Role() string {
	var st struct {
		Role string `json:"role"`
	}
	if getJSON(fmt.Sprintf("http://127.0.0.1:%d/patroni", n.APIPort), &st) != nil {
		return ""
	}
	if st.Role == "master" {
		return "primary"
	}
	return st.Role
}

// Member is a node as the cluster's leader sees it (GET /cluster).
type Member struct {
	Name  string `json:"name"`
	Role  string `json:"role"`  // leader, sync_standby, replica
	State string `json:"state"` // running, streaming, …
	Lag   any    `json:"lag"`
}

// Members asks any node that answers.
func (c *Cluster) Members() []Member {
	for _, n := range c.Nodes {
		var out struct {
			Members []Member `json:"members"`
		}
		if getJSON(fmt.Sprintf("http://127.0.0.1:%d/cluster", n.APIPort), &out) == nil {
			return out.Members
		}
	}
	return nil
}

// Primary is the node that is primary now, nil when none is.
func (c *Cluster) Primary() *Node {
	for _, n := range c.Nodes {
		if n.Role() == "primary" {
			return n
		}
	}
	return nil
}

// WaitSynchronous waits until the cluster has a leader and a synchronous
// standby.
func (c *Cluster) WaitSynchronous(t testing.TB, d time.Duration) {
	t.Helper()
	procs := append([]*Proc{}, c.Etcd...)
	for _, n := range c.Nodes {
		procs = append(procs, n.Patroni)
	}
	WaitFor(t, d, "a leader and a synchronous standby", func() bool {
		roles := map[string]int{}
		for _, m := range c.Members() {
			if m.State == "running" || m.State == "streaming" {
				roles[m.Role]++
			}
		}
		return roles["leader"] == 1 && roles["sync_standby"] >= 1
	}, procs...)
}

// Kill kills the node as its host's death would: Patroni, the postmaster
// and every PostgreSQL process at once, with SIGKILL.
func (n *Node) Kill() {
	pids := n.postgresPids()
	if n.Patroni != nil {
		pids = append(pids, n.Patroni.Pid())
	}
	for _, p := range pids {
		syscall.Kill(p, syscall.SIGKILL)
	}
	if n.Patroni != nil {
		n.Patroni.Kill()
	}
}

// postgresPids are the node's postmaster and its children.
func (n *Node) postgresPids() []int {
	b, err := os.ReadFile(filepath.Join(n.DataDir, "postmaster.pid"))
	if err != nil {
		return nil
	}
	pm, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
	if err != nil || syscall.Kill(pm, 0) != nil {
		return nil
	}
	pids := []int{pm}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		st, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid …: comm may hold spaces, so read after ')'.
		f := strings.Fields(string(st[strings.LastIndexByte(string(st), ')')+1:]))
		if len(f) > 1 && f[1] == strconv.Itoa(pm) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// stopAll stops every node's Patroni and PostgreSQL when the test ends.
func (c *Cluster) stopAll() {
	for _, n := range c.Nodes {
		if n.Patroni != nil {
			n.Patroni.Kill()
		}
		if _, err := os.Stat(filepath.Join(n.DataDir, "postmaster.pid")); err == nil {
			cmdAs(c.as, pgBin("pg_ctl"), "-D", n.DataDir, "-m", "immediate", "-w", "stop")
		}
		for _, p := range n.postgresPids() {
			syscall.Kill(p, syscall.SIGKILL)
		}
	}
}

func secret() string {
	b := make([]byte, 12)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func mkdirAs(t testing.TB, as As, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	chownAs(t, as, dir)
}

func chownAs(t testing.TB, as As, path string) {
	t.Helper()
	c := (*syscall.Credential)(as)
	if err := os.Chown(path, int(c.Uid), int(c.Gid)); err != nil {
		t.Fatal(err)
	}
}

func httpStatus(url string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

func getJSON(url string, out any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(out)
}
