package image_test

import (
	"bytes"
	"context"
	"crypto/md5"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/imagedata"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/images"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/members"
	"github.com/gophercloud/gophercloud/v2/pagination"

	"nimbus/internal/cloud"
	"nimbus/internal/image"
	"nimbus/internal/imagecatalog"
	"nimbus/internal/store"
	"nimbus/internal/testenv"
)

const patchCT = "application/openstack-images-v2.1-json-patch"

type env struct {
	c                  *cloud.Cloud
	http               *http.Client
	demoTok, adminTok  string
	demo, admin        *gophercloud.ServiceClient
	demoProj, adminPrj string
}

func newEnv(t *testing.T, dbURL string) *env {
	t.Helper()
	c := testenv.StartCloud(t, dbURL)
	e := &env{c: c, http: testenv.HTTPClient(t, c),
		demoTok: testenv.Token(t, c, cloud.DemoUser), adminTok: testenv.Token(t, c, cloud.AdminUser)}
	for _, u := range []string{cloud.DemoUser, cloud.AdminUser} {
		sc, err := openstack.NewImageV2(testenv.Provider(t, c, u), gophercloud.EndpointOpts{Region: "RegionOne"})
		if err != nil {
			t.Fatal(err)
		}
		if u == cloud.DemoUser {
			e.demo = sc
		} else {
			e.admin = sc
		}
	}
	ctx := context.Background()
	dp, err := c.Identity.ProjectByName(ctx, cloud.DemoProject)
	if err != nil {
		t.Fatal(err)
	}
	ap, err := c.Identity.ProjectByName(ctx, cloud.AdminProject)
	if err != nil {
		t.Fatal(err)
	}
	e.demoProj, e.adminPrj = dp.ID, ap.ID
	return e
}

// do sends a raw request to the image service and returns status and body.
func (e *env) do(t *testing.T, method, path, tok, body string, hdr ...string) (*http.Response, string) {
	t.Helper()
	return testenv.Do(t, e.http, method, e.c.ImageURL+path, tok, body, hdr...)
}

func (e *env) want(t *testing.T, status int, method, path, tok, body string, hdr ...string) map[string]any {
	t.Helper()
	resp, b := e.do(t, method, path, tok, body, hdr...)
	testenv.MustStatus(t, resp, b, status)
	var m map[string]any
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") && b != "" {
		if err := json.Unmarshal([]byte(b), &m); err != nil {
			t.Fatalf("%s %s: bad JSON %q: %v", method, path, b, err)
		}
	}
	return m
}

func (e *env) create(t *testing.T, tok, body string) map[string]any {
	t.Helper()
	return e.want(t, http.StatusCreated, "POST", "/v2/images", tok, body)
}

func TestImageService(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		t.Run("discovery", func(t *testing.T) { testDiscovery(t, e) })
		t.Run("catalog", func(t *testing.T) { testCatalog(t, e) })
		t.Run("roundtrip", func(t *testing.T) { testRoundTrip(t, e) })
		t.Run("list", func(t *testing.T) { testList(t, e) })
		t.Run("patch", func(t *testing.T) { testPatch(t, e) })
		t.Run("isolation", func(t *testing.T) { testIsolation(t, e) })
		t.Run("protected", func(t *testing.T) { testProtected(t, e) })
		t.Run("members", func(t *testing.T) { testMembers(t, e) })
		t.Run("deactivate", func(t *testing.T) { testDeactivate(t, e) })
		t.Run("badInput", func(t *testing.T) { testBadInput(t, e) })
		t.Run("contract", func(t *testing.T) { testContract(t, e) })
	})
}

func testDiscovery(t *testing.T, e *env) {
	for _, tc := range []struct {
		path   string
		status int
	}{{"/", 300}, {"/versions", 200}} {
		m := e.want(t, tc.status, "GET", tc.path, "", "")
		vs, _ := m["versions"].([]any)
		if len(vs) == 0 {
			t.Fatalf("%s: no versions: %v", tc.path, m)
		}
		first := vs[0].(map[string]any)
		href := first["links"].([]any)[0].(map[string]any)["href"].(string)
		if first["status"] != "CURRENT" || !strings.HasPrefix(first["id"].(string), "v2.") || !strings.HasSuffix(href, "/v2/") {
			t.Errorf("%s: first version %v", tc.path, first)
		}
	}
	resp, b := e.do(t, "GET", "/v2/images", "", "")
	testenv.MustStatus(t, resp, b, http.StatusUnauthorized)
	e.want(t, 200, "GET", "/v2/schemas/image", e.demoTok, "")
	e.want(t, 200, "GET", "/v2/schemas/images", e.demoTok, "")
	e.want(t, 200, "GET", "/v2/schemas/member", e.demoTok, "")
	e.want(t, 200, "GET", "/v2/schemas/members", e.demoTok, "")
}

