package identity_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/credentials"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/tokens"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/users"

	"nimbus/internal/identity"
	"nimbus/internal/testenv"
)

// receiptOf is the 401 of a token request that wants another factor: its
// receipt header and body, or a test failure.
func receiptOf(t testing.TB, err error) (string, map[string]any) {
	t.Helper()
	var e gophercloud.ErrUnexpectedResponseCode
	if !errors.As(err, &e) || e.Actual != http.StatusUnauthorized {
		t.Fatalf("want 401 with a receipt, got %v", err)
	}
	var body map[string]any
	if err := json.Unmarshal(e.Body, &body); err != nil {
		t.Fatalf("receipt body %q: %v", e.Body, err)
	}
	rc := e.ResponseHeader.Get(identity.ReceiptHeader)
	if rc == "" {
		t.Fatalf("401 without %s: %s", identity.ReceiptHeader, e.Body)
	}
	return rc, body
}

// methodsOf is the methods of an issued token (tokens' ExtractInto reads
// inside "token").
func methodsOf(t testing.TB, r tokens.CreateResult) []string {
	t.Helper()
	var tok struct {
		Methods []string `json:"methods"`
	}
	if err := r.ExtractInto(&tok); err != nil {
		t.Fatal(err)
	}
	slices.Sort(tok.Methods)
	return tok.Methods
}

// TestMFAOverAPI is Keystone's MFA through gophercloud: a user who has a
// TOTP credential and the rule [password, totp] gets, for the password
// alone, 401 with a receipt naming what succeeded and what is required;
// the receipt and a passcode then give a token (once); password and
// passcode in one request give one too; a passcode alone never does; the
// credential's secret is its owner's to read.
func TestMFAOverAPI(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		clk := newClock()
		c := startController(t, dbURL, clk, identity.Limits{})
		mia := c.userID(t, "mia")

		// The owner makes the credential with gophercloud.
		pc, err := c.provider(gophercloud.AuthOptions{Username: "mia", Password: "mia-password", DomainID: "default"})
		if err != nil {
			t.Fatal(err)
		}
		own := identityV3(t, pc)
		cred, err := credentials.Create(ctx, own, credentials.CreateOpts{Type: "totp", UserID: mia, Blob: secret("mia")}).Extract()
		if err != nil {
			t.Fatal(err)
		}
		if cred.Blob != secret("mia") || cred.Type != "totp" || cred.UserID != mia {
			t.Fatalf("credential as made: %+v", cred)
		}
		admin, err := c.provider(gophercloud.AuthOptions{Username: "admin", Password: "admin-secret", DomainID: "default"})
		if err != nil {
			t.Fatal(err)
		}
		adm := identityV3(t, admin)
		if got, err := credentials.Get(ctx, adm, cred.ID).Extract(); err != nil || got.Blob != "" || got.UserID != mia {
			t.Fatalf("an admin reads mia's TOTP credential as %+v, %v; want it without the blob", got, err)
		}
		u, err := users.Update(ctx, adm, mia, users.UpdateOpts{Options: map[users.Option]any{
			users.MultiFactorAuthRules: [][]string{{"password", "totp"}}, users.MultiFactorAuthEnabled: true}}).Extract()
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(u.Options, map[string]any{"multi_factor_auth_rules": []any{[]any{"password", "totp"}}, "multi_factor_auth_enabled": true}) {
			t.Fatalf("options after update: %v", u.Options)
		}

		// The password alone: 401 and a receipt (today's bug: 201).
		anon := c.anonymous(t)
		pw := tokens.AuthOptions{Username: "mia", DomainID: "default", Password: "mia-password"}
		rc, body := receiptOf(t, tokens.Create(ctx, anon, &pw).Err)
		if got := get(body, "receipt", "methods"); !reflect.DeepEqual(got, []any{"password"}) {
			t.Errorf("receipt methods %v, want [password]", got)
		}
		if got := get(body, "required_auth_methods"); !reflect.DeepEqual(got, []any{[]any{"password", "totp"}}) {
			t.Errorf("required_auth_methods %v", got)
		}
		if str(body, "receipt", "user", "id") != mia || str(body, "receipt", "user", "domain", "id") != "default" ||
			str(body, "receipt", "expires_at") == "" {
			t.Errorf("receipt body %v", body)
		}

		// A passcode alone, without the receipt: plain 401.
		now := code(t, secret("mia"), clk.now())
		err = tokens.Create(ctx, anon, &tokens.AuthOptions{UserID: mia, Passcode: now}).Err
		var ue gophercloud.ErrUnexpectedResponseCode
		if !errors.As(err, &ue) || ue.Actual != http.StatusUnauthorized || ue.ResponseHeader.Get(identity.ReceiptHeader) != "" {
			t.Fatalf("a passcode alone: %v, want 401 without a receipt", err)
		}

		// The receipt and the passcode: a token naming both methods.
		r := tokens.Create(ctx, c.withReceipt(t, rc), &tokens.AuthOptions{UserID: mia, Passcode: now})
		if r.Err != nil {
			t.Fatalf("receipt and passcode: %v", r.Err)
		}
		if got := methodsOf(t, r); !reflect.DeepEqual(got, []string{"password", "totp"}) {
			t.Errorf("token methods %v", got)
		}
		// A receipt is spent with its token.
		clk.add(30 * time.Second)
		next := code(t, secret("mia"), clk.now())
		err = tokens.Create(ctx, c.withReceipt(t, rc), &tokens.AuthOptions{UserID: mia, Passcode: next}).Err
		if !errors.As(err, &ue) || ue.Actual != http.StatusUnauthorized {
			t.Fatalf("a spent receipt: %v, want 401", err)
		}

		// Both in one request, as openstack --os-auth-type v3multifactor
		// sends them; gophercloud does with Password and Passcode.
		both, err := c.provider(gophercloud.AuthOptions{Username: "mia", Password: "mia-password", Passcode: next, DomainID: "default"})
		if err != nil {
			t.Fatalf("password and passcode in one request: %v", err)
		}
		if both.TokenID == "" {
			t.Fatal("no token")
		}
	})
}

