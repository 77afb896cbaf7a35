package volume_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/volumes"
)

// TestBackendInventory: the admin's os-hosts, pools and capabilities name
// the one backend as volumes show their host, count what it holds, and are
// an admin's only.
func TestBackendInventory(t *testing.T) {
	e := newEnv(t, "")
	v, err := volumes.Create(context.Background(), e.demo, volumes.CreateOpts{Size: 2}, nil).Extract()
	if err != nil {
		t.Fatal(err)
	}
	waitStatus(t, e.demo, v.ID, "available")
	host := e.want(t, 200, "GET", "/v3/volumes/"+v.ID, e.adTok, "")["volume"].(map[string]any)["os-vol-host-attr:host"].(string)

	pools := e.want(t, 200, "GET", "/v3/scheduler-stats/get_pools", e.adTok, "")["pools"].([]any)
	if len(pools) != 1 || mustJSON(t, pools[0]) != fmt.Sprintf(`{"name":%q}`, host) {
		t.Errorf("pools %v, want one named %s", pools, host)
	}
	pools = e.want(t, 200, "GET", "/v3/scheduler-stats/get_pools?detail=true", e.adTok, "")["pools"].([]any)
	caps := pools[0].(map[string]any)["capabilities"].(map[string]any)
	if caps["allocated_capacity_gb"] != 2.0 || caps["storage_protocol"] != "nbd" || caps["volume_backend_name"] != "network" {
		t.Errorf("pool capabilities %v", caps)
	}
	if total, ok := caps["total_capacity_gb"].(float64); !ok || total <= 0 {
		t.Errorf("total_capacity_gb %v", caps["total_capacity_gb"])
	}
	backend, _, _ := strings.Cut(host, "#")
	for _, h := range []string{backend, host} {
		c := e.want(t, 200, "GET", "/v3/capabilities/"+h, e.adTok, "")
		for _, k := range []string{"vendor_name", "volume_backend_name", "storage_protocol"} {
			if c[k] != caps[k] {
				t.Errorf("capabilities/%s %s = %v, the pool says %v", h, k, c[k], caps[k])
			}
		}
	}

	hosts := e.want(t, 200, "GET", "/v3/os-hosts", e.adTok, "")["hosts"].([]any)
	volumeHost := false
	for _, h := range hosts {
		h := h.(map[string]any)
		volumeHost = volumeHost || (h["host_name"] == backend && h["service"] == "cinder-volume" && h["service-state"] == "enabled")
	}
	if len(hosts) < 2 || !volumeHost {
		t.Errorf("hosts %v, want cinder-volume on %s among them", hosts, backend)
	}
	res := e.want(t, 200, "GET", "/v3/os-hosts/"+backend, e.adTok, "")["host"].([]any)
	want := fmt.Sprintf(`[{"resource":{"host":%q,"project":"(total)","snapshot_count":"0","total_snapshot_gb":"0","total_volume_gb":"2","volume_count":"1"}},`+
		`{"resource":{"host":%[1]q,"project":%q,"snapshot_count":"0","total_snapshot_gb":"0","total_volume_gb":"2","volume_count":"1"}}]`, backend, e.demoProj)
	if got := mustJSON(t, res); got != want {
		t.Errorf("host %s:\n got %s\nwant %s", backend, got, want)
	}

	for _, c := range []struct {
		path   string
		tok    string
		status int
	}{
		{"/v3/os-hosts/nowhere@x", e.adTok, 404},
		{"/v3/capabilities/nowhere@x", e.adTok, 404},
		{"/v3/os-hosts", e.demoTok, 403},
		{"/v3/os-hosts/" + backend, e.demoTok, 403},
		{"/v3/scheduler-stats/get_pools", e.demoTok, 403},
		{"/v3/capabilities/" + backend, e.demoTok, 403},
	} {
		e.want(t, c.status, "GET", c.path, c.tok, "")
	}
}

// TestQuotaClass: the default quota class's limits are every project's
// defaults (and limits, under a project's own), per type too; only the
// default class exists, and only an admin changes it.
func TestQuotaClass(t *testing.T) {
	e := newEnv(t, "")
	m := e.want(t, 200, "GET", "/v3/os-quota-class-sets/default", e.adTok, "")["quota_class_set"].(map[string]any)
	if m["id"] != "default" || m["volumes"] != 10.0 || m["volumes_network"] != -1.0 {
		t.Fatalf("default class %v", m)
	}
	m = e.want(t, 200, "PUT", "/v3/os-quota-class-sets/default", e.adTok, `{"quota_class_set":{"volumes":1,"gigabytes_network":"7"}}`)["quota_class_set"].(map[string]any)
	if m["volumes"] != 1.0 || m["gigabytes_network"] != 7.0 || m["id"] != nil {
		t.Errorf("update answered %v", m)
	}
	for _, path := range []string{"/v3/os-quota-sets/" + e.demoProj + "/defaults", "/v3/os-quota-sets/" + e.demoProj} {
		q := e.want(t, 200, "GET", path, e.demoTok, "")["quota_set"].(map[string]any)
		if q["volumes"] != 1.0 || q["gigabytes_network"] != 7.0 {
			t.Errorf("%s: %v", path, q)
		}
	}
	// The class limits a project, and a project's own limit wins.
	e.want(t, 202, "POST", "/v3/volumes", e.demoTok, `{"volume":{"size":1}}`)
	e.want(t, 413, "POST", "/v3/volumes", e.demoTok, `{"volume":{"size":1}}`)
	e.want(t, 200, "PUT", "/v3/os-quota-sets/"+e.demoProj, e.adTok, `{"quota_set":{"volumes":3}}`)
	e.want(t, 202, "POST", "/v3/volumes", e.demoTok, `{"volume":{"size":1}}`)

	for _, c := range []struct {
		method, path, tok, body string
		status                  int
	}{
		{"GET", "/v3/os-quota-class-sets/gold", e.adTok, "", 404},
		{"PUT", "/v3/os-quota-class-sets/default", e.adTok, `{"quota_class_set":{"volumes":-2}}`, 400},
		{"PUT", "/v3/os-quota-class-sets/default", e.adTok, `{"quota_class_set":{"nonsense":1}}`, 400},
		{"PUT", "/v3/os-quota-class-sets/default", e.adTok, `{"quota_class_set":{"volumes":"x"}}`, 400},
		{"PUT", "/v3/os-quota-class-sets/default", e.demoTok, `{"quota_class_set":{"volumes":100}}`, 403},
		{"GET", "/v3/os-quota-class-sets/default", e.demoTok, "", 403},
	} {
		e.want(t, c.status, c.method, c.path, c.tok, c.body)
	}
	if m := e.want(t, 200, "GET", "/v3/os-quota-class-sets/default", e.adTok, "")["quota_class_set"].(map[string]any); m["volumes"] != 1.0 {
		t.Errorf("a refused update changed the class: %v", m)
	}
}
