package volume_test

import (
	"testing"

	"nimbus/internal/testenv"
)

// TestVolumeMetadataBound: a volume holds at most 128 metadata items,
// however they arrive: on create, update, replace, or merged by POST or
// PUT of one item.
func TestVolumeMetadataBound(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		base := "/v3/" + e.demoProj + "/volumes"
		m := e.want(t, 202, "POST", base, e.demoTok, `{"volume":{"size":1,"metadata":`+testenv.JSONObject("a", 100)+`}}`)
		vol := base + "/" + m["volume"].(map[string]any)["id"].(string)
		const msg = "Invalid metadata: Maximum number of metadata items exceeds 128"
		for _, tc := range []struct {
			name, method, path, body string
			code                     int
		}{
			{"create over limit", "POST", base, `{"volume":{"size":1,"metadata":` + testenv.JSONObject("a", 129) + `}}`, 400},
			{"update over limit", "PUT", vol, `{"volume":{"metadata":` + testenv.JSONObject("a", 129) + `}}`, 400},
			{"replace over limit", "PUT", vol + "/metadata", `{"metadata":` + testenv.JSONObject("b", 129) + `}`, 400},
			{"merge over limit", "POST", vol + "/metadata", `{"metadata":` + testenv.JSONObject("b", 29) + `}`, 400},
			{"merge to the limit", "POST", vol + "/metadata", `{"metadata":` + testenv.JSONObject("b", 28) + `}`, 200},
			{"merge of known keys at the limit", "POST", vol + "/metadata", `{"metadata":` + testenv.JSONObject("a", 50) + `}`, 200},
			{"item over limit", "PUT", vol + "/metadata/c", `{"meta":{"c":"v"}}`, 400},
			{"item replaced at the limit", "PUT", vol + "/metadata/a0", `{"meta":{"a0":"w"}}`, 200},
		} {
			t.Run(tc.name, func(t *testing.T) {
				resp, m := e.do(t, tc.method, tc.path, e.demoTok, tc.body)
				bad, _ := m["badRequest"].(map[string]any)
				if resp.StatusCode != tc.code || (tc.code == 400 && bad["message"] != msg) {
					t.Fatalf("%d %v, want %d", resp.StatusCode, m, tc.code)
				}
			})
		}
		m = e.want(t, 200, "GET", vol+"/metadata", e.demoTok, "")
		if n := len(m["metadata"].(map[string]any)); n != 128 {
			t.Fatalf("metadata items: %d, want 128", n)
		}
	})
}
