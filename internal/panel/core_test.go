package panel_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"nimbus/internal/panel"
)

func TestSecurityHeaders(t *testing.T) {
	c := startCloud(t)
	w := newWeb(t, c)
	resp, err := w.hc.Get(c.PanelURL + "/login")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	for h, want := range map[string]string{
		"Content-Security-Policy": "script-src 'self'",
		"X-Frame-Options":         "DENY",
		"X-Content-Type-Options":  "nosniff",
		"Cache-Control":           "no-store",
	} {
		if got := resp.Header.Get(h); !strings.Contains(got, want) {
			t.Errorf("%s = %q, want it to hold %q", h, got, want)
		}
	}
	if csp := resp.Header.Get("Content-Security-Policy"); strings.Contains(csp, "unsafe-inline") || !strings.Contains(csp, "frame-ancestors 'none'") {
		t.Errorf("CSP %q allows inline code or framing", csp)
	}
}

func TestSignInAndOut(t *testing.T) {
	c := startCloud(t)
	user, pw := demoLogin(c)
	tests := []struct {
		name       string
		form       url.Values
		csrf       bool
		wantStatus int
		wantLoc    string
	}{
		{"no form token", url.Values{"email": {user}, "password": {pw}}, false, http.StatusForbidden, ""},
		{"wrong password", url.Values{"email": {user}, "password": {"nope"}}, true, http.StatusUnauthorized, ""},
		{"unknown user", url.Values{"email": {"nobody@example.com"}, "password": {pw}}, true, http.StatusUnauthorized, ""},
		{"foreign next", url.Values{"email": {user}, "password": {pw}, "next": {"//evil.example/"}}, true, http.StatusSeeOther, "/"},
		{"right", url.Values{"email": {user}, "password": {pw}, "next": {"/billing"}}, true, http.StatusSeeOther, "/billing"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := newWeb(t, c)
			status, loc, body := w.post("/login", "/login", tt.form, tt.csrf)
			if status != tt.wantStatus || loc != tt.wantLoc {
				t.Fatalf("got %d %q, want %d %q: %s", status, loc, tt.wantStatus, tt.wantLoc, snippet(body))
			}
		})
	}

	w := newWeb(t, c)
	if status, loc, _ := w.get("/servers"); status != http.StatusSeeOther || loc != "/login?next=%2Fservers" {
		t.Fatalf("signed out /servers: %d %q", status, loc)
	}
	w.login(user, pw)
	u, _ := url.Parse(c.PanelURL)
	var cookie *http.Cookie
	for _, ck := range w.hc.Jar.Cookies(u) {
		if ck.Name == "nimbus_session" {
			cookie = ck
		}
	}
	if cookie == nil {
		t.Fatal("no session cookie")
	}
	// The store holds neither the cookie nor the token in the clear.
	idHash, sealed := panel.HashID(cookie.Value), ""
	if err := c.DB.QueryRow(context.Background(), "SELECT token_sealed FROM panel_sessions WHERE id_hash = ?", idHash).Scan(&sealed); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(sealed, cookie.Value) {
		t.Fatal("the session's secret is stored in the clear")
	}
	if status, _, body := w.get("/login"); status != http.StatusSeeOther {
		t.Fatalf("signed in /login: %d %s", status, snippet(body))
	}
	if status, _, _ := w.post("/servers", "/logout", url.Values{}, false); status != http.StatusForbidden {
		t.Fatalf("logout without form token: %d, want 403", status)
	}
	status, loc, _ := w.post("/servers", "/logout", url.Values{}, true)
	if status != http.StatusSeeOther || loc != "/" {
		t.Fatalf("logout: %d %q", status, loc)
	}
	var n int
	c.DB.QueryRow(context.Background(), "SELECT COUNT(*) FROM panel_sessions WHERE id_hash = ?", idHash).Scan(&n)
	if n != 0 {
		t.Fatal("the session outlived its logout")
	}
	if status, _, _ := w.get("/servers"); status != http.StatusSeeOther {
		t.Fatalf("/servers after logout: %d", status)
	}
}

func TestBrowserSignIn(t *testing.T) {
	c := startCloud(t)
	b := newBrowser(t, c)
	b.open("/")
	b.axe()
	b.shot("home")
	b.open("/login")
	b.axe()
	b.shot("login")
	user, pw := demoLogin(c)
	b.login(user, pw)
	if got := b.text(".who span"); !strings.Contains(got, user) {
		t.Fatalf("after sign-in the header says %q", got)
	}
	b.open("/lang/ru?next=/login")
	if got := b.text(".who span"); !strings.Contains(got, "Вы вошли как") {
		t.Fatalf("in Russian the header says %q", got)
	}
}

// TestSessionsPerUserBounded: signing in again and again keeps at most a
// bounded number of one user's sessions; the oldest end, the newest work.
func TestSessionsPerUserBounded(t *testing.T) {
	c := startCloud(t)
	user, pw := demoLogin(c)
	var webs []*web
	for range panel.MaxSessionsPerUser + 5 {
		w := newWeb(t, c)
		w.login(user, pw)
		webs = append(webs, w)
	}
	var n int
	if err := c.DB.QueryRow(context.Background(), "SELECT COUNT(*) FROM panel_sessions WHERE user_name = ?", user).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != panel.MaxSessionsPerUser {
		t.Fatalf("%d sessions of one user, want %d", n, panel.MaxSessionsPerUser)
	}
	if status, _, _ := webs[0].get("/servers"); status != http.StatusSeeOther {
		t.Fatalf("the oldest session still opens /servers: %d", status)
	}
	if status, _, _ := webs[len(webs)-1].get("/servers"); status != http.StatusOK {
		t.Fatalf("the newest session: %d", status)
	}
}
