// Package imagecatalog is the stock images a cloud registers on its first
// start: their names, properties and vendors' sources, their stable ids,
// and what an operator runs to put a real image in place of one's
// placeholder. It holds data only, so that the hypervisor drivers can name
// that command without importing the image service and its store.
package imagecatalog

import (
	"fmt"

	"github.com/google/uuid"
)

// Image is one base or marketplace image, registered on a cloud's first start.
type Image struct {
	Name            string
	OSType          string // linux or windows
	Distro, Version string
	LoginProtocol   string // ssh or rdp
	LoginUser       string
	MinDisk, MinRAM int
	MarketplaceOf   string // base image name for marketplace images
	// GuestAgent is true when the vendor's image ships qemu-guest-agent
	// enabled (hw_qemu_guest_agent=yes).
	GuestAgent bool
	// SourceURL and ChecksumsURL are the vendor's own cloud image and its
	// checksum list: what import fetches in place of the placeholder, and
	// what docs/operator.md and a placeholder's boot fault name.
	SourceURL, ChecksumsURL string
	ExtraProperties         map[string]string
}

// Images are the spec's base images and a few marketplace images.
var Images = []Image{
	{Name: "Windows Server 2019", OSType: "windows", Distro: "windows", Version: "2019", LoginProtocol: "rdp", LoginUser: "Administrator", MinDisk: 40, MinRAM: 2048},
	{Name: "Windows Server 2022", OSType: "windows", Distro: "windows", Version: "2022", LoginProtocol: "rdp", LoginUser: "Administrator", MinDisk: 40, MinRAM: 2048},
	{Name: "Ubuntu 24.04", OSType: "linux", Distro: "ubuntu", Version: "24.04", LoginProtocol: "ssh", LoginUser: "ubuntu", MinDisk: 10,
		SourceURL:    "https://cloud-images.ubuntu.com/noble/current/noble-server-cloudimg-amd64.img",
		ChecksumsURL: "https://cloud-images.ubuntu.com/noble/current/SHA256SUMS"},
	{Name: "Ubuntu 22.04", OSType: "linux", Distro: "ubuntu", Version: "22.04", LoginProtocol: "ssh", LoginUser: "ubuntu", MinDisk: 10,
		SourceURL:    "https://cloud-images.ubuntu.com/jammy/current/jammy-server-cloudimg-amd64.img",
		ChecksumsURL: "https://cloud-images.ubuntu.com/jammy/current/SHA256SUMS"},
	{Name: "Debian 12", OSType: "linux", Distro: "debian", Version: "12", LoginProtocol: "ssh", LoginUser: "debian", MinDisk: 10,
		SourceURL:    "https://cloud.debian.org/images/cloud/bookworm/latest/debian-12-genericcloud-amd64.qcow2",
		ChecksumsURL: "https://cloud.debian.org/images/cloud/bookworm/latest/SHA512SUMS"},
	{Name: "CentOS Stream 9", OSType: "linux", Distro: "centos", Version: "9", LoginProtocol: "ssh", LoginUser: "cloud-user", MinDisk: 10, GuestAgent: true,
		SourceURL:    "https://cloud.centos.org/centos/9-stream/x86_64/images/CentOS-Stream-GenericCloud-9-latest.x86_64.qcow2",
		ChecksumsURL: "https://cloud.centos.org/centos/9-stream/x86_64/images/CentOS-Stream-GenericCloud-9-latest.x86_64.qcow2.SHA256SUM"},
	{Name: "Fedora 41", OSType: "linux", Distro: "fedora", Version: "41", LoginProtocol: "ssh", LoginUser: "fedora", MinDisk: 10, GuestAgent: true,
		SourceURL:    "https://download.fedoraproject.org/pub/fedora/linux/releases/41/Cloud/x86_64/images/Fedora-Cloud-Base-Generic-41-1.4.x86_64.qcow2",
		ChecksumsURL: "https://download.fedoraproject.org/pub/fedora/linux/releases/41/Cloud/x86_64/images/Fedora-Cloud-41-1.4-x86_64-CHECKSUM"},
	{Name: "openSUSE Leap 15.6", OSType: "linux", Distro: "opensuse", Version: "15.6", LoginProtocol: "ssh", LoginUser: "opensuse", MinDisk: 10,
		SourceURL:    "https://download.opensuse.org/distribution/leap/15.6/appliances/openSUSE-Leap-15.6-Minimal-VM.x86_64-Cloud.qcow2",
		ChecksumsURL: "https://download.opensuse.org/distribution/leap/15.6/appliances/openSUSE-Leap-15.6-Minimal-VM.x86_64-Cloud.qcow2.sha256"},
	{Name: "Docker CE on Ubuntu 24.04", OSType: "linux", Distro: "ubuntu", Version: "24.04", LoginProtocol: "ssh", LoginUser: "ubuntu", MinDisk: 10, MarketplaceOf: "Ubuntu 24.04"},
	{Name: "WordPress on Debian 12", OSType: "linux", Distro: "debian", Version: "12", LoginProtocol: "ssh", LoginUser: "debian", MinDisk: 10, MarketplaceOf: "Debian 12"},
	{Name: "GitLab CE on Ubuntu 22.04", OSType: "linux", Distro: "ubuntu", Version: "22.04", LoginProtocol: "ssh", LoginUser: "ubuntu", MinDisk: 20, MinRAM: 4096, MarketplaceOf: "Ubuntu 22.04"},
}

// PlaceholderReason is why a placeholder cannot boot.
const PlaceholderReason = "its data is a placeholder, not an operating system"

// PlaceholderFix is the command that puts a real image in place of the
// placeholder of image id (named name): the build for Debian 12, the
// vendor's image for the others with a vendor URL, an operator's own file
// (Windows, marketplace) otherwise.
func PlaceholderFix(id, name string) string {
	ci, ok := Lookup(id, name)
	switch {
	case ok && ci.Name == "Debian 12":
		return "nimbus admin image build debian-12"
	case ok && ci.SourceURL != "":
		return fmt.Sprintf("nimbus admin image import --replace --name %q --checksums %s %s", name, ci.ChecksumsURL, ci.SourceURL)
	}
	return fmt.Sprintf("nimbus admin image import --replace --name %q <image file>", name)
}

// Lookup is the catalog image of id, else of name (an image registered
// under another id).
func Lookup(id, name string) (Image, bool) {
	for _, ci := range Images {
		if ID(ci.Name) == id {
			return ci, true
		}
	}
	for _, ci := range Images {
		if ci.Name == name {
			return ci, true
		}
	}
	return Image{}, false
}

// ID is the stable id of a catalog image: a UUIDv5 of its name, the same
// on every install.
func ID(name string) string {
	return uuid.NewSHA1(uuid.NameSpaceURL, []byte("https://nimbus.invalid/images/"+name)).String()
}
