package panel_test

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/sha1"
	"encoding/base32"
	"encoding/binary"
	"fmt"
	"html"
	"mime"
	"net"
	"net/http"
	netmail "net/mail"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"nimbus/internal/cloud"
	"nimbus/internal/identity"
	"nimbus/internal/testenv"
)

// smtpReceiver is a real SMTP server on loopback speaking just enough of
// the protocol to take messages (EHLO/HELO, MAIL, RCPT, DATA, QUIT).
type smtpReceiver struct {
	ln   net.Listener
	mail chan string
}

func newSMTPReceiver(t testing.TB) *smtpReceiver {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &smtpReceiver{ln: ln, mail: make(chan string, 16)}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go s.serve(c)
		}
	}()
	return s
}

func (s *smtpReceiver) serve(c net.Conn) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	r := bufio.NewReader(c)
	say := func(line string) { fmt.Fprintf(c, "%s\r\n", line) }
	say("220 test ESMTP")
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		switch cmd := strings.ToUpper(strings.TrimSpace(line)); {
		case strings.HasPrefix(cmd, "EHLO"), strings.HasPrefix(cmd, "HELO"):
			say("250-test")
			say("250 8BITMIME")
		case strings.HasPrefix(cmd, "MAIL"), strings.HasPrefix(cmd, "RCPT"), strings.HasPrefix(cmd, "RSET"), strings.HasPrefix(cmd, "NOOP"):
			say("250 OK")
		case cmd == "DATA":
			say("354 go on")
			var msg strings.Builder
			for {
				l, err := r.ReadString('\n')
				if err != nil {
					return
				}
				if l == ".\r\n" {
					break
				}
				msg.WriteString(strings.TrimPrefix(l, "."))
			}
			s.mail <- msg.String()
			say("250 queued")
		case cmd == "QUIT":
			say("221 bye")
			return
		default:
			say("502 not here")
		}
	}
}

// next waits for the next message.
func (s *smtpReceiver) next(t testing.TB) string {
	t.Helper()
	select {
	case m := <-s.mail:
		return m
	case <-time.After(20 * time.Second):
		t.Fatal("no e-mail arrived")
		return ""
	}
}

// none checks that no message arrives for a while.
func (s *smtpReceiver) none(t testing.TB) {
	t.Helper()
	select {
	case m := <-s.mail:
		t.Fatalf("unexpected e-mail: %s", m)
	case <-time.After(300 * time.Millisecond):
	}
}

func withSMTP(s *smtpReceiver) testenv.Options {
	return func(c *cloud.Config) {
		c.Panel.SMTPURL = "smtp://" + s.ln.Addr().String() + "?from=noreply@nimbus.test"
	}
}

var linkRE = regexp.MustCompile(`https://\S+/(verify\?token=|reset/)\S+`)

func mailedLink(t testing.TB, msg string) string {
	t.Helper()
	l := linkRE.FindString(msg)
	if l == "" {
		t.Fatalf("no link in the e-mail: %s", msg)
	}
	return l
}

