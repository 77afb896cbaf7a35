package cloud_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"nimbus/internal/cloud"
	"nimbus/internal/pki"
	"nimbus/internal/pki/pkitest"
	"nimbus/internal/testenv"
)

// listenerAddrs are the loopback address and port of every listener of c.
func listenerAddrs(t *testing.T, c *cloud.Cloud) map[string]string {
	t.Helper()
	addrs := map[string]string{}
	for name, u := range map[string]string{"identity": c.IdentityURL, "compute": c.ComputeURL, "image": c.ImageURL,
		"network": c.NetworkURL, "volume": c.VolumeURL, "billing": c.BillingURL, "agent": c.AgentURL,
		"console": c.ConsoleURL, "panel": c.PanelURL} {
		pu, err := url.Parse(u)
		if err != nil {
			t.Fatal(err)
		}
		// By address, so that no name goes out unless asked for.
		addrs[name] = net.JoinHostPort("127.0.0.1", pu.Port())
	}
	return addrs
}

// servedBy answers the leaf each listener presents to a client asking for
// sni.
func servedBy(t *testing.T, c *cloud.Cloud, sni string) map[string][]byte {
	t.Helper()
	got := map[string][]byte{}
	for name, addr := range listenerAddrs(t, c) {
		chain, err := pkitest.Served(addr, sni)
		if err != nil {
			t.Fatalf("%s (%s) for %q: %v", name, addr, sni, err)
		}
		got[name] = chain[0].Raw
	}
	return got
}

