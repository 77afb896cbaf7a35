package image_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/imagedata"

	"nimbus/internal/billing"
	"nimbus/internal/imagecatalog"
	"nimbus/internal/testenv"
)

// TestImageQuotasAndMetering: image count and size quotas answer Glance's
// 413 and leave nothing behind, /v2/info/usage shows them, compute's
// snapshots count against them (shelve images too, without being refused),
// and stored images are charged per GB-hour except the public catalog.
func TestImageQuotasAndMetering(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		t.Run("quotaAPI", func(t *testing.T) { testQuotaAPI(t, e) })
		t.Run("count", func(t *testing.T) { testCountQuota(t, e) })
		t.Run("size", func(t *testing.T) { testSizeQuota(t, e) })
		t.Run("snapshots", func(t *testing.T) { testSnapshotQuota(t, e) })
		t.Run("charges", func(t *testing.T) { testImageCharges(t, e) })
	})
}

// usage reads GET /v2/info/usage as tok: limit and usage by quota name.
func (e *env) usage(t *testing.T, tok string) map[string][2]int64 {
	t.Helper()
	resp, b := e.do(t, "GET", "/v2/info/usage", tok, "")
	testenv.MustStatus(t, resp, b, http.StatusOK)
	var body struct {
		Usage map[string]struct{ Limit, Usage int64 } `json:"usage"`
	}
	if err := json.Unmarshal([]byte(b), &body); err != nil {
		t.Fatalf("usage body %q: %v", b, err)
	}
	out := map[string][2]int64{}
	for k, v := range body.Usage {
		out[k] = [2]int64{v.Limit, v.Usage}
	}
	return out
}

func (e *env) setQuota(t *testing.T, body string) {
	t.Helper()
	e.want(t, http.StatusOK, "PUT", "/v2/quotas/"+e.demoProj, e.adminTok, `{"quota_set": `+body+`}`)
}

func testQuotaAPI(t *testing.T, e *env) {
	u := e.usage(t, e.demoTok)
	want := map[string]int64{"image_count_total": 100, "image_size_total": 1000 << 10, "image_stage_total": 1000 << 10, "image_count_uploading": 10}
	for k, l := range want {
		if u[k][0] != l {
			t.Errorf("default %s: limit %d, want %d (usage %v)", k, u[k][0], l, u)
		}
	}
	for _, tc := range []struct {
		name, tok, path, body string
		status                int
	}{
		{"customer sets", e.demoTok, e.demoProj, `{"quota_set": {"image_count_total": 1000}}`, 403},
		{"below -1", e.adminTok, e.demoProj, `{"quota_set": {"image_count_total": -2}}`, 400},
		{"string", e.adminTok, e.demoProj, `{"quota_set": {"image_count_total": "5"}}`, 400},
		{"fraction", e.adminTok, e.demoProj, `{"quota_set": {"image_size_total": 1.5}}`, 400},
		{"beyond 2^40", e.adminTok, e.demoProj, `{"quota_set": {"image_size_total": 1099511627777}}`, 400},
		{"beyond int64", e.adminTok, e.demoProj, `{"quota_set": {"image_size_total": 99999999999999999999}}`, 400},
		{"unknown name", e.adminTok, e.demoProj, `{"quota_set": {"images": 5}}`, 400},
		{"not an object", e.adminTok, e.demoProj, `{"quota_set": [1]}`, 400},
		{"extra key", e.adminTok, e.demoProj, `{"quota_set": {}, "x": 1}`, 400},
		{"array", e.adminTok, e.demoProj, `[]`, 400},
	} {
		resp, b := e.do(t, "PUT", "/v2/quotas/"+tc.path, tc.tok, tc.body)
		if resp.StatusCode != tc.status {
			t.Errorf("%s: %d %s, want %d", tc.name, resp.StatusCode, b, tc.status)
		}
	}
	resp, b := e.do(t, "GET", "/v2/quotas/"+e.adminPrj, e.demoTok, "")
	testenv.MustStatus(t, resp, b, http.StatusForbidden)
	e.want(t, http.StatusOK, "GET", "/v2/quotas/"+e.demoProj, e.demoTok, "")

	e.setQuota(t, `{"image_count_total": 7, "image_size_total": -1}`)
	if u := e.usage(t, e.demoTok); u["image_count_total"][0] != 7 || u["image_size_total"][0] != -1 {
		t.Errorf("after set: %v", u)
	}
	e.setQuota(t, `{"image_count_total": null, "image_size_total": null}`)
	if u := e.usage(t, e.demoTok); u["image_count_total"][0] != 100 || u["image_size_total"][0] != 1000<<10 {
		t.Errorf("after reset: %v", u)
	}
	// The property that exempts shelve images is the system's to set.
	resp, b = e.do(t, "POST", "/v2/images", e.demoTok, `{"name": "x", "nimbus_shelved": "true"}`)
	testenv.MustStatus(t, resp, b, http.StatusForbidden)
	id := e.create(t, e.demoTok, `{"name": "x"}`)["id"].(string)
	resp, b = e.do(t, "PATCH", "/v2/images/"+id, e.demoTok, `[{"op": "add", "path": "/nimbus_shelved", "value": "true"}]`,
		"Content-Type", patchCT)
	testenv.MustStatus(t, resp, b, http.StatusForbidden)
	e.want(t, http.StatusNoContent, "DELETE", "/v2/images/"+id, e.demoTok, "")
}

