package panel

import (
	"errors"
	"net/http"
	"strings"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/identity"
)

// coreRoutes are the landing page, signing in and out, and the language.
func (p *Panel) coreRoutes() []route {
	return []route{
		{"GET /{$}", public, p.home},
		{"GET /login", public, p.loginPage},
		{"POST /login", public, p.login},
		{"POST /logout", member, p.logout},
		{"GET /lang/{lang}", public, p.setLanguage},
	}
}

func (p *Panel) home(q *req) error {
	if q.s != nil {
		http.Redirect(q.w, q.r, "/servers", http.StatusSeeOther)
		return nil
	}
	return q.render("home", "Nimbus", nil)
}

type loginData struct {
	Email, Next, Error string
}

func (p *Panel) loginPage(q *req) error {
	next := afterSignIn(q.r.URL.Query().Get("next"))
	if q.s != nil {
		http.Redirect(q.w, q.r, next, http.StatusSeeOther)
		return nil
	}
	return q.render("login", q.T("Sign in"), loginData{Next: next})
}

// login checks the password through identity, which applies the same
// lockout, per-address limits and MFA rules as the API's token issue, and
// starts a session holding the user's own token, or asks for the second
// factor identity wants.
func (p *Panel) login(q *req) error {
	f := q.r.PostForm
	email := strings.ToLower(strings.TrimSpace(f.Get("email")))
	next := afterSignIn(f.Get("next"))
	is, err := p.cfg.Identity.Login(q.r.Context(), clientIP(q.r), email, f.Get("password"))
	var rr *identity.ReceiptRequired
	if errors.As(err, &rr) {
		return p.askPasscode(q, rr, next)
	}
	if err != nil {
		var ae *api.Error
		if !errors.As(err, &ae) || ae.Status >= 500 {
			return err
		}
		msg := q.T("Wrong e-mail or password.")
		if ae.Status == http.StatusTooManyRequests {
			msg = ae.Message
		}
		if ra := ae.Header.Get("Retry-After"); ra != "" {
			q.w.Header().Set("Retry-After", ra)
		}
		return q.renderStatus(ae.Status, "login", q.T("Sign in"), loginData{Email: email, Next: next, Error: msg})
	}
	return p.startSession(q, sessionOf(is), next)
}

// afterSignIn is where a sign-in goes: next, made safe, or the servers
// when there is none.
func afterSignIn(next string) string {
	if next == "" {
		return "/servers"
	}
	return safeNext(next)
}

// sessionOf is a panel session for an identity sign-in.
func sessionOf(is *identity.Session) *Session {
	return &Session{UserID: is.UserID, UserName: is.UserName, ProjectID: is.ProjectID, ProjectName: is.ProjectName,
		Roles: is.Roles, Admin: is.Admin, Token: is.Token, Expires: is.Expires}
}

// startSession stores s, sets its cookie and goes to next.
func (p *Panel) startSession(q *req, s *Session, next string) error {
	if s.Expires.IsZero() {
		s.Expires = p.cfg.Now().Add(p.cfg.TokenTTL)
	}
	secret, err := p.sessions.create(q.r.Context(), s)
	if err != nil {
		return err
	}
	setCookie(q.w, sessionCookie, secret, s.Expires)
	clearCookie(q.w, anonCookie)
	http.Redirect(q.w, q.r, safeNext(next), http.StatusSeeOther)
	return nil
}

// logout ends the session and revokes its token.
func (p *Panel) logout(q *req) error {
	q.api.RevokeOwn(q.r.Context()) // best effort: the session ends regardless
	if err := p.sessions.delete(q.r.Context(), q.s.idHash); err != nil {
		return err
	}
	clearCookie(q.w, sessionCookie)
	http.Redirect(q.w, q.r, "/", http.StatusSeeOther)
	return nil
}

func (p *Panel) setLanguage(q *req) error {
	lang := q.r.PathValue("lang")
	if lang != "en" && lang != "ru" {
		return errNotFound
	}
	setCookie(q.w, "lang", lang, p.cfg.Now().Add(365*24*time.Hour))
	http.Redirect(q.w, q.r, safeNext(q.r.URL.Query().Get("next")), http.StatusSeeOther)
	return nil
}
