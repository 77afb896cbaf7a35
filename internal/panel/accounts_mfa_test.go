package panel_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/tokens"

	"nimbus/internal/cloud"
	"nimbus/internal/testenv"
)

// newWebFrom is newWeb with connections from addr, a loopback address
// other than the cloud's (127.0.0.2 …), so that a test has browsers at
// several addresses.
func newWebFrom(t testing.TB, c *cloud.Cloud, addr string) *web {
	w := newWeb(t, c)
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(addr)}, Timeout: 5 * time.Second}
	w.hc.Transport.(*http.Transport).DialContext = d.DialContext
	return w
}

// enableTOTP signs email in and turns two-factor sign-in on in the panel;
// it returns the secret. The code it used (this step's) is spent.
func enableTOTP(t testing.TB, c *cloud.Cloud, email, password string) string {
	t.Helper()
	w := newWeb(t, c)
	w.login(email, password)
	_, _, page := w.get("/account/security")
	m := secretRE.FindStringSubmatch(page)
	if m == nil {
		t.Fatalf("no secret on the security page: %s", snippet(page))
	}
	if status, _, body := w.post("/account/security", "/account/security",
		url.Values{"action": {"enable"}, "secret": {m[1]}, "code": {totp(t, m[1], time.Now())}}, true); status != http.StatusSeeOther {
		t.Fatalf("enable: %d %s", status, snippet(body))
	}
	return m[1]
}

// apiToken asks the cloud's identity API for a token with gophercloud
// (opts as given; receipt, if any, in Openstack-Auth-Receipt).
func apiToken(t testing.TB, c *cloud.Cloud, opts tokens.AuthOptions, receipt string) tokens.CreateResult {
	t.Helper()
	pc, err := openstack.NewClient(c.IdentityURL)
	if err != nil {
		t.Fatal(err)
	}
	pc.HTTPClient = *testenv.HTTPClient(t, c)
	sc := &gophercloud.ServiceClient{ProviderClient: pc, Endpoint: gophercloud.NormalizeURL(c.IdentityURL)}
	if receipt != "" {
		sc.MoreHeaders = map[string]string{"Openstack-Auth-Receipt": receipt}
	}
	return tokens.Create(context.Background(), sc, &opts)
}

// TestTwoFactorSameRuleAsAPI: turning two-factor sign-in on in the panel
// protects the API too. The password alone gets no token from POST
// /v3/auth/tokens (it did: 201) but a receipt; the receipt and a code
// give one; that code is then spent for the panel's sign-in as well; and
// the user's application credential, made before, still works.
func TestTwoFactorSameRuleAsAPI(t *testing.T) {
	c := startCloud(t)
	register(t, c, "ada@example.com", "ada-password")
	pw := tokens.AuthOptions{Username: "ada@example.com", DomainID: "default", Password: "ada-password"}
	tok, err := apiToken(t, c, pw, "").ExtractTokenID()
	if err != nil {
		t.Fatal(err)
	}
	ada, err := c.Identity.UserByName(context.Background(), "ada@example.com")
	if err != nil {
		t.Fatal(err)
	}
	w := newWeb(t, c)
	resp, raw := testenv.Do(t, w.hc, "POST", c.IdentityURL+"/users/"+ada.ID+"/application_credentials", tok, `{"application_credential":{"name":"ci"}}`)
	testenv.MustStatus(t, resp, raw, http.StatusCreated)
	secret := enableTOTP(t, c, "ada@example.com", "ada-password")

	err = apiToken(t, c, pw, "").Err
	var ue gophercloud.ErrUnexpectedResponseCode
	if !errors.As(err, &ue) || ue.Actual != http.StatusUnauthorized {
		t.Fatalf("the API with the password alone, two-factor sign-in on: %v, want 401", err)
	}
	receipt := ue.ResponseHeader.Get("Openstack-Auth-Receipt")
	if receipt == "" || !strings.Contains(string(ue.Body), `"required_auth_methods":[["password","totp"]]`) {
		t.Fatalf("401 without a receipt: %v %s", ue.ResponseHeader, ue.Body)
	}
	next := totp(t, secret, time.Now().Add(30*time.Second))
	if err := apiToken(t, c, tokens.AuthOptions{UserID: ada.ID, Passcode: next}, receipt).Err; err != nil {
		t.Fatalf("the API with the receipt and a code: %v", err)
	}

	// The panel asks identity the same: the code the API took is spent.
	w2 := newWeb(t, c)
	if status, _, body := w2.post("/login", "/login", url.Values{"email": {"ada@example.com"}, "password": {"ada-password"}}, true); status != http.StatusOK || !strings.Contains(body, `action="/login/totp"`) {
		t.Fatalf("panel sign-in: %d %s", status, snippet(body))
	}
	if status, _, _ := w2.post("/login", "/login/totp", url.Values{"code": {next}}, true); status != http.StatusUnauthorized {
		t.Fatalf("the panel takes a code the API spent: %d, want 401", status)
	}

	// Automation keeps working (the panel's rules allow an application
	// credential alone).
	var cred struct {
		ID, Secret string
	}
	if err := jsonField(raw, "application_credential", &cred); err != nil {
		t.Fatal(err)
	}
	resp, raw = testenv.Do(t, w.hc, "POST", c.IdentityURL+"/auth/tokens", "",
		`{"auth":{"identity":{"methods":["application_credential"],"application_credential":{"id":"`+cred.ID+`","secret":"`+cred.Secret+`"}}}}`)
	testenv.MustStatus(t, resp, raw, http.StatusCreated)
}

