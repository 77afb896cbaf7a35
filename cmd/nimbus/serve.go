package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/mail"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/billing"
	"nimbus/internal/cloud"
	"nimbus/internal/driver/fake"
	"nimbus/internal/driver/qemu"
	"nimbus/internal/fleet"
	"nimbus/internal/identity"
	"nimbus/internal/image"
	"nimbus/internal/network"
	"nimbus/internal/panel"
	"nimbus/internal/pki"
	"nimbus/internal/scheduler"
	"nimbus/internal/version"
)

func defaultDataDir() string { return dataDirFor("NIMBUS_DATA_DIR", "nimbus") }

// dataDirFor is a command's default data directory: $env when set, else
// /var/lib/<name> as root, else <name> in the user's data directory.
func dataDirFor(env, name string) string {
	if d := os.Getenv(env); d != "" {
		return d
	}
	if os.Geteuid() == 0 {
		return filepath.Join("/var/lib", name)
	}
	if d := os.Getenv("XDG_DATA_HOME"); d != "" {
		return filepath.Join(d, name)
	}
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".local", "share", name)
}

// checkServeFlags refuses the first flag out of its range, naming it.
// agentOnlyFlags configure serve's local agent alone: the controller
// itself does not read them.
var agentOnlyFlags = []string{"driver", "fleet", "fake-delay", "accel", "reserved-cpus", "reserved-memory-mb",
	"access-host", "qemu-user", "console-listen", "no-sandbox",
	"network-mode", "provider-bridge", "provider-interface", "underlay-mtu", "netns-prefix"}

// localAgentFlags refuses, with --no-local-agent, a flag that only the
// local agent would have read: silently ignored, it would leave an
// operator believing the hosts run as they asked.
func localAgentFlags(fs *flag.FlagSet, noLocalAgent bool) error {
	if !noLocalAgent {
		return nil
	}
	var set []string
	fs.Visit(func(f *flag.Flag) {
		if slices.Contains(agentOnlyFlags, f.Name) {
			set = append(set, "--"+f.Name)
		}
	})
	if len(set) > 0 {
		return fmt.Errorf("%s configure the local agent, which --no-local-agent turns off: give them to each host's nimbus agent",
			strings.Join(set, ", "))
	}
	return nil
}

// flagRule refuses flag, saying what it must be, when bad.
type flagRule struct {
	bad        bool
	flag, must string
}

// tlsRules are the TLS flags' rules: the operator's certificate or ACME,
// not both, each for a --public-host that is a DNS name (a client asking
// by IP address sends no name to choose a certificate by).
func tlsRules(cfg *cloud.Config) []flagRule {
	own, acme := cfg.TLS.CertFile != "" || cfg.TLS.KeyFile != "", cfg.TLS.ACME != nil
	var email, dir string
	if acme {
		email, dir = cfg.TLS.ACME.Email, cfg.TLS.ACME.Directory
	}
	addr, err := mail.ParseAddress(email)
	return []flagRule{
		{(cfg.TLS.CertFile == "") != (cfg.TLS.KeyFile == ""), "--tls-cert", "and --tls-key go together"},
		{own && acme, "--tls-cert", "and --acme-email are two ways to the same certificate: give one"},
		{(own || acme) && !pki.IsHostName(cfg.PublicHost), "--public-host", "must be the DNS name of the certificate (--tls-cert, --acme-email)"},
		{acme && (err != nil || addr.Address != email || addr.Name != "" || len(email) > 254), "--acme-email", "must be an e-mail address"},
		{acme && !strings.HasPrefix(dir, "https://"), "--acme-directory", "must be an https:// URL"},
	}
}

