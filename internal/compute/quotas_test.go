package compute_test

import (
	"context"
	"testing"

	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/quotasets"

	"nimbus/internal/cloud"
	"nimbus/internal/testenv"
)

var (
	quotaCore   = []string{"id", "instances", "cores", "ram", "metadata_items", "key_pairs", "server_groups", "server_group_members"}
	quotaFiles  = []string{"injected_files", "injected_file_content_bytes", "injected_file_path_bytes"}
	quotaLegacy = []string{"fixed_ips", "floating_ips", "security_groups", "security_group_rules"}
)

func TestQuotaSets(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := rsStart(t, dbURL)
		ctx := context.Background()
		demoProject, _ := e.c.Identity.ProjectByName(ctx, cloud.DemoProject)
		adminProject, _ := e.c.Identity.ProjectByName(ctx, cloud.AdminProject)
		path := "/os-quota-sets/" + demoProject.ID

		cat := func(parts ...[]string) []string {
			var out []string
			for _, p := range parts {
				out = append(out, p...)
			}
			return out
		}
		for mv, want := range map[string][]string{
			"":     cat(quotaCore, quotaFiles, quotaLegacy),
			"2.36": cat(quotaCore, quotaFiles),
			"2.57": quotaCore,
		} {
			q := rsObj(e.must(200, "GET", path, e.demo, mv, ""), "quota_set")
			rsWantKeys(t, "quota_set at "+mv, q, want...)
			if q["id"] != demoProject.ID || q["instances"] != float64(10) || q["cores"] != float64(20) || q["ram"] != float64(51200) {
				t.Errorf("defaults at %s: %v", mv, q)
			}
			rsWantKeys(t, "defaults at "+mv, rsObj(e.must(200, "GET", path+"/defaults", e.demo, mv, ""), "quota_set"), want...)
		}
		d := rsObj(e.must(200, "GET", path+"/detail", e.demo, "2.57", ""), "quota_set")
		rsWantKeys(t, "detail instances", d["instances"], "in_use", "limit", "reserved")

		e.fault(403, "os_compute_api:os-quota-sets:show", "GET", "/os-quota-sets/"+adminProject.ID, e.demo, "", "")
		e.must(200, "GET", "/os-quota-sets/"+adminProject.ID+"/defaults", e.demo, "", "")
		e.fault(400, "Project ID nope is not a valid project.", "GET", "/os-quota-sets/nope", e.admin, "", "")
		e.fault(403, "os_compute_api:os-quota-sets:update", "PUT", path, e.demo, "", `{"quota_set":{"instances":50}}`)
		e.fault(403, "os_compute_api:os-quota-sets:delete", "DELETE", path, e.demo, "", "")

		admin := testenv.Compute(t, testenv.Provider(t, e.c, cloud.AdminUser), "")
		five, big := 5, -1
		qs, err := quotasets.Update(ctx, admin, demoProject.ID, quotasets.UpdateOpts{Instances: &five, Cores: &big}).Extract()
		if err != nil || qs.Instances != 5 || qs.Cores != -1 || qs.RAM != 51200 {
			t.Fatalf("update: %+v %v", qs, err)
		}
		up := rsObj(e.must(200, "PUT", path, e.admin, "2.57", `{"quota_set":{"ram":"1024","force":true}}`), "quota_set")
		rsWantKeys(t, "update answer at 2.57", up, quotaCore[1:]...)
		demo := testenv.Compute(t, testenv.Provider(t, e.c, cloud.DemoUser), "")
		got, err := quotasets.Get(ctx, demo, demoProject.ID).Extract()
		if err != nil || got.Instances != 5 || got.RAM != 1024 || got.Cores != -1 {
			t.Fatalf("get: %+v %v", got, err)
		}
		det, err := quotasets.GetDetail(ctx, demo, demoProject.ID).Extract()
		if err != nil || det.Instances.Limit != 5 || det.Instances.InUse != 0 {
			t.Fatalf("detail: %+v %v", det, err)
		}
		for _, b := range []struct{ mv, body, msg string }{
			{"", `{"quota_set":{"instances":-2}}`, "less than the minimum of -1"},
			{"", `{"quota_set":{"instances":"many"}}`, "is not of type"},
			{"2.57", `{"quota_set":{"injected_files":1}}`, "Additional properties"},
			{"2.36", `{"quota_set":{"floating_ips":1}}`, "Additional properties"},
			{"", `{"quota_set":{"bogus":1}}`, "Additional properties"},
			{"", `{"quota_set":{"force":"perhaps"}}`, "force"},
			{"", `{"quota":{}}`, "required property"},
		} {
			e.fault(400, b.msg, "PUT", path, e.admin, b.mv, b.body)
		}
		e.fault(400, "Project ID nope is not a valid project.", "PUT", "/os-quota-sets/nope", e.admin, "", `{"quota_set":{"instances":1}}`)
		e.must(200, "PUT", path, e.admin, "", `{"quota_set":{"floating_ips":3}}`)

		if err := quotasets.Delete(ctx, admin, demoProject.ID).Err; err != nil {
			t.Fatal(err)
		}
		if got, _ := quotasets.Get(ctx, demo, demoProject.ID).Extract(); got.Instances != 10 || got.RAM != 51200 {
			t.Errorf("after delete: %+v", got)
		}
	})
}