func testCountQuota(t *testing.T, e *env) {
	have := e.usage(t, e.demoTok)["image_count_total"][1]
	e.setQuota(t, `{"image_count_total": `+itoa(have+1)+`}`)
	defer e.setQuota(t, `{"image_count_total": null}`)
	id := e.create(t, e.demoTok, `{"name": "last one"}`)["id"].(string)
	resp, b := e.do(t, "POST", "/v2/images", e.demoTok, `{"name": "one too many"}`)
	testenv.MustStatus(t, resp, b, http.StatusRequestEntityTooLarge)
	if !strings.Contains(b, "image_count_total is over limit of "+itoa(have+1)) {
		t.Errorf("413 body: %s", b)
	}
	if u := e.usage(t, e.demoTok)["image_count_total"]; u[1] != have+1 {
		t.Errorf("count after refusal: %v, want %d", u, have+1)
	}
	// Deleting one makes room again.
	e.want(t, http.StatusNoContent, "DELETE", "/v2/images/"+id, e.demoTok, "")
	id = e.create(t, e.demoTok, `{"name": "room again"}`)["id"].(string)
	e.want(t, http.StatusNoContent, "DELETE", "/v2/images/"+id, e.demoTok, "")
}

// chunked hides a reader's length, so the upload is sent without
// Content-Length and the server learns its size only by reading it.
type chunked struct{ io.Reader }

// counter counts what is read through it: an upload without length.
type counter struct {
	r io.Reader
	n atomic.Int64 // the transport may still be reading when the answer is in
}

