package image_test

import (
	"context"
	"testing"

	"nimbus/internal/imagecatalog"
	"nimbus/internal/testenv"
)

// TestCatalogGuestAgent: the images whose vendor ships qemu-guest-agent say
// so (hw_qemu_guest_agent=yes), the others do not claim it.
func TestCatalogGuestAgent(t *testing.T) {
	c := testenv.StartCloud(t, "")
	ctx := context.Background()
	for _, ci := range imagecatalog.Images {
		img, err := c.Images.Get(ctx, "", true, imagecatalog.ID(ci.Name))
		if err != nil {
			t.Fatal(err)
		}
		want := ""
		if ci.GuestAgent {
			want = "yes"
		}
		if got := img.Properties["hw_qemu_guest_agent"]; got != want {
			t.Errorf("%s: hw_qemu_guest_agent %q, want %q", ci.Name, got, want)
		}
	}
	for _, name := range []string{"CentOS Stream 9", "Fedora 41"} {
		if img, _ := c.Images.Get(ctx, "", true, imagecatalog.ID(name)); img.Properties["hw_qemu_guest_agent"] != "yes" {
			t.Errorf("%s: no hw_qemu_guest_agent", name)
		}
	}
}
