package volume_test

import (
	"net/http"
	"testing"
)

// TestExtensions: GET /v3/extensions lists each Cinder extension this
// service serves, Hosts among them (Tempest's test_list_extensions with
// api_extensions = all looks for it), and each listed extension that
// adds a resource answers at its path rather than 404.
func TestExtensions(t *testing.T) {
	e := newEnv(t, "")
	p := "/v3/" + e.adPrj
	got := e.want(t, http.StatusOK, "GET", p+"/extensions", e.adTok, "")
	listed := map[string]bool{}
	names := map[string]bool{}
	for _, x := range got["extensions"].([]any) {
		m := x.(map[string]any)
		alias, name := m["alias"].(string), m["name"].(string)
		if listed[alias] || names[name] {
			t.Errorf("extension %s (%s) listed twice", alias, name)
		}
		listed[alias], names[name] = true, true
	}
	if !names["Hosts"] {
		t.Errorf("Hosts is not listed: %v", got)
	}
	for alias, path := range map[string]string{
		"os-hosts":              "/os-hosts",
		"os-services":           "/os-services",
		"scheduler-stats":       "/scheduler-stats/get_pools",
		"os-quota-class-sets":   "/os-quota-class-sets/default",
		"os-quota-sets":         "/os-quota-sets/" + e.adPrj,
		"backups":               "/backups",
		"qos-specs":             "/qos-specs",
		"os-availability-zone":  "/os-availability-zone",
		"os-volume-transfer":    "/os-volume-transfer",
		"os-types-manage":       "/types",
		"os-volume-type-access": "/types",
	} {
		if !listed[alias] {
			t.Errorf("%s is served at %s but not listed", alias, path)
			continue
		}
		if resp, m := e.do(t, "GET", p+path, e.adTok, ""); resp.StatusCode != http.StatusOK {
			t.Errorf("%s: GET %s answered %d %v", alias, path, resp.StatusCode, m)
		}
	}
}