func (c *counter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

func testSizeQuota(t *testing.T, e *env) {
	ctx := context.Background()
	e.setQuota(t, `{"image_size_total": 2}`) // MiB
	defer e.setQuota(t, `{"image_size_total": null}`)
	a := e.create(t, e.demoTok, `{"name": "a", "disk_format": "raw", "container_format": "bare"}`)["id"].(string)
	if err := imagedata.Upload(ctx, e.demo, a, bytes.NewReader(make([]byte, 3<<19))).ExtractErr(); err != nil {
		t.Fatalf("1.5 MiB under a 2 MiB quota: %v", err)
	}
	b := e.create(t, e.demoTok, `{"name": "b", "disk_format": "raw", "container_format": "bare"}`)["id"].(string)
	queuedAndClean := func(how string) {
		t.Helper()
		if m := e.want(t, 200, "GET", "/v2/images/"+b, e.demoTok, ""); m["status"] != "queued" || m["size"] != nil {
			t.Errorf("%s: status %v size %v, want queued without data", how, m["status"], m["size"])
		}
		if files, _ := filepath.Glob(filepath.Join(e.c.Config.DataDir, "images", "*"+b+"*")); len(files) != 0 {
			t.Errorf("%s: files left: %v", how, files)
		}
	}
	// Declared too big: refused before the data is read.
	resp, body := e.do(t, "PUT", "/v2/images/"+b+"/file", e.demoTok, strings.Repeat("x", 1<<20),
		"Content-Type", "application/octet-stream")
	testenv.MustStatus(t, resp, body, http.StatusRequestEntityTooLarge)
	if !strings.Contains(body, "image_size_total is over limit of 2 due to current usage 1 and delta 1") {
		t.Errorf("413 body: %s", body)
	}
	queuedAndClean("declared")
	// Not declared: cut off as soon as it crosses, long before the end of
	// 256 MiB (what the client sent is at most what the connection buffers).
	src := &counter{r: io.LimitReader(zeros{}, 256<<20)}
	err := imagedata.Upload(ctx, e.demo, b, src).ExtractErr()
	if !gophercloud.ResponseCodeIs(err, http.StatusRequestEntityTooLarge) {
		t.Fatalf("chunked upload over quota: %v, want 413", err)
	}
	if n := src.n.Load(); n > 32<<20 {
		t.Errorf("the server read on to %d bytes of an upload over quota", n)
	} else {
		t.Logf("an upload over quota was cut off after the client sent %d bytes", n)
	}
	queuedAndClean("chunked")
	// What fits is taken.
	if err := imagedata.Upload(ctx, e.demo, b, chunked{bytes.NewReader(make([]byte, 400<<10))}).ExtractErr(); err != nil {
		t.Fatalf("0.4 MiB in the room left: %v", err)
	}
	if u := e.usage(t, e.demoTok)["image_size_total"]; u != [2]int64{2, 1} {
		t.Errorf("image_size_total [limit usage] = %v, want [2 1] (1.9 MiB)", u)
	}
	// image_count_uploading: a second upload while one runs is refused.
	e.setQuota(t, `{"image_size_total": null, "image_count_uploading": 1}`)
	defer e.setQuota(t, `{"image_count_uploading": null}`)
	c := e.create(t, e.demoTok, `{"name": "c", "disk_format": "raw", "container_format": "bare"}`)["id"].(string)
	d := e.create(t, e.demoTok, `{"name": "d", "disk_format": "raw", "container_format": "bare"}`)["id"].(string)
	e.abortedUpload(t, c, func() {
		if u := e.usage(t, e.demoTok)["image_count_uploading"]; u != [2]int64{1, 1} {
			t.Errorf("image_count_uploading [limit usage] during an upload = %v, want [1 1]", u)
		}
		resp, body := e.do(t, "PUT", "/v2/images/"+d+"/file", e.demoTok, "data", "Content-Type", "application/octet-stream")
		testenv.MustStatus(t, resp, body, http.StatusRequestEntityTooLarge)
	})
	e.want(t, http.StatusNoContent, "PUT", "/v2/images/"+d+"/file", e.demoTok, "data", "Content-Type", "application/octet-stream")
	for _, id := range []string{c, d} {
		e.want(t, http.StatusNoContent, "DELETE", "/v2/images/"+id, e.demoTok, "")
	}
	for _, id := range []string{a, b} {
		e.want(t, http.StatusNoContent, "DELETE", "/v2/images/"+id, e.demoTok, "")
	}
}

// compute sends a request to the compute API at microversion 2.96.
func (e *env) compute(t *testing.T, method, path, tok, body string) (int, map[string]any) {
	t.Helper()
	resp, raw := testenv.Do(t, e.http, method, e.c.ComputeURL+path, tok, body, "OpenStack-API-Version", "compute 2.96")
	var m map[string]any
	if strings.TrimSpace(raw) != "" {
		if err := json.Unmarshal([]byte(raw), &m); err != nil {
			t.Fatalf("%s %s: %d %q", method, path, resp.StatusCode, raw)
		}
	}
	return resp.StatusCode, m
}

func (e *env) waitServer(t *testing.T, id, want string) {
	t.Helper()
	var sv map[string]any
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		_, m := e.compute(t, "GET", "/servers/"+id, e.demoTok, "")
		sv, _ = m["server"].(map[string]any)
		if sv["status"] == want && sv["OS-EXT-STS:task_state"] == nil {
			return
		}
	}
	t.Fatalf("server %s: %v, want %s", id, sv["status"], want)
}

