// Package image is Nimbus's Glance v2: image records, upload and download of
// image data, and the catalog of base and marketplace images registered on
// first start.
package image

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"

	"nimbus/internal/api"
	"nimbus/internal/metering"
	"nimbus/internal/rbd"
	"nimbus/internal/store"
)

// Image is one image record. Empty strings stand for Glance's nulls: a name,
// owner, format, checksum or hash that was never set is rendered as null,
// and size is null until data has been stored (Checksum != "").
type Image struct {
	ID, Name, Status, Visibility, Owner, DiskFormat, ContainerFormat, Checksum string
	Size, VirtualSize                                                          int64
	MinDisk, MinRAM                                                            int
	Protected                                                                  bool
	Tags                                                                       []string
	Properties                                                                 map[string]string
	CreatedAt, UpdatedAt                                                       time.Time

	// OSHidden hides the image from default listings (Glance os_hidden).
	OSHidden bool
	// OSHashAlgo and OSHashValue are Glance's multihash of the data.
	OSHashAlgo, OSHashValue string
	// Licence is the OS licence the data carries ("windows" or ""): set by
	// the image service alone (see licence.go), never shown or taken by
	// the API, so that re-uploading or re-labelling licensed data does not
	// drop the licence its servers pay for.
	Licence string
	// Location is where the data is (store.go): "" for the file store,
	// rbd://fsid/pool/image/snap for Ceph. Set by the image service
	// alone, never shown or taken by the API.
	Location string
}

// HasData reports whether image data has been stored.
func (img *Image) HasData() bool { return img.Checksum != "" }

// SpendGate is what the image service asks before a project stores image
// data, which is charged per GB-hour: billing answers an error (an
// *api.Error 403 with the reason) while the project's account is below its
// credit limit.
type SpendGate interface {
	CanSpend(ctx context.Context, project string) error
}

// SetSpendGate connects billing's gate; without one, uploads are never
// refused for money.
func (s *Service) SetSpendGate(g SpendGate) { s.gate = g }

// Image statuses (glance/api/v2/images.py get_base_properties).
const (
	StatusQueued      = "queued"
	StatusSaving      = "saving"
	StatusActive      = "active"
	StatusDeactivated = "deactivated"
)

// Visibilities.
const (
	Public    = "public"
	Community = "community"
	Shared    = "shared"
	Private   = "private"
)

// Service is the image service.
type Service struct {
	db      *store.DB
	dataDir string
	rbd     *rbd.Store // the rbd backend (store.go); nil: files in dataDir
	log     *slog.Logger
	gate    SpendGate // asked before a customer stores data; nil: never
	// projects finds the operator's project, owner of the catalog; nil:
	// the catalog is no project's.
	projects Projects
}

// Projects finds a project's id by name, "" when there is none; identity
// provides it, so image never reads identity's tables.
type Projects interface {
	ProjectID(ctx context.Context, name string) (string, error)
}

// SetProjects connects identity's project lookup.
func (s *Service) SetProjects(p Projects) { s.projects = p }

// New makes the image service; image data lives under dataDir.
func New(db *store.DB, dataDir string) *Service {
	return &Service{db: db, dataDir: dataDir, log: slog.Default()}
}

// SetLog sets the service's logger.
func (s *Service) SetLog(l *slog.Logger) { s.log = l }

