package e2e

import (
	"bytes"
	"context"
	"crypto/md5"
	"crypto/rand"
	"crypto/sha512"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/volumes"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/flavors"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/keypairs"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/imagedata"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/images"

	"nimbus/internal/cloud"
	"nimbus/internal/image"
	"nimbus/internal/imagecatalog"
	"nimbus/internal/testenv"
	"nimbus/internal/testenv/syncbuf"
)

// imageRegion is two controllers on one PostgreSQL database and one Ceph
// cluster, images and volumes in Ceph: the first runs alone
// (--no-local-agent), the second with the local agent, so servers run on
// the second's hosts whichever controller they were asked of.
type imageRegion struct {
	t      *testing.T
	ceph   *testenv.Ceph
	c      [2]*cloud.Cloud
	img    [2]*gophercloud.ServiceClient // demo's image clients
	vol    [2]*gophercloud.ServiceClient // demo's block storage clients
	comp   [2]*gophercloud.ServiceClient // demo's compute clients
	tok    [2]string                     // demo's tokens
	client [2]*http.Client
}

// postgresURL is a fresh PostgreSQL database; a region needs one.
func postgresURL(t *testing.T) string {
	t.Helper()
	for _, eng := range testenv.Engines(t) {
		if eng.Name == "postgres" {
			return eng.URL
		}
	}
	t.Skip("PostgreSQL not available (set NIMBUS_TEST_POSTGRES)")
	return ""
}

func startImageRegion(t *testing.T, second func(*cloud.Config)) *imageRegion {
	t.Helper()
	pg := postgresURL(t)
	r := &imageRegion{t: t, ceph: testenv.StartCeph(t)}
	inCeph := func(cfg *cloud.Config) {
		cfg.Volumes = cloud.VolumeOptions{Backend: cloud.VolumeBackendRBD, RBD: cloud.RBDOptions{
			Conf: r.ceph.Conf, Keyring: r.ceph.Keyring, User: r.ceph.Client, Pool: testenv.VolumesPool, BackupPool: testenv.BackupsPool}}
		cfg.ImageData = cloud.ImageOptions{Backend: image.BackendRBD, Pool: testenv.ImagesPool}
	}
	r.c[0] = testenv.StartCloud(t, pg, inCeph, func(cfg *cloud.Config) { cfg.NoLocalAgent = true })
	// The region's CA is the first controller's, copied to the others
	// before their first start: each issues its own server certificate
	// from it, and agents and clients trust one CA file.
	shareCA := func(cfg *cloud.Config) {
		must(t, os.MkdirAll(cfg.DataDir, 0o700))
		for _, f := range []string{"ca.pem", "ca-key.pem"} {
			b, err := os.ReadFile(filepath.Join(r.c[0].Config.DataDir, f))
			must(t, err)
			must(t, os.WriteFile(filepath.Join(cfg.DataDir, f), b, 0o600))
		}
	}
	r.c[1] = testenv.StartCloud(t, pg, inCeph, second, shareCA)
	for i, c := range r.c {
		pc := testenv.Provider(t, c, cloud.DemoUser)
		var err error
		r.img[i], err = openstack.NewImageV2(pc, gophercloud.EndpointOpts{})
		must(t, err)
		r.vol[i], err = openstack.NewBlockStorageV3(pc, gophercloud.EndpointOpts{})
		must(t, err)
		r.comp[i] = testenv.Compute(t, pc, "2.79")
		r.tok[i] = testenv.Token(t, c, cloud.DemoUser)
		r.client[i] = testenv.HTTPClient(t, c)
	}
	// One CA: a client that trusts the first controller's reaches the
	// second.
	resp, body := testenv.Do(t, r.client[0], "GET", r.c[1].ImageURL+"/versions", "", "")
	testenv.MustStatus(t, resp, body, http.StatusOK)
	// Each controller's own directory holds nothing of the images.
	for i, c := range r.c {
		if files, _ := filepath.Glob(filepath.Join(c.Config.DataDir, "images", "*")); len(files) > 0 {
			t.Errorf("controller %d keeps image files %v", i+1, files)
		}
	}
	return r
}

// rbd runs the rbd tool as the clouds' client and returns its output.
func (r *imageRegion) rbd(args ...string) (string, error) {
	out, err := exec.Command("rbd", append([]string{"--conf", r.ceph.Conf, "--keyring", r.ceph.Keyring, "--id", r.ceph.Client}, args...)...).Output()
	if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
		err = errors.New(string(ee.Stderr))
	}
	return string(out), err
}

