package api_test

import (
	"errors"
	"slices"
	"testing"

	"nimbus/internal/api"
)

func TestParseBool(t *testing.T) {
	tests := []struct {
		in    string
		v, ok bool
	}{
		{"true", true, true}, {"TRUE", true, true}, {"1", true, true}, {"yes", true, true}, {"On", true, true},
		{"t", true, true}, {"y", true, true}, {" true ", true, true},
		{"false", false, true}, {"False", false, true}, {"0", false, true}, {"no", false, true}, {"OFF", false, true},
		{"f", false, true}, {"n", false, true},
		{"", false, false}, {"2", false, false}, {"maybe", false, false}, {"truee", false, false},
	}
	for _, tt := range tests {
		if v, ok := api.ParseBool(tt.in); v != tt.v || ok != tt.ok {
			t.Errorf("ParseBool(%q) = %v, %v; want %v, %v", tt.in, v, ok, tt.v, tt.ok)
		}
	}
}

func TestIntRule(t *testing.T) {
	errNotInt, errSmall := errors.New("not int"), errors.New("too small")
	rule := api.IntRule{Default: 25, Min: 0, Max: 100,
		NotInt: func(string) error { return errNotInt }, TooSmall: func(string) error { return errSmall }}
	noSmall := rule
	noSmall.TooSmall = nil
	tests := []struct {
		name  string
		rule  api.IntRule
		raw   string
		given bool
		want  int
		err   error
	}{
		{"absent is the default", rule, "", false, 25, nil},
		{"given empty is not an integer", rule, "", true, 0, errNotInt},
		{"in range", rule, "7", true, 7, nil},
		{"zero", rule, "0", true, 0, nil},
		{"past the maximum is the maximum", rule, "5000", true, 100, nil},
		{"below the minimum", rule, "-1", true, 0, errSmall},
		{"below the minimum, one message", noSmall, "-1", true, 0, errNotInt},
		{"not a number", rule, "x", true, 0, errNotInt},
		{"overflow", rule, "99999999999999999999", true, 0, errNotInt},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.rule.Parse(tt.raw, tt.given)
			if got != tt.want || err != tt.err {
				t.Errorf("Parse = %d, %v; want %d, %v", got, err, tt.want, tt.err)
			}
		})
	}
}

func TestPlaceholders(t *testing.T) {
	for n, want := range []string{"", "?", "?, ?", "?, ?, ?"} {
		if got := api.Placeholders(n); got != want {
			t.Errorf("Placeholders(%d) = %q, want %q", n, got, want)
		}
	}
	in, args := api.InList([]string{"a", "b"})
	if in != "IN (?, ?)" || !slices.Equal(args, []any{"a", "b"}) {
		t.Errorf("InList = %q, %v", in, args)
	}
}

func TestSchemaError(t *testing.T) {
	tests := []struct {
		value any
		want  string
	}{
		{"abc", "Invalid input for field/attribute f. Value: abc. bad"},
		{true, "Invalid input for field/attribute f. Value: True. bad"},
		{false, "Invalid input for field/attribute f. Value: False. bad"},
		{nil, "Invalid input for field/attribute f. Value: None. bad"},
		{3, "Invalid input for field/attribute f. Value: 3. bad"},
		{map[string]int{"a": 1}, `Invalid input for field/attribute f. Value: {"a":1}. bad`},
	}
	for _, tt := range tests {
		e := api.SchemaError("f", tt.value, "%s", "bad")
		if e.Status != 400 || e.Message != tt.want {
			t.Errorf("SchemaError(%v) = %d %q, want 400 %q", tt.value, e.Status, e.Message, tt.want)
		}
	}
}
