package volume_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"

	img "nimbus/internal/image"
	"nimbus/internal/testenv"
)

// TestUploadImage: os-volume_upload_image makes a private image of the
// owner's with the volume's bytes, raw or converted to qcow2, while the
// volume is uploading, and gives the volume back available; what Cinder
// refuses is refused with its status and nothing changes.
func TestUploadImage(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		e := newEnv(t, dbURL)
		ctx := context.Background()
		vol := e.newVolume(t, 1)
		pattern := []byte("nimbus upload " + vol)
		f, err := os.OpenFile(filepath.Join(e.c.Config.DataDir, "volumes", vol), os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteAt(pattern, 1<<20); err != nil {
			t.Fatal(err)
		}
		f.Close()
		action := "/v3/volumes/" + vol + "/action"

		// upload asks for an image and waits for it to be active and the
		// volume available again; it returns the image.
		upload := func(body string) *img.Image {
			t.Helper()
			m := e.want(t, 202, "POST", action, e.demoTok, body)["os-volume_upload_image"].(map[string]any)
			id, _ := m["image_id"].(string)
			if m["id"] != vol || m["status"] != "uploading" || id == "" || m["volume_type"] == nil {
				t.Fatalf("upload answer %v", m)
			}
			var got *img.Image
			testenv.Eventually(t, 30*time.Second, "image "+id+" active", func() bool {
				got, err = e.c.Images.Get(ctx, e.demoProj, false, id)
				return err == nil && got.Status == img.StatusActive
			})
			waitStatus(t, e.demo, vol, "available")
			if got.Owner != e.demoProj || got.Visibility != img.Private || got.MinDisk != 1 {
				t.Errorf("image %+v", got)
			}
			return got
		}

		raw := upload(`{"os-volume_upload_image":{"image_name":"from-volume"}}`)
		if raw.Name != "from-volume" || raw.DiskFormat != "raw" || raw.ContainerFormat != "bare" {
			t.Errorf("raw image %+v", raw)
		}
		if got, size := readAt(t, e.c.Images.DataPath(raw.ID), 1<<20, len(pattern)); size != 1<<30 || !bytes.Equal(got, pattern) {
			t.Errorf("raw image: %d bytes, %q at 1 MiB", size, got)
		}

		q := upload(`{"os-volume_upload_image":{"image_name":"as-qcow2","disk_format":"qcow2","container_format":"bare","force":false}}`)
		out, err := exec.Command("qemu-img", "info", "--output", "json", e.c.Images.DataPath(q.ID)).Output()
		if err != nil {
			t.Fatal(err)
		}
		var info struct {
			Format      string `json:"format"`
			VirtualSize int64  `json:"virtual-size"`
		}
		if err := json.Unmarshal(out, &info); err != nil || info.Format != "qcow2" || info.VirtualSize != 1<<30 {
			t.Errorf("qcow2 image: %+v %v", info, err)
		}
		back := filepath.Join(t.TempDir(), "back.raw")
		if out, err := exec.Command("qemu-img", "convert", "-f", "qcow2", "-O", "raw", e.c.Images.DataPath(q.ID), back).CombinedOutput(); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		if got, _ := readAt(t, back, 1<<20, len(pattern)); !bytes.Equal(got, pattern) {
			t.Errorf("the qcow2 image has %q at 1 MiB, not the volume's bytes", got)
		}

		// Refusals, each leaving the volume available.
		attached := e.newVolume(t, 1)
		e.want(t, 202, "POST", "/v3/volumes/"+attached+"/action", e.demoTok, `{"os-reserve":{}}`)
		e.want(t, 202, "POST", "/v3/volumes/"+attached+"/action", e.demoTok,
			`{"os-attach":{"instance_uuid":"`+uuid.NewString()+`","mountpoint":"/dev/vdb"}}`)
		for _, c := range []struct {
			name, tok, vol, body string
			status               int
		}{
			{"no image name", e.demoTok, vol, `{"os-volume_upload_image":{}}`, 400},
			{"an unknown disk format", e.demoTok, vol, `{"os-volume_upload_image":{"image_name":"x","disk_format":"iso"}}`, 400},
			{"a container format", e.demoTok, vol, `{"os-volume_upload_image":{"image_name":"x","container_format":"ovf"}}`, 400},
			{"made public", e.demoTok, vol, `{"os-volume_upload_image":{"image_name":"x","visibility":"public"}}`, 400},
			{"an unknown field", e.demoTok, vol, `{"os-volume_upload_image":{"image_name":"x","size":3}}`, 400},
			{"force not a boolean", e.demoTok, vol, `{"os-volume_upload_image":{"image_name":"x","force":"maybe"}}`, 400},
			{"an unknown volume", e.demoTok, uuid.NewString(), `{"os-volume_upload_image":{"image_name":"x"}}`, 404},
			{"in use", e.demoTok, attached, `{"os-volume_upload_image":{"image_name":"x"}}`, 400},
			{"in use, forced", e.demoTok, attached, `{"os-volume_upload_image":{"image_name":"x","force":true}}`, 400},
		} {
			t.Run(c.name, func(t *testing.T) {
				images := func() (n int) {
					if err := e.c.DB.QueryRow(ctx, "SELECT COUNT(*) FROM images").Scan(&n); err != nil {
						t.Fatal(err)
					}
					return n
				}
				before := images()
				e.want(t, c.status, "POST", "/v3/volumes/"+c.vol+"/action", c.tok, c.body)
				if after := images(); after != before {
					t.Errorf("images %d → %d", before, after)
				}
			})
		}
		if v := waitStatus(t, e.demo, vol, "available"); v.Status != "available" {
			t.Errorf("volume %s after the refusals", v.Status)
		}
	})
}

