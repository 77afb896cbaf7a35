package panel

import (
	"compress/gzip"
	"errors"
	"net/http"
	"net/url"
	"path"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// req is one request to a page: the exchange, the signed-in user (nil on a
// public page with no one signed in), and the API client acting as them.
type req struct {
	w    http.ResponseWriter
	r    *http.Request
	s    *Session
	api  *Client
	lang string
	// csrf is the token this request's forms carry.
	csrf string
	p    *Panel
}

// Errors a page returns for the wrapper to render.
var (
	errNotFound = &APIError{Status: http.StatusNotFound, Message: "The page could not be found."}
	errBadCSRF  = &APIError{Status: http.StatusForbidden, Message: "The form has expired or did not come from this panel. Reload the page and try again."}
)

// BadRequest is a form's mistake, shown on an error page with status 400.
func BadRequest(msg string) error { return &APIError{Status: http.StatusBadRequest, Message: msg} }

// securityHeaders are on every answer: a strict CSP (no inline script or
// style, nothing from another origin but the console's frame, and forms
// sent only here, whose answer may lead on to the console), no framing,
// no sniffing, no referrer beyond the origin.
func (p *Panel) securityHeaders(h http.Header) {
	frame, forms := "'none'", "'self'"
	if p.cfg.ConsoleURL != "" {
		frame, forms = p.cfg.ConsoleURL, forms+" "+p.cfg.ConsoleURL
	}
	h.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "+
		"connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; form-action "+forms+"; "+
		"frame-ancestors 'none'; frame-src "+frame)
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Strict-Transport-Security", "max-age=31536000")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
}

// wrap runs a route: headers, compression, session, CSRF, access, and the
// rendering of whatever error the page returns.
func (p *Panel) wrap(rt route) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.securityHeaders(w.Header())
		w.Header().Set("Cache-Control", "no-store")
		if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			gz := gzipPool.Get().(*gzip.Writer)
			gz.Reset(w)
			defer func() { gz.Close(); gzipPool.Put(gz) }()
			w.Header().Set("Content-Encoding", "gzip")
			w.Header().Add("Vary", "Accept-Encoding")
			w = &gzipWriter{ResponseWriter: w, gz: gz}
		}
		q := &req{w: w, r: r, p: p, lang: language(r)}
		defer func() {
			if v := recover(); v != nil {
				p.cfg.Log.Error("panel: panic", "path", r.URL.Path, "panic", v, "stack", string(debug.Stack()))
				q.errorPage(errors.New("panic"))
			}
		}()
		if err := p.serve(q, rt); err != nil {
			q.errorPage(err)
		}
	})
}

