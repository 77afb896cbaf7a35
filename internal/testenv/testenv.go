// Package testenv starts real Nimbus clouds for tests: on a fresh SQLite file
// and on a fresh PostgreSQL database, over HTTPS on loopback ports, with
// clients that trust the cloud's CA.
package testenv

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"

	"nimbus/internal/billing"
	"nimbus/internal/cloud"
	"nimbus/internal/store/storetest"
)

// Engine is one database to run a test on.
type Engine = storetest.Engine

// Engines returns fresh databases on every engine; see storetest.Engines.
func Engines(t testing.TB) []Engine { return storetest.Engines(t) }

// ForEachEngine runs f as a subtest on every engine.
func ForEachEngine(t *testing.T, f func(t *testing.T, dbURL string)) { storetest.ForEachEngine(t, f) }

// Options change how StartCloud starts a cloud.
type Options func(*cloud.Config)

// StartCloud starts a cloud on loopback with free ports, the fake driver at
// a short delay and the given database ("" for SQLite in the test's data
// directory). It is closed when the test ends.
func StartCloud(t testing.TB, dbURL string, opts ...Options) *cloud.Cloud {
	t.Helper()
	cfg := cloud.Config{
		DataDir: t.TempDir(), DatabaseURL: dbURL, Listen: "127.0.0.1",
		AdminPassword: "admin-secret", DemoPassword: "demo-secret",
		FakeDelay: 20 * time.Millisecond,
		// Test projects start at a zero balance; a generous credit limit
		// keeps a test that runs across the hour from having its servers
		// shelved for running dry. Billing's own tests set limits per
		// account. Tests top up through the simulated card.
		Billing: billing.Config{DefaultCreditLimit: 1 << 40, TestPayments: true},
		Log:     Log(),
	}
	for _, o := range opts {
		o(&cfg)
	}
	c, err := cloud.Start(context.Background(), cfg)
	if err != nil {
		t.Fatalf("start cloud: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// HTTPClient returns a client that trusts the cloud's CA.
func HTTPClient(t testing.TB, c *cloud.Cloud) *http.Client {
	t.Helper()
	pem, err := os.ReadFile(c.CACertFile)
	if err != nil {
		t.Fatalf("read CA: %v", err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	return &http.Client{
		Timeout:   30 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, MaxIdleConnsPerHost: 16},
	}
}

// Provider authenticates with gophercloud as user (cloud.AdminUser or
// cloud.DemoUser) on its own project.
func Provider(t testing.TB, c *cloud.Cloud, user string) *gophercloud.ProviderClient {
	t.Helper()
	pw, project := c.Secrets.DemoPassword, cloud.DemoProject
	if user == cloud.AdminUser {
		pw, project = c.Secrets.AdminPassword, cloud.AdminProject
	}
	return ProviderAs(t, c, user, pw, project)
}

// ProviderAs authenticates with gophercloud with the given credentials.
func ProviderAs(t testing.TB, c *cloud.Cloud, user, password, project string) *gophercloud.ProviderClient {
	t.Helper()
	pc, err := openstack.NewClient(c.IdentityURL)
	if err != nil {
		t.Fatal(err)
	}
	pc.HTTPClient = *HTTPClient(t, c)
	err = openstack.Authenticate(context.Background(), pc, gophercloud.AuthOptions{
		IdentityEndpoint: c.IdentityURL, Username: user, Password: password,
		DomainID: "default", TenantName: project, AllowReauth: true,
	})
	if err != nil {
		t.Fatalf("authenticate %s: %v", user, err)
	}
	return pc
}

// Compute returns a compute client at microversion mv ("" for 2.1).
func Compute(t testing.TB, pc *gophercloud.ProviderClient, mv string) *gophercloud.ServiceClient {
	t.Helper()
	sc, err := openstack.NewComputeV2(pc, gophercloud.EndpointOpts{Region: "RegionOne"})
	if err != nil {
		t.Fatal(err)
	}
	sc.Microversion = mv
	return sc
}

// Token returns a raw token for user, for tests that speak HTTP directly.
func Token(t testing.TB, c *cloud.Cloud, user string) string {
	t.Helper()
	pw, project := c.Secrets.DemoPassword, cloud.DemoProject
	if user == cloud.AdminUser {
		pw, project = c.Secrets.AdminPassword, cloud.AdminProject
	}
	tok, err := c.Identity.Issue(context.Background(), user, pw, project)
	if err != nil {
		t.Fatalf("token for %s: %v", user, err)
	}
	return tok
}

// Do sends a request with a token and JSON body and returns the response
// with its body read.
func Do(t testing.TB, client *http.Client, method, url, token string, body string, hdr ...string) (*http.Response, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("X-Auth-Token", token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// MustStatus fails the test when resp's status is not want.
func MustStatus(t testing.TB, resp *http.Response, body string, want int) {
	t.Helper()
	if resp.StatusCode != want {
		t.Fatalf("%s %s: status %d, want %d; body: %s", resp.Request.Method, resp.Request.URL, resp.StatusCode, want, body)
	}
}

// Sprintf is fmt.Sprintf, for building JSON bodies in tests.
func Sprintf(format string, a ...any) string { return fmt.Sprintf(format, a...) }
