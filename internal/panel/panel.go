// Package panel is Nimbus's web control panel: sign-up, the configurator
// with its live price, servers, storage, networks, billing, API access,
// support, and the operator's pages. Pages are rendered on the server with
// html/template; a little JavaScript (embedded, no build step) makes the
// price and the server states live, and every flow works without it.
//
// The panel holds no rights of its own over customers' resources: it signs
// a user in through identity and then calls the same OpenStack and billing
// APIs the CLI calls, over HTTPS, with the user's own Keystone token. What
// it keeps itself is its sessions, pending sign-ups, support settings and
// customers' support requests.
package panel

import (
	"context"
	"log/slog"
	"math/big"
	"net/http"
	"slices"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/billing"
	"nimbus/internal/compute"
	"nimbus/internal/identity"
	"nimbus/internal/store"
)

// Config is what the panel needs.
type Config struct {
	DB *store.DB
	// Identity signs users in and makes accounts; Compute answers the
	// configurator (flavors for any choice, live capacity); Billing gives
	// the price list and quotes to visitors who are not signed in yet.
	Identity *identity.Service
	Compute  *compute.Service
	Billing  *billing.Service
	// HTTPClient calls the APIs at URLs (by catalog type: identity, compute,
	// image, network, volume, billing; each the base URL as in the catalog).
	HTTPClient *http.Client
	URLs       map[string]string
	// ConsoleURL is the noVNC console proxy's origin, which the server page
	// frames.
	ConsoleURL string
	// PublicURL is the panel's own address, for links in e-mail.
	PublicURL string
	// Money is the account currency and the presentation currency.
	Money Money
	// SMTPURL is where verification and reset e-mail goes
	// (smtp://user:pass@host:port?from=…); empty writes the links to the log.
	SMTPURL string
	// Support is the operator's contacts until changed in the panel.
	Support Support
	// SupportLimits bound each project's support requests.
	SupportLimits SupportLimits
	// TestPayments offers billing's simulated payment providers (test,
	// webhook-test) on the top-up form, as billing does.
	TestPayments bool
	// TokenTTL is how long a sign-in lasts (the Keystone token's life).
	TokenTTL time.Duration
	Log      *slog.Logger
	Now      func() time.Time
}

// Money formats amounts: minor units of Currency, with the presentation
// currency beside them at Rate (major units of Presentation per major unit
// of Currency), when set.
type Money struct {
	Currency     string
	Presentation string
	Rate         *big.Rat
}

// Support is the operator's contacts, shown on the support page.
type Support struct {
	Messenger, Email, Phone, Hours string
}

// Panel serves the web control panel.
type Panel struct {
	cfg      Config
	sessions sessions
	pages    pageSet
	mux      *http.ServeMux
}

// New makes the panel.
func New(cfg Config) (*Panel, error) {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = func() time.Time { return time.Now().UTC() }
	}
	if cfg.TokenTTL <= 0 {
		cfg.TokenTTL = time.Hour
	}
	pages, err := parsePages(cfg.Money)
	if err != nil {
		return nil, err
	}
	p := &Panel{cfg: cfg, sessions: sessions{db: cfg.DB, now: cfg.Now}, pages: pages, mux: http.NewServeMux()}
	for _, rt := range p.routes() {
		p.mux.Handle(rt.pattern, p.wrap(rt))
	}
	p.mux.Handle("GET /static/", staticHandler())
	p.mux.Handle("/", p.wrap(route{access: public, h: func(q *req) error { return errNotFound }}))
	return p, nil
}

// Handler is the panel's HTTP handler.
func (p *Panel) Handler() http.Handler { return p.mux }

// PurgeSessions removes expired sessions; the controller's housekeeping
// calls it with its other periodic purges.
func (p *Panel) PurgeSessions(ctx context.Context) error { return p.sessions.purge(ctx) }

// access is who may open a route.
type access int

const (
	public access = iota // anyone, signed in or not
	member               // a signed-in user
	admin                // a signed-in user with the admin role
)

// route is one page or form action.
type route struct {
	pattern string
	access  access
	h       func(q *req) error
}

// routes are every page, by area; each area's file owns its list.
func (p *Panel) routes() []route {
	return slices.Concat(p.coreRoutes(), p.accountRoutes(), p.serverRoutes(), p.configuratorRoutes(),
		p.resourceRoutes(), p.billingRoutes(), p.accessRoutes(), p.supportRoutes(), p.adminRoutes())
}

// clientIP is the browser's address, for rate limits: the same key the
// APIs count by (an IPv6 /64), so the panel is no wider a door.
func clientIP(r *http.Request) string { return api.ClientAddress(r) }
