// Package compute is Nimbus's Nova v2.1: servers and their state machine,
// actions, flavors, key pairs, quotas, limits, usage, availability zones,
// hypervisors and services, with Nova's microversions. Work that takes time
// is written to the store as a task and carried out by the reconcile loop
// through the hypervisor driver.
package compute

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/driver"
	"nimbus/internal/image"
	"nimbus/internal/lease"
	"nimbus/internal/network"
	"nimbus/internal/scheduler"
	"nimbus/internal/store"
	"nimbus/internal/volume"
	"nimbus/internal/workqueue"
)

// Service is the compute service.
type Service struct {
	// zones caches the hosts' zones that aggregates set (aggregates.go).
	zones zoneCache
	// onAggregatesChanged, when set, is called after any aggregate change
	// commits (for the scheduler's snapshot); nil does nothing.
	onAggregatesChanged func()

	db       *store.DB
	driver   driver.Driver
	images   Images
	networks Networks
	volumes  Volumes // nil: no block storage, volume attach refused
	identity Projects
	gate     SpendGate
	log      *slog.Logger
	now      func() time.Time
	queue    *workqueue.Queue // reconcile loop work, keyed by server id
	// leases owns servers' work and the sweeps through the database
	// (reconcile.go); ownLeases when compute made them itself and so
	// renews them.
	leases    *lease.Manager
	ownLeases bool
	// owned marks servers whose lease the transaction that wrote their
	// intent took (enqueueAfter): their worker need not take it again.
	// A stale mark costs a step that its commit's fence refuses.
	owned sync.Map
	// scanEvery is how often Run looks for owed work no live controller
	// holds (scanPeriod).
	scanEvery time.Duration
	// fresh holds, per server id, the row a worker's last step committed,
	// so that the next step need not read it again. Only the worker that
	// holds the id uses its entry; a stale entry costs at most a wasted
	// driver call, since every commit re-checks the task state.
	fresh sync.Map
	docs  docCache  // decoded server documents for lists (servers half)
	hosts hostCache // schedulable hosts, read on every placement
	sched schedView // the scheduler's snapshot of hosts and claims
	// consoleURL is the console proxy's base URL (consoles.go).
	consoleURL string
}

// Images is what compute needs of the image service (*image.Service):
// boot images, snapshots, shelve images and backups.
type Images interface {
	Get(ctx context.Context, projectID string, admin bool, id string) (*image.Image, error)
	List(ctx context.Context, c *api.Caller) ([]*image.Image, error)
	Delete(ctx context.Context, id string) error
	CreateSnapshot(ctx context.Context, tx *store.Tx, projectID, name string, props map[string]string, base *image.Image, licence string) (*image.Image, error)
	FinishSnapshot(ctx context.Context, id, diskFormat string, data io.Reader) error
	CreateShelveImage(ctx context.Context, tx *store.Tx, projectID, name string, props map[string]string, base *image.Image, licence string) (*image.Image, error)
	Backups(ctx context.Context, owner, instance, backupType string) ([]*image.Image, error)
}

// Networks is what compute needs of the network service
// (*network.Service): checks and ports at create, ports for the driver,
// addresses for views, and release at delete.
type Networks interface {
	CheckSecurityGroups(ctx context.Context, projectID string, names []string) error
	AutoNetwork(ctx context.Context, projectID string) (*network.Network, error)
	GetNetwork(ctx context.Context, projectID string, admin bool, id string) (*network.Network, error)
	GetPort(ctx context.Context, projectID string, admin bool, id string) (*network.Port, error)
	BindPort(ctx context.Context, tx *store.Tx, projectID, portID, serverID string) error
	CreateServerPort(ctx context.Context, tx *store.Tx, projectID, networkID, serverID, fixedIP string, securityGroups []string) (*network.Port, error)
	AttachPublicIP(ctx context.Context, tx *store.Tx, projectID, serverID, portID string) (string, error)
	ServerPorts(ctx context.Context, sv network.ServerRef) ([]network.ServerPort, error)
	Addresses(ctx context.Context, servers []network.ServerRef) (map[string]map[string][]network.Address, error)
	ReleaseServer(ctx context.Context, tx *store.Tx, serverID string) error
	// ServerDeleting marks the server's ports as about to be released
	// (its delete was accepted), so that deletes they block wait for them.
	ServerDeleting(ctx context.Context, tx *store.Tx, serverID string) error
	MeterServerAddresses(ctx context.Context, q store.Querier, serverID string, serverPays bool) error
	ServerInterfaces(ctx context.Context, sv network.ServerRef) ([]network.Interface, error)
	ReleasePort(ctx context.Context, tx *store.Tx, serverID, portID string) error
	// NetworkChanged tells the data plane that a server moved (placed
	// on a host, or off one), so that the hosts' wiring follows at once.
	NetworkChanged()
}

