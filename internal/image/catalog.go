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

	"nimbus/internal/imagecatalog"
	"nimbus/internal/metering"
	"nimbus/internal/store"
)

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
		for _, ci := range imagecatalog.Images {
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

func catalogRecord(ci imagecatalog.Image, owner string, now time.Time) *Image {
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
		props["nimbus_base_image"] = imagecatalog.ID(ci.MarketplaceOf)
	}
	for k, v := range ci.ExtraProperties {
		props[k] = v
	}
	return &Image{
		ID: imagecatalog.ID(ci.Name), Name: ci.Name, Status: StatusActive, Visibility: Public, Owner: owner,
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
	for _, ci := range imagecatalog.Images {
		id := imagecatalog.ID(ci.Name)
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
