package compute

import (
	"encoding/json"
	"testing"
)

// TestAppendJSONValue: the hand-written encoder of server views writes
// what encoding/json writes for each kind of value a view holds.
func TestAppendJSONValue(t *testing.T) {
	s := "x"
	tests := []struct {
		name string
		v    any
	}{
		{"nil", nil},
		{"string", "a \"quoted\" <tag> é"},
		{"string pointer", &s},
		{"nil string pointer", (*string)(nil)},
		{"numbers and bools", []any{1, int64(-2), true, false}},
		{"strings", []string{"b", "a"}},
		{"empty strings", []string{}},
		{"string map", map[string]string{"z": "1", "a": "2", "m": ""}},
		{"empty string map", map[string]string{}},
		{"string maps", []map[string]string{{"k": "v", "a": "b"}, {}}},
		{"nested", map[string]any{"b": []any{"x", map[string]any{"d": 1, "c": nil}}, "a": map[string]string{"y": "z"}}},
		{"other", []int{3, 1}},
	}
	for _, tc := range tests {
		want, err := json.Marshal(tc.v)
		if err != nil {
			t.Fatal(err)
		}
		if got := appendJSONValue(nil, tc.v); string(got) != string(want) {
			t.Errorf("%s: got %s, want %s", tc.name, got, want)
		}
	}
}
