package volume_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/limits"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/quotasets"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/volumes"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/volumetypes"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/imagedata"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/images"
	"github.com/gophercloud/gophercloud/v2/pagination"

	"nimbus/internal/cloud"
	"nimbus/internal/testenv"
)

// env is a running cloud with block storage clients for demo and admin.
type env struct {
	c               *cloud.Cloud
	http            *http.Client
	demo, admin     *gophercloud.ServiceClient
	demoPC          *gophercloud.ProviderClient
	demoTok, adTok  string
	demoProj, adPrj string
}

func newEnv(t *testing.T, dbURL string, opts ...testenv.Options) *env {
	c := testenv.StartCloud(t, dbURL, opts...)
	e := &env{c: c, http: testenv.HTTPClient(t, c)}
	var err error
	e.demoPC = testenv.Provider(t, c, cloud.DemoUser)
	if e.demo, err = openstack.NewBlockStorageV3(e.demoPC, gophercloud.EndpointOpts{Region: "RegionOne"}); err != nil {
		t.Fatal(err)
	}
	if e.admin, err = openstack.NewBlockStorageV3(testenv.Provider(t, c, cloud.AdminUser), gophercloud.EndpointOpts{Region: "RegionOne"}); err != nil {
		t.Fatal(err)
	}
	e.demoTok, e.adTok = testenv.Token(t, c, cloud.DemoUser), testenv.Token(t, c, cloud.AdminUser)
	e.demoProj = e.project(t, e.demoTok)
	e.adPrj = e.project(t, e.adTok)
	return e
}

// project is the project of a token, from the limits call's view of it.
func (e *env) project(t *testing.T, tok string) string {
	caller, err := e.c.Identity.Validate(context.Background(), tok)
	if err != nil {
		t.Fatal(err)
	}
	return caller.ProjectID
}

// do sends a raw request to the volume service and decodes a JSON answer.
func (e *env) do(t *testing.T, method, path, tok, body string, hdr ...string) (*http.Response, map[string]any) {
	t.Helper()
	resp, raw := testenv.Do(t, e.http, method, strings.TrimSuffix(e.c.VolumeURL, "/v3")+path, tok, body, hdr...)
	var m map[string]any
	if raw != "" {
		if err := json.Unmarshal([]byte(raw), &m); err != nil {
			t.Fatalf("%s %s: body is not JSON: %s", method, path, raw)
		}
	}
	return resp, m
}

func (e *env) want(t *testing.T, status int, method, path, tok, body string, hdr ...string) map[string]any {
	t.Helper()
	resp, m := e.do(t, method, path, tok, body, hdr...)
	if resp.StatusCode != status {
		t.Fatalf("%s %s: status %d, want %d; body %v", method, path, resp.StatusCode, status, m)
	}
	return m
}

