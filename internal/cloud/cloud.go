// Package cloud assembles a whole Nimbus controller from its services: it
// opens the store, makes the TLS certificate, bootstraps the first accounts,
// builds identity, compute, image, network, volume, billing and the fleet, and
// serves each on its own HTTPS listener. Unless told otherwise it also runs
// a local agent in the same process, presenting the fake fleet, so that one
// box is a whole cloud. cmd/nimbus and the end-to-end tests both start a
// cloud through it.
package cloud

import (
	"context"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"nimbus/internal/agent"
	"nimbus/internal/api"
	"nimbus/internal/billing"
	"nimbus/internal/blockexport"
	"nimbus/internal/compute"
	"nimbus/internal/console"
	"nimbus/internal/driver"
	"nimbus/internal/driver/fake"
	"nimbus/internal/fleet"
	"nimbus/internal/identity"
	"nimbus/internal/image"
	"nimbus/internal/lease"
	"nimbus/internal/network"
	"nimbus/internal/panel"
	"nimbus/internal/pki"
	"nimbus/internal/scheduler"
	"nimbus/internal/store"
	"nimbus/internal/volume"
)

// Ports are the listening ports of the services; 0 picks a free port.
// Agent is the agent API's, which host agents connect to; Console the
// noVNC console proxy's (internal/console), Panel the web panel's.
type Ports struct {
	Identity, Compute, Image, Network, Volume, Billing, Agent, Console, Panel int
}

// DefaultPorts are the spec's and OpenStack's ports; billing takes the port
// of OpenStack's rating service (CloudKitty), the console proxy Nova's
// nova-novncproxy's.
var DefaultPorts = Ports{Identity: 5000, Compute: 8774, Image: 9292, Network: 9696, Volume: 8776, Billing: 8889, Agent: 8790, Console: 6080, Panel: 8443}

// Config is what a controller needs to start.
type Config struct {
	DataDir     string
	DatabaseURL string // default: SQLite file in DataDir
	Listen      string // address to bind, default 0.0.0.0
	PublicHost  string // host name put in catalog URLs; default from Listen
	Ports       Ports
	// Provider is the provider network the public network's subnet
	// follows (default network.DefaultProvider).
	Provider network.Provider
	// AdminPassword and DemoPassword are used when the accounts are made
	// on first start; empty means generate.
	AdminPassword, DemoPassword string
	TokenTTL                    time.Duration
	// Driver is the local agent's driver: "fake" (the default) or "qemu"
	// (this machine's real VMs, configured by QEMU). Fleet overrides the
	// fake fleet; nil means fake.DefaultFleet. FakeDelay scales the fake
	// driver's delays.
	Driver    string
	Fleet     []driver.Host
	FakeDelay time.Duration
	QEMU      QEMUOptions
	// NoLocalAgent runs a controller alone: its hosts are those of the
	// agents that enrol with it ("nimbus agent"). Otherwise an agent in
	// this process presents the fake fleet over the agent API, and Start
	// returns once its hosts are registered.
	NoLocalAgent bool
	// DownAfter is how long a host may go without a heartbeat before it
	// is down, AgentHeartbeat how often the local agent reports, OpTimeout
	// how long a driver call waits for its agent; 0 means the defaults
	// (60 s, 10 s, 10 min).
	DownAfter, AgentHeartbeat, OpTimeout time.Duration
	// PlainHTTP serves without TLS, for benchmarks that measure the API
	// alone. Never the default.
	PlainHTTP bool
	// TLS chooses the certificate of the public host name (tls.go).
	TLS TLSOptions
	// TrustedProxies are the reverse proxies whose PROXY header or
	// X-Forwarded-For names the client, for limits and logs (api.Proxies).
	TrustedProxies api.Proxies
	// Billing is the operator's billing settings (currency, minimum
	// top-up, default credit limit, presentation currency); its clock and
	// log are the cloud's.
	Billing billing.Config
	// DemoCredit is the demo project's welcome credit in minor units,
	// given once (0: none).
	DemoCredit int64
	// NoDemo makes no demo customer (production); without it the demo
	// customer is made on the first start, and only then.
	NoDemo bool
	// Production is a production start (serve --production): no demo
	// customer, no test payment providers, the operator's or ACME's
	// certificate; the banner says so.
	Production bool
	// MetricsListen is the address of the Prometheus listener (plain
	// HTTP, /metrics and /healthz); "" serves no metrics. The customers'
	// ports never serve them. MetricsToken, when set, is the bearer token
	// a scrape must send.
	MetricsListen, MetricsToken string
	// Scheduler is how hosts are chosen; nil spreads and keeps GPU hosts
	// for GPU flavors.
	Scheduler *scheduler.Policy
	// Identity bounds logins and tokens per user and client address; the
	// zero value limits only concurrent password hashes (nimbus serve's
	// flags default to identity.DefaultLimits).
	Identity identity.Limits
	// HTTP bounds what slow or numerous connections can hold.
	HTTP HTTPLimits
	// Panel configures the web panel.
	Panel PanelOptions
	// Volumes chooses where block storage keeps the volumes' data.
	Volumes VolumeOptions
	// ImageData chooses where the image service keeps image data.
	ImageData ImageOptions
	Log       *slog.Logger
}

