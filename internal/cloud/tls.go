package cloud

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"time"

	"nimbus/internal/pki"
)

// TLSOptions choose the certificate the listeners present for the public
// host name. With neither the operator's files nor ACME, the built-in CA's
// certificate serves every name, as on a first run; with either, it still
// serves the clients that ask for no name or another one (by IP address,
// the local agent on loopback, hosts' agents enrolled with ca.pem).
type TLSOptions struct {
	// CertFile (the certificate, then its chain) and KeyFile are the
	// operator's, used as given and never written; read again when they
	// change, looked at every ReloadEvery (0: a minute).
	CertFile, KeyFile string
	ReloadEvery       time.Duration
	// ACME, when set, has the certificate issued by an ACME CA instead;
	// its Host, Dir and Log are the cloud's (the public host, the data
	// directory).
	ACME *pki.ACME
}

// checkTLS refuses options that cannot serve the public host: each of its
// choices needs a name a client sends (SNI), which an IP address is not.
func checkTLS(cfg Config) error {
	o := cfg.TLS
	if (o.CertFile == "") != (o.KeyFile == "") {
		return errors.New("cloud: --tls-cert and --tls-key go together")
	}
	if o.CertFile != "" && o.ACME != nil {
		return errors.New("cloud: --tls-cert and ACME (--acme-email) are two ways to the same certificate: give one")
	}
	if (o.CertFile != "" || o.ACME != nil) && net.ParseIP(cfg.PublicHost) != nil {
		return fmt.Errorf("cloud: the certificate of --tls-cert or ACME is for a host name, and --public-host is the address %s", cfg.PublicHost)
	}
	builtin := pki.FilesIn(cfg.DataDir)
	for _, own := range []string{o.CertFile, o.KeyFile} {
		for _, b := range []string{builtin.Cert, builtin.Key, builtin.CACert, builtin.CAKey} {
			if own != "" && samePath(own, b) {
				return fmt.Errorf("cloud: %s is the built-in CA's file, which Nimbus writes: keep your certificate and key outside the data directory", own)
			}
		}
	}
	return nil
}

func samePath(a, b string) bool {
	aa, err1 := filepath.Abs(a)
	bb, err2 := filepath.Abs(b)
	return err1 == nil && err2 == nil && aa == bb
}

// startTLS makes the built-in certificate and the source every listener
// presents from, loading the operator's certificate or a kept ACME one.
func (c *Cloud) startTLS() error {
	cfg := c.Config
	if err := checkTLS(cfg); err != nil {
		return err
	}
	files := pki.FilesIn(cfg.DataDir)
	c.CACertFile = files.CACert
	cert, err := pki.Ensure(files, pki.DefaultHosts(cfg.Listen, cfg.PublicHost))
	if err != nil {
		return err
	}
	c.certs = pki.NewSource(cert)
	switch {
	case cfg.TLS.CertFile != "":
		return c.certs.UseFiles(c.ownFiles())
	case cfg.TLS.ACME != nil:
		a := *cfg.TLS.ACME
		a.Host, a.Dir, a.Log = cfg.PublicHost, cfg.DataDir, cfg.Log.With("component", "acme")
		c.acme, err = c.certs.UseACME(a)
		return err
	}
	return nil
}

func (c *Cloud) ownFiles() pki.OwnFiles {
	o := c.Config.TLS
	return pki.OwnFiles{Cert: o.CertFile, Key: o.KeyFile, Host: c.Config.PublicHost, Every: o.ReloadEvery,
		Log: c.Config.Log.With("component", "tls")}
}

// runTLS keeps the public certificate current until ctx ends.
func (c *Cloud) runTLS(ctx context.Context) {
	switch {
	case c.Config.TLS.CertFile != "":
		c.certs.WatchFiles(ctx, c.ownFiles())
	case c.acme != nil:
		c.acme.Run(ctx)
	}
}

// builtinServesCatalog reports whether the catalog's URLs meet the
// built-in CA's certificate, which clients then need ca.pem to trust.
func (c *Cloud) builtinServesCatalog() bool {
	return c.Config.TLS.CertFile == "" && c.Config.TLS.ACME == nil
}

// TLSSummary says, for the banner, which certificate the public host gets.
func (c *Cloud) TLSSummary() string {
	o := c.Config.TLS
	switch {
	case o.CertFile != "":
		leaf := c.certs.Public()
		return fmt.Sprintf("your certificate %s for %s, valid until %s (read again when it changes)",
			o.CertFile, c.Config.PublicHost, leaf.NotAfter.Format(time.DateOnly))
	case c.acme != nil:
		state := "none yet: the built-in one meanwhile; the CA validates on port 443 (TLS-ALPN-01)"
		if leaf := c.certs.Public(); leaf != nil {
			state = "valid until " + leaf.NotAfter.Format(time.DateOnly) + ", renewed from " + pki.RenewAt(leaf).Format(time.DateOnly)
		}
		return fmt.Sprintf("ACME (%s) for %s, kept in %s: %s", cmp.Or(o.ACME.Directory, pki.LetsEncrypt), c.Config.PublicHost, c.acme.CertFile(), state)
	}
	return "Nimbus's own CA: clients trust " + c.CACertFile
}