// TestTwoFactorFlood: a flood of sign-ins waiting for their code from one
// address is cut off at that address's bound (429) instead of filling a
// table every user shares, and another user signing in from another
// address meanwhile gets in with password and code.
func TestTwoFactorFlood(t *testing.T) {
	c := startCloud(t, func(cfg *cloud.Config) { cfg.Identity.ReceiptsPerAddress = 2 })
	register(t, c, "eve@example.com", "eve-password")
	register(t, c, "mia@example.com", "mia-password")
	enableTOTP(t, c, "eve@example.com", "eve-password")
	miaSecret := enableTOTP(t, c, "mia@example.com", "mia-password")

	var status int
	var body string
	for i := range 3 {
		status, _, body = newWebFrom(t, c, "127.0.0.2").post("/login", "/login",
			url.Values{"email": {"eve@example.com"}, "password": {"eve-password"}}, true)
		if i < 2 && status != http.StatusOK {
			t.Fatalf("sign-in %d from the flood's address: %d %s", i+1, status, snippet(body))
		}
	}
	if status != http.StatusTooManyRequests {
		t.Fatalf("the third pending sign-in from one address: %d %s, want 429", status, snippet(body))
	}

	w := newWebFrom(t, c, "127.0.0.1")
	if status, _, body := w.post("/login", "/login", url.Values{"email": {"mia@example.com"}, "password": {"mia-password"}}, true); status != http.StatusOK || !strings.Contains(body, `action="/login/totp"`) {
		t.Fatalf("mia's sign-in during the flood: %d %s", status, snippet(body))
	}
	if status, loc, _ := w.post("/login", "/login/totp", url.Values{"code": {totp(t, miaSecret, time.Now().Add(30*time.Second))}}, true); status != http.StatusSeeOther || loc != "/servers" {
		t.Fatalf("mia's code during the flood: %d %s", status, loc)
	}
}

// TestTwoFactorOff: turning two-factor sign-in off takes a current code
// and lets the password alone in again, in the panel and the API.
func TestTwoFactorOff(t *testing.T) {
	c := startCloud(t)
	register(t, c, "ida@example.com", "ida-password")
	secret := enableTOTP(t, c, "ida@example.com", "ida-password")
	w := newWeb(t, c)
	w.post("/login", "/login", url.Values{"email": {"ida@example.com"}, "password": {"ida-password"}}, true)
	next := totp(t, secret, time.Now().Add(30*time.Second))
	if status, loc, _ := w.post("/login", "/login/totp", url.Values{"code": {next}}, true); status != http.StatusSeeOther || loc != "/servers" {
		t.Fatalf("sign-in with the code: %d %s", status, loc)
	}
	if status, _, _ := w.post("/account/security", "/account/security", url.Values{"action": {"disable"}, "code": {next}}, true); status != http.StatusBadRequest {
		t.Fatalf("turning off with a spent code: %d, want 400", status)
	}
	if _, _, page := w.get("/account/security"); !strings.Contains(page, `id="totp-on"`) {
		t.Fatal("two-factor sign-in is off after a refused change")
	}
	// Wait for a fresh step: the two around now are spent.
	time.Sleep(time.Until(time.Unix((time.Now().Unix()/30+1)*30, 0)) + 100*time.Millisecond)
	if status, _, body := w.post("/account/security", "/account/security",
		url.Values{"action": {"disable"}, "code": {totp(t, secret, time.Now().Add(30*time.Second))}}, true); status != http.StatusSeeOther {
		t.Fatalf("turning off: %d %s", status, snippet(body))
	}
	newWeb(t, c).login("ida@example.com", "ida-password")
	pw := tokens.AuthOptions{Username: "ida@example.com", DomainID: "default", Password: "ida-password"}
	if err := apiToken(t, c, pw, "").Err; err != nil {
		t.Fatalf("the API with the password after turning off: %v", err)
	}
}

// jsonField decodes the object under key of a JSON document into v.
func jsonField(raw, key string, v any) error {
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(raw), &m); err != nil {
		return err
	}
	return json.Unmarshal(m[key], v)
}