func waitStatus(t *testing.T, sc *gophercloud.ServiceClient, id, status string) *volumes.Volume {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := volumes.WaitForStatus(ctx, sc, id, status); err != nil {
		v, _ := volumes.Get(context.Background(), sc, id).Extract()
		t.Fatalf("volume %s did not become %s: %v (now %+v)", id, status, err, v)
	}
	v, err := volumes.Get(context.Background(), sc, id).Extract()
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func waitGone(t *testing.T, sc *gophercloud.ServiceClient, id string) {
	t.Helper()
	for i := 0; i < 300; i++ {
		_, err := volumes.Get(context.Background(), sc, id).Extract()
		if gophercloud.ResponseCodeIs(err, http.StatusNotFound) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("volume %s was not deleted", id)
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

func TestVolumes(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		t.Run("Discovery", e.testDiscovery)
		t.Run("Lifecycle", e.testLifecycle)
		t.Run("ListAndPaging", e.testList)
		t.Run("Errors", e.testErrors)
		t.Run("Types", e.testTypes)
		t.Run("Quotas", e.testQuotas)
		t.Run("FromImage", e.testFromImage)
	})
}

func (e *env) testDiscovery(t *testing.T) {
	m := e.want(t, http.StatusMultipleChoices, "GET", "/", "", "")
	v := m["versions"].([]any)[0].(map[string]any)
	if v["id"] != "v3.0" || v["min_version"] != "3.0" || v["version"] != "3.60" || v["status"] != "CURRENT" {
		t.Errorf("root version: %v", v)
	}
	m = e.want(t, 200, "GET", "/v3/", "", "")
	if len(m["versions"].([]any)) != 1 {
		t.Errorf("/v3/: %v", m)
	}
	// The microversion is echoed; out of range is 406, malformed 400.
	resp, _ := e.do(t, "GET", "/v3/types", e.demoTok, "", "OpenStack-API-Version", "volume 3.27")
	if resp.StatusCode != 200 || resp.Header.Get("OpenStack-API-Version") != "volume 3.27" {
		t.Errorf("echo: %d %q", resp.StatusCode, resp.Header.Get("OpenStack-API-Version"))
	}
	e.want(t, http.StatusNotAcceptable, "GET", "/v3/types", e.demoTok, "", "OpenStack-API-Version", "volume 3.99")
	e.want(t, http.StatusBadRequest, "GET", "/v3/types", e.demoTok, "", "OpenStack-API-Version", "volume 3.x")
	resp, _ = e.do(t, "GET", "/v3/types", e.demoTok, "", "OpenStack-API-Version", "volume latest")
	if resp.Header.Get("OpenStack-API-Version") != "volume 3.60" {
		t.Errorf("latest: %q", resp.Header.Get("OpenStack-API-Version"))
	}
	// Cinder's URL with the project id works as the one without, and
	// links repeat it; another project's id is refused.
	m = e.want(t, 200, "GET", "/v3/"+e.demoProj+"/types/default", e.demoTok, "")
	if m["volume_type"].(map[string]any)["name"] != "network" {
		t.Errorf("default type: %v", m)
	}
	e.want(t, 400, "GET", "/v3/"+e.adPrj+"/volumes", e.demoTok, "")
	e.want(t, 401, "GET", "/v3/volumes", "", "")
}

func (e *env) testLifecycle(t *testing.T) {
	ctx := context.Background()
	v, err := volumes.Create(ctx, e.demo, volumes.CreateOpts{Size: 1, Name: "data", Description: "first",
		Metadata: map[string]string{"purpose": "test"}}, nil).Extract()
	if err != nil {
		t.Fatal(err)
	}
	if v.Status != "creating" && v.Status != "available" {
		t.Errorf("created in status %s", v.Status)
	}
	if v.Size != 1 || v.Name != "data" || v.VolumeType != "network" || v.AvailabilityZone != "nova" || v.Bootable != "false" ||
		v.Metadata["purpose"] != "test" || v.TenantID != "" || v.CreatedAt.IsZero() {
		t.Errorf("created: %+v", v)
	}
	v = waitStatus(t, e.demo, v.ID, "available")
	path := e.c.Volumes.DataPath(v.ID)
	if got := fileSize(t, path); got != 1<<30 {
		t.Errorf("data file is %d bytes, want 1 GiB", got)
	}

	name, desc := "data2", "second"
	v, err = volumes.Update(ctx, e.demo, v.ID, volumes.UpdateOpts{Name: &name, Description: &desc}).Extract()
	if err != nil || v.Name != "data2" || v.Description != "second" {
		t.Fatalf("update: %+v %v", v, err)
	}

	// Metadata sub-resource.
	m := e.want(t, 200, "POST", "/v3/"+e.demoProj+"/volumes/"+v.ID+"/metadata", e.demoTok, `{"metadata":{"a":"1"}}`)
	if md := m["metadata"].(map[string]any); md["a"] != "1" || md["purpose"] != "test" {
		t.Errorf("metadata merge: %v", m)
	}
	e.want(t, 200, "PUT", "/v3/volumes/"+v.ID+"/metadata/a", e.demoTok, `{"meta":{"a":"2"}}`)
	m = e.want(t, 200, "GET", "/v3/volumes/"+v.ID+"/metadata/a", e.demoTok, "")
	if m["meta"].(map[string]any)["a"] != "2" {
		t.Errorf("meta item: %v", m)
	}
	e.want(t, 400, "PUT", "/v3/volumes/"+v.ID+"/metadata/a", e.demoTok, `{"meta":{"b":"2"}}`)
	e.want(t, 200, "DELETE", "/v3/volumes/"+v.ID+"/metadata/a", e.demoTok, "")
	e.want(t, 404, "DELETE", "/v3/volumes/"+v.ID+"/metadata/a", e.demoTok, "")

	// Extend: larger only, then the file grows.
	err = volumes.ExtendSize(ctx, e.demo, v.ID, volumes.ExtendSizeOpts{NewSize: 1}).ExtractErr()
	if !gophercloud.ResponseCodeIs(err, http.StatusBadRequest) {
		t.Errorf("extend to the same size: %v", err)
	}
	if err := volumes.ExtendSize(ctx, e.demo, v.ID, volumes.ExtendSizeOpts{NewSize: 3}).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	v = waitStatus(t, e.demo, v.ID, "available")
	if v.Size != 3 || fileSize(t, path) != 3<<30 {
		t.Errorf("after extend: size %d, file %d", v.Size, fileSize(t, path))
	}

	// Bootable flag, and admin-only reset.
	if err := volumes.SetBootable(ctx, e.demo, v.ID, volumes.BootableOpts{Bootable: true}).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	if v, _ = volumes.Get(ctx, e.demo, v.ID).Extract(); v.Bootable != "true" {
		t.Errorf("bootable %q", v.Bootable)
	}
	err = volumes.ResetStatus(ctx, e.demo, v.ID, volumes.ResetStatusOpts{Status: "error"}).ExtractErr()
	if !gophercloud.ResponseCodeIs(err, http.StatusForbidden) {
		t.Errorf("member reset-status: %v", err)
	}
	if err := volumes.ResetStatus(ctx, e.admin, v.ID, volumes.ResetStatusOpts{Status: "error"}).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	// An error volume can be extended by no one but deleted.
	err = volumes.ExtendSize(ctx, e.demo, v.ID, volumes.ExtendSizeOpts{NewSize: 4}).ExtractErr()
	if !gophercloud.ResponseCodeIs(err, http.StatusBadRequest) {
		t.Errorf("extend in error: %v", err)
	}
	if err := volumes.Delete(ctx, e.demo, v.ID, volumes.DeleteOpts{}).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	waitGone(t, e.demo, v.ID)
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("data file left after delete: %v", err)
	}
}

