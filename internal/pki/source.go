package pki

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Source is the certificates every listener presents. A client that asks
// (by SNI) for a name the public certificate covers gets it: the operator's
// own (--tls-cert, reloaded when its files change) or an ACME CA's. Every
// other client (by IP address, loopback, the host name) gets the built-in
// CA's certificate, which the local agent, hosts' agents enrolled with
// ca.pem and a first run rely on.
type Source struct {
	builtin *tls.Certificate
	public  atomic.Pointer[keyPair]
	// previous is the public pair before the last swap, still trusted by
	// ClientConfig: a handshake may have begun just before it.
	previous atomic.Pointer[keyPair]

	mu         sync.Mutex
	challenges map[string]*tls.Certificate // TLS-ALPN-01, by identifier
}

// keyPair is a certificate with its parsed leaf and the bytes it was read
// from, to tell a replaced file from an unchanged one.
type keyPair struct {
	cert    *tls.Certificate
	leaf    *x509.Certificate
	certPEM []byte
	keyPEM  []byte
}

// NewSource serves builtin until a public certificate is set.
func NewSource(builtin tls.Certificate) *Source {
	return &Source{builtin: &builtin, challenges: map[string]*tls.Certificate{}}
}

// ServerConfig is the listeners' TLS configuration.
func (s *Source) ServerConfig() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: s.certificate, GetConfigForClient: s.challengeConfig}
}

func (s *Source) certificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	if p := s.public.Load(); p != nil && hello.ServerName != "" && p.leaf.VerifyHostname(hello.ServerName) == nil {
		return p.cert, nil
	}
	return s.builtin, nil
}

// acmeALPN is the protocol an ACME CA's TLS-ALPN-01 validation offers
// alone (RFC 8737 section 3).
const acmeALPN = "acme-tls/1"

// challengeConfig answers an ACME CA's validation connection with the
// challenge certificate of the name it asks for, and nothing else.
func (s *Source) challengeConfig(hello *tls.ClientHelloInfo) (*tls.Config, error) {
	if !slices.Equal(hello.SupportedProtos, []string{acmeALPN}) {
		return nil, nil
	}
	s.mu.Lock()
	cert := s.challenges[hello.ServerName]
	s.mu.Unlock()
	if cert == nil {
		return nil, fmt.Errorf("pki: no ACME challenge pending for %q", hello.ServerName)
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{*cert}, NextProtos: []string{acmeALPN}}, nil
}

func (s *Source) setChallenge(name string, cert *tls.Certificate) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if cert == nil {
		delete(s.challenges, name)
	} else {
		s.challenges[name] = cert
	}
}

// Public is the public certificate's leaf, nil while there is none.
func (s *Source) Public() *x509.Certificate {
	if p := s.public.Load(); p != nil {
		return p.leaf
	}
	return nil
}

func (s *Source) setPublic(p *keyPair) {
	if old := s.public.Swap(p); old != nil {
		s.previous.Store(old)
	}
}

// serves reports whether der is a certificate this source presents.
func (s *Source) serves(der []byte) bool {
	if bytes.Equal(der, s.builtin.Certificate[0]) {
		return true
	}
	for _, p := range []*keyPair{s.public.Load(), s.previous.Load()} {
		if p != nil && bytes.Equal(der, p.cert.Certificate[0]) {
			return true
		}
	}
	return false
}

// ClientConfig is for the clients inside this process that call the
// cloud's own public URLs (the panel): they trust roots and, whatever CA
// signed it, the very certificate this source presents, which an operator's
// private CA or an ACME test CA would otherwise make unknown to them. A peer
// presenting it has proved it holds its key in the handshake.
func (s *Source) ClientConfig(roots *x509.CertPool) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		// VerifyConnection does the verification, with the one extra rule.
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("pki: the server presented no certificate")
			}
			leaf := cs.PeerCertificates[0]
			if s.serves(leaf.Raw) {
				return nil
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			_, err := leaf.Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, DNSName: cs.ServerName})
			return err
		},
	}
}

// loadPair reads a certificate (with its chain) and its key, as an operator
// gives them, and checks that they belong together and that the
// certificate names host.
func loadPair(certFile, keyFile, host string) (*keyPair, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, err
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, err
	}
	p, err := parsePair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("%s and %s: %w", certFile, keyFile, err)
	}
	if err := p.leaf.VerifyHostname(host); err != nil {
		return nil, fmt.Errorf("%s names %s, not the public host %s", certFile, names(p.leaf), host)
	}
	return p, nil
}

func parsePair(certPEM, keyPEM []byte) (*keyPair, error) {
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return nil, err
	}
	cert.Leaf = leaf
	return &keyPair{cert: &cert, leaf: leaf, certPEM: certPEM, keyPEM: keyPEM}, nil
}

func names(leaf *x509.Certificate) string {
	n := slices.Clone(leaf.DNSNames)
	for _, ip := range leaf.IPAddresses {
		n = append(n, ip.String())
	}
	if len(n) == 0 {
		return "no host name"
	}
	return strings.Join(n, ", ")
}

// OwnFiles is the operator's own certificate: used as given, never written,
// read again when either file changes.
type OwnFiles struct {
	Cert, Key string
	// Host is the public host name the certificate must name.
	Host string
	// Every is how often the files are looked at (0: a minute).
	Every time.Duration
	Log   *slog.Logger
}

// UseFiles serves the operator's certificate as the public one. It fails
// when the files do not load, do not match or do not name the host.
func (s *Source) UseFiles(f OwnFiles) error {
	p, err := loadPair(f.Cert, f.Key, f.Host)
	if err != nil {
		return fmt.Errorf("pki: --tls-cert: %w", err)
	}
	s.setPublic(p)
	return nil
}

// WatchFiles reads the operator's files every f.Every until ctx ends and
// serves a pair that changed once it loads whole, so that a certificate
// renewed by another tool (certbot, a corporate CA's agent) reaches every
// listener without a restart. A pair caught half written, or no longer
// naming the host, is not taken: the one in use stays, and the next look
// tries again.
func (s *Source) WatchFiles(ctx context.Context, f OwnFiles) {
	every := f.Every
	if every <= 0 {
		every = time.Minute
	}
	log := f.Log
	if log == nil {
		log = slog.Default()
	}
	t := time.NewTicker(every)
	defer t.Stop()
	var lastErr string
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cur := s.public.Load()
		certPEM, err1 := os.ReadFile(f.Cert)
		keyPEM, err2 := os.ReadFile(f.Key)
		if err1 == nil && err2 == nil && cur != nil && bytes.Equal(certPEM, cur.certPEM) && bytes.Equal(keyPEM, cur.keyPEM) {
			lastErr = ""
			continue
		}
		p, err := loadPair(f.Cert, f.Key, f.Host)
		if err != nil {
			if err.Error() != lastErr { // once per distinct problem, not every look
				log.Warn("tls: the certificate files changed but do not load; the one in use stays", "cert", f.Cert, "key", f.Key, "error", err)
				lastErr = err.Error()
			}
			continue
		}
		lastErr = ""
		s.setPublic(p)
		log.Info("tls: certificate reloaded", "cert", f.Cert, "names", names(p.leaf), "not_after", p.leaf.NotAfter)
	}
}
