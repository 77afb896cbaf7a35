package compute

import (
	"context"
	"database/sql"
	"strings"
	"sync"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// flavorSnap is the copy of a flavor a server keeps (Nova's instance.flavor),
// so that a later flavor change or delete does not change the server.
type flavorSnap struct {
	ID         string            `json:"id"`
	Name       string            `json:"name"`
	VCPUs      int               `json:"vcpus"`
	RAM        int               `json:"ram"`
	Disk       int               `json:"disk"`
	Ephemeral  int               `json:"ephemeral"`
	Swap       int               `json:"swap"`
	ExtraSpecs map[string]string `json:"extra_specs"`
}

func snapOf(f *Flavor) flavorSnap {
	es := map[string]string{}
	for k, v := range f.ExtraSpecs {
		es[k] = v
	}
	return flavorSnap{ID: f.ID, Name: f.Name, VCPUs: f.VCPUs, RAM: f.RAM, Disk: f.Disk,
		Ephemeral: f.Ephemeral, Swap: f.Swap, ExtraSpecs: es}
}

func (f flavorSnap) diskGB() int { return f.Disk + f.Ephemeral + (f.Swap+1023)/1024 }

// faultDoc is a server's last fault (nova instance_faults).
type faultDoc struct {
	Code    int       `json:"code"`
	Message string    `json:"message"`
	Details string    `json:"details,omitempty"`
	Created time.Time `json:"created"`
}

// serverDoc is the part of a server kept as one JSON document.
type serverDoc struct {
	Flavor         flavorSnap        `json:"flavor"`
	OldFlavor      *flavorSnap       `json:"old_flavor,omitempty"`
	OldVMState     string            `json:"old_vm_state,omitempty"`
	Metadata       map[string]string `json:"metadata"`
	Description    *string           `json:"description"`
	AccessIPv4     string            `json:"access_ipv4"`
	AccessIPv6     string            `json:"access_ipv6"`
	ConfigDrive    bool              `json:"config_drive"`
	DiskConfig     string            `json:"disk_config"`
	UserData       *string           `json:"user_data"`
	SecurityGroups []string          `json:"security_groups"`
	Fault          *faultDoc         `json:"fault,omitempty"`
	LockedReason   *string           `json:"locked_reason"`
	LockedBy       string            `json:"locked_by,omitempty"`
	AdminPass      string            `json:"admin_pass,omitempty"`
	PublicKey      string            `json:"public_key,omitempty"`
	PinnedAZ       *string           `json:"pinned_az"`
	RequestedHost  string            `json:"requested_host,omitempty"`
	OSType         string            `json:"os_type,omitempty"`
	PendingImage   string            `json:"pending_image,omitempty"`
	SnapshotID     string            `json:"snapshot_id,omitempty"`
	BackupRotation int               `json:"backup_rotation,omitempty"`
	RebootHard     bool              `json:"reboot_hard,omitempty"`
	InstanceName   string            `json:"instance_name"`
	RequestID      string            `json:"request_id,omitempty"`
	Retries        int               `json:"retries,omitempty"`
	// TaskID is new with every intent (an action, a delete, billing's
	// shelve): with the server id and task state it keys the driver work a
	// step asks for, so that a driver running work on host agents can tell
	// the same step asked again (after a restart) from new work.
	TaskID string `json:"task_id,omitempty"`
	// Group, SameHost and DifferentHost are the create request's scheduler
	// hints, kept for every later placement (unshelve).
	Group         string   `json:"group,omitempty"`
	SameHost      []string `json:"same_host,omitempty"`
	DifferentHost []string `json:"different_host,omitempty"`
	// Password is os-server-password's: the Windows administrator
	// password encrypted to the server's RSA key pair.
	Password string `json:"password,omitempty"`
	// Shelved is shelve's bookkeeping (Nova's system_metadata
	// shelved_image_id, shelved_at, shelved_host). Only compute writes it;
	// no API shows it or takes it, so a customer cannot point delete or
	// unshelve at an image of their choice.
	Shelved shelveState `json:"shelved,omitzero"`
	// VolumeOps are the volume attaches and detaches the server's
	// reconcile worker owes (volume_attachments_work.go). Only compute
	// writes them.
	VolumeOps []volumeOp `json:"volume_ops,omitempty"`
	// BlockDevices are the volumes the server was created with, its boot
	// volume among them (block_devices.go). Only compute writes them.
	BlockDevices []blockDevice `json:"block_devices,omitempty"`
	// BootImage is the image a boot volume's data came from, as far as
	// the create knew it ("" when none).
	BootImage string `json:"boot_image,omitempty"`
}

// shelveState is what shelve keeps until unshelve or delete.
type shelveState struct {
	ImageID string    `json:"image_id,omitempty"`
	At      time.Time `json:"at,omitzero"`
	Host    string    `json:"host,omitempty"`
}

// server is one row of compute_servers.
type server struct {
	ID, ProjectID, UserID, Name string
	VMState, TaskState          string
	Power                       int
	Host                        string
	FlavorID, ImageRef          string
	ReservationID               string
	LaunchIndex                 int
	Locked                      bool
	AZ, KeyName, Hostname       string
	Tags                        []string
	VCPUs, MemoryMB, DiskGB     int
	CreatedAt, UpdatedAt        time.Time
	LaunchedAt, TerminatedAt    *time.Time
	Deleted                     bool
	Doc                         serverDoc

	// placed is what the row counted on its host when read, so that
	// saveServer can move the difference in compute_host_usage.
	placed placement
	// counted is what the row counted against its project's quota when
	// read, so that saveServer can move the difference in
	// compute_project_usage.
	counted quotaUse
	// metered is what the row was billed as when read, so that saveServer
	// records a new usage period only when that changes.
	metered meterKey
	// released is set on a row a step's commit wrote at rest, having
	// given the server's lease back in the same transaction.
	released bool
}

// quotaUse is what a server counts against its project's quota: its flavor
// while it is not deleted (shelved-offloaded servers still count, as in Nova).
type quotaUse struct {
	project               string
	instances, cores, ram int
}

func quotaUseOf(sv *server) quotaUse {
	if sv.Deleted {
		return quotaUse{}
	}
	return quotaUse{sv.ProjectID, 1, sv.VCPUs, sv.MemoryMB}
}

// moveQuotaUse applies a server's change of quota use to its project's totals.
func moveQuotaUse(ctx context.Context, q store.Querier, from, to quotaUse) error {
	if from == to {
		return nil
	}
	if from.project != "" {
		if _, err := q.Exec(ctx, `UPDATE compute_project_usage SET instances = instances - ?, cores = cores - ?, ram = ram - ?
 WHERE project_id = ?`, from.instances, from.cores, from.ram, from.project); err != nil {
			return err
		}
	}
	if to.project != "" {
		if _, err := q.Exec(ctx, `INSERT INTO compute_project_usage (project_id, instances, cores, ram) VALUES (?, ?, ?, ?)
 ON CONFLICT (project_id) DO UPDATE SET instances = compute_project_usage.instances + excluded.instances,
 cores = compute_project_usage.cores + excluded.cores, ram = compute_project_usage.ram + excluded.ram`,
			to.project, to.instances, to.cores, to.ram); err != nil {
			return err
		}
	}
	return nil
}

// placement is what a server holds on a host; a zero value holds nothing.
type placement struct {
	host                  string
	vcpus, memoryMB, disk int
}

// placementOf is what sv holds: nothing when deleted or without a host.
func placementOf(sv *server) placement {
	if sv.Deleted || sv.Host == "" {
		return placement{}
	}
	return placement{sv.Host, sv.VCPUs, sv.MemoryMB, sv.DiskGB}
}

// movePlacement applies a server's change of placement to the per-host totals.
func movePlacement(ctx context.Context, q store.Querier, from, to placement) error {
	if from == to {
		return nil
	}
	if from.host != "" {
		if _, err := q.Exec(ctx, `UPDATE compute_host_usage SET servers = servers - 1, vcpus = vcpus - ?, memory_mb = memory_mb - ?,
 disk_gb = disk_gb - ? WHERE host = ?`, from.vcpus, from.memoryMB, from.disk, from.host); err != nil {
			return err
		}
	}
	if to.host != "" {
		if _, err := q.Exec(ctx, `INSERT INTO compute_host_usage (host, servers, vcpus, memory_mb, disk_gb) VALUES (?, 1, ?, ?, ?)
 ON CONFLICT (host) DO UPDATE SET servers = compute_host_usage.servers + 1, vcpus = compute_host_usage.vcpus + excluded.vcpus,
 memory_mb = compute_host_usage.memory_mb + excluded.memory_mb, disk_gb = compute_host_usage.disk_gb + excluded.disk_gb`,
			to.host, to.vcpus, to.memoryMB, to.disk); err != nil {
			return err
		}
	}
	return nil
}

const serverCols = `id, project_id, user_id, name, vm_state, task_state, power_state, host, flavor_id, image_ref,
 reservation_id, launch_index, locked, availability_zone, key_name, hostname, tags, vcpus, memory_mb, disk_gb,
 created_at, updated_at, launched_at, terminated_at, deleted, doc`

func scanServer(sc interface{ Scan(...any) error }) (*server, error) { return scanServerWith(sc, nil) }

// docCache keeps decoded documents by their exact text, so that listing
// thousands of servers does not decode each document again. Entries are
// shared: only read-only paths (lists) use it.
type docCache struct {
	mu sync.Mutex
	m  map[string]docEntry
}

type docEntry struct {
	raw string
	doc serverDoc
}

const docCacheMax = 50000

func (c *docCache) decode(id, raw string, dst *serverDoc) error {
	c.mu.Lock()
	e, ok := c.m[id]
	c.mu.Unlock()
	if ok && e.raw == raw {
		*dst = e.doc
		return nil
	}
	if err := store.FromJSON(raw, dst); err != nil {
		return err
	}
	if dst.Metadata == nil {
		dst.Metadata = map[string]string{}
	}
	c.mu.Lock()
	if c.m == nil || len(c.m) >= docCacheMax {
		c.m = map[string]docEntry{}
	}
	c.m[id] = docEntry{raw: raw, doc: *dst}
	c.mu.Unlock()
	return nil
}

// scanServerCached is scanServer for read-only callers: the document may be
// shared with other readers and must not be changed.
func (s *Service) scanServerCached(sc interface{ Scan(...any) error }) (*server, error) {
	return scanServerWith(sc, &s.docs)
}

func scanServerWith(sc interface{ Scan(...any) error }, cache *docCache) (*server, error) {
	var sv server
	var locked, deleted int
	var tags, created, updated, launched, terminated, doc string
	err := sc.Scan(&sv.ID, &sv.ProjectID, &sv.UserID, &sv.Name, &sv.VMState, &sv.TaskState, &sv.Power, &sv.Host,
		&sv.FlavorID, &sv.ImageRef, &sv.ReservationID, &sv.LaunchIndex, &locked, &sv.AZ, &sv.KeyName, &sv.Hostname,
		&tags, &sv.VCPUs, &sv.MemoryMB, &sv.DiskGB, &created, &updated, &launched, &terminated, &deleted, &doc)
	if err != nil {
		if err == sql.ErrNoRows {
			return nil, store.ErrNotFound
		}
		return nil, err
	}
	sv.Locked, sv.Deleted = locked != 0, deleted != 0
	sv.Tags = splitTags(tags)
	sv.CreatedAt, sv.UpdatedAt = store.ParseTime(created), store.ParseTime(updated)
	if launched != "" {
		sv.LaunchedAt = timePtr(store.ParseTime(launched))
	}
	if terminated != "" {
		sv.TerminatedAt = timePtr(store.ParseTime(terminated))
	}
	sv.placed = placementOf(&sv)
	sv.counted = quotaUseOf(&sv)
	if cache != nil {
		if err := cache.decode(sv.ID, doc, &sv.Doc); err != nil {
			return nil, err
		}
	} else if err := store.FromJSON(doc, &sv.Doc); err != nil {
		return nil, err
	}
	if sv.Doc.Metadata == nil {
		sv.Doc.Metadata = map[string]string{}
	}
	sv.metered = meterKeyOf(&sv)
	return &sv, nil
}

// tags are stored as ",a,b," so that a tag filter is a LIKE on one column
// (Nova tags may contain neither ',' nor '/').
func joinTags(tags []string) string {
	if len(tags) == 0 {
		return ""
	}
	return "," + strings.Join(tags, ",") + ","
}

func splitTags(s string) []string {
	s = strings.Trim(s, ",")
	if s == "" {
		return []string{}
	}
	return strings.Split(s, ",")
}

func fmtTimePtr(t *time.Time) string {
	if t == nil {
		return ""
	}
	return store.FormatTime(*t)
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func (s *Service) insertServer(ctx context.Context, q store.Querier, sv *server) error {
	if err := movePlacement(ctx, q, placement{}, placementOf(sv)); err != nil {
		return err
	}
	sv.placed = placementOf(sv)
	if err := moveQuotaUse(ctx, q, quotaUse{}, quotaUseOf(sv)); err != nil {
		return err
	}
	sv.counted = quotaUseOf(sv)
	if err := s.moveMeter(ctx, q, sv, true); err != nil {
		return err
	}
	_, err := q.Exec(ctx, `INSERT INTO compute_servers (`+serverCols+`, work_due) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)`,
		sv.ID, sv.ProjectID, sv.UserID, sv.Name, sv.VMState, sv.TaskState, sv.Power, sv.Host, sv.FlavorID, sv.ImageRef,
		sv.ReservationID, sv.LaunchIndex, b2i(sv.Locked), sv.AZ, sv.KeyName, sv.Hostname, joinTags(sv.Tags),
		sv.VCPUs, sv.MemoryMB, sv.DiskGB, store.FormatTime(sv.CreatedAt), store.FormatTime(sv.UpdatedAt),
		fmtTimePtr(sv.LaunchedAt), fmtTimePtr(sv.TerminatedAt), b2i(sv.Deleted), store.JSON(sv.Doc), b2i(workDue(sv)))
	return err
}

// saveServer writes every mutable column of sv and bumps updated_at.
func (s *Service) saveServer(ctx context.Context, q store.Querier, sv *server) error {
	if err := movePlacement(ctx, q, sv.placed, placementOf(sv)); err != nil {
		return err
	}
	sv.placed = placementOf(sv)
	if err := moveQuotaUse(ctx, q, sv.counted, quotaUseOf(sv)); err != nil {
		return err
	}
	sv.counted = quotaUseOf(sv)
	if err := s.moveMeter(ctx, q, sv, false); err != nil {
		return err
	}
	sv.UpdatedAt = s.now()
	_, err := q.Exec(ctx, `UPDATE compute_servers SET name=?, vm_state=?, task_state=?, power_state=?, host=?, flavor_id=?,
 image_ref=?, locked=?, availability_zone=?, key_name=?, hostname=?, tags=?, vcpus=?, memory_mb=?, disk_gb=?,
 updated_at=?, launched_at=?, terminated_at=?, deleted=?, doc=?, work_due=? WHERE id=?`,
		sv.Name, sv.VMState, sv.TaskState, sv.Power, sv.Host, sv.FlavorID, sv.ImageRef, b2i(sv.Locked), sv.AZ,
		sv.KeyName, sv.Hostname, joinTags(sv.Tags), sv.VCPUs, sv.MemoryMB, sv.DiskGB, store.FormatTime(sv.UpdatedAt),
		fmtTimePtr(sv.LaunchedAt), fmtTimePtr(sv.TerminatedAt), b2i(sv.Deleted), store.JSON(sv.Doc), b2i(workDue(sv)), sv.ID)
	return err
}

// loadServer reads one server row, deleted or not.
func (s *Service) loadServer(ctx context.Context, q store.Querier, id string, forUpdate bool) (*server, error) {
	query := `SELECT ` + serverCols + ` FROM compute_servers WHERE id=?`
	if forUpdate && q.Dialect() == store.Postgres {
		query += " FOR UPDATE"
	}
	return scanServer(q.QueryRow(ctx, query, id))
}

// visibleServer loads a server the caller may see: 404 "Instance <id> could
// not be found." for other projects' and deleted servers (admins see any
// project's live servers).
func (s *Service) visibleServer(ctx context.Context, q store.Querier, id string, forUpdate bool) (*server, error) {
	c := api.CallerFrom(ctx)
	sv, err := s.loadServer(ctx, q, id, forUpdate)
	if err == store.ErrNotFound || (err == nil && (sv.Deleted || (!c.IsAdmin() && sv.ProjectID != c.ProjectID))) {
		return nil, api.NotFound("Instance %s could not be found.", id)
	}
	return sv, err
}

// hostUsage returns, per host name, what the servers placed there hold
// (servers not deleted and not shelved-offloaded). Owner: servers.
func (s *Service) hostUsage(ctx context.Context, q store.Querier) (map[string]HostUsage, error) {
	rows, err := q.Query(ctx, `SELECT host, servers, vcpus, memory_mb, disk_gb FROM compute_host_usage WHERE servers > 0`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]HostUsage{}
	for rows.Next() {
		var h string
		var u HostUsage
		if err := rows.Scan(&h, &u.Servers, &u.VCPUs, &u.MemoryMB, &u.DiskGB); err != nil {
			return nil, err
		}
		out[h] = u
	}
	return out, rows.Err()
}

// quotaLock is the PostgreSQL advisory lock class that serialises quota
// checks of one project (lock key: this class and the project's hash), so
// two concurrent creates cannot both take the last instance. SQLite
// transactions are already serial.
const quotaLock = 7316

func lockProjectQuota(ctx context.Context, tx *store.Tx, projectID string) error {
	if tx.Dialect() != store.Postgres {
		return nil
	}
	_, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(?, hashtext(?))", quotaLock, projectID)
	return err
}

// projectUsage returns what a project's servers count against its quota:
// instances, cores and RAM of servers not deleted. Owner: servers.
func (s *Service) projectUsage(ctx context.Context, q store.Querier, projectID string) (instances, cores, ram int, err error) {
	// Quota counts the flavor, not the placement: shelved-offloaded servers
	// still count (nova counts instances.vcpus/memory_mb of live rows).
	err = q.QueryRow(ctx, `SELECT instances, cores, ram FROM compute_project_usage WHERE project_id = ?`,
		projectID).Scan(&instances, &cores, &ram)
	if store.IsNoRows(err) {
		return 0, 0, 0, nil
	}
	return
}
