package panel

import (
	"fmt"
	"math"
	"math/big"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"nimbus/internal/billing"
)

// TestSafeNext: a redirect target from a request is parsed and rebuilt
// from its path, query and fragment; anything that could leave the
// panel's origin (a scheme, a host, a path a browser reads as "//host")
// becomes "/".
func TestSafeNext(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"", "/"},
		{"/billing?x=1", "/billing?x=1"},
		{"/support#request", "/support#request"},
		{"/servers/", "/servers/"},
		{"/configure?vcpus=2&name=my+box", "/configure?name=my+box&vcpus=2"},
		{"/@evil.example", "/@evil.example"},
		{"/a/../..//evil.example/x", "/evil.example/x"},
		{"/.//evil.example", "/evil.example"},
		// The finding: a tab, which browsers drop, makes "/\t/host" "//host".
		{"/\t/evil.example/x", "/"},
		{"/%09/evil.example/x", "/"},
		{"/\n/evil.example", "/"},
		{"/\r\n/evil.example", "/"},
		{"/a\r\nSet-Cookie: x=1", "/"},
		{"/%0d%0aSet-Cookie:%20x=1", "/"},
		{"/%00", "/"},
		{"/ /evil.example", "/"},
		{"//evil.example", "/"},
		{"///evil.example", "/"},
		{"/%2F%2Fevil.example", "/"},
		{"/%2F/evil.example", "/"},
		{"/\\evil.example", "/"},
		{"\\\\evil.example", "/"},
		{"/%5Cevil.example", "/"},
		{"/%5C%5Cevil.example", "/"},
		{"https://evil.example/", "/"},
		{"https:evil.example", "/"},
		{"https:/evil.example", "/"},
		{"HTTPS://evil.example", "/"},
		{"javascript:alert(1)", "/"},
		{" javascript:alert(1)", "/"},
		{"data:text/html,x", "/"},
		{"evil.example", "/"},
		{"./x", "/"},
		{"?next=//evil.example", "/"},
		{"#x", "/"},
		{"/\u3000/evil.example", "/"},    // ideographic space
		{"/\u2028/evil.example", "/"},    // line separator
		{"/%E2%80%A8/evil.example", "/"}, // the same, escaped
		{"/\u202e/evil.example", "/"},    // right-to-left override
		{"/\xff/evil.example", "/"},      // not UTF-8
		{"/\uff0f\uff0fevil.example", "/%EF%BC%8F%EF%BC%8Fevil.example"}, // fullwidth solidi stay a path
		{"/servers#%09/x", "/"},
		{"/servers?q=%0a", "/"},
		{"/servers?q=a+b%20c#x%20y", "/servers?q=a+b+c#x%20y"},
		{"/" + strings.Repeat("a", 5000), "/"},
	} {
		if got := safeNext(tt.in); got != tt.want {
			t.Errorf("safeNext(%q) = %q, want %q", tt.in, got, tt.want)
		}
		checkLocal(t, tt.in, safeNext(tt.in))
	}
}

// checkLocal fails unless out, as a Location header, can only lead to the
// panel's own origin: printable ASCII, no backslash, one leading slash.
func checkLocal(t *testing.T, in, out string) {
	t.Helper()
	for i := 0; i < len(out); i++ {
		if c := out[i]; c <= ' ' || c >= 0x7f || c == '\\' {
			t.Fatalf("safeNext(%q) = %q holds byte %#x", in, out, c)
		}
	}
	if !strings.HasPrefix(out, "/") || strings.HasPrefix(out, "//") {
		t.Fatalf("safeNext(%q) = %q does not start with one slash", in, out)
	}
	base, _ := url.Parse("https://panel.example/servers/x")
	u, err := url.Parse(out)
	if err != nil {
		t.Fatalf("safeNext(%q) = %q does not parse: %v", in, out, err)
	}
	if r := base.ResolveReference(u); r.Scheme != "https" || r.Host != "panel.example" || r.User != nil {
		t.Fatalf("safeNext(%q) = %q leads to %s", in, out, r)
	}
}

// FuzzSafeNext: whatever comes in, what goes out stays on the origin.
func FuzzSafeNext(f *testing.F) {
	for _, s := range []string{"/", "/\t/evil", "//evil", "/%2F%2Fevil", "/\\evil", "https:evil", "/a?b=c#d"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		out := safeNext(in)
		checkLocal(t, in, out)
		if again := safeNext(out); again != out {
			t.Fatalf("safeNext(%q) = %q, but safeNext(%q) = %q", in, out, out, again)
		}
	})
}

