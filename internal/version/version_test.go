package version

import "testing"

func TestString(t *testing.T) {
	for _, tc := range []struct {
		in         Info
		short, has string
	}{
		{Info{Release: "v1.2.0", Commit: "abc", Go: "go1.26"}, "v1.2.0", "v1.2.0 (commit abc), go1.26"},
		{Info{Commit: "0123456789abcdef0123", Time: "2026-11-28T10:00:00Z", Go: "go1.26"}, "dev-0123456789ab",
			"dev-0123456789ab (commit 0123456789abcdef0123 of 2026-11-28T10:00:00Z), go1.26"},
		{Info{Commit: "0123456789abcdef", Modified: true, Go: "go1.26"}, "dev-0123456789ab+changes",
			"dev-0123456789ab+changes (commit 0123456789abcdef, with changes), go1.26"},
		{Info{Go: "go1.26"}, "dev", "dev, go1.26"},
	} {
		if got := tc.in.String(); got != tc.short {
			t.Errorf("%+v: String %q, want %q", tc.in, got, tc.short)
		}
		if got := tc.in.Long(); got != tc.has {
			t.Errorf("%+v: Long %q, want %q", tc.in, got, tc.has)
		}
	}
}