// productionRules are what --production asks: money is real and
// customers' browsers trust the certificate.
func productionRules(cfg *cloud.Config) []flagRule {
	if !cfg.Production {
		return nil
	}
	return []flagRule{
		{cfg.Billing.TestPayments, "--billing-test-payments", "is refused by --production: its providers credit money nobody paid"},
		{cfg.TLS.CertFile == "" && cfg.TLS.ACME == nil, "--production", "needs a certificate customers' browsers trust: --tls-cert and --tls-key, or --acme-email"},
		{cfg.PlainHTTP, "--production", "serves HTTPS only"},
		{os.Getenv(faultChargePause) != "", faultChargePause, "is a fault test's pause inside billing's charging transactions: refused by --production"},
	}
}

// faultChargePause names the environment variable (a duration) that makes
// each charging transaction wait, after its inserts and before its commit,
// so that a fault test can kill the controller there
// (test/e2e/charging_faults_test.go). --production refuses it, and a
// controller that honours it says so in its log at every pause.
const faultChargePause = "NIMBUS_FAULT_CHARGE_PAUSE"

// faultHooks installs the fault tests' hooks that the environment asks for.
func faultHooks(cfg *cloud.Config, log *slog.Logger) error {
	v := os.Getenv(faultChargePause)
	if v == "" {
		return nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return fmt.Errorf("%s: want a positive duration, got %q", faultChargePause, v)
	}
	cfg.Billing.BeforeCommit = func() {
		log.Warn("billing: fault test pause before commit", "env", faultChargePause, "pause", d)
		time.Sleep(d)
	}
	return nil
}

func checkServeFlags(cfg *cloud.Config) error {
	const positive, notNegative = "must be positive", "must not be negative"
	id, b := cfg.Identity, cfg.Billing
	upTo := func(lo int64, hi string) string { return fmt.Sprintf("must be from %d to %s", lo, hi) }
	maxAmount := strconv.FormatInt(billing.MaxAmount, 10)
	rules := []flagRule{
		{cfg.DownAfter <= 0, "--down-after", positive},
		{cfg.AgentHeartbeat <= 0, "--heartbeat", positive},
		{cfg.OpTimeout <= 0, "--op-timeout", positive},
		{cfg.Volumes.Backend != cloud.VolumeBackendFile && cfg.Volumes.Backend != cloud.VolumeBackendRBD && cfg.Volumes.Backend != "", "--volume-backend", "must be file or rbd"},
		{cfg.ImageData.Backend != image.BackendFile && cfg.ImageData.Backend != image.BackendRBD && cfg.ImageData.Backend != "", "--image-backend", "must be file or rbd"},
		{id.LockoutFailureAttempts < 0, "--lockout-failure-attempts", notNegative},
		{id.LockoutDuration < 0, "--lockout-duration", notNegative},
		{id.LoginFailuresPerAddress < 0, "--login-failures-per-ip", notNegative},
		{id.LoginFailuresPerAddress > 0 && id.LoginFailureWindow <= 0, "--login-failure-window", positive},
		{!(id.TokenRate >= 0), "--token-rate", notNegative}, // NaN too
		{id.TokenBurst < 0, "--token-burst", notNegative},
		{id.MaxTokensPerUser < 0, "--max-tokens-per-user", notNegative},
		{id.PasswordHashes < 0, "--password-hashes", notNegative},
		{id.ReceiptsPerAddress < 0, "--receipts-per-ip", notNegative},
		{cfg.HTTP.MaxConnsPerIP < 0, "--max-conns-per-ip", notNegative},
		{b.MinTopup < 1, "--billing-min-topup", positive},
		{b.MaxTopup < b.MinTopup, "--billing-max-topup", "must be at least --billing-min-topup"},
		{b.MaxBalance < 1 || b.MaxBalance > billing.MaxAmount, "--billing-max-balance", upTo(1, maxAmount)},
		{b.DefaultCreditLimit < 0 || b.DefaultCreditLimit > billing.MaxAmount, "--billing-credit-limit", upTo(0, maxAmount)},
		{cfg.DemoCredit < 0 || cfg.DemoCredit > b.MaxBalance, "--demo-credit", upTo(0, "--billing-max-balance")},
		{cfg.MetricsListen != "" && !loopback(cfg.MetricsListen) && cfg.MetricsToken == "", "--metrics-token",
			"is required when --metrics-listen is not a loopback address: metrics name every project's spend"},
	}
	rules = append(rules, tlsRules(cfg)...)
	rules = append(rules, productionRules(cfg)...)
	for _, r := range rules {
		if r.bad {
			return fmt.Errorf("%s %s", r.flag, r.must)
		}
	}
	if err := cfg.Provider.Check(); err != nil {
		return fmt.Errorf("--public-cidr, --public-gateway, --public-pool: %w", err)
	}
	return nil
}