func testCatalog(t *testing.T, e *env) {
	ctx := context.Background()
	var all []images.Image
	err := images.List(e.demo, images.ListOpts{Visibility: images.ImageVisibilityPublic}).EachPage(ctx, func(_ context.Context, p pagination.Page) (bool, error) {
		imgs, err := images.ExtractImages(p)
		all = append(all, imgs...)
		return true, err
	})
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]images.Image{}
	for _, im := range all {
		byName[im.Name] = im
	}
	for _, ci := range imagecatalog.Images {
		im, ok := byName[ci.Name]
		if !ok {
			t.Fatalf("catalog image %q not listed", ci.Name)
		}
		if im.ID != imagecatalog.ID(ci.Name) || im.Status != images.ImageStatusActive || im.Visibility != images.ImageVisibilityPublic {
			t.Errorf("%s: id %s status %s visibility %s", ci.Name, im.ID, im.Status, im.Visibility)
		}
		for _, k := range []string{"os_type", "os_distro", "os_version", "login_protocol", "login_user"} {
			if im.Properties[k] == nil || im.Properties[k] == "" {
				t.Errorf("%s: property %s missing", ci.Name, k)
			}
		}
		if im.Properties["nimbus_placeholder"] != "true" {
			t.Errorf("%s: nimbus_placeholder = %v", ci.Name, im.Properties["nimbus_placeholder"])
		}
		if (ci.MarketplaceOf != "") != (im.Properties["nimbus_marketplace"] == "true") {
			t.Errorf("%s: nimbus_marketplace = %v", ci.Name, im.Properties["nimbus_marketplace"])
		}
	}
	win := byName["Windows Server 2022"]
	if win.MinDiskGigabytes != 40 || win.Properties["login_protocol"] != "rdp" || win.Properties["os_type"] != "windows" {
		t.Errorf("windows image: %+v", win)
	}
	ub := byName["Ubuntu 24.04"]
	r := imagedata.Download(ctx, e.demo, ub.ID)
	rc, err := r.Extract()
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(rc)
	rc.Close()
	sum := md5.Sum(data)
	if len(data) != 1<<20 || hex.EncodeToString(sum[:]) != ub.Checksum || r.Header.Get("Content-MD5") != ub.Checksum {
		t.Errorf("placeholder data: %d bytes, md5 %x, image checksum %s, Content-MD5 %s", len(data), sum, ub.Checksum, r.Header.Get("Content-MD5"))
	}
}

func testRoundTrip(t *testing.T, e *env) {
	ctx := context.Background()
	im, err := images.Create(ctx, e.demo, images.CreateOpts{
		Name: "roundtrip", DiskFormat: "qcow2", ContainerFormat: "bare", MinDisk: 1,
		Tags: []string{"t1"}, Properties: map[string]string{"purpose": "test"},
	}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	if im.Status != images.ImageStatusQueued || im.Visibility != images.ImageVisibilityShared || im.Owner != e.demoProj || im.Properties["purpose"] != "test" {
		t.Fatalf("created: %+v", im)
	}
	// Raw: a queued image has null size and checksum and no data.
	m := e.want(t, 200, "GET", "/v2/images/"+im.ID, e.demoTok, "")
	if m["size"] != nil || m["checksum"] != nil || m["self"] != "/v2/images/"+im.ID || m["schema"] != "/v2/schemas/image" {
		t.Errorf("queued image body: %v", m)
	}
	e.want(t, http.StatusNoContent, "GET", "/v2/images/"+im.ID+"/file", e.demoTok, "")

	// A qcow2 header with a 5 GiB virtual size, then some payload.
	payload := make([]byte, 300000)
	copy(payload, "QFI\xfb")
	payload[24+3] = 1
	payload[24+4] = 0x40 // 0x0000000140000000 = 5 GiB
	for i := 512; i < len(payload); i++ {
		payload[i] = byte(i * 7)
	}
	if err := imagedata.Upload(ctx, e.demo, im.ID, bytes.NewReader(payload)).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	got, err := images.Get(ctx, e.demo, im.ID).Extract()
	if err != nil {
		t.Fatal(err)
	}
	sum := md5.Sum(payload)
	if got.Status != images.ImageStatusActive || got.SizeBytes != int64(len(payload)) || got.Checksum != hex.EncodeToString(sum[:]) ||
		got.VirtualSize != 5<<30 {
		t.Fatalf("after upload: status %s size %d checksum %s virtual %d", got.Status, got.SizeBytes, got.Checksum, got.VirtualSize)
	}
	m = e.want(t, 200, "GET", "/v2/images/"+im.ID, e.demoTok, "")
	if m["os_hash_algo"] != "sha512" || len(m["os_hash_value"].(string)) != 128 {
		t.Errorf("hash: %v %v", m["os_hash_algo"], m["os_hash_value"])
	}
	rc, err := imagedata.Download(ctx, e.demo, im.ID).Extract()
	if err != nil {
		t.Fatal(err)
	}
	back, _ := io.ReadAll(rc)
	rc.Close()
	if !bytes.Equal(back, payload) {
		t.Fatalf("download differs: %d bytes", len(back))
	}
	// Byte ranges are served as 206.
	for _, tc := range []struct {
		rng    string
		status int
		want   []byte
	}{
		{"bytes=0-3", 206, payload[:4]},
		{"bytes=299990-", 206, payload[299990:]},
		{"bytes=-5", 206, payload[len(payload)-5:]},
		{"bytes=400000-", 416, nil},
		{"lines=1-2", 416, nil},
	} {
		resp, b := e.do(t, "GET", "/v2/images/"+im.ID+"/file", e.demoTok, "", "Range", tc.rng)
		if resp.StatusCode != tc.status || (tc.want != nil && b != string(tc.want)) {
			t.Errorf("Range %s: %d with %d bytes", tc.rng, resp.StatusCode, len(b))
		}
	}
	// A second upload to an active image conflicts.
	resp, b := e.do(t, "PUT", "/v2/images/"+im.ID+"/file", e.demoTok, "again", "Content-Type", "application/octet-stream")
	testenv.MustStatus(t, resp, b, http.StatusConflict)
	// No temporary files are left behind.
	left, _ := filepath.Glob(filepath.Join(e.c.Config.DataDir, "images", ".upload-*"))
	if len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}
	// An upload cut short by the client leaves the image queued and no file.
	cut := e.create(t, e.demoTok, `{"name":"cut","disk_format":"raw","container_format":"bare"}`)["id"].(string)
	e.abortedUpload(t, cut)
	if m := e.want(t, 200, "GET", "/v2/images/"+cut, e.demoTok, ""); m["status"] != "queued" || m["size"] != nil {
		t.Errorf("after aborted upload: status %v size %v", m["status"], m["size"])
	}
	if files, _ := filepath.Glob(filepath.Join(e.c.Config.DataDir, "images", "*"+cut+"*")); len(files) != 0 {
		t.Errorf("files after aborted upload: %v", files)
	}
	if _, err := os.Stat(filepath.Join(e.c.Config.DataDir, "images", ".upload-"+cut)); err == nil {
		t.Errorf("temporary file left")
	}
	e.want(t, 204, "PUT", "/v2/images/"+cut+"/file", e.demoTok, "whole", "Content-Type", "application/octet-stream")
	// An upload before the formats are set is refused and leaves it queued.
	noFmt := e.create(t, e.demoTok, `{"name":"noformat"}`)
	id := noFmt["id"].(string)
	resp, b = e.do(t, "PUT", "/v2/images/"+id+"/file", e.demoTok, "data", "Content-Type", "application/octet-stream")
	testenv.MustStatus(t, resp, b, http.StatusBadRequest)
	if m := e.want(t, 200, "GET", "/v2/images/"+id, e.demoTok, ""); m["status"] != "queued" {
		t.Errorf("status after refused upload: %v", m["status"])
	}
}

