package main

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// benchLoginAttack measures login under a password-guessing attack: for each
// setting of the limits, a fresh `nimbus serve` child takes wrong-password
// logins for the demo user from attackers concurrent clients on 127.0.0.1
// for d; then, with the attack still on, the admin logs in from 127.0.0.2
// (another client address). It prints that login's time and status and the
// child's peak resident memory (VmHWM).
func benchLoginAttack(attackers int, d time.Duration) error {
	for _, sc := range []struct {
		name string
		args []string
	}{
		{"a hash slot per attacker, no throttle or lockout", []string{"--password-hashes", strconv.Itoa(attackers),
			"--login-failures-per-ip", "0", "--lockout-failure-attempts", "0"}},
		{"defaults", nil},
		{"no per-address throttle", []string{"--login-failures-per-ip", "0"}},
		{"no per-address throttle, no lockout (hash bound only)", []string{"--login-failures-per-ip", "0", "--lockout-failure-attempts", "0"}},
	} {
		if err := loginAttack(sc.name, attackers, d, sc.args); err != nil {
			return fmt.Errorf("login-attack (%s): %w", sc.name, err)
		}
	}
	return nil
}

const (
	attackAdminPassword = "bench-admin-secret"
	attackDemoPassword  = "bench-demo-secret"
)

func loginAttack(name string, attackers int, d time.Duration, args []string) error {
	s, err := startServe(append([]string{"--admin-password", attackAdminPassword, "--demo-password", attackDemoPassword}, args...)...)
	if err != nil {
		return err
	}
	defer s.stop()
	attack, err := clientFrom(s, "127.0.0.1", attackers)
	if err != nil {
		return err
	}
	user, err := clientFrom(s, "127.0.0.2", 1)
	if err != nil {
		return err
	}
	rssBefore := procStatusBytes(s.pid(), "VmRSS:")
	var unauthorized, throttled, other atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range attackers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				switch status, _ := login(attack, s.identityURL, "demo", "wrong-guess"); status {
				case http.StatusUnauthorized:
					unauthorized.Add(1)
				case http.StatusTooManyRequests:
					throttled.Add(1)
				default:
					other.Add(1)
				}
			}
		}()
	}
	time.Sleep(d)
	status, took := login(user, s.identityURL, "admin", attackAdminPassword)
	close(stop)
	wg.Wait()
	fmt.Printf("login under attack, %s:\n  real login %s (status %d); nimbus serve RSS %d MB before, peak %d MB; %d attackers for %s: %d 401, %d 429, %d other\n",
		name, took.Round(time.Millisecond), status, rssBefore>>20, procStatusBytes(s.pid(), "VmHWM:")>>20,
		attackers, d, unauthorized.Load(), throttled.Load(), other.Load())
	return nil
}

// clientFrom is an HTTPS client of s whose connections come from local (a
// loopback address), with up to conns of them.
func clientFrom(s *serveChild, local string, conns int) (*http.Client, error) {
	pem, err := os.ReadFile(filepath.Join(s.dataDir, "ca.pem"))
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}, Timeout: 10 * time.Second}
	return &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{
		DialContext: dialer.DialContext, TLSClientConfig: &tls.Config{RootCAs: pool},
		MaxIdleConnsPerHost: conns, MaxConnsPerHost: conns,
	}}, nil
}

// login is one POST /v3/auth/tokens with a password; it returns the status
// (0 if the request failed) and how long it took.
func login(c *http.Client, identityURL, user, password string) (int, time.Duration) {
	body := `{"auth":{"identity":{"methods":["password"],"password":{"user":{"name":"` + user +
		`","domain":{"id":"default"},"password":"` + password + `"}}}}}`
	start := time.Now()
	resp, err := c.Post(identityURL+"/auth/tokens", "application/json", strings.NewReader(body))
	if err != nil {
		return 0, time.Since(start)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, time.Since(start)
}

// procStatusBytes reads a field of /proc/<pid>/status in bytes (VmRSS:, VmHWM:, given in kB).
func procStatusBytes(pid, field string) int64 {
	b, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == field {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}