// HTTPLimits bound what slow or numerous connections can hold on every
// listener. A zero duration or rate takes DefaultHTTPLimits' value;
// MaxConnsPerIP 0 is no limit.
type HTTPLimits struct {
	// A request body must arrive within BodyGrace plus its size at
	// MinBodyRate bytes per second (api.GuardBodies).
	BodyGrace   time.Duration
	MinBodyRate int64
	// WriteTimeout bounds a request's handling and response on the
	// listeners that never stream (not image, agent or console).
	WriteTimeout time.Duration
	// IdleTimeout closes a kept-alive connection with no request.
	IdleTimeout time.Duration
	// MaxConnsPerIP bounds the open connections from one client address
	// (an IPv6 /64) over all listeners.
	MaxConnsPerIP int
}

// DefaultHTTPLimits are nimbus serve's.
var DefaultHTTPLimits = HTTPLimits{BodyGrace: 30 * time.Second, MinBodyRate: 64 << 10,
	WriteTimeout: 2 * time.Minute, IdleTimeout: 120 * time.Second, MaxConnsPerIP: 256}

func (l HTTPLimits) withDefaults() HTTPLimits {
	d := DefaultHTTPLimits
	if l.BodyGrace <= 0 {
		l.BodyGrace = d.BodyGrace
	}
	if l.MinBodyRate <= 0 {
		l.MinBodyRate = d.MinBodyRate
	}
	if l.WriteTimeout <= 0 {
		l.WriteTimeout = d.WriteTimeout
	}
	if l.IdleTimeout <= 0 {
		l.IdleTimeout = d.IdleTimeout
	}
	return l
}

// Cloud is a running controller.
type Cloud struct {
	Config   Config
	DB       *store.DB
	Identity *identity.Service
	Compute  *compute.Service
	Images   *image.Service
	Networks *network.Service
	Volumes  *volume.Service
	Billing  *billing.Service
	// Fleet is the controller's side of the hosts, and Driver (the same)
	// the driver compute drives.
	Fleet  *fleet.Service
	Driver driver.Driver
	// Agent and Fake are the local agent and its fake driver (nil with
	// NoLocalAgent); tests inject failures through Fake and report a change
	// at once with Agent.Heartbeat.
	Agent *agent.Agent
	Fake  *fake.Driver
	// Panel is the web control panel.
	Panel *panel.Panel
	// Leases owns the work that must happen once, shared with the other
	// controllers of the region (internal/lease).
	Leases *lease.Manager
	// URLs of the services as put in the catalog, and of the agent API;
	// ConsoleURL is the console proxy's base URL, PanelURL the web panel's.
	IdentityURL, ComputeURL, ImageURL, NetworkURL, VolumeURL, BillingURL, AgentURL, ConsoleURL, PanelURL string
	// Files the operator needs.
	CACertFile, CloudsFile string
	// MetricsURL is the metrics listener's /metrics ("" without one).
	MetricsURL string
	// HasDemo reports whether the demo customer exists (made on the first
	// start, unless NoDemo or the operator deleted it).
	HasDemo bool
	Secrets Secrets

	servers     []*http.Server
	cancel      context.CancelFunc
	wg          sync.WaitGroup
	agentCancel context.CancelFunc
	leaseCancel context.CancelFunc
	leaseDone   chan struct{}
	localDriver driver.Driver
	exports     *blockexport.Exporter // volumes served to other hosts
	agentDone   chan struct{}
	conns       *api.ConnLimiter
	certs       *pki.Source      // what every listener presents (tls.go)
	acme        *pki.ACMEManager // nil without ACME
}

