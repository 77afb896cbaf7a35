package pki_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"nimbus/internal/pki"
	"nimbus/internal/pki/pkitest"
)

// TestACMEIssuesAndRenews: against pebble, which validates a real
// TLS-ALPN-01 challenge on the listener's port, the manager obtains a
// certificate for the public host, serves it to the clients asking for
// that name, keeps it in the data directory, renews it two thirds into its
// life (validated again) and, after a restart, serves the kept one at once.
func TestACMEIssuesAndRenews(t *testing.T) {
	own, _ := builtin(t)
	src := pki.NewSource(own)
	port := pkitest.FreePort(t)
	// Fifteen seconds of life: renewed after ten.
	peb := pkitest.Start(t, port, 15*time.Second)
	roots := peb.Roots(t)
	addr := serveTLSAt(t, "127.0.0.1:"+strconv.Itoa(port), src.ServerConfig())

	dataDir := t.TempDir()
	cfg := pki.ACME{Directory: peb.Directory, Email: "ops@example.net", Host: "localhost", Dir: dataDir,
		HTTPClient: peb.HTTPClient, RetryMin: time.Second}
	m, err := src.UseACME(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if src.Public() != nil {
		t.Fatal("a certificate before any was obtained")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); m.Run(ctx) }()
	defer func() { cancel(); <-done }()

	first := waitIssued(t, addr, roots, nil, 30*time.Second)
	if got := served(t, addr, ""); !bytes.Equal(got, own.Certificate[0]) {
		t.Error("a client without SNI did not get the built-in certificate")
	}
	kept, err := os.ReadFile(m.CertFile())
	if err != nil || !bytes.Contains(kept, pemBody(first.Raw)) {
		t.Fatalf("the certificate is not kept in %s: %v", m.CertFile(), err)
	}
	if st, err := os.Stat(filepath.Join(filepath.Dir(m.CertFile()), "localhost-key.pem")); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("the key: %v, mode %v, want 0600", err, st.Mode().Perm())
	}

	second := waitIssued(t, addr, roots, first, 30*time.Second)
	renewAt := pki.RenewAt(first)
	if second.NotBefore.Before(renewAt.Add(-time.Second)) || !second.NotBefore.Before(first.NotAfter) {
		t.Errorf("renewed at %v; the first lived %v to %v, renewal due at %v", second.NotBefore, first.NotBefore, first.NotAfter, renewAt)
	}
	cancel()
	<-done

	// A restart serves the kept certificate before ordering anything.
	src2 := pki.NewSource(own)
	if _, err := src2.UseACME(cfg); err != nil {
		t.Fatal(err)
	}
	if p := src2.Public(); p == nil || !bytes.Equal(p.Raw, second.Raw) {
		t.Error("after a restart the kept certificate is not served")
	}
}

// waitIssued waits until addr serves, for localhost, a certificate that
// pebble's root verifies and that is not prev.
func waitIssued(t *testing.T, addr string, roots *x509.CertPool, prev *x509.Certificate, within time.Duration) *x509.Certificate {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		chain, err := pkitest.Served(addr, "localhost")
		if err == nil && pkitest.Verify(chain, roots, "localhost") == nil && (prev == nil || !bytes.Equal(chain[0].Raw, prev.Raw)) {
			return chain[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("no new certificate from pebble within %v (last: %v)", within, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