// abortedUpload starts an upload that promises more bytes than it sends,
// runs each of during while the image is saving, and hangs up, then waits
// until the server has given up on it.
func (e *env) abortedUpload(t *testing.T, id string, during ...func()) {
	t.Helper()
	u, err := url.Parse(e.c.ImageURL)
	if err != nil {
		t.Fatal(err)
	}
	cfg := e.http.Transport.(*http.Transport).TLSClientConfig.Clone()
	conn, err := tls.Dial("tcp", u.Host, cfg)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "PUT /v2/images/%s/file HTTP/1.1\r\nHost: %s\r\nX-Auth-Token: %s\r\n"+
		"Content-Type: application/octet-stream\r\nContent-Length: 100000\r\n\r\npartial data", id, u.Host, e.demoTok)
	waitStatus := func(want string) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if m := e.want(t, 200, "GET", "/v2/images/"+id, e.demoTok, ""); m["status"] == want {
				return
			}
		}
		t.Fatalf("image %s never reached %s", id, want)
	}
	waitStatus("saving")
	for _, f := range during {
		f()
	}
	conn.Close()
	waitStatus("queued")
}

func testList(t *testing.T, e *env) {
	ctx := context.Background()
	tag := "list-" + strings.ReplaceAll(t.Name(), "/", "-")
	want := map[string]bool{}
	for _, n := range []string{"l-c", "l-a", "l-e", "l-b", "l-d"} {
		m := e.create(t, e.demoTok, `{"name":"`+n+`","disk_format":"raw","container_format":"bare","tags":["`+tag+`"],"flavour":"x"}`)
		want[m["id"].(string)] = true
	}
	// gophercloud follows next links to the end, two at a time.
	var names []string
	seen := map[string]bool{}
	pages := 0
	err := images.List(e.demo, images.ListOpts{Tags: []string{tag}, Limit: 2, SortKey: "name", SortDir: "asc"}).EachPage(ctx,
		func(_ context.Context, p pagination.Page) (bool, error) {
			pages++
			imgs, err := images.ExtractImages(p)
			for _, im := range imgs {
				if seen[im.ID] {
					t.Errorf("image %s listed twice", im.ID)
				}
				seen[im.ID] = true
				names = append(names, im.Name)
			}
			return true, err
		})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(names, ",") != "l-a,l-b,l-c,l-d,l-e" || pages < 3 {
		t.Fatalf("paged names %v over %d pages", names, pages)
	}
	for id := range want {
		if !seen[id] {
			t.Errorf("image %s not listed", id)
		}
	}

	count := func(query, tok string) int {
		t.Helper()
		m := e.want(t, 200, "GET", "/v2/images?"+query, tok, "")
		return len(m["images"].([]any))
	}
	for _, tc := range []struct {
		query string
		want  int
	}{
		{"tag=" + tag, 5},
		{"tag=" + tag + "&name=l-c", 1},
		{"tag=" + tag + "&name=in:l-a,l-b", 2},
		{"tag=" + tag + "&status=queued", 5},
		{"tag=" + tag + "&status=active", 0},
		{"tag=" + tag + "&flavour=x", 5},
		{"tag=" + tag + "&flavour=y", 0},
		{"tag=" + tag + "&tag=other", 0},
		{"tag=" + tag + "&visibility=shared", 5},
		{"tag=" + tag + "&visibility=private", 0},
		{"tag=" + tag + "&owner=" + e.demoProj, 5},
		{"tag=" + tag + "&disk_format=qcow2", 0},
		{"tag=" + tag + "&protected=false", 5},
		{"sort=name:asc,created_at:desc&tag=" + tag, 5},
		{"os_distro=ubuntu&visibility=public", 4},
		{"os_distro=windows&size_min=1048576&size_max=1048576", 2},
		{"os_distro=windows&size_min=1048577", 0},
	} {
		if got := count(tc.query, e.demoTok); got != tc.want {
			t.Errorf("?%s: %d images, want %d", tc.query, got, tc.want)
		}
	}
	// next and first links keep the filters; the last page has no next.
	m := e.want(t, 200, "GET", "/v2/images?tag="+tag+"&limit=3", e.demoTok, "")
	next, _ := m["next"].(string)
	if !strings.Contains(next, "marker=") || !strings.Contains(next, "tag="+tag) || !strings.HasPrefix(m["first"].(string), "/v2/images?") {
		t.Fatalf("links: first %v next %v", m["first"], m["next"])
	}
	m = e.want(t, 200, "GET", next, e.demoTok, "")
	if len(m["images"].([]any)) != 2 || m["next"] != nil {
		t.Errorf("last page: %d images, next %v", len(m["images"].([]any)), m["next"])
	}
	// Hidden images are left out unless asked for.
	id := e.create(t, e.demoTok, `{"name":"hidden","os_hidden":true,"tags":["`+tag+`"]}`)["id"].(string)
	if count("tag="+tag, e.demoTok) != 5 || count("tag="+tag+"&os_hidden=true", e.demoTok) != 1 {
		t.Errorf("os_hidden filtering wrong")
	}
	e.want(t, 200, "GET", "/v2/images/"+id, e.demoTok, "")
}