func clientTrusting(pool *x509.CertPool) *http.Client {
	jar, _ := cookiejar.New(nil)
	return &http.Client{Timeout: 30 * time.Second, Jar: jar,
		Transport:     &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// panelServers signs the demo customer in to the panel and opens the
// servers page, which the panel fills by calling the compute API at the
// catalog's URL: through the certificate under test.
func panelServers(t *testing.T, c *cloud.Cloud, hc *http.Client) {
	t.Helper()
	resp, err := hc.Get(c.PanelURL + "/login")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := csrfRE.FindSubmatch(body)
	if m == nil {
		t.Fatalf("no form token on the panel's sign-in page (%d)", resp.StatusCode)
	}
	resp, err = hc.PostForm(c.PanelURL+"/login", url.Values{"email": {cloud.DemoUser}, "password": {c.Secrets.DemoPassword}, "csrf": {string(m[1])}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("panel sign-in: %d", resp.StatusCode)
	}
	resp, err = hc.Get(c.PanelURL + "/servers")
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("the panel's servers page: %d %.300s", resp.StatusCode, body)
	}
}

// TestOperatorCertificateAcrossRestarts: with --tls-cert/--tls-key, every
// listener presents the operator's certificate to clients asking for the
// public host, and the built-in CA's to those asking by address (the local
// agent among them); the files are never written, the certificate is
// still the one served after a restart and the panel's own calls trust it;
// a replaced certificate reaches every listener without a restart.
func TestOperatorCertificateAcrossRestarts(t *testing.T) {
	ca := pkitest.NewCA(t, "Operator CA")
	own := t.TempDir()
	first := ca.Issue(t, own, "localhost")
	certFile, keyFile := filepath.Join(own, "cert.pem"), filepath.Join(own, "key.pem")
	certPEM, _ := os.ReadFile(certFile)
	keyPEM, _ := os.ReadFile(keyFile)
	cfg := cloud.Config{DataDir: t.TempDir(), Listen: "127.0.0.1", PublicHost: "localhost", FakeDelay: 20 * time.Millisecond,
		AdminPassword: "admin-secret", DemoPassword: "demo-secret", Log: testenv.Log(),
		TLS: cloud.TLSOptions{CertFile: certFile, KeyFile: keyFile, ReloadEvery: 50 * time.Millisecond}}
	start := func() *cloud.Cloud {
		c, err := cloud.Start(context.Background(), cfg)
		if err != nil {
			t.Fatalf("start: %v", err)
		}
		return c
	}

	c := start()
	builtin, _ := os.ReadFile(c.CACertFile)
	builtinPool := x509.NewCertPool()
	builtinPool.AppendCertsFromPEM(builtin)
	check := func(c *cloud.Cloud, want []byte) {
		t.Helper()
		for name, der := range servedBy(t, c, "localhost") {
			if !bytes.Equal(der, want) {
				t.Errorf("%s: not the operator's certificate", name)
			}
		}
		for name, der := range servedBy(t, c, "") {
			leaf, _ := x509.ParseCertificate(der)
			if _, err := leaf.Verify(x509.VerifyOptions{Roots: builtinPool, DNSName: "127.0.0.1"}); err != nil {
				t.Errorf("%s by address: %v, want the built-in CA's", name, err)
			}
		}
	}
	check(c, first)
	hc := clientTrusting(ca.Pool())
	panelServers(t, c, hc)
	if clouds, _ := os.ReadFile(c.CloudsFile); bytes.Contains(clouds, []byte("cacert")) {
		t.Error("clouds.yaml names ca.pem, which does not verify the operator's certificate")
	}
	if !strings.Contains(c.TLSSummary(), certFile) {
		t.Errorf("banner: %q", c.TLSSummary())
	}
	c.Close()

	c = start()
	defer func() { c.Close() }()
	check(c, first)
	if a, b := mustRead(t, certFile), mustRead(t, keyFile); !bytes.Equal(a, certPEM) || !bytes.Equal(b, keyPEM) {
		t.Fatal("the operator's files were written")
	}

	second := ca.Issue(t, own, "localhost")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		n := 0
		for _, der := range servedBy(t, c, "localhost") {
			if bytes.Equal(der, second) {
				n++
			}
		}
		if n == len(listenerAddrs(t, c)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the files were replaced, %d listeners present the new certificate", n)
		}
	}
	panelServers(t, c, clientTrusting(ca.Pool()))
}

func pemBody(der []byte) []byte {
	return bytes.TrimSpace(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestBuiltinCAIsTheDefault: without --tls-cert or ACME, a client asking
// for the public host name gets the built-in CA's certificate, and the
// client files name ca.pem.
func TestBuiltinCAIsTheDefault(t *testing.T) {
	c := testenv.StartCloud(t, "", func(cfg *cloud.Config) { cfg.PublicHost = "localhost"; cfg.NoLocalAgent = true })
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(mustRead(t, c.CACertFile))
	for name, der := range servedBy(t, c, "localhost") {
		leaf, _ := x509.ParseCertificate(der)
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: "localhost"}); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	if !bytes.Contains(mustRead(t, c.CloudsFile), []byte("cacert: "+c.CACertFile)) {
		t.Error("clouds.yaml does not name ca.pem")
	}
}

// TestTLSOptionsRefused: options that could not serve the public host are
// refused before anything listens.
func TestTLSOptionsRefused(t *testing.T) {
	dir := t.TempDir()
	own := t.TempDir()
	pkitest.NewCA(t, "Operator CA").Issue(t, own, "cloud.example.net")
	cert, key := filepath.Join(own, "cert.pem"), filepath.Join(own, "key.pem")
	acme := &pki.ACME{Email: "ops@example.net"}
	for _, tc := range []struct {
		name string
		host string
		tls  cloud.TLSOptions
		want string
	}{
		{"a certificate without its key", "cloud.example.net", cloud.TLSOptions{CertFile: cert}, "go together"},
		{"both ways", "cloud.example.net", cloud.TLSOptions{CertFile: cert, KeyFile: key, ACME: acme}, "give one"},
		{"an IP address as the public host", "192.0.2.1", cloud.TLSOptions{CertFile: cert, KeyFile: key}, "host name"},
		{"ACME for an address", "192.0.2.1", cloud.TLSOptions{ACME: acme}, "host name"},
		{"the built-in certificate's own file", "cloud.example.net",
			cloud.TLSOptions{CertFile: filepath.Join(dir, "server.pem"), KeyFile: key}, "outside the data directory"},
		{"a certificate for another name", "other.example.net", cloud.TLSOptions{CertFile: cert, KeyFile: key}, "not the public host"},
	} {
		_, err := cloud.Start(context.Background(), cloud.Config{DataDir: dir, Listen: "127.0.0.1", PublicHost: tc.host,
			NoLocalAgent: true, TLS: tc.tls, Log: testenv.Log()})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error saying %q", tc.name, err, tc.want)
		}
	}
}

// TestACMEOnEveryListener: with ACME, the cloud obtains a certificate for
// its public host from pebble, which validates the TLS-ALPN-01 challenge
// on the panel's port (what port 443 would reach in production), and every
// listener presents it; the panel's own calls and a customer's client
// trusting the CA's root alone work through it.
func TestACMEOnEveryListener(t *testing.T) {
	panelPort := pkitest.FreePort(t)
	peb := pkitest.Start(t, panelPort, time.Hour)
	roots := peb.Roots(t)
	c := testenv.StartCloud(t, "", func(cfg *cloud.Config) {
		cfg.PublicHost = "localhost"
		cfg.Ports.Panel = panelPort
		cfg.TLS.ACME = &pki.ACME{Directory: peb.Directory, Email: "ops@example.net", HTTPClient: peb.HTTPClient, RetryMin: time.Second}
	})
	var leaf *x509.Certificate
	for deadline := time.Now().Add(30 * time.Second); leaf == nil; time.Sleep(100 * time.Millisecond) {
		chain, err := pkitest.Served(listenerAddrs(t, c)["panel"], "localhost")
		if err == nil && pkitest.Verify(chain, roots, "localhost") == nil {
			leaf = chain[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no certificate from pebble within 30 s (last: %v)", err)
		}
	}
	for name, der := range servedBy(t, c, "localhost") {
		if !bytes.Equal(der, leaf.Raw) {
			t.Errorf("%s does not present the ACME certificate", name)
		}
	}
	hc := clientTrusting(roots)
	resp, err := hc.Get(c.IdentityURL)
	if err != nil {
		t.Fatalf("GET %s trusting pebble's root: %v", c.IdentityURL, err)
	}
	resp.Body.Close()
	panelServers(t, c, hc)
	if s := c.TLSSummary(); !strings.Contains(s, "ACME ("+peb.Directory+") for localhost") || !strings.Contains(s, "valid until") {
		t.Errorf("banner: %q", s)
	}
	if kept, _ := filepath.Glob(filepath.Join(c.Config.DataDir, "acme-*", "localhost.pem")); len(kept) != 1 ||
		!bytes.Contains(mustRead(t, kept[0]), pemBody(leaf.Raw)) {
		t.Errorf("the certificate is not kept in the data directory: %v", kept)
	}
}