// inPool lists the pool's images that begin with prefix.
func (r *imageRegion) inPool(pool, prefix string) []string {
	r.t.Helper()
	out, err := r.rbd("ls", pool)
	if err != nil {
		r.t.Fatalf("rbd ls %s: %v", pool, err)
	}
	var names []string
	for _, n := range strings.Fields(out) {
		if strings.HasPrefix(n, prefix) {
			names = append(names, n)
		}
	}
	return names
}

// parent is the pool/image@snap an RBD image was cloned from, "" for none.
func (r *imageRegion) parent(spec string) string {
	r.t.Helper()
	out, err := r.rbd("info", "--format", "json", spec)
	if err != nil {
		r.t.Fatalf("rbd info %s: %v", spec, err)
	}
	var info struct {
		Parent *struct{ Pool, Image, Snapshot string } `json:"parent"`
	}
	must(r.t, json.Unmarshal([]byte(out), &info))
	if info.Parent == nil {
		return ""
	}
	return info.Parent.Pool + "/" + info.Parent.Image + "@" + info.Parent.Snapshot
}

// upload makes an image through controller i and uploads data to it.
func (r *imageRegion) upload(ctx context.Context, i int, name, format string, data []byte) string {
	r.t.Helper()
	img, err := images.Create(ctx, r.img[i], images.CreateOpts{Name: name, DiskFormat: format, ContainerFormat: "bare"}).Extract()
	must(r.t, err)
	if err := imagedata.Upload(ctx, r.img[i], img.ID, bytes.NewReader(data)).ExtractErr(); err != nil {
		r.t.Fatalf("upload %s through controller %d: %v", name, i+1, err)
	}
	return img.ID
}

