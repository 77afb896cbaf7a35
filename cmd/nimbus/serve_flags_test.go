package main

import (
	"flag"
	"math"
	"strings"
	"testing"
	"time"

	"nimbus/internal/billing"
	"nimbus/internal/cloud"
	"nimbus/internal/fleet"
	"nimbus/internal/identity"
	"nimbus/internal/image"
	"nimbus/internal/network"
	"nimbus/internal/pki"
)

// TestCheckServeFlags: serve's defaults pass, and each flag out of its
// range is refused with an error that names it.
func TestCheckServeFlags(t *testing.T) {
	base := func() cloud.Config {
		return cloud.Config{DownAfter: fleet.DefaultDownAfter, AgentHeartbeat: 10 * time.Second, OpTimeout: fleet.DefaultOpTimeout,
			Identity: identity.DefaultLimits, HTTP: cloud.DefaultHTTPLimits, DemoCredit: 100000,
			Billing: billing.Config{MinTopup: 10000, MaxTopup: 100_000_000, MaxBalance: 10_000_000_000}}
	}
	tests := []struct {
		flag string // "" for no error
		set  func(c *cloud.Config)
	}{
		{"", func(c *cloud.Config) {}},
		{"", func(c *cloud.Config) { c.Identity.LoginFailuresPerAddress, c.Identity.LoginFailureWindow = 0, 0 }},
		{"--down-after", func(c *cloud.Config) { c.DownAfter = 0 }},
		{"--heartbeat", func(c *cloud.Config) { c.AgentHeartbeat = -time.Second }},
		{"--op-timeout", func(c *cloud.Config) { c.OpTimeout = 0 }},
		{"", func(c *cloud.Config) { c.Volumes.Backend = cloud.VolumeBackendRBD }},
		{"--volume-backend", func(c *cloud.Config) { c.Volumes.Backend = "ceph" }},
		{"", func(c *cloud.Config) { c.ImageData.Backend = image.BackendRBD }},
		{"--image-backend", func(c *cloud.Config) { c.ImageData.Backend = "swift" }},
		{"--lockout-failure-attempts", func(c *cloud.Config) { c.Identity.LockoutFailureAttempts = -1 }},
		{"--lockout-duration", func(c *cloud.Config) { c.Identity.LockoutDuration = -time.Second }},
		{"--login-failures-per-ip", func(c *cloud.Config) { c.Identity.LoginFailuresPerAddress = -1 }},
		{"--login-failure-window", func(c *cloud.Config) { c.Identity.LoginFailuresPerAddress, c.Identity.LoginFailureWindow = 5, 0 }},
		{"--token-rate", func(c *cloud.Config) { c.Identity.TokenRate = math.NaN() }},
		{"--token-burst", func(c *cloud.Config) { c.Identity.TokenBurst = -1 }},
		{"--max-tokens-per-user", func(c *cloud.Config) { c.Identity.MaxTokensPerUser = -1 }},
		{"--password-hashes", func(c *cloud.Config) { c.Identity.PasswordHashes = -1 }},
		{"--receipts-per-ip", func(c *cloud.Config) { c.Identity.ReceiptsPerAddress = -1 }},
		{"--max-conns-per-ip", func(c *cloud.Config) { c.HTTP.MaxConnsPerIP = -1 }},
		{"--billing-min-topup", func(c *cloud.Config) { c.Billing.MinTopup = 0 }},
		{"--billing-max-topup", func(c *cloud.Config) { c.Billing.MaxTopup = 9999 }},
		{"--billing-max-balance", func(c *cloud.Config) { c.Billing.MaxBalance = billing.MaxAmount + 1 }},
		{"--billing-credit-limit", func(c *cloud.Config) { c.Billing.DefaultCreditLimit = -1 }},
		{"--demo-credit", func(c *cloud.Config) { c.DemoCredit = c.Billing.MaxBalance + 1 }},
		{"--metrics-token", func(c *cloud.Config) { c.MetricsListen = "0.0.0.0:9180" }},
		{"--production", func(c *cloud.Config) { c.Production = true }}, // no certificate
		{"--billing-test-payments", func(c *cloud.Config) {
			c.Production, c.Billing.TestPayments, c.PublicHost = true, true, "cloud.example.com"
			c.TLS.ACME = &pki.ACME{Email: "ops@example.com", Directory: "https://acme.example/dir"}
		}},
		{"", func(c *cloud.Config) {
			c.Production, c.PublicHost = true, "cloud.example.com"
			c.TLS.ACME = &pki.ACME{Email: "ops@example.com", Directory: "https://acme.example/dir"}
		}},
		{"--metrics-token", func(c *cloud.Config) { c.MetricsListen = "192.0.2.10:9180" }},
		{"", func(c *cloud.Config) { c.MetricsListen = "127.0.0.1:9180" }},
		{"", func(c *cloud.Config) { c.MetricsListen = "[::1]:9180" }},
		{"", func(c *cloud.Config) { c.MetricsListen, c.MetricsToken = "0.0.0.0:9180", "t" }},
		{"", func(c *cloud.Config) { c.Provider = network.Provider{CIDR: "198.51.100.0/24", Gateway: "198.51.100.1"} }},
		{"--public-cidr,", func(c *cloud.Config) { c.Provider = network.Provider{CIDR: "198.51.100.0/24", Gateway: "192.0.2.1"} }},
		{"", func(c *cloud.Config) {
			c.TLS, c.PublicHost = cloud.TLSOptions{CertFile: "c.pem", KeyFile: "k.pem"}, "cloud.example.net"
		}},
		{"", func(c *cloud.Config) {
			c.TLS.ACME, c.PublicHost = acme("ops@example.net", pki.LetsEncrypt), "cloud.example.net"
		}},
		{"--tls-cert", func(c *cloud.Config) { c.TLS, c.PublicHost = cloud.TLSOptions{CertFile: "c.pem"}, "cloud.example.net" }},
		{"--tls-cert", func(c *cloud.Config) { c.TLS, c.PublicHost = cloud.TLSOptions{KeyFile: "k.pem"}, "cloud.example.net" }},
		{"--tls-cert", func(c *cloud.Config) {
			c.TLS, c.PublicHost = cloud.TLSOptions{CertFile: "c.pem", KeyFile: "k.pem", ACME: acme("ops@example.net", pki.LetsEncrypt)}, "cloud.example.net"
		}},
		{"--public-host", func(c *cloud.Config) { c.TLS = cloud.TLSOptions{CertFile: "c.pem", KeyFile: "k.pem"} }},
		{"--public-host", func(c *cloud.Config) {
			c.TLS.ACME, c.PublicHost = acme("ops@example.net", pki.LetsEncrypt), "192.0.2.1"
		}},
		{"--acme-email", func(c *cloud.Config) {
			c.TLS.ACME, c.PublicHost = acme("Ops <ops@example.net>", pki.LetsEncrypt), "cloud.example.net"
		}},
		{"--acme-email", func(c *cloud.Config) { c.TLS.ACME, c.PublicHost = acme("ops", pki.LetsEncrypt), "cloud.example.net" }},
		{"--acme-directory", func(c *cloud.Config) {
			c.TLS.ACME, c.PublicHost = acme("ops@example.net", "http://ca.example.net/dir"), "cloud.example.net"
		}},
	}
	for _, tc := range tests {
		cfg := base()
		tc.set(&cfg)
		err := checkServeFlags(&cfg)
		switch {
		case tc.flag == "" && err != nil:
			t.Errorf("valid flags refused: %v", err)
		case tc.flag != "" && (err == nil || !strings.HasPrefix(err.Error(), tc.flag+" ")):
			t.Errorf("%s out of range: got %v, want an error naming it", tc.flag, err)
		}
	}
}