// loopback reports whether a listen address (host:port) is on loopback.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// serveFlags are the values of nimbus serve's flags, read once parsed.
type serveFlags struct {
	cfg                          cloud.Config
	acme                         pki.ACME
	proxies                      []string
	qf                           qemuFlags
	nf                           netFlags
	fleetFile, weigher, logLevel *string
	keepGPU                      *bool
}

// newServeFlags defines nimbus serve's flags on a new flag set: serve
// parses it, and the flag reference (nimbus docs flags) lists it.
func newServeFlags() (*flag.FlagSet, *serveFlags) {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	sf := &serveFlags{cfg: cloud.Config{Ports: cloud.DefaultPorts}}
	cfg := &sf.cfg
	fs.StringVar(&cfg.DataDir, "data-dir", defaultDataDir(), "directory for the database, certificates and client files (env NIMBUS_DATA_DIR)")
	fs.StringVar(&cfg.DatabaseURL, "database-url", os.Getenv("NIMBUS_DATABASE_URL"), "postgres://… to use PostgreSQL; default SQLite in the data directory (env NIMBUS_DATABASE_URL)")
	fs.StringVar(&cfg.Listen, "listen", "0.0.0.0", "address to listen on")
	fs.StringVar(&cfg.PublicHost, "public-host", "", "host name clients use, put in the catalog and the certificate (default: the listen address, or localhost)")
	fs.StringVar(&cfg.TLS.CertFile, "tls-cert", "", "your certificate for --public-host (PEM, then its chain), used as given and read again when it changes; default a certificate of Nimbus's own CA")
	fs.StringVar(&cfg.TLS.KeyFile, "tls-key", "", "the key of --tls-cert (PEM)")
	acme := &sf.acme
	fs.StringVar(&acme.Email, "acme-email", "", "have --public-host's certificate issued and renewed by an ACME CA (TLS-ALPN-01: port 443 must reach a listener), with this contact address")
	fs.StringVar(&acme.Directory, "acme-directory", pki.LetsEncrypt, "with --acme-email: the ACME CA's directory URL (Let's Encrypt's staging: https://acme-staging-v02.api.letsencrypt.org/directory)")
	fs.Func("trusted-proxies", "CIDRs or addresses of reverse proxies whose PROXY protocol header or X-Forwarded-For names the client, for limits and logs (comma-separated or repeated)", func(v string) error {
		sf.proxies = append(sf.proxies, strings.Split(v, ",")...)
		return nil
	})
	fs.IntVar(&cfg.Ports.Identity, "identity-port", cfg.Ports.Identity, "identity (Keystone v3) port")
	fs.IntVar(&cfg.Ports.Compute, "compute-port", cfg.Ports.Compute, "compute (Nova v2.1) port")
	fs.IntVar(&cfg.Ports.Image, "image-port", cfg.Ports.Image, "image (Glance v2) port")
	fs.IntVar(&cfg.Ports.Network, "network-port", cfg.Ports.Network, "network (Neutron v2.0) port")
	fs.IntVar(&cfg.Ports.Volume, "volume-port", cfg.Ports.Volume, "block storage (Cinder v3) port")
	fs.IntVar(&cfg.Ports.Billing, "billing-port", cfg.Ports.Billing, "billing API port")
	fs.IntVar(&cfg.Ports.Agent, "agent-port", cfg.Ports.Agent, "agent API port, where host agents connect")
	fs.IntVar(&cfg.Ports.Console, "console-port", cfg.Ports.Console, "console proxy (noVNC websocket) port")
	fs.IntVar(&cfg.Ports.Panel, "panel-port", cfg.Ports.Panel, "web control panel (HTTPS) port")
	fs.StringVar(&cfg.Panel.SMTPURL, "smtp-url", os.Getenv("NIMBUS_SMTP_URL"), "smtp://user:password@host:port?from=address for the panel's e-mail (sign-up verification, password reset); default: the links are written to the log (env NIMBUS_SMTP_URL)")
	fs.StringVar(&cfg.Panel.Support.Messenger, "support-messenger", "", "the operator's messenger contact shown on the panel's support page, until changed there or with nimbus admin support")
	fs.StringVar(&cfg.Panel.Support.Email, "support-email", "", "the operator's support e-mail address shown on the panel")
	fs.StringVar(&cfg.Panel.Support.Phone, "support-phone", "", "the operator's support telephone shown on the panel")
	fs.StringVar(&cfg.Panel.Support.Hours, "support-hours", "", "the operator's support hours shown on the panel")
	fs.IntVar(&cfg.Panel.SupportLimits.Open, "support-max-open", panel.DefaultSupportLimits.Open, "how many support requests one project may have open at once in the panel")
	fs.IntVar(&cfg.Panel.SupportLimits.PerHour, "support-max-per-hour", panel.DefaultSupportLimits.PerHour, "how many support requests one project may send in an hour in the panel")
	fs.BoolVar(&cfg.NoLocalAgent, "no-local-agent", false, "run the controller alone: no local agent with the fake fleet; hosts come from nimbus agent")
	fs.DurationVar(&cfg.DownAfter, "down-after", fleet.DefaultDownAfter, "a host not heard from for this long is down")
	fs.DurationVar(&cfg.AgentHeartbeat, "heartbeat", 10*time.Second, "how often the local agent reports")
	fs.DurationVar(&cfg.OpTimeout, "op-timeout", fleet.DefaultOpTimeout, "how long a hypervisor operation may wait for its host's agent")
	fs.StringVar(&cfg.AdminPassword, "admin-password", os.Getenv("NIMBUS_ADMIN_PASSWORD"), "admin password on first start; default generated (env NIMBUS_ADMIN_PASSWORD)")
	fs.StringVar(&cfg.DemoPassword, "demo-password", os.Getenv("NIMBUS_DEMO_PASSWORD"), "demo password on first start; default generated (env NIMBUS_DEMO_PASSWORD)")
	fs.DurationVar(&cfg.TokenTTL, "token-ttl", time.Hour, "token lifetime")
	cfg.Identity, cfg.HTTP = identity.DefaultLimits, cloud.DefaultHTTPLimits
	fs.IntVar(&cfg.Identity.LockoutFailureAttempts, "lockout-failure-attempts", cfg.Identity.LockoutFailureAttempts, "failed password checks in a row that lock a user (Keystone's lockout_failure_attempts; 0: never)")
	fs.DurationVar(&cfg.Identity.LockoutDuration, "lockout-duration", cfg.Identity.LockoutDuration, "how long a locked user stays locked after its last failure (0: until an admin enables it)")
	fs.IntVar(&cfg.Identity.LoginFailuresPerAddress, "login-failures-per-ip", cfg.Identity.LoginFailuresPerAddress, "failed logins from one client address within --login-failure-window before it gets 429 (0: no limit)")
	fs.DurationVar(&cfg.Identity.LoginFailureWindow, "login-failure-window", cfg.Identity.LoginFailureWindow, "the sliding window of --login-failures-per-ip")
	fs.Float64Var(&cfg.Identity.TokenRate, "token-rate", cfg.Identity.TokenRate, "tokens per second one user may be issued on average (0: no limit)")
	fs.IntVar(&cfg.Identity.TokenBurst, "token-burst", cfg.Identity.TokenBurst, "tokens one user may be issued at once beyond --token-rate")
	fs.IntVar(&cfg.Identity.MaxTokensPerUser, "max-tokens-per-user", cfg.Identity.MaxTokensPerUser, "live tokens per user; a new one revokes the oldest (0: no limit)")
	fs.IntVar(&cfg.Identity.PasswordHashes, "password-hashes", 0, "password hashes computed at once, 19 MiB each (0: one per CPU)")
	fs.IntVar(&cfg.Identity.ReceiptsPerAddress, "receipts-per-ip", cfg.Identity.ReceiptsPerAddress, "sign-ins from one client address waiting for a second factor at once; more get 429 (0: no limit)")
	fs.DurationVar(&cfg.HTTP.BodyGrace, "body-timeout", cfg.HTTP.BodyGrace, "time any request body may take, plus its size at --min-body-rate")
	fs.Int64Var(&cfg.HTTP.MinBodyRate, "min-body-rate", cfg.HTTP.MinBodyRate, "slowest request body accepted beyond --body-timeout, in bytes per second")
	fs.DurationVar(&cfg.HTTP.WriteTimeout, "write-timeout", cfg.HTTP.WriteTimeout, "time to handle a request and send its response (not image data, agents or the console)")
	fs.DurationVar(&cfg.HTTP.IdleTimeout, "idle-timeout", cfg.HTTP.IdleTimeout, "how long a kept-alive connection may wait for its next request")
	fs.IntVar(&cfg.HTTP.MaxConnsPerIP, "max-conns-per-ip", cfg.HTTP.MaxConnsPerIP, "open connections per client address (IPv6: per /64) over all listeners (0: no limit)")
	fs.StringVar(&cfg.Driver, "driver", "fake", "the local agent's hypervisor driver: fake (a simulated fleet) or qemu (real VMs on this machine)")
	fs.StringVar(&cfg.Volumes.Backend, "volume-backend", cloud.VolumeBackendFile, "where volumes live: file (files in the data directory, served to other hosts over NBD) or rbd (RBD images in a Ceph pool, see --rbd-*)")
	fs.StringVar(&cfg.ImageData.Backend, "image-backend", image.BackendFile, "where image data lives: file (files in the data directory, this controller's alone) or rbd (RBD images in a Ceph pool every controller reaches, see --rbd-image-pool and --rbd-*)")
	fs.StringVar(&cfg.ImageData.Pool, "rbd-image-pool", "images", "with --image-backend rbd: the pool images live in, each with a protected snapshot volumes are cloned from")
	fs.StringVar(&cfg.Volumes.RBD.Conf, "rbd-conf", "/etc/ceph/ceph.conf", "with --volume-backend rbd or --image-backend rbd: the Ceph cluster's ceph.conf")
	fs.StringVar(&cfg.Volumes.RBD.User, "rbd-user", "cinder", "with --volume-backend rbd or --image-backend rbd: the Ceph client's name, without client.")
	fs.StringVar(&cfg.Volumes.RBD.Keyring, "rbd-keyring", "", "with --volume-backend rbd or --image-backend rbd: the client's keyring (default /etc/ceph/ceph.client.<rbd-user>.keyring)")
	fs.StringVar(&cfg.Volumes.RBD.Pool, "rbd-pool", "volumes", "with --volume-backend rbd: the pool volumes and their snapshots live in")
	fs.StringVar(&cfg.Volumes.RBD.BackupPool, "rbd-backup-pool", "backups", "with --volume-backend rbd: the pool volume backups are stored in")
	sf.qf.register(fs)
	sf.nf.register(fs, true)
	sf.fleetFile = fs.String("fleet", "", "JSON file describing the local agent's fake hosts (default: a demo fleet)")
	fs.DurationVar(&cfg.FakeDelay, "fake-delay", 500*time.Millisecond, "how long the local agent's fake driver takes per step")
	fs.StringVar(&cfg.Billing.Currency, "billing-currency", "RUB", "ISO 4217 code of all amounts")
	fs.Int64Var(&cfg.Billing.MinTopup, "billing-min-topup", 10000, "smallest top-up, in minor units (10000 = 100.00)")
	fs.Int64Var(&cfg.Billing.DefaultCreditLimit, "billing-credit-limit", 0, "credit limit of new accounts, in minor units")
	fs.StringVar(&cfg.Billing.PresentationCurrency, "billing-presentation-currency", "USD", "a second currency shown beside amounts, as the spec's English presentation does (empty: none)")
	fs.StringVar(&cfg.Billing.PresentationRate, "billing-presentation-rate", "0.011", "major units of the presentation currency per major unit of the billing currency")
	fs.Int64Var(&cfg.Billing.MaxTopup, "billing-max-topup", 100_000_000, "largest top-up, in minor units (100000000 = 1,000,000.00)")
	fs.Int64Var(&cfg.Billing.MaxBalance, "billing-max-balance", 10_000_000_000, "largest balance a credit may bring an account to, in minor units (10000000000 = 100,000,000.00)")
	fs.BoolVar(&cfg.Billing.TestPayments, "billing-test-payments", false, "offer the simulated payment providers (test, webhook-test), which credit money never paid: demos and tests only")
	fs.Int64Var(&cfg.DemoCredit, "demo-credit", 100000, "the demo project's welcome credit on first start, in minor units")
	fs.StringVar(&cfg.MetricsListen, "metrics-listen", "", "address of the Prometheus metrics listener, e.g. 127.0.0.1:9180 (plain HTTP: /metrics, /healthz); empty for none. The customers' ports never serve metrics")
	fs.StringVar(&cfg.MetricsToken, "metrics-token", os.Getenv("NIMBUS_METRICS_TOKEN"), "bearer token a metrics scrape must send (env NIMBUS_METRICS_TOKEN); needed when --metrics-listen is not on loopback")
	fs.BoolVar(&cfg.NoDemo, "no-demo", false, "make no demo customer (it is made on the first start only, and not again once deleted)")
	fs.BoolVar(&cfg.Production, "production", false, "a production start: no demo customer, the test payment providers refused, and a certificate of the operator's (--tls-cert) or ACME's (--acme-email) required")
	fs.StringVar(&cfg.Provider.CIDR, "public-cidr", network.DefaultProvider.CIDR, "the provider network's IPv4 CIDR, where floating IPs and routers' gateways live: the public network's subnet follows it")
	fs.StringVar(&cfg.Provider.Gateway, "public-gateway", network.DefaultProvider.Gateway, "the provider network's own router, the next hop of routers' gateways")
	fs.Func("public-pool", "a range start-end of --public-cidr given out as public addresses; repeat for more (default: the whole CIDR but the gateway)", func(v string) error {
		cfg.Provider.Pools = append(cfg.Provider.Pools, v)
		return nil
	})
	sf.weigher = fs.String("scheduler-weigher", "spread", "how hosts are chosen: spread (even load) or pack (fill hosts, keep whole hosts free)")
	sf.keepGPU = fs.Bool("scheduler-keep-gpu-hosts", true, "keep GPU hosts for GPU flavors: other servers go there only when nothing else fits")
	sf.logLevel = fs.String("log-level", "info", "debug, info, warn or error")
	return fs, sf
}

