package compute_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"nimbus/internal/testenv"
)

// TestServerFieldsCreateRebuildAgree sends each bad field that both create
// and rebuild accept to both and wants the same 400: one table validates
// both bodies, so they cannot drift apart.
func TestServerFieldsCreateRebuildAgree(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		id := e.create(e.demo, "2.96", "")
		e.wait(id, e.demo, "ACTIVE")
		long := func(n int) string { return strings.Repeat("a", n) }
		cases := []struct {
			mv, field, value, want string
		}{
			{"2.96", "name", `""`, "Invalid input for field/attribute name. Value: . '' does not match"},
			{"2.96", "name", `5`, "Invalid input for field/attribute name. Value: 5. 5 is not of type 'string'"},
			{"2.96", "adminPass", `5`, "Value: 5. 5 is not of type 'string'"},
			{"2.96", "adminPass", `null`, "Invalid input for field/attribute adminPass. Value: None. None is not of type 'string'"},
			{"2.96", "imageRef", `"not-a-uuid"`, "Value: not-a-uuid. 'not-a-uuid' is not a 'uuid'"},
			{"2.96", "metadata", `"x"`, `Value: "x". "x" is not of type 'object'`},
			{"2.96", "metadata", `{"k":5}`, "Invalid input for field/attribute k. Value: 5. 5 is not of type 'string'"},
			{"2.96", "OS-DCF:diskConfig", `"BAD"`, "'BAD' is not one of ['AUTO', 'MANUAL']"},
			{"2.96", "accessIPv4", `"nope"`, "'nope' is not a 'ipv4'"},
			{"2.96", "accessIPv6", `"nope"`, "'nope' is not a 'ipv6'"},
			{"2.96", "description", `"` + long(256) + `"`, "is too long"},
			{"2.96", "user_data", `"` + long(65536) + `"`, "Invalid input for field/attribute user_data. Value: aaaaaaaaaaaaaaaaaaaa... is too long"},
			{"2.96", "user_data", `"!!!"`, "User data needs to be valid base 64."},
			{"2.96", "key_name", `""`, `Invalid input for field/attribute key_name. Value: "". is not valid`},
			{"2.96", "key_name", `"` + long(256) + `"`, "is not valid"},
			{"2.96", "hostname", `"bad_host!"`, "does not match the hostname format"},
			{"2.96", "bogus", `1`, "Additional properties are not allowed ('bogus' was unexpected)"},
			{"2.96", "personality", `[]`, "Additional properties are not allowed ('personality' was unexpected)"},
			{"2.89", "hostname", `"h"`, "Additional properties are not allowed ('hostname' was unexpected)"},
			{"2.18", "description", `"d"`, "Additional properties are not allowed ('description' was unexpected)"},
			{"2.62", "trusted_image_certificates", `[]`, "Additional properties are not allowed ('trusted_image_certificates' was unexpected)"},
		}
		// Fields one operation has and the other has not, or has at
		// other microversions.
		oneSided := []struct {
			mv, field, value, wantCreate, wantRebuild string
		}{
			{"2.96", "preserve_ephemeral", `"maybe"`, "('preserve_ephemeral' was unexpected)", "Value: \"maybe\". is not a boolean"},
			{"2.53", "key_name", `""`, "Value: \"\". is not valid", "('key_name' was unexpected)"},
			{"2.56", "user_data", `"!!!"`, "User data needs to be valid base 64.", "('user_data' was unexpected)"},
			{"2.96", "tags", `["a"]`, "", "('tags' was unexpected)"},
		}
		for _, tc := range oneSided {
			create := fmt.Sprintf(`{"server":%s}`, withField(map[string]string{
				"name": `"s"`, "imageRef": fmt.Sprintf("%q", e.imageID), "flavorRef": `"2"`, "networks": `"none"`}, tc.field, tc.value))
			rebuild := fmt.Sprintf(`{"rebuild":%s}`, withField(map[string]string{
				"imageRef": fmt.Sprintf("%q", e.imageID)}, tc.field, tc.value))
			if tc.wantCreate != "" {
				if st, msg := e.badRequest("/servers", tc.mv, create); st != 400 || !strings.Contains(msg, tc.wantCreate) {
					t.Errorf("create %s %s=%s: %d %q, want 400 with %q", tc.mv, tc.field, tc.value, st, msg, tc.wantCreate)
				}
			}
			if st, msg := e.badRequest("/servers/"+id+"/action", tc.mv, rebuild); st != 400 || !strings.Contains(msg, tc.wantRebuild) {
				t.Errorf("rebuild %s %s=%s: %d %q, want 400 with %q", tc.mv, tc.field, tc.value, st, msg, tc.wantRebuild)
			}
		}
		for _, tc := range cases {
			create := fmt.Sprintf(`{"server":%s}`, withField(map[string]string{
				"name": `"s"`, "imageRef": fmt.Sprintf("%q", e.imageID), "flavorRef": `"2"`, "networks": `"none"`}, tc.field, tc.value))
			rebuild := fmt.Sprintf(`{"rebuild":%s}`, withField(map[string]string{
				"imageRef": fmt.Sprintf("%q", e.imageID)}, tc.field, tc.value))
			cst, cmsg := e.badRequest("/servers", tc.mv, create)
			rst, rmsg := e.badRequest("/servers/"+id+"/action", tc.mv, rebuild)
			if cst != 400 || rst != 400 || cmsg != rmsg || !strings.Contains(cmsg, tc.want) {
				t.Errorf("%s %s=%.40s:\n create  %d %.200q\n rebuild %d %.200q\n want 400 with %.200q in both",
					tc.mv, tc.field, tc.value, cst, cmsg, rst, rmsg, tc.want)
			}
		}
	})
}

