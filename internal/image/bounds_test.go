package image_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"nimbus/internal/imagecatalog"
	"nimbus/internal/testenv"
)

// TestImageBounds: the customer-controlled counts of the image API are
// bounded as Glance bounds them (image_tag_quota, image_member_quota,
// image_property_quota), also for the properties compute's createImage
// passes on, and a PATCH has a bounded number of operations.
func TestImageBounds(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		img := e.create(t, e.demoTok, `{"name":"bounds","visibility":"shared"}`)["id"].(string)
		// tags is n tags of which unique differ.
		tags := func(n, unique int) string {
			return testenv.JSONList(n, func(i int) string { return fmt.Sprintf(`"t%d"`, i%unique) })
		}
		replaceName := func(n int) string {
			return testenv.JSONList(n, func(i int) string { return fmt.Sprintf(`{"op":"replace","path":"/name","value":"n%d"}`, i) })
		}
		for _, tc := range []struct {
			name, method, path, body string
			hdr                      []string
			code                     int
			msg                      string
		}{
			{"tags at limit, repeated", "POST", "/v2/images", `{"name":"t","tags":` + tags(256, 128) + `}`,
				nil, 201, ""},
			{"tags over limit", "POST", "/v2/images", `{"name":"t","tags":` + tags(129, 129) + `}`,
				nil, 413, "Maximum number of tags exceeded: 128"},
			{"patch at limit", "PATCH", "/v2/images/" + img, replaceName(256), []string{"Content-Type", patchCT}, 200, ""},
			{"patch over limit", "PATCH", "/v2/images/" + img, replaceName(257), []string{"Content-Type", patchCT},
				400, "Too many operations in the request: at most 256 are allowed."},
		} {
			t.Run(tc.name, func(t *testing.T) {
				resp, b := e.do(t, tc.method, tc.path, e.demoTok, tc.body, tc.hdr...)
				if resp.StatusCode != tc.code || !strings.Contains(b, tc.msg) {
					t.Fatalf("%d %s, want %d %q", resp.StatusCode, b, tc.code, tc.msg)
				}
			})
		}

		t.Run("members over limit", func(t *testing.T) {
			for i := range 128 {
				e.want(t, http.StatusOK, "POST", "/v2/images/"+img+"/members", e.demoTok, fmt.Sprintf(`{"member":"p%03d"}`, i))
			}
			resp, b := e.do(t, "POST", "/v2/images/"+img+"/members", e.demoTok, `{"member":"one-more"}`)
			if resp.StatusCode != http.StatusRequestEntityTooLarge ||
				!strings.Contains(b, "Image member limit exceeded for image "+img) || !strings.Contains(b, "Attempted: 129, Maximum: 128") {
				t.Fatalf("%d %s, want 413 member limit", resp.StatusCode, b)
			}
		})

		t.Run("snapshot metadata over limit", func(t *testing.T) {
			st, m := e.compute(t, "POST", "/servers", e.demoTok, `{"server": {"name": "b", "imageRef": "`+imagecatalog.ID("Debian 12")+
				`", "flavorRef": "2", "networks": "auto"}}`)
			if st != http.StatusAccepted {
				t.Fatalf("create server: %d %v", st, m)
			}
			sv := m["server"].(map[string]any)["id"].(string)
			e.waitServer(t, sv, "ACTIVE")
			for _, action := range []string{
				`{"createImage": {"name": "s", "metadata": ` + testenv.JSONObject("k", 129) + `}}`,
				`{"createBackup": {"name": "b", "backup_type": "daily", "rotation": 1, "metadata": ` + testenv.JSONObject("k", 129) + `}}`,
			} {
				st, m := e.compute(t, "POST", "/servers/"+sv+"/action", e.demoTok, action)
				fault, _ := m["overLimit"].(map[string]any)
				if st != http.StatusRequestEntityTooLarge || fault["message"] != "Maximum number of image properties exceeded: 128" {
					t.Errorf("%.40s…: %d %v, want 413 overLimit", action, st, m)
				}
			}
		})
	})
}