func (e *env) waitImage(t *testing.T, id, want string) map[string]any {
	t.Helper()
	var m map[string]any
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if m = e.want(t, 200, "GET", "/v2/images/"+id, e.adminTok, ""); m["status"] == want {
			return m
		}
	}
	t.Fatalf("image %s: %v, want %s", id, m["status"], want)
	return nil
}

// openPeriod answers the kind and project of an image's open usage period
// ("" when it has none).
func (e *env) openPeriod(t *testing.T, id string) (kind, project string) {
	t.Helper()
	err := e.c.DB.QueryRow(context.Background(), "SELECT kind, project_id FROM metering_periods WHERE resource_id = ? AND ended_at = ''",
		id).Scan(&kind, &project)
	if err != nil && !strings.Contains(err.Error(), "no rows") {
		t.Fatal(err)
	}
	return kind, project
}

func testSnapshotQuota(t *testing.T, e *env) {
	st, m := e.compute(t, "POST", "/servers", e.demoTok, `{"server": {"name": "q", "imageRef": "`+imagecatalog.ID("Debian 12")+
		`", "flavorRef": "2", "networks": "auto"}}`)
	if st != http.StatusAccepted {
		t.Fatalf("create server: %d %v", st, m)
	}
	sv := m["server"].(map[string]any)["id"].(string)
	e.waitServer(t, sv, "ACTIVE")
	before := e.usage(t, e.demoTok)["image_count_total"][1]
	st, m = e.compute(t, "POST", "/servers/"+sv+"/action", e.demoTok, `{"createImage": {"name": "snap"}}`)
	if st != http.StatusAccepted {
		t.Fatalf("createImage: %d %v", st, m)
	}
	snap := m["image_id"].(string)
	e.waitImage(t, snap, "active")
	e.waitServer(t, sv, "ACTIVE")
	if got := e.usage(t, e.demoTok)["image_count_total"][1]; got != before+1 {
		t.Errorf("image_count_total usage after createImage: %d, want %d", got, before+1)
	}
	if kind, project := e.openPeriod(t, snap); kind != "image" || project != e.demoProj {
		t.Errorf("snapshot usage period: kind %q project %q, want image of %s", kind, project, e.demoProj)
	}
	// At the count quota a snapshot is refused with Nova's 413 …
	e.setQuota(t, `{"image_count_total": `+itoa(before+1)+`}`)
	defer e.setQuota(t, `{"image_count_total": null}`)
	st, m = e.compute(t, "POST", "/servers/"+sv+"/action", e.demoTok, `{"createImage": {"name": "snap2"}}`)
	if st != http.StatusRequestEntityTooLarge || m["overLimit"] == nil {
		t.Errorf("createImage over image_count_total: %d %v, want 413 overLimit", st, m)
	}
	// … and customer metadata cannot claim the shelve exemption.
	st, m = e.compute(t, "POST", "/servers/"+sv+"/action", e.demoTok, `{"createImage": {"name": "s", "metadata": {"nimbus_shelved": "true"}}}`)
	if st != http.StatusForbidden {
		t.Errorf("createImage with nimbus_shelved: %d %v, want 403", st, m)
	}
	// A shelve still keeps the disk: its image counts and is charged but
	// is not refused.
	if st, m = e.compute(t, "POST", "/servers/"+sv+"/action", e.demoTok, `{"shelve": null}`); st != http.StatusAccepted {
		t.Fatalf("shelve: %d %v", st, m)
	}
	e.waitServer(t, sv, "SHELVED_OFFLOADED")
	var shelved string
	if err := e.c.DB.QueryRow(context.Background(), "SELECT id FROM images WHERE name = ? AND owner = ?", "q-shelved", e.demoProj).Scan(&shelved); err != nil {
		t.Fatalf("no shelve image at the count quota: %v", err)
	}
	if m := e.waitImage(t, shelved, "active"); m["nimbus_shelved"] != "true" {
		t.Errorf("shelve image properties: %v", m)
	}
	if kind, project := e.openPeriod(t, shelved); kind != "image" || project != e.demoProj {
		t.Errorf("shelve image usage period: kind %q project %q", kind, project)
	}
	if got := e.usage(t, e.demoTok)["image_count_total"][1]; got != before+2 {
		t.Errorf("image_count_total usage after shelve: %d, want %d", got, before+2)
	}
	if st, m = e.compute(t, "DELETE", "/servers/"+sv, e.demoTok, ""); st != http.StatusNoContent {
		t.Fatalf("delete server: %d %v", st, m)
	}
}