func (e *env) testList(t *testing.T) {
	ctx := context.Background()
	var ids []string
	for _, n := range []string{"l1", "l2", "l3"} {
		v, err := volumes.Create(ctx, e.demo, volumes.CreateOpts{Size: 1, Name: n}, nil).Extract()
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, v.ID)
	}
	for _, id := range ids {
		waitStatus(t, e.demo, id, "available")
	}
	// gophercloud follows volumes_links page by page.
	pages := 0
	var names []string
	err := volumes.List(e.demo, volumes.ListOpts{Limit: 2, Sort: "name:asc"}).EachPage(ctx, func(_ context.Context, p pagination.Page) (bool, error) {
		pages++
		vs, err := volumes.ExtractVolumes(p)
		for _, v := range vs {
			names = append(names, v.Name)
		}
		return true, err
	})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(names, ",") != "l1,l2,l3" || pages != 2 {
		t.Errorf("paged list: %v in %d pages", names, pages)
	}
	all, err := volumes.List(e.demo, volumes.ListOpts{Name: "l2"}).AllPages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if vs, _ := volumes.ExtractVolumes(all); len(vs) != 1 || vs[0].ID != ids[1] {
		t.Errorf("name filter: %+v", vs)
	}
	// Another project's volumes: invisible to demo, listed for admin
	// with all_tenants only.
	m := e.want(t, 200, "GET", "/v3/volumes", e.adTok, "")
	if len(m["volumes"].([]any)) != 0 {
		t.Errorf("admin's own list: %v", m)
	}
	m = e.want(t, 200, "GET", "/v3/volumes/detail?all_tenants=1&project_id="+e.demoProj, e.adTok, "", "OpenStack-API-Version", "volume 3.60")
	if vs := m["volumes"].([]any); len(vs) != 3 || vs[0].(map[string]any)["os-vol-host-attr:host"] == nil ||
		vs[0].(map[string]any)["os-vol-tenant-attr:tenant_id"] != e.demoProj || vs[0].(map[string]any)["shared_targets"] != false {
		t.Errorf("all_tenants list: %v", m)
	}
	// The owner sees the project (volume_tenant_attribute is admin or
	// owner) but not the host attribute: Cinder shows that to admins only.
	m = e.want(t, 200, "GET", "/v3/volumes/detail", e.demoTok, "", "OpenStack-API-Version", "volume 3.60")
	for _, v := range m["volumes"].([]any) {
		if v.(map[string]any)["os-vol-tenant-attr:tenant_id"] != e.demoProj {
			t.Errorf("owner's view without its project: %v", v)
		}
		for _, k := range []string{"os-vol-host-attr:host", "migration_status"} {
			if _, ok := v.(map[string]any)[k]; ok {
				t.Errorf("customer sees %s: %v", k, v)
			}
		}
	}
	m = e.want(t, 200, "GET", "/v3/volumes/detail?with_count=true&limit=1", e.demoTok, "", "OpenStack-API-Version", "volume 3.45")
	if m["count"] != float64(3) || len(m["volumes"].([]any)) != 1 || m["volumes_links"] == nil {
		t.Errorf("with_count: %v", m)
	}
	e.want(t, 404, "GET", "/v3/volumes/detail?marker=nope", e.demoTok, "")
	e.want(t, 400, "GET", "/v3/volumes/detail?sort=bogus", e.demoTok, "")
	m = e.want(t, 200, "GET", "/v3/volumes/summary", e.demoTok, "", "OpenStack-API-Version", "volume 3.36")
	if s := m["volume-summary"].(map[string]any); s["total_count"] != float64(3) || s["total_size"] != float64(3) {
		t.Errorf("summary: %v", m)
	}
	for _, id := range ids {
		if err := volumes.Delete(ctx, e.demo, id, volumes.DeleteOpts{}).ExtractErr(); err != nil {
			t.Fatal(err)
		}
		waitGone(t, e.demo, id)
	}
}

