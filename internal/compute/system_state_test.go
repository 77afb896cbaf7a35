package compute_test

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"nimbus/internal/testenv"
)

// image makes an image as tok's project through Glance and stores data in
// it; props are extra image properties.
func (e *env) image(tok, visibility, format, data string, props map[string]string) string {
	e.t.Helper()
	body := fmt.Sprintf(`{"name":"img","disk_format":%q,"container_format":"bare","visibility":%q`, format, visibility)
	for k, v := range props {
		body += fmt.Sprintf(",%q:%q", k, v)
	}
	resp, raw := testenv.Do(e.t, e.client, "POST", e.c.ImageURL+"/v2/images", tok, body+"}")
	testenv.MustStatus(e.t, resp, raw, http.StatusCreated)
	var img struct{ ID string }
	if err := json.Unmarshal([]byte(raw), &img); err != nil {
		e.t.Fatal(err)
	}
	id := img.ID
	resp, raw = testenv.Do(e.t, e.client, "PUT", e.c.ImageURL+"/v2/images/"+id+"/file", tok, data,
		"Content-Type", "application/octet-stream")
	testenv.MustStatus(e.t, resp, raw, http.StatusNoContent)
	return id
}

// imageExists says whether image id is still there, as the operator sees.
func (e *env) imageExists(id string) bool {
	e.t.Helper()
	resp, raw := testenv.Do(e.t, e.client, "GET", e.c.ImageURL+"/v2/images/"+id, e.admin, "")
	switch resp.StatusCode {
	case http.StatusOK:
		return true
	case http.StatusNotFound:
		return false
	}
	e.t.Fatalf("GET image %s: %d %s", id, resp.StatusCode, raw)
	return false
}

// TestShelveStateIsNotMetadata is the hardening issue's exploit: shelve's
// bookkeeping used to live in user metadata, so a customer who wrote
// shelved_image_id there made delete remove the provider's catalog image
// and made unshelve boot, then delete, another project's image. Now the
// keys are the customer's own and mean nothing to compute.
func TestShelveStateIsNotMetadata(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		private := e.image(e.admin, "private", "raw", "the operator's data", nil)
		set := func(id, target string) {
			e.must(200, "PUT", "/servers/"+id+"/metadata/shelved_image_id", e.demo, "2.96",
				fmt.Sprintf(`{"meta":{"shelved_image_id":%q}}`, target))
		}

		// Delete with a forged key.
		id := e.create(e.demo, "2.96", "")
		e.wait(id, e.demo, "ACTIVE")
		set(id, e.imageID)
		e.must(204, "DELETE", "/servers/"+id, e.demo, "2.96", "")
		e.waitGone(id, e.demo)
		if !e.imageExists(e.imageID) {
			t.Fatal("deleting a server removed the public catalog image its metadata named")
		}

		// Forge, shelve, unshelve: shelve makes the server's own image and
		// unshelve boots that one, then removes it; the forged one is
		// untouched.
		id = e.create(e.demo, "2.96", "")
		e.wait(id, e.demo, "ACTIVE")
		set(id, private)
		e.action(id, e.demo, "2.96", `{"shelve":null}`, 202)
		sv := e.wait(id, e.demo, "SHELVED_OFFLOADED")
		if meta := sv["metadata"].(map[string]any); len(meta) != 1 {
			t.Errorf("shelve wrote into the customer's metadata: %v", meta)
		}
		var own string
		if err := e.c.DB.QueryRow(t.Context(), "SELECT id FROM images WHERE name = ?", "s1-shelved").Scan(&own); err != nil {
			t.Fatalf("no shelve image of the server's own: %v", err)
		}
		e.action(id, e.demo, "2.96", `{"unshelve":null}`, 202)
		e.wait(id, e.demo, "ACTIVE")
		if !e.imageExists(private) {
			t.Error("unshelve deleted another project's image that the metadata named")
		}
		// The shelve image goes just after the server is ACTIVE again.
		for deadline := time.Now().Add(10 * time.Second); e.imageExists(own); time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Error("unshelve kept the server's own shelve image")
				break
			}
		}
		if got := e.server(id, e.demo, "2.96")["metadata"].(map[string]any)["shelved_image_id"]; got != private {
			t.Errorf("the customer's own metadata key changed to %v", got)
		}
	})
}