// Start brings a controller up. It returns once every listener is bound.
func Start(ctx context.Context, cfg Config) (*Cloud, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	c := &Cloud{Config: cfg, conns: api.NewConnLimiter(cfg.HTTP.MaxConnsPerIP, cfg.TrustedProxies)}
	ok := false
	lns := map[string]net.Listener{} // bound, not yet served
	defer func() {
		if !ok {
			closeAll(lns)
			c.Close()
		}
	}()

	if c.DB, err = store.Open(ctx, cfg.DatabaseURL); err != nil {
		return nil, err
	}
	holder, err := controllerID(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	c.Leases = lease.New(c.DB, lease.Config{Holder: holder, Log: cfg.Log.With("component", "lease")})
	// Bind every listener first: with port 0 the catalog needs the ports
	// the kernel chose.
	if err := c.listen(lns); err != nil {
		return nil, err
	}
	// The agent API is HTTPS even when the services are not: agents'
	// credentials cross the network.
	if err := c.startTLS(); err != nil {
		return nil, err
	}
	agentTLS := c.certs.ServerConfig()
	var tlsCfg *tls.Config
	if !cfg.PlainHTTP {
		tlsCfg = agentTLS
	}
	if err := c.newServices(); err != nil {
		return nil, err
	}
	runCtx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel

	// The agent API comes first: the local agent registers the hosts that
	// bootstrapping compute then gives services.
	c.serve("agent", lns["agent"], withHealth(c.Fleet.Handler(), c), agentTLS)
	delete(lns, "agent")
	c.wg.Add(1)
	go func() { defer c.wg.Done(); c.Fleet.Run(runCtx) }()
	if !cfg.NoLocalAgent {
		if err := c.startLocalAgent(ctx); err != nil {
			return nil, err
		}
	}
	if err := c.setLocalHosts(ctx); err != nil {
		return nil, err
	}
	if err := c.bootstrap(ctx); err != nil {
		return nil, err
	}
	if err := c.Volumes.Bootstrap(ctx); err != nil {
		return nil, fmt.Errorf("cloud: bootstrap volumes: %w", err)
	}

	handlers, err := c.handlers(runCtx)
	if err != nil {
		return nil, err
	}
	if ln, ok := lns["metrics"]; ok {
		c.serve("metrics", ln, metricsHandler(c), nil)
		delete(lns, "metrics")
	}
	for name, ln := range lns {
		c.serve(name, ln, withHealth(handlers[name], c), tlsCfg)
		delete(lns, name)
	}
	c.run(runCtx)
	ok = true
	return c, nil
}

// withDefaults is cfg with its defaults filled in and its data directory
// made.
func (cfg Config) withDefaults() (Config, error) {
	if cfg.DataDir == "" {
		return cfg, errors.New("cloud: no data directory")
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Listen == "" {
		cfg.Listen = "0.0.0.0"
	}
	if cfg.PublicHost == "" {
		cfg.PublicHost = cfg.Listen
		if ip := net.ParseIP(cfg.Listen); ip != nil && ip.IsUnspecified() {
			cfg.PublicHost = "localhost"
		}
	}
	if cfg.TokenTTL == 0 {
		cfg.TokenTTL = time.Hour
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return cfg, fmt.Errorf("cloud: data directory: %w", err)
	}
	cfg.DatabaseURL = DatabaseURL(cfg.DataDir, cfg.DatabaseURL)
	cfg.HTTP = cfg.HTTP.withDefaults()
	return cfg, nil
}

// listen binds every service's listener into lns, and the metrics one
// when asked for, and sets the URLs the catalog gives.
func (c *Cloud) listen(lns map[string]net.Listener) error {
	cfg := c.Config
	for _, p := range []struct {
		name string
		port int
	}{{"identity", cfg.Ports.Identity}, {"compute", cfg.Ports.Compute}, {"image", cfg.Ports.Image}, {"network", cfg.Ports.Network},
		{"volume", cfg.Ports.Volume}, {"billing", cfg.Ports.Billing}, {"agent", cfg.Ports.Agent}, {"console", cfg.Ports.Console}, {"panel", cfg.Ports.Panel}} {
		ln, err := net.Listen("tcp", net.JoinHostPort(cfg.Listen, strconv.Itoa(p.port)))
		if err != nil {
			return fmt.Errorf("cloud: %s listener: %w", p.name, err)
		}
		lns[p.name] = ln
	}
	scheme := "https"
	if cfg.PlainHTTP {
		scheme = "http"
	}
	url := func(name, path string) string {
		port := lns[name].Addr().(*net.TCPAddr).Port
		return scheme + "://" + net.JoinHostPort(cfg.PublicHost, strconv.Itoa(port)) + path
	}
	c.IdentityURL = url("identity", "/v3")
	c.ComputeURL = url("compute", "/v2.1")
	c.ImageURL = url("image", "")
	c.NetworkURL = url("network", "")
	c.VolumeURL = url("volume", "/v3")
	c.BillingURL = url("billing", "")
	c.ConsoleURL = url("console", "")
	c.PanelURL = url("panel", "")
	if cfg.MetricsListen != "" {
		ln, err := net.Listen("tcp", cfg.MetricsListen)
		if err != nil {
			return fmt.Errorf("cloud: metrics listener: %w", err)
		}
		lns["metrics"] = ln
		c.MetricsURL = "http://" + ln.Addr().String() + "/metrics"
	}
	agentPort := strconv.Itoa(lns["agent"].Addr().(*net.TCPAddr).Port)
	c.AgentURL = "https://" + net.JoinHostPort(cfg.PublicHost, agentPort)
	return nil
}

// newServices makes the services on the controller's database and wires
// the calls they make of one another.
func (c *Cloud) newServices() error {
	cfg, db := c.Config, c.DB
	c.Identity = identity.New(db)
	c.Identity.TokenTTL = cfg.TokenTTL
	c.Identity.SetLimits(cfg.Identity)
	c.Identity.SetCatalog([]identity.CatalogService{
		{Type: "identity", Name: "keystone", URL: c.IdentityURL},
		{Type: "compute", Name: "nova", URL: c.ComputeURL},
		{Type: "image", Name: "glance", URL: c.ImageURL},
		{Type: "network", Name: "neutron", URL: c.NetworkURL},
		// python-cinderclient (OSC's volume commands) looks up volumev3,
		// openstacksdk and gophercloud block-storage (or its aliases).
		{Type: "volumev3", Name: "cinderv3", URL: c.VolumeURL},
		{Type: "block-storage", Name: "cinder", URL: c.VolumeURL},
		{Type: "billing", Name: "nimbus-billing", URL: c.BillingURL},
		{Type: "dashboard", Name: "nimbus-panel", URL: c.PanelURL},
	})
	var err error
	if c.Images, err = newImages(cfg, db); err != nil {
		return err
	}
	bcfg := cfg.Billing
	bcfg.Log = cfg.Log
	c.Billing = billing.New(db, bcfg)
	c.Billing.SetLeases(c.Leases)
	// Every service that starts or raises a charge asks billing's gate;
	// an account that runs dry has its servers shelved and its public
	// addresses detached.
	c.Images.SetSpendGate(c.Billing)
	c.Networks = network.New(db)
	c.Networks.SetSpendGate(c.Billing)
	c.Networks.SetProvider(cfg.Provider)
	// The catalog and the public network belong to the operator's project.
	c.Images.SetProjects(c.Identity)
	c.Networks.SetProjects(c.Identity)
	// A project made through Keystone or the panel's registration gets its
	// private network, default security group and billing account in the
	// same transaction.
	c.Identity.AddProjectHook(c.Networks)
	c.Identity.AddProjectHook(c.Billing)
	c.Billing.SetDetacher(c.Networks)
	vcfg, exports, err := volumeConfig(cfg)
	if err != nil {
		return err
	}
	c.exports = exports
	vcfg.DB, vcfg.Images, vcfg.Billing = db, c.Images, c.Billing
	c.Volumes = volume.New(vcfg)
	c.Fleet = fleet.New(db, fleet.Config{DownAfter: cfg.DownAfter, OpTimeout: cfg.OpTimeout, Log: cfg.Log})
	c.Fleet.SetImages(hostImages{s: c.Images, direct: cfg.Volumes.Backend == VolumeBackendRBD})
	c.Driver = c.Fleet
	c.Compute = compute.New(compute.Deps{DB: db, Driver: c.Driver, Images: c.Images, Networks: c.Networks, Volumes: c.Volumes,
		Identity: c.Identity, Billing: c.Billing, Scheduler: cfg.Scheduler, ConsoleURL: c.ConsoleURL, Leases: c.Leases, Log: cfg.Log})
	c.Volumes.SetLeases(c.Leases)
	c.Volumes.SetExtender(c.Compute)   // an in-use volume that grew
	c.Volumes.SetLiveCopier(c.Compute) // a snapshot of a volume a VM here writes
	c.Billing.SetSuspender(c.Compute)
	c.Billing.SetFlavors(c.Compute) // quotes by flavor
	c.Fleet.SetPlacements(c.Compute)
	c.Networks.SetServerOwner(c.Compute)
	c.Fleet.SetDataPlane(newDataPlane(c.Networks, c.Fleet, c.Compute)) // bridged hosts' network state (dataplane.go)
	return nil
}

// handlers are the HTTP handlers of the services' listeners, by name.
func (c *Cloud) handlers(runCtx context.Context) (map[string]http.Handler, error) {
	cfg := c.Config
	handlers := map[string]http.Handler{
		"identity": service("identity", api.RenderKeystone, c.Identity, c.IdentityURL, c.Identity.Routes(), cfg.Log),
		"compute":  c.Compute.API(c.Identity, authRoot(c.IdentityURL)),
		"image":    service("image", api.RenderGlance, c.Identity, c.IdentityURL, c.Images.Routes(), cfg.Log),
		"network":  service("network", api.RenderNeutron, c.Identity, c.IdentityURL, c.Networks.Routes(), cfg.Log),
		"volume":   c.Volumes.API(c.Identity, authRoot(c.IdentityURL)),
		"billing":  service("billing", api.RenderKeystone, c.Identity, c.IdentityURL, c.Billing.Routes(), cfg.Log),
		"console": console.New(console.Config{Tokens: c.Compute.ConsoleTokens(), Context: runCtx,
			Log: cfg.Log.With("component", "console")}),
	}
	var err error
	if c.Panel, err = c.newPanel(); err != nil {
		return nil, err
	}
	handlers["panel"] = c.Panel.Handler()
	// Keystone itself names its versioned URL in WWW-Authenticate; the other
	// services' keystonemiddleware names the root (wire captures 08, 09, 40).
	handlers["identity"].(*api.Service).AuthURL = c.IdentityURL
	// A request on a listener with a write timeout cannot be answered
	// after it: end its context a little before, so that it answers 503
	// and frees its database connection (image data streams have none).
	for name, h := range handlers {
		if s, ok := h.(*api.Service); ok && name != "image" {
			s.Deadline = cfg.HTTP.WriteTimeout - cfg.HTTP.WriteTimeout/10
		}
	}
	return handlers, nil
}

// run starts the controller's background work: the leases, certificate
// renewal, and each service's loops.
func (c *Cloud) run(runCtx context.Context) {
	// The leases are renewed until the work under them has stopped, then
	// given back (Close), so that no step of this controller's is cut
	// off from its commit by its own shutdown.
	leaseCtx, leaseCancel := context.WithCancel(context.Background())
	c.leaseCancel, c.leaseDone = leaseCancel, make(chan struct{})
	go func() { defer close(c.leaseDone); c.Leases.Run(leaseCtx) }()
	c.wg.Add(5)
	go func() { defer c.wg.Done(); c.runTLS(runCtx) }()
	go func() { defer c.wg.Done(); c.Compute.Run(runCtx) }()
	go func() { defer c.wg.Done(); c.Volumes.Run(runCtx) }()
	go func() { defer c.wg.Done(); c.Billing.Run(runCtx) }()
	go func() { defer c.wg.Done(); c.housekeeping(runCtx) }()
}

// serve serves h on ln, over TLS when tlsCfg is set, within the HTTP limits.
func (c *Cloud) serve(name string, ln net.Listener, h http.Handler, tlsCfg *tls.Config) {
	lim := c.Config.HTTP
	srv := &http.Server{
		Handler:           api.GuardBodies(c.Config.TrustedProxies.Handler(h), api.BodyTimeouts{Grace: lim.BodyGrace, MinRate: lim.MinBodyRate}),
		ReadHeaderTimeout: 10 * time.Second,
		// Headers and query strings past this are no client's: a long
		// filter list only makes longer queries.
		MaxHeaderBytes: 64 << 10,
		// GuardBodies moves the read deadline per request; this holds
		// until it runs.
		ReadTimeout: lim.BodyGrace,
		IdleTimeout: lim.IdleTimeout,
		ErrorLog:    slog.NewLogLogger(c.Config.Log.Handler(), slog.LevelWarn),
	}
	// Image data and agents' image streams take as long as they take;
	// the console proxy's websockets last a session.
	if name != "image" && name != "agent" && name != "console" {
		srv.WriteTimeout = lim.WriteTimeout
	}
	ln = c.conns.Wrap(c.Config.TrustedProxies.Listener(ln))
	c.servers = append(c.servers, srv)
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		var err error
		if tlsCfg != nil {
			srv.TLSConfig = tlsCfg.Clone()
			err = srv.ServeTLS(ln, "", "")
		} else {
			err = srv.Serve(ln)
		}
		if err != nil && !errors.Is(err, http.ErrServerClosed) {
			c.Config.Log.Error("listener stopped", "service", name, "error", err)
		}
	}()
}

// localAgentWait bounds how long Start waits for the local agent's hosts.
const localAgentWait = 30 * time.Second

// startLocalAgent runs the in-process agent with the fake fleet: the same
// agent as "nimbus agent", over HTTPS on loopback, with a credential the
// controller makes for it (kept in the data directory like a remote
// agent's). It returns once the agent's hosts are registered and its VMs
// reported, so that compute's start-up reconcile sees them.
func (c *Cloud) startLocalAgent(ctx context.Context) error {
	cfg := c.Config
	if cfg.QEMU.Network != nil && cfg.Driver != "qemu" {
		return errors.New("cloud: bridged networking needs the qemu driver: the fake driver runs no VMs to wire")
	}
	np, err := NewNetPlane(cfg.QEMU)
	if err != nil {
		return err
	}
	if np != nil {
		cfg.QEMU.Wiring = np
	}
	drv, err := newDriver(cfg)
	if err != nil {
		return err
	}
	c.Fake, _ = drv.(*fake.Driver)
	c.localDriver = drv
	id, err := agent.LoadIdentity(cfg.DataDir)
	known := false
	if err == nil {
		if known, err = c.Fleet.AgentExists(ctx, id.AgentID); err != nil {
			return err
		}
	}
	if !known {
		// First start, or a database that does not know the saved agent
		// (a new PostgreSQL database, an install from before the fleet).
		aid, cred, err := c.Fleet.NewAgent(ctx, "local")
		if err != nil {
			return fmt.Errorf("cloud: local agent: %w", err)
		}
		if err := agent.SaveIdentity(cfg.DataDir, agent.Identity{AgentID: aid, Credential: cred, Controller: "local"}); err != nil {
			return err
		}
	}
	port := c.AgentURL[strings.LastIndexByte(c.AgentURL, ':')+1:]
	c.Agent, err = agent.New(agent.Config{
		ControllerURL: "https://" + net.JoinHostPort(loopback(cfg.Listen), port),
		CACertFile:    c.CACertFile, DataDir: cfg.DataDir, Name: "local", Driver: drv,
		Heartbeat: cfg.AgentHeartbeat, Net: np, Log: cfg.Log.With("component", "agent"),
	})
	if err != nil {
		return err
	}
	actx, cancel := context.WithCancel(context.Background())
	c.agentCancel, c.agentDone = cancel, make(chan struct{})
	errc := make(chan error, 1)
	go func() {
		defer close(c.agentDone)
		errc <- c.Agent.Run(actx)
		if np != nil {
			np.Close()
		}
	}()
	t := time.NewTimer(localAgentWait)
	defer t.Stop()
	select {
	case <-c.Agent.Ready():
		return nil
	case err := <-errc:
		return fmt.Errorf("cloud: local agent stopped: %v", err)
	case <-t.C:
		return fmt.Errorf("cloud: the local agent did not register its hosts within %s (see the log)", localAgentWait)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// loopback is the address the local agent dials to reach listen.
func loopback(listen string) string {
	ip := net.ParseIP(listen)
	switch {
	case ip == nil:
		return listen // a host name
	case ip.IsUnspecified() && ip.To4() == nil:
		return "::1"
	case ip.IsUnspecified():
		return "127.0.0.1"
	}
	return listen
}

func closeAll(lns map[string]net.Listener) {
	for _, l := range lns {
		l.Close()
	}
}

// authRoot is the identity URL without /v3, as keystonemiddleware puts it in
// WWW-Authenticate.
func authRoot(identityURL string) string {
	if len(identityURL) > 3 && identityURL[len(identityURL)-3:] == "/v3" {
		return identityURL[:len(identityURL)-3]
	}
	return identityURL
}

func service(name string, render api.ErrorRenderer, auth api.Authenticator, authURL string, routes []api.Route, log *slog.Logger) http.Handler {
	s := api.NewService(name, render, auth)
	s.AuthURL = authRoot(authURL)
	s.Log = log
	s.Handle(routes...)
	return s
}

// newDriver makes the local agent's driver.
func newDriver(cfg Config) (driver.Driver, error) {
	switch cfg.Driver {
	case "", "fake":
		fleet := cfg.Fleet
		if fleet == nil {
			fleet = fake.DefaultFleet()
		}
		return fake.New(fake.Config{Hosts: fleet, Delay: cfg.FakeDelay,
			StateFile: filepath.Join(cfg.DataDir, "fake-fleet.json")})
	case "qemu":
		o := cfg.QEMU
		if o.DataDir == "" {
			o.DataDir = cfg.DataDir
		}
		if o.IP == "" {
			o.IP = cfg.PublicHost
		}
		if o.Log == nil {
			o.Log = cfg.Log.With("component", "qemu")
		}
		return NewQEMUDriver(o)
	}
	return nil, fmt.Errorf("cloud: unknown driver %q (this build has: fake, qemu)", cfg.Driver)
}

// withHealth serves /healthz on every listener, for load balancers; the
// metrics are on their own listener only (metricsHandler), never on a
// customer's port.
func withHealth(h http.Handler, c *Cloud) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthz" {
			c.health(w, r)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// health answers whether this controller reaches its database.
func (c *Cloud) health(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	var one int
	if err := c.DB.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil {
		api.WriteJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "unhealthy", "database": err.Error()})
		return
	}
	api.WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// metricsHandler serves the metrics listener: /metrics, behind
// MetricsToken when one is set, and /healthz. The metrics are the
// process-wide ones (requests, latencies, Go runtime) plus this cloud's
// own collectors, kept in a registry of its own so that tests can run
// several clouds in one process.
func metricsHandler(c *Cloud) http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(c.Compute.Collector())
	metrics := promhttp.HandlerFor(prometheus.Gatherers{prometheus.DefaultGatherer, reg}, promhttp.HandlerOpts{})
	want := []byte("Bearer " + c.Config.MetricsToken)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/healthz":
			c.health(w, r)
		case "/metrics":
			if c.Config.MetricsToken != "" && subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
				w.Header().Set("WWW-Authenticate", `Bearer realm="nimbus-metrics"`)
				http.Error(w, "a bearer token is required", http.StatusUnauthorized)
				return
			}
			metrics.ServeHTTP(w, r)
		default:
			http.NotFound(w, r)
		}
	})
}