// TestPasscodeSpentAcrossControllers: a passcode that gave a token is
// refused afterwards, by the same controller and by another one on the
// same database, in one request or with a receipt; the next step's
// passcode still works.
func TestPasscodeSpentAcrossControllers(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		clk := newClock()
		a := startController(t, dbURL, clk, identity.Limits{})
		b := startController(t, dbURL, clk, identity.Limits{})
		a.withTOTP(t, "mia", `[["password","totp"]]`)
		mia := a.userID(t, "mia")
		hc := http.DefaultClient
		used := code(t, secret("mia"), clk.now())
		a.expect(t, http.StatusCreated, hc, "POST", "/auth/tokens", "", bothAuth("mia", "mia-password", used))

		for _, c := range []*controller{a, b} {
			_, m := c.expect(t, http.StatusUnauthorized, hc, "POST", "/auth/tokens", "", bothAuth("mia", "mia-password", used))
			keystoneError(t, m, 401, unauthorized)
			resp, _ := c.expect(t, http.StatusUnauthorized, hc, "POST", "/auth/tokens", "", passwordAuth("mia", "mia-password", ""))
			rc := resp.Header.Get(identity.ReceiptHeader)
			c.expect(t, http.StatusUnauthorized, hc, "POST", "/auth/tokens", "", totpAuth(mia, used), identity.ReceiptHeader, rc)
		}
		// A passcode of an earlier step is refused too, though it is
		// within the drift.
		before := code(t, secret("mia"), clk.now().Add(-30*time.Second))
		b.expect(t, http.StatusUnauthorized, hc, "POST", "/auth/tokens", "", bothAuth("mia", "mia-password", before))
		after := code(t, secret("mia"), clk.now().Add(30*time.Second))
		b.expect(t, http.StatusCreated, hc, "POST", "/auth/tokens", "", bothAuth("mia", "mia-password", after))
	})
}