// Routes is the image API's route table.
func (s *Service) Routes() []api.Route {
	const maxUpload = 1 << 40 // 1 TiB: an image upload is not a JSON body.
	return []api.Route{
		{Pattern: "GET /{$}", Handler: s.versions(http300), Public: true},
		{Pattern: "GET /versions", Handler: s.versions(http200), Public: true},
		{Pattern: "GET /v2/{$}", Handler: s.versions(http300), Public: true},

		{Pattern: "GET /v2/images", Handler: s.listImages},
		{Pattern: "POST /v2/images", Handler: s.createImage},
		{Pattern: "GET /v2/images/{id}", Handler: s.showImage},
		{Pattern: "PATCH /v2/images/{id}", Handler: s.updateImage},
		{Pattern: "DELETE /v2/images/{id}", Handler: s.deleteImage},
		{Pattern: "PUT /v2/images/{id}/tags/{tag}", Handler: s.addTag},
		{Pattern: "DELETE /v2/images/{id}/tags/{tag}", Handler: s.deleteTag},
		{Pattern: "POST /v2/images/{id}/actions/deactivate", Handler: s.deactivate},
		{Pattern: "POST /v2/images/{id}/actions/reactivate", Handler: s.reactivate},
		{Pattern: replaceDataRoute, Handler: s.replaceData, AdminOnly: true, Policy: "nimbus_replace_data"},

		{Pattern: "PUT /v2/images/{id}/file", Handler: s.uploadData, MaxBody: maxUpload},
		{Pattern: "GET /v2/images/{id}/file", Handler: s.downloadData},

		{Pattern: "GET /v2/images/{id}/members", Handler: s.listMembers},
		{Pattern: "POST /v2/images/{id}/members", Handler: s.createMember},
		{Pattern: "GET /v2/images/{id}/members/{member}", Handler: s.showMember},
		{Pattern: "PUT /v2/images/{id}/members/{member}", Handler: s.updateMember},
		{Pattern: "DELETE /v2/images/{id}/members/{member}", Handler: s.deleteMember},

		{Pattern: "GET /v2/schemas/image", Handler: schemaHandler(imageSchema)},
		{Pattern: "GET /v2/schemas/images", Handler: schemaHandler(imagesSchema)},
		{Pattern: "GET /v2/schemas/member", Handler: schemaHandler(memberSchema)},
		{Pattern: "GET /v2/schemas/members", Handler: schemaHandler(membersSchema)},
		{Pattern: "GET /v2/info/import", Handler: importInfo},
		{Pattern: "GET /v2/info/usage", Handler: s.usage},
		{Pattern: "GET /v2/quotas/{project}", Handler: s.showQuota},
		{Pattern: "PUT /v2/quotas/{project}", Handler: s.updateQuota, AdminOnly: true, Policy: "set_quota"},
	}
}

// Get returns an image the project may see (public, community, its own or
// shared with it; admins see all), or store.ErrNotFound.
func (s *Service) Get(ctx context.Context, projectID string, admin bool, id string) (*Image, error) {
	return s.visibleImage(ctx, s.db, projectID, admin, id)
}

// CreateSnapshot registers a queued image owned by projectID for a server
// snapshot (createImage, createBackup), copying disk/container format and
// OS properties from base; licence is the server's (see licence.go). It
// counts against the project's image_count_total (413 beyond it); reserved
// properties are refused (403).
func (s *Service) CreateSnapshot(ctx context.Context, tx *store.Tx, projectID, name string, props map[string]string, base *Image, licence string) (*Image, error) {
	for k := range props {
		if reserved(k) {
			return nil, api.Forbidden("Attribute '%s' is reserved.", k)
		}
	}
	if len(props) > maxProperties {
		// As setProperty answers through the image API.
		return nil, api.OverLimit("Maximum number of image properties exceeded: %d", maxProperties)
	}
	return s.createSnapshot(ctx, tx, projectID, name, props, base, licence, false)
}

// CreateShelveImage is CreateSnapshot for the image that keeps a shelved
// server's disk: it counts and is charged like any image but is never
// refused for quota (see shelvedProperty).
func (s *Service) CreateShelveImage(ctx context.Context, tx *store.Tx, projectID, name string, props map[string]string, base *Image, licence string) (*Image, error) {
	return s.createSnapshot(ctx, tx, projectID, name, props, base, licence, true)
}

