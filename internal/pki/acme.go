package pki

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/crypto/acme"
)

// LetsEncrypt is Let's Encrypt's production ACME directory, the default.
const LetsEncrypt = acme.LetsEncryptURL

// ACME configures certificates from an ACME CA for the public host name.
//
// The challenge is TLS-ALPN-01 (RFC 8737): the CA connects to port 443 of
// the host and asks, by ALPN, for a challenge certificate, which every
// Nimbus listener answers (Source.ServerConfig), so no plain-HTTP port 80
// is opened as HTTP-01 would need and no DNS provider's API is driven as
// DNS-01 would. Port 443 must reach one of the listeners: --panel-port 443,
// or a redirect of 443 to the panel's port.
type ACME struct {
	// Directory is the CA's directory URL ("": Let's Encrypt).
	Directory string
	// Email is the account's contact ("": none).
	Email string
	// Host is the name certified: the cloud's public host name.
	Host string
	// Dir keeps the account key and the certificates, under a directory
	// per CA, so that moving from a staging CA to a production one does
	// not serve the staging one's certificate.
	Dir string
	// HTTPClient talks to the CA (nil: the system's roots).
	HTTPClient *http.Client
	// RetryMin and RetryMax bound the wait after a failed attempt, doubled
	// from one to the next (0: 2 minutes and 4 hours, within Let's
	// Encrypt's five failed validations per host an hour).
	RetryMin, RetryMax time.Duration
	Log                *slog.Logger
}

// ACMEManager obtains and renews the public certificate.
type ACMEManager struct {
	cfg      ACME
	src      *Source
	key      crypto.Signer
	certFile string
	keyFile  string
}

// UseACME serves the certificate an ACME CA issued for cfg.Host, once
// there is one: the one kept in cfg.Dir from an earlier run at once, a new
// one when the returned manager's Run obtains it. Until then the names get
// the built-in certificate.
func (s *Source) UseACME(cfg ACME) (*ACMEManager, error) {
	if cfg.Directory == "" {
		cfg.Directory = LetsEncrypt
	}
	if cfg.RetryMin <= 0 {
		cfg.RetryMin = 2 * time.Minute
	}
	if cfg.RetryMax < cfg.RetryMin {
		cfg.RetryMax = max(4*time.Hour, cfg.RetryMin)
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if !IsHostName(cfg.Host) {
		return nil, fmt.Errorf("pki: ACME certifies a DNS name, not %q", cfg.Host)
	}
	dir := filepath.Join(cfg.Dir, caDirName(cfg.Directory))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("pki: ACME: %w", err)
	}
	key, err := loadOrMakeKey(filepath.Join(dir, "account-key.pem"))
	if err != nil {
		return nil, fmt.Errorf("pki: ACME account key: %w", err)
	}
	m := &ACMEManager{cfg: cfg, src: s, key: key,
		certFile: filepath.Join(dir, cfg.Host+".pem"), keyFile: filepath.Join(dir, cfg.Host+"-key.pem")}
	if p, err := loadPair(m.certFile, m.keyFile, cfg.Host); err == nil && time.Now().Before(p.leaf.NotAfter) {
		s.setPublic(p)
	} else if !errors.Is(err, os.ErrNotExist) && err != nil {
		cfg.Log.Warn("acme: the kept certificate does not load; a new one is ordered", "cert", m.certFile, "error", err)
	}
	return m, nil
}

// IsHostName accepts the DNS names a CA can certify, which also make safe
// file names: letters, digits, hyphens and dots, not an IP address.
func IsHostName(h string) bool {
	if h == "" || len(h) > 253 || strings.HasPrefix(h, ".") || strings.HasSuffix(h, ".") || strings.Contains(h, "..") {
		return false
	}
	digitsAndDots := true
	for _, r := range h {
		switch {
		case r >= '0' && r <= '9' || r == '.':
		case r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r == '-':
			digitsAndDots = false
		default:
			return false
		}
	}
	return !digitsAndDots
}

// caDirName is the directory a CA's files are kept in: its host (and port).
func caDirName(directory string) string {
	u, err := url.Parse(directory)
	if err != nil || u.Host == "" {
		return "acme"
	}
	return "acme-" + strings.NewReplacer(":", "_", "/", "_").Replace(u.Host)
}

// CertFile is where the certificate (with its chain) is kept.
func (m *ACMEManager) CertFile() string { return m.certFile }

// RenewAt is when a certificate is renewed: two thirds into its life,
// which for Let's Encrypt's 90 days leaves 30, as it advises, and scales
// to its 6-day and 45-day profiles.
func RenewAt(leaf *x509.Certificate) time.Time {
	return leaf.NotBefore.Add(leaf.NotAfter.Sub(leaf.NotBefore) * 2 / 3)
}