// Volumes is what compute needs of the block storage service
// (*volume.Service): its volumes' attachments to servers, and how a
// server's host opens them.
type Volumes interface {
	Reserve(ctx context.Context, tx *store.Tx, req volume.ReserveRequest) (volume.Attachment, error)
	Connect(ctx context.Context, attachmentID, host string) (driver.Volume, error)
	Disconnect(ctx context.Context, attachmentID string) error
	Complete(ctx context.Context, tx *store.Tx, attachmentID string) error
	BeginDetach(ctx context.Context, tx *store.Tx, attachmentID string) error
	RollDetach(ctx context.Context, tx *store.Tx, attachmentID string) error
	Remove(ctx context.Context, tx *store.Tx, attachmentID string) error
	Swap(ctx context.Context, tx *store.Tx, oldAttachmentID, newAttachmentID string) error
	SetDeleteOnTermination(ctx context.Context, tx *store.Tx, attachmentID string, v bool) error
	DeleteTerminated(ctx context.Context, tx *store.Tx, volumeID string) error
	Attachments(ctx context.Context, q store.Querier, serverIDs ...string) (map[string][]volume.Attachment, error)
	AttachmentByID(ctx context.Context, q store.Querier, id string) (volume.Attachment, error)
	// For boot from volume (block_devices.go).
	CreateForServer(ctx context.Context, tx *store.Tx, req volume.ServerVolumeRequest) (string, error)
	SnapshotForImage(ctx context.Context, tx *store.Tx, c *api.Caller, volumeID, name string) (string, error)
	VolumeForServer(ctx context.Context, q store.Querier, c *api.Caller, id string) (volume.ServerVolume, error)
	SnapshotForServer(ctx context.Context, q store.Querier, c *api.Caller, id string) (int64, string, error)
	SetDevice(ctx context.Context, tx *store.Tx, attachmentID, device string) error
	SetFlavorDisk(ctx context.Context, q store.Querier, volumeID string, gb int64) error
}

// Projects is what compute needs of the identity service
// (*identity.Service): whether a project named in a quota call exists.
type Projects interface {
	ProjectExists(ctx context.Context, id string) (bool, error)
}

// Deps are the compute service's collaborators.
type Deps struct {
	DB       *store.DB
	Driver   driver.Driver
	Images   Images
	Networks Networks
	// Volumes, when set, gives servers block storage volumes.
	Volumes Volumes
	// Identity, when set, is asked whether a project exists.
	Identity Projects
	// Billing, when set, is asked before creates and unshelves.
	Billing SpendGate
	// Scheduler is how hosts are chosen (weigher, GPU hosts kept for GPU
	// flavors); the zero value spreads and keeps GPU hosts.
	Scheduler *scheduler.Policy
	// Leases owns the reconcile work and the sweeps through the
	// database, shared with the region's other controllers; nil: compute
	// makes its own, under a random holder name, and renews it in Run.
	Leases *lease.Manager
	// ConsoleURL is the console proxy's base URL, e.g.
	// https://cloud.example.com:6080 (Nova's novncproxy_base_url without
	// its page); empty: no console proxy, no remote consoles.
	ConsoleURL string
	Log        *slog.Logger
}

// New makes the compute service.
func New(d Deps) *Service {
	log := d.Log
	if log == nil {
		log = slog.Default()
	}
	policy := scheduler.Policy{Weigher: "spread", KeepGPUHosts: true}
	if d.Scheduler != nil {
		policy = *d.Scheduler
	}
	s := &Service{
		sched: schedView{policy: policy},
		db:    d.DB, driver: d.Driver, images: d.Images, networks: d.Networks, volumes: d.Volumes, identity: d.Identity, gate: d.Billing, log: log,
		now:   func() time.Time { return time.Now().UTC() },
		queue: workqueue.New(workqueue.Config{Backoff: stepRetry, MaxBackoff: stepRetryMax}),
	}
	s.leases, s.scanEvery = d.Leases, scanPeriod
	if s.leases == nil {
		s.leases, s.ownLeases = lease.New(d.DB, lease.Config{Log: log}), true
	}
	s.consoleURL = strings.TrimSuffix(d.ConsoleURL, "/")
	// An aggregate's zone change moves hosts between zones: the
	// scheduler's snapshot takes it with its next host refresh.
	s.onAggregatesChanged = s.hosts.invalidate
	return s
}

