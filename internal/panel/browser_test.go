package panel_test

// The browser harness: a real nimbus cloud with its panel over HTTPS, and
// Debian's chromium driven headless by chromedp. Every area's tests use it.

import (
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"nimbus/internal/cloud"
	"nimbus/internal/testenv"
)

// chromium is the browser the tests drive; a machine without it skips
// the browser tests unless NIMBUS_REQUIRE_BROWSER=1 (the test command sets
// it, after installing Debian's chromium).
func chromium(t testing.TB) string {
	t.Helper()
	for _, p := range []string{os.Getenv("NIMBUS_CHROMIUM"), "/usr/bin/chromium", "/usr/bin/chromium-browser"} {
		if p == "" {
			continue
		}
		if _, err := exec.LookPath(p); err == nil {
			return p
		}
	}
	if os.Getenv("NIMBUS_REQUIRE_BROWSER") == "1" {
		t.Fatal("chromium is not installed (apt-get install chromium) and NIMBUS_REQUIRE_BROWSER=1")
	}
	t.Skip("chromium is not installed: apt-get install chromium to run the panel's browser tests")
	return ""
}

// startCloud starts a cloud with its panel on SQLite, showing amounts in
// US dollars beside roubles as nimbus serve does by default.
func startCloud(t testing.TB, opts ...testenv.Options) *cloud.Cloud {
	t.Helper()
	usd := func(c *cloud.Config) { c.Billing.PresentationCurrency, c.Billing.PresentationRate = "USD", "0.011" }
	return testenv.StartCloud(t, "", append([]testenv.Options{usd}, opts...)...)
}

// browser is one headless chromium with its own profile.
type browser struct {
	t    testing.TB
	ctx  context.Context
	base string
}

func newBrowser(t testing.TB, c *cloud.Cloud) *browser {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium(t)),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Headless,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		// The cloud's CA is the test's own; chromium has no flag to
		// trust one file.
		chromedp.IgnoreCertErrors,
		chromedp.WindowSize(1280, 900),
	)
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancel)
	ctx, cancel2 := chromedp.NewContext(actx)
	t.Cleanup(cancel2)
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return &browser{t: t, ctx: ctx, base: c.PanelURL}
}

// do runs steps with a deadline, failing the test on error.
func (b *browser) do(what string, steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		b.t.Fatalf("%s (at %s): %v", what, b.location(), err)
	}
}

// get runs one action that gives a value.
func get[T any](b *browser, what string, a chromedp.Action[T]) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		b.t.Fatalf("%s: %v", what, err)
	}
	return v
}

// navigate runs steps that load a new page (a link, a form) and waits for
// it.
func (b *browser) navigate(what string, steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	if _, err := chromedp.RunResponse(ctx, steps...); err != nil {
		b.t.Fatalf("%s (at %s): %v", what, b.location(), err)
	}
	b.do(what, chromedp.WaitReady(chromedp.CSS("main")))
}

// open loads a panel path and waits for its main content.
func (b *browser) open(path string) {
	b.t.Helper()
	b.navigate("open "+path, chromedp.Navigate(b.base+path))
}

// text is the visible text of the first element matching the CSS selector.
func (b *browser) text(sel string) string {
	b.t.Helper()
	return get(b, "read "+sel, chromedp.Text(chromedp.CSS(sel), chromedp.NodeVisible))
}

// location is the page's URL path and query.
func (b *browser) location() string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
	defer cancel()
	loc, _ := chromedp.Run(ctx, chromedp.Location())
	u, err := url.Parse(loc)
	if err != nil {
		return loc
	}
	return u.RequestURI()
}

// login signs in through the login form.
func (b *browser) login(email, password string) {
	b.t.Helper()
	b.open("/login")
	b.do("fill sign-in", chromedp.SendKeys(chromedp.CSS("#email"), email), chromedp.SendKeys(chromedp.CSS("#password"), password))
	b.navigate("sign in", chromedp.Submit(chromedp.CSS("#password")))
}

type axeViolation struct {
	ID     string `json:"id"`
	Impact string `json:"impact"`
	Help   string `json:"help"`
	Nodes  []struct {
		Target []any `json:"target"`
	} `json:"nodes"`
}

