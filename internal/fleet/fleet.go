// Package fleet is the controller's side of the hypervisor hosts: it keeps
// the hosts that agents (internal/agent) register, and it is the driver the
// compute service drives, turning each per-server call into an op for the
// agent of the server's host and waiting for its result.
//
// Everything lives in the database (migration 0014), so several controllers
// can share one PostgreSQL database: an op made on one controller reaches an
// agent connected to another, which finds it by polling, and its result is
// seen by the first the same way. A single controller skips the polling:
// it wakes its own long-polls and waiters in-process.
//
// A host is up while its agent has heartbeated within DownAfter and reports
// it healthy (Nova's service_down_time). A call for a server on a down host
// answers driver.ErrHostDown at once; an op waits at most OpTimeout.
package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"nimbus/internal/driver"
	"nimbus/internal/fleet/wire"
	"nimbus/internal/store"
)

// Defaults for Config.
const (
	DefaultDownAfter    = 60 * time.Second
	DefaultOpTimeout    = 10 * time.Minute
	DefaultPollInterval = 250 * time.Millisecond
	DefaultMaxWait      = 25 * time.Second
	DefaultLostCheck    = 10 * time.Second
)

// Config tunes the fleet.
type Config struct {
	// DownAfter is how long a host may go without a heartbeat before it
	// is down (default 60 s, Nova's service_down_time).
	DownAfter time.Duration
	// OpTimeout bounds how long a call waits for its op (default 10 min).
	OpTimeout time.Duration
	// PollInterval is how often the database is polled for what other
	// controllers sharing it did (ops for agents connected here, results
	// of ops waited on here), while anything waits (default 250 ms).
	PollInterval time.Duration
	// MaxWait caps an agent's long-poll (default 25 s).
	MaxWait time.Duration
	// LostCheck is how often the ops waited on here are looked for in the
	// database, and how old a wait must be before its op's absence counts
	// (default 10 s, far longer than an insert takes to commit).
	LostCheck time.Duration
	Log       *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Service is the fleet: a driver.Driver for compute and the agent API.
type Service struct {
	db  *store.DB
	cfg Config
	log *slog.Logger
	hub *hub

	lmu      sync.Mutex
	listener driver.PowerListener

	writes          *committer
	creds           credCache
	agentHostsCache sync.Map // agent id → cachedHosts
	images          atomic.Pointer[Images]
	placements      atomic.Pointer[Placements]
	inventories     sync.Map // host name → *parsedInventory

	net netServing // the bridged data plane (netstate.go)

	done      chan struct{}
	closeOnce sync.Once
}

var (
	_ driver.Driver        = (*Service)(nil)
	_ driver.PowerNotifier = (*Service)(nil)
)

// New makes the fleet service on db.
func New(db *store.DB, cfg Config) *Service {
	if cfg.DownAfter <= 0 {
		cfg.DownAfter = DefaultDownAfter
	}
	if cfg.OpTimeout <= 0 {
		cfg.OpTimeout = DefaultOpTimeout
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	if cfg.MaxWait <= 0 {
		cfg.MaxWait = DefaultMaxWait
	}
	if cfg.LostCheck <= 0 {
		cfg.LostCheck = DefaultLostCheck
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Service{db: db, cfg: cfg, log: cfg.Log, hub: newHub(), done: make(chan struct{}), writes: &committer{db: db},
		creds: credCache{m: map[string]credEntry{}}}
}

// Config is the service's settings, defaults filled in.
func (s *Service) Config() Config { return s.cfg }

// Close ends open long-polls at once (and answers later ones empty), so
// that the listener can shut down without waiting for them. Calls still
// waiting end with their contexts; Run with its.
func (s *Service) Close() {
	s.closeOnce.Do(func() { close(s.done) })
}

// Name is "fleet".
func (s *Service) Name() string { return "fleet" }

// SetPowerListener sets who is told of power states that changed by
// themselves, as heartbeats report them.
func (s *Service) SetPowerListener(l driver.PowerListener) {
	s.lmu.Lock()
	s.listener = l
	s.lmu.Unlock()
}

func (s *Service) powerListener() driver.PowerListener {
	s.lmu.Lock()
	defer s.lmu.Unlock()
	return s.listener
}

func (s *Service) now() time.Time { return s.cfg.Now() }

// hostRow is one fleet_hosts row.
type hostRow struct {
	Name, AgentID, Inventory, Health string
	Up                               bool
	Observed                         int64
	Registered, Seen                 time.Time
}

const hostColumns = "name, agent_id, inventory, up, health, observed, registered_at, seen_at"

func scanHost(row interface{ Scan(...any) error }) (*hostRow, error) {
	var h hostRow
	var up int
	var reg, seen string
	if err := row.Scan(&h.Name, &h.AgentID, &h.Inventory, &up, &h.Health, &h.Observed, &reg, &seen); err != nil {
		if store.IsNoRows(err) {
			return nil, store.ErrNotFound
		}
		return nil, err
	}
	h.Up, h.Registered, h.Seen = up != 0, store.ParseTime(reg), store.ParseTime(seen)
	return &h, nil
}

// alive tells whether the host's agent has been heard from in time.
func (s *Service) alive(h *hostRow, now time.Time) bool {
	return h.AgentID != "" && now.Sub(h.Seen) < s.cfg.DownAfter
}

// isUp is whether work may be sent to the host.
func (s *Service) isUp(h *hostRow, now time.Time) bool { return h.Up && s.alive(h, now) }

// view is the driver.Host compute sees: the registered inventory with Up
// and Health from the latest reports.
func (s *Service) view(h *hostRow, now time.Time) driver.Host {
	d := s.inventory(h)
	d.Name = h.Name
	d.Up = s.isUp(h, now)
	d.Health = h.Health
	switch {
	case h.AgentID == "":
		d.Health = "no agent presents this host"
	case !s.alive(h, now):
		d.Health = "no heartbeat since " + h.Seen.UTC().Format(time.RFC3339)
	case !h.Up && d.Health == "":
		d.Health = "down"
	}
	return d
}

// parsedInventory is a host's inventory as last decoded.
type parsedInventory struct {
	raw  string
	host driver.Host
}

// inventory decodes a host's inventory, from the cache when it has not
// changed: compute asks for the hosts on every admin server listing, and a
// real host's topology makes its inventory large.
func (s *Service) inventory(h *hostRow) driver.Host {
	if v, ok := s.inventories.Load(h.Name); ok && v.(*parsedInventory).raw == h.Inventory {
		return copyHost(v.(*parsedInventory).host)
	}
	var d driver.Host
	if err := json.Unmarshal([]byte(h.Inventory), &d); err != nil {
		s.log.Warn("fleet: bad inventory", "host", h.Name, "error", err)
	}
	s.inventories.Store(h.Name, &parsedInventory{raw: h.Inventory, host: d})
	return copyHost(d)
}

// copyHost copies a host's slices, so that callers cannot change the
// cached one.
func copyHost(h driver.Host) driver.Host {
	h.GPUs = append([]driver.GPU(nil), h.GPUs...)
	h.CPUs = append([]driver.CPU(nil), h.CPUs...)
	h.ReservedCPUs = append([]int(nil), h.ReservedCPUs...)
	h.NUMANodes = append([]driver.NUMANode(nil), h.NUMANodes...)
	return h
}

func (s *Service) loadHosts(ctx context.Context, q store.Querier) ([]*hostRow, error) {
	rows, err := q.Query(ctx, "SELECT "+hostColumns+" FROM fleet_hosts ORDER BY registered_at, position, name")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*hostRow
	for rows.Next() {
		h, err := scanHost(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, h)
	}
	return out, rows.Err()
}

// Hosts lists the registered hosts in the order they came; a host whose agent has not heartbeated
// within DownAfter, or that its agent reports unhealthy, is not Up.
func (s *Service) Hosts(ctx context.Context) ([]driver.Host, error) {
	hs, err := s.loadHosts(ctx, s.db)
	if err != nil {
		return nil, fmt.Errorf("fleet: hosts: %w", err)
	}
	now := s.now()
	out := make([]driver.Host, len(hs))
	for i, h := range hs {
		out[i] = s.view(h, now)
	}
	return out, nil
}

// host reads one host; store.ErrNotFound when none is registered by name.
func (s *Service) host(ctx context.Context, name string) (*hostRow, error) {
	return scanHost(s.db.QueryRow(ctx, "SELECT "+hostColumns+" FROM fleet_hosts WHERE name = ?", name))
}

// List returns every VM the agents reported and not since destroyed.
func (s *Service) List(ctx context.Context) ([]driver.Instance, error) {
	rows, err := s.db.Query(ctx, "SELECT server_id, host, power FROM fleet_instances WHERE gone = 0 AND observed > 0")
	if err != nil {
		return nil, fmt.Errorf("fleet: list: %w", err)
	}
	defer rows.Close()
	var out []driver.Instance
	for rows.Next() {
		var in driver.Instance
		var p int
		if err := rows.Scan(&in.ID, &in.Host, &p); err != nil {
			return nil, err
		}
		in.Power = driver.PowerState(p)
		out = append(out, in)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, rows.Err()
}

// State returns a server's last reported power state.
func (s *Service) State(ctx context.Context, id string) (driver.PowerState, error) {
	var p, gone int
	err := s.db.QueryRow(ctx, "SELECT power, gone FROM fleet_instances WHERE server_id = ?", id).Scan(&p, &gone)
	if store.IsNoRows(err) || (err == nil && gone != 0) {
		return driver.NoState, driver.ErrNotFound
	}
	if err != nil {
		return driver.NoState, fmt.Errorf("fleet: state: %w", err)
	}
	return driver.PowerState(p), nil
}

// Spawn creates and boots a server on spec.Host.
func (s *Service) Spawn(ctx context.Context, spec driver.Spec) error {
	if spec.ServerID == "" || spec.Host == "" {
		return errors.New("fleet: spawn needs a server id and a host")
	}
	_, err := s.call(ctx, wire.KindSpawn, spec.ServerID, spec.Host, spec)
	return err
}

// Destroy removes a server from its host; an unknown server is not an
// error.
func (s *Service) Destroy(ctx context.Context, id string) error {
	_, err := s.call(ctx, wire.KindDestroy, id, "", nil)
	if errors.Is(err, driver.ErrNotFound) {
		return nil
	}
	return err
}

// PowerOff stops a server.
func (s *Service) PowerOff(ctx context.Context, id string, graceful bool) error {
	_, err := s.call(ctx, wire.KindPowerOff, id, "", wire.PowerOffArgs{Graceful: graceful})
	return err
}

// PowerOn starts a stopped server.
func (s *Service) PowerOn(ctx context.Context, id string) error {
	_, err := s.call(ctx, wire.KindPowerOn, id, "", nil)
	return err
}

// Reboot restarts a server.
func (s *Service) Reboot(ctx context.Context, id string, hard bool) error {
	_, err := s.call(ctx, wire.KindReboot, id, "", wire.RebootArgs{Hard: hard})
	return err
}

// Pause freezes a server's vCPUs.
func (s *Service) Pause(ctx context.Context, id string) error {
	_, err := s.call(ctx, wire.KindPause, id, "", nil)
	return err
}

// Unpause thaws a paused server.
func (s *Service) Unpause(ctx context.Context, id string) error {
	_, err := s.call(ctx, wire.KindUnpause, id, "", nil)
	return err
}

// Suspend saves a server's state and stops it.
func (s *Service) Suspend(ctx context.Context, id string) error {
	_, err := s.call(ctx, wire.KindSuspend, id, "", nil)
	return err
}

// Resume brings a suspended server back.
func (s *Service) Resume(ctx context.Context, id string) error {
	_, err := s.call(ctx, wire.KindResume, id, "", nil)
	return err
}

// Resize changes a server's CPU, RAM and disk on spec.Host (its own host
// when empty).
func (s *Service) Resize(ctx context.Context, spec driver.Spec) error {
	_, err := s.call(ctx, wire.KindResize, spec.ServerID, spec.Host, spec)
	return err
}

// ConfirmResize drops the disk a server's last resize kept.
func (s *Service) ConfirmResize(ctx context.Context, id string) error {
	_, err := s.call(ctx, wire.KindConfirm, id, "", nil)
	return err
}

// Snapshot copies a server's boot disk and returns its size.
func (s *Service) Snapshot(ctx context.Context, id, imageID string) (int64, error) {
	raw, err := s.call(ctx, wire.KindSnapshot, id, "", wire.SnapshotArgs{ImageID: imageID})
	if err != nil {
		return 0, err
	}
	var r wire.SnapshotResult
	if err := json.Unmarshal(raw, &r); err != nil {
		return 0, fmt.Errorf("fleet: snapshot result: %w", err)
	}
	return r.SizeBytes, nil
}

// Access lists how to log in to a server.
func (s *Service) Access(ctx context.Context, id string) ([]driver.Access, error) {
	raw, err := s.call(ctx, wire.KindAccess, id, "", nil)
	if err != nil {
		return nil, err
	}
	var r wire.AccessResult
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, fmt.Errorf("fleet: access result: %w", err)
	}
	return r.Access, nil
}

// Console says where a server's VNC console is reached.
func (s *Service) Console(ctx context.Context, id string) (driver.ConsoleEndpoint, error) {
	raw, err := s.call(ctx, wire.KindVNC, id, "", nil)
	if err != nil {
		return driver.ConsoleEndpoint{}, err
	}
	var r wire.VNCResult
	if err := json.Unmarshal(raw, &r); err != nil {
		return driver.ConsoleEndpoint{}, fmt.Errorf("fleet: console result: %w", err)
	}
	return r.Endpoint, nil
}

// ConsoleOutput returns the last lines of a server's serial console.
func (s *Service) ConsoleOutput(ctx context.Context, id string, lines int) (string, error) {
	raw, err := s.call(ctx, wire.KindConsole, id, "", wire.ConsoleArgs{Lines: lines})
	if err != nil {
		return "", err
	}
	var r wire.ConsoleResult
	if err := json.Unmarshal(raw, &r); err != nil {
		return "", fmt.Errorf("fleet: console result: %w", err)
	}
	return r.Output, nil
}
