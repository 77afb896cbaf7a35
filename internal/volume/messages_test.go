package volume_test

import (
	"context"
	"strings"
	"testing"

	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/volumes"
)

// TestNoBackendMessage: a volume whose type asks for what the backend
// does not have is made in error, and its owner reads why in a user
// message (3.3+) naming the create's request; a type the backend fits
// makes volumes as usual; messages are their project's, and go when
// deleted.
func TestNoBackendMessage(t *testing.T) {
	e := newEnv(t, "")
	mkType := func(name, specs string) {
		t.Helper()
		e.want(t, 200, "POST", "/v3/types", e.adTok, `{"volume_type":{"name":"`+name+`","extra_specs":`+specs+`}}`)
	}
	mkType("bogus", `{"storage_protocol":"iSCSI","vendor_name":"Acme"}`)
	mkType("fits", `{"storage_protocol":"nbd","vendor_name":"Nimbus","capabilities:volume_backend_name":"network",`+
		`"QoS_support":"<is> True","driver_version":"<or> 0.9 <or> 1.0.0","nimbus:other":"ignored","thin_provisioning_support":"<is> true"}`)

	fits, err := volumes.Create(context.Background(), e.demo, volumes.CreateOpts{Size: 1, VolumeType: "fits"}, nil).Extract()
	if err != nil {
		t.Fatal(err)
	}
	waitStatus(t, e.demo, fits.ID, "available")

	resp, m := e.do(t, "POST", "/v3/volumes", e.demoTok, `{"volume":{"size":1,"volume_type":"bogus"}}`)
	if resp.StatusCode != 202 {
		t.Fatalf("create: %d %v", resp.StatusCode, m)
	}
	bad := m["volume"].(map[string]any)["id"].(string)
	waitStatus(t, e.demo, bad, "error")
	rid := resp.Header.Get("X-Openstack-Request-Id")

	v33 := []string{"OpenStack-API-Version", "volume 3.3"}
	e.want(t, 404, "GET", "/v3/messages", e.demoTok, "")
	list := e.want(t, 200, "GET", "/v3/messages", e.demoTok, "", v33...)["messages"].([]any)
	if len(list) != 1 {
		t.Fatalf("messages %v, want the one about %s", list, bad)
	}
	msg := list[0].(map[string]any)
	for k, want := range map[string]any{"resource_uuid": bad, "resource_type": "VOLUME", "event_id": "VOLUME_VOLUME_001_003",
		"message_level": "ERROR", "request_id": rid,
		"user_message": "schedule allocate volume:Could not find any available weighted backend."} {
		if msg[k] != want {
			t.Errorf("message %s = %v, want %v", k, msg[k], want)
		}
	}
	id := msg["id"].(string)
	if !strings.HasPrefix(mustJSON(t, msg["guaranteed_until"]), `"20`) {
		t.Errorf("guaranteed_until %v", msg["guaranteed_until"])
	}
	e.want(t, 200, "GET", "/v3/messages/"+id, e.demoTok, "", v33...)
	if n := len(e.want(t, 200, "GET", "/v3/messages", e.adTok, "", v33...)["messages"].([]any)); n != 1 {
		t.Errorf("admin lists %d messages", n)
	}
	e.want(t, 204, "DELETE", "/v3/messages/"+id, e.demoTok, "", v33...)
	e.want(t, 404, "GET", "/v3/messages/"+id, e.demoTok, "", v33...)
	e.want(t, 404, "DELETE", "/v3/messages/"+id, e.demoTok, "", v33...)

	// Another project's message is not demo's to see.
	m = e.want(t, 202, "POST", "/v3/volumes", e.adTok, `{"volume":{"size":1,"volume_type":"bogus"}}`)
	waitStatus(t, e.admin, m["volume"].(map[string]any)["id"].(string), "error")
	list = e.want(t, 200, "GET", "/v3/messages", e.adTok, "", v33...)["messages"].([]any)
	if len(list) != 1 {
		t.Fatalf("admin's messages %v", list)
	}
	if n := len(e.want(t, 200, "GET", "/v3/messages", e.demoTok, "", v33...)["messages"].([]any)); n != 0 {
		t.Errorf("demo lists %d messages of admin's", n)
	}
	e.want(t, 404, "GET", "/v3/messages/"+list[0].(map[string]any)["id"].(string), e.demoTok, "", v33...)
}
