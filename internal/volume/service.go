// Package volume is Nimbus's Cinder v3 block storage: volumes (the
// "network disk") as sparse raw files in the data directory or as RBD
// images in a Ceph pool (backend.go), volume types, per-project quotas
// and limits, and the usage periods billing charges volumes from.
//
// A volume's row is its desired state and its data the real one. Creating,
// extending and deleting answer 202 at once, as Cinder does; the data work
// runs after the transaction commits (worker.go) and moves the volume from
// creating, extending or deleting to available (or error, or gone). Work
// left undone by a stopped controller resumes when Run starts.
package volume

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"slices"
	"sync/atomic"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/image"
	"nimbus/internal/lease"
	"nimbus/internal/metering"
	"nimbus/internal/rbd"
	"nimbus/internal/store"
	"nimbus/internal/workqueue"
)

// Images is what volumes need of the image service: an image the caller
// may see, and where its data lives.
type Images interface {
	Get(ctx context.Context, projectID string, admin bool, id string) (*image.Image, error)
	// DataFile is a file holding an active image's data, a copy made
	// under dir when the data is not a file, removed by done.
	DataFile(ctx context.Context, id, dir string) (path string, done func(), err error)
	// RBDLocation is where an active image's data is in Ceph; ok is false
	// when it is not there.
	RBDLocation(ctx context.Context, id string) (l rbd.Location, ok bool, err error)
	// CreateSnapshot, FinishSnapshot and Delete make, fill and remove the
	// image a volume is uploaded to (upload.go).
	CreateSnapshot(ctx context.Context, tx *store.Tx, projectID, name string, props map[string]string, base *image.Image, licence string) (*image.Image, error)
	FinishSnapshot(ctx context.Context, id, diskFormat string, data io.Reader) error
	Delete(ctx context.Context, id string) error
}

// Config is what the volume service is made of.
type Config struct {
	DB *store.DB
	// DataDir holds the volumes' files, one per volume named by its id.
	DataDir string
	// Images is the image service, for volumes made from an image (nil:
	// imageRef is refused).
	Images Images
	Log    *slog.Logger
	// Now is the clock (nil: time.Now); usage periods start at its time.
	Now func() time.Time
	// QemuImg is the qemu-img binary ("" looks it up in PATH when needed).
	QemuImg string
	// Billing, when set, is asked before a volume is created or extended.
	Billing SpendGate
	// BackupDir holds the volume backups (backupstore.go); "" is "backups"
	// beside DataDir.
	BackupDir string
	// LocalHosts are the hosts the storage node's own agent presents:
	// servers there open a volume's file directly. SetLocalHosts sets them
	// later, once that agent has said what they are.
	LocalHosts []string
	// Exporter serves volumes to other hosts (nil: attaching on another
	// host is refused).
	Exporter Exporter
	// Extender is told when an in-use volume grew (nil: extending an
	// in-use volume is refused); SetExtender sets it later.
	Extender Extender
	// RBD, when set, keeps the volumes as RBD images in its pool, with
	// RBD's own snapshots and clones, and RBDBackups (another pool of the
	// same cluster, reached as the same client) the backups: the rbd
	// backend (backend_rbd.go). Every host then opens volumes with
	// QEMU's rbd driver; LocalHosts and Exporter are not used. Nil: the
	// file backend, volumes as files in DataDir.
	RBD, RBDBackups *rbd.Store
}

// SpendGate is billing's rule of what a project's money allows (billing's
// gate.go), asked before a project starts or raises a charge: CanStart
// for a new volume, snapshot or backup (its first hour must be paid for),
// CanChange for an extend (the raise), CanSpend for what is priced only
// once made (an upload to an image). Each answers a 403 *api.Error with
// the reason when it refuses.
type SpendGate interface {
	CanSpend(ctx context.Context, project string) error
	CanStart(ctx context.Context, project, kind string, spec metering.Spec, count int64) error
	CanChange(ctx context.Context, project, kind string, from, to metering.Spec) error
}

