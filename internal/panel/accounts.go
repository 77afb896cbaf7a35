package panel

import (
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"nimbus/internal/identity"
	"nimbus/internal/store"
)

// accountRoutes are sign-up with e-mail verification, password reset and
// two-factor sign-in.
func (p *Panel) accountRoutes() []route {
	return []route{
		{"GET /signup", public, p.signupPage},
		{"POST /signup", public, p.signup},
		{"GET /verify", public, p.verify},
		{"GET /reset", public, p.resetPage},
		{"POST /reset", public, p.resetRequest},
		{"GET /reset/{token}", public, p.resetFormPage},
		{"POST /reset/{token}", public, p.resetPassword},
		{"GET /account/security", member, p.securityPage},
		{"POST /account/security", member, p.securityChange},
		{"POST /login/totp", public, p.loginTOTP},
	}
}

const (
	minPassword = 10
	signupTTL   = 24 * time.Hour
	resetTTL    = time.Hour
)

// accountState is what the account pages keep in memory: rate limits.
// (Sign-ins waiting for their second factor are identity's receipts.)
type accountState struct {
	byAddr, byEmail *rateLimit
}

var accountStates sync.Map // *Panel → *accountState

func (p *Panel) acctState() *accountState {
	if v, ok := accountStates.Load(p); ok {
		return v.(*accountState)
	}
	v, _ := accountStates.LoadOrStore(p, &accountState{
		byAddr:  newRateLimit(10, time.Hour),
		byEmail: newRateLimit(3, time.Hour),
	})
	return v.(*accountState)
}

// linkHash is how a mailed link's token is stored.
func linkHash(token string) string {
	h := sha256.Sum256([]byte("nimbus-panel-link\x00" + token))
	return base64.RawURLEncoding.EncodeToString(h[:])
}

// link is an absolute panel URL for e-mail.
func (p *Panel) link(q *req, path string) string {
	base := p.cfg.PublicURL
	if base == "" {
		base = "https://" + q.r.Host
	}
	return strings.TrimSuffix(base, "/") + path
}

type signupData struct {
	Email, Next, Error string
	Promo, Sent        bool
	MinPassword        int
}

func (p *Panel) signupPage(q *req) error {
	return q.render("signup", q.T("Sign up"), signupData{Next: safeNext(q.r.URL.Query().Get("next")), MinPassword: minPassword})
}

// signup stores a pending sign-up and mails its verification link. An
// address that already has an account gets a mail saying so instead, and
// the page says the same in both cases, so the form tells no one which
// addresses have accounts.
func (p *Panel) signup(q *req) error {
	f := q.r.PostForm
	d := signupData{Email: strings.ToLower(strings.TrimSpace(f.Get("email"))), Next: safeNext(f.Get("next")),
		Promo: f.Get("promo") == "on", MinPassword: minPassword}
	if err := p.limited(q, d.Email); err != nil {
		return err
	}
	pw := f.Get("password")
	switch {
	case !validEmail(d.Email):
		d.Error = q.T("Enter a valid e-mail address.")
	case len([]rune(pw)) < minPassword:
		d.Error = q.T("The password must be at least %d characters long.", minPassword)
	case pw != f.Get("password2"):
		d.Error = q.T("The passwords do not match.")
	}
	if d.Error != "" {
		return q.renderStatus(http.StatusBadRequest, "signup", q.T("Sign up"), d)
	}
	ctx := q.r.Context()
	if _, err := p.cfg.Identity.UserByName(ctx, d.Email); err == nil {
		d.Sent = true
		body := q.T("Someone (perhaps you) tried to sign up with this address, which already has an account.") + "\n\n" +
			q.T("Sign in:") + " " + p.link(q, "/login") + "\n" + q.T("Forgot your password?") + " " + p.link(q, "/reset") + "\n"
		if err := p.sendMail(d.Email, q.T("You already have an account"), body); err != nil {
			return err
		}
		return q.render("signup", q.T("Check your e-mail"), d)
	} else if !errors.Is(err, store.ErrNotFound) {
		return err
	}
	hash, err := identity.HashPassword(pw)
	if err != nil {
		return BadRequest(q.T("The password is too long."))
	}
	token, now := newSecret(), p.cfg.Now()
	if err := p.purgeLinks(q, now); err != nil {
		return err
	}
	_, err = p.cfg.DB.Exec(ctx, `INSERT INTO panel_signups (token_hash, email, password_hash, promo, next_path, created_at, expires_at)
		VALUES (?, ?, ?, ?, ?, ?, ?)`, linkHash(token), d.Email, hash, boolInt(d.Promo), d.Next, now.Unix(), now.Add(signupTTL).Unix())
	if err != nil {
		return err
	}
	body := q.T("Confirm your e-mail address to finish signing up:") + "\n\n" + p.link(q, "/verify?token="+url.QueryEscape(token)) +
		"\n\n" + q.T("The link works for 24 hours. If you did not sign up, ignore this message.") + "\n"
	if err := p.sendMail(d.Email, q.T("Confirm your e-mail address"), body); err != nil {
		return err
	}
	d.Sent = true
	return q.render("signup", q.T("Check your e-mail"), d)
}

