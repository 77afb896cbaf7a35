package imagecatalog

import (
	"net/url"
	"strings"
	"testing"
)

// TestPlaceholderFix: the command a placeholder's boot fault gives is the
// build for Debian 12, the vendor's image with its checksum list for the
// other base images, and the operator's own file for Windows and the
// marketplace; an image found by name only gets its catalog entry's.
func TestPlaceholderFix(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ id, name, want string }{
		{ID("Debian 12"), "Debian 12", "nimbus admin image build debian-12"},
		{ID("Ubuntu 24.04"), "Ubuntu 24.04", `nimbus admin image import --replace --name "Ubuntu 24.04" ` +
			"--checksums https://cloud-images.ubuntu.com/noble/current/SHA256SUMS https://cloud-images.ubuntu.com/noble/current/noble-server-cloudimg-amd64.img"},
		{"other-id", "Fedora 41", `nimbus admin image import --replace --name "Fedora 41" --checksums ` +
			"https://download.fedoraproject.org/pub/fedora/linux/releases/41/Cloud/x86_64/images/Fedora-Cloud-41-1.4-x86_64-CHECKSUM " +
			"https://download.fedoraproject.org/pub/fedora/linux/releases/41/Cloud/x86_64/images/Fedora-Cloud-Base-Generic-41-1.4.x86_64.qcow2"},
		{ID("Windows Server 2022"), "Windows Server 2022", `nimbus admin image import --replace --name "Windows Server 2022" <image file>`},
		{ID("WordPress on Debian 12"), "WordPress on Debian 12", `nimbus admin image import --replace --name "WordPress on Debian 12" <image file>`},
	} {
		if got := PlaceholderFix(tc.id, tc.name); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestVendors: every Linux base image names its vendor's cloud image
// and checksum list on the vendor's own host, and says its login.
func TestVendors(t *testing.T) {
	t.Parallel()
	hosts := map[string]string{"ubuntu": "cloud-images.ubuntu.com", "debian": "cloud.debian.org", "centos": "cloud.centos.org",
		"fedora": "download.fedoraproject.org", "opensuse": "download.opensuse.org"}
	for _, ci := range Images {
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
