package image_test

import (
	"crypto/md5"
	"encoding/hex"
	"net/http"
	"strings"
	"testing"

	"nimbus/internal/imagecatalog"
	"nimbus/internal/testenv"
)

// TestReplaceData: the admin-only nimbus-replace-data action moves a
// staging image's data into a catalog placeholder, which keeps its id,
// name and properties and loses its placeholder mark; the staging image
// goes.
func TestReplaceData(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		octet := []string{"Content-Type", "application/octet-stream"}
		// staged makes an image of tok's project holding data (none: queued).
		staged := func(tok, data string) string {
			im := e.create(t, tok, `{"name": "staging", "disk_format": "raw", "container_format": "bare"}`)
			id := im["id"].(string)
			if data != "" {
				e.want(t, http.StatusNoContent, "PUT", "/v2/images/"+id+"/file", tok, data, octet...)
			}
			return id
		}
		target := imagecatalog.ID("Debian 12")
		action := func(id string) string { return "/v2/images/" + id + "/actions/nimbus-replace-data" }
		body := func(from string) string { return `{"from": "` + from + `"}` }

		demoImg := staged(e.demoTok, "demo data")
		queued := staged(e.adminTok, "")
		for _, tc := range []struct {
			name, tok, id, body string
			status              int
			msg                 string
		}{
			{"a member is refused", e.demoTok, target, body(demoImg), http.StatusForbidden, "nimbus_replace_data"},
			{"a source without data", e.adminTok, target, body(queued), http.StatusConflict, "is queued"},
			{"another project's data", e.adminTok, target, body(demoImg), http.StatusConflict, "another project"},
			{"itself", e.adminTok, target, body(target), http.StatusBadRequest, "its own data"},
			{"no source id", e.adminTok, target, `{}`, http.StatusBadRequest, "'from'"},
			{"an unknown source", e.adminTok, target, body("00000000-0000-4000-8000-000000000000"), http.StatusNotFound, "No image found"},
			{"an unknown target", e.adminTok, "00000000-0000-4000-8000-000000000000", body(queued), http.StatusNotFound, "No image found"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				resp, b := e.do(t, "POST", action(tc.id), tc.tok, tc.body)
				testenv.MustStatus(t, resp, b, tc.status)
				if !strings.Contains(b, tc.msg) {
					t.Errorf("%d %s: want %q", resp.StatusCode, b, tc.msg)
				}
			})
		}
		before := e.want(t, http.StatusOK, "GET", "/v2/images/"+target, e.adminTok, "")
		if before["nimbus_placeholder"] != "true" {
			t.Fatalf("the catalog image is no placeholder: %v", before)
		}

		const data = "the real Debian 12 disk"
		src := staged(e.adminTok, data)
		got := e.want(t, http.StatusOK, "POST", action(target), e.adminTok, body(src))
		sum := md5.Sum([]byte(data))
		after := e.want(t, http.StatusOK, "GET", "/v2/images/"+target, e.adminTok, "")
		for _, m := range []map[string]any{got, after} {
			if m["id"] != target || m["name"] != "Debian 12" || m["checksum"] != hex.EncodeToString(sum[:]) ||
				m["size"] != float64(len(data)) || m["disk_format"] != "raw" || m["status"] != "active" ||
				m["visibility"] != before["visibility"] || m["os_distro"] != "debian" || m["login_user"] != "debian" ||
				m["min_disk"] != before["min_disk"] || m["nimbus_placeholder"] != nil || m["os_hash_value"] == before["os_hash_value"] {
				t.Fatalf("after the swap %v, before %v", m, before)
			}
		}
		if resp, b := e.do(t, "GET", "/v2/images/"+target+"/file", e.demoTok, ""); resp.StatusCode != 200 || b != data {
			t.Fatalf("download: %d %q", resp.StatusCode, b)
		}
		e.want(t, http.StatusNotFound, "GET", "/v2/images/"+src, e.adminTok, "")
	})
}
