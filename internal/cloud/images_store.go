package cloud

import (
	"fmt"
	"path/filepath"

	"nimbus/internal/image"
	"nimbus/internal/rbd"
	"nimbus/internal/store"
)

// ImageOptions choose where the image service keeps image data.
type ImageOptions struct {
	// Backend is "file" (the default): image data is files in the data
	// directory, which only this controller reaches; or "rbd": RBD images
	// in a Ceph pool, as Glance's rbd store keeps them, which every
	// controller of a region reaches and volumes are cloned from. The rbd
	// backend reaches Ceph as the volume backend's client (Volumes.RBD's
	// Conf, Keyring and User).
	Backend string
	// Pool holds the images (Glance's rbd_store_pool; default images).
	Pool string
}

// newImages makes the image service on cfg's image backend.
func newImages(cfg Config, db *store.DB) (*image.Service, error) {
	s := image.New(db, filepath.Join(cfg.DataDir, "images"))
	s.SetLog(cfg.Log.With("component", "image"))
	switch cfg.ImageData.Backend {
	case "", image.BackendFile:
		return s, nil
	case image.BackendRBD:
		o := cfg.Volumes.RBD.withDefaults()
		pool := cfg.ImageData.Pool
		if pool == "" {
			pool = "images"
		}
		st, err := rbd.New(rbd.Config{Conf: o.Conf, Keyring: o.Keyring, User: o.User, Pool: pool})
		if err != nil {
			return nil, fmt.Errorf("cloud: rbd image backend: %w", err)
		}
		s.UseRBD(st)
		return s, nil
	}
	return nil, fmt.Errorf("cloud: unknown image backend %q (file or rbd)", cfg.ImageData.Backend)
}
