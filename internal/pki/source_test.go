package pki_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"nimbus/internal/pki"
	"nimbus/internal/pki/pkitest"
)

// TestEnsureKeepsForeignServerCertificate: a certificate an operator put
// in place of server.pem is not overwritten at the next start (it was, by
// one re-issued for the built-in names): the start fails and says how to
// give it. One issued by an earlier Nimbus CA is still re-issued.
func TestEnsureKeepsForeignServerCertificate(t *testing.T) {
	dir := t.TempDir()
	f := pki.FilesIn(dir)
	if _, err := pki.Ensure(f, []string{"localhost"}); err != nil {
		t.Fatal(err)
	}
	ca := pkitest.NewCA(t, "Operator CA")
	own := t.TempDir()
	ca.Issue(t, own, "cloud.example.net")
	for _, c := range [][2]string{{"cert.pem", f.Cert}, {"key.pem", f.Key}} {
		data, _ := os.ReadFile(filepath.Join(own, c[0]))
		os.WriteFile(c[1], data, 0o600)
	}
	before, _ := os.ReadFile(f.Cert)
	_, err := pki.Ensure(f, []string{"localhost", "127.0.0.1"})
	if err == nil || !strings.Contains(err.Error(), "--tls-cert") {
		t.Errorf("Ensure over an operator's server.pem: %v, want a refusal naming --tls-cert", err)
	}
	if after, _ := os.ReadFile(f.Cert); !bytes.Equal(before, after) {
		t.Error("the operator's certificate was overwritten")
	}

	// A new Nimbus CA (its files removed) re-issues the old one's.
	dir2 := t.TempDir()
	f2 := pki.FilesIn(dir2)
	first, err := pki.Ensure(f2, []string{"localhost"})
	if err != nil {
		t.Fatal(err)
	}
	os.Remove(f2.CACert)
	os.Remove(f2.CAKey)
	second, err := pki.Ensure(f2, []string{"localhost"})
	if err != nil {
		t.Fatalf("Ensure after a new CA: %v", err)
	}
	if bytes.Equal(first.Certificate[0], second.Certificate[0]) {
		t.Error("the old CA's server certificate was kept")
	}
}

// serveTLS runs a TLS listener with cfg that completes handshakes.
func serveTLS(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	return serveTLSAt(t, "127.0.0.1:0", cfg)
}

func serveTLSAt(t *testing.T, addr string, cfg *tls.Config) string {
	t.Helper()
	ln, err := tls.Listen("tcp", addr, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				c.(*tls.Conn).Handshake()
				c.Close()
			}()
		}
	}()
	return ln.Addr().String()
}

func builtin(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	f := pki.FilesIn(t.TempDir())
	cert, err := pki.Ensure(f, []string{"127.0.0.1", "localhost"})
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	ca, _ := os.ReadFile(f.CACert)
	pool.AppendCertsFromPEM(ca)
	return cert, pool
}

func served(t *testing.T, addr, name string) []byte {
	t.Helper()
	chain, err := pkitest.Served(addr, name)
	if err != nil {
		t.Fatalf("handshake with %s for %q: %v", addr, name, err)
	}
	return chain[0].Raw
}

