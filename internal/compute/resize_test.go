package compute

import (
	"encoding/json"
	"strings"
	"testing"

	"nimbus/internal/api"
)

// TestParseResize: resize's argument in Nova's schema words: an object
// with a flavorRef (a string or a number, not empty) and an optional
// OS-DCF:diskConfig of AUTO or MANUAL, nothing else.
func TestParseResize(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		arg, ref, dc, err string
	}{
		{`{"flavorRef": "d1.2g.local"}`, "d1.2g.local", "", ""},
		{`{"flavorRef": 42, "OS-DCF:diskConfig": "MANUAL"}`, "42", "MANUAL", ""},
		{`[]`, "", "", "is not of type 'object'"},
		{`{}`, "", "", "'flavorRef' is a required property"},
		{`{"flavorRef": ""}`, "", "", "'' is too short"},
		{`{"flavorRef": true}`, "", "", "is not of type 'string', 'integer'"},
		{`{"flavorRef": "x", "OS-DCF:diskConfig": "FAST"}`, "", "", "is not one of ['AUTO', 'MANUAL']"},
		{`{"flavorRef": "x", "other": 1}`, "", "", "other"},
	} {
		ref, dc, err := parseResize(json.RawMessage(tc.arg))
		if tc.err != "" {
			ae, ok := err.(*api.Error)
			if !ok || ae.Status != 400 || !strings.Contains(ae.Message, tc.err) {
				t.Errorf("%s: %v, want a 400 saying %q", tc.arg, err, tc.err)
			}
			continue
		}
		got := ""
		if dc != nil {
			got = *dc
		}
		if err != nil || ref != tc.ref || got != tc.dc {
			t.Errorf("%s: %q, %q, %v", tc.arg, ref, got, err)
		}
	}
}