func (s *Service) createSnapshot(ctx context.Context, tx *store.Tx, projectID, name string, props map[string]string, base *Image, licence string, shelve bool) (*Image, error) {
	// Kept to the microsecond (shown to the second): a server's backups
	// made within one second still sort oldest first, for rotation and
	// for sort_key=created_at.
	now := time.Now().UTC().Truncate(time.Microsecond)
	img := &Image{
		ID: uuid.NewString(), Name: name, Status: StatusQueued, Visibility: Private, Owner: projectID,
		DiskFormat: "raw", ContainerFormat: "bare", Tags: []string{}, Properties: map[string]string{},
		CreatedAt: now, UpdatedAt: now, Licence: licence,
	}
	if base != nil {
		if base.DiskFormat != "" {
			img.DiskFormat = base.DiskFormat
		}
		if base.ContainerFormat != "" {
			img.ContainerFormat = base.ContainerFormat
		}
		img.MinDisk, img.MinRAM = base.MinDisk, base.MinRAM
		for k, v := range base.Properties {
			// As Nova's snapshot carries the instance's image_* system
			// metadata: what the OS is, how to log in, how to boot it.
			if strings.HasPrefix(k, "os_") || strings.HasPrefix(k, "login_") || strings.HasPrefix(k, "hw_") ||
				k == "kernel_id" || k == "ramdisk_id" || k == "img_config_drive" {
				img.Properties[k] = v
			}
		}
	}
	for k, v := range props {
		img.Properties[k] = v
	}
	if shelve {
		img.Properties[shelvedProperty] = "true"
	}
	if err := checkCount(ctx, tx, img); err != nil {
		return nil, err
	}
	if err := insertImage(ctx, tx, img); err != nil {
		return nil, err
	}
	return img, nil
}

// FinishSnapshot stores a snapshot's data, in diskFormat when not empty
// (a hypervisor writes its own format), and makes the image active.
func (s *Service) FinishSnapshot(ctx context.Context, id, diskFormat string, data io.Reader) error {
	if diskFormat != "" && !slices.Contains(diskFormats, diskFormat) {
		return api.BadRequest("Invalid disk format '%s' for image.", diskFormat)
	}
	img, err := getImage(ctx, s.db, id)
	if err != nil {
		return err
	}
	if diskFormat != "" && diskFormat != img.DiskFormat {
		err := s.db.Tx(ctx, func(tx *store.Tx) error {
			cur, err := getImage(ctx, tx, id)
			if err != nil {
				return err
			}
			if cur.Status != StatusQueued {
				return api.Conflict("Image status transition from %s to saving is not allowed", cur.Status)
			}
			cur.DiskFormat = diskFormat
			*img = *cur
			return updateImage(ctx, tx, cur)
		})
		if err != nil {
			return err
		}
	}
	if err := s.beginUpload(ctx, img); err != nil {
		return err
	}
	return s.storeData(ctx, img, data, -1)
}

// Open reads an active image's data, for a hypervisor host.
func (s *Service) Open(ctx context.Context, id string) (io.ReadCloser, *Image, error) {
	img, err := getImage(ctx, s.db, id)
	if err != nil {
		return nil, nil, err
	}
	if img.Status != StatusActive || !img.HasData() {
		return nil, nil, api.Conflict("Image %s is %s: it has no data to read.", id, img.Status)
	}
	rc, _, err := s.openData(ctx, img.ID, img.Location)
	if err != nil {
		return nil, nil, fmt.Errorf("image store: image %s: %w", id, err)
	}
	return rc, img, nil
}

// Backups lists, newest first, the backup images (Nova's createBackup) of
// owner's server instance of the given backup type.
func (s *Service) Backups(ctx context.Context, owner, instance, backupType string) ([]*Image, error) {
	rows, err := s.db.Query(ctx, "SELECT "+imageCols+" FROM images WHERE owner = ? ORDER BY created_at DESC, id DESC", owner)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*Image
	for rows.Next() {
		img, err := scanImage(rows)
		if err != nil {
			return nil, err
		}
		p := img.Properties
		if p["image_type"] == "backup" && p["instance_uuid"] == instance && p["backup_type"] == backupType {
			out = append(out, img)
		}
	}
	return out, rows.Err()
}

// Delete removes an image and its data (used for shelved-server images). It
// makes no policy checks; store.ErrNotFound when there is no such image,
// a 409 while volumes are cloned from its data.
func (s *Service) Delete(ctx context.Context, id string) error {
	return s.db.Tx(ctx, func(tx *store.Tx) error { return s.deleteRow(ctx, tx, id) })
}

