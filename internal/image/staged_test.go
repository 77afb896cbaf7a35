package image_test

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/images"
)

// TestStagedSweep: data an upload was writing when its controller
// stopped is not left forever. A start removes staged files of images
// that are not saving (queued again, or gone); those of an upload still
// running stay; deleting a saving image removes its staged data, and the
// upload that was writing it ends with Glance's 410.
func TestStagedSweep(t *testing.T) {
	e := newEnv(t, "")
	ctx := context.Background()
	dir := filepath.Dir(e.c.Images.DataPath(uuid.NewString()))
	queued, err := images.Create(ctx, e.demo, images.CreateOpts{Name: "queued", DiskFormat: "raw", ContainerFormat: "bare"}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	saving, err := images.Create(ctx, e.demo, images.CreateOpts{Name: "saving", DiskFormat: "raw", ContainerFormat: "bare"}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	// An upload that runs until the test ends it.
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest("PUT", e.c.ImageURL+"/v2/images/"+saving.ID+"/file", pr)
		req.Header.Set("X-Auth-Token", e.demoTok)
		req.Header.Set("Content-Type", "application/octet-stream")
		resp, err := e.http.Do(req)
		if err != nil {
			done <- 0
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	pw.Write(make([]byte, 64<<10))
	running := waitStaged(t, dir, saving.ID)

	// What a stopped controller left: staged data of a queued image and
	// of one that is gone.
	left := []string{
		filepath.Join(dir, ".upload-"+queued.ID+"-4242"),
		filepath.Join(dir, ".upload-"+uuid.NewString()+"-4243"),
	}
	for _, f := range left {
		if err := os.WriteFile(f, []byte("partial"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.c.Images.Bootstrap(ctx); err != nil {
		t.Fatal(err)
	}
	for _, f := range left {
		if _, err := os.Stat(f); !os.IsNotExist(err) {
			t.Errorf("%s still there after a start (%v)", filepath.Base(f), err)
		}
	}
	if _, err := os.Stat(running); err != nil {
		t.Errorf("a running upload's data was swept: %v", err)
	}

	if err := images.Delete(ctx, e.demo, saving.ID).ExtractErr(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(running); !os.IsNotExist(err) {
		t.Errorf("the deleted image's staged data is still there (%v)", err)
	}
	pw.Close()
	select {
	case code := <-done:
		if code != http.StatusGone {
			t.Errorf("the upload of a deleted image answered %d, want 410", code)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the upload did not end")
	}
	if m, _ := filepath.Glob(filepath.Join(dir, ".upload-*")); len(m) > 0 {
		t.Errorf("staged data left: %v", m)
	}
}

// waitStaged waits for the staged file of image id's upload.
func waitStaged(t *testing.T, dir, id string) string {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if m, _ := filepath.Glob(filepath.Join(dir, ".upload-"+id+"-*")); len(m) == 1 {
			return m[0]
		}
	}
	t.Fatalf("no staged file for %s", id)
	return ""
}