func testImageCharges(t *testing.T, e *env) {
	ctx := context.Background()
	// 2.0001 minor units per GB-hour: a 1 GB image pays 3 an hour.
	if _, err := e.c.Billing.SetPrices(ctx, map[string]int64{"image_gb": 2*billing.RateScale + 1}); err != nil {
		t.Fatal(err)
	}
	id := e.create(t, e.demoTok, `{"name": "billed", "disk_format": "raw", "container_format": "bare"}`)["id"].(string)
	if err := imagedata.Upload(ctx, e.demo, id, bytes.NewReader(make([]byte, 1<<20))).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	// A public image of the operator's, with data, costs nobody anything.
	pub := e.create(t, e.adminTok, `{"name": "catalog", "visibility": "public", "disk_format": "raw", "container_format": "bare"}`)["id"].(string)
	if err := imagedata.Upload(ctx, e.admin, pub, bytes.NewReader(make([]byte, 1<<20))).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.c.Billing.ChargeUntil(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	charges := func(resource string) (n int, sum int64) {
		t.Helper()
		if err := e.c.DB.QueryRow(ctx, "SELECT COUNT(*), COALESCE(SUM(amount), 0) FROM billing_ledger WHERE resource_id = ?",
			resource).Scan(&n, &sum); err != nil {
			t.Fatal(err)
		}
		return n, sum
	}
	if n, sum := charges(id); n < 1 || sum != -3*int64(n) {
		t.Errorf("image charges: %d rows summing %d, want 3 per hour", n, sum)
	}
	for _, free := range []string{pub, imagecatalog.ID("Debian 12")} {
		if n, _ := charges(free); n != 0 {
			t.Errorf("public image %s charged %d times", free, n)
		}
		if kind, _ := e.openPeriod(t, free); kind != "" {
			t.Errorf("public image %s metered as %q", free, kind)
		}
	}
	// An image stored before images were metered is metered from the next
	// start.
	if _, err := e.c.DB.Exec(ctx, "DELETE FROM metering_periods WHERE resource_id = ?", id); err != nil {
		t.Fatal(err)
	}
	if err := e.c.Images.Bootstrap(ctx); err != nil {
		t.Fatal(err)
	}
	if kind, project := e.openPeriod(t, id); kind != "image" || project != e.demoProj {
		t.Errorf("after a restart an unmetered image is metered as %q of %q", kind, project)
	}
	// Given to another project, it is that project's to pay from now.
	e.want(t, http.StatusOK, "PATCH", "/v2/images/"+id, e.adminTok, `[{"op": "replace", "path": "/owner", "value": "`+e.adminPrj+`"}]`,
		"Content-Type", patchCT)
	if kind, project := e.openPeriod(t, id); kind != "image" || project != e.adminPrj {
		t.Errorf("after the owner changed the image is metered as %q of %q, want image of %s", kind, project, e.adminPrj)
	}
	// Deleting the image ends its charges.
	e.want(t, http.StatusNoContent, "DELETE", "/v2/images/"+id, e.adminTok, "")
	if kind, _ := e.openPeriod(t, id); kind != "" {
		t.Errorf("deleted image still metered as %q", kind)
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