// meter records, in the transaction that writes img, what its stored data
// costs: per started GB and hour, at backup_gb for a server backup (Nova's
// createBackup: image_type=backup) and image_gb for any other image,
// shelved servers' included, from when the data is stored until the image
// goes. Public images are the operator's catalog and cost customers
// nothing; an image without data or owner costs nothing.
func meter(ctx context.Context, q store.Querier, img *Image) error {
	kind := metering.KindImage
	if img.Properties["image_type"] == "backup" {
		kind = metering.KindBackup
	}
	var spec *metering.Spec
	if img.HasData() && img.Visibility != Public && img.Owner != "" {
		gb := (img.Size + 1<<30 - 1) >> 30
		spec = &metering.Spec{SizeGB: max(gb, 1), Name: img.Name}
	}
	return metering.Set(ctx, q, kind, img.ID, img.Owner, spec, time.Now())
}

// deleteRow removes the record (members cascade) and its data: a file
// once the transaction commits; an RBD image before, so that one volumes
// are cloned from refuses (409) and the record stays, as Glance deletes
// the data first. What an upload of a saving image placed goes too.
func (s *Service) deleteRow(ctx context.Context, tx *store.Tx, id string) error {
	img, err := getImage(ctx, tx, id)
	if err != nil {
		return err
	}
	if err := s.dropRow(ctx, tx, id); err != nil {
		return err
	}
	if img.Location != "" {
		if err := s.removeData(ctx, id, img.Location); err != nil {
			return err
		}
	}
	tx.AfterCommit(func() {
		if img.Location == "" {
			s.removeData(ctx, id, "")
		}
		if img.Status == StatusSaving {
			if err := s.dropUnfinished(context.WithoutCancel(ctx), id); err != nil {
				s.log.Warn("image store: data of a deleted image's upload left", "image", id, "error", err)
			}
		}
	})
	return nil
}

// dropRow removes the record, its members and its charge, not its data.
func (s *Service) dropRow(ctx context.Context, tx *store.Tx, id string) error {
	// The image's data stops being billed when it goes.
	if err := metering.Set(ctx, tx, metering.KindImage, id, "", nil, time.Now()); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, "DELETE FROM image_members WHERE image_id = ?", id); err != nil {
		return err
	}
	res, err := tx.Exec(ctx, "DELETE FROM images WHERE id = ?", id)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return store.ErrNotFound
	}
	return nil
}

// --- storage of records ---

const imageCols = `id, name, status, visibility, owner, protected, os_hidden, disk_format, container_format,
	size, virtual_size, checksum, os_hash_algo, os_hash_value, min_disk, min_ram, tags, properties, created_at, updated_at, licence,
	location`

type scanner interface{ Scan(dest ...any) error }

func scanImage(row scanner) (*Image, error) {
	var img Image
	var protected, hidden int
	var tags, props, created, updated string
	err := row.Scan(&img.ID, &img.Name, &img.Status, &img.Visibility, &img.Owner, &protected, &hidden,
		&img.DiskFormat, &img.ContainerFormat, &img.Size, &img.VirtualSize, &img.Checksum, &img.OSHashAlgo,
		&img.OSHashValue, &img.MinDisk, &img.MinRAM, &tags, &props, &created, &updated, &img.Licence, &img.Location)
	if err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return nil, store.ErrNotFound
		}
		return nil, err
	}
	img.Protected, img.OSHidden = protected != 0, hidden != 0
	img.Tags, img.Properties = []string{}, map[string]string{}
	if err := store.FromJSON(tags, &img.Tags); err != nil {
		return nil, fmt.Errorf("image %s: tags: %w", img.ID, err)
	}
	if err := store.FromJSON(props, &img.Properties); err != nil {
		return nil, fmt.Errorf("image %s: properties: %w", img.ID, err)
	}
	if img.Tags == nil {
		img.Tags = []string{}
	}
	if img.Properties == nil {
		img.Properties = map[string]string{}
	}
	img.CreatedAt, img.UpdatedAt = store.ParseTime(created), store.ParseTime(updated)
	return &img, nil
}

func getImage(ctx context.Context, q store.Querier, id string) (*Image, error) {
	return scanImage(q.QueryRow(ctx, "SELECT "+imageCols+" FROM images WHERE id = ?", id))
}