// purgeLinks forgets sign-ups and reset links that have expired, so the
// tables hold only what the rate limits let in within a day.
func (p *Panel) purgeLinks(q *req, now time.Time) error {
	for _, t := range []string{"panel_signups", "panel_resets"} {
		if _, err := p.cfg.DB.Exec(q.r.Context(), "DELETE FROM "+t+" WHERE expires_at <= ?", now.Unix()); err != nil {
			return err
		}
	}
	return nil
}

// limited answers 429 when the address or the e-mail has asked too often.
func (p *Panel) limited(q *req, email string) error {
	a := p.acctState()
	if !a.byAddr.allow(clientIP(q.r), p.cfg.Now()) || (email != "" && !a.byEmail.allow(email, p.cfg.Now())) {
		q.w.Header().Set("Retry-After", "3600")
		return &APIError{Status: http.StatusTooManyRequests,
			Message: q.T("Too many requests from your address or for this e-mail. Try again in an hour.")}
	}
	return nil
}

// validEmail is identity's rule, which registration applies too.
func validEmail(s string) bool { return identity.ValidEmail(s) }

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

type verifyData struct {
	OK   bool
	Next string
}

// verify makes the account of a verified sign-up: identity.Register makes
// the project, the user with member, the network, security group and
// billing account in one transaction. The user then signs in (the panel
// never holds the password to do it for them).
func (p *Panel) verify(q *req) error {
	ctx := q.r.Context()
	h := linkHash(q.r.URL.Query().Get("token"))
	var email, hash, next string
	var promo int
	var expires int64
	err := p.cfg.DB.QueryRow(ctx, "SELECT email, password_hash, promo, next_path, expires_at FROM panel_signups WHERE token_hash = ?", h).
		Scan(&email, &hash, &promo, &next, &expires)
	if store.IsNoRows(err) || (err == nil && p.cfg.Now().Unix() >= expires) {
		return q.renderStatus(http.StatusNotFound, "verify", q.T("Link expired"), verifyData{})
	}
	if err != nil {
		return err
	}
	reg, err := p.cfg.Identity.Register(ctx, identity.Registration{Email: email, PasswordHash: hash})
	if err != nil && StatusOf(err) != http.StatusConflict {
		return err
	}
	if _, err := p.cfg.DB.Exec(ctx, "DELETE FROM panel_signups WHERE email = ?", email); err != nil {
		return err
	}
	if reg != nil {
		if _, err := p.cfg.DB.Exec(ctx, "INSERT INTO panel_accounts (user_id, email, promo, created_at) VALUES (?, ?, ?, ?)",
			reg.UserID, email, promo, p.cfg.Now().Unix()); err != nil {
			return err
		}
	}
	return q.render("verify", q.T("Your account is ready"), verifyData{OK: true, Next: "/login?next=" + url.QueryEscape(safeNext(next))})
}

type resetData struct {
	Email, Error, Token string
	Sent                bool
	MinPassword         int
}

func (p *Panel) resetPage(q *req) error {
	return q.render("reset", q.T("Reset your password"), resetData{})
}