// readAt reads n bytes of file at off, and its size.
func readAt(t *testing.T, file string, off int64, n int) ([]byte, int64) {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, n)
	k, _ := f.ReadAt(b, off)
	return b[:k], fi.Size()
}

// TestUploadKeepsLicence: a volume made from a Windows image, uploaded to
// an image of the customer's own, keeps the Windows licence its servers
// pay for (the image service keeps it through any relabelling).
func TestUploadKeepsLicence(t *testing.T) {
	e := newEnv(t, "")
	ctx := context.Background()
	resp, raw := testenv.Do(t, e.http, "POST", e.c.ImageURL+"/v2/images", e.adTok,
		`{"name":"win","disk_format":"raw","container_format":"bare","visibility":"public","os_type":"windows"}`)
	testenv.MustStatus(t, resp, raw, 201)
	var win struct{ ID string }
	if err := json.Unmarshal([]byte(raw), &win); err != nil {
		t.Fatal(err)
	}
	resp, raw = testenv.Do(t, e.http, "PUT", e.c.ImageURL+"/v2/images/"+win.ID+"/file", e.adTok,
		string(make([]byte, 1<<20)), "Content-Type", "application/octet-stream")
	testenv.MustStatus(t, resp, raw, 204)
	m := e.want(t, 202, "POST", "/v3/volumes", e.demoTok, `{"volume":{"size":1,"imageRef":"`+win.ID+`"}}`)
	vol := m["volume"].(map[string]any)["id"].(string)
	waitStatus(t, e.demo, vol, "available")
	up := e.want(t, 202, "POST", "/v3/volumes/"+vol+"/action", e.demoTok,
		`{"os-volume_upload_image":{"image_name":"mine"}}`)["os-volume_upload_image"].(map[string]any)
	id := up["image_id"].(string)
	var got *img.Image
	testenv.Eventually(t, 30*time.Second, "image "+id+" active", func() bool {
		var err error
		got, err = e.c.Images.Get(ctx, e.demoProj, false, id)
		return err == nil && got.Status == img.StatusActive
	})
	if got.Licence != img.LicenceWindows {
		t.Errorf("the uploaded image's licence is %q, want %q", got.Licence, img.LicenceWindows)
	}
}