// TestFaultPauseRefusedInProduction: the fault tests' pause inside
// billing's charging transactions is refused by --production, so that a
// stray environment variable cannot stall a real region's charging.
func TestFaultPauseRefusedInProduction(t *testing.T) {
	t.Setenv(faultChargePause, "5s")
	cfg := cloud.Config{DownAfter: fleet.DefaultDownAfter, AgentHeartbeat: 10 * time.Second, OpTimeout: fleet.DefaultOpTimeout,
		Identity: identity.DefaultLimits, HTTP: cloud.DefaultHTTPLimits,
		Billing: billing.Config{MinTopup: 10000, MaxTopup: 100_000_000, MaxBalance: 10_000_000_000}}
	if err := checkServeFlags(&cfg); err != nil {
		t.Fatalf("refused outside production: %v", err)
	}
	cfg.Production, cfg.PublicHost, cfg.TLS.ACME = true, "cloud.example.com", acme("ops@example.com", pki.LetsEncrypt)
	if err := checkServeFlags(&cfg); err == nil || !strings.HasPrefix(err.Error(), faultChargePause+" ") {
		t.Fatalf("--production with %s: %v", faultChargePause, err)
	}
}

func acme(email, dir string) *pki.ACME { return &pki.ACME{Email: email, Directory: dir} }