func serve(args []string) error {
	fs, sf := newServeFlags()
	fs.Parse(args)
	cfg, acme, proxies, qf, nf := sf.cfg, sf.acme, sf.proxies, sf.qf, sf.nf
	fleetFile, weigher, keepGPU, logLevel := sf.fleetFile, sf.weigher, sf.keepGPU, sf.logLevel
	if err := localAgentFlags(fs, cfg.NoLocalAgent); err != nil {
		return err
	}
	if acme.Email != "" {
		cfg.TLS.ACME = &acme
	} else if isSet(fs, "acme-directory") {
		return errors.New("--acme-directory goes with --acme-email, which turns ACME on")
	}
	var err error
	if cfg.TrustedProxies, err = api.ParseProxies(proxies); err != nil {
		return fmt.Errorf("--trusted-proxies: %w", err)
	}
	policy, err := scheduler.ParsePolicy(*weigher, *keepGPU)
	if err != nil {
		return fmt.Errorf("--scheduler-weigher: %w", err)
	}
	cfg.Scheduler = &policy
	if cfg.QEMU, err = qf.options(); err != nil {
		return err
	}
	if cfg.QEMU.Network, err = nf.options(cfg.Driver, nf.hostIP); err != nil {
		return err
	}
	cfg.QEMU.IP = nf.hostIP
	if cfg.Billing.PresentationCurrency != "" {
		if _, err := billing.ParseRate(cfg.Billing.PresentationRate); err != nil {
			return fmt.Errorf("--billing-presentation-rate: %w", err)
		}
	}
	if cfg.Production {
		cfg.NoDemo = true
	}
	if err := checkServeFlags(&cfg); err != nil {
		return err
	}

	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: lvl}))
	slog.SetDefault(log)
	cfg.Log = log
	if err := faultHooks(&cfg, log); err != nil {
		return err
	}
	if *fleetFile != "" {
		hosts, err := fake.LoadFleet(*fleetFile)
		if err != nil {
			return err
		}
		cfg.Fleet = hosts
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	c, err := cloud.Start(ctx, cfg)
	if err != nil {
		return err
	}
	panelNote, clouds, try := fmt.Sprintf("the demo customer signs in as %s, password in %s", cloud.DemoUser,
		filepath.Join(cfg.DataDir, "secrets.json")), "clouds nimbus-admin and nimbus-demo", "nimbus-demo"
	if !c.HasDemo {
		panelNote, clouds, try = "no demo customer", "cloud nimbus-admin", "nimbus-admin"
	}
	mode := "demo and evaluation: the built-in CA unless given a certificate; --production for real customers"
	if cfg.Production {
		mode = "production: no demo customer, the test payment providers refused, the certificate below"
	} else if cfg.Billing.TestPayments {
		mode = "demo and evaluation, with the simulated payment providers (--billing-test-payments: no real money)"
	}
	fmt.Printf(`Nimbus %s is running.
  mode      %s
  identity  %s
  compute   %s
  image     %s
  network   %s
  volume    %s
  billing   %s
  agents    %s
  console   %s
  panel     %s  (%s)
  driver    %s
  CA file   %s
  TLS       %s
  clouds    %s  (%s)

Try:
  export OS_CLIENT_CONFIG_FILE=%s
  openstack --os-cloud %s server list
`, version.String(), mode, c.IdentityURL, c.ComputeURL, c.ImageURL, c.NetworkURL, c.VolumeURL, c.BillingURL, c.AgentURL, c.ConsoleURL,
		c.PanelURL, panelNote, driverLine(c, cfg), c.CACertFile, c.TLSSummary(), c.CloudsFile, clouds, c.CloudsFile, try)
	log.Info("nimbus started", "data_dir", cfg.DataDir, "identity", c.IdentityURL, "clouds_yaml", c.CloudsFile)
	<-ctx.Done()
	log.Info("nimbus stopping")
	return c.Close()
}

// isSet reports whether the flag name was given.
func isSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// driverLine says what runs the servers: the local agent's driver and, for
// qemu, its accelerator with the reason (a fall back from KVM to TCG
// says why), or that hosts come from agents.
func driverLine(c *cloud.Cloud, cfg cloud.Config) string {
	if cfg.NoLocalAgent {
		return "none here (--no-local-agent): hosts come from nimbus agent"
	}
	if accel, reason, ok := c.LocalAccel(); ok {
		return fmt.Sprintf("qemu, %s (%s)", qemu.HypervisorType(accel), reason)
	}
	return "fake: a simulated fleet (--driver qemu for real VMs)"
}
