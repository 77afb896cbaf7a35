package cloud

import (
	"crypto/x509"
	"fmt"
	"net/http"
	"os"
	"time"

	"nimbus/internal/billing"
	"nimbus/internal/panel"
)

// PanelOptions configure the web panel.
type PanelOptions struct {
	// SMTPURL is where the panel's e-mail goes; empty logs the links.
	SMTPURL string
	// Support is the operator's contacts until changed in the panel.
	Support panel.Support
	// SupportLimits bound each project's support requests (0: the panel's
	// defaults).
	SupportLimits panel.SupportLimits
}

// newPanel makes the web panel. It calls the services' public URLs over
// HTTPS like any client, trusting the cloud's CA and the certificate the
// cloud presents (the operator's or ACME's, whatever its CA).
func (c *Cloud) newPanel() (*panel.Panel, error) {
	cfg := c.Config
	pem, err := os.ReadFile(c.CACertFile)
	if err != nil {
		return nil, fmt.Errorf("cloud: panel: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	hc := &http.Client{Timeout: time.Minute, Transport: &http.Transport{
		TLSClientConfig: c.certs.ClientConfig(pool), MaxIdleConnsPerHost: 64,
		ForceAttemptHTTP2: true,
	}}
	money := panel.Money{Currency: cfg.Billing.Currency, Presentation: cfg.Billing.PresentationCurrency}
	if money.Currency == "" {
		money.Currency = "RUB"
	}
	if money.Presentation != "" {
		if money.Rate, err = billing.ParseRate(cfg.Billing.PresentationRate); err != nil {
			money.Presentation = "" // billing logs the bad rate and shows none either
		}
	}
	return panel.New(panel.Config{
		DB: c.DB, Identity: c.Identity, Compute: c.Compute, Billing: c.Billing, HTTPClient: hc,
		URLs: map[string]string{
			panel.Identity: c.IdentityURL, panel.Compute: c.ComputeURL, panel.Image: c.ImageURL,
			panel.Network: c.NetworkURL, panel.Volume: c.VolumeURL, panel.Billing: c.BillingURL,
		},
		ConsoleURL: c.ConsoleURL, PublicURL: c.PanelURL, Money: money,
		SMTPURL: cfg.Panel.SMTPURL, Support: cfg.Panel.Support, SupportLimits: cfg.Panel.SupportLimits, TestPayments: cfg.Billing.TestPayments, TokenTTL: cfg.TokenTTL, Log: cfg.Log.With("component", "panel"),
	})
}
