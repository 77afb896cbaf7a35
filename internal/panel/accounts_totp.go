package panel

import (
	"crypto/rand"
	"encoding/base32"
	"errors"
	"net/http"
	"net/url"
	"strings"

	"nimbus/internal/api"
	"nimbus/internal/identity"
)

// Two-factor sign-in is identity's (Keystone's TOTP credentials and MFA
// rules): turning it on here makes the user a TOTP credential and the rules
// identity.PanelTOTPRules, and signing in asks identity for the password,
// then for the passcode with the auth receipt identity answered. So the
// API's token issue and this sign-in ask for the same factors; the panel
// keeps no secret and no pending sign-in of its own, only the receipt in a
// cookie of the browser that proved the password.

var b32 = base32.StdEncoding.WithPadding(base32.NoPadding)

type securityData struct {
	Enabled        bool
	Secret, URI    string
	Error, Message string
	Next           string
}

func (p *Panel) securityPage(q *req) error {
	on, err := p.cfg.Identity.TOTPEnabled(q.r.Context(), q.s.UserID)
	if err != nil {
		return err
	}
	d := securityData{Enabled: on}
	if !d.Enabled {
		d.Secret, d.URI = p.newTOTP(q)
	}
	return q.render("security", q.T("Two-factor sign-in"), d)
}

// newTOTP is a new random secret and its otpauth:// URI for an app.
func (p *Panel) newTOTP(q *req) (string, string) {
	key := make([]byte, 20)
	rand.Read(key)
	secret := b32.EncodeToString(key)
	return secret, totpURI(q.s.UserName, secret)
}

func totpURI(user, secret string) string {
	return "otpauth://totp/" + url.PathEscape("Nimbus:"+user) + "?secret=" + url.QueryEscape(secret) +
		"&issuer=Nimbus&algorithm=SHA1&digits=6&period=30"
}

// passcode is the code typed in a form, without the spaces apps show.
func passcode(q *req) string {
	return strings.ReplaceAll(strings.TrimSpace(q.r.PostForm.Get("code")), " ", "")
}

// securityChange turns two-factor sign-in on (the form carries the secret
// shown and a code made from it, proving the app has it) or off (with a
// current code), through identity.
func (p *Panel) securityChange(q *req) error {
	f, ctx := q.r.PostForm, q.r.Context()
	var err error
	d := securityData{}
	switch f.Get("action") {
	case "enable":
		secret := f.Get("secret")
		err = p.cfg.Identity.EnableTOTP(ctx, q.s.UserID, secret, passcode(q))
		d.Secret, d.URI = secret, totpURI(q.s.UserName, secret)
	case "disable":
		err = p.cfg.Identity.DisableTOTP(ctx, clientIP(q.r), q.s.UserID, passcode(q))
		d.Enabled = true
	default:
		return BadRequest(q.T("Unknown action."))
	}
	var ae *api.Error
	switch {
	case err == nil:
		return q.redirect("/account/security", q.T("Two-factor sign-in is updated."))
	case !errors.As(err, &ae) || ae.Status >= 500:
		return err
	case ae.Status == http.StatusUnauthorized || ae.Status == http.StatusBadRequest:
		d.Error = q.T("The code is wrong. Enter the code the app shows now.")
	case ae.Status == http.StatusConflict:
		d.Error = q.T(ae.Message)
	default:
		d.Error = ae.Message
	}
	if on, err := p.cfg.Identity.TOTPEnabled(ctx, q.s.UserID); err != nil {
		return err
	} else if on != d.Enabled {
		d.Enabled = on
		d.Secret, d.URI = p.newTOTP(q)
	}
	status := ae.Status
	if status == http.StatusUnauthorized {
		status = http.StatusBadRequest // the session is fine; the form is not
	}
	return q.renderStatus(status, "security", q.T("Two-factor sign-in"), d)
}

const pendingCookie = "nimbus_2fa"

// askPasscode answers a right password whose user's rules want a passcode:
// the receipt goes to the browser in a cookie and the page asks for the
// code.
func (p *Panel) askPasscode(q *req, rr *identity.ReceiptRequired, next string) error {
	setCookie(q.w, pendingCookie, rr.Receipt, rr.ExpiresAt)
	return q.render("login_totp", q.T("Enter your code"), securityData{Next: next})
}

// loginTOTP completes a sign-in with its receipt and a code; identity
// refuses a wrong or spent code, and ends the receipt after too many.
func (p *Panel) loginTOTP(q *req) error {
	c, err := q.r.Cookie(pendingCookie)
	if err != nil {
		return q.redirect("/login", "")
	}
	next := afterSignIn(q.r.PostForm.Get("next"))
	is, err := p.cfg.Identity.LoginPasscode(q.r.Context(), clientIP(q.r), c.Value, passcode(q))
	var ae *api.Error
	var rr *identity.ReceiptRequired
	switch {
	case err == nil:
		clearCookie(q.w, pendingCookie)
		return p.startSession(q, sessionOf(is), next)
	case errors.Is(err, identity.ErrReceiptNotFound) || errors.As(err, &rr):
		clearCookie(q.w, pendingCookie)
		return q.redirect("/login?next="+url.QueryEscape(next), q.T("Sign in again."))
	case !errors.As(err, &ae) || ae.Status >= 500:
		return err
	}
	d := securityData{Next: next, Error: q.T("The code is wrong. Enter the code the app shows now.")}
	if ra := ae.Header.Get("Retry-After"); ra != "" {
		// Too many wrong codes for the user, or failures from the address.
		q.w.Header().Set("Retry-After", ra)
		d.Error = q.T("Too many wrong codes. Try again in %s seconds.", ra)
	}
	return q.renderStatus(ae.Status, "login_totp", q.T("Enter your code"), d)
}