// housekeeping purges expired tokens and panel sessions every 10
// minutes, on one controller of the region at a time.
func (c *Cloud) housekeeping(ctx context.Context) {
	c.Leases.Loop(ctx, lease.Job{Name: "cloud-housekeeping", Next: lease.Every(10 * time.Minute), Check: 10 * time.Minute,
		Run: func(ctx context.Context) error {
			if err := c.Identity.PurgeExpired(ctx); err != nil {
				return fmt.Errorf("token purge: %w", err)
			}
			if err := c.Panel.PurgeSessions(ctx); err != nil {
				return fmt.Errorf("panel session purge: %w", err)
			}
			return nil
		}})
}

// controllerIDFile keeps the controller's name in its data directory:
// the holder of its leases, the same across restarts, so that a
// restarted controller takes its own work back at once.
const controllerIDFile = "controller-id"

// controllerID is the controller's lease holder name, made at first start
// from the host name and a random part.
func controllerID(dataDir string) (string, error) {
	path := filepath.Join(dataDir, controllerIDFile)
	if b, err := os.ReadFile(path); err == nil {
		if id := strings.TrimSpace(string(b)); id != "" {
			return id, nil
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("cloud: controller id: %w", err)
	}
	host, _ := os.Hostname()
	id := lease.NewHolder(host)
	if err := os.WriteFile(path, []byte(id+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("cloud: controller id: %w", err)
	}
	return id, nil
}

// Close stops the local agent, the listeners and loops, and closes the
// store. Work under way stays recorded and resumes after a restart.
func (c *Cloud) Close() error {
	if c.agentCancel != nil {
		c.agentCancel()
		<-c.agentDone
	}
	if cl, ok := c.localDriver.(io.Closer); ok {
		cl.Close() // stops watching VMs; they run on, as under a restarted agent
	}
	if c.Fleet != nil {
		c.Fleet.Close() // ends agents' long-polls, which would hold Shutdown up
	}
	for _, s := range c.servers {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		s.Shutdown(ctx)
		cancel()
	}
	if c.cancel != nil {
		c.cancel()
	}
	c.wg.Wait()
	if c.leaseCancel != nil {
		c.leaseCancel()
		<-c.leaseDone
	}
	if c.exports != nil {
		c.exports.Close() // the volume service re-exports at its next start
	}
	if c.DB != nil {
		return c.DB.Close()
	}
	return nil
}