// TestBootImagesReadableByProject: an image's kernel_id and ramdisk_id are
// its owner's to write, so they may name another project's private image;
// the server then fails with the reason rather than boot it (issue 16).
func TestBootImagesReadableByProject(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		secret := e.image(e.admin, "private", "raw", "the operator's data", nil)
		kernel := e.image(e.demo, "private", "raw", "a kernel", nil)
		for _, tc := range []struct{ name, prop string }{
			{"ramdisk", "ramdisk_id"},
			{"kernel", "kernel_id"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				e.t = t
				props := map[string]string{"kernel_id": kernel, tc.prop: secret}
				e.imageID = e.image(e.demo, "private", "qcow2", "a disk", props)
				id := e.create(e.demo, "2.96", "")
				sv := e.wait(id, e.demo, "ERROR")
				fault, _ := sv["fault"].(map[string]any)
				if msg, _ := fault["message"].(string); !strings.Contains(msg, tc.prop+" "+secret) {
					t.Errorf("fault %v, want one naming %s %s", fault, tc.prop, secret)
				}
			})
		}
	})
}

// waitGone polls until server id is 404.
func (e *env) waitGone(id, tok string) {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if st, _, _ := e.do("GET", "/servers/"+id, tok, "2.96", ""); st == http.StatusNotFound {
			return
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("server %s not gone after delete", id)
		}
		time.Sleep(15 * time.Millisecond)
	}
}

// TestCreateCountCannotOverflowQuota is the abuse issue's first item: a
// max_count near MaxInt64 once wrapped the quota sum and gave a project
// with a 10-instance quota every pCPU of the fleet.
func TestCreateCountCannotOverflowQuota(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		e.wait(e.create(e.demo, "2.96", ""), e.demo, "ACTIVE")
		body := fmt.Sprintf(`{"server":{"name":"many","imageRef":%q,"flavorRef":%q,"networks":"none","min_count":1,"max_count":9223372036854775807}}`,
			e.imageID, e.flavorID)
		e.must(202, "POST", "/servers", e.demo, "2.37", body)
		l := e.must(200, "GET", "/servers", e.demo, "2.96", "")["servers"].([]any)
		if len(l) != 10 {
			t.Errorf("project has %d servers, want its quota of 10", len(l))
		}
		for _, tc := range []struct {
			body string
			want int
			msg  string
		}{
			{`"min_count":11,"max_count":20000000000`, 403, "Quota exceeded for instances: Requested 11, but already used 10 of 10 instances"},
			{`"min_count":2,"max_count":9223372036854775807`, 403, "Quota exceeded for instances"},
			{`"min_count":201,"max_count":201`, 400, "min_count may be at most 200"},
		} {
			body := fmt.Sprintf(`{"server":{"name":"more","imageRef":%q,"flavorRef":%q,"networks":"none",%s}}`, e.imageID, e.flavorID, tc.body)
			st, m, _ := e.do("POST", "/servers", e.demo, "2.37", body)
			if st != tc.want || !strings.Contains(fmt.Sprint(m), tc.msg) {
				t.Errorf("%s: %d %v, want %d %q", tc.body, st, m, tc.want, tc.msg)
			}
		}
	})
}

// TestClientNumbersBounded: lists a client makes long are refused before
// they become long queries or long transactions.
func TestClientNumbersBounded(t *testing.T) {
	e := newEnv(t, "")
	many := func(n int, item string) string {
		parts := make([]string, n)
		for i := range parts {
			parts[i] = fmt.Sprintf(item, i)
		}
		return strings.Join(parts, ",")
	}
	nets := "[" + many(17, `{"uuid":"00000000-0000-0000-0000-%012d"}`) + "]"
	for _, tc := range []struct {
		name, method, path, body string
		want                     int
	}{
		{"51 tags in a filter", "GET", "/servers?tags=" + many(51, "t%d"), "", 400},
		{"50 tags in a filter", "GET", "/servers?tags-any=" + many(50, "t%d"), "", 200},
		{"11 sort keys", "GET", "/servers?sort_key=display_name" + strings.Repeat("&sort_key=display_name", 10), "", 400},
		{"17 networks", "POST", "/servers", fmt.Sprintf(`{"server":{"name":"n","imageRef":%q,"flavorRef":%q,"networks":%s}}`,
			e.imageID, e.flavorID, nets), 403},
	} {
		if st, m, _ := e.do(tc.method, tc.path, e.demo, "2.96", tc.body); st != tc.want {
			t.Errorf("%s: %d %v, want %d", tc.name, st, m, tc.want)
		}
	}
}