// axe runs axe-core on the page and fails on serious or critical
// violations.
func (b *browser) axe() {
	b.t.Helper()
	src, err := os.ReadFile("testdata/axe.min.js")
	if err != nil {
		b.t.Fatal(err)
	}
	get(b, "load axe", chromedp.Evaluate[bool](string(src)+";true"))
	out := get(b, "axe", chromedp.Evaluate[[]axeViolation](`axe.run(document, {resultTypes: ["violations"]}).then(r => r.violations.map(v => ({id: v.id, impact: v.impact, help: v.help, nodes: v.nodes.slice(0, 3).map(n => ({target: n.target}))})))`,
		chromedp.EvalAwaitPromise))
	for _, v := range out {
		if v.Impact == "serious" || v.Impact == "critical" {
			b.t.Errorf("axe on %s: %s (%s): %s at %v", b.location(), v.ID, v.Impact, v.Help, v.Nodes)
		}
	}
}

// shot saves desktop and phone screenshots of the page as
// docs/panel/<name>-{desktop,phone}.png when NIMBUS_PANEL_SCREENSHOTS names
// the repository's root.
func (b *browser) shot(name string) {
	b.t.Helper()
	root := os.Getenv("NIMBUS_PANEL_SCREENSHOTS")
	if root == "" {
		return
	}
	dir := filepath.Join(root, "docs", "panel")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.t.Fatal(err)
	}
	for _, size := range []struct {
		suffix        string
		width, height int64
		opts          []chromedp.EmulateViewportOption
	}{{"desktop", 1280, 900, nil}, {"phone", 390, 844, []chromedp.EmulateViewportOption{chromedp.EmulateMobile, chromedp.EmulateTouch}}} {
		b.do("size "+size.suffix, chromedp.EmulateViewport(size.width, size.height, size.opts...), chromedp.Sleep(150*time.Millisecond))
		img := get(b, "screenshot "+name, chromedp.FullScreenshot(100))
		if err := os.WriteFile(filepath.Join(dir, name+"-"+size.suffix+".png"), img, 0o644); err != nil {
			b.t.Fatal(err)
		}
	}
	b.do("restore size", chromedp.ResetViewport())
}

// web is a plain HTTP client with its own cookies, for what a browser is
// not needed to show (status codes, refused forms).
type web struct {
	t    testing.TB
	hc   *http.Client
	base string
}

func newWeb(t testing.TB, c *cloud.Cloud) *web {
	hc := testenv.HTTPClient(t, c)
	hc.Jar, _ = cookiejar.New(nil)
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &web{t: t, hc: hc, base: c.PanelURL}
}

// get fetches path and returns status, Location and body.
func (w *web) get(path string) (int, string, string) {
	w.t.Helper()
	resp, err := w.hc.Get(w.base + path)
	if err != nil {
		w.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Location"), string(b)
}

// post submits a form; with csrf true it first reads the token from the
// page at from.
func (w *web) post(from, path string, form url.Values, csrf bool) (int, string, string) {
	w.t.Helper()
	if csrf {
		form.Set("csrf", w.csrf(from))
	}
	resp, err := w.hc.PostForm(w.base+path, form)
	if err != nil {
		w.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Location"), string(b)
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrf is the form token on the page at path.
func (w *web) csrf(path string) string {
	w.t.Helper()
	status, _, body := w.get(path)
	m := csrfRE.FindStringSubmatch(body)
	if status != http.StatusOK || m == nil {
		w.t.Fatalf("no form token on %s (status %d)", path, status)
	}
	return m[1]
}

// login signs in with the form.
func (w *web) login(email, password string) {
	w.t.Helper()
	status, loc, body := w.post("/login", "/login", url.Values{"email": {email}, "password": {password}}, true)
	if status != http.StatusSeeOther || strings.HasPrefix(loc, "/login") {
		w.t.Fatalf("login %s: %d %s %s", email, status, loc, snippet(body))
	}
}

func snippet(s string) string {
	if len(s) > 300 {
		return s[:300] + "…"
	}
	return s
}

func demoLogin(c *cloud.Cloud) (string, string) { return cloud.DemoUser, c.Secrets.DemoPassword }

func adminLogin(c *cloud.Cloud) (string, string) { return cloud.AdminUser, c.Secrets.AdminPassword }