func insertImage(ctx context.Context, q store.Querier, img *Image) error {
	img.Licence = publishedLicence(img)
	_, err := q.Exec(ctx, "INSERT INTO images ("+imageCols+`) VALUES
		(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		img.ID, img.Name, img.Status, img.Visibility, img.Owner, b2i(img.Protected), b2i(img.OSHidden),
		img.DiskFormat, img.ContainerFormat, img.Size, img.VirtualSize, img.Checksum, img.OSHashAlgo,
		img.OSHashValue, img.MinDisk, img.MinRAM, store.JSON(img.Tags), store.JSON(img.Properties),
		store.FormatTime(img.CreatedAt), store.FormatTime(img.UpdatedAt), img.Licence, img.Location)
	return err
}

// updateImage writes img's record and, with it, what its data costs.
func updateImage(ctx context.Context, q store.Querier, img *Image) error {
	img.Licence = publishedLicence(img)
	res, err := q.Exec(ctx, `UPDATE images SET name = ?, status = ?, visibility = ?, owner = ?, protected = ?,
		os_hidden = ?, disk_format = ?, container_format = ?, size = ?, virtual_size = ?, checksum = ?,
		os_hash_algo = ?, os_hash_value = ?, min_disk = ?, min_ram = ?, tags = ?, properties = ?, updated_at = ?,
		licence = ?, location = ? WHERE id = ?`,
		img.Name, img.Status, img.Visibility, img.Owner, b2i(img.Protected), b2i(img.OSHidden),
		img.DiskFormat, img.ContainerFormat, img.Size, img.VirtualSize, img.Checksum, img.OSHashAlgo,
		img.OSHashValue, img.MinDisk, img.MinRAM, store.JSON(img.Tags), store.JSON(img.Properties),
		store.FormatTime(img.UpdatedAt), img.Licence, img.Location, img.ID)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return store.ErrNotFound
	}
	return meter(ctx, q, img)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// --- visibility (glance/db/sqlalchemy/api.py is_image_visible) ---

// visibleImage loads an image the project may see: admins see all; public
// and community images are seen by everyone; private ones by the owner;
// shared ones by the owner and by members in any member status.
func (s *Service) visibleImage(ctx context.Context, q store.Querier, projectID string, admin bool, id string) (*Image, error) {
	img, err := getImage(ctx, q, id)
	if err != nil {
		return nil, err
	}
	ok, err := canSee(ctx, q, img, projectID, admin)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, store.ErrNotFound
	}
	return img, nil
}

func canSee(ctx context.Context, q store.Querier, img *Image, projectID string, admin bool) (bool, error) {
	switch {
	case admin, img.Visibility == Public, img.Visibility == Community:
		return true, nil
	case projectID != "" && img.Owner == projectID:
		return true, nil
	case img.Visibility == Shared && projectID != "":
		var one int
		err := q.QueryRow(ctx, "SELECT 1 FROM image_members WHERE image_id = ? AND member = ?", img.ID, projectID).Scan(&one)
		if errors.Is(err, sql.ErrNoRows) {
			return false, nil
		}
		return err == nil, err
	}
	return false, nil
}

// owns reports whether the caller may change an image: admins and writers
// of the owning project (Glance's secure-RBAC defaults, "role:admin or
// (role:member and project_id:%(project_id)s)").
func owns(c *api.Caller, img *Image) bool {
	return c.IsAdmin() || (c.ProjectID != "" && img.Owner == c.ProjectID && canWrite(c))
}

// canWrite is false for a caller whose only say in its project is the
// reader role.
func canWrite(c *api.Caller) bool {
	return c.IsAdmin() || c.HasRole("member") || !c.HasRole("reader")
}

// List returns the images a caller sees in a default Glance listing
// (public, its own, and shared ones it accepted), newest first; the compute
// API's image proxy serves it.
func (s *Service) List(ctx context.Context, c *api.Caller) ([]*Image, error) {
	imgs, err := s.candidates(ctx, c, "", "accepted")
	if err != nil {
		return nil, err
	}
	sort.SliceStable(imgs, func(i, j int) bool {
		if !imgs[i].CreatedAt.Equal(imgs[j].CreatedAt) {
			return imgs[i].CreatedAt.After(imgs[j].CreatedAt)
		}
		return imgs[i].ID > imgs[j].ID
	})
	return imgs, nil
}