// TestOperatorCertificate: the operator's certificate is presented to the
// clients that ask for a name it covers, the built-in one to the others;
// it is read again when its files change, a pair that does not load or
// does not name the host is not taken, and Nimbus never writes the files.
func TestOperatorCertificate(t *testing.T) {
	own, _ := builtin(t)
	src := pki.NewSource(own)
	ca := pkitest.NewCA(t, "Operator CA")
	dir := t.TempDir()
	files := pki.OwnFiles{Cert: filepath.Join(dir, "cert.pem"), Key: filepath.Join(dir, "key.pem"), Host: "cloud.example.net",
		Every: 20 * time.Millisecond}

	// Refused at start: missing, for another name, key of another pair.
	if err := src.UseFiles(files); err == nil {
		t.Error("missing files accepted")
	}
	ca.Issue(t, dir, "other.example.net")
	if err := src.UseFiles(files); err == nil || !strings.Contains(err.Error(), "not the public host") {
		t.Errorf("a certificate for another name: %v", err)
	}
	wrongKey, _ := os.ReadFile(files.Key)
	first := ca.Issue(t, dir, "cloud.example.net", "*.cloud.example.net")
	goodKey, _ := os.ReadFile(files.Key)
	os.WriteFile(files.Key, wrongKey, 0o600)
	if err := src.UseFiles(files); err == nil {
		t.Error("a key of another certificate accepted")
	}
	os.WriteFile(files.Key, goodKey, 0o600)
	if err := src.UseFiles(files); err != nil {
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go src.WatchFiles(ctx, files)
	addr := serveTLS(t, src.ServerConfig())
	for _, tc := range []struct {
		sni  string
		want []byte
	}{
		{"cloud.example.net", first},
		{"panel.cloud.example.net", first},
		{"localhost", own.Certificate[0]},
		{"", own.Certificate[0]}, // by IP address: no SNI
	} {
		if got := served(t, addr, tc.sni); !bytes.Equal(got, tc.want) {
			t.Errorf("SNI %q: served the wrong certificate", tc.sni)
		}
	}

	// Replaced by a renewal: taken without a restart.
	second := ca.Issue(t, dir, "cloud.example.net")
	waitServed(t, addr, "cloud.example.net", second)

	// Half written (garbage), then for another name: not taken.
	os.WriteFile(files.Cert, []byte("-----BEGIN CERTIFICATE-----\ntruncated"), 0o644)
	time.Sleep(10 * files.Every)
	if !bytes.Equal(served(t, addr, "cloud.example.net"), second) {
		t.Error("a half-written certificate replaced the one in use")
	}
	ca.Issue(t, dir, "elsewhere.example.net")
	time.Sleep(10 * files.Every)
	if !bytes.Equal(served(t, addr, "cloud.example.net"), second) {
		t.Error("a certificate for another name replaced the one in use")
	}
	third := ca.Issue(t, dir, "cloud.example.net")
	waitServed(t, addr, "cloud.example.net", third)
	// Nimbus wrote nothing: the files are as the test last wrote them.
	if data, _ := os.ReadFile(files.Cert); !bytes.Contains(data, pemBody(third)) {
		t.Error("the certificate file is not the one the test wrote")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Errorf("the operator's directory holds %d files, want their 2", len(entries))
	}
}

func pemBody(der []byte) []byte {
	return bytes.TrimSpace(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

func waitServed(t *testing.T, addr, sni string, want []byte) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !bytes.Equal(served(t, addr, sni), want); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("SNI %q: the new certificate was not served", sni)
		}
	}
}

// TestClientConfigTrustsItsOwn: the panel's client accepts the certificate
// its own process serves, signed by a CA it does not know, and nothing
// else that CA signed.
func TestClientConfigTrustsItsOwn(t *testing.T) {
	own, pool := builtin(t)
	src := pki.NewSource(own)
	ca := pkitest.NewCA(t, "Operator CA")
	dir := t.TempDir()
	ca.Issue(t, dir, "cloud.example.net")
	if err := src.UseFiles(pki.OwnFiles{Cert: filepath.Join(dir, "cert.pem"), Key: filepath.Join(dir, "key.pem"), Host: "cloud.example.net"}); err != nil {
		t.Fatal(err)
	}
	ours := serveTLS(t, src.ServerConfig())

	// A stranger with another certificate from the same CA.
	dir2 := t.TempDir()
	ca.Issue(t, dir2, "cloud.example.net")
	stranger, err := tls.LoadX509KeyPair(filepath.Join(dir2, "cert.pem"), filepath.Join(dir2, "key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	theirs := serveTLS(t, &tls.Config{Certificates: []tls.Certificate{stranger}})

	dial := func(addr, name string) error {
		cfg := src.ClientConfig(pool)
		cfg.ServerName = name
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
		if err == nil {
			c.Close()
		}
		return err
	}
	for _, tc := range []struct {
		addr, name string
		ok         bool
	}{
		{ours, "cloud.example.net", true},
		{ours, "localhost", true}, // the built-in one, through pool
		{theirs, "cloud.example.net", false},
	} {
		if err := dial(tc.addr, tc.name); (err == nil) != tc.ok {
			t.Errorf("%s as %s: %v, want ok=%v", tc.addr, tc.name, err, tc.ok)
		}
	}
}