// download reads an image's data through controller i.
func (r *imageRegion) download(ctx context.Context, i int, id string) []byte {
	r.t.Helper()
	rc, err := imagedata.Download(ctx, r.img[i], id).Extract()
	if err != nil {
		r.t.Fatalf("download %s through controller %d: %v", id, i+1, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	must(r.t, err)
	return b
}

// waitVolume waits for a volume's status through controller i.
func (r *imageRegion) waitVolume(ctx context.Context, i int, id, want string) {
	r.t.Helper()
	waitFor(r.t, 90*time.Second, "volume "+id+" "+want, func() bool {
		v, err := volumes.Get(ctx, r.vol[i], id).Extract()
		if want == "deleted" {
			return gophercloud.ResponseCodeIs(err, http.StatusNotFound)
		}
		if err == nil && v.Status == "error" {
			r.t.Fatalf("volume %s: error", id)
		}
		return err == nil && v.Status == want
	})
}

// TestRegionImages: image data lives in Ceph, where every controller of a
// region reaches it. An image uploaded through one controller downloads
// intact through the other, with Glance's checksum and multihash; a server
// asked of either boots it; a volume made of it on the rbd volume backend
// is a copy-on-write clone of its snapshot, which keeps the image from
// being deleted (409, as Glance's store in use) until the volume goes;
// deleting it through either controller removes its RBD image; a snapshot
// a host stores through one controller reads back through the other; an
// upload cut short leaves nothing in the pool.
func TestRegionImages(t *testing.T) {
	r := startImageRegion(t, func(*cloud.Config) {})
	ctx := context.Background()

	// The catalog's placeholders were put in Ceph by the first start.
	debian := imagecatalog.ID("Debian 12")
	var loc string
	must(t, r.c[1].DB.QueryRow(ctx, "SELECT location FROM images WHERE id = ?", debian).Scan(&loc))
	if !strings.HasPrefix(loc, "rbd://") || !strings.HasSuffix(loc, "/"+testenv.ImagesPool+"/"+debian+"/snap") {
		t.Errorf("Debian 12's placeholder is at %q, want rbd://<fsid>/images/%s/snap", loc, debian)
	}
	if b := r.download(ctx, 1, debian); len(b) != 1<<20 || !bytes.HasPrefix(b, []byte("NIMBUS PLACEHOLDER")) {
		t.Errorf("placeholder through controller 2: %d bytes", len(b))
	}

	// The operator replaces the placeholder (nimbus admin image import
	// --replace) through one controller with data uploaded through the
	// other: the record takes the staging image's RBD image, the
	// placeholder's goes.
	adminTok := testenv.Token(t, r.c[1], cloud.AdminUser)
	real := []byte("the real Debian 12 disk")
	resp, body := testenv.Do(t, r.client[1], "POST", r.c[1].ImageURL+"/v2/images", adminTok,
		`{"name": "staging", "disk_format": "raw", "container_format": "bare"}`)
	testenv.MustStatus(t, resp, body, http.StatusCreated)
	var staging struct{ ID string }
	must(t, json.Unmarshal([]byte(body), &staging))
	resp, body = testenv.Do(t, r.client[1], "PUT", r.c[1].ImageURL+"/v2/images/"+staging.ID+"/file", adminTok, string(real),
		"Content-Type", "application/octet-stream")
	testenv.MustStatus(t, resp, body, http.StatusNoContent)
	resp, body = testenv.Do(t, r.client[0], "POST", r.c[0].ImageURL+"/v2/images/"+debian+"/actions/nimbus-replace-data",
		testenv.Token(t, r.c[0], cloud.AdminUser), `{"from": "`+staging.ID+`"}`)
	testenv.MustStatus(t, resp, body, http.StatusOK)
	if b := r.download(ctx, 1, debian); !bytes.Equal(b, real) {
		t.Errorf("replaced data through controller 2: %q", b)
	}
	must(t, r.c[1].DB.QueryRow(ctx, "SELECT location FROM images WHERE id = ?", debian).Scan(&loc))
	if !strings.HasSuffix(loc, "/"+staging.ID+"/snap") {
		t.Errorf("replaced image's location %q, want the staging image's", loc)
	}
	if names := r.inPool(testenv.ImagesPool, debian); len(names) > 0 {
		t.Errorf("the placeholder's RBD image is left: %v", names)
	}

	data := make([]byte, 8<<20+4321)
	rand.Read(data)
	id := r.upload(ctx, 0, "region-raw", "raw", data)
	md, sh := md5.Sum(data), sha512.Sum512(data)
	got, err := images.Get(ctx, r.img[1], id).Extract()
	must(t, err)
	if got.Status != images.ImageStatusActive || got.SizeBytes != int64(len(data)) || got.Checksum != hex.EncodeToString(md[:]) ||
		got.Properties["os_hash_value"] != hex.EncodeToString(sh[:]) {
		t.Errorf("through controller 2: status %s size %d checksum %s hash %v", got.Status, got.SizeBytes, got.Checksum, got.Properties["os_hash_value"])
	}
	if b := r.download(ctx, 1, id); !bytes.Equal(b, data) {
		t.Fatalf("download through controller 2: %d bytes, not the %d uploaded through controller 1", len(b), len(data))
	}
	// A byte range through the second controller (glance's 206).
	resp, body = testenv.Do(t, r.client[1], "GET", r.c[1].ImageURL+"/v2/images/"+id+"/file", r.tok[1], "", "Range", "bytes=5000000-5000099")
	testenv.MustStatus(t, resp, body, http.StatusPartialContent)
	if body != string(data[5000000:5000100]) {
		t.Errorf("range through controller 2: %d bytes, not the data's", len(body))
	}
	if names := r.inPool(testenv.ImagesPool, id); len(names) != 1 || names[0] != id {
		t.Errorf("images pool holds %v for the image, want [%s]", names, id)
	}
	if out, err := r.rbd("snap", "ls", "--format", "json", testenv.ImagesPool+"/"+id); err != nil || !strings.Contains(out, `"name":"snap"`) || !strings.Contains(out, `"protected":"true"`) {
		t.Errorf("image's snapshots: %s %v; want snap, protected", out, err)
	}

	// A server asked of the second controller boots on its hosts.
	sv, err := servers.Create(ctx, r.comp[1], servers.CreateOpts{Name: "region-1", ImageRef: id, FlavorRef: "1", Networks: "auto"}, nil).Extract()
	must(t, err)
	waitFor(t, 60*time.Second, "server ACTIVE", func() bool {
		s, err := servers.Get(ctx, r.comp[0], sv.ID).Extract()
		if err == nil && s.Status == "ERROR" {
			t.Fatalf("server: ERROR %v", s.Fault)
		}
		return err == nil && s.Status == "ACTIVE"
	})
	// A server whose flavor's disk is a network disk, asked of the first
	// controller, boots from a volume made for it: a clone of the image,
	// which its host opens in Ceph.
	admin := testenv.Compute(t, testenv.Provider(t, r.c[0], cloud.AdminUser), "2.79")
	one := 1
	fl, err := flavors.Create(ctx, admin, flavors.CreateOpts{Name: "region.net", VCPUs: 1, RAM: 512, Disk: &one}).Extract()
	must(t, err)
	_, err = flavors.CreateExtraSpecs(ctx, admin, fl.ID, flavors.ExtraSpecsOpts{"nimbus:disk_type": "network"}).Extract()
	must(t, err)
	nsv, err := servers.Create(ctx, r.comp[0], servers.CreateOpts{Name: "region-net", ImageRef: id, FlavorRef: fl.ID, Networks: "auto"}, nil).Extract()
	must(t, err)
	var root string
	waitFor(t, 90*time.Second, "network-disk server ACTIVE", func() bool {
		s, err := servers.Get(ctx, r.comp[1], nsv.ID).Extract()
		if err == nil && s.Status == "ERROR" {
			t.Fatalf("network-disk server: ERROR %v", s.Fault)
		}
		if err == nil && len(s.AttachedVolumes) == 1 {
			root = s.AttachedVolumes[0].ID
		}
		return err == nil && s.Status == "ACTIVE"
	})
	if p := r.parent(testenv.VolumesPool + "/volume-" + root); p != testenv.ImagesPool+"/"+id+"@snap" {
		t.Errorf("network disk's parent %q, want the image's snapshot", p)
	}
	must(t, servers.Delete(ctx, r.comp[0], nsv.ID).ExtractErr())
	r.waitVolume(ctx, 1, root, "deleted")

	// Its snapshot, stored by the host through the second controller,
	// reads back through the first.
	snapID, err := servers.CreateImage(ctx, r.comp[1], sv.ID, servers.CreateImageOpts{Name: "region-snap"}).ExtractImageID()
	must(t, err)
	waitFor(t, 60*time.Second, "snapshot active", func() bool {
		im, err := images.Get(ctx, r.img[0], snapID).Extract()
		return err == nil && im.Status == images.ImageStatusActive
	})
	if b := r.download(ctx, 0, snapID); len(b) != 1<<20 || !bytes.Equal(b, make([]byte, 1<<20)) {
		t.Errorf("snapshot through controller 1: %d bytes, want the fake host's 1 MiB of zeros", len(b))
	}

	// A volume of the raw image, asked of the second controller, is a
	// clone of the image's snapshot: nothing copied.
	v, err := volumes.Create(ctx, r.vol[1], volumes.CreateOpts{Size: 1, Name: "from-image", ImageID: id}, nil).Extract()
	must(t, err)
	r.waitVolume(ctx, 0, v.ID, "available")
	if p := r.parent(testenv.VolumesPool + "/volume-" + v.ID); p != testenv.ImagesPool+"/"+id+"@snap" {
		t.Errorf("volume's parent %q, want the image's snapshot", p)
	}
	head, err := exec.Command("sh", "-c", `rbd --conf "$0" --keyring "$1" --id "$2" export --no-progress "$3" - | head -c "$4"`,
		r.ceph.Conf, r.ceph.Keyring, r.ceph.Client, testenv.VolumesPool+"/volume-"+v.ID, "8392929").Output()
	if err != nil || !bytes.Equal(head, data) {
		t.Errorf("volume's first bytes (%d, %v) are not the image's", len(head), err)
	}

	// The clone keeps the image: 409 through either controller, and its
	// data stays whole.
	for i := range r.c {
		err := images.Delete(ctx, r.img[i], id).ExtractErr()
		if !gophercloud.ResponseCodeIs(err, http.StatusConflict) || !strings.Contains(err.Error(), "in use") {
			t.Errorf("delete through controller %d with a volume cloned from it: %v, want 409 in use", i+1, err)
		}
		// The volumes may be another project's: not named.
		if err != nil && (strings.Contains(err.Error(), v.ID) || strings.Contains(err.Error(), testenv.VolumesPool+"/")) {
			t.Errorf("the 409 names the volumes: %v", err)
		}
	}
	if b := r.download(ctx, 0, id); !bytes.Equal(b, data) {
		t.Errorf("after the refused delete: %d bytes", len(b))
	}

	// A qcow2 image makes a volume by conversion, not a clone.
	qcow := qcow2Image(t)
	qid := r.upload(ctx, 1, "region-qcow2", "qcow2", qcow)
	qv, err := volumes.Create(ctx, r.vol[0], volumes.CreateOpts{Size: 1, Name: "from-qcow2", ImageID: qid}, nil).Extract()
	must(t, err)
	r.waitVolume(ctx, 1, qv.ID, "available")
	if p := r.parent(testenv.VolumesPool + "/volume-" + qv.ID); p != "" {
		t.Errorf("volume of a qcow2 image has parent %q, want a copy", p)
	}
	mark, err := exec.Command("sh", "-c", `rbd --conf "$0" --keyring "$1" --id "$2" export --no-progress "$3" - | tail -c +1048577 | head -c 6`,
		r.ceph.Conf, r.ceph.Keyring, r.ceph.Client, testenv.VolumesPool+"/volume-"+qv.ID).Output()
	if err != nil || string(mark) != "nnnnnn" {
		t.Errorf("converted volume at 1 MiB: %q, %v; want the qcow2's data", mark, err)
	}

	// Deleting the volumes frees the image; each controller removes what
	// it is asked to, from the pool.
	for _, vid := range []string{v.ID, qv.ID} {
		must(t, volumes.Delete(ctx, r.vol[1], vid, nil).ExtractErr())
		r.waitVolume(ctx, 0, vid, "deleted")
	}
	must(t, images.Delete(ctx, r.img[1], id).ExtractErr())
	must(t, images.Delete(ctx, r.img[0], qid).ExtractErr())
	for _, gone := range []string{id, qid} {
		if names := r.inPool(testenv.ImagesPool, gone); len(names) > 0 {
			t.Errorf("deleted image %s still in the pool: %v", gone, names)
		}
		if _, err := images.Get(ctx, r.img[0], gone).Extract(); !gophercloud.ResponseCodeIs(err, http.StatusNotFound) {
			t.Errorf("deleted image %s: %v, want 404", gone, err)
		}
	}

	// An upload cut short: the image is queued again and nothing of it
	// is in the pool.
	cut, err := images.Create(ctx, r.img[0], images.CreateOpts{Name: "cut", DiskFormat: "raw", ContainerFormat: "bare"}).Extract()
	must(t, err)
	rctx, cancel := context.WithCancel(ctx)
	pr, pw := io.Pipe()
	go func() {
		pw.Write(data[:4<<20])
		time.Sleep(500 * time.Millisecond)
		cancel() // the client hangs up mid-upload
		pw.CloseWithError(errors.New("cut"))
	}()
	req, _ := http.NewRequestWithContext(rctx, "PUT", r.c[0].ImageURL+"/v2/images/"+cut.ID+"/file", pr)
	req.Header.Set("X-Auth-Token", r.tok[0])
	req.Header.Set("Content-Type", "application/octet-stream")
	if resp, err := r.client[0].Do(req); err == nil {
		resp.Body.Close()
		t.Fatalf("a cut upload answered %d", resp.StatusCode)
	}
	waitFor(t, 15*time.Second, "the cut upload undone", func() bool {
		im, err := images.Get(ctx, r.img[1], cut.ID).Extract()
		return err == nil && im.Status == images.ImageStatusQueued && len(r.inPool(testenv.ImagesPool, cut.ID)) == 0
	})

	// Data a controller killed mid-upload left staged goes at the next
	// start of any controller, once the image is not saving.
	f := filepath.Join(t.TempDir(), "partial")
	must(t, os.WriteFile(f, data[:1<<20], 0o600))
	staged := testenv.ImagesPool + "/" + cut.ID + ".upload.00112233445566ff"
	if _, err := r.rbd("import", "--no-progress", f, staged); err != nil {
		t.Fatalf("rbd import: %v", err)
	}
	must(t, r.c[1].Images.Bootstrap(ctx))
	if names := r.inPool(testenv.ImagesPool, cut.ID); len(names) > 0 {
		t.Errorf("staged data of an ended upload still in the pool after a start: %v", names)
	}

	// A controller stopped between putting an upload's data under the
	// image's id and recording it left the image saving: deleting the
	// image takes that data too.
	stuck, err := images.Create(ctx, r.img[0], images.CreateOpts{Name: "stuck", DiskFormat: "raw", ContainerFormat: "bare"}).Extract()
	must(t, err)
	if _, err := r.c[0].DB.Exec(ctx, "UPDATE images SET status = 'saving' WHERE id = ?", stuck.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := r.rbd("import", "--no-progress", f, testenv.ImagesPool+"/"+stuck.ID); err != nil {
		t.Fatalf("rbd import: %v", err)
	}
	if _, err := r.rbd("snap", "create", testenv.ImagesPool+"/"+stuck.ID+"@snap"); err != nil {
		t.Fatalf("rbd snap create: %v", err)
	}
	must(t, images.Delete(ctx, r.img[1], stuck.ID).ExtractErr())
	if names := r.inPool(testenv.ImagesPool, stuck.ID); len(names) > 0 {
		t.Errorf("a deleted saving image's data is left in the pool: %v", names)
	}

	// What a controller of the region keeps of its own: docs/operator.md's
	// list, and nothing another controller needs.
	perController(t, r.c[0].Config.DataDir)
}

// perController fails the test for any file in a region controller's data
// directory (no local agent, images and volumes in Ceph) that the
// docs/operator.md's list of per-controller files does not name: anything else
// there would be state the other controllers cannot reach.
func perController(t *testing.T, dir string) {
	t.Helper()
	listed := map[string]bool{
		"ca.pem": true, "ca-key.pem": true, // the region's CA, copied to every controller
		"server.pem": true, "server-key.pem": true, // this controller's certificate
		"secrets.json": true, "clouds.yaml": true, "admin-openrc.sh": true, "demo-openrc.sh": true, // first accounts, client files
		"controller-id": true, // its name as a holder of leases
	}
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || path == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		if d.IsDir() {
			// The file stores' directories, empty with both backends in Ceph.
			switch rel {
			case "images", "volumes", "backups", "exports":
				return nil
			}
		}
		if !listed[rel] {
			t.Errorf("controller's data directory holds %s, which no list of per-controller files names", rel)
		}
		return nil
	})
	must(t, err)
}

// qcow2Image is a small qcow2 image of 64 MiB whose data at 1 MiB reads
// "nnnn…" (4 KiB of 0x6e).
func qcow2Image(t *testing.T) []byte {
	t.Helper()
	path := filepath.Join(t.TempDir(), "disk.qcow2")
	for _, c := range [][]string{
		{"qemu-img", "create", "-q", "-f", "qcow2", path, "64M"},
		{"qemu-io", "-f", "qcow2", "-c", "write -P 0x6e 1M 4k", path},
	} {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v\n%s", c, err, out)
		}
	}
	b, err := os.ReadFile(path)
	must(t, err)
	return b
}

