package identity_test

import (
	"strings"
	"testing"

	"nimbus/internal/identity"
)

// TestValidEmail: an address is what net/mail parses as one bare address,
// not whatever lacks a few characters: comments, display names, quoting,
// NULs and empty labels are refused.
func TestValidEmail(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want bool
	}{
		{"ann@example.com", true},
		{"ann.lee+x@example.com", true},
		{"a_b-c@mail.example.co.uk", true},
		{"", false},
		{"nobody", false},
		{"@example.com", false},
		{"ann@", false},
		{"ann@localhost", false},
		{"ann@@example.com", false},
		{"ann@example..com", false},
		{"ann@.example.com", false},
		{".ann@example.com", false},
		{"ann.@example.com", false},
		{"ann\x00@example.com", false},
		{"ann@example.com\x00", false},
		{"ann\t@example.com", false},
		{"(comment)ann@example.com", false},
		{"ann@example.com(comment)", false},
		{"Ann <ann@example.com>", false},
		{`"ann lee"@example.com`, false},
		{"ann@example.com, eve@example.com", false},
		{"ann@[127.0.0.1]", false},
		{"ann@example.com\r\nBcc: eve@example.com", false},
		{"\xffann@example.com", false},
		{strings.Repeat("a", 250) + "@example.com", false},
	} {
		if got := identity.ValidEmail(tt.in); got != tt.want {
			t.Errorf("ValidEmail(%q) = %v, want %v", tt.in, got, tt.want)
		}
	}
}
