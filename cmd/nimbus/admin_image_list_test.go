package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/imagedata"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/images"

	"nimbus/internal/cloud"
	"nimbus/internal/imagecatalog"
	"nimbus/internal/testenv"
)

// TestImageList lists a new cloud's images: every catalog image is a
// placeholder ("real" no) with its distro and login user, an uploaded
// image is real; and Glance's custom property filter lists the
// placeholders alone, as "openstack image list --property
// nimbus_placeholder=true" asks.
func TestImageList(t *testing.T) {
	clearOpenStackEnv(t)
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		c := testenv.StartCloud(t, dbURL)
		ctx := context.Background()
		admin := imageClient(t, c, cloud.AdminUser)
		up, err := images.Create(ctx, admin, images.CreateOpts{Name: "mine", DiskFormat: "raw", ContainerFormat: "bare",
			Properties: map[string]string{"os_distro": "alpine", "login_user": "alpine"}}).Extract()
		if err != nil {
			t.Fatal(err)
		}
		if err := imagedata.Upload(ctx, admin, up.ID, strings.NewReader("a real disk\n")).ExtractErr(); err != nil {
			t.Fatal(err)
		}

		var out, errOut bytes.Buffer
		if err := runAdmin(ctx, []string{"image", "list", "--data-dir", c.Config.DataDir, "--json"}, &out, &errOut); err != nil {
			t.Fatalf("image list: %v (%s)", err, errOut.String())
		}
		var got struct{ Images []listedImage }
		if err := json.Unmarshal(out.Bytes(), &got); err != nil {
			t.Fatalf("%v: %s", err, out.String())
		}
		byID := map[string]listedImage{}
		for _, r := range got.Images {
			byID[r.ID] = r
		}
		want := map[string]listedImage{up.ID: {ID: up.ID, Name: "mine", Status: "active", Size: 12, Real: true, OSDistro: "alpine", LoginUser: "alpine"}}
		for _, ci := range imagecatalog.Images {
			id := imagecatalog.ID(ci.Name)
			want[id] = listedImage{ID: id, Name: ci.Name, Status: "active", Size: 1 << 20, OSDistro: ci.Distro, LoginUser: ci.LoginUser}
		}
		for id, w := range want {
			if byID[id] != w {
				t.Errorf("image %s: %+v, want %+v", id, byID[id], w)
			}
		}

		out.Reset()
		if err := runAdmin(ctx, []string{"image", "list", "--data-dir", c.Config.DataDir}, &out, &errOut); err != nil {
			t.Fatal(err)
		}
		for _, line := range []string{"mine", "Ubuntu 24.04"} {
			if !strings.Contains(out.String(), line) {
				t.Errorf("table does not list %q:\n%s", line, out.String())
			}
		}
		if !strings.HasPrefix(out.String(), "ID") || !strings.Contains(out.String(), "REAL") {
			t.Errorf("table header:\n%s", out.String())
		}

		var filtered struct{ Images []images.Image }
		if _, err := admin.Get(ctx, admin.ServiceURL("images")+"?nimbus_placeholder=true", &filtered, nil); err != nil {
			t.Fatal(err)
		}
		if len(filtered.Images) != len(imagecatalog.Images) {
			t.Errorf("?nimbus_placeholder=true lists %d images, want the %d of the catalog", len(filtered.Images), len(imagecatalog.Images))
		}
		for _, im := range filtered.Images {
			if im.ID == up.ID {
				t.Errorf("the filter lists the real image")
			}
		}
	})
}
