package panel_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// TestBrowserRedirectStaysOnOrigin: chromium, sent through the language
// switch, the sign-in page when signed in, and the sign-in form with a
// hostile next (a tab or backslash that browsers drop or read as a slash),
// ends on the panel and never asks another origin for anything.
func TestBrowserRedirectStaysOnOrigin(t *testing.T) {
	c := startCloud(t)
	var hits atomic.Int32
	evil := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Write([]byte("<!doctype html><main>elsewhere</main>"))
	}))
	defer evil.Close()
	host := strings.TrimPrefix(evil.URL, "https://")
	panelURL, _ := url.Parse(c.PanelURL)
	hostile := []string{"/\t/" + host + "/x", "/\\/" + host + "/x", "/\n/" + host + "/x", "//" + host + "/x", "/%2F%2F" + host + "/x",
		"/%09/" + host + "/x", "https:" + host + "/x"}

	b := newBrowser(t, c)
	// ends runs steps that load a page and reports where chromium lands.
	ends := func(steps ...chromedp.Action[chromedp.Void]) *url.URL {
		t.Helper()
		ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
		defer cancel()
		chromedp.RunResponse(ctx, steps...) // an error page, or none, is an answer too
		loc, err := chromedp.Run(ctx, chromedp.Location())
		if err != nil {
			t.Fatalf("location: %v", err)
		}
		u, _ := url.Parse(loc)
		return u
	}
	check := func(what, next string, u *url.URL) {
		t.Helper()
		if u == nil || u.Host != panelURL.Host || hits.Load() != 0 {
			t.Fatalf("%s with next %q: chromium is at %v (%d requests to the other origin)", what, next, u, hits.Load())
		}
	}
	for _, next := range hostile {
		check("the language switch", next, ends(chromedp.Navigate(b.base+"/lang/en?next="+url.QueryEscape(next))))
	}
	// The sign-in form carries next in a hidden field. (Chromium also
	// refuses to follow a form's redirect off the origin, by the CSP's
	// form-action 'self'; the pages above have no such guard.)
	user, pw := demoLogin(c)
	b.open("/login?next=" + url.QueryEscape(hostile[0]))
	b.do("fill sign-in", chromedp.SendKeys(chromedp.CSS("#email"), user), chromedp.SendKeys(chromedp.CSS("#password"), pw))
	check("signing in", hostile[0], ends(chromedp.Click(chromedp.CSS("form button[type=submit]"))))
	for _, next := range hostile {
		check("the sign-in page when signed in", next, ends(chromedp.Navigate(b.base+"/login?next="+url.QueryEscape(next))))
	}
}
