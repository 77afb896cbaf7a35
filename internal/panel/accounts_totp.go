package panel

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha1"
	"encoding/base32"
	"encoding/binary"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"nimbus/internal/store"
)

// Two-factor sign-in with TOTP (RFC 6238: HMAC-SHA-1, 6 digits, 30 s
// steps, one step of clock drift either way).

var b32 = base32.StdEncoding.WithPadding(base32.NoPadding)

// totpCode is the code of secret at step.
func totpCode(secret []byte, step int64) string {
	mac := hmac.New(sha1.New, secret)
	binary.Write(mac, binary.BigEndian, step)
	sum := mac.Sum(nil)
	off := sum[len(sum)-1] & 0x0f
	n := binary.BigEndian.Uint32(sum[off:off+4]) & 0x7fffffff
	return fmt.Sprintf("%06d", n%1_000_000)
}

// totpValid checks code against the secret (base32) at now, ±1 step.
func totpValid(secret, code string, now time.Time) bool {
	key, err := b32.DecodeString(secret)
	code = strings.ReplaceAll(strings.TrimSpace(code), " ", "")
	if err != nil || len(code) != 6 {
		return false
	}
	step := now.Unix() / 30
	for d := int64(-1); d <= 1; d++ {
		if hmac.Equal([]byte(totpCode(key, step+d)), []byte(code)) {
			return true
		}
	}
	return false
}

// totpSecret is the user's enabled TOTP secret, "" if none.
func (p *Panel) totpSecret(q *req, userID string) (string, error) {
	var s string
	err := p.cfg.DB.QueryRow(q.r.Context(), "SELECT totp_secret FROM panel_accounts WHERE user_id = ?", userID).Scan(&s)
	if store.IsNoRows(err) {
		return "", nil
	}
	return s, err
}

type securityData struct {
	Enabled        bool
	Secret, URI    string
	Error, Message string
}

func (p *Panel) securityPage(q *req) error {
	secret, err := p.totpSecret(q, q.s.UserID)
	if err != nil {
		return err
	}
	d := securityData{Enabled: secret != ""}
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

// securityChange enables TOTP (the form carries the secret shown and a code
// made from it, proving the app has it) or disables it (with a current
// code).
func (p *Panel) securityChange(q *req) error {
	f, ctx := q.r.PostForm, q.r.Context()
	current, err := p.totpSecret(q, q.s.UserID)
	if err != nil {
		return err
	}
	switch f.Get("action") {
	case "enable":
		secret := f.Get("secret")
		if current != "" || !totpValid(secret, f.Get("code"), p.cfg.Now()) {
			d := securityData{Secret: secret, URI: totpURI(q.s.UserName, secret),
				Error: q.T("The code is wrong. Enter the code the app shows now.")}
			return q.renderStatus(http.StatusBadRequest, "security", q.T("Two-factor sign-in"), d)
		}
		err = p.setTOTP(q, secret)
	case "disable":
		if current == "" || !totpValid(current, f.Get("code"), p.cfg.Now()) {
			return q.renderStatus(http.StatusBadRequest, "security", q.T("Two-factor sign-in"),
				securityData{Enabled: current != "", Error: q.T("The code is wrong. Enter the code the app shows now.")})
		}
		_, err = p.cfg.DB.Exec(ctx, "UPDATE panel_accounts SET totp_secret = '' WHERE user_id = ?", q.s.UserID)
	default:
		return BadRequest(q.T("Unknown action."))
	}
	if err != nil {
		return err
	}
	return q.redirect("/account/security", q.T("Two-factor sign-in is updated."))
}

// setTOTP stores the user's secret, making the account row of a user the
// panel did not sign up (the bootstrap's).
func (p *Panel) setTOTP(q *req, secret string) error {
	return p.cfg.DB.Tx(q.r.Context(), func(tx *store.Tx) error {
		res, err := tx.Exec(q.r.Context(), "UPDATE panel_accounts SET totp_secret = ? WHERE user_id = ?", secret, q.s.UserID)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n > 0 {
			return nil
		}
		_, err = tx.Exec(q.r.Context(), "INSERT INTO panel_accounts (user_id, email, promo, totp_secret, created_at) VALUES (?, ?, 0, ?, ?)",
			q.s.UserID, q.s.UserName, secret, p.cfg.Now().Unix())
		return err
	})
}

// pendingLogin is a sign-in whose password was right, waiting for its code.
type pendingLogin struct {
	s        *Session
	next     string
	secret   string
	expires  time.Time
	failures int
}

type pendingLogins struct {
	mu sync.Mutex
	m  map[string]*pendingLogin
}

const (
	pendingCookie = "nimbus_2fa"
	pendingTTL    = 5 * time.Minute
	maxCodeTries  = 5
)

// secondFactor runs after a correct password: when the user has two-factor
// sign-in it keeps the sign-in pending (server-side, 5 minutes, behind a
// random cookie), asks for the code and returns true.
func (p *Panel) secondFactor(q *req, s *Session, next string) (bool, error) {
	secret, err := p.totpSecret(q, s.UserID)
	if err != nil || secret == "" {
		return false, err
	}
	id := newSecret()
	pl := p.acctState().pending
	now := p.cfg.Now()
	pl.mu.Lock()
	for k, v := range pl.m {
		if now.After(v.expires) {
			delete(pl.m, k)
		}
	}
	if len(pl.m) >= maxKeys {
		pl.mu.Unlock()
		return true, &APIError{Status: http.StatusServiceUnavailable, Message: q.T("Too many sign-ins at once; try again in a minute.")}
	}
	pl.m[linkHash(id)] = &pendingLogin{s: s, next: next, secret: secret, expires: now.Add(pendingTTL)}
	pl.mu.Unlock()
	setCookie(q.w, pendingCookie, id, now.Add(pendingTTL))
	return true, q.render("login_totp", q.T("Enter your code"), securityData{})
}

// loginTOTP completes a pending sign-in with its code; too many wrong codes
// end it.
func (p *Panel) loginTOTP(q *req) error {
	c, err := q.r.Cookie(pendingCookie)
	if err != nil {
		return q.redirect("/login", "")
	}
	key, now := linkHash(c.Value), p.cfg.Now()
	pl := p.acctState().pending
	pl.mu.Lock()
	pend := pl.m[key]
	ok := pend != nil && now.Before(pend.expires) && totpValid(pend.secret, q.r.PostForm.Get("code"), now)
	switch {
	case pend == nil:
	case ok || now.After(pend.expires):
		delete(pl.m, key)
	default:
		if pend.failures++; pend.failures >= maxCodeTries {
			delete(pl.m, key)
			pend = nil
		}
	}
	pl.mu.Unlock()
	if pend == nil {
		clearCookie(q.w, pendingCookie)
		return q.redirect("/login", q.T("Sign in again."))
	}
	if !ok {
		return q.renderStatus(http.StatusUnauthorized, "login_totp", q.T("Enter your code"),
			securityData{Error: q.T("The code is wrong. Enter the code the app shows now.")})
	}
	clearCookie(q.w, pendingCookie)
	return p.startSession(q, pend.s, pend.next)
}