func (e *env) testErrors(t *testing.T) {
	const id = "6a1b6a2a-3d3e-4b7e-9e43-5c4d4f8f0a11"
	m := e.want(t, 404, "GET", "/v3/volumes/"+id, e.demoTok, "")
	if nf := m["itemNotFound"].(map[string]any); nf["message"] != "Volume "+id+" could not be found." || nf["code"] != float64(404) {
		t.Errorf("not found: %v", m)
	}
	e.want(t, 404, "GET", "/v3/volumes/not-a-uuid", e.demoTok, "")
	e.want(t, 404, "DELETE", "/v3/volumes/"+id, e.demoTok, "")
	for _, tt := range []struct{ name, body string }{
		{"no volume", `{}`},
		{"no size", `{"volume":{"name":"x"}}`},
		{"zero size", `{"volume":{"size":0}}`},
		{"bad size", `{"volume":{"size":"ten"}}`},
		{"fraction", `{"volume":{"size":1.5}}`},
		{"bad zone", `{"volume":{"size":1,"availability_zone":"mars"}}`},
		{"bad metadata", `{"volume":{"size":1,"metadata":{"a":1}}}`},
		{"unknown image", `{"volume":{"size":1,"imageRef":"` + id + `"}}`},
		{"malformed", `{"volume":`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m := e.want(t, 400, "POST", "/v3/volumes", e.demoTok, tt.body)
			if _, ok := m["badRequest"]; !ok {
				t.Errorf("body %v", m)
			}
		})
	}
	m = e.want(t, 404, "POST", "/v3/volumes", e.demoTok, `{"volume":{"size":1,"volume_type":"nope"}}`)
	if m["itemNotFound"].(map[string]any)["message"] != "Volume type with name nope could not be found." {
		t.Errorf("unknown type: %v", m)
	}
	e.want(t, 400, "POST", "/v3/volumes", e.demoTok, `{"volume":{"size":1,"bogus":1}}`, "OpenStack-API-Version", "volume 3.53")
	// Deleting while creating is refused as Cinder does.
	m = e.want(t, 202, "POST", "/v3/volumes", e.demoTok, `{"volume":{"size":1}}`)
	vid := m["volume"].(map[string]any)["id"].(string)
	waitStatus(t, e.demo, vid, "available")
	e.want(t, 400, "POST", "/v3/volumes/"+vid+"/action", e.demoTok, `{"os-bogus":{}}`)
	e.want(t, 400, "POST", "/v3/volumes/"+vid+"/action", e.demoTok, `{"os-extend":{"new_size":"x"}}`)
	e.want(t, 202, "DELETE", "/v3/volumes/"+vid, e.demoTok, "")
	waitGone(t, e.demo, vid)
}

