package panel_test

import (
	"context"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"

	"nimbus/internal/cloud"
	"nimbus/internal/testenv"
)

var (
	credIDRE     = regexp.MustCompile(`application_credential_id: &#34;([0-9a-f]{32})&#34;`)
	credSecretRE = regexp.MustCompile(`application_credential_secret: &#34;([A-Za-z0-9_-]+)&#34;`)
)

// appCredAuth authenticates with gophercloud by application credential.
func appCredAuth(t testing.TB, c *cloud.Cloud, id, secret string) error {
	t.Helper()
	pc, err := openstack.NewClient(c.IdentityURL)
	if err != nil {
		t.Fatal(err)
	}
	pc.HTTPClient = *testenv.HTTPClient(t, c)
	return openstack.Authenticate(context.Background(), pc, gophercloud.AuthOptions{
		IdentityEndpoint: c.IdentityURL, ApplicationCredentialID: id, ApplicationCredentialSecret: secret})
}

// TestAPIAccess: clouds.yaml and openrc hold no password; an application
// credential made on the page authenticates gophercloud with the
// clouds.yaml it shows, and deleting it ends that.
func TestAPIAccess(t *testing.T) {
	c := startCloud(t)
	w := newWeb(t, c)
	w.login(demoLogin(c))
	for _, tc := range []struct{ path, want string }{
		{"/api-access/clouds.yaml", "auth_url: \"" + c.IdentityURL + "\""},
		{"/api-access/openrc", "export OS_AUTH_URL='" + c.IdentityURL + "'"},
	} {
		status, _, body := w.get(tc.path)
		if status != http.StatusOK || !strings.Contains(body, tc.want) || !strings.Contains(body, "demo") ||
			strings.Contains(body, c.Secrets.DemoPassword) {
			t.Errorf("%s: %d %s", tc.path, status, body)
		}
	}

	status, _, page := w.post("/api-access", "/api-access/credentials", url.Values{"name": {"terraform"}}, true)
	id, secret := credIDRE.FindStringSubmatch(page), credSecretRE.FindStringSubmatch(page)
	if status != http.StatusOK || id == nil || secret == nil || !strings.Contains(page, "auth_type: v3applicationcredential") {
		t.Fatalf("create credential: %d %s", status, snippet(page))
	}
	if err := appCredAuth(t, c, id[1], secret[1]); err != nil {
		t.Fatalf("gophercloud with the page's clouds.yaml: %v", err)
	}
	_, _, list := w.get("/api-access")
	if !strings.Contains(list, `data-credential="`+id[1]+`"`) || strings.Contains(list, secret[1]) {
		t.Errorf("the list should show the credential and never its secret again")
	}
	if status, _, _ := w.post("/api-access", "/api-access/credentials", url.Values{"name": {"terraform"}}, true); status != http.StatusSeeOther {
		t.Errorf("a second credential of the same name: %d, want back with the API's message", status)
	}

	// Another customer cannot delete it through their own panel session.
	other := newWeb(t, c)
	register(t, c, "olga@example.com", "olga-password")
	other.login("olga@example.com", "olga-password")
	other.post("/api-access", "/api-access/credentials/"+id[1]+"/delete", url.Values{"confirm": {"yes"}}, true)
	if err := appCredAuth(t, c, id[1], secret[1]); err != nil {
		t.Fatalf("another customer's delete ended the credential: %v", err)
	}
	if status, _, _ := w.post("/api-access", "/api-access/credentials/"+id[1]+"/delete", url.Values{}, true); status != http.StatusSeeOther {
		t.Fatalf("delete without confirming: %d", status)
	}
	if err := appCredAuth(t, c, id[1], secret[1]); err != nil {
		t.Fatalf("an unconfirmed delete ended the credential: %v", err)
	}
	if status, _, _ := w.post("/api-access", "/api-access/credentials/"+id[1]+"/delete", url.Values{"confirm": {"yes"}}, true); status != http.StatusSeeOther {
		t.Fatalf("delete: %d", status)
	}
	if err := appCredAuth(t, c, id[1], secret[1]); !gophercloud.ResponseCodeIs(err, http.StatusUnauthorized) {
		t.Fatalf("after delete the credential authenticates: %v", err)
	}
}

// TestBrowserAccountPages: the API access, security, reset and two-factor
// code pages pass axe.
func TestBrowserAccountPages(t *testing.T) {
	mail := newSMTPReceiver(t)
	c := startCloud(t, withSMTP(mail))
	b := newBrowser(t, c)
	b.open("/reset")
	b.axe()
	register(t, c, "pat@example.com", "pat-password")
	newWeb(t, c).post("/reset", "/reset", url.Values{"email": {"pat@example.com"}}, true)
	b.open(strings.TrimPrefix(mailedLink(t, mail.next(t)), c.PanelURL))
	b.axe()

	b.login(demoLogin(c))
	for _, page := range []string{"/api-access", "/account/security"} {
		b.open(page)
		b.axe()
	}
	b.open("/api-access")
	b.shot("api-access")

	// The code page of a two-factor sign-in.
	b2 := newBrowser(t, c)
	w := newWeb(t, c)
	w.login("pat@example.com", "pat-password")
	_, _, page := w.get("/account/security")
	secret := secretRE.FindStringSubmatch(page)[1]
	w.post("/account/security", "/account/security", url.Values{"action": {"enable"}, "secret": {secret}, "code": {totp(t, secret, time.Now())}}, true)
	b2.login("pat@example.com", "pat-password")
	b2.do("code form", chromedp.WaitVisible(chromedp.CSS("#code")))
	b2.axe()
}