func testPatch(t *testing.T, e *env) {
	ctx := context.Background()
	id := e.create(t, e.demoTok, `{"name":"p","disk_format":"raw","container_format":"bare"}`)["id"].(string)
	im, err := images.Update(ctx, e.demo, id, images.UpdateOpts{
		images.ReplaceImageName{NewName: "renamed"},
		images.ReplaceImageMinDisk{NewMinDisk: 3},
		images.ReplaceImageTags{NewTags: []string{"a", "b"}},
		images.UpdateImageProperty{Op: images.AddOp, Name: "color", Value: "blue"},
	}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	if im.Name != "renamed" || im.MinDiskGigabytes != 3 || len(im.Tags) != 2 || im.Properties["color"] != "blue" {
		t.Fatalf("after patch: %+v", im)
	}
	path := "/v2/images/" + id
	for _, tc := range []struct {
		body   string
		ct     string
		status int
		check  func(m map[string]any) bool
	}{
		{`[{"op":"replace","path":"/color","value":"red"}]`, patchCT, 200, func(m map[string]any) bool { return m["color"] == "red" }},
		{`[{"op":"remove","path":"/color"}]`, patchCT, 200, func(m map[string]any) bool { _, ok := m["color"]; return !ok }},
		{`[{"op":"replace","path":"/color","value":"red"}]`, patchCT, 409, nil},
		{`[{"op":"remove","path":"/color"}]`, patchCT, 409, nil},
		{`[{"op":"add","path":"/name","value":null}]`, patchCT, 200, func(m map[string]any) bool { return m["name"] == nil }},
		{`[{"op":"replace","path":"/os_hidden","value":true},{"op":"replace","path":"/min_ram","value":256}]`, patchCT, 200,
			func(m map[string]any) bool { return m["os_hidden"] == true && m["min_ram"] == float64(256) }},
		{`[{"op":"replace","path":"/visibility","value":"private"}]`, patchCT, 200, func(m map[string]any) bool { return m["visibility"] == "private" }},
		{`[{"op":"replace","path":"/visibility","value":"community"}]`, patchCT, 200, func(m map[string]any) bool { return m["visibility"] == "community" }},
		{`[{"replace":"/disk_format","value":"qcow2"}]`, "application/openstack-images-v2.0-json-patch", 200,
			func(m map[string]any) bool { return m["disk_format"] == "qcow2" }},
		{`[{"op":"replace","path":"/visibility","value":"public"}]`, patchCT, 403, nil},
		{`[{"op":"replace","path":"/status","value":"active"}]`, patchCT, 403, nil},
		{`[{"op":"replace","path":"/checksum","value":"x"}]`, patchCT, 403, nil},
		{`[{"op":"add","path":"/id","value":"x"}]`, patchCT, 403, nil},
		{`[{"op":"remove","path":"/name"}]`, patchCT, 403, nil},
		{`[{"op":"replace","path":"/owner","value":"someone"}]`, patchCT, 403, nil},
		{`[{"op":"add","path":"/os_glance_x","value":"x"}]`, patchCT, 403, nil},
		{`[{"op":"replace","path":"/min_ram","value":"lots"}]`, patchCT, 400, nil},
		{`[{"op":"replace","path":"/visibility","value":"everyone"}]`, patchCT, 400, nil},
		{`[{"op":"add","path":"/color","value":5}]`, patchCT, 400, nil},
		{`[{"op":"move","path":"/name","value":"x"}]`, patchCT, 400, nil},
		{`[{"op":"add","path":"name","value":"x"}]`, patchCT, 400, nil},
		{`[{"op":"add","path":"/a/b","value":"x"}]`, patchCT, 400, nil},
		{`[{"op":"add","path":"/name"}]`, patchCT, 400, nil},
		{`{"op":"add"}`, patchCT, 400, nil},
		{`[{"op":`, patchCT, 400, nil},
		{`[{"op":"replace","path":"/name","value":"x"}]`, "application/json", 415, nil},
	} {
		resp, b := e.do(t, "PATCH", path, e.demoTok, tc.body, "Content-Type", tc.ct)
		if resp.StatusCode != tc.status {
			t.Errorf("PATCH %s (%s): %d, want %d: %s", tc.body, tc.ct, resp.StatusCode, tc.status, b)
			continue
		}
		if tc.status == 403 && strings.Contains(tc.body, "/status") && !strings.Contains(b, "Attribute 'status' is read-only.") {
			t.Errorf("read-only message: %s", b)
		}
		if tc.status == 415 && resp.Header.Get("Accept-Patch") == "" {
			t.Errorf("415 without Accept-Patch")
		}
		if tc.check != nil {
			var m map[string]any
			json.Unmarshal([]byte(b), &m)
			if !tc.check(m) {
				t.Errorf("PATCH %s: body %s", tc.body, b)
			}
		}
	}
	// Formats are fixed once the image has data.
	e.want(t, 204, "PUT", path+"/file", e.demoTok, "data", "Content-Type", "application/octet-stream")
	e.want(t, 403, "PATCH", path, e.demoTok, `[{"op":"replace","path":"/disk_format","value":"raw"}]`, "Content-Type", patchCT)
	// Admin may publicize and change the owner.
	m := e.want(t, 200, "PATCH", path, e.adminTok, `[{"op":"replace","path":"/visibility","value":"public"}]`, "Content-Type", patchCT)
	if m["visibility"] != "public" {
		t.Errorf("admin publicize: %v", m["visibility"])
	}
	// Tags sub-resource.
	e.want(t, 204, "PUT", path+"/tags/extra", e.demoTok, "")
	e.want(t, 204, "PUT", path+"/tags/extra", e.demoTok, "")
	m = e.want(t, 200, "GET", path, e.demoTok, "")
	if tags := m["tags"].([]any); len(tags) != 3 {
		t.Errorf("tags %v", tags)
	}
	e.want(t, 204, "DELETE", path+"/tags/extra", e.demoTok, "")
	e.want(t, 404, "DELETE", path+"/tags/extra", e.demoTok, "")
	e.want(t, 204, "DELETE", path, e.demoTok, "")
}

func testIsolation(t *testing.T, e *env) {
	ctx := context.Background()
	adminImg := e.create(t, e.adminTok, `{"name":"admin-private","visibility":"private","disk_format":"raw","container_format":"bare"}`)
	id := adminImg["id"].(string)
	e.want(t, 204, "PUT", "/v2/images/"+id+"/file", e.adminTok, "secret", "Content-Type", "application/octet-stream")
	for _, tc := range []struct{ method, path, body, ct string }{
		{"GET", "/v2/images/" + id, "", ""},
		{"GET", "/v2/images/" + id + "/file", "", ""},
		{"PATCH", "/v2/images/" + id, `[{"op":"replace","path":"/name","value":"x"}]`, patchCT},
		{"DELETE", "/v2/images/" + id, "", ""},
		{"PUT", "/v2/images/" + id + "/tags/x", "", ""},
		{"GET", "/v2/images/" + id + "/members", "", ""},
		{"POST", "/v2/images/" + id + "/actions/deactivate", "", ""},
	} {
		var hdr []string
		if tc.ct != "" {
			hdr = []string{"Content-Type", tc.ct}
		}
		resp, b := e.do(t, tc.method, tc.path, e.demoTok, tc.body, hdr...)
		if resp.StatusCode != 404 {
			t.Errorf("demo %s %s: %d, want 404: %s", tc.method, tc.path, resp.StatusCode, b)
		}
	}
	_, err := images.Get(ctx, e.demo, id).Extract()
	if !gophercloud.ResponseCodeIs(err, http.StatusNotFound) {
		t.Errorf("gophercloud get as demo: %v", err)
	}
	m := e.want(t, 200, "GET", "/v2/images?name=admin-private", e.demoTok, "")
	if len(m["images"].([]any)) != 0 {
		t.Errorf("demo lists admin's private image")
	}
	// The admin sees the demo project's private images.
	demoImg := e.create(t, e.demoTok, `{"name":"demo-private","visibility":"private"}`)
	e.want(t, 200, "GET", "/v2/images/"+demoImg["id"].(string), e.adminTok, "")
	m = e.want(t, 200, "GET", "/v2/images?name=demo-private", e.adminTok, "")
	if len(m["images"].([]any)) != 1 {
		t.Errorf("admin does not list demo's private image")
	}
	// Only an admin may create public images or images for another project.
	e.want(t, 403, "POST", "/v2/images", e.demoTok, `{"name":"pub","visibility":"public"}`)
	e.want(t, 403, "POST", "/v2/images", e.demoTok, `{"name":"x","owner":"`+e.adminPrj+`"}`)
	// Another project's public image is visible but not changeable.
	pub := e.create(t, e.adminTok, `{"name":"admin-public","visibility":"public"}`)["id"].(string)
	e.want(t, 200, "GET", "/v2/images/"+pub, e.demoTok, "")
	e.want(t, 403, "PATCH", "/v2/images/"+pub, e.demoTok, `[{"op":"replace","path":"/name","value":"x"}]`, "Content-Type", patchCT)
	e.want(t, 403, "DELETE", "/v2/images/"+pub, e.demoTok, "")
	e.want(t, 403, "PUT", "/v2/images/"+pub+"/file", e.demoTok, "x", "Content-Type", "application/octet-stream")
	// Community images are visible by id but left out of the default list.
	comm := e.create(t, e.adminTok, `{"name":"admin-community","visibility":"community"}`)["id"].(string)
	e.want(t, 200, "GET", "/v2/images/"+comm, e.demoTok, "")
	if n := len(e.want(t, 200, "GET", "/v2/images?name=admin-community", e.demoTok, "")["images"].([]any)); n != 0 {
		t.Errorf("community image in default list")
	}
	if n := len(e.want(t, 200, "GET", "/v2/images?name=admin-community&visibility=community", e.demoTok, "")["images"].([]any)); n != 1 {
		t.Errorf("community image not listed with visibility=community")
	}
}

func testProtected(t *testing.T, e *env) {
	ctx := context.Background()
	im, err := images.Create(ctx, e.demo, images.CreateOpts{Name: "prot", Protected: ptr(true), DiskFormat: "raw", ContainerFormat: "bare"}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	if err := imagedata.Upload(ctx, e.demo, im.ID, strings.NewReader("bits")).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(e.c.Config.DataDir, "images", im.ID)
	if _, err := os.Stat(file); err != nil {
		t.Fatalf("data file: %v", err)
	}
	err = images.Delete(ctx, e.demo, im.ID).ExtractErr()
	if !gophercloud.ResponseCodeIs(err, http.StatusForbidden) {
		t.Fatalf("delete protected: %v", err)
	}
	if _, err := images.Update(ctx, e.demo, im.ID, images.UpdateOpts{images.ReplaceImageProtected{NewProtected: false}}).Extract(); err != nil {
		t.Fatal(err)
	}
	if err := images.Delete(ctx, e.demo, im.ID).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	if _, err := images.Get(ctx, e.demo, im.ID).Extract(); !gophercloud.ResponseCodeIs(err, http.StatusNotFound) {
		t.Errorf("get deleted: %v", err)
	}
	if _, err := os.Stat(file); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("data file after delete: %v", err)
	}
}

func testMembers(t *testing.T, e *env) {
	ctx := context.Background()
	im, err := images.Create(ctx, e.admin, images.CreateOpts{Name: "shared-one", Visibility: ptr(images.ImageVisibilityShared)}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	listed := func(query string) bool {
		m := e.want(t, 200, "GET", "/v2/images?name=shared-one"+query, e.demoTok, "")
		return len(m["images"].([]any)) == 1
	}
	e.want(t, 404, "GET", "/v2/images/"+im.ID, e.demoTok, "")
	mem, err := members.Create(ctx, e.admin, im.ID, e.demoProj).Extract()
	if err != nil {
		t.Fatal(err)
	}
	if mem.Status != "pending" || mem.MemberID != e.demoProj || mem.ImageID != im.ID {
		t.Fatalf("member: %+v", mem)
	}
	if _, err := members.Create(ctx, e.admin, im.ID, e.demoProj).Extract(); !gophercloud.ResponseCodeIs(err, http.StatusConflict) {
		t.Errorf("duplicate member: %v", err)
	}
	// A pending member sees the image by id and with member_status=pending.
	e.want(t, 200, "GET", "/v2/images/"+im.ID, e.demoTok, "")
	if listed("") || !listed("&member_status=pending") || !listed("&member_status=all") {
		t.Errorf("pending listing wrong")
	}
	// The member may not add members or answer for the owner.
	e.want(t, 403, "POST", "/v2/images/"+im.ID+"/members", e.demoTok, `{"member":"someone"}`)
	if _, err := members.Update(ctx, e.demo, im.ID, e.demoProj, members.UpdateOpts{Status: "accepted"}).Extract(); err != nil {
		t.Fatal(err)
	}
	if !listed("") {
		t.Errorf("accepted shared image not listed")
	}
	all, err := members.List(e.demo, im.ID).AllPages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ms, _ := members.ExtractMembers(all)
	if len(ms) != 1 || ms[0].Status != "accepted" {
		t.Errorf("members as member: %+v", ms)
	}
	e.want(t, 403, "DELETE", "/v2/images/"+im.ID+"/members/"+e.demoProj, e.demoTok, "")
	e.want(t, 400, "PUT", "/v2/images/"+im.ID+"/members/"+e.demoProj, e.demoTok, `{"status":"maybe"}`)
	e.want(t, 400, "POST", "/v2/images/"+im.ID+"/members", e.adminTok, `{"memb":"x"}`)
	e.want(t, 404, "GET", "/v2/images/"+im.ID+"/members/nobody", e.adminTok, "")
	if err := members.Delete(ctx, e.admin, im.ID, e.demoProj).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	e.want(t, 404, "GET", "/v2/images/"+im.ID, e.demoTok, "")
	// Only shared images have members.
	priv := e.create(t, e.adminTok, `{"name":"not-shared","visibility":"private"}`)["id"].(string)
	e.want(t, 403, "POST", "/v2/images/"+priv+"/members", e.adminTok, `{"member":"`+e.demoProj+`"}`)
}

func testDeactivate(t *testing.T, e *env) {
	id := e.create(t, e.demoTok, `{"name":"deact","disk_format":"raw","container_format":"bare","visibility":"private"}`)["id"].(string)
	path := "/v2/images/" + id
	e.want(t, 403, "POST", path+"/actions/deactivate", e.demoTok, "")
	e.want(t, 204, "PUT", path+"/file", e.demoTok, "payload", "Content-Type", "application/octet-stream")
	e.want(t, 204, "POST", path+"/actions/deactivate", e.demoTok, "")
	if m := e.want(t, 200, "GET", path, e.demoTok, ""); m["status"] != "deactivated" {
		t.Errorf("status %v", m["status"])
	}
	e.want(t, 403, "GET", path+"/file", e.demoTok, "")
	resp, b := e.do(t, "GET", path+"/file", e.adminTok, "")
	testenv.MustStatus(t, resp, b, 200)
	if b != "payload" || resp.Header.Get("Content-Length") != "7" {
		t.Errorf("admin download of deactivated: %q (len %s)", b, resp.Header.Get("Content-Length"))
	}
	e.want(t, 204, "POST", path+"/actions/reactivate", e.demoTok, "")
	e.want(t, 200, "GET", path+"/file", e.demoTok, "")
}

func testBadInput(t *testing.T, e *env) {
	octet := []string{"Content-Type", "application/octet-stream"}
	id := e.create(t, e.demoTok, `{"name":"bad-input"}`)["id"].(string)
	for _, tc := range []struct {
		method, path, body string
		hdr                []string
		status             int
	}{
		{"POST", "/v2/images", `{"name":`, nil, 400},
		{"POST", "/v2/images", `[]`, nil, 400},
		{"POST", "/v2/images", `{"id":"not-a-uuid"}`, nil, 400},
		{"POST", "/v2/images", `{"id":"` + id + `"}`, nil, 409},
		{"POST", "/v2/images", `{"name":5}`, nil, 400},
		{"POST", "/v2/images", `{"min_ram":"x"}`, nil, 400},
		{"POST", "/v2/images", `{"min_disk":-1}`, nil, 400},
		{"POST", "/v2/images", `{"disk_format":"floppy"}`, nil, 400},
		{"POST", "/v2/images", `{"protected":"yes"}`, nil, 400},
		{"POST", "/v2/images", `{"tags":"a"}`, nil, 400},
		{"POST", "/v2/images", `{"custom":{"nested":1}}`, nil, 400},
		{"POST", "/v2/images", `{"status":"active"}`, nil, 403},
		{"POST", "/v2/images", `{"self":"x"}`, nil, 403},
		{"POST", "/v2/images", `{"deleted":"x"}`, nil, 403},
		{"GET", "/v2/images/not-a-uuid", "", nil, 404},
		{"GET", "/v2/images/00000000-0000-0000-0000-000000000000", "", nil, 404},
		{"GET", "/v2/images?sort_key=bogus", "", nil, 400},
		{"GET", "/v2/images?sort_dir=up", "", nil, 400},
		{"GET", "/v2/images?sort=name:up", "", nil, 400},
		{"GET", "/v2/images?sort=name&sort_key=id", "", nil, 400},
		{"GET", "/v2/images?marker=00000000-0000-0000-0000-000000000000", "", nil, 400},
		{"GET", "/v2/images?marker=garbage", "", nil, 400},
		{"GET", "/v2/images?limit=abc", "", nil, 400},
		{"GET", "/v2/images?limit=-1", "", nil, 400},
		{"GET", "/v2/images?visibility=bogus", "", nil, 400},
		{"GET", "/v2/images?member_status=bogus", "", nil, 400},
		{"GET", "/v2/images?os_hidden=maybe", "", nil, 400},
		{"GET", "/v2/images?size_min=big", "", nil, 400},
		{"GET", "/v2/images?created_at=gt:yesterday", "", nil, 400},
		{"GET", "/v2/images?changes-since=2020-01-01", "", nil, 400},
		{"PUT", "/v2/images/" + id + "/file", "x", []string{"Content-Type", "text/plain"}, 415},
		{"PUT", "/v2/images/not-a-uuid/file", "x", octet, 404},
		{"GET", "/v2/images/" + id + "/file", "", nil, 204},
		{"POST", "/v2/images/" + id + "/members", `{"member":`, nil, 400},
		{"POST", "/v2/images/" + id + "/members", `{"member":""}`, nil, 400},
		{"POST", "/v2/images/" + id + "/members", `{"member":7}`, nil, 400},
		{"PUT", "/v2/images/" + id + "/members/x", `{}`, nil, 400},
		{"DELETE", "/v2/images/not-a-uuid", "", nil, 404},
		{"POST", "/v2/images/" + id + "/actions/explode", "", nil, 404},
	} {
		resp, b := e.do(t, tc.method, tc.path, e.demoTok, tc.body, tc.hdr...)
		if resp.StatusCode != tc.status {
			t.Errorf("%s %s %s: %d, want %d: %s", tc.method, tc.path, tc.body, resp.StatusCode, tc.status, b)
		}
	}
	// Listing with every sort key and a valid marker works.
	for _, k := range []string{"name", "status", "container_format", "disk_format", "size", "id", "created_at", "updated_at"} {
		e.want(t, 200, "GET", "/v2/images?limit=2&sort_key="+k+"&marker="+id, e.demoTok, "")
	}
}

func testContract(t *testing.T, e *env) {
	ctx := context.Background()
	base, err := e.c.Images.Get(ctx, e.demoProj, false, imagecatalog.ID("Ubuntu 24.04"))
	if err != nil {
		t.Fatal(err)
	}
	var snap *image.Image
	err = e.c.DB.Tx(ctx, func(tx *store.Tx) error {
		snap, err = e.c.Images.CreateSnapshot(ctx, tx, e.demoProj, "my-snap", map[string]string{"image_type": "snapshot"}, base, "")
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if snap.Status != image.StatusQueued || snap.Visibility != image.Private || snap.Properties["os_distro"] != "ubuntu" ||
		snap.Properties["login_user"] != "ubuntu" || snap.Properties["image_type"] != "snapshot" || snap.Properties["nimbus_placeholder"] != "" {
		t.Fatalf("snapshot record: %+v", snap)
	}
	data := bytes.Repeat([]byte("disk"), 10000)
	if err := e.c.Images.FinishSnapshot(ctx, snap.ID, "", bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	got, err := e.c.Images.Get(ctx, e.demoProj, false, snap.ID)
	if err != nil {
		t.Fatal(err)
	}
	sum := md5.Sum(data)
	if got.Status != image.StatusActive || got.Size != int64(len(data)) || got.Checksum != hex.EncodeToString(sum[:]) {
		t.Fatalf("finished snapshot: %+v", got)
	}
	if _, err := e.c.Images.Get(ctx, e.adminPrj, false, snap.ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("other project sees snapshot: %v", err)
	}
	if _, err := e.c.Images.Get(ctx, e.adminPrj, true, snap.ID); err != nil {
		t.Errorf("admin does not see snapshot: %v", err)
	}
	if m := e.want(t, 200, "GET", "/v2/images/"+snap.ID, e.demoTok, ""); m["status"] != "active" || m["name"] != "my-snap" {
		t.Errorf("snapshot over HTTP: %v", m)
	}
	if err := e.c.Images.Delete(ctx, snap.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Images.Get(ctx, e.demoProj, false, snap.ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("deleted snapshot: %v", err)
	}
	if err := e.c.Images.Delete(ctx, snap.ID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("second delete: %v", err)
	}
	// A snapshot without a base still gets formats.
	err = e.c.DB.Tx(ctx, func(tx *store.Tx) error {
		snap, err = e.c.Images.CreateSnapshot(ctx, tx, e.demoProj, "bare-snap", nil, nil, "")
		return err
	})
	if err != nil || snap.DiskFormat == "" || snap.ContainerFormat == "" {
		t.Fatalf("snapshot without base: %+v, %v", snap, err)
	}
}

// TestBootstrapIdempotent starts two clouds on one database in turn: the
// catalog is registered once, an image the operator deleted stays deleted,
// and the second cloud (with a fresh data directory) still serves data.
func TestBootstrapIdempotent(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		count := func(c *cloud.Cloud) int {
			var n int
			if err := c.DB.QueryRow(ctx, "SELECT COUNT(*) FROM images").Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
		c1 := testenv.StartCloud(t, dbURL)
		n1 := count(c1)
		if n1 != len(imagecatalog.Images) {
			t.Fatalf("first start: %d images, want %d", n1, len(imagecatalog.Images))
		}
		if err := c1.Images.Bootstrap(ctx); err != nil {
			t.Fatal(err)
		}
		if err := c1.Images.Delete(ctx, imagecatalog.ID("Fedora 41")); err != nil {
			t.Fatal(err)
		}
		c1.Close()

		c2 := testenv.StartCloud(t, dbURL)
		if n2 := count(c2); n2 != n1-1 {
			t.Fatalf("second start: %d images, want %d", n2, n1-1)
		}
		client := testenv.HTTPClient(t, c2)
		tok := testenv.Token(t, c2, cloud.DemoUser)
		resp, b := testenv.Do(t, client, "GET", c2.ImageURL+"/v2/images/"+imagecatalog.ID("Debian 12")+"/file", tok, "")
		testenv.MustStatus(t, resp, b, 200)
		if len(b) != 1<<20 || !strings.HasPrefix(b, "NIMBUS PLACEHOLDER IMAGE") {
			t.Errorf("placeholder after restart: %d bytes %q", len(b), b[:min(len(b), 40)])
		}
	})
}

func ptr[T any](v T) *T { return &v }