// Run obtains the certificate when there is none and renews it from
// RenewAt on, until ctx ends. A failure is logged and tried again later,
// the certificate in use served meanwhile.
func (m *ACMEManager) Run(ctx context.Context) {
	retry := m.cfg.RetryMin
	for {
		if leaf := m.src.Public(); leaf != nil {
			if wait := time.Until(RenewAt(leaf)); wait > 0 {
				if !sleep(ctx, wait) {
					return
				}
				continue
			}
		}
		err := m.obtain(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			m.cfg.Log.Error("acme: no certificate obtained; the one in use stays", "host", m.cfg.Host,
				"directory", m.cfg.Directory, "error", err, "retry_in", retry.String())
			if !sleep(ctx, retry) {
				return
			}
			retry = min(2*retry, m.cfg.RetryMax)
			continue
		}
		retry = m.cfg.RetryMin
		leaf := m.src.Public()
		m.cfg.Log.Info("acme: certificate obtained", "host", m.cfg.Host, "issuer", leaf.Issuer.String(),
			"not_after", leaf.NotAfter, "renew_at", RenewAt(leaf), "cert", m.certFile)
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// obtainTimeout bounds one order from account to certificate.
const obtainTimeout = 5 * time.Minute

// obtain orders a certificate for the host (RFC 8555 section 7.4),
// answers its authorizations' TLS-ALPN-01 challenges, keeps the
// certificate in the data directory and serves it.
func (m *ACMEManager) obtain(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, obtainTimeout)
	defer cancel()
	c := &acme.Client{Key: m.key, DirectoryURL: m.cfg.Directory, HTTPClient: m.cfg.HTTPClient, UserAgent: "nimbus"}
	acct := &acme.Account{}
	if m.cfg.Email != "" {
		acct.Contact = []string{"mailto:" + m.cfg.Email}
	}
	// The key's account when it has one (ErrAccountAlreadyExists).
	if _, err := c.Register(ctx, acct, acme.AcceptTOS); err != nil && !errors.Is(err, acme.ErrAccountAlreadyExists) {
		return fmt.Errorf("account: %w", err)
	}
	order, err := c.AuthorizeOrder(ctx, acme.DomainIDs(m.cfg.Host))
	if err != nil {
		return fmt.Errorf("new order: %w", err)
	}
	for _, u := range order.AuthzURLs {
		if err := m.authorize(ctx, c, u); err != nil {
			return err
		}
	}
	if order, err = c.WaitOrder(ctx, order.URI); err != nil {
		return fmt.Errorf("order: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{DNSNames: []string{m.cfg.Host}}, key)
	if err != nil {
		return err
	}
	chain, _, err := c.CreateCertFromOrder(ctx, order, csr, true)
	if err != nil {
		return fmt.Errorf("finalize: %w", err)
	}
	var certPEM []byte
	for _, der := range chain {
		certPEM = append(certPEM, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: mustMarshalKey(key)})
	p, err := parsePair(certPEM, keyPEM)
	if err != nil {
		return fmt.Errorf("the CA's certificate: %w", err)
	}
	if err := p.leaf.VerifyHostname(m.cfg.Host); err != nil {
		return fmt.Errorf("the CA's certificate: %w", err)
	}
	// The key first: a crash between the two leaves a pair that does not
	// load, and the next start orders again, rather than a new
	// certificate beside the old key.
	if err := writeFile(m.keyFile, keyPEM, 0o600); err != nil {
		return err
	}
	if err := writeFile(m.certFile, certPEM, 0o644); err != nil {
		return err
	}
	m.src.setPublic(p)
	return nil
}

// authorize answers one authorization's TLS-ALPN-01 challenge, unless the
// CA holds it valid already (an authorization reused within its life).
func (m *ACMEManager) authorize(ctx context.Context, c *acme.Client, url string) error {
	z, err := c.GetAuthorization(ctx, url)
	if err != nil {
		return fmt.Errorf("authorization: %w", err)
	}
	if z.Status == acme.StatusValid {
		return nil
	}
	var chal *acme.Challenge
	for _, ch := range z.Challenges {
		if ch.Type == "tls-alpn-01" {
			chal = ch
		}
	}
	if chal == nil {
		return fmt.Errorf("the CA offers no tls-alpn-01 challenge for %s", z.Identifier.Value)
	}
	cert, err := c.TLSALPN01ChallengeCert(chal.Token, z.Identifier.Value)
	if err != nil {
		return err
	}
	m.src.setChallenge(z.Identifier.Value, &cert)
	defer m.src.setChallenge(z.Identifier.Value, nil)
	if _, err := c.Accept(ctx, chal); err != nil {
		return fmt.Errorf("challenge: %w", err)
	}
	if _, err := c.WaitAuthorization(ctx, url); err != nil {
		return fmt.Errorf("validation of %s on port 443: %w", z.Identifier.Value, err)
	}
	return nil
}

func loadOrMakeKey(path string) (crypto.Signer, error) {
	if data, err := os.ReadFile(path); err == nil {
		block, _ := pem.Decode(data)
		if block == nil {
			return nil, fmt.Errorf("%s holds no PEM key", path)
		}
		return x509.ParseECPrivateKey(block.Bytes)
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	return key, writePEM(path, "EC PRIVATE KEY", mustMarshalKey(key), 0o600)
}

func writeFile(path string, data []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
