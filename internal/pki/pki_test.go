package pki

import (
	"bytes"
	"crypto/x509"
	"os"
	"testing"
)

func TestEnsure(t *testing.T) {
	dir := t.TempDir()
	f := FilesIn(dir)
	first, err := Ensure(f, []string{"localhost", "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []struct {
		path string
		mode os.FileMode
	}{{f.CAKey, 0o600}, {f.Key, 0o600}, {f.CACert, 0o644}, {f.Cert, 0o644}} {
		st, err := os.Stat(p.path)
		if err != nil || st.Mode().Perm() != p.mode {
			t.Errorf("%s: %v mode %v, want %v", p.path, err, st.Mode().Perm(), p.mode)
		}
	}
	ca, _ := os.ReadFile(f.CACert)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	leaf, _ := x509.ParseCertificate(first.Certificate[0])
	for _, name := range []string{"localhost", "127.0.0.1"} {
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, DNSName: name}); err != nil {
			t.Errorf("certificate does not verify for %s: %v", name, err)
		}
	}

	tests := []struct {
		name    string
		hosts   []string
		reissue bool
	}{
		{"same names keep the certificate", []string{"127.0.0.1", "localhost"}, false},
		{"a subset keeps it", []string{"localhost"}, false},
		{"a new name reissues it", []string{"localhost", "cloud.example.net"}, true},
	}
	prev := first
	for _, tt := range tests {
		got, err := Ensure(f, tt.hosts)
		if err != nil {
			t.Fatal(err)
		}
		if changed := !bytes.Equal(got.Certificate[0], prev.Certificate[0]); changed != tt.reissue {
			t.Errorf("%s: reissued = %v", tt.name, changed)
		}
		prev = got
	}
	// The CA stays the same throughout, so clients keep trusting it.
	if ca2, _ := os.ReadFile(f.CACert); !bytes.Equal(ca, ca2) {
		t.Error("the CA changed")
	}
}