// TestBrowserSignUp: a visitor signs up, the verification mail arrives
// over SMTP, the link makes the account, the visitor signs in and lands on
// /servers, and the new project has its private network and billing
// account, seen through the APIs with the new user's token.
func TestBrowserSignUp(t *testing.T) {
	mail := newSMTPReceiver(t)
	c := startCloud(t, withSMTP(mail))
	b := newBrowser(t, c)
	b.open("/signup")
	b.axe()
	b.shot("signup")
	const email, pw = "New.Customer@example.com", "long-enough-pw"
	b.do("fill sign-up", chromedp.SendKeys(chromedp.CSS("#email"), email), chromedp.SendKeys(chromedp.CSS("#password"), pw),
		chromedp.SendKeys(chromedp.CSS("#password2"), pw))
	b.navigate("sign up", chromedp.Submit(chromedp.CSS("#password2")))
	if got := b.text("#signup-sent"); !strings.Contains(got, "new.customer@example.com") {
		t.Fatalf("after sign-up the page says %q", got)
	}
	b.axe()
	msg := mail.next(t)
	if !strings.Contains(msg, "To: <new.customer@example.com>") {
		t.Errorf("mail not to the new address: %s", msg)
	}
	b.navigate("open the link", chromedp.Navigate(mailedLink(t, msg)))
	b.text("#verified")
	b.axe()
	b.navigate("go to sign in", chromedp.Click(chromedp.CSS("#signin-link")))
	b.do("fill sign-in", chromedp.SendKeys(chromedp.CSS("#email"), email), chromedp.SendKeys(chromedp.CSS("#password"), pw))
	b.navigate("sign in", chromedp.Submit(chromedp.CSS("#password")))
	if loc := b.location(); loc != "/servers" {
		t.Fatalf("after sign-in at %s, want /servers", loc)
	}

	s, err := c.Identity.Login(context.Background(), "", email, pw)
	if err != nil {
		t.Fatal(err)
	}
	hc := testenv.HTTPClient(t, c)
	resp, body := testenv.Do(t, hc, "GET", c.NetworkURL+"/v2.0/networks?name=private", s.Token, "")
	testenv.MustStatus(t, resp, body, http.StatusOK)
	if !strings.Contains(body, `"project_id":"`+s.ProjectID+`"`) {
		t.Errorf("no private network of the new project: %s", body)
	}
	resp, body = testenv.Do(t, hc, "GET", c.BillingURL+"/v1/account", s.Token, "")
	testenv.MustStatus(t, resp, body, http.StatusOK)
	if !strings.Contains(body, s.ProjectID) {
		t.Errorf("billing account is not the new project's: %s", body)
	}
	var n int
	if err := c.DB.QueryRow(context.Background(), "SELECT COUNT(*) FROM billing_accounts WHERE project_id = ?", s.ProjectID).Scan(&n); err != nil || n != 1 {
		t.Errorf("billing account rows %d, %v", n, err)
	}
	// The promotional e-mail is off unless ticked.
	var promo int
	if err := c.DB.QueryRow(context.Background(), "SELECT promo FROM panel_accounts WHERE user_id = ?", s.UserID).Scan(&promo); err != nil || promo != 0 {
		t.Errorf("promo = %d, %v; want the account's row with 0", promo, err)
	}

	// The used link does not work twice; signing up again with the address
	// says the same as for a new one, and mails the owner instead.
	b.navigate("open the link again", chromedp.Navigate(mailedLink(t, msg)))
	if b.text("h1") == "Your account is ready" {
		t.Error("a used link made an account again")
	}
	w := newWeb(t, c)
	status, _, page := w.post("/signup", "/signup", url.Values{"email": {email}, "password": {pw}, "password2": {pw}}, true)
	if status != http.StatusOK || !strings.Contains(page, "signup-sent") {
		t.Fatalf("sign-up of a taken address: %d %s", status, snippet(page))
	}
	if again := mail.next(t); !strings.Contains(again, "already has an account") {
		t.Errorf("mail to a taken address: %s", again)
	}
}

// TestSignUpRefusals: bad forms are refused with the reason, and the
// per-e-mail and per-address limits answer 429.
func TestSignUpRefusals(t *testing.T) {
	c := startCloud(t)
	for _, tc := range []struct {
		name string
		form url.Values
		want string
	}{
		{"short password", url.Values{"email": {"a@example.com"}, "password": {"short"}, "password2": {"short"}}, "at least 10"},
		{"passwords differ", url.Values{"email": {"a@example.com"}, "password": {"long-enough-1"}, "password2": {"long-enough-2"}}, "do not match"},
		{"not an address", url.Values{"email": {"nobody"}, "password": {"long-enough-1"}, "password2": {"long-enough-1"}}, "valid e-mail"},
		{"a NUL in the address", url.Values{"email": {"nobody\x00@example.com"}, "password": {"long-enough-1"}, "password2": {"long-enough-1"}}, "valid e-mail"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, _, body := newWeb(t, c).post("/signup", "/signup", tc.form, true)
			if status != http.StatusBadRequest || !strings.Contains(body, tc.want) {
				t.Fatalf("got %d, want 400 saying %q: %s", status, tc.want, snippet(body))
			}
		})
	}
	w := newWeb(t, c)
	form := func(email string) url.Values {
		return url.Values{"email": {email}, "password": {"long-enough-pw"}, "password2": {"long-enough-pw"}}
	}
	// The three refusals above counted against this address too.
	for i := range 3 {
		if status, _, body := w.post("/signup", "/signup", form("same@example.com"), true); status != http.StatusOK {
			t.Fatalf("sign-up %d: %d %s", i, status, snippet(body))
		}
	}
	status, _, body := w.post("/signup", "/signup", form("same@example.com"), true)
	if status != http.StatusTooManyRequests || !strings.Contains(body, "Too many requests") {
		t.Fatalf("fourth sign-up of one address: %d %s", status, snippet(body))
	}
	for i := range 3 {
		w.post("/signup", "/signup", form(fmt.Sprintf("other%d@example.com", i)), true)
	}
	if status, _, _ := w.post("/signup", "/signup", form("fresh@example.com"), true); status != http.StatusTooManyRequests {
		t.Fatalf("eleventh sign-up from one address: %d, want 429", status)
	}
}

