package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"nimbus/internal/cloud"
	"nimbus/internal/compute"
	"nimbus/internal/driver"
)

// benchFlags are the values of nimbus bench's flags, read once parsed.
type benchFlags struct {
	dbURL        *string
	only         *string
	duration     *time.Duration
	workers      *int
	creates      *int
	listSize     *int
	resources    *int
	placeHosts   *int
	placeCreates *int
	panelServers *int
	guestDir     *string
	vmRuns       *int
	attackers    *int
	attackFor    *time.Duration
	wait         *time.Duration
	short        *bool
	cpuProfile   *string
}

// newBenchFlags defines nimbus bench's flags on a new flag set: bench
// parses it, and the flag reference (nimbus docs flags) lists it.
func newBenchFlags() (*flag.FlagSet, *benchFlags) {
	fs := flag.NewFlagSet("bench", flag.ExitOnError)
	bf := &benchFlags{}
	bf.dbURL = fs.String("database-url", "", "database to run on (default: SQLite in a temporary directory)")
	bf.only = fs.String("only", "tokens,create,detail,rss", "comma-separated scenarios: tokens, create, detail, rss, charge, place, panel (the web panel's pages), vm (real VMs: QEMU and the test guest), login-attack (wrong-password clients against nimbus serve)")
	bf.duration = fs.Duration("duration", 5*time.Second, "how long the token scenario runs")
	bf.workers = fs.Int("workers", 16, "concurrent clients")
	bf.creates = fs.Int("creates", 2000, "servers created in the create scenario")
	bf.listSize = fs.Int("servers", 10000, "servers in the store for the detail scenario")
	bf.resources = fs.Int("resources", 100000, "metered servers in the charge scenario")
	bf.placeHosts = fs.Int("place-hosts", 1000, "fake hosts in the place scenario")
	bf.placeCreates = fs.Int("place-creates", 1000, "servers created in the place scenario")
	bf.panelServers = fs.Int("panel-servers", 1000, "servers in the account in the panel scenario")
	bf.guestDir = fs.String("guest", "", "the test guest for the vm scenario (default: test/guest/build.sh's cache)")
	bf.vmRuns = fs.Int("vm-runs", 3, "boots of each kind in the vm scenario")
	bf.attackers = fs.Int("attackers", 128, "concurrent wrong-password clients in the login-attack scenario")
	bf.attackFor = fs.Duration("attack-duration", 10*time.Second, "how long the login-attack scenario attacks before a real login")
	bf.wait = fs.Duration("wait", 5*time.Minute, "how long a scenario waits for its servers to be ACTIVE before it fails")
	bf.short = fs.Bool("short", false, "a short run of every scenario with small counts, to check that each still passes (scripts/test-all runs it); flags given explicitly still apply")
	bf.cpuProfile = fs.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	return fs, bf
}