// TestReceiptFloodOneAddress: sign-ins waiting for a second factor are
// bounded per address (the flood's address gets 429) and per user (the
// oldest give way), so a flood from one address leaves another user's
// sign-in alone.
func TestReceiptFloodOneAddress(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		clk := newClock()
		c := startController(t, dbURL, clk, identity.Limits{ReceiptsPerAddress: 2})
		c.withTOTP(t, "eve", `[["password","totp"]]`)
		c.withTOTP(t, "mia", `[["password","totp"]]`)
		attacker := from("127.0.0.2")
		var receipts []string
		for range 2 {
			resp, _ := c.expect(t, http.StatusUnauthorized, attacker, "POST", "/auth/tokens", "", passwordAuth("eve", "eve-password", ""))
			receipts = append(receipts, resp.Header.Get(identity.ReceiptHeader))
			clk.add(time.Second)
		}
		resp, m := c.expect(t, http.StatusTooManyRequests, attacker, "POST", "/auth/tokens", "", passwordAuth("eve", "eve-password", ""))
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || s < 1 || s > 300 {
			t.Errorf("Retry-After %q", resp.Header.Get("Retry-After"))
		}
		keystoneError(t, m, 429, "")

		// Mia, elsewhere, signs in with both factors meanwhile.
		victim := from("127.0.0.1")
		resp, _ = c.expect(t, http.StatusUnauthorized, victim, "POST", "/auth/tokens", "", passwordAuth("mia", "mia-password", ""))
		c.expect(t, http.StatusCreated, victim, "POST", "/auth/tokens", "",
			totpAuth(c.userID(t, "mia"), code(t, secret("mia"), clk.now())), identity.ReceiptHeader, resp.Header.Get(identity.ReceiptHeader))

		// From more addresses, eve holds three receipts at most: the
		// oldest gave way.
		for _, addr := range []string{"127.0.0.3", "127.0.0.4"} {
			clk.add(time.Second)
			r, _ := c.expect(t, http.StatusUnauthorized, from(addr), "POST", "/auth/tokens", "", passwordAuth("eve", "eve-password", ""))
			receipts = append(receipts, r.Header.Get(identity.ReceiptHeader))
		}
		_, m = c.expect(t, http.StatusUnauthorized, victim, "POST", "/auth/tokens", "",
			totpAuth(c.userID(t, "eve"), code(t, secret("eve"), clk.now())), identity.ReceiptHeader, receipts[0])
		keystoneError(t, m, 401, "Could not find auth receipt.")
		c.expect(t, http.StatusCreated, victim, "POST", "/auth/tokens", "",
			totpAuth(c.userID(t, "eve"), code(t, secret("eve"), clk.now())), identity.ReceiptHeader, receipts[3])

		// A receipt lives five minutes: then the address may sign in again.
		clk.add(5*time.Minute + time.Second)
		c.expect(t, http.StatusUnauthorized, attacker, "POST", "/auth/tokens", "", passwordAuth("eve", "eve-password", ""))
	})
}

// TestWrongPasscodes: five wrong passcodes end a receipt; ten in a row
// refuse even the right one for fifteen minutes; only a user's right
// password lets anyone try passcodes, so guesses without it lock nothing.
func TestWrongPasscodes(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		clk := newClock()
		c := startController(t, dbURL, clk, identity.Limits{})
		c.withTOTP(t, "mia", `[["password","totp"]]`)
		mia, hc := c.userID(t, "mia"), http.DefaultClient
		right := func() string { return code(t, secret("mia"), clk.now()) }
		wrong := func() string {
			if right() == "000000" {
				return "000001"
			}
			return "000000"
		}
		for range 20 {
			c.expect(t, http.StatusUnauthorized, hc, "POST", "/auth/tokens", "", totpAuth(mia, wrong()))
		}
		signIn := func() string {
			resp, _ := c.expect(t, http.StatusUnauthorized, hc, "POST", "/auth/tokens", "", passwordAuth("mia", "mia-password", ""))
			return resp.Header.Get(identity.ReceiptHeader)
		}
		rc := signIn()
		for range 5 {
			c.expect(t, http.StatusUnauthorized, hc, "POST", "/auth/tokens", "", totpAuth(mia, wrong()), identity.ReceiptHeader, rc)
		}
		_, m := c.expect(t, http.StatusUnauthorized, hc, "POST", "/auth/tokens", "", totpAuth(mia, right()), identity.ReceiptHeader, rc)
		keystoneError(t, m, 401, "Could not find auth receipt.")

		for range 5 {
			c.expect(t, http.StatusUnauthorized, hc, "POST", "/auth/tokens", "", bothAuth("mia", "mia-password", wrong()))
		}
		resp, _ := c.expect(t, http.StatusUnauthorized, hc, "POST", "/auth/tokens", "", bothAuth("mia", "mia-password", right()))
		if resp.Header.Get("Retry-After") == "" {
			t.Error("the right passcode after ten wrong ones: no Retry-After")
		}
		clk.add(15*time.Minute + time.Second)
		c.expect(t, http.StatusCreated, hc, "POST", "/auth/tokens", "", bothAuth("mia", "mia-password", right()))
	})
}

