package image_test

import (
	"context"
	"net/url"
	"strings"
	"testing"

	"nimbus/internal/image"
	"nimbus/internal/testenv"
)

// TestPlaceholderFix: the command a placeholder's boot fault gives is the
// build for Debian 12, the vendor's image with its checksum list for the
// other base images, and the operator's own file for Windows and the
// marketplace; an image found by name only gets its catalog entry's.
func TestPlaceholderFix(t *testing.T) {
	for _, tc := range []struct{ id, name, want string }{
		{image.CatalogID("Debian 12"), "Debian 12", "nimbus admin image build debian-12"},
		{image.CatalogID("Ubuntu 24.04"), "Ubuntu 24.04", `nimbus admin image import --replace --name "Ubuntu 24.04" ` +
			"--checksums https://cloud-images.ubuntu.com/noble/current/SHA256SUMS https://cloud-images.ubuntu.com/noble/current/noble-server-cloudimg-amd64.img"},
		{"other-id", "Fedora 41", `nimbus admin image import --replace --name "Fedora 41" --checksums ` +
			"https://download.fedoraproject.org/pub/fedora/linux/releases/41/Cloud/x86_64/images/Fedora-Cloud-41-1.4-x86_64-CHECKSUM " +
			"https://download.fedoraproject.org/pub/fedora/linux/releases/41/Cloud/x86_64/images/Fedora-Cloud-Base-Generic-41-1.4.x86_64.qcow2"},
		{image.CatalogID("Windows Server 2022"), "Windows Server 2022", `nimbus admin image import --replace --name "Windows Server 2022" <image file>`},
		{image.CatalogID("WordPress on Debian 12"), "WordPress on Debian 12", `nimbus admin image import --replace --name "WordPress on Debian 12" <image file>`},
	} {
		if got := image.PlaceholderFix(tc.id, tc.name); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestCatalogVendors: every Linux base image names its vendor's cloud image
// and checksum list on the vendor's own host, and says its login.
func TestCatalogVendors(t *testing.T) {
	hosts := map[string]string{"ubuntu": "cloud-images.ubuntu.com", "debian": "cloud.debian.org", "centos": "cloud.centos.org",
		"fedora": "download.fedoraproject.org", "opensuse": "download.opensuse.org"}
	for _, ci := range image.Catalog {
		if ci.OSType != "linux" || ci.MarketplaceOf != "" {
			if ci.SourceURL != "" {
				t.Errorf("%s: a vendor URL for an image built by the operator", ci.Name)
			}
			continue
		}
		for _, raw := range []string{ci.SourceURL, ci.ChecksumsURL} {
			u, err := url.Parse(raw)
			if err != nil || u.Scheme != "https" || u.Host != hosts[ci.Distro] {
				t.Errorf("%s: %q is not on %s over https", ci.Name, raw, hosts[ci.Distro])
			}
		}
		if ci.LoginUser == "" || ci.LoginProtocol != "ssh" || ci.Version == "" || !strings.Contains(ci.Name, ci.Version) {
			t.Errorf("%s: login %q/%q, version %q", ci.Name, ci.LoginProtocol, ci.LoginUser, ci.Version)
		}
	}
}

// TestCatalogGuestAgent: the images whose vendor ships qemu-guest-agent say
// so (hw_qemu_guest_agent=yes), the others do not claim it.
func TestCatalogGuestAgent(t *testing.T) {
	c := testenv.StartCloud(t, "")
	ctx := context.Background()
	for _, ci := range image.Catalog {
		img, err := c.Images.Get(ctx, "", true, image.CatalogID(ci.Name))
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
		if img, _ := c.Images.Get(ctx, "", true, image.CatalogID(name)); img.Properties["hw_qemu_guest_agent"] != "yes" {
			t.Errorf("%s: no hw_qemu_guest_agent", name)
		}
	}
}