// API builds the compute HTTP service.
func (s *Service) API(auth api.Authenticator, authURL string) *api.Service {
	a := api.NewService("compute", api.RenderNova, auth)
	a.AuthURL = authURL
	a.Log = s.log
	a.Before = append(a.Before, before)
	a.AfterAuth = append(a.AfterAuth, checkProjectInURL)
	a.Decorate = decorate
	a.Handle(s.Routes()...)
	return a
}

// Routes is the compute API's route table.
func (s *Service) Routes() []api.Route {
	routes := []api.Route{
		{Pattern: "GET /{$}", Handler: versions, Public: true},
		{Pattern: "GET /v2.1", Handler: version, Public: true},
		{Pattern: "GET /v2.1/{$}", Handler: version, Public: true},
		{Pattern: "GET /v2", Handler: versionV2, Public: true},
		{Pattern: "GET /v2/{$}", Handler: versionV2, Public: true},
	}
	routes = append(routes, s.serverRoutes()...)
	routes = append(routes, s.resourceRoutes()...)
	routes = append(routes, s.serverGroupRoutes()...)
	routes = append(routes, s.aggregateRoutes()...)
	routes = append(routes, s.imageProxyRoutes()...)
	routes = append(routes, s.consoleRoutes()...)
	routes = append(routes, s.interfaceRoutes()...)
	routes = append(routes, s.volumeAttachmentRoutes()...)
	routes = append(routes, s.volumeProxyRoutes()...)
	return routes
}

func versionDoc(r *http.Request) map[string]any {
	return map[string]any{
		"id": "v2.1", "status": "CURRENT", "version": MaxVersion.String(), "min_version": MinVersion.String(),
		"updated": "2013-07-23T11:33:21Z",
		"links": []map[string]string{
			{"rel": "self", "href": api.BaseURL(r) + "/v2.1/"},
			{"rel": "describedby", "type": "text/html", "href": "http://docs.openstack.org/"},
		},
		"media-types": []map[string]string{{"base": "application/json", "type": "application/vnd.openstack.compute+json;version=2.1"}},
	}
}

// versions is GET /: 200 (Nova does not answer 300 here).
func versions(r *http.Request) (*api.Response, error) {
	return api.JSON(http.StatusOK, map[string]any{"versions": []any{
		map[string]any{"id": "v2.0", "status": "SUPPORTED", "version": "", "min_version": "",
			"updated": "2011-01-21T11:33:21Z", "links": []map[string]string{{"rel": "self", "href": api.BaseURL(r) + "/v2/"}}},
		map[string]any{"id": "v2.1", "status": "CURRENT", "version": MaxVersion.String(), "min_version": MinVersion.String(),
			"updated": "2013-07-23T11:33:21Z", "links": []map[string]string{{"rel": "self", "href": api.BaseURL(r) + "/v2.1/"}}},
	}}), nil
}

func version(r *http.Request) (*api.Response, error) {
	return api.JSON(http.StatusOK, map[string]any{"version": versionDoc(r)}), nil
}

// versionV2 is the legacy v2.0 version document, which Nova still serves
// (its v2 API is v2.1 without microversions); Nimbus routes only /v2.1.
func versionV2(r *http.Request) (*api.Response, error) {
	return api.JSON(http.StatusOK, map[string]any{"version": map[string]any{
		"id": "v2.0", "status": "SUPPORTED", "version": "", "min_version": "", "updated": "2011-01-21T11:33:21Z",
		"links": []map[string]string{
			{"rel": "self", "href": api.BaseURL(r) + "/v2/"},
			{"rel": "describedby", "type": "text/html", "href": "http://docs.openstack.org/"},
		},
		"media-types": []map[string]string{{"base": "application/json", "type": "application/vnd.openstack.compute+json;version=2"}},
	}}), nil
}