// TestMFARulesAndApplicationCredentials: as in Keystone, the rules apply
// to every method: under [[password, totp]] an application credential
// alone gets a receipt; the panel's rules, which add
// [application_credential], keep automation working. A token re-scoped
// from a two-factor token keeps its methods; disabling MFA lets the
// password alone in again.
func TestMFARulesAndApplicationCredentials(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		clk := newClock()
		c := startController(t, dbURL, clk, identity.Limits{})
		mia, hc := c.userID(t, "mia"), http.DefaultClient
		_, m := c.expect(t, http.StatusCreated, hc, "POST", "/users/"+mia+"/application_credentials", c.token(t, "mia"),
			`{"application_credential":{"name":"ci"}}`)
		acID, acSecret := str(m, "application_credential", "id"), str(m, "application_credential", "secret")
		c.withTOTP(t, "mia", `[["password","totp"]]`)

		resp, m := c.expect(t, http.StatusUnauthorized, hc, "POST", "/auth/tokens", "", appCredAuth(acID, acSecret))
		if resp.Header.Get(identity.ReceiptHeader) == "" || !reflect.DeepEqual(get(m, "receipt", "methods"), []any{"application_credential"}) {
			t.Fatalf("application credential under [[password, totp]]: %v", m)
		}
		rules, _ := json.Marshal(identity.PanelTOTPRules)
		c.expect(t, http.StatusOK, hc, "PATCH", "/users/"+mia, c.token(t, "admin"), `{"user":{"options":{"multi_factor_auth_rules":`+string(rules)+`}}}`)
		c.expect(t, http.StatusCreated, hc, "POST", "/auth/tokens", "", appCredAuth(acID, acSecret))
		c.expect(t, http.StatusUnauthorized, hc, "POST", "/auth/tokens", "", passwordAuth("mia", "mia-password", ""))

		resp, _ = c.expect(t, http.StatusCreated, hc, "POST", "/auth/tokens", "", bothAuth("mia", "mia-password", code(t, secret("mia"), clk.now())))
		tok := resp.Header.Get("X-Subject-Token")
		_, m = c.expect(t, http.StatusCreated, hc, "POST", "/auth/tokens", "",
			`{"auth":{"identity":{"methods":["token"],"token":{"id":"`+tok+`"}}}}`)
		if got := get(m, "token", "methods"); !reflect.DeepEqual(got, []any{"token", "password", "totp"}) {
			t.Errorf("re-scoped token methods %v", got)
		}

		c.expect(t, http.StatusOK, hc, "PATCH", "/users/"+mia, c.token(t, "admin"), `{"user":{"options":{"multi_factor_auth_enabled":false}}}`)
		c.expect(t, http.StatusCreated, hc, "POST", "/auth/tokens", "", passwordAuth("mia", "mia-password", ""))
	})
}

