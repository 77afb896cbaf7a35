package image

import (
	"context"

	"nimbus/internal/store"
)

// LicenceWindows is the licence of Windows Server data: each server booted
// from it is metered with the Windows licence line.
const LicenceWindows = "windows"

// An image's licence comes from three places, none of them a field a
// customer writes:
//   - what the operator publishes: a public image (only admins publish)
//     whose os_type is windows;
//   - the data: stored data whose sha512 equals a licensed image's, however
//     it is labelled (a re-upload of the public Windows image);
//   - the server: a snapshot or shelve image of a licensed server, which
//     compute names when it creates the image.
//
// A licence once set stays with the image.

// publishedLicence is img's licence with what its publication implies.
func publishedLicence(img *Image) string {
	if img.Licence == "" && img.Visibility == Public && img.Properties["os_type"] == LicenceWindows {
		return LicenceWindows
	}
	return img.Licence
}

// dataLicence is the licence of any other image holding the same data as
// img, for img's licence when its data is stored.
func dataLicence(ctx context.Context, q store.Querier, img *Image) (string, error) {
	if img.Licence != "" || img.OSHashValue == "" {
		return img.Licence, nil
	}
	var lic string
	err := q.QueryRow(ctx, `SELECT licence FROM images WHERE os_hash_value = ? AND os_hash_algo = ? AND licence <> '' AND id <> ? LIMIT 1`,
		img.OSHashValue, img.OSHashAlgo, img.ID).Scan(&lic)
	if store.IsNoRows(err) {
		return "", nil
	}
	return lic, err
}
