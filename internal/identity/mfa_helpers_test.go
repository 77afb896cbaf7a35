package identity_test

import (
	"context"
	"crypto/hmac"
	"crypto/sha1"
	"encoding/base32"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"

	"nimbus/internal/api"
	"nimbus/internal/identity"
	"nimbus/internal/store"
	"nimbus/internal/testenv"
)

// clock is a time the test moves, shared by the controllers of a test.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

// newClock starts 10 s into a TOTP step, so that a step's passcode stays
// the current one until the test moves the clock.
func newClock() *clock {
	return &clock{t: time.Date(2026, 11, 30, 12, 0, 10, 0, time.UTC)}
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// controller is identity's own service alone on a database, over HTTP on a
// loopback port: what one Nimbus controller serves on its identity port.
type controller struct {
	svc *identity.Service
	url string // ends in /v3
}

// Bootstrap accounts of every controller: the admin, and two customers.
var mfaAccounts = []identity.Account{
	{User: "admin", Password: "admin-secret", Project: "admin", Role: "admin"},
	{User: "mia", Password: "mia-password", Project: "mia", Role: "member"},
	{User: "eve", Password: "eve-password", Project: "eve", Role: "member"},
}

// startController opens dbURL (a second controller on the same URL shares
// the database, as controllers sharing one PostgreSQL do) and serves its
// identity API.
func startController(t testing.TB, dbURL string, clk *clock, l identity.Limits) *controller {
	t.Helper()
	ctx := context.Background()
	db, err := store.Open(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	svc := identity.New(db)
	svc.SetLimits(l)
	identity.SetClock(svc, clk.now)
	if err := svc.Bootstrap(ctx, mfaAccounts...); err != nil {
		t.Fatal(err)
	}
	as := api.NewService("identity", api.RenderKeystone, svc)
	as.Log = testenv.Log()
	as.Handle(svc.Routes()...)
	srv := httptest.NewServer(as)
	t.Cleanup(srv.Close)
	as.AuthURL = srv.URL
	svc.SetCatalog([]identity.CatalogService{{Type: "identity", Name: "keystone", URL: srv.URL + "/v3"}})
	return &controller{svc: svc, url: srv.URL + "/v3"}
}

// from is an HTTP client whose connections come from addr, a loopback
// address (127.0.0.2 …), so that a test has clients at several addresses.
func from(addr string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(addr)}, Timeout: 5 * time.Second}
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DialContext: d.DialContext}}
}

// call sends a request from client and decodes a JSON answer.
func (c *controller) call(t testing.TB, client *http.Client, method, path, token, body string, hdr ...string) (*http.Response, map[string]any) {
	t.Helper()
	resp, raw := testenv.Do(t, client, method, c.url+path, token, body, hdr...)
	var m map[string]any
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") && raw != "" {
		if err := json.Unmarshal([]byte(raw), &m); err != nil {
			t.Fatalf("%s %s: bad JSON %q: %v", method, path, raw, err)
		}
	}
	return resp, m
}

// expect is call plus a status check.
func (c *controller) expect(t testing.TB, want int, client *http.Client, method, path, token, body string, hdr ...string) (*http.Response, map[string]any) {
	t.Helper()
	resp, m := c.call(t, client, method, path, token, body, hdr...)
	if resp.StatusCode != want {
		t.Fatalf("%s %s: status %d, want %d; body %v", method, path, resp.StatusCode, want, m)
	}
	return resp, m
}

// token is a password token of a bootstrap user (one without MFA rules).
func (c *controller) token(t testing.TB, user string) string {
	t.Helper()
	resp, _ := c.expect(t, http.StatusCreated, http.DefaultClient, "POST", "/auth/tokens", "", passwordAuth(user, user+"-"+pwSuffix(user), ""))
	return resp.Header.Get("X-Subject-Token")
}

func pwSuffix(user string) string {
	if user == "admin" {
		return "secret"
	}
	return "password"
}

func (c *controller) userID(t testing.TB, name string) string {
	t.Helper()
	u, err := c.svc.UserByName(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	return u.ID
}

// provider is gophercloud authenticated with opts on c.
func (c *controller) provider(opts gophercloud.AuthOptions) (*gophercloud.ProviderClient, error) {
	pc, err := openstack.NewClient(c.url)
	if err != nil {
		return nil, err
	}
	opts.IdentityEndpoint = c.url
	return pc, openstack.Authenticate(context.Background(), pc, opts)
}

// anonymous is gophercloud's identity client without a token, for
// tokens.Create.
func (c *controller) anonymous(t testing.TB) *gophercloud.ServiceClient {
	t.Helper()
	pc, err := openstack.NewClient(c.url)
	if err != nil {
		t.Fatal(err)
	}
	return &gophercloud.ServiceClient{ProviderClient: pc, Endpoint: gophercloud.NormalizeURL(c.url)}
}

// withReceipt is the anonymous client sending receipt in
// Openstack-Auth-Receipt. gophercloud's tokens.Create takes a Passcode but
// sends no receipt (it never calls ToTokenV3HeadersMap), so the header goes
// as one of the client's MoreHeaders.
func (c *controller) withReceipt(t testing.TB, receipt string) *gophercloud.ServiceClient {
	t.Helper()
	sc := c.anonymous(t)
	sc.MoreHeaders = map[string]string{identity.ReceiptHeader: receipt}
	return sc
}

// secret is a fixed TOTP secret (20 bytes) for user.
func secret(user string) string {
	return base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString([]byte(fmt.Sprintf("%-20.20s", "key of "+user)))
}

// code is RFC 6238's passcode of a base32 secret at t, written again here
// so that the test does not trust identity's own.
func code(t testing.TB, secret string, at time.Time) string {
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

// withTOTP gives user a TOTP credential (made with the user's own token, as
// Keystone lets an owner) and, as admin, rules.
func (c *controller) withTOTP(t testing.TB, user string, rules string) {
	t.Helper()
	id := c.userID(t, user)
	c.expect(t, http.StatusCreated, http.DefaultClient, "POST", "/credentials", c.token(t, user),
		`{"credential":{"type":"totp","user_id":"`+id+`","blob":"`+secret(user)+`"}}`)
	c.expect(t, http.StatusOK, http.DefaultClient, "PATCH", "/users/"+id, c.token(t, "admin"),
		`{"user":{"options":{"multi_factor_auth_rules":`+rules+`,"multi_factor_auth_enabled":true}}}`)
}

// totpAuth is a totp method body for user id.
func totpAuth(userID, passcode string) string {
	return `{"auth":{"identity":{"methods":["totp"],"totp":{"user":{"id":"` + userID + `","passcode":"` + passcode + `"}}}}}`
}

// bothAuth is password and totp in one request.
func bothAuth(user, password, passcode string) string {
	return `{"auth":{"identity":{"methods":["password","totp"],"password":{"user":{"name":"` + user +
		`","domain":{"id":"default"},"password":"` + password + `"}},"totp":{"user":{"name":"` + user +
		`","domain":{"id":"default"},"passcode":"` + passcode + `"}}}}}`
}