// register makes an account as a verified sign-up would.
func register(t testing.TB, c *cloud.Cloud, email, pw string) *identity.Registered {
	t.Helper()
	h, err := identity.HashPassword(pw)
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.Identity.Register(context.Background(), identity.Registration{Email: email, PasswordHash: h})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

var formTokenRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// TestPasswordReset: the link is mailed only for an existing account (the
// page is the same), sets a new password, ends the user's sessions, and
// works once.
func TestPasswordReset(t *testing.T) {
	mail := newSMTPReceiver(t)
	c := startCloud(t, withSMTP(mail))
	register(t, c, "ria@example.com", "old-password-1")
	signedIn := newWeb(t, c)
	signedIn.login("ria@example.com", "old-password-1")

	w := newWeb(t, c)
	status, _, unknown := w.post("/reset", "/reset", url.Values{"email": {"nobody@example.com"}}, true)
	if status != http.StatusOK || !strings.Contains(unknown, "reset-sent") {
		t.Fatalf("reset of an unknown address: %d %s", status, snippet(unknown))
	}
	mail.none(t)
	status, _, known := w.post("/reset", "/reset", url.Values{"email": {"Ria@example.com"}}, true)
	if status != http.StatusOK || !strings.Contains(known, "reset-sent") {
		t.Fatalf("reset: %d %s", status, snippet(known))
	}
	link := mailedLink(t, mail.next(t))
	path := strings.TrimPrefix(link, c.PanelURL)
	status, _, form := w.get(path)
	m := formTokenRE.FindStringSubmatch(form)
	if status != http.StatusOK || m == nil {
		t.Fatalf("reset form: %d %s", status, snippet(form))
	}
	resp, err := w.hc.PostForm(link, url.Values{"csrf": {html.UnescapeString(m[1])}, "password": {"new-password-2"}, "password2": {"new-password-2"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/login" {
		t.Fatalf("set password: %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	// A page that calls no API: the session itself must be gone, not only
	// its Keystone token.
	if status, loc, _ := signedIn.get("/account/security"); status != http.StatusSeeOther || !strings.HasPrefix(loc, "/login") {
		t.Errorf("an old session after the reset: %d %s, want a redirect to sign in", status, loc)
	}
	if status, _, _ := newWeb(t, c).post("/login", "/login", url.Values{"email": {"ria@example.com"}, "password": {"old-password-1"}}, true); status != http.StatusUnauthorized {
		t.Errorf("old password after reset: %d, want 401", status)
	}
	newWeb(t, c).login("ria@example.com", "new-password-2")
	if status, _, _ := w.get(path); status != http.StatusNotFound {
		t.Errorf("a used reset link: %d, want 404", status)
	}
}

// totp is RFC 6238's code for a base32 secret at t, written again here so
// the test does not trust the panel's own.
func totp(t testing.TB, secret string, at time.Time) string {
	t.Helper()
	key, err := base32.StdEncoding.WithPadding(base32.NoPadding).DecodeString(secret)
	if err != nil {
		t.Fatal(err)
	}
	mac := hmac.New(sha1.New, key)
	var msg [8]byte
	binary.BigEndian.PutUint64(msg[:], uint64(at.Unix()/30))
	mac.Write(msg[:])
	sum := mac.Sum(nil)
	o := sum[19] & 15
	return fmt.Sprintf("%06d", (binary.BigEndian.Uint32(sum[o:])&0x7fffffff)%1000000)
}

var secretRE = regexp.MustCompile(`<code id="totp-secret">([A-Z2-7]+)</code>`)

// TestTwoFactor: with TOTP on, a right password alone does not sign in;
// the code does, a wrong one is refused, and too many wrong ones end the
// attempt. The code that turned TOTP on is spent, so the sign-in uses the
// next step's (within the drift identity allows).
func TestTwoFactor(t *testing.T) {
	c := startCloud(t)
	register(t, c, "tess@example.com", "tess-password")
	w := newWeb(t, c)
	w.login("tess@example.com", "tess-password")
	_, _, page := w.get("/account/security")
	m := secretRE.FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no secret on the security page: %s", snippet(page))
	}
	secret := m[1]
	if status, _, _ := w.post("/account/security", "/account/security", url.Values{"action": {"enable"}, "secret": {secret}, "code": {"000000"}}, true); status != http.StatusBadRequest {
		t.Fatalf("enable with a wrong code: %d, want 400", status)
	}
	if status, _, body := w.post("/account/security", "/account/security",
		url.Values{"action": {"enable"}, "secret": {secret}, "code": {totp(t, secret, time.Now())}}, true); status != http.StatusSeeOther {
		t.Fatalf("enable: %d %s", status, snippet(body))
	}

	w2 := newWeb(t, c)
	status, loc, body := w2.post("/login", "/login", url.Values{"email": {"tess@example.com"}, "password": {"tess-password"}}, true)
	if status != http.StatusOK || !strings.Contains(body, `action="/login/totp"`) {
		t.Fatalf("sign-in with two-factor on: %d %s %s", status, loc, snippet(body))
	}
	if status, _, _ := w2.get("/servers"); status != http.StatusSeeOther {
		t.Fatalf("/servers before the code: %d, want a redirect", status)
	}
	if status, _, _ := w2.post("/login", "/login/totp", url.Values{"code": {"123456"}}, true); status != http.StatusUnauthorized {
		t.Fatalf("wrong code: %d, want 401", status)
	}
	next := totp(t, secret, time.Now().Add(30*time.Second))
	if status, loc, _ := w2.post("/login", "/login/totp", url.Values{"code": {next}}, true); status != http.StatusSeeOther || loc != "/servers" {
		t.Fatalf("right code: %d %s", status, loc)
	}
	if status, _, _ := w2.get("/servers"); status != http.StatusOK {
		t.Fatalf("/servers after the code: %d", status)
	}

	w3 := newWeb(t, c)
	w3.post("/login", "/login", url.Values{"email": {"tess@example.com"}, "password": {"tess-password"}}, true)
	for range 5 {
		w3.post("/login", "/login/totp", url.Values{"code": {"000001"}}, true)
	}
	if status, loc, _ := w3.post("/login", "/login/totp", url.Values{"code": {totp(t, secret, time.Now())}}, true); status != http.StatusSeeOther || !strings.HasPrefix(loc, "/login") {
		t.Fatalf("right code after five wrong ones: %d %s, want back to /login", status, loc)
	}
}

// TestMailHeadersEncoded: a message in Russian keeps its header ASCII, the
// subject an RFC 2047 word that decodes to the words sent.
func TestMailHeadersEncoded(t *testing.T) {
	mail := newSMTPReceiver(t)
	c := startCloud(t, withSMTP(mail))
	register(t, c, "olga@example.com", "old-password-1")
	w := newWeb(t, c)
	w.get("/lang/ru")
	if status, _, body := w.post("/reset", "/reset", url.Values{"email": {"olga@example.com"}}, true); status != http.StatusOK {
		t.Fatalf("reset: %d %s", status, snippet(body))
	}
	msg := mail.next(t)
	head, _, _ := strings.Cut(msg, "\r\n\r\n")
	for i := 0; i < len(head); i++ {
		if head[i] >= 0x80 {
			t.Fatalf("a byte %#x in the header: %s", head[i], head)
		}
	}
	m, err := netmail.ReadMessage(strings.NewReader(msg))
	if err != nil {
		t.Fatal(err)
	}
	subject, err := new(mime.WordDecoder).DecodeHeader(m.Header.Get("Subject"))
	if err != nil || !strings.ContainsAny(subject, "абвгдеёжзийклмнопрстуфхцчшщъыьэюя") {
		t.Fatalf("subject %q (%q): %v", subject, m.Header.Get("Subject"), err)
	}
	if to, err := m.Header.AddressList("To"); err != nil || len(to) != 1 || to[0].Address != "olga@example.com" {
		t.Fatalf("To %v: %v", to, err)
	}
}