// bench is Nimbus's own load command. It starts a cloud in this process (on
// loopback, HTTPS, fake driver without delays, a fresh data directory) and
// measures the hot paths the control plane promises, printing one line per
// figure. Every loop is bounded in count and time.
func bench(args []string) error {
	fs, bf := newBenchFlags()
	fs.Parse(args)
	if *bf.short {
		if err := shortFlags(fs); err != nil {
			return err
		}
	}
	dbURL, only, duration, workers, creates, listSize, resources, placeHosts, placeCreates, panelServers, guestDir, vmRuns, attackers, attackFor, wait, cpuProfile := bf.dbURL, bf.only, bf.duration, bf.workers, bf.creates, bf.listSize, bf.resources, bf.placeHosts, bf.placeCreates, bf.panelServers, bf.guestDir, bf.vmRuns, bf.attackers, bf.attackFor, bf.wait, bf.cpuProfile
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	want := map[string]bool{}
	for _, s := range strings.Split(*only, ",") {
		s = strings.TrimSpace(s)
		if !slices.Contains(strings.Split(benchShort["only"], ","), s) {
			return fmt.Errorf("bench: no scenario %q", s)
		}
		want[s] = true
	}

	if want["rss"] {
		if err := benchIdleRSS(); err != nil {
			return err
		}
	}
	if want["login-attack"] {
		if err := benchLoginAttack(max(1, *attackers), *attackFor); err != nil {
			return err
		}
	}
	if want["vm"] {
		if err := benchVM(*guestDir, max(1, *vmRuns)); err != nil {
			return err
		}
	}
	if want["place"] {
		if err := benchPlace(*dbURL, *placeHosts, *placeCreates, *workers, *wait); err != nil {
			return err
		}
	}
	if want["panel"] {
		if err := benchPanel(*dbURL, *panelServers, *workers, *wait); err != nil {
			return err
		}
	}
	if !want["tokens"] && !want["create"] && !want["detail"] && !want["charge"] {
		return nil
	}

	dir, err := os.MkdirTemp("", "nimbus-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	// A fleet big enough that placement never limits the figures.
	var fleet []driver.Host
	for i := range 200 {
		fleet = append(fleet, driver.Host{Name: fmt.Sprintf("bench-%03d", i), VCPUs: 1024, MemoryMB: 4 << 20,
			DiskGB: 1 << 20, Zone: "nova", Hypervisor: "fake", Up: true})
	}
	c, err := cloud.Start(context.Background(), cloud.Config{
		DataDir: dir, DatabaseURL: *dbURL, Listen: "127.0.0.1", Fleet: fleet,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		return err
	}
	defer c.Close()
	b, err := newBenchClient(c, *workers, *wait)
	if err != nil {
		return err
	}
	if want["tokens"] {
		if err := b.tokens(*duration, *workers); err != nil {
			return err
		}
	}
	if want["create"] || want["detail"] {
		if err := b.unlimitedQuota(); err != nil {
			return err
		}
	}
	if want["create"] {
		for _, batch := range []int{1, 20} {
			if err := b.createToActive(*creates, batch, *workers); err != nil {
				return err
			}
		}
	}
	if want["detail"] {
		if err := b.detail(*listSize); err != nil {
			return err
		}
	}
	if want["charge"] {
		if err := benchCharge(c, *resources); err != nil {
			return err
		}
	}
	return nil
}

// benchShort is what --short changes: every scenario, each small enough
// that the whole run takes a minute or two on a 2-CPU machine, and a
// scenario that does not finish fails within a minute instead of five.
var benchShort = map[string]string{
	"only":            "tokens,create,detail,rss,charge,place,panel,login-attack,vm",
	"duration":        "1s",
	"creates":         "200",
	"servers":         "1000",
	"resources":       "5000",
	"place-hosts":     "100",
	"place-creates":   "100",
	"panel-servers":   "100",
	"vm-runs":         "1",
	"attackers":       "16",
	"attack-duration": "1s",
	"wait":            "1m",
}

// shortFlags sets the flags of benchShort that the command line did not.
func shortFlags(fs *flag.FlagSet) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for name, v := range benchShort {
		if given[name] {
			continue
		}
		if err := fs.Set(name, v); err != nil {
			return fmt.Errorf("bench --short: %w", err)
		}
	}
	return nil
}

type benchClient struct {
	c      *cloud.Cloud
	http   *http.Client
	token  string
	admin  string
	flavor string
	image  string
	net    string
	wait   time.Duration // for servers to be ACTIVE
}

func newBenchClient(c *cloud.Cloud, workers int, wait time.Duration) (*benchClient, error) {
	pem, err := os.ReadFile(c.CACertFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	hc := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool}, MaxIdleConnsPerHost: workers * 2, ForceAttemptHTTP2: false,
	}}
	b := &benchClient{c: c, http: hc, wait: wait}
	ctx := context.Background()
	if b.admin, err = c.Identity.Issue(ctx, cloud.AdminUser, c.Secrets.AdminPassword, cloud.AdminProject); err != nil {
		return nil, err
	}
	b.token = b.admin
	return b, nil
}

func (b *benchClient) do(method, url, token string, body any, out any) (int, error) {
	var rd io.Reader
	if body != nil {
		buf, _ := json.Marshal(body)
		rd = bytes.NewReader(buf)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		return 0, err
	}
	req.Header.Set("X-Auth-Token", token)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("OpenStack-API-Version", "compute 2.79")
	resp, err := b.http.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode >= 400 {
		return resp.StatusCode, fmt.Errorf("%s %s: %d %s", method, url, resp.StatusCode, data)
	}
	if out != nil && len(data) > 0 {
		return resp.StatusCode, json.Unmarshal(data, out)
	}
	return resp.StatusCode, nil
}

