package panel_test

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"nimbus/internal/cloud"
)

// panelPages are every page without a parameter, by who opens them.
var panelPages = map[string][]string{
	"visitor": {"/", "/login", "/signup", "/reset", "/prices", "/configure", "/support"},
	"member": {"/servers", "/configure", "/volumes", "/backups", "/networks", "/keys", "/floating-ips",
		"/billing", "/api-access", "/account/security", "/support"},
	"admin": {"/admin", "/admin/hosts", "/admin/customers", "/admin/trials", "/admin/prices", "/admin/support"},
}

// maxPageWeight is the bound on a page with its assets, compressed.
const maxPageWeight = 150 << 10

var refRE = regexp.MustCompile(`(?i)\b(?:src|href|action|srcset|poster|data)\s*=\s*"([^"]*)"`)

// TestPageWeight loads every page with its CSS, JavaScript and images as a
// browser would (gzip), checks the total against the bound, and that
// nothing is fetched from another origin.
func TestPageWeight(t *testing.T) {
	c := startCloud(t)
	for who, pages := range panelPages {
		w := newWeb(t, c)
		w.hc.Transport.(*http.Transport).DisableCompression = true
		switch who {
		case "member":
			w.login(demoLogin(c))
		case "admin":
			w.login(adminLogin(c))
		}
		for _, path := range pages {
			body, size := fetchGzip(t, w, path)
			assets := 0
			for _, m := range refRE.FindAllStringSubmatch(body, -1) {
				ref := m[1]
				if external(ref, c) {
					t.Errorf("%s %s refers to another origin: %q", who, path, ref)
				}
				if strings.HasPrefix(ref, "/static/") {
					_, n := fetchGzip(t, w, ref)
					assets += n
				}
			}
			t.Logf("%-8s %-18s page %6d B, with assets %6d B (gzip)", who, path, size, size+assets)
			if size+assets > maxPageWeight {
				t.Errorf("%s %s weighs %d bytes compressed, over %d", who, path, size+assets, maxPageWeight)
			}
		}
	}
}

// external is a reference that leaves the panel's origin (the console's
// frame is set by script from the API's answer, never in the page).
func external(ref string, c *cloud.Cloud) bool {
	r := strings.ToLower(strings.TrimSpace(ref))
	if strings.HasPrefix(r, strings.ToLower(c.PanelURL)) {
		return false
	}
	return strings.HasPrefix(r, "//") || strings.Contains(r, "://")
}

// fetchGzip gets path asking for gzip and returns the page's text and its
// size on the wire.
func fetchGzip(t *testing.T, w *web, path string) (string, int) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, w.base+path, nil)
	req.Header.Set("Accept-Encoding", "gzip")
	resp, err := w.hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: %d", path, resp.StatusCode)
	}
	text := raw
	if resp.Header.Get("Content-Encoding") == "gzip" {
		text = gunzip(t, raw)
	} else if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
		t.Errorf("%s sent uncompressed", path)
	}
	return string(text), len(raw)
}

func gunzip(t *testing.T, b []byte) []byte {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	out, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestAxeEveryPage runs axe-core on every page of panelPages and on the
// error page, as a visitor, a customer and an operator.
func TestAxeEveryPage(t *testing.T) {
	c := startCloud(t)
	for _, who := range []string{"visitor", "member", "admin"} {
		b := newBrowser(t, c)
		switch who {
		case "member":
			b.login(demoLogin(c))
		case "admin":
			b.login(adminLogin(c))
		}
		for _, path := range append(panelPages[who], "/no-such-page") {
			b.open(path)
			b.axe()
		}
	}
}