func TestErrorMessage(t *testing.T) {
	for _, tt := range []struct{ body, want string }{
		{`{"badRequest": {"message": "Invalid flavorRef provided.", "code": 400}}`, "Invalid flavorRef provided."},
		{`{"error": {"message": "The request you have made requires authentication.", "code": 401}}`, "The request you have made requires authentication."},
		{`{"NeutronError": {"type": "X", "message": "Quota exceeded", "detail": ""}}`, "Quota exceeded"},
		{"404 Not Found\n\nNo image found with ID x\n\n   ", "No image found with ID x"},
		{"<html>boom</html>", "500 Internal Server Error"},
		{"", "500 Internal Server Error"},
	} {
		if got := errorMessage([]byte(tt.body), "500 Internal Server Error"); got != tt.want {
			t.Errorf("errorMessage(%q) = %q, want %q", tt.body, got, tt.want)
		}
	}
}

func TestMoneyFormat(t *testing.T) {
	usd := Money{Currency: "RUB", Presentation: "USD", Rate: big.NewRat(11, 1000)}
	for _, tt := range []struct {
		m     Money
		minor int64
		want  string
	}{
		{Money{Currency: "RUB"}, 10000, "100.00 RUB"},
		{Money{Currency: "RUB"}, -5, "-0.05 RUB"},
		{usd, 10000, "100.00 RUB (≈ 1.10 USD)"},
		{usd, 4545, "45.45 RUB (≈ 0.50 USD)"},
		{usd, -10000, "-100.00 RUB (≈ -1.10 USD)"},
	} {
		if got := tt.m.Format(tt.minor); got != tt.want {
			t.Errorf("Format(%d) = %q, want %q", tt.minor, got, tt.want)
		}
	}
}

func TestSealRoundTrip(t *testing.T) {
	secret := newSecret()
	sealed, err := seal(secret, "gAAAA-token")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := unseal(secret, sealed); err != nil || got != "gAAAA-token" {
		t.Fatalf("unseal = %q, %v", got, err)
	}
	if _, err := unseal(newSecret(), sealed); err == nil {
		t.Fatal("another cookie's key opened the token")
	}
}

// TestSignUpLimitPerSubscriber: the sign-up and reset limit counts an IPv6
// client by its /64, as the APIs do, so a subscriber's 2^64 addresses are
// one client, not 2^64 fresh allowances.
func TestSignUpLimitPerSubscriber(t *testing.T) {
	p := &Panel{cfg: Config{Now: time.Now}}
	ask := func(addr string) error {
		r := httptest.NewRequest("POST", "/signup", nil)
		r.RemoteAddr = addr
		return p.limited(&req{w: httptest.NewRecorder(), r: r, p: p}, "")
	}
	for i := range 10 {
		if err := ask(fmt.Sprintf("[2001:db8:1:2::%x]:4000", i+1)); err != nil {
			t.Fatalf("sign-up %d: %v", i, err)
		}
	}
	if err := ask("[2001:db8:1:2:ffff::1]:4000"); err == nil {
		t.Fatal("an 11th sign-up from one /64 was let through")
	}
	if err := ask("[2001:db8:1:3::1]:4000"); err != nil {
		t.Fatalf("another /64: %v", err)
	}
}

// TestRateText: rates are written exactly, in major units, with at least
// the currency's two decimals and no trailing zeros past them.
func TestRateText(t *testing.T) {
	for _, tt := range []struct {
		units, scale int64
		want         string
	}{
		{5000, billing.RateScale, "0.005"},           // local disk per GB and hour
		{5000 * 720, billing.RateScale, "3.60"},      // … and per month
		{500000, billing.RateScale, "0.50"},          // a vCPU per hour
		{15000000, billing.RateScale, "15.00"},       // an A100 per hour
		{1, billing.RateScale, "0.000001"},           // the smallest rate
		{123456789, billing.RateScale, "123.456789"}, // every digit kept
		{8000 * 730, billing.RateScale, "5.84"},      // another month length
		{0, billing.RateScale, "0.00"},
		{-5000, billing.RateScale, "-0.005"},
		{math.MinInt64, billing.RateScale, "-9223372036854.775808"},
		{math.MaxInt64, billing.RateScale, "9223372036854.775807"},
		{1234, 1, "12.34"}, // minor units
		{-5, 1, "-0.05"},
	} {
		if got := rateText(tt.units, tt.scale); got != tt.want {
			t.Errorf("rateText(%d, %d) = %q, want %q", tt.units, tt.scale, got, tt.want)
		}
	}
	usd := Money{Currency: "RUB", Presentation: "USD", Rate: big.NewRat(11, 1000)}
	for _, tt := range []struct {
		m     Money
		units int64
		want  string
	}{
		{Money{Currency: "RUB"}, 5000, "0.005 RUB"},
		{usd, 5000, "0.005 RUB (≈ 0.000055 USD)"},
		{usd, 5000 * 720, "3.60 RUB (≈ 0.0396 USD)"},
		{usd, 3, "0.000003 RUB (≈ 0.00 USD)"},
	} {
		if got := tt.m.Exact(tt.units); got != tt.want {
			t.Errorf("Exact(%d) = %q, want %q", tt.units, got, tt.want)
		}
	}
	if got := perMonth(math.MaxInt64/2, 720); got != math.MaxInt64 {
		t.Errorf("perMonth past int64 = %d", got)
	}
}