// tokens measures token validation: authenticated requests whose only work
// is validating the caller's token (GET /v3/auth/tokens with the caller's own
// token as subject), from several keep-alive HTTPS clients.
func (b *benchClient) tokens(d time.Duration, workers int) error {
	// Issue rate first: sequential password logins (argon2id dominates).
	start := time.Now()
	n := 0
	for time.Since(start) < 2*time.Second && n < 200 {
		if _, err := b.c.Identity.Issue(context.Background(), cloud.DemoUser, b.c.Secrets.DemoPassword, cloud.DemoProject); err != nil {
			return err
		}
		n++
	}
	fmt.Printf("token issue (password, in-process):     %8.0f /s\n", float64(n)/time.Since(start).Seconds())

	for _, sc := range []struct {
		name, url string
		subject   bool
	}{
		{"token validation (GET /v3/auth/tokens)", b.c.IdentityURL + "/auth/tokens?nocatalog", true},
		{"authenticated GET (GET /v2.1/flavors)", b.c.ComputeURL + "/flavors", false},
	} {
		var ok, failed atomic.Int64
		deadline := time.Now().Add(d)
		var wg sync.WaitGroup
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(deadline) {
					req, _ := http.NewRequest("GET", sc.url, nil)
					req.Header.Set("X-Auth-Token", b.token)
					if sc.subject {
						req.Header.Set("X-Subject-Token", b.token)
					}
					resp, err := b.http.Do(req)
					if err != nil {
						failed.Add(1)
						continue
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode == 200 {
						ok.Add(1)
					} else {
						failed.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		fmt.Printf("%-40s%8.0f /s  (%d ok, %d failed, %d clients, %s)\n", sc.name+":",
			float64(ok.Load())/d.Seconds(), ok.Load(), failed.Load(), workers, d)
	}
	return nil
}

func (b *benchClient) unlimitedQuota() error {
	p, err := b.c.Identity.ProjectByName(context.Background(), cloud.AdminProject)
	if err != nil {
		return err
	}
	body := map[string]any{"quota_set": map[string]any{"instances": -1, "cores": -1, "ram": -1}}
	if _, err := b.do("PUT", b.c.ComputeURL+"/os-quota-sets/"+p.ID, b.admin, body, nil); err != nil {
		return err
	}
	// A /16 network: the default /24 holds only 253 servers. Ports are
	// quota-limited in Neutron too.
	nq := map[string]any{"quota": map[string]any{"port": -1, "network": -1, "subnet": -1}}
	if _, err := b.do("PUT", b.c.NetworkURL+"/v2.0/quotas/"+p.ID, b.admin, nq, nil); err != nil {
		return err
	}
	var nw struct {
		Network struct {
			ID string `json:"id"`
		} `json:"network"`
	}
	if _, err := b.do("POST", b.c.NetworkURL+"/v2.0/networks", b.admin, map[string]any{"network": map[string]any{"name": "bench"}}, &nw); err != nil {
		return err
	}
	sub := map[string]any{"subnet": map[string]any{"network_id": nw.Network.ID, "cidr": "10.128.0.0/16", "ip_version": 4}}
	if _, err := b.do("POST", b.c.NetworkURL+"/v2.0/subnets", b.admin, sub, nil); err != nil {
		return err
	}
	b.net = nw.Network.ID

	// A Linux image and the smallest flavor that holds it, as a user would pick.
	var images struct {
		Images []struct {
			ID      string `json:"id"`
			MinDisk int    `json:"min_disk"`
			MinRAM  int    `json:"min_ram"`
		} `json:"images"`
	}
	if _, err := b.do("GET", b.c.ImageURL+"/v2/images?os_type=linux&limit=1", b.admin, nil, &images); err != nil {
		return err
	}
	if len(images.Images) == 0 {
		return fmt.Errorf("no Linux image")
	}
	img := images.Images[0]
	b.image = img.ID
	type flavor struct {
		ID    string            `json:"id"`
		VCPUs int               `json:"vcpus"`
		RAM   int               `json:"ram"`
		Disk  int               `json:"disk"`
		Specs map[string]string `json:"extra_specs"`
	}
	var flavors struct {
		Flavors []flavor `json:"flavors"`
	}
	if _, err := b.do("GET", b.c.ComputeURL+"/flavors/detail", b.admin, nil, &flavors); err != nil {
		return err
	}
	slices.SortFunc(flavors.Flavors, func(a, b flavor) int {
		return a.VCPUs*1_000_000 + a.RAM - b.VCPUs*1_000_000 - b.RAM
	})
	for _, f := range flavors.Flavors {
		// Public IPv4 comes from a small pool: leave it out of a bulk test.
		if f.Disk >= img.MinDisk && f.RAM >= img.MinRAM && f.Specs["nimbus:public_ipv4"] != "true" {
			b.flavor = f.ID
			return nil
		}
	}
	return fmt.Errorf("no flavor holds the image")
}

// serverBody asks for exactly count servers: with min_count below
// max_count, compute silently creates fewer (its bound, the quota, the
// funds) and the bench would wait for servers that never come; this way a
// shortfall is the request's error.
func (b *benchClient) serverBody(name string, count int) map[string]any {
	return map[string]any{"server": map[string]any{
		"name": name, "imageRef": b.image, "flavorRef": b.flavor,
		"networks":  []map[string]string{{"uuid": b.net}},
		"min_count": count, "max_count": count,
	}}
}

// countActive returns how many of the project's servers are ACTIVE.
func (b *benchClient) countActive() (int, error) { return b.countStatus("ACTIVE") }

// countStatus returns how many of the project's servers have status.
func (b *benchClient) countStatus(status string) (int, error) {
	n := 0
	marker := ""
	for {
		url := b.c.ComputeURL + "/servers?status=" + status + "&limit=1000"
		if marker != "" {
			url += "&marker=" + marker
		}
		var page struct {
			Servers []struct {
				ID string `json:"id"`
			} `json:"servers"`
		}
		if _, err := b.do("GET", url, b.admin, nil, &page); err != nil {
			return 0, err
		}
		n += len(page.Servers)
		if len(page.Servers) < 1000 {
			return n, nil
		}
		marker = page.Servers[len(page.Servers)-1].ID
	}
}

// createToActive creates n servers, batch per POST (max_count), from
// several clients and measures the time until all are ACTIVE.
func (b *benchClient) createToActive(n, batch, workers int) error {
	before, err := b.countActive()
	if err != nil {
		return err
	}
	start := time.Now()
	var next atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				// The last POST asks only for what is left.
				i := next.Add(int64(batch))
				count := min(int64(batch), int64(n)-(i-int64(batch)))
				if count <= 0 {
					return
				}
				if _, err := b.do("POST", b.c.ComputeURL+"/servers", b.admin, b.serverBody("bench-"+strconv.FormatInt(i, 10), int(count)), nil); err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if e := firstErr.Load(); e != nil {
		return e.(error)
	}
	accepted := time.Since(start)
	// Polling lists every ACTIVE server: keep it rare so it does not take
	// the CPU it measures.
	if err := b.waitActive("create", before+n, 150*time.Millisecond); err != nil {
		return err
	}
	total := time.Since(start)
	fmt.Printf("create accepted, %2d per POST:            %8.0f /s  (%d in %s)\n", batch, float64(n)/accepted.Seconds(), n, accepted.Round(time.Millisecond))
	fmt.Printf("create to ACTIVE, %2d per POST:           %8.0f /s  (%d in %s, fake driver, delay 0)\n", batch, float64(n)/total.Seconds(), n, total.Round(time.Millisecond))
	return nil
}

// waitActive polls every poll until the project has want ACTIVE servers. A
// server in ERROR, or the time running out (b.wait), fails the scenario
// at once rather than leaving it to spin.
func (b *benchClient) waitActive(scenario string, want int, poll time.Duration) error {
	for deadline := time.Now().Add(b.wait); ; time.Sleep(poll) {
		n, err := b.countActive()
		if err != nil {
			return fmt.Errorf("%s: %w", scenario, err)
		}
		if n >= want {
			return nil
		}
		if failed, err := b.countStatus("ERROR"); err != nil || failed > 0 {
			return fmt.Errorf("%s: %d servers in ERROR (%v)", scenario, failed, err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: only %d of %d servers ACTIVE after %s", scenario, n, want, b.wait)
		}
	}
}

// detail fills the store to total servers with multi-create requests, then
// times GET /servers/detail?limit=1000.
func (b *benchClient) detail(total int) error {
	have, err := b.countActive()
	if err != nil {
		return err
	}
	for have < total {
		batch := min(compute.MaxCreateCount, total-have)
		if _, err := b.do("POST", b.c.ComputeURL+"/servers", b.admin, b.serverBody("fill", batch), nil); err != nil {
			return fmt.Errorf("detail: %w", err)
		}
		have += batch
	}
	if err := b.waitActive("detail", total, 100*time.Millisecond); err != nil {
		return err
	}
	// Time the request and the whole body's arrival, not the client's JSON
	// decoding; the page is checked once, outside the timing.
	url := b.c.ComputeURL + "/servers/detail?limit=1000"
	var times []time.Duration
	var body []byte
	for range 30 {
		req, _ := http.NewRequest("GET", url, nil)
		req.Header.Set("X-Auth-Token", b.admin)
		req.Header.Set("OpenStack-API-Version", "compute 2.79")
		start := time.Now()
		resp, err := b.http.Do(req)
		if err != nil {
			return err
		}
		body, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil {
			return err
		}
		times = append(times, time.Since(start))
		if resp.StatusCode != 200 {
			return fmt.Errorf("detail: %d %s", resp.StatusCode, body)
		}
	}
	var page struct {
		Servers []json.RawMessage `json:"servers"`
	}
	if err := json.Unmarshal(body, &page); err != nil || len(page.Servers) != 1000 {
		return fmt.Errorf("detail: page has %d servers (%v)", len(page.Servers), err)
	}
	slices.Sort(times)
	fmt.Printf("GET /servers/detail?limit=1000 (%d in store, %d KB): median %s, p90 %s, max %s\n", total, len(body)/1024,
		times[len(times)/2].Round(100*time.Microsecond), times[len(times)*9/10].Round(100*time.Microsecond),
		times[len(times)-1].Round(100*time.Microsecond))
	return nil
}

// serveChild is `nimbus serve` run as a child process on loopback.
type serveChild struct {
	cmd         *exec.Cmd
	done        chan struct{} // closed when cmd has exited
	dataDir     string
	identityURL string
}

// startServe starts `nimbus serve` with args on a fresh directory and free
// ports and waits until it is healthy; stop it with stop.
func startServe(args ...string) (*serveChild, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "nimbus-serve-")
	if err != nil {
		return nil, err
	}
	// Every listener on a free port: a default one (the panel's 8443)
	// may be another cloud's on this machine.
	ports := make([]string, 9)
	for i := range ports {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		ports[i] = strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
		ln.Close()
	}
	s := &serveChild{dataDir: filepath.Join(dir, "data"), identityURL: "https://127.0.0.1:" + ports[0] + "/v3"}
	s.cmd = exec.Command(exe, append([]string{"serve", "--data-dir", s.dataDir, "--listen", "127.0.0.1",
		"--identity-port", ports[0], "--compute-port", ports[1], "--image-port", ports[2], "--network-port", ports[3],
		"--billing-port", ports[4], "--agent-port", ports[5], "--console-port", ports[6],
		"--volume-port", ports[7], "--panel-port", ports[8], "--log-level", "warn"}, args...)...)
	var stderr bytes.Buffer
	s.cmd.Stdout, s.cmd.Stderr = io.Discard, &stderr
	if err := s.cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	s.done = make(chan struct{})
	go func() { s.cmd.Wait(); close(s.done) }()
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		resp, err := client.Get("https://127.0.0.1:" + ports[0] + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return s, nil
			}
		}
		select {
		case <-s.done:
		default:
			if time.Now().Before(deadline) {
				continue
			}
		}
		// Stopped, the child no longer writes its stderr.
		s.stop()
		return nil, fmt.Errorf("nimbus serve did not become healthy: %s", bytes.TrimSpace(stderr.Bytes()))
	}
}

func (s *serveChild) pid() string { return strconv.Itoa(s.cmd.Process.Pid) }

func (s *serveChild) stop() {
	s.cmd.Process.Signal(os.Interrupt)
	<-s.done
	os.RemoveAll(filepath.Dir(s.dataDir))
}

// benchIdleRSS starts `nimbus serve` as a child, waits for it to settle and
// reads its resident memory.
func benchIdleRSS() error {
	s, err := startServe()
	if err != nil {
		return fmt.Errorf("rss: %w", err)
	}
	defer s.stop()
	time.Sleep(5 * time.Second)
	rss := rssOf(s.pid())
	if rss == 0 {
		return fmt.Errorf("rss: cannot read nimbus serve's resident memory")
	}
	fmt.Printf("idle nimbus serve resident memory:      %d kB\n", rss>>10)
	return nil
}
