package volume_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/volumes"

	"nimbus/internal/testenv"
)

// TestTypeAccess: a private volume type is hidden from a project until an
// admin gives it access (then listed, shown and used for volumes), and
// again after the access is taken back; the access calls' errors are
// Cinder's.
func TestTypeAccess(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		m := e.want(t, 200, "POST", "/v3/types", e.adTok, `{"volume_type":{"name":"gold","os-volume-type-access:is_public":false}}`)
		gold := m["volume_type"].(map[string]any)["id"].(string)
		m = e.want(t, 200, "GET", "/v3/types/default", e.adTok, "")
		public := m["volume_type"].(map[string]any)["id"].(string)
		access := "/v3/types/" + gold + "/os-volume-type-access"
		action := "/v3/types/" + gold + "/action"
		add := fmt.Sprintf(`{"addProjectAccess":{"project":%q}}`, e.demoProj)
		remove := fmt.Sprintf(`{"removeProjectAccess":{"project":%q}}`, e.demoProj)

		// sees reports whether demo sees gold in the list and by id.
		sees := func(t *testing.T) bool {
			t.Helper()
			listed := strings.Contains(mustJSON(t, e.want(t, 200, "GET", "/v3/types", e.demoTok, "")), gold)
			resp, _ := e.do(t, "GET", "/v3/types/"+gold, e.demoTok, "")
			if listed != (resp.StatusCode == 200) {
				t.Fatalf("listed %v but show answers %d", listed, resp.StatusCode)
			}
			return listed
		}
		if sees(t) {
			t.Fatal("demo sees the private type before any access")
		}
		e.want(t, 404, "POST", "/v3/volumes", e.demoTok, `{"volume":{"size":1,"volume_type":"gold"}}`)

		for _, c := range []struct {
			name, method, path, tok, body string
			status                        int
			msg                           string
		}{
			{"member adds", "POST", action, e.demoTok, add, 403, "volume_type_access"},
			{"member lists", "GET", access, e.demoTok, "", 403, "volume_type_access"},
			{"add", "POST", action, e.adTok, add, 202, ""},
			{"add again", "POST", action, e.adTok, add, 409, "already exists"},
			{"public type", "POST", "/v3/types/" + public + "/action", e.adTok, add, 400, "not applicable to public volume type"},
			{"public type's list", "GET", "/v3/types/" + public + "/os-volume-type-access", e.adTok, "", 404, "not available for public volume types"},
			{"no project", "POST", action, e.adTok, `{"addProjectAccess":{}}`, 400, "project"},
			{"unknown action", "POST", action, e.adTok, `{"grant":{"project":"x"}}`, 400, "There is no such action: grant"},
			{"unknown type", "POST", "/v3/types/00000000-0000-0000-0000-000000000000/action", e.adTok, add, 404, "could not be found"},
		} {
			t.Run(c.name, func(t *testing.T) {
				resp, m := e.do(t, c.method, c.path, c.tok, c.body)
				if resp.StatusCode != c.status || !strings.Contains(mustJSON(t, m), c.msg) {
					t.Errorf("%d %v, want %d with %q", resp.StatusCode, m, c.status, c.msg)
				}
			})
		}
		m = e.want(t, 200, "GET", access, e.adTok, "")
		if got := mustJSON(t, m["volume_type_access"]); got != fmt.Sprintf(`[{"project_id":%q,"volume_type_id":%q}]`, e.demoProj, gold) {
			t.Errorf("access list %s", got)
		}
		if !sees(t) {
			t.Fatal("demo does not see the type it was given")
		}
		v, err := volumes.Create(context.Background(), e.demo, volumes.CreateOpts{Size: 1, VolumeType: gold}, nil).Extract()
		if err != nil {
			t.Fatal(err)
		}
		if v = waitStatus(t, e.demo, v.ID, "available"); v.VolumeType != "gold" {
			t.Errorf("volume type %q", v.VolumeType)
		}

		e.want(t, http.StatusAccepted, "POST", action, e.adTok, remove)
		e.want(t, 404, "POST", action, e.adTok, remove)
		if sees(t) {
			t.Error("demo still sees the type after its access went")
		}
		e.want(t, 404, "POST", "/v3/volumes", e.demoTok, `{"volume":{"size":1,"volume_type":"`+gold+`"}}`)

		// A type deleted with access rows takes them along.
		if err := volumes.Delete(context.Background(), e.demo, v.ID, nil).ExtractErr(); err != nil {
			t.Fatal(err)
		}
		waitGone(t, e.demo, v.ID)
		e.want(t, 202, "POST", action, e.adTok, add)
		e.want(t, 202, "DELETE", "/v3/types/"+gold, e.adTok, "")
		e.want(t, 404, "GET", access, e.adTok, "")
	})
}