func (p *Panel) serve(q *req, rt route) error {
	r := q.r
	if c, err := r.Cookie(sessionCookie); err == nil {
		s, err := p.sessions.load(r.Context(), c.Value)
		switch {
		case err == nil:
			q.s = s
			q.api = p.client(s.Token)
			q.csrf = s.CSRF
		case errors.Is(err, errNoSession):
			clearCookie(q.w, sessionCookie)
		default:
			return err
		}
	}
	if q.s == nil {
		q.csrf = anonToken(q)
	}
	if rt.access != public && q.s == nil {
		if r.Method != http.MethodGet {
			return errBadCSRF
		}
		http.Redirect(q.w, r, "/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
		return nil
	}
	// Operator pages do not exist for anyone else.
	if rt.access == admin && !q.s.Admin {
		return errNotFound
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		r.Body = http.MaxBytesReader(q.w, r.Body, 1<<20)
		if err := r.ParseForm(); err != nil {
			return BadRequest("The form could not be read.")
		}
		if !sameSecret(r.PostForm.Get(csrfField), q.csrf) {
			return errBadCSRF
		}
	}
	return rt.h(q)
}

// anonToken is the CSRF secret of a visitor with no session: the one in
// their cookie, or a new one set now.
func anonToken(q *req) string {
	if c, err := q.r.Cookie(anonCookie); err == nil && len(c.Value) == 43 {
		return c.Value
	}
	t := newSecret()
	setCookie(q.w, anonCookie, t, time.Time{})
	return t
}

// client is an API client acting with token.
func (p *Panel) client(token string) *Client {
	return &Client{hc: p.cfg.HTTPClient, urls: p.cfg.URLs, token: token}
}

// redirect answers a form with 303 to path, carrying a one-time message.
func (q *req) redirect(path, flash string) error {
	if flash != "" {
		setCookie(q.w, "nimbus_flash", url.QueryEscape(flash), time.Time{})
	}
	http.Redirect(q.w, q.r, path, http.StatusSeeOther)
	return nil
}

// back answers a form by going back to path with the error's message, or
// renders the error page when it is not the API's.
func (q *req) back(path string, err error) error {
	var ae *APIError
	if errors.As(err, &ae) && ae.Status < 500 {
		setCookie(q.w, "nimbus_flash_error", url.QueryEscape(ae.Message), time.Time{})
		http.Redirect(q.w, q.r, path, http.StatusSeeOther)
		return nil
	}
	return err
}

// takeFlash reads and clears the one-time messages.
func (q *req) takeFlash() (info, bad string) {
	for _, n := range []string{"nimbus_flash", "nimbus_flash_error"} {
		if c, err := q.r.Cookie(n); err == nil {
			v, _ := url.QueryUnescape(c.Value)
			if len(v) > 500 {
				v = v[:500]
			}
			if n == "nimbus_flash" {
				info = v
			} else {
				bad = v
			}
			clearCookie(q.w, n)
		}
	}
	return info, bad
}

// errorPage renders err: the API's message at its status, a 503 while the
// database is away (the rule the APIs follow, store.IsUnavailable), or a
// plain 500.
func (q *req) errorPage(err error) {
	var ae *APIError
	switch {
	case errors.As(err, &ae):
	case store.IsServiceFault(err):
		q.p.cfg.Log.Warn("panel: database unavailable, busy or storage full", "path", q.r.URL.Path, "error", err)
		ae = &APIError{Status: http.StatusServiceUnavailable, Message: "The service is briefly unavailable. Try again in a moment."}
	default:
		q.p.cfg.Log.Error("panel: page failed", "path", q.r.URL.Path, "error", err)
		ae = &APIError{Status: http.StatusInternalServerError, Message: "Something went wrong on our side. Try again in a moment."}
	}
	if ae.Status == http.StatusServiceUnavailable {
		q.w.Header().Set("Retry-After", strconv.Itoa(api.RetryAfter))
	}
	if ae.Status == http.StatusUnauthorized && q.s != nil {
		// The token ended (revoked, expired): sign in again.
		q.p.sessions.delete(q.r.Context(), q.s.idHash)
		clearCookie(q.w, sessionCookie)
		http.Redirect(q.w, q.r, "/login?next="+url.QueryEscape(q.r.URL.RequestURI()), http.StatusSeeOther)
		return
	}
	status := ae.Status
	if status < 400 || status > 599 {
		status = http.StatusInternalServerError
	}
	q.renderStatus(status, "error", q.T("Error"), ae)
}

// maxNextLen bounds a redirect target taken from a request.
const maxNextLen = 2048

// safeNext is where to send the browser after a form or a switch, from a
// target the request names (next=, a sign-up's stored next): the target
// parsed as a URL and rebuilt from its path, query and fragment alone.
// Only a relative reference with no scheme, host or user whose path is
// rooted at one "/" survives; a path holding a backslash, whitespace or a
// control or format character, decoded, does not (browsers drop a tab or
// read "\" as "/", so "/\t/host" would leave the origin), nor does a query
// or fragment holding a control character. Anything else is "/". The
// result is printable ASCII, so every browser reads it as this origin.
func safeNext(s string) string {
	const home = "/"
	if s == "" || len(s) > maxNextLen || !utf8.ValidString(s) {
		return home
	}
	u, err := url.Parse(s)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || u.Opaque != "" {
		return home
	}
	if !strings.HasPrefix(u.Path, "/") || strings.HasPrefix(u.Path, "//") ||
		strings.IndexFunc(u.Path, badPathRune) >= 0 || strings.IndexFunc(u.Fragment, badRune) >= 0 {
		return home
	}
	query, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return home
	}
	for k, vs := range query {
		if strings.IndexFunc(k, badRune) >= 0 || slices.ContainsFunc(vs, func(v string) bool { return strings.IndexFunc(v, badRune) >= 0 }) {
			return home
		}
	}
	clean := path.Clean(u.Path) // "/a/../..//x" is "/x"
	if strings.HasSuffix(u.Path, "/") && clean != "/" {
		clean += "/"
	}
	out := url.URL{Path: clean, RawQuery: query.Encode(), Fragment: u.Fragment}
	return out.String()
}

// badRune is a control or format character (a line break, a bidi
// override), which no redirect target holds.
func badRune(r rune) bool { return unicode.IsControl(r) || unicode.Is(unicode.Cf, r) }

// badPathRune is what no redirect path holds besides: whitespace and the
// backslash browsers read as a slash.
func badPathRune(r rune) bool { return badRune(r) || unicode.IsSpace(r) || r == '\\' }

var gzipPool = sync.Pool{New: func() any { gz, _ := gzip.NewWriterLevel(nil, gzip.BestSpeed); return gz }}

type gzipWriter struct {
	http.ResponseWriter
	gz *gzip.Writer
}

func (g *gzipWriter) Write(b []byte) (int, error) { return g.gz.Write(b) }

func (g *gzipWriter) WriteHeader(code int) {
	g.ResponseWriter.Header().Del("Content-Length")
	g.ResponseWriter.WriteHeader(code)
}