// TestUserOptions: options are validated as Keystone's schema does, set
// and unset (null), and shown on the user; Keystone's options Nimbus does
// not implement are refused rather than kept without effect.
func TestUserOptions(t *testing.T) {
	c := startController(t, testenv.Engines(t)[0].URL, newClock(), identity.Limits{})
	mia, admin, hc := c.userID(t, "mia"), c.token(t, "admin"), http.DefaultClient
	patch := func(options string) (*http.Response, map[string]any) {
		return c.call(t, hc, "PATCH", "/users/"+mia, admin, `{"user":{"options":`+options+`}}`)
	}
	for _, tc := range []struct {
		options string
		status  int
		want    string // the options shown after, for a 200
	}{
		{`{"multi_factor_auth_rules":[["password","totp"],["application_credential"]]}`, 200,
			`{"multi_factor_auth_rules":[["password","totp"],["application_credential"]]}`},
		{`{"multi_factor_auth_enabled":true}`, 200,
			`{"multi_factor_auth_enabled":true,"multi_factor_auth_rules":[["password","totp"],["application_credential"]]}`},
		{`{"multi_factor_auth_rules":null}`, 200, `{"multi_factor_auth_enabled":true}`},
		{`{"multi_factor_auth_rules":[]}`, 200, `{"multi_factor_auth_enabled":true,"multi_factor_auth_rules":[]}`},
		{`{"multi_factor_auth_rules":true}`, 400, ""},
		{`{"multi_factor_auth_rules":[true]}`, 400, ""},
		{`{"multi_factor_auth_rules":[[]]}`, 400, ""},
		{`{"multi_factor_auth_rules":[["password"],["password"]]}`, 400, ""},
		{`{"multi_factor_auth_rules":[["password","password"]]}`, 400, ""},
		{`{"multi_factor_auth_rules":[[1]]}`, 400, ""},
		{`{"multi_factor_auth_rules":[["a"],["b"],["c"],["d"],["e"],["f"],["g"],["h"],["i"],["j"],["k"],["l"],["m"],["n"],["o"],["p"],["q"]]}`, 400, ""},
		{`{"multi_factor_auth_enabled":"yes"}`, 400, ""},
		{`{"lock_password":true}`, 400, ""},
		{`{"colour":"blue"}`, 400, ""},
		{`[]`, 400, ""},
		{`{"multi_factor_auth_enabled":null,"multi_factor_auth_rules":null}`, 200, `{}`},
	} {
		resp, m := patch(tc.options)
		if resp.StatusCode != tc.status {
			t.Errorf("options %s: %d %v, want %d", tc.options, resp.StatusCode, m, tc.status)
			continue
		}
		if tc.status != 200 {
			keystoneError(t, m, 400, "")
			continue
		}
		got, _ := json.Marshal(get(m, "user", "options"))
		_, shown := c.expect(t, http.StatusOK, hc, "GET", "/users/"+mia, admin, "")
		again, _ := json.Marshal(get(shown, "user", "options"))
		if string(got) != tc.want || string(again) != tc.want {
			t.Errorf("options %s: shown %s and %s, want %s", tc.options, got, again, tc.want)
		}
	}
	// A user made with options has them.
	_, m := c.expect(t, http.StatusCreated, hc, "POST", "/users", admin,
		`{"user":{"name":"zoe","password":"zoe-password","options":{"multi_factor_auth_rules":[["password","totp"]]}}}`)
	if got, _ := json.Marshal(get(m, "user", "options")); string(got) != `{"multi_factor_auth_rules":[["password","totp"]]}` {
		t.Errorf("created with options: %s", got)
	}
	// A member may not set them.
	resp, _ := c.call(t, hc, "PATCH", "/users/"+mia, c.token(t, "eve"), `{"user":{"options":{"multi_factor_auth_enabled":false}}}`)
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("a member sets options: %d, want 403", resp.StatusCode)
	}
}