// TestRegionImagesQEMU: a real VM asked of the second controller boots
// on its host an image uploaded through the first. The host, which has
// the Ceph client's key for its volumes, reads the image's disk, kernel
// and initrd from Ceph itself, into its cache (checked against the
// image's multihash), and the guest comes up.
func TestRegionImagesQEMU(t *testing.T) {
	guest := testenv.TestGuest(t)
	dir := vmDir(t)
	logs := &syncbuf.Buffer{}
	r := startImageRegion(t, func(cfg *cloud.Config) {
		cfg.DataDir = dir
		cfg.Driver = "qemu"
		cfg.QEMU = cloud.QEMUOptions{Accel: "auto", ReservedCPUs: []int{}, ReservedMemoryMB: -1, AccessHost: "127.0.0.1",
			Log: slog.New(slog.NewTextHandler(logs, nil))}
		cfg.AgentHeartbeat = 2 * time.Second
	})
	ctx := context.Background()
	q := &qemuCloud{t: t, c: r.c[0], guest: guest, image: r.img[0], compute: r.comp[1],
		admin: testenv.Provider(t, r.c[0], cloud.AdminUser), demo: testenv.Provider(t, r.c[0], cloud.DemoUser)}
	signer, pub := testenv.NewSSHKey(t)
	q.key = signer
	if _, err := keypairs.Create(ctx, q.compute, keypairs.CreateOpts{Name: "e2e", PublicKey: pub}).Extract(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	img := q.uploadGuest(ctx)
	t.Logf("guest uploaded through controller 1 in %v", time.Since(start).Round(time.Millisecond))
	got, err := images.Get(ctx, r.img[1], img).Extract()
	must(t, err)
	sv := q.create(ctx, "region-vm", img, q.flavor(ctx, "e2e.region", 1, 256, 1))
	t.Logf("ACTIVE through the second controller %v after the upload", time.Since(start).Round(time.Millisecond))
	cached := filepath.Join(dir, "qemu", "images", "sha512-"+got.Properties["os_hash_value"].(string))
	if fi, err := os.Stat(cached); err != nil || fi.Size() != got.SizeBytes {
		t.Errorf("the host's cache of the image: %v (%v), want %d bytes", fi, err, got.SizeBytes)
	}
	if id := q.ssh(ctx, sv.ID, "cat /var/lib/nimbus-instance-id"); id != sv.ID {
		t.Errorf("guest says instance %q, want %s", id, sv.ID)
	}
	for _, id := range []string{img, got.Properties["kernel_id"].(string), got.Properties["ramdisk_id"].(string)} {
		if !strings.Contains(logs.String(), `msg="qemu: image read from Ceph" image=`+id) {
			t.Errorf("the host did not read image %s from Ceph; its log:\n%s", id, logs.String())
		}
	}
	if strings.Contains(logs.String(), "not read from Ceph") {
		t.Errorf("the host fell back to downloading:\n%s", logs.String())
	}
}

// BenchmarkImageData measures image upload and download through the
// image API (HTTPS, gophercloud) on the file and the rbd image backends,
// 256 MiB of random raw data a time, and making a 1 GiB volume of such an
// image on the rbd volume backend (a copy from the file store, a clone
// from Ceph): go test ./test/e2e -run '^$' -bench ImageData -benchtime 3x
// (with Ceph installed).
func BenchmarkImageData(b *testing.B) {
	const size = 256 << 20
	data := make([]byte, size)
	rand.Read(data)
	ceph := testenv.StartCeph(b)
	for _, backend := range []string{image.BackendFile, image.BackendRBD} {
		b.Run(backend, func(b *testing.B) {
			c := testenv.StartCloud(b, "", func(cfg *cloud.Config) {
				cfg.NoLocalAgent = true
				cfg.Volumes = cloud.VolumeOptions{Backend: cloud.VolumeBackendRBD, RBD: cloud.RBDOptions{
					Conf: ceph.Conf, Keyring: ceph.Keyring, User: ceph.Client, Pool: testenv.VolumesPool, BackupPool: testenv.BackupsPool}}
				cfg.ImageData = cloud.ImageOptions{Backend: backend, Pool: testenv.ImagesPool}
			})
			pc := testenv.Provider(b, c, cloud.AdminUser)
			sc, err := openstack.NewImageV2(pc, gophercloud.EndpointOpts{})
			if err != nil {
				b.Fatal(err)
			}
			bs, err := openstack.NewBlockStorageV3(pc, gophercloud.EndpointOpts{})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			var ids []string
			b.Run("upload", func(b *testing.B) {
				b.SetBytes(size)
				for range b.N {
					img, err := images.Create(ctx, sc, images.CreateOpts{Name: "bench", DiskFormat: "raw", ContainerFormat: "bare"}).Extract()
					if err != nil {
						b.Fatal(err)
					}
					if err := imagedata.Upload(ctx, sc, img.ID, bytes.NewReader(data)).ExtractErr(); err != nil {
						b.Fatal(err)
					}
					ids = append(ids, img.ID)
				}
			})
			b.Run("download", func(b *testing.B) {
				b.SetBytes(size)
				for i := range b.N {
					rc, err := imagedata.Download(ctx, sc, ids[i%len(ids)]).Extract()
					if err != nil {
						b.Fatal(err)
					}
					n, err := io.Copy(io.Discard, rc)
					rc.Close()
					if err != nil || n != size {
						b.Fatalf("downloaded %d bytes: %v", n, err)
					}
				}
			})
			b.Run("volume", func(b *testing.B) {
				b.SetBytes(size)
				for i := range b.N {
					v, err := volumes.Create(ctx, bs, volumes.CreateOpts{Size: 1, ImageID: ids[i%len(ids)]}, nil).Extract()
					if err != nil {
						b.Fatal(err)
					}
					for {
						got, err := volumes.Get(ctx, bs, v.ID).Extract()
						if err != nil || got.Status == "error" {
							b.Fatalf("volume: %v %+v", err, got)
						}
						if got.Status == "available" {
							break
						}
						time.Sleep(20 * time.Millisecond)
					}
				}
			})
		})
	}
}