// TestServeTLSAndProxyFlags: the flags read while parsing (the others are
// TestCheckServeFlags's) refuse a bad value by name before anything starts. Each call
// that should pass the flags ends at a bad --scheduler-weigher.
func TestServeTLSAndProxyFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--trusted-proxies", "0.0.0.0/0"}, "--trusted-proxies: "},
		{[]string{"--trusted-proxies", "10.0.0.0/8,proxy.example.net"}, "--trusted-proxies: "},
		{[]string{"--trusted-proxies", "10.0.0.0/8,192.0.2.7", "--trusted-proxies", "2001:db8::/48"}, "--scheduler-weigher"},
		{[]string{"--acme-directory", "https://ca.example.net/dir"}, "--acme-directory goes with --acme-email"},
	} {
		args := append([]string{"--data-dir", t.TempDir(), "--scheduler-weigher", "bogus"}, tc.args...)
		if err := serve(args); err == nil || !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%q: %v, want an error starting %q", tc.args, err, tc.want)
		}
	}
}

// TestNoLocalAgentFlags: with --no-local-agent, a flag only the local
// agent reads is refused by name before anything starts, rather than
// ignored; without it, or for the controller's own flags, nothing is.
func TestNoLocalAgentFlags(t *testing.T) {
	vals := map[string]string{"driver": "qemu", "fleet": "f.json", "fake-delay": "1s", "accel": "tcg", "reserved-cpus": "0",
		"reserved-memory-mb": "0", "access-host": "192.0.2.1", "qemu-user": "nobody", "console-listen": "127.0.0.1:0",
		"no-sandbox": "true", "network-mode": "bridged", "provider-bridge": "br0", "provider-interface": "eth1",
		"underlay-mtu": "9000", "netns-prefix": "h1-"}
	if len(vals) != len(agentOnlyFlags) {
		t.Fatalf("the table names %d flags, agentOnlyFlags %d", len(vals), len(agentOnlyFlags))
	}
	for _, name := range agentOnlyFlags {
		v, ok := vals[name]
		if !ok {
			t.Fatalf("no value for --%s", name)
		}
		// serve parses with ExitOnError: a name it does not register
		// would end the test binary, so this also checks the list.
		// The bad weigher, checked next, stops serve should the check let
		// the flag by.
		err := serve([]string{"--data-dir", t.TempDir(), "--no-local-agent", "--" + name + "=" + v, "--scheduler-weigher", "bogus"})
		if err == nil || !strings.Contains(err.Error(), "--"+name+" configure the local agent") {
			t.Errorf("--no-local-agent --%s=%s: got %v, want it refused by name", name, v, err)
		}
	}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.String("network-mode", "user", "")
	fs.String("public-host", "", "")
	if err := fs.Parse([]string{"--network-mode", "bridged", "--public-host", "x"}); err != nil {
		t.Fatal(err)
	}
	if err := localAgentFlags(fs, false); err != nil {
		t.Errorf("with a local agent: %v", err)
	}
	fs = flag.NewFlagSet("t", flag.ContinueOnError)
	fs.String("public-host", "", "")
	fs.Parse([]string{"--public-host", "x"})
	if err := localAgentFlags(fs, true); err != nil {
		t.Errorf("a controller flag with --no-local-agent: %v", err)
	}
}