func (e *env) testTypes(t *testing.T) {
	ctx := context.Background()
	all, err := volumetypes.List(e.demo, volumetypes.ListOpts{}).AllPages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ts, _ := volumetypes.ExtractVolumeTypes(all)
	if len(ts) != 1 || ts[0].Name != "network" || !ts[0].IsPublic || len(ts[0].ExtraSpecs) != 0 {
		t.Errorf("member's types: %+v", ts)
	}
	adm, err := volumetypes.Get(ctx, e.admin, ts[0].ID).Extract()
	if err != nil || adm.ExtraSpecs["volume_backend_name"] != "network" {
		t.Errorf("admin's view: %+v %v", adm, err)
	}
	_, err = volumetypes.Create(ctx, e.demo, volumetypes.CreateOpts{Name: "fast"}).Extract()
	if !gophercloud.ResponseCodeIs(err, http.StatusForbidden) {
		t.Errorf("member create type: %v", err)
	}
	pub := false
	fast, err := volumetypes.Create(ctx, e.admin, volumetypes.CreateOpts{Name: "fast", IsPublic: &pub,
		ExtraSpecs: map[string]string{"volume_backend_name": "network"}}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := volumetypes.Create(ctx, e.admin, volumetypes.CreateOpts{Name: "fast"}).Extract(); !gophercloud.ResponseCodeIs(err, http.StatusConflict) {
		t.Errorf("duplicate type: %v", err)
	}
	// A private type is the admin's only.
	if _, err := volumetypes.Get(ctx, e.demo, fast.ID).Extract(); !gophercloud.ResponseCodeIs(err, http.StatusNotFound) {
		t.Errorf("member sees private type: %v", err)
	}
	v, err := volumes.Create(ctx, e.admin, volumes.CreateOpts{Size: 1, VolumeType: "fast"}, nil).Extract()
	if err != nil || v.VolumeType != "fast" {
		t.Fatalf("create with type: %+v %v", v, err)
	}
	waitStatus(t, e.admin, v.ID, "available")
	if _, err := volumes.Get(ctx, e.demo, v.ID).Extract(); !gophercloud.ResponseCodeIs(err, http.StatusNotFound) {
		t.Errorf("member sees admin's volume: %v", err)
	}
	if err := volumetypes.Delete(ctx, e.admin, fast.ID).ExtractErr(); !gophercloud.ResponseCodeIs(err, http.StatusBadRequest) {
		t.Errorf("delete type in use: %v", err)
	}
	if err := volumes.Delete(ctx, e.admin, v.ID, volumes.DeleteOpts{}).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	waitGone(t, e.admin, v.ID)
	if err := volumetypes.Delete(ctx, e.admin, fast.ID).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	if err := volumetypes.Delete(ctx, e.admin, ts[0].ID).ExtractErr(); !gophercloud.ResponseCodeIs(err, http.StatusBadRequest) {
		t.Errorf("delete default type: %v", err)
	}
}

func (e *env) testQuotas(t *testing.T) {
	ctx := context.Background()
	q, err := quotasets.Get(ctx, e.demo, e.demoProj).Extract()
	if err != nil || q.Volumes != 10 || q.Gigabytes != 1000 {
		t.Fatalf("default quota: %+v %v", q, err)
	}
	if _, err := quotasets.Update(ctx, e.demo, e.demoProj, quotasets.UpdateOpts{Gigabytes: gophercloud.IntToPointer(5)}).Extract(); !gophercloud.ResponseCodeIs(err, http.StatusForbidden) {
		t.Errorf("member updates quota: %v", err)
	}
	if _, err := quotasets.Update(ctx, e.admin, e.demoProj, quotasets.UpdateOpts{Gigabytes: gophercloud.IntToPointer(5),
		Volumes: gophercloud.IntToPointer(2)}).Extract(); err != nil {
		t.Fatal(err)
	}
	v, err := volumes.Create(ctx, e.demo, volumes.CreateOpts{Size: 4}, nil).Extract()
	if err != nil {
		t.Fatal(err)
	}
	m := e.want(t, 413, "POST", "/v3/volumes", e.demoTok, `{"volume":{"size":2}}`)
	if m["overLimit"].(map[string]any)["message"] != "Requested volume or snapshot exceeds allowed gigabytes quota. Requested 2G, quota is 5G and 4G has been consumed." {
		t.Errorf("gigabytes over quota: %v", m)
	}
	waitStatus(t, e.demo, v.ID, "available")
	if err := volumes.ExtendSize(ctx, e.demo, v.ID, volumes.ExtendSizeOpts{NewSize: 6}).ExtractErr(); !gophercloud.ResponseCodeIs(err, http.StatusRequestEntityTooLarge) {
		t.Errorf("extend over quota: %v", err)
	}
	w, err := volumes.Create(ctx, e.demo, volumes.CreateOpts{Size: 1}, nil).Extract()
	if err != nil {
		t.Fatal(err)
	}
	m = e.want(t, 413, "POST", "/v3/volumes", e.demoTok, `{"volume":{"size":"1"}}`)
	if m["overLimit"].(map[string]any)["message"] != "Maximum number of volumes allowed (2) exceeded for quota 'volumes'." {
		t.Errorf("volumes over quota: %v", m)
	}
	l, err := limits.Get(ctx, e.demo).Extract()
	if err != nil || l.Absolute.MaxTotalVolumes != 2 || l.Absolute.MaxTotalVolumeGigabytes != 5 ||
		l.Absolute.TotalVolumesUsed != 2 || l.Absolute.TotalGigabytesUsed != 5 {
		t.Errorf("limits: %+v %v", l, err)
	}
	u, err := quotasets.GetUsage(ctx, e.demo, e.demoProj).Extract()
	if err != nil || u.Gigabytes.InUse != 5 || u.Gigabytes.Limit != 5 || u.Volumes.InUse != 2 {
		t.Errorf("usage: %+v %v", u, err)
	}
	// Lowering a limit below usage is refused; delete restores defaults.
	if _, err := quotasets.Update(ctx, e.admin, e.demoProj, quotasets.UpdateOpts{Gigabytes: gophercloud.IntToPointer(1)}).Extract(); !gophercloud.ResponseCodeIs(err, http.StatusBadRequest) {
		t.Errorf("limit below usage: %v", err)
	}
	if err := quotasets.Delete(ctx, e.admin, e.demoProj).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	d, err := quotasets.GetDefaults(ctx, e.demo, e.demoProj).Extract()
	if err != nil || d.Gigabytes != 1000 {
		t.Errorf("defaults: %+v %v", d, err)
	}
	for _, id := range []string{v.ID, w.ID} {
		waitStatus(t, e.demo, id, "available")
		if err := volumes.Delete(ctx, e.demo, id, volumes.DeleteOpts{}).ExtractErr(); err != nil {
			t.Fatal(err)
		}
		waitGone(t, e.demo, id)
	}
}

func (e *env) testFromImage(t *testing.T) {
	if _, err := exec.LookPath("qemu-img"); err != nil {
		t.Skip("no qemu-img")
	}
	ctx := context.Background()
	ic, err := openstack.NewImageV2(e.demoPC, gophercloud.EndpointOpts{Region: "RegionOne"})
	if err != nil {
		t.Fatal(err)
	}
	im, err := images.Create(ctx, ic, images.CreateOpts{Name: "disk", DiskFormat: "raw", ContainerFormat: "bare"}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	payload := bytes.Repeat([]byte("nimbus-volume-data!"), 60000) // ~1.1 MB
	if err := imagedata.Upload(ctx, ic, im.ID, bytes.NewReader(payload)).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	v, err := volumes.Create(ctx, e.demo, volumes.CreateOpts{Size: 1, Name: "boot", ImageID: im.ID}, nil).Extract()
	if err != nil {
		t.Fatal(err)
	}
	v = waitStatus(t, e.demo, v.ID, "available")
	if v.Bootable != "true" || v.VolumeImageMetadata["image_id"] != im.ID || v.VolumeImageMetadata["disk_format"] != "raw" {
		t.Errorf("image volume: %+v", v)
	}
	path := e.c.Volumes.DataPath(v.ID)
	if fileSize(t, path) != 1<<30 {
		t.Errorf("file size %d", fileSize(t, path))
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	head := make([]byte, len(payload)+16)
	_, err = f.ReadAt(head, 0)
	f.Close()
	if err != nil || !bytes.Equal(head[:len(payload)], payload) || !bytes.Equal(head[len(payload):], make([]byte, 16)) {
		t.Errorf("volume data differs from the image's (%v)", err)
	}
	if err := volumes.Delete(ctx, e.demo, v.ID, volumes.DeleteOpts{}).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	waitGone(t, e.demo, v.ID)

	// A qcow2 whose backing file is a file of the controller's (here a
	// secret beside the database) must not be copied into the volume.
	dir := t.TempDir()
	secret := filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, bytes.Repeat([]byte("controller secret "), 1000), 0o600); err != nil {
		t.Fatal(err)
	}
	evil := filepath.Join(dir, "evil.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", secret, evil).CombinedOutput(); err != nil {
		t.Fatalf("qemu-img create: %v: %s", err, out)
	}
	data, err := os.ReadFile(evil)
	if err != nil {
		t.Fatal(err)
	}
	im, err = images.Create(ctx, ic, images.CreateOpts{Name: "evil", DiskFormat: "qcow2", ContainerFormat: "bare"}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	if err := imagedata.Upload(ctx, ic, im.ID, bytes.NewReader(data)).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	v, err = volumes.Create(ctx, e.demo, volumes.CreateOpts{Size: 1, Name: "evil", ImageID: im.ID}, nil).Extract()
	if err != nil {
		t.Fatal(err)
	}
	waitStatus(t, e.demo, v.ID, "error")
	if b, err := os.ReadFile(e.c.Volumes.DataPath(v.ID)); err == nil && bytes.Contains(b, []byte("controller secret")) {
		t.Error("a backing file of the controller's was copied into a customer's volume")
	}
}
