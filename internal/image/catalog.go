package image

import (
	"bytes"
	"context"
	"crypto/md5"
	"crypto/sha512"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"

	"nimbus/internal/metering"
	"nimbus/internal/store"
)

// CatalogImage is one base or marketplace image registered on first start.
type CatalogImage struct {
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

// Catalog is the spec's base images and a few marketplace images.
var Catalog = []CatalogImage{
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
	ci, ok := catalogEntry(id, name)
	switch {
	case ok && ci.Name == "Debian 12":
		return "nimbus admin image build debian-12"
	case ok && ci.SourceURL != "":
		return fmt.Sprintf("nimbus admin image import --replace --name %q --checksums %s %s", name, ci.ChecksumsURL, ci.SourceURL)
	}
	return fmt.Sprintf("nimbus admin image import --replace --name %q <image file>", name)
}

// catalogEntry is the catalog image of id, else of name (an image
// registered under another id).
func catalogEntry(id, name string) (CatalogImage, bool) {
	for _, ci := range Catalog {
		if CatalogID(ci.Name) == id {
			return ci, true
		}
	}
	for _, ci := range Catalog {
		if ci.Name == name {
			return ci, true
		}
	}
	return CatalogImage{}, false
}

// CatalogID is the stable id of a catalog image: a UUIDv5 of its name, the
// same on every install.
func CatalogID(name string) string {
	return uuid.NewSHA1(uuid.NameSpaceURL, []byte("https://nimbus.invalid/images/"+name)).String()
}

// placeholderSize is the size of a catalog image's stand-in data.
const placeholderSize = 1 << 20

// placeholder is the deterministic stand-in data of a catalog image: a
// recognisable text line repeated to 1 MiB.
func placeholder(name string) []byte {
	line := []byte(fmt.Sprintf("NIMBUS PLACEHOLDER IMAGE %q: import the real image before booting it.\n", name))
	return bytes.Repeat(line, placeholderSize/len(line)+1)[:placeholderSize]
}

const bootstrapSetting = "catalog_bootstrapped"

// operatorProject is the id of identity's "admin" project, which the
// catalog belongs to; "" when there is none (or no identity).
func (s *Service) operatorProject(ctx context.Context) (string, error) {
	if s.projects == nil {
		return "", nil
	}
	return s.projects.ProjectID(ctx, "admin")
}

// Bootstrap registers the base and marketplace images once per database as
// public active images, and on every start makes sure the placeholder data
// of those still registered is on disk (the data directory may be new while
// the database is not).
func (s *Service) Bootstrap(ctx context.Context) error {
	owner, err := s.operatorProject(ctx)
	if err != nil {
		return err
	}
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		var done string
		err := tx.QueryRow(ctx, "SELECT value FROM image_settings WHERE name = ?", bootstrapSetting).Scan(&done)
		if err == nil {
			return nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		now := time.Now().UTC().Truncate(time.Second)
		if _, err := tx.Exec(ctx, "INSERT INTO image_settings (name, value) VALUES (?, ?)", bootstrapSetting, store.FormatTime(now)); err != nil {
			return err
		}
		for _, ci := range Catalog {
			img := catalogRecord(ci, owner, now)
			if _, err := getImage(ctx, tx, img.ID); err == nil {
				continue
			} else if !errors.Is(err, store.ErrNotFound) {
				return err
			}
			if err := insertImage(ctx, tx, img); err != nil {
				return err
			}
		}
		return nil
	})
	if errors.Is(err, store.ErrConflict) {
		err = nil // another controller bootstrapped the same database
	}
	if err != nil {
		return err
	}
	if err := s.meterUnmetered(ctx); err != nil {
		return err
	}
	if err := s.ensurePlaceholders(ctx); err != nil {
		return err
	}
	// Housekeeping: a failure here costs space, not service.
	if err := s.sweepStaged(ctx, ""); err != nil {
		s.log.Warn("image store: sweeping data of ended uploads", "error", err)
	}
	return nil
}

