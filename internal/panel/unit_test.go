package panel

import (
	"math/big"
	"testing"
)

func TestSafeNext(t *testing.T) {
	for in, want := range map[string]string{
		"":                  "/servers",
		"/billing?x=1":      "/billing?x=1",
		"//evil.example":    "/servers",
		"/\\evil.example":   "/servers",
		"https://evil":      "/servers",
		"/a\r\nSet-Cookie:": "/servers",
	} {
		if got := safeNext(in); got != want {
			t.Errorf("safeNext(%q) = %q, want %q", in, got, want)
		}
	}
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