// TestLoginWays: "How to log in" shows first the address the customer
// reaches, the public one where the server has one, and names the key.
func TestLoginWays(t *testing.T) {
	fixed, public := []string{"10.0.0.5"}, []string{"203.0.113.7"}
	ssh := func(host string, port int) loginInfo {
		return loginInfo{Protocol: "ssh", Host: host, Port: port, User: "ubuntu"}
	}
	for _, tt := range []struct {
		name          string
		access        []loginInfo
		fixed, public []string
		key           string
		want          []loginWay
	}{
		{"private address, public one beside", []loginInfo{ssh("10.0.0.5", 22)}, fixed, public, "web-key",
			[]loginWay{{"ssh", "ubuntu", "ssh -i ~/.ssh/web-key ubuntu@203.0.113.7", false}}},
		{"compute lists both (bridged)", []loginInfo{ssh("203.0.113.7", 22), ssh("10.0.0.5", 22)}, fixed, public, "web-key",
			[]loginWay{{"ssh", "ubuntu", "ssh -i ~/.ssh/web-key ubuntu@203.0.113.7", false}}},
		{"no public address", []loginInfo{ssh("10.0.0.5", 22)}, fixed, nil, "web-key",
			[]loginWay{{"ssh", "ubuntu", "ssh -i ~/.ssh/web-key ubuntu@10.0.0.5", true}}},
		{"a forwarded port (user-mode networking)", []loginInfo{ssh("192.0.2.10", 2201)}, fixed, public, "k",
			[]loginWay{{"ssh", "ubuntu", "ssh -i ~/.ssh/k -p 2201 ubuntu@192.0.2.10", false}}},
		{"private listed first", []loginInfo{ssh("10.0.0.5", 22), ssh("192.0.2.10", 2201)}, fixed, nil, "",
			[]loginWay{{"ssh", "ubuntu", "ssh -p 2201 ubuntu@192.0.2.10", false}, {"ssh", "ubuntu", "ssh ubuntu@10.0.0.5", true}}},
		{"a key name the shell must quote", []loginInfo{ssh("203.0.113.7", 22)}, fixed, public, "my key's",
			[]loginWay{{"ssh", "ubuntu", `ssh -i ~/.ssh/'my key'\''s' ubuntu@203.0.113.7`, false}}},
		{"remote desktop", []loginInfo{{Protocol: "rdp", Host: "10.0.0.5", Port: 3389, User: "Administrator"}}, fixed, public, "k",
			[]loginWay{{"rdp", "Administrator", "203.0.113.7", false}}},
		{"not running", nil, fixed, public, "k", nil},
	} {
		if got := loginWays(tt.access, tt.fixed, tt.public, tt.key); !slices.Equal(got, tt.want) {
			t.Errorf("%s: %+v, want %+v", tt.name, got, tt.want)
		}
	}
}

// TestStamp: an API's moment is written as every page writes one.
func TestStamp(t *testing.T) {
	for in, want := range map[string]string{
		"2026-11-30T12:34:56Z":           "2026-11-30 12:34 UTC",
		"2026-11-30T15:34:56+03:00":      "2026-11-30 12:34 UTC",
		"2026-11-30T12:34:56.000000":     "2026-11-30 12:34 UTC", // Nova, Cinder
		"2026-11-30T12:34:56.123456789Z": "2026-11-30 12:34 UTC",
		"soon":                           "soon",
	} {
		if got := stamp(in); got != want {
			t.Errorf("stamp(%q) = %q, want %q", in, got, want)
		}
	}
}
