// Package pkitest has what the tests of Nimbus's certificates need: a CA
// of an operator's own, and pebble, Let's Encrypt's own ACME test server:
// a real CA that validates a real TLS-ALPN-01 challenge against the test's
// listener. scripts/test-all builds pebble outside the tree and names it in
// NIMBUS_PEBBLE; without it the ACME tests skip, unless
// NIMBUS_REQUIRE_PEBBLE=1.
package pkitest

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"nimbus/internal/pki"
	"nimbus/internal/testenv/syncbuf"
)

// Version is the pebble scripts/test-all installs.
const Version = "v2.10.3"

const install = "go install github.com/letsencrypt/pebble/v2/cmd/pebble@" + Version

// Pebble is a running pebble.
type Pebble struct {
	// Directory is its ACME directory URL.
	Directory string
	// HTTPClient trusts its HTTPS interface, as an ACME client must.
	HTTPClient *http.Client
	mgmt       string
}

// Start runs pebble until the test ends. Its validation authority connects
// to tlsPort on 127.0.0.1 (pebble resolves "localhost" through /etc/hosts)
// for TLS-ALPN-01, and each certificate it issues is valid for validity.
// Every order needs a fresh challenge (no authorization reuse), so that a
// renewal is validated as the first issuance was.
func Start(t testing.TB, tlsPort int, validity time.Duration) *Pebble {
	t.Helper()
	bin := os.Getenv("NIMBUS_PEBBLE")
	if bin == "" {
		if os.Getenv("NIMBUS_REQUIRE_PEBBLE") == "1" {
			t.Fatalf("NIMBUS_PEBBLE is not set, and NIMBUS_REQUIRE_PEBBLE=1 requires pebble (%s)", install)
		}
		t.Skipf("skipping: NIMBUS_PEBBLE names no pebble binary (%s; scripts/test-all does it)", install)
	}
	dir := t.TempDir()
	// Pebble's HTTPS interface needs a certificate for 127.0.0.1; Nimbus's
	// own CA code makes one, and the client trusts that CA.
	files := pki.FilesIn(dir)
	if _, err := pki.Ensure(files, []string{"127.0.0.1", "localhost"}); err != nil {
		t.Fatal(err)
	}
	listen, mgmt := "127.0.0.1:"+strconv.Itoa(FreePort(t)), "127.0.0.1:"+strconv.Itoa(FreePort(t))
	// As pebble's test/config/pebble-config.json, with the ports, the
	// certificate, the validity and quicker polling set for the test.
	cfg := map[string]any{"pebble": map[string]any{
		"listenAddress": listen, "managementListenAddress": mgmt,
		"certificate": files.Cert, "privateKey": files.Key,
		"httpPort": FreePort(t), "tlsPort": tlsPort,
		"ocspResponderURL": "", "externalAccountBindingRequired": false,
		"domainBlocklist": []string{"blocked-domain.example"},
		"retryAfter":      map[string]int{"authz": 1, "order": 1},
		"keyAlgorithm":    "ecdsa",
		"profiles": map[string]any{"default": map[string]any{
			"description": "the test's", "validityPeriod": int(validity / time.Second)}},
	}}
	data, _ := json.Marshal(cfg)
	cfgFile := filepath.Join(dir, "pebble-config.json")
	if err := os.WriteFile(cfgFile, data, 0o600); err != nil {
		t.Fatal(err)
	}
	var out syncbuf.Buffer
	cmd := exec.Command(bin, "-config", cfgFile, "-strict")
	cmd.Env = append(os.Environ(), "PEBBLE_VA_NOSLEEP=1", "PEBBLE_AUTHZREUSE=0")
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start pebble: %v", err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("pebble's log:\n%s", out.String())
		}
	})
	pool := x509.NewCertPool()
	ca, _ := os.ReadFile(files.CACert)
	pool.AppendCertsFromPEM(ca)
	p := &Pebble{Directory: "https://" + listen + "/dir", mgmt: mgmt,
		HTTPClient: &http.Client{Timeout: 30 * time.Second,
			Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		resp, err := p.HTTPClient.Get(p.Directory)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("pebble did not answer at %s: %v\n%s", p.Directory, err, out.String())
		}
	}
}

// Roots is the root of the certificates this pebble issues (made afresh at
// each start, apart from its HTTPS interface's).
func (p *Pebble) Roots(t testing.TB) *x509.CertPool {
	t.Helper()
	resp, err := p.HTTPClient.Get("https://" + p.mgmt + "/roots/0")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	pool := x509.NewCertPool()
	if resp.StatusCode != http.StatusOK || !pool.AppendCertsFromPEM(body) {
		t.Fatalf("pebble's root: %d %s", resp.StatusCode, body)
	}
	return pool
}

// FreePort is a TCP port free on 127.0.0.1 a moment ago: pebble's
// configuration names the port its validation connects to before the
// listener there exists.
func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// Served is the certificate a TLS client asking for serverName at addr
// gets, with its chain, unverified.
func Served(addr, serverName string) ([]*x509.Certificate, error) {
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr,
		&tls.Config{ServerName: serverName, InsecureSkipVerify: true})
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates, nil
}

// Verify checks a served chain against roots for name.
func Verify(chain []*x509.Certificate, roots *x509.CertPool, name string) error {
	if len(chain) == 0 {
		return fmt.Errorf("no certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	_, err := chain[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, DNSName: name})
	return err
}