// meterUnmetered starts charging, from now, the stored images that have
// no usage period: those stored before images were metered.
func (s *Service) meterUnmetered(ctx context.Context) error {
	return s.db.Tx(ctx, func(tx *store.Tx) error {
		rows, err := tx.Query(ctx, "SELECT "+imageCols+" FROM images WHERE checksum <> '' AND owner <> '' AND visibility <> ? AND "+
			metering.Unmetered("images.id", true), Public)
		if err != nil {
			return err
		}
		var imgs []*Image
		for rows.Next() {
			img, err := scanImage(rows)
			if err != nil {
				rows.Close()
				return err
			}
			imgs = append(imgs, img)
		}
		if err := rows.Close(); err != nil {
			return err
		}
		if err := rows.Err(); err != nil {
			return err
		}
		for _, img := range imgs {
			if err := meter(ctx, tx, img); err != nil {
				return err
			}
		}
		return nil
	})
}

func catalogRecord(ci CatalogImage, owner string, now time.Time) *Image {
	data := placeholder(ci.Name)
	md, sh := md5.Sum(data), sha512.Sum512(data)
	props := map[string]string{
		"os_type": ci.OSType, "os_distro": ci.Distro, "os_version": ci.Version,
		"login_protocol": ci.LoginProtocol, "login_user": ci.LoginUser,
		"architecture": "x86_64", "nimbus_placeholder": "true",
	}
	if ci.GuestAgent {
		props["hw_qemu_guest_agent"] = "yes"
	}
	if ci.MarketplaceOf != "" {
		props["nimbus_marketplace"] = "true"
		props["nimbus_base_image"] = CatalogID(ci.MarketplaceOf)
	}
	for k, v := range ci.ExtraProperties {
		props[k] = v
	}
	return &Image{
		ID: CatalogID(ci.Name), Name: ci.Name, Status: StatusActive, Visibility: Public, Owner: owner,
		DiskFormat: "raw", ContainerFormat: "bare", Size: int64(len(data)), VirtualSize: int64(len(data)),
		Checksum: hex.EncodeToString(md[:]), OSHashAlgo: hashAlgo, OSHashValue: hex.EncodeToString(sh[:]),
		MinDisk: ci.MinDisk, MinRAM: ci.MinRAM, Tags: []string{}, Properties: props,
		CreatedAt: now, UpdatedAt: now,
	}
}

// ensurePlaceholders writes the stand-in data of every registered catalog
// image that still carries its placeholder and whose data is missing:
// into the backend's store, which for the rbd backend is also where data
// a file-backed start placed goes (the record follows).
func (s *Service) ensurePlaceholders(ctx context.Context) error {
	for _, ci := range Catalog {
		id := CatalogID(ci.Name)
		img, err := getImage(ctx, s.db, id)
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		if img.Properties["nimbus_placeholder"] != "true" || !img.HasData() {
			continue
		}
		if img.Location != "" || s.rbd == nil {
			ok, err := s.dataExists(ctx, id, img.Location)
			if err != nil {
				return err
			}
			if ok {
				continue
			}
		}
		if err := s.placeData(ctx, img, placeholder(ci.Name)); err != nil {
			return err
		}
	}
	return nil
}

// placeData writes data, the same on every controller, as image img's
// into the backend, and records its location unless another controller
// moved it meanwhile.
func (s *Service) placeData(ctx context.Context, img *Image, data []byte) error {
	staged, err := s.stage(ctx, img.ID, bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("image store: %w", err)
	}
	loc, err := s.commit(ctx, staged, img.ID, true)
	if err != nil {
		return fmt.Errorf("image store: %w", err)
	}
	if loc == img.Location {
		return nil
	}
	_, err = s.db.Exec(ctx, "UPDATE images SET location = ? WHERE id = ? AND location = ?", loc, img.ID, img.Location)
	return err
}
