package main

import (
	"math"
	"strings"
	"testing"
	"time"

	"nimbus/internal/billing"
	"nimbus/internal/cloud"
	"nimbus/internal/fleet"
	"nimbus/internal/identity"
	"nimbus/internal/network"
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
		{"--lockout-failure-attempts", func(c *cloud.Config) { c.Identity.LockoutFailureAttempts = -1 }},
		{"--lockout-duration", func(c *cloud.Config) { c.Identity.LockoutDuration = -time.Second }},
		{"--login-failures-per-ip", func(c *cloud.Config) { c.Identity.LoginFailuresPerAddress = -1 }},
		{"--login-failure-window", func(c *cloud.Config) { c.Identity.LoginFailuresPerAddress, c.Identity.LoginFailureWindow = 5, 0 }},
		{"--token-rate", func(c *cloud.Config) { c.Identity.TokenRate = math.NaN() }},
		{"--token-burst", func(c *cloud.Config) { c.Identity.TokenBurst = -1 }},
		{"--max-tokens-per-user", func(c *cloud.Config) { c.Identity.MaxTokensPerUser = -1 }},
		{"--password-hashes", func(c *cloud.Config) { c.Identity.PasswordHashes = -1 }},
		{"--max-conns-per-ip", func(c *cloud.Config) { c.HTTP.MaxConnsPerIP = -1 }},
		{"--billing-min-topup", func(c *cloud.Config) { c.Billing.MinTopup = 0 }},
		{"--billing-max-topup", func(c *cloud.Config) { c.Billing.MaxTopup = 9999 }},
		{"--billing-max-balance", func(c *cloud.Config) { c.Billing.MaxBalance = billing.MaxAmount + 1 }},
		{"--billing-credit-limit", func(c *cloud.Config) { c.Billing.DefaultCreditLimit = -1 }},
		{"--demo-credit", func(c *cloud.Config) { c.DemoCredit = c.Billing.MaxBalance + 1 }},
		{"", func(c *cloud.Config) { c.Provider = network.Provider{CIDR: "198.51.100.0/24", Gateway: "198.51.100.1"} }},
		{"--public-cidr,", func(c *cloud.Config) { c.Provider = network.Provider{CIDR: "198.51.100.0/24", Gateway: "192.0.2.1"} }},
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
