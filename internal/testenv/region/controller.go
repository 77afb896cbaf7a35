package region

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Services are the names of a controller's listeners, as nimbus serve's
// --<name>-port flags and the HAProxy configuration's variables call them.
var Services = []string{"identity", "compute", "image", "network", "volume", "billing", "agent", "console", "panel"}

// The first accounts' passwords in every test region.
const (
	AdminPassword = "admin-secret"
	DemoPassword  = "demo-secret"
)

// Controller is one nimbus serve process.
type Controller struct {
	*Proc
	Dir   string         // data directory
	Addr  string         // address it listens on
	Ports map[string]int // by service name
	bin   string
	args  []string
	env   []string
}

// ControllerConfig says how to start a controller.
type ControllerConfig struct {
	Bin, DatabaseURL string
	// Addr is the address to listen on; Ports the port of each service
	// (free ports on Addr when nil).
	Addr  string
	Ports map[string]int
	// PublicHost is the address the catalog names (default Addr).
	PublicHost string
	// CA is the data directory of a controller whose CA this one shares
	// (its ca.pem, ca-key.pem and secrets.json are copied), as docs/operator.md
	// has the operator do for every controller after the first.
	CA string
	// Extra flags.
	Args []string
	// Env is added to the process's environment.
	Env []string
	// Dir is the data directory (default a new one in the test's
	// temporary directory).
	Dir string
}

// StartController starts nimbus serve and waits until /healthz answers.
func StartController(t testing.TB, name string, cfg ControllerConfig) *Controller {
	t.Helper()
	if cfg.Addr == "" {
		cfg.Addr = "127.0.0.1"
	}
	c := &Controller{Dir: cfg.Dir, Addr: cfg.Addr, Ports: cfg.Ports, bin: cfg.Bin, env: cfg.Env}
	if c.Dir == "" {
		c.Dir = filepath.Join(t.TempDir(), name)
	}
	if err := os.MkdirAll(c.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if cfg.CA != "" {
		for _, f := range []string{"ca.pem", "ca-key.pem", "secrets.json"} {
			b, err := os.ReadFile(filepath.Join(cfg.CA, f))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(c.Dir, f), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	// A port found free may be taken before the controller binds it (an
	// outgoing connection's local port, from the same range): ports of
	// the test's choosing are chosen again, a few times.
	for try := 1; ; try++ {
		if cfg.Ports == nil {
			c.Ports = map[string]int{}
			for _, s := range Services {
				c.Ports[s] = FreePort(t, cfg.Addr)
			}
		}
		c.args = []string{"serve", "--data-dir", c.Dir, "--database-url", cfg.DatabaseURL, "--listen", cfg.Addr,
			"--admin-password", AdminPassword, "--demo-password", DemoPassword, "--log-level", "warn"}
		if cfg.PublicHost != "" {
			c.args = append(c.args, "--public-host", cfg.PublicHost)
		}
		for _, s := range Services {
			c.args = append(c.args, "--"+s+"-port", strconv.Itoa(c.Ports[s]))
		}
		c.args = append(c.args, cfg.Args...)
		if c.start(t, name) || cfg.Ports != nil || try == 3 ||
			!strings.Contains(c.Proc.Tail(), "address already in use") {
			break
		}
	}
	c.healthy(t, name)
	return c
}

// Restart starts the controller's process again with the same flags.
func (c *Controller) Restart(t testing.TB, name string) {
	t.Helper()
	c.start(t, name)
	c.healthy(t, name)
}

// start starts the process and waits until it serves or exits; it
// answers whether it serves.
func (c *Controller) start(t testing.TB, name string) bool {
	t.Helper()
	c.Proc = Start(t, name, nil, append([]string{"NIMBUS_DATABASE_URL=", "NIMBUS_DATA_DIR="}, c.env...), c.bin, c.args...)
	WaitFor(t, 60*time.Second, name+" healthy", func() bool { return c.Proc.Exited() || c.Healthz() == http.StatusOK }, c.Proc)
	return !c.Proc.Exited()
}

// healthy fails the test when the process exited.
func (c *Controller) healthy(t testing.TB, name string) {
	t.Helper()
	if c.Proc.Exited() {
		t.Fatalf("%s exited\n%s", name, c.Proc.Tail())
	}
}

// CACert is the controller's CA file.
func (c *Controller) CACert() string { return filepath.Join(c.Dir, "ca.pem") }

// URL is the controller's own URL of a service.
func (c *Controller) URL(service string) string {
	return "https://" + net.JoinHostPort(c.Addr, strconv.Itoa(c.Ports[service]))
}

// Healthz is the status of the controller's compute /healthz (0 when it
// does not answer).
func (c *Controller) Healthz() int {
	if _, err := os.Stat(c.CACert()); err != nil {
		return 0
	}
	client, err := HTTPClient(c.CACert(), 3*time.Second)
	if err != nil {
		return 0
	}
	resp, err := client.Get(c.URL("compute") + "/healthz")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// HTTPClient is a client that trusts the CA in caFile, with a deadline on
// every request.
func HTTPClient(caFile string, timeout time.Duration) (*http.Client, error) {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("no certificate in %s", caFile)
	}
	return &http.Client{Timeout: timeout, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool}, MaxIdleConnsPerHost: 32}}, nil
}

// StartAgent enrols and starts a hypervisor host's agent: a host token
// from the controller whose data directory is ctlDir (on dbURL), then
// nimbus agent reaching the controllers at agentURL (HAProxy's agent
// port), trusting caFile, its state in dir/data, the hosts of its fake
// driver in fleet, with extra flags args.
func StartAgent(t testing.TB, bin, ctlDir, dbURL, agentURL, caFile, dir, fleet string, args ...string) *Proc {
	t.Helper()
	tok, err := exec.Command(bin, "admin", "host", "token", "--data-dir", ctlDir, "--database-url", dbURL).Output()
	if err != nil {
		t.Fatalf("admin host token: %v", err)
	}
	return Start(t, "agent", nil, []string{"NIMBUS_AGENT_TOKEN=" + strings.TrimSpace(string(tok))}, bin,
		append([]string{"agent", "--controller", agentURL, "--ca-cert", caFile, "--data-dir", filepath.Join(dir, "data"),
			"--name", "agent", "--fleet", fleet}, args...)...)
}