// TestCredentialsAPI covers /v3/credentials beyond TOTP sign-in: what is
// refused, who sees what.
func TestCredentialsAPI(t *testing.T) {
	c := startController(t, testenv.Engines(t)[0].URL, newClock(), identity.Limits{})
	hc := http.DefaultClient
	mia, eve := c.userID(t, "mia"), c.userID(t, "eve")
	miaTok, eveTok, admin := c.token(t, "mia"), c.token(t, "eve"), c.token(t, "admin")
	create := func(token, body string) (*http.Response, map[string]any) {
		return c.call(t, hc, "POST", "/credentials", token, body)
	}
	for _, tc := range []struct {
		name, token, body string
		status            int
	}{
		{"totp", miaTok, `{"credential":{"type":"totp","user_id":"` + mia + `","blob":"` + secret("mia") + `"}}`, 201},
		{"padded secret", miaTok, `{"credential":{"type":"totp","user_id":"` + mia + `","blob":"GEZDGNBVGY3TQOJQGEZDGNBVGY======"}}`, 201},
		{"other type", miaTok, `{"credential":{"type":"cert","user_id":"` + mia + `","blob":"-----BEGIN-----"}}`, 201},
		{"not base32", miaTok, `{"credential":{"type":"totp","user_id":"` + mia + `","blob":"not a secret!"}}`, 400},
		{"lower case", miaTok, `{"credential":{"type":"totp","user_id":"` + mia + `","blob":"gezdgnbvgy3tqojqgezdgnbvgy"}}`, 400},
		{"short secret", miaTok, `{"credential":{"type":"totp","user_id":"` + mia + `","blob":"GEZDGNBV"}}`, 400},
		{"no type", miaTok, `{"credential":{"user_id":"` + mia + `","blob":"x"}}`, 400},
		{"no user", miaTok, `{"credential":{"type":"cert","blob":"x"}}`, 400},
		{"ec2", miaTok, `{"credential":{"type":"ec2","user_id":"` + mia + `","blob":"{}"}}`, 400},
		{"for another user", eveTok, `{"credential":{"type":"totp","user_id":"` + mia + `","blob":"` + secret("eve") + `"}}`, 403},
		{"another's project", miaTok, `{"credential":{"type":"cert","user_id":"` + mia + `","blob":"x","project_id":"` + projectID(t, c, "eve") + `"}}`, 403},
		{"no such user (admin)", admin, `{"credential":{"type":"cert","user_id":"nobody","blob":"x"}}`, 400},
	} {
		if resp, m := create(tc.token, tc.body); resp.StatusCode != tc.status {
			t.Errorf("%s: %d %v, want %d", tc.name, resp.StatusCode, m, tc.status)
		}
	}
	_, m := c.expect(t, http.StatusOK, hc, "GET", "/credentials", miaTok, "")
	list, _ := get(m, "credentials").([]any)
	if len(list) != 3 {
		t.Fatalf("mia lists %d credentials, want 3: %v", len(list), m)
	}
	id := ""
	for _, cr := range list {
		if str(cr, "blob") == secret("mia") && str(cr, "type") == "totp" {
			id = str(cr, "id")
		}
	}
	if id == "" {
		t.Errorf("the owner does not see the TOTP blob: %v", list)
	}
	_, m = c.expect(t, http.StatusOK, hc, "GET", "/credentials?user_id="+mia, eveTok, "")
	if l, _ := get(m, "credentials").([]any); len(l) != 0 {
		t.Errorf("eve lists mia's credentials: %v", m)
	}
	c.expect(t, http.StatusNotFound, hc, "GET", "/credentials/"+id, eveTok, "")
	c.expect(t, http.StatusNotFound, hc, "DELETE", "/credentials/"+id, eveTok, "")
	_, m = c.expect(t, http.StatusOK, hc, "GET", "/credentials?type=totp", admin, "")
	for _, cr := range get(m, "credentials").([]any) {
		if _, shown := cr.(map[string]any)["blob"]; shown {
			t.Errorf("an admin sees a TOTP secret: %v", cr)
		}
	}
	_, m = c.expect(t, http.StatusOK, hc, "GET", "/credentials?type=cert", admin, "")
	if l := get(m, "credentials").([]any); len(l) != 1 || str(l[0], "blob") != "-----BEGIN-----" {
		t.Errorf("an admin lists cert credentials as %v", m)
	}
	// The owner never changes (OSSA-2020-005).
	c.expect(t, http.StatusForbidden, hc, "PATCH", "/credentials/"+id, miaTok, `{"credential":{"user_id":"`+eve+`"}}`)
	c.expect(t, http.StatusBadRequest, hc, "PATCH", "/credentials/"+id, miaTok, `{"credential":{"blob":"nope"}}`)
	_, m = c.expect(t, http.StatusOK, hc, "PATCH", "/credentials/"+id, miaTok, `{"credential":{"blob":"`+secret("new")+`"}}`)
	if str(m, "credential", "blob") != secret("new") || str(m, "credential", "user_id") != mia {
		t.Errorf("after update: %v", m)
	}
	c.expect(t, http.StatusNoContent, hc, "DELETE", "/credentials/"+id, admin, "")
	c.expect(t, http.StatusNotFound, hc, "GET", "/credentials/"+id, miaTok, "")
	// A restricted application credential's token may not change the
	// user's credentials: a leaked one must not add a second factor of its
	// holder's choosing.
	_, m = c.expect(t, http.StatusCreated, hc, "POST", "/users/"+mia+"/application_credentials", miaTok, `{"application_credential":{"name":"ro"}}`)
	resp, _ := c.expect(t, http.StatusCreated, hc, "POST", "/auth/tokens", "",
		appCredAuth(str(m, "application_credential", "id"), str(m, "application_credential", "secret")))
	acTok := resp.Header.Get("X-Subject-Token")
	if resp, m := create(acTok, `{"credential":{"type":"totp","user_id":"`+mia+`","blob":"`+secret("eve")+`"}}`); resp.StatusCode != http.StatusForbidden {
		t.Errorf("a restricted application credential adds a TOTP credential: %d %v", resp.StatusCode, m)
	}
	// At most 20 per user.
	for i := range 20 {
		resp, _ := create(miaTok, `{"credential":{"type":"cert","user_id":"`+mia+`","blob":"b`+strconv.Itoa(i)+`"}}`)
		if want := map[bool]int{true: 201, false: 403}[i < 18]; resp.StatusCode != want {
			t.Fatalf("credential %d: %d, want %d", i+3, resp.StatusCode, want)
		}
	}
}

func projectID(t testing.TB, c *controller, name string) string {
	t.Helper()
	id, err := c.svc.ProjectID(context.Background(), name)
	if err != nil || id == "" {
		t.Fatalf("project %s: %q %v", name, id, err)
	}
	return id
}
