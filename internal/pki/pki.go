// Package pki makes and keeps Nimbus's own certificate authority and the
// server certificate every HTTPS listener presents, so that TLS is on from
// the first start and clients trust it through one CA file.
package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Files are the paths of the CA and server certificate in a data directory.
type Files struct {
	CACert, CAKey, Cert, Key string
}

// FilesIn gives the standard file names inside dir.
func FilesIn(dir string) Files {
	return Files{
		CACert: filepath.Join(dir, "ca.pem"),
		CAKey:  filepath.Join(dir, "ca-key.pem"),
		Cert:   filepath.Join(dir, "server.pem"),
		Key:    filepath.Join(dir, "server-key.pem"),
	}
}

// Ensure makes the CA when it is missing and (re)issues the server
// certificate when it is missing, expires within 30 days, does not cover
// every name in hosts or was signed by an earlier CA. It returns the server's TLS certificate. It never
// overwrites a server certificate its CA did not sign: that is someone
// else's (an operator who put theirs in its place), to be given with
// --tls-cert instead.
func Ensure(f Files, hosts []string) (tls.Certificate, error) {
	caCert, caKey, err := loadOrMakeCA(f)
	if err != nil {
		return tls.Certificate{}, err
	}
	if err := ownedBy(f.Cert, caCert); err != nil {
		return tls.Certificate{}, err
	}
	if cert, err := tls.LoadX509KeyPair(f.Cert, f.Key); err == nil && covers(cert, hosts) && cert.Leaf.CheckSignatureFrom(caCert) == nil {
		return cert, nil
	}
	if err := issue(f, caCert, caKey, hosts); err != nil {
		return tls.Certificate{}, err
	}
	return tls.LoadX509KeyPair(f.Cert, f.Key)
}

func covers(cert tls.Certificate, hosts []string) bool {
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil || time.Until(leaf.NotAfter) < 30*24*time.Hour {
		return false
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			if !slices.ContainsFunc(leaf.IPAddresses, ip.Equal) {
				return false
			}
		} else if !slices.Contains(leaf.DNSNames, h) {
			return false
		}
	}
	return true
}

// ownedBy refuses a certificate in path that neither ca nor an earlier
// Nimbus CA (one whose files were removed to make a new one) issued. A
// missing or unreadable file is Nimbus's to (re)make.
func ownedBy(path string, ca *x509.Certificate) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	block, _ := pem.Decode(data)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil
	}
	leaf, err := x509.ParseCertificate(block.Bytes)
	if err != nil || leaf.CheckSignatureFrom(ca) == nil || isNimbusCA(leaf.Issuer) {
		return nil
	}
	return fmt.Errorf("pki: %s was not issued by Nimbus's CA (%s, %s), so it is not overwritten: "+
		"to serve it, move it and its key out of the data directory and give them with --tls-cert and --tls-key", path, leaf.Issuer, names(leaf))
}

// caName is the subject of the CA made for host.
func caName(host string) pkix.Name {
	return pkix.Name{CommonName: "Nimbus CA " + host, Organization: []string{"Nimbus"}}
}

func isNimbusCA(n pkix.Name) bool {
	return strings.HasPrefix(n.CommonName, "Nimbus CA ") && slices.Equal(n.Organization, []string{"Nimbus"})
}

func loadOrMakeCA(f Files) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	certPEM, err1 := os.ReadFile(f.CACert)
	keyPEM, err2 := os.ReadFile(f.CAKey)
	if err1 == nil && err2 == nil {
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return nil, nil, fmt.Errorf("pki: CA in %s: %w", f.CACert, err)
		}
		cert, err := x509.ParseCertificate(pair.Certificate[0])
		if err != nil {
			return nil, nil, err
		}
		key, ok := pair.PrivateKey.(*ecdsa.PrivateKey)
		if !ok {
			return nil, nil, errors.New("pki: CA key is not ECDSA")
		}
		return cert, key, nil
	}
	if !errors.Is(err1, os.ErrNotExist) && err1 != nil {
		return nil, nil, err1
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	host, _ := os.Hostname()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               caName(host),
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().AddDate(10, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	if err := writePEM(f.CAKey, "EC PRIVATE KEY", mustMarshalKey(key), 0o600); err != nil {
		return nil, nil, err
	}
	if err := writePEM(f.CACert, "CERTIFICATE", der, 0o644); err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	return cert, key, err
}

func issue(f Files, ca *x509.Certificate, caKey *ecdsa.PrivateKey, hosts []string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "nimbus", Organization: []string{"Nimbus"}},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().AddDate(2, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return err
	}
	if err := writePEM(f.Key, "EC PRIVATE KEY", mustMarshalKey(key), 0o600); err != nil {
		return err
	}
	return writePEM(f.Cert, "CERTIFICATE", der, 0o644)
}

func mustMarshalKey(k *ecdsa.PrivateKey) []byte {
	b, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		panic(err)
	}
	return b
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}

func writePEM(path, typ string, der []byte, mode os.FileMode) error {
	return writeFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), mode)
}

// DefaultHosts are the names every server certificate covers: the loopback
// names and this machine's host name and addresses.
func DefaultHosts(extra ...string) []string {
	hosts := []string{"localhost", "127.0.0.1", "::1"}
	if h, err := os.Hostname(); err == nil && h != "" {
		hosts = append(hosts, h)
	}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && !ipn.IP.IsLinkLocalUnicast() {
				hosts = append(hosts, ipn.IP.String())
			}
		}
	}
	for _, e := range extra {
		if e != "" && e != "0.0.0.0" && e != "::" {
			hosts = append(hosts, e)
		}
	}
	slices.Sort(hosts)
	return slices.Compact(hosts)
}