// Service is the block storage service.
type Service struct {
	db      *store.DB
	dataDir string
	images  Images
	log     *slog.Logger
	now     func() time.Time
	qemuImg string
	gate    SpendGate

	local    atomic.Pointer[[]string] // LocalHosts
	exporter Exporter
	extender Extender // set while wiring, before serving

	liveCopier LiveCopier // livecopy.go; set while wiring, before serving

	ctx   context.Context // background work; cancelled when Run returns
	stop  context.CancelFunc
	queue *workqueue.Queue // data work by volume id (worker.go)

	backend backend // where the data lives (backend.go)

	backupStore *BackupStore     // backups.go
	backupQueue *workqueue.Queue // backup work by backup id

	leases *lease.Manager // who owns each item's work (leases.go); nil: this controller
}

// New makes the block storage service.
func New(cfg Config) *Service {
	s := &Service{db: cfg.DB, dataDir: cfg.DataDir, images: cfg.Images, log: cfg.Log, now: cfg.Now, qemuImg: cfg.QemuImg,
		gate: cfg.Billing, exporter: cfg.Exporter, extender: cfg.Extender}
	s.SetLocalHosts(cfg.LocalHosts)
	s.backend = fileBackend{s}
	if cfg.RBD != nil {
		s.backend = &rbdBackend{s: s, vols: cfg.RBD, backups: cfg.RBDBackups}
		s.exporter = nil // every host opens the images itself
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.now == nil {
		s.now = time.Now
	}
	s.ctx, s.stop = context.WithCancel(context.Background())
	s.startWorkers()
	s.startBackups(cfg.BackupDir)
	return s
}

// SetLocalHosts sets the hosts whose servers open volume files directly
// (Config.LocalHosts); call it before serving.
func (s *Service) SetLocalHosts(hosts []string) {
	h := slices.Clone(hosts)
	s.local.Store(&h)
}

// isLocal is whether a server on host opens volume files directly.
func (s *Service) isLocal(host string) bool {
	return host != "" && slices.Contains(*s.local.Load(), host)
}

// SetExtender sets what is told of in-use volumes that grew (compute,
// which is made after the volume service); call it before serving.
func (s *Service) SetExtender(e Extender) { s.extender = e }

// checkSpend asks the gate, when there is one, whether project may start
// what is priced once made.
func (s *Service) checkSpend(ctx context.Context, project string) error {
	if s.gate == nil {
		return nil
	}
	return s.gate.CanSpend(ctx, project)
}

// checkStart asks the gate, when there is one, whether project pays the
// first hour of a new resource of kind (a volume, snapshot or backup) of
// sizeGB.
func (s *Service) checkStart(ctx context.Context, project, kind string, sizeGB int64) error {
	if s.gate == nil {
		return nil
	}
	return s.gate.CanStart(ctx, project, kind, metering.Spec{SizeGB: sizeGB}, 1)
}

// Microversions served (cinder/api/openstack/api_version_request.py
// _MAX_API_VERSION history). Every change up to MaxMinor that touches a
// field or call served here is honoured: group_id (3.13), provider_id for
// admins (3.21), name~ filters (3.34), with_count (3.45), shared_targets
// and service_uuid (3.48), transfers' no_snapshots (3.55), their history
// fields (3.57) and paging (3.59), created_at/updated_at filters (3.60).
const (
	MinMinor = 0
	MaxMinor = 60
)

// API is the block storage API on its own listener: Cinder's error shape
// (the same fault names as Nova, cinder/api/openstack/wsgi.py Fault), the
// optional project id removed before routing, and microversions.
func (s *Service) API(auth api.Authenticator, authURL string) *api.Service {
	a := api.NewService("volume", api.RenderNova, auth)
	a.AuthURL = authURL
	a.Log = s.log
	a.Before = append(a.Before, microversions.Before)
	a.AfterAuth = append(a.AfterAuth, microversions.CheckProject)
	a.Decorate = microversions.Echo
	a.Handle(s.Routes()...)
	return a
}

// Routes is the block storage API's route table. Paths are given without
// the project id, which before removes.
func (s *Service) Routes() []api.Route {
	routes := []api.Route{
		{Pattern: "GET /{$}", Handler: versions, Public: true},
		{Pattern: "GET /v3", Handler: version, Public: true},
		{Pattern: "GET /v3/{$}", Handler: version, Public: true},

		{Pattern: "GET /v3/volumes", Handler: s.listVolumes(false)},
		{Pattern: "GET /v3/volumes/detail", Handler: s.listVolumes(true)},
		{Pattern: "GET /v3/volumes/summary", Handler: s.summary},
		{Pattern: "POST /v3/volumes", Handler: s.createVolume},
		{Pattern: "GET /v3/volumes/{id}", Handler: s.showVolume},
		{Pattern: "PUT /v3/volumes/{id}", Handler: s.updateVolume},
		{Pattern: "DELETE /v3/volumes/{id}", Handler: s.deleteVolume},
		{Pattern: "POST /v3/volumes/{id}/action", Handler: s.action},

		{Pattern: "GET /v3/attachments", Handler: s.listAttachments(false)},
		{Pattern: "GET /v3/attachments/detail", Handler: s.listAttachments(true)},
		{Pattern: "POST /v3/attachments", Handler: s.createAttachment},
		{Pattern: "GET /v3/attachments/{id}", Handler: s.showAttachment},
		{Pattern: "PUT /v3/attachments/{id}", Handler: s.updateAttachment},
		{Pattern: "DELETE /v3/attachments/{id}", Handler: s.deleteAttachment},
		{Pattern: "POST /v3/attachments/{id}/action", Handler: s.attachmentAction},

		{Pattern: "GET /v3/snapshots", Handler: s.listSnapshots(false)},
		{Pattern: "GET /v3/snapshots/detail", Handler: s.listSnapshots(true)},
		{Pattern: "POST /v3/snapshots", Handler: s.createSnapshot},
		{Pattern: "GET /v3/snapshots/{id}", Handler: s.showSnapshot},
		{Pattern: "PUT /v3/snapshots/{id}", Handler: s.updateSnapshot},
		{Pattern: "DELETE /v3/snapshots/{id}", Handler: s.deleteSnapshot},
		{Pattern: "POST /v3/snapshots/{id}/action", Handler: s.snapshotAction},

		{Pattern: "GET /v3/backups", Handler: s.listBackups(false)},
		{Pattern: "GET /v3/backups/detail", Handler: s.listBackups(true)},
		{Pattern: "POST /v3/backups", Handler: s.createBackup},
		{Pattern: "GET /v3/backups/{id}", Handler: s.showBackup},
		{Pattern: "PUT /v3/backups/{id}", Handler: s.updateBackup},
		{Pattern: "DELETE /v3/backups/{id}", Handler: s.deleteBackup},
		{Pattern: "POST /v3/backups/{id}/restore", Handler: s.restoreBackup},
		{Pattern: "POST /v3/backups/{id}/action", Handler: s.backupAction},

		// Volume transfers (transfers.go): the same calls under both
		// paths, volume-transfers being 3.55's name for them.
		{Pattern: "GET /v3/os-volume-transfer", Handler: s.listTransfers(false)},
		{Pattern: "GET /v3/os-volume-transfer/detail", Handler: s.listTransfers(true)},
		{Pattern: "POST /v3/os-volume-transfer", Handler: s.createTransfer},
		{Pattern: "GET /v3/os-volume-transfer/{id}", Handler: s.showTransfer},
		{Pattern: "DELETE /v3/os-volume-transfer/{id}", Handler: s.deleteTransfer},
		{Pattern: "POST /v3/os-volume-transfer/{id}/accept", Handler: s.acceptTransfer},
		{Pattern: "GET /v3/volume-transfers", Handler: s.listTransfers(false)},
		{Pattern: "GET /v3/volume-transfers/detail", Handler: s.listTransfers(true)},
		{Pattern: "POST /v3/volume-transfers", Handler: s.createTransfer},
		{Pattern: "GET /v3/volume-transfers/{id}", Handler: s.showTransfer},
		{Pattern: "DELETE /v3/volume-transfers/{id}", Handler: s.deleteTransfer},
		{Pattern: "POST /v3/volume-transfers/{id}/accept", Handler: s.acceptTransfer},

		{Pattern: "GET /v3/types", Handler: s.listTypes},
		{Pattern: "POST /v3/types", Handler: s.createType, AdminOnly: true, Policy: "volume_extension:types_manage"},
		{Pattern: "GET /v3/types/default", Handler: s.defaultType},
		{Pattern: "GET /v3/types/{id}", Handler: s.showType},
		{Pattern: "PUT /v3/types/{id}", Handler: s.updateType, AdminOnly: true, Policy: "volume_extension:types_manage"},
		{Pattern: "DELETE /v3/types/{id}", Handler: s.deleteType, AdminOnly: true, Policy: "volume_extension:types_manage"},
		{Pattern: "POST /v3/types/{id}/action", Handler: s.typeAction, AdminOnly: true, Policy: "volume_extension:volume_type_access:addProjectAccess"},
		{Pattern: "GET /v3/types/{id}/os-volume-type-access", Handler: s.listTypeAccess, AdminOnly: true, Policy: "volume_extension:volume_type_access"},
		{Pattern: "GET /v3/types/{id}/extra_specs", Handler: s.listExtraSpecs},
		{Pattern: "POST /v3/types/{id}/extra_specs", Handler: s.createExtraSpecs, AdminOnly: true, Policy: "volume_extension:types_extra_specs:create"},
		{Pattern: "GET /v3/types/{id}/extra_specs/{key}", Handler: s.showExtraSpec},
		{Pattern: "PUT /v3/types/{id}/extra_specs/{key}", Handler: s.updateExtraSpec, AdminOnly: true, Policy: "volume_extension:types_extra_specs:update"},
		{Pattern: "DELETE /v3/types/{id}/extra_specs/{key}", Handler: s.deleteExtraSpec, AdminOnly: true, Policy: "volume_extension:types_extra_specs:delete"},

		{Pattern: "GET /v3/qos-specs", Handler: s.listQoS, AdminOnly: true, Policy: "volume_extension:qos_specs_manage:get_all"},
		{Pattern: "POST /v3/qos-specs", Handler: s.createQoS, AdminOnly: true, Policy: "volume_extension:qos_specs_manage:create"},
		{Pattern: "GET /v3/qos-specs/{id}", Handler: s.showQoS, AdminOnly: true, Policy: "volume_extension:qos_specs_manage:get"},
		{Pattern: "PUT /v3/qos-specs/{id}", Handler: s.updateQoS, AdminOnly: true, Policy: "volume_extension:qos_specs_manage:update"},
		{Pattern: "DELETE /v3/qos-specs/{id}", Handler: s.deleteQoS, AdminOnly: true, Policy: "volume_extension:qos_specs_manage:delete"},
		{Pattern: "PUT /v3/qos-specs/{id}/delete_keys", Handler: s.deleteQoSKeys, AdminOnly: true, Policy: "volume_extension:qos_specs_manage:delete"},
		{Pattern: "GET /v3/qos-specs/{id}/associations", Handler: s.qosAssociations, AdminOnly: true, Policy: "volume_extension:qos_specs_manage:get_all"},
		{Pattern: "GET /v3/qos-specs/{id}/associate", Handler: s.associateQoS, AdminOnly: true, Policy: "volume_extension:qos_specs_manage:update"},
		{Pattern: "GET /v3/qos-specs/{id}/disassociate", Handler: s.disassociateQoS, AdminOnly: true, Policy: "volume_extension:qos_specs_manage:update"},
		{Pattern: "GET /v3/qos-specs/{id}/disassociate_all", Handler: s.disassociateAllQoS, AdminOnly: true, Policy: "volume_extension:qos_specs_manage:update"},

		{Pattern: "GET /v3/limits", Handler: s.limits},
		{Pattern: "GET /v3/os-quota-sets/{project}", Handler: s.showQuota},
		{Pattern: "GET /v3/os-quota-sets/{project}/defaults", Handler: s.showQuotaDefaults},
		{Pattern: "PUT /v3/os-quota-sets/{project}", Handler: s.updateQuota, AdminOnly: true, Policy: "volume_extension:quotas:update"},
		{Pattern: "DELETE /v3/os-quota-sets/{project}", Handler: s.deleteQuota, AdminOnly: true, Policy: "volume_extension:quotas:delete"},
		{Pattern: "GET /v3/os-quota-class-sets/{class}", Handler: s.showQuotaClass, AdminOnly: true, Policy: "volume_extension:quota_classes"},
		{Pattern: "PUT /v3/os-quota-class-sets/{class}", Handler: s.updateQuotaClass, AdminOnly: true, Policy: "volume_extension:quota_classes:update"},
		{Pattern: "GET /v3/os-availability-zone", Handler: availabilityZones},
		{Pattern: "GET /v3/os-services", Handler: s.listServices, AdminOnly: true, Policy: "volume_extension:services:index"},
		{Pattern: "PUT /v3/os-services/{action}", Handler: s.updateService, AdminOnly: true, Policy: "volume_extension:services:update"},
		{Pattern: "GET /v3/messages", Handler: s.listMessages},
		{Pattern: "GET /v3/messages/{id}", Handler: s.showMessage},
		{Pattern: "DELETE /v3/messages/{id}", Handler: s.deleteMessage},
		{Pattern: "GET /v3/os-hosts", Handler: s.listHosts, AdminOnly: true, Policy: "volume_extension:hosts"},
		{Pattern: "GET /v3/os-hosts/{host}", Handler: s.showHost, AdminOnly: true, Policy: "volume_extension:hosts"},
		{Pattern: "GET /v3/scheduler-stats/get_pools", Handler: s.getPools, AdminOnly: true, Policy: "scheduler_extension:scheduler_stats:get_pools"},
		{Pattern: "GET /v3/capabilities/{host}", Handler: s.showCapabilities, AdminOnly: true, Policy: "volume_extension:capabilities"},
		{Pattern: "GET /v3/extensions", Handler: extensions},
	}
	routes = append(routes, s.metadataRoutes("/v3/volumes", volumeMeta)...)
	return append(routes, s.metadataRoutes("/v3/snapshots", snapshotMeta)...)
}

// AvailabilityZone is the one zone volumes live in, Cinder's default
// storage_availability_zone.
const AvailabilityZone = "nova"

// versionDoc is cinder/api/views/versions.py's v3.0 entry.
func versionDoc(r *http.Request) map[string]any {
	return map[string]any{
		"id": "v3.0", "status": "CURRENT", "version": fmt.Sprintf("3.%d", MaxMinor), "min_version": fmt.Sprintf("3.%d", MinMinor),
		"updated": "2023-08-31T00:00:00Z",
		"links": []map[string]string{
			{"rel": "describedby", "type": "text/html", "href": "https://docs.openstack.org/"},
			{"rel": "self", "href": api.BaseURL(r) + "/v3/"},
		},
		"media-types": []map[string]string{{"base": "application/json", "type": "application/vnd.openstack.volume+json;version=3"}},
	}
}

// versions is GET /: 300 Multiple Choices, as cinder/api/versions.py
// VersionsController.all answers.
func versions(r *http.Request) (*api.Response, error) {
	return api.JSON(http.StatusMultipleChoices, map[string]any{"versions": []any{versionDoc(r)}}), nil
}

// version is GET /v3/: Cinder answers the list form here too.
func version(r *http.Request) (*api.Response, error) {
	return api.JSON(http.StatusOK, map[string]any{"versions": []any{versionDoc(r)}}), nil
}

func availabilityZones(r *http.Request) (*api.Response, error) {
	return api.JSON(200, map[string]any{"availabilityZoneInfo": []any{
		map[string]any{"zoneName": AvailabilityZone, "zoneState": map[string]bool{"available": true}},
	}}), nil
}

func extensions(r *http.Request) (*api.Response, error) {
	out := make([]any, 0, len(servedExtensions))
	for _, e := range servedExtensions {
		out = append(out, map[string]any{"alias": e[0], "name": e[1], "description": e[2], "links": []any{},
			"updated": "2013-10-03T00:00:00+00:00"})
	}
	return api.JSON(200, map[string]any{"extensions": out}), nil
}

// servedExtensions are the Cinder API extensions this service serves
// (alias, name, description, as cinder/api/contrib names them).
var servedExtensions = [][3]string{
	{"os-admin-actions", "AdminActions", "Enable admin actions."},
	{"os-availability-zone", "AvailabilityZones", "Describe Availability Zones."},
	{"backups", "Backups", "Backups support."},
	{"capabilities", "Capabilities", "Capabilities support."},
	{"os-extended-services", "ExtendedServices", "Extended services support."},
	{"os-extended-snapshot-attributes", "ExtendedSnapshotAttributes", "Extended SnapshotAttributes support."},
	{"os-hosts", "Hosts", "Admin-only host administration."},
	{"os-image-create", "CreateVolumeExtension", "Allow creating a volume from an image in the Create Volume v1 API."},
	{"os-quota-class-sets", "QuotaClasses", "Quota classes management support."},
	{"os-quota-sets", "Quotas", "Quota management support."},
	{"qos-specs", "Qos_specs_manage", "QoS specs support."},
	{"scheduler-stats", "Scheduler_stats", "Scheduler stats support."},
	{"os-services", "Services", "Services support."},
	{"os-snapshot-actions", "SnapshotActions", "Enable snapshot manager actions."},
	{"os-types-extra-specs", "TypesExtraSpecs", "Type extra specs support."},
	{"os-types-manage", "TypesManage", "Types manage support."},
	{"os-used-limits", "UsedLimits", "Provide data on limited resources that are being used."},
	{"os-volume-actions", "VolumeActions", "Enable volume actions."},
	{"os-volume-transfer", "VolumeTransfer", "Volume transfer management support."},
	{"os-vol-host-attr", "VolumeHostAttribute", "Expose host as an attribute of a volume."},
	{"os-vol-image-meta", "VolumeImageMetadata", "Show image metadata associated with the volume."},
	{"os-vol-mig-status-attr", "VolumeMigStatusAttribute", "Expose migration_status as an attribute of a volume."},
	{"os-vol-tenant-attr", "VolumeTenantAttribute", "Expose the internal project_id as an attribute of a volume."},
	{"os-volume-type-access", "VolumeTypeAccess", "Volume type access support."},
}

// ---- Microversions and the project id in the URL ----

// microversions is Cinder's negotiation: "OpenStack-API-Version: volume
// 3.X" (also under the service type block-storage) or the legacy
// X-OpenStack-Volume-API-Version gophercloud sends; only the first is
// echoed (cinder/api/openstack/__init__.py, wsgi.py
// Request.set_api_version_request). Cinder's URLs carry the project id;
// from 3.67 it may be left out.
var microversions = &api.Microversions{
	Types:   []string{"volume", "block-storage"},
	Legacy:  "X-OpenStack-Volume-API-Version",
	Min:     api.Version{Major: 3, Minor: MinMinor},
	Max:     api.Version{Major: 3, Minor: MaxMinor},
	Root:    "/v3",
	Project: regexp.MustCompile(`^/v3/([0-9a-fA-F]{32}|[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})(/.*)?$`),
	// cinder/api/openstack/wsgi.py: "Malformed request url".
	Mismatch: func(string, string) error { return api.BadRequest("Malformed request url") },
}

// minor is the request's microversion 3.minor.
func minor(r *http.Request) int { return api.VersionFrom(r.Context(), microversions.Min).Minor }

// projectInURL is the project id the client put in the URL ("" if none),
// repeated in links.
func projectInURL(r *http.Request) string { return api.ProjectInURL(r.Context()) }

// DataPath is where volume id's data lives, for the hypervisor that will
// attach it.
func (s *Service) DataPath(id string) string { return s.dataPath(id) }