// resetRequest mails a reset link when the address has an account; the
// page is the same either way.
func (p *Panel) resetRequest(q *req) error {
	email := strings.ToLower(strings.TrimSpace(q.r.PostForm.Get("email")))
	if err := p.limited(q, email); err != nil {
		return err
	}
	ctx := q.r.Context()
	u, err := p.cfg.Identity.UserByName(ctx, email)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return err
	}
	if err == nil && u.Enabled && validEmail(email) {
		if err := p.purgeLinks(q, p.cfg.Now()); err != nil {
			return err
		}
		token := newSecret()
		if _, err := p.cfg.DB.Exec(ctx, "INSERT INTO panel_resets (token_hash, user_id, expires_at) VALUES (?, ?, ?)",
			linkHash(token), u.ID, p.cfg.Now().Add(resetTTL).Unix()); err != nil {
			return err
		}
		body := q.T("Set a new password for your account:") + "\n\n" + p.link(q, "/reset/"+token) + "\n\n" +
			q.T("The link works for one hour. If you did not ask for it, ignore this message.") + "\n"
		if err := p.sendMail(email, q.T("Reset your password"), body); err != nil {
			return err
		}
	}
	return q.render("reset", q.T("Check your e-mail"), resetData{Sent: true})
}

// resetUser is the user a live reset link is for, "" if none.
func (p *Panel) resetUser(q *req) (string, error) {
	var user string
	err := p.cfg.DB.QueryRow(q.r.Context(), "SELECT user_id FROM panel_resets WHERE token_hash = ? AND expires_at > ?",
		linkHash(q.r.PathValue("token")), p.cfg.Now().Unix()).Scan(&user)
	if store.IsNoRows(err) {
		return "", nil
	}
	return user, err
}

func (p *Panel) resetFormPage(q *req) error {
	user, err := p.resetUser(q)
	if err != nil {
		return err
	}
	if user == "" {
		return q.renderStatus(http.StatusNotFound, "verify", q.T("Link expired"), verifyData{})
	}
	return q.render("reset_form", q.T("Choose a new password"), resetData{Token: q.r.PathValue("token"), MinPassword: minPassword})
}

// resetPassword sets the new password through identity (which revokes the
// user's tokens and lifts a lockout) and ends every panel session of the
// user.
func (p *Panel) resetPassword(q *req) error {
	user, err := p.resetUser(q)
	if err != nil {
		return err
	}
	if user == "" {
		return q.renderStatus(http.StatusNotFound, "verify", q.T("Link expired"), verifyData{})
	}
	pw := q.r.PostForm.Get("password")
	d := resetData{Token: q.r.PathValue("token"), MinPassword: minPassword}
	switch {
	case len([]rune(pw)) < minPassword:
		d.Error = q.T("The password must be at least %d characters long.", minPassword)
	case pw != q.r.PostForm.Get("password2"):
		d.Error = q.T("The passwords do not match.")
	}
	if d.Error != "" {
		return q.renderStatus(http.StatusBadRequest, "reset_form", q.T("Choose a new password"), d)
	}
	ctx := q.r.Context()
	if err := p.cfg.Identity.SetPassword(ctx, user, pw); err != nil {
		return err
	}
	if _, err := p.cfg.DB.Exec(ctx, "DELETE FROM panel_resets WHERE user_id = ?", user); err != nil {
		return err
	}
	if err := p.sessions.deleteUser(ctx, user); err != nil {
		return err
	}
	if q.s != nil && q.s.UserID == user {
		clearCookie(q.w, sessionCookie)
	}
	return q.redirect("/login", q.T("Your password is changed. Sign in with the new one."))
}

// rateLimit allows n events per key in a window, remembering at most
// maxKeys keys (forgetting all when full: a flood of new keys cannot make
// the panel keep more).
type rateLimit struct {
	mu     sync.Mutex
	n      int
	window time.Duration
	m      map[string][]time.Time
}

const maxKeys = 10_000

func newRateLimit(n int, window time.Duration) *rateLimit {
	return &rateLimit{n: n, window: window, m: map[string][]time.Time{}}
}

func (l *rateLimit) allow(key string, now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.m) >= maxKeys {
		l.m = map[string][]time.Time{}
	}
	kept := l.m[key][:0]
	for _, t := range l.m[key] {
		if now.Sub(t) < l.window {
			kept = append(kept, t)
		}
	}
	if len(kept) >= l.n {
		l.m[key] = kept
		return false
	}
	l.m[key] = append(kept, now)
	return true
}