// TestWindowsLicenceFollowsData is the abuse issue's sixth item: the
// Windows licence line once followed the os_type property, which a
// customer drops by re-uploading the public image's data without it, or
// by editing it off a snapshot. It now follows the data and its origin.
func TestWindowsLicenceFollowsData(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := placementEnv(t, dbURL)
		e.flavor("pw", 2, 4096, 40, map[string]string{"hw:cpu_policy": "dedicated", "nimbus:disk_type": "local"})
		var win string
		if err := e.c.DB.QueryRow(t.Context(), "SELECT id FROM images WHERE name = 'Windows Server 2022'").Scan(&win); err != nil {
			t.Fatal(err)
		}
		resp, data := testenv.Do(t, e.client, "GET", e.c.ImageURL+"/v2/images/"+win+"/file", e.demo, "")
		testenv.MustStatus(t, resp, data, http.StatusOK)
		meteredOS := func(image string) string {
			t.Helper()
			id := e.must(202, "POST", "/servers", e.demo, "2.1",
				`{"server":{"name":"w","imageRef":"`+image+`","flavorRef":"pw"}}`)["server"].(map[string]any)["id"].(string)
			e.wait(id, e.demo, "ACTIVE")
			var spec string
			if err := e.c.DB.QueryRow(t.Context(), "SELECT spec FROM metering_periods WHERE resource_id = ? AND ended_at = ''", id).Scan(&spec); err != nil {
				t.Fatal(err)
			}
			var s struct {
				OSType string `json:"os_type"`
			}
			json.Unmarshal([]byte(spec), &s)
			return s.OSType + "@" + id
		}
		osOf := func(image string) string { return strings.Split(meteredOS(image), "@")[0] }

		if got := osOf(win); got != "windows" {
			t.Errorf("the public Windows image meters %q", got)
		}
		reup := e.image(e.demo, "private", "raw", data, nil)
		if got := osOf(reup); got != "windows" {
			t.Errorf("the public Windows data re-uploaded without os_type meters %q", got)
		}
		// A snapshot of a licensed server, its os_type removed.
		sv := strings.Split(meteredOS(win), "@")[1]
		snap := e.action(sv, e.demo, "2.96", `{"createImage":{"name":"snap"}}`, 202)["image_id"].(string)
		deadline := time.Now().Add(10 * time.Second)
		for {
			resp, raw := testenv.Do(t, e.client, "GET", e.c.ImageURL+"/v2/images/"+snap, e.demo, "")
			if strings.Contains(raw, `"status": "active"`) || strings.Contains(raw, `"status":"active"`) || time.Now().After(deadline) {
				testenv.MustStatus(t, resp, raw, http.StatusOK)
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		e.wait(sv, e.demo, "ACTIVE")
		resp, raw := testenv.Do(t, e.client, "PATCH", e.c.ImageURL+"/v2/images/"+snap, e.demo,
			`[{"op":"remove","path":"/os_type"}]`, "Content-Type", "application/openstack-images-v2.1-json-patch")
		testenv.MustStatus(t, resp, raw, http.StatusOK)
		if got := osOf(snap); got != "windows" {
			t.Errorf("a Windows server's snapshot without os_type meters %q", got)
		}
		if got := osOf(e.imageID); got != "" {
			t.Errorf("a Linux image meters %q", got)
		}
	})
}

// TestImageVirtualSizeFitsFlavor: a qcow2's virtual size is its header's,
// which the uploader writes; a tiny image claiming 100 TiB must not get a
// root disk past the flavor's, on create or rebuild.
func TestImageVirtualSizeFitsFlavor(t *testing.T) {
	e := newEnv(t, "")
	header := make([]byte, 512)
	copy(header, "QFI\xfb\x00\x00\x00\x03")
	binary.BigEndian.PutUint64(header[24:], 100<<40)
	huge := e.image(e.demo, "private", "qcow2", string(header), nil)
	body := fmt.Sprintf(`{"server":{"name":"v","imageRef":%q,"flavorRef":%q,"networks":"none"}}`, huge, e.flavorID)
	if st, m, _ := e.do("POST", "/servers", e.demo, "2.96", body); st != 400 || !strings.Contains(fmt.Sprint(m), "Flavor's disk is too small") {
		t.Errorf("create from a 100 TiB image: %d %v", st, m)
	}
	id := e.create(e.demo, "2.96", "")
	e.wait(id, e.demo, "ACTIVE")
	if st, m, _ := e.do("POST", "/servers/"+id+"/action", e.demo, "2.96", fmt.Sprintf(`{"rebuild":{"imageRef":%q}}`, huge)); st != 400 {
		t.Errorf("rebuild to a 100 TiB image: %d %v", st, m)
	}
}