// TestServerImageFitsFlavorCreateRebuild: an image that needs more memory
// or disk than the flavor has is refused with Nova's message on create and
// on rebuild alike (nova/exception.py FlavorMemoryTooSmall,
// FlavorDiskSmallerThanMinDisk).
func TestServerImageFitsFlavorCreateRebuild(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		id := e.create(e.demo, "2.96", "")
		e.wait(id, e.demo, "ACTIVE")
		fl := e.must(200, "GET", "/flavors/2", e.demo, "", "")["flavor"].(map[string]any)
		ram, disk := int(fl["ram"].(float64)), int(fl["disk"].(float64))
		if disk == 0 {
			t.Fatal("flavor 2 has no root disk: min_disk is not checked")
		}
		cases := []struct {
			name            string
			minRAM, minDisk int
			want            string
		}{
			{"min_ram", ram + 1, 0, "Flavor's memory is too small for requested image."},
			{"min_ram and min_disk", ram + 1, disk + 1, "Flavor's memory is too small for requested image."},
			{"min_disk", 0, disk + 1, fmt.Sprintf("Flavor's disk is smaller than the minimum size specified in image metadata. "+
				"Flavor disk is %d bytes, minimum size is %d bytes.", int64(disk)<<30, int64(disk+1)<<30)},
		}
		for _, tc := range cases {
			img := e.imageNeeding(tc.minRAM, tc.minDisk)
			create := fmt.Sprintf(`{"server":{"name":"s","imageRef":%q,"flavorRef":"2","networks":"none"}}`, img)
			cst, cmsg := e.badRequest("/servers", "2.96", create)
			rst, rmsg := e.badRequest("/servers/"+id+"/action", "2.96", fmt.Sprintf(`{"rebuild":{"imageRef":%q}}`, img))
			if cst != 400 || rst != 400 || cmsg != tc.want || rmsg != tc.want {
				t.Errorf("%s:\n create  %d %q\n rebuild %d %q\n want 400 %q", tc.name, cst, cmsg, rst, rmsg, tc.want)
			}
		}
	})
}

// TestServerDescriptionNull: a null description is no description, on
// create and on rebuild (Nova's description is string or null).
func TestServerDescriptionNull(t *testing.T) {
	e := newEnv(t, "")
	id := e.create(e.demo, "2.96", `,"description":null`)
	if d, ok := e.server(id, e.demo, "2.96")["description"]; !ok || d != nil {
		t.Errorf("create with a null description shows %#v", d)
	}
	e.wait(id, e.demo, "ACTIVE")
	e.action(id, e.demo, "2.96", fmt.Sprintf(`{"rebuild":{"imageRef":%q,"description":"d"}}`, e.imageID), 202)
	e.wait(id, e.demo, "ACTIVE")
	e.action(id, e.demo, "2.96", fmt.Sprintf(`{"rebuild":{"imageRef":%q,"description":null}}`, e.imageID), 202)
	if d, ok := e.server(id, e.demo, "2.96")["description"]; !ok || d != nil {
		t.Errorf("rebuild with a null description shows %#v", d)
	}
}

// withField is obj as JSON with field set to the JSON value.
func withField(obj map[string]string, field, value string) string {
	obj[field] = value
	parts := make([]string, 0, len(obj))
	for k, v := range obj {
		parts = append(parts, fmt.Sprintf("%q:%s", k, v))
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// badRequest posts body as demo and returns the status and badRequest's
// message.
func (e *env) badRequest(path, mv, body string) (int, string) {
	e.t.Helper()
	st, m, _ := e.do("POST", path, e.demo, mv, body)
	br, _ := m["badRequest"].(map[string]any)
	msg, _ := br["message"].(string)
	return st, msg
}

// imageNeeding is an active image of the demo project with min_ram (MiB)
// and min_disk (GiB).
func (e *env) imageNeeding(minRAM, minDisk int) string {
	e.t.Helper()
	body := fmt.Sprintf(`{"name":"needy","disk_format":"raw","container_format":"bare","min_ram":%d,"min_disk":%d}`, minRAM, minDisk)
	resp, raw := testenv.Do(e.t, e.client, "POST", e.c.ImageURL+"/v2/images", e.demo, body)
	testenv.MustStatus(e.t, resp, raw, http.StatusCreated)
	var img struct{ ID string }
	if err := json.Unmarshal([]byte(raw), &img); err != nil {
		e.t.Fatal(err)
	}
	resp, raw = testenv.Do(e.t, e.client, "PUT", e.c.ImageURL+"/v2/images/"+img.ID+"/file", e.demo, "data",
		"Content-Type", "application/octet-stream")
	testenv.MustStatus(e.t, resp, raw, http.StatusNoContent)
	return img.ID
}
