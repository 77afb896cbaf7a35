package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"nimbus/internal/billing"
	"nimbus/internal/cloud"
	"nimbus/internal/driver/fake"
	"nimbus/internal/driver/qemu"
	"nimbus/internal/fleet"
	"nimbus/internal/identity"
	"nimbus/internal/network"
	"nimbus/internal/panel"
	"nimbus/internal/scheduler"
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

// parsePrefixes reads "10.0.0.5,192.0.2.0/24,2001:db8::/64": an address
// alone is its own /32 or /128.
func parsePrefixes(v string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range strings.Split(v, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if a, err := netip.ParseAddr(f); err == nil {
			out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
			continue
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			return nil, fmt.Errorf("%q is neither an address nor a CIDR", f)
		}
		out = append(out, p.Masked())
	}
	return out, nil
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

func checkServeFlags(cfg *cloud.Config) error {
	const positive, notNegative = "must be positive", "must not be negative"
	id, b := cfg.Identity, cfg.Billing
	upTo := func(lo int64, hi string) string { return fmt.Sprintf("must be from %d to %s", lo, hi) }
	maxAmount := strconv.FormatInt(billing.MaxAmount, 10)
	rules := []struct {
		bad        bool
		flag, must string
	}{
		{cfg.DownAfter <= 0, "--down-after", positive},
		{cfg.AgentHeartbeat <= 0, "--heartbeat", positive},
		{cfg.OpTimeout <= 0, "--op-timeout", positive},
		{cfg.Volumes.Backend != cloud.VolumeBackendFile && cfg.Volumes.Backend != cloud.VolumeBackendRBD && cfg.Volumes.Backend != "", "--volume-backend", "must be file or rbd"},
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
	}
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

func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	cfg := cloud.Config{Ports: cloud.DefaultPorts}
	fs.StringVar(&cfg.DataDir, "data-dir", defaultDataDir(), "directory for the database, certificates and client files (env NIMBUS_DATA_DIR)")
	fs.StringVar(&cfg.DatabaseURL, "database-url", os.Getenv("NIMBUS_DATABASE_URL"), "postgres://… to use PostgreSQL; default SQLite in the data directory (env NIMBUS_DATABASE_URL)")
	fs.StringVar(&cfg.Listen, "listen", "0.0.0.0", "address to listen on")
	fs.StringVar(&cfg.PublicHost, "public-host", "", "host name clients use, put in the catalog and the certificate (default: the listen address, or localhost)")
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
	fs.Func("proxy-protocol-from", "addresses or CIDRs, comma-separated, of load balancers that pass TLS through and begin each connection with a PROXY protocol header (HAProxy's send-proxy-v2): their connections must, and per-client limits count the client it names", func(v string) error {
		p, err := parsePrefixes(v)
		cfg.HTTP.ProxyFrom = append(cfg.HTTP.ProxyFrom, p...)
		return err
	})
	fs.StringVar(&cfg.Driver, "driver", "fake", "the local agent's hypervisor driver: fake (a simulated fleet) or qemu (real VMs on this machine)")
	fs.StringVar(&cfg.Volumes.Backend, "volume-backend", cloud.VolumeBackendFile, "where volumes live: file (files in the data directory, served to other hosts over NBD) or rbd (RBD images in a Ceph pool, see --rbd-*)")
	fs.StringVar(&cfg.Volumes.RBD.Conf, "rbd-conf", "/etc/ceph/ceph.conf", "with --volume-backend rbd: the Ceph cluster's ceph.conf")
	fs.StringVar(&cfg.Volumes.RBD.User, "rbd-user", "cinder", "with --volume-backend rbd: the Ceph client's name, without client.")
	fs.StringVar(&cfg.Volumes.RBD.Keyring, "rbd-keyring", "", "with --volume-backend rbd: the client's keyring (default /etc/ceph/ceph.client.<rbd-user>.keyring)")
	fs.StringVar(&cfg.Volumes.RBD.Pool, "rbd-pool", "volumes", "with --volume-backend rbd: the pool volumes and their snapshots live in")
	fs.StringVar(&cfg.Volumes.RBD.BackupPool, "rbd-backup-pool", "backups", "with --volume-backend rbd: the pool volume backups are stored in")
	var qf qemuFlags
	qf.register(fs)
	var nf netFlags
	nf.register(fs, true)
	fleetFile := fs.String("fleet", "", "JSON file describing the local agent's fake hosts (default: a demo fleet)")
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
	fs.StringVar(&cfg.Provider.CIDR, "public-cidr", network.DefaultProvider.CIDR, "the provider network's IPv4 CIDR, where floating IPs and routers' gateways live: the public network's subnet follows it")
	fs.StringVar(&cfg.Provider.Gateway, "public-gateway", network.DefaultProvider.Gateway, "the provider network's own router, the next hop of routers' gateways")
	fs.Func("public-pool", "a range start-end of --public-cidr given out as public addresses; repeat for more (default: the whole CIDR but the gateway)", func(v string) error {
		cfg.Provider.Pools = append(cfg.Provider.Pools, v)
		return nil
	})
	weigher := fs.String("scheduler-weigher", "spread", "how hosts are chosen: spread (even load) or pack (fill hosts, keep whole hosts free)")
	keepGPU := fs.Bool("scheduler-keep-gpu-hosts", true, "keep GPU hosts for GPU flavors: other servers go there only when nothing else fits")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	fs.Parse(args)
	if err := localAgentFlags(fs, cfg.NoLocalAgent); err != nil {
		return err
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
	fmt.Printf(`Nimbus is running.
  identity  %s
  compute   %s
  image     %s
  network   %s
  volume    %s
  billing   %s
  agents    %s
  console   %s
  panel     %s  (the demo customer signs in as %s, password in %s)
  driver    %s
  CA file   %s
  clouds    %s  (clouds nimbus-admin and nimbus-demo)

Try:
  export OS_CLIENT_CONFIG_FILE=%s
  openstack --os-cloud nimbus-demo server list
`, c.IdentityURL, c.ComputeURL, c.ImageURL, c.NetworkURL, c.VolumeURL, c.BillingURL, c.AgentURL, c.ConsoleURL,
		c.PanelURL, cloud.DemoUser, filepath.Join(cfg.DataDir, "secrets.json"), driverLine(c, cfg), c.CACertFile, c.CloudsFile, c.CloudsFile)
	log.Info("nimbus started", "data_dir", cfg.DataDir, "identity", c.IdentityURL, "clouds_yaml", c.CloudsFile)
	<-ctx.Done()
	log.Info("nimbus stopping")
	return c.Close()
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
