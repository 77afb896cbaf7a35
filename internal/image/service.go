// Package image is Nimbus's Glance v2: image records, upload and download of
// image data, and the catalog of base and marketplace images registered on
// first start.
package image

import (
	"context"
	"errors"
	"io"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// Image is one image record.
type Image struct {
	ID, Name, Status, Visibility, Owner, DiskFormat, ContainerFormat, Checksum string
	Size, VirtualSize                                                          int64
	MinDisk, MinRAM                                                            int
	Protected                                                                  bool
	Tags                                                                       []string
	Properties                                                                 map[string]string
	CreatedAt, UpdatedAt                                                       time.Time
}

// Service is the image service.
type Service struct {
	db      *store.DB
	dataDir string
}

// New makes the image service; image data lives under dataDir.
func New(db *store.DB, dataDir string) *Service { return &Service{db: db, dataDir: dataDir} }

// Routes is the image API's route table.
func (s *Service) Routes() []api.Route { return nil }

var errTODO = errors.New("image: not implemented yet")

// Get returns an image the project may see (public, community, its own or
// shared with it; admins see all), or store.ErrNotFound.
func (s *Service) Get(ctx context.Context, projectID string, admin bool, id string) (*Image, error) {
	return nil, errTODO
}

// CreateSnapshot registers a queued image owned by projectID for a server
// snapshot, copying disk/container format and OS properties from base.
func (s *Service) CreateSnapshot(ctx context.Context, tx *store.Tx, projectID, name string, props map[string]string, base *Image) (*Image, error) {
	return nil, errTODO
}

// FinishSnapshot stores a snapshot's data and makes the image active.
func (s *Service) FinishSnapshot(ctx context.Context, id string, data io.Reader) error {
	return errTODO
}

// Delete removes an image and its data (used for shelved-server images).
func (s *Service) Delete(ctx context.Context, id string) error { return errTODO }

// Bootstrap registers the base and marketplace images once.
func (s *Service) Bootstrap(ctx context.Context) error { return nil }
