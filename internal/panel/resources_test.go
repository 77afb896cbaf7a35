package panel_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"nimbus/internal/panel"
)

// TestResourcePages walks the volume, backup, network, key and floating IP
// pages in a browser: each renders, passes axe, and makes and deletes its
// resource through the API.
func TestResourcePages(t *testing.T) {
	c := startCloud(t)
	b := newBrowser(t, c)
	b.login(demoLogin(c))

	b.open("/volumes")
	b.axe()
	b.do("fill volume", chromedp.SendKeys(chromedp.CSS("#vol-name"), "data-1"))
	b.navigate("create volume", chromedp.Submit(chromedp.CSS("#vol-name")))
	if got := b.text("main table tbody"); !strings.Contains(got, "data-1") {
		t.Fatalf("volume list after create: %q", got)
	}
	b.shot("volumes")

	b.open("/networks")
	b.axe()
	b.do("fill network", chromedp.SendKeys(chromedp.CSS("#net-name"), "backend"), chromedp.Clear(chromedp.CSS("#net-cidr")),
		chromedp.SendKeys(chromedp.CSS("#net-cidr"), "10.77.0.0/24"))
	b.navigate("create network", chromedp.Submit(chromedp.CSS("#net-name")))
	if got := b.text("main table tbody"); !strings.Contains(got, "10.77.0.0/24") {
		t.Fatalf("network list after create: %q", got)
	}
	// A bad range comes back with Neutron's message, and no network is
	// left behind.
	b.do("fill bad network", chromedp.SendKeys(chromedp.CSS("#net-name"), "broken"), chromedp.Clear(chromedp.CSS("#net-cidr")),
		chromedp.SendKeys(chromedp.CSS("#net-cidr"), "10.78.0.0/99"))
	b.navigate("create bad network", chromedp.Submit(chromedp.CSS("#net-name")))
	if got := b.text(".flash.bad"); got == "" {
		t.Fatal("no error shown for a bad CIDR")
	}
	if got := b.text("main table tbody"); strings.Contains(got, "broken") {
		t.Fatalf("a network was left half-made: %q", got)
	}
	b.shot("networks")

	b.open("/keys")
	b.axe()
	b.do("fill key", chromedp.SendKeys(chromedp.CSS("#key-name"), "laptop"), chromedp.Click(chromedp.CSS(`input[name="generate"]`)))
	b.navigate("generate key", chromedp.Submit(chromedp.CSS("#key-name")))
	if got := b.text("#private-key"); !strings.Contains(got, "BEGIN OPENSSH PRIVATE KEY") {
		t.Fatalf("generated key not shown: %q", got)
	}
	b.open("/keys")
	if got := b.text("main table tbody"); !strings.Contains(got, "laptop") {
		t.Fatalf("key list: %q", got)
	}
	b.do("confirm delete", chromedp.Click(chromedp.CSS(`form.confirm input[name="confirm"]`)))
	b.navigate("delete key", chromedp.Submit(chromedp.CSS(`form.confirm input[name="confirm"]`)))
	if got := b.text("main table tbody"); strings.Contains(got, "laptop") {
		t.Fatalf("key not deleted: %q", got)
	}

	b.open("/floating-ips")
	b.axe()
	b.navigate("allocate", chromedp.Submit(chromedp.CSS(`form[action="/floating-ips"] button`)))
	if got := b.text("main"); !strings.Contains(got, "ACTIVE") && !strings.Contains(got, "DOWN") {
		t.Fatalf("no address after allocating: %q", got)
	}
	b.shot("floating-ips")

	// The backups page lists volume backups beside server backups: one
	// of the volume made above, once it is available.
	for end := time.Now().Add(20 * time.Second); ; time.Sleep(300 * time.Millisecond) {
		b.open("/volumes")
		if strings.Contains(b.text("main table tbody"), "available") {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("volume not available: %q", b.text("main table tbody"))
		}
	}
	b.open("/backups")
	b.axe()
	b.do("fill volume backup", chromedp.Clear(chromedp.CSS("#vb-name")), chromedp.SendKeys(chromedp.CSS("#vb-name"), "vol-bk-1"))
	b.navigate("back up the volume", chromedp.Submit(chromedp.CSS("#vb-name")))
	if got := b.text("#volume-backups tbody"); !strings.Contains(got, "vol-bk-1") || !strings.Contains(got, "data-1") {
		t.Fatalf("volume backups after create: %q", got)
	}
	b.axe()
	b.shot("backups")
}

// TestResourceDeleteNeedsConfirmation: a delete form without its box
// ticked deletes nothing.
func TestResourceDeleteNeedsConfirmation(t *testing.T) {
	c := startCloud(t)
	w := newWeb(t, c)
	w.login(demoLogin(c))
	status, _, _ := w.post("/keys", "/keys", url.Values{"name": {"k1"}, "generate": {"yes"}}, true)
	if status != http.StatusOK {
		t.Fatalf("generate: %d", status)
	}
	for _, tt := range []struct {
		form url.Values
		gone bool
	}{{url.Values{}, false}, {url.Values{"confirm": {"yes"}}, true}} {
		w.post("/keys", "/keys/k1/delete", tt.form, true)
		_, _, body := w.get("/keys")
		if gone := !strings.Contains(body, ">k1<"); gone != tt.gone {
			t.Fatalf("form %v: key gone = %v, want %v", tt.form, gone, tt.gone)
		}
	}
}

func TestGenerateKey(t *testing.T) {
	pub, priv, err := panel.GenerateKey("me@host")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(pub, "ssh-ed25519 ") || !strings.HasSuffix(pub, " me@host") || !strings.Contains(priv, "OPENSSH PRIVATE KEY") {
		t.Fatalf("pub %q priv %q", pub, priv[:40])
	}
}
