package compute

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"nimbus/internal/api"
	"nimbus/internal/driver"
	"nimbus/internal/store"
)

// The Nova services Nimbus shows: one nova-compute per hypervisor host and,
// on each controller, the scheduler and conductor (in zone "internal").
const (
	binCompute   = "nova-compute"
	binScheduler = "nova-scheduler"
	binConductor = "nova-conductor"
	internalZone = "internal"
	serviceTime  = "2006-01-02T15:04:05.000000"
)

// serviceRow is one compute_services row; nova-compute rows also carry
// their hypervisor's (compute node's) ids.
type serviceRow struct {
	ID         int64
	UUID       string
	Host       string
	Binary     string
	Zone       string
	Disabled   bool
	Reason     *string
	ForcedDown bool
	NodeID     int64
	NodeUUID   string
	UpdatedAt  time.Time
}

const serviceColumns = "id, uuid, host, binary_name, zone, disabled, disabled_reason, forced_down, node_id, node_uuid, updated_at"

func scanService(row interface{ Scan(...any) error }) (*serviceRow, error) {
	var sv serviceRow
	var disabled, forced int
	var reason *string
	var updated string
	if err := row.Scan(&sv.ID, &sv.UUID, &sv.Host, &sv.Binary, &sv.Zone, &disabled, &reason, &forced,
		&sv.NodeID, &sv.NodeUUID, &updated); err != nil {
		if store.IsNoRows(err) {
			return nil, store.ErrNotFound
		}
		return nil, err
	}
	sv.Disabled, sv.ForcedDown, sv.Reason = disabled != 0, forced != 0, reason
	sv.UpdatedAt = store.ParseTime(updated)
	return &sv, nil
}

// controllerHost is the host name the controller's own services carry.
func controllerHost() string {
	if h, err := os.Hostname(); err == nil && h != "" {
		return h
	}
	return "controller"
}

// loadServices returns the services not deleted, by id.
func loadServices(ctx context.Context, q store.Querier) ([]*serviceRow, error) {
	rows, err := q.Query(ctx, "SELECT "+serviceColumns+" FROM compute_services WHERE deleted = 0 ORDER BY id")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*serviceRow
	for rows.Next() {
		sv, err := scanService(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, sv)
	}
	return out, rows.Err()
}

// ensureServices registers a service for every fleet host and the
// controller's scheduler and conductor. With revive (at start-up) a deleted
// service comes back, as nova-compute re-registers when it restarts. With a
// driver that forgets a host when its service is deleted (HostRemover, the
// fleet), a deleted nova-compute service also comes back as soon as its
// host is in the fleet again: an agent that registers the host again is a
// nova-compute re-creating its service.
func (s *Service) ensureServices(ctx context.Context, revive bool) error {
	hosts, err := s.driver.Hosts(ctx)
	if err != nil {
		return err
	}
	return s.ensureServicesFor(ctx, hosts, revive)
}

// ensureServicesFor is ensureServices for hosts already read.
func (s *Service) ensureServicesFor(ctx context.Context, hosts []driver.Host, revive bool) error {
	ctrl := controllerHost()
	type want struct{ host, binary, zone string }
	wants := []want{{ctrl, binScheduler, internalZone}, {ctrl, binConductor, internalZone}}
	for _, h := range hosts {
		wants = append(wants, want{h.Name, binCompute, cmpOr(h.Zone, "nova")})
	}
	_, reborn := s.driver.(HostRemover)
	comesBack := func(binary string) bool { return revive || (reborn && binary == binCompute) }
	if !revive {
		// The cheap path for every scheduling call: nothing to do when
		// each wanted service has a row. (Not a count: other controllers'
		// services are rows too, and hosts join whenever their agents
		// register.)
		have, err := serviceKeys(ctx, s.db)
		if err != nil {
			return err
		}
		missing := false
		for _, w := range wants {
			deleted, ok := have[w.host+"\x00"+w.binary]
			missing = missing || !ok || (deleted && comesBack(w.binary))
		}
		if !missing {
			return nil
		}
	}
	return s.db.Tx(ctx, func(tx *store.Tx) error {
		tx.AfterCommit(s.hosts.invalidate)
		now := store.FormatTime(s.now())
		for _, w := range wants {
			var deleted int
			err := tx.QueryRow(ctx, "SELECT deleted FROM compute_services WHERE host = ? AND binary_name = ?", w.host, w.binary).Scan(&deleted)
			if err == nil {
				if deleted != 0 && comesBack(w.binary) {
					if _, err := tx.Exec(ctx, "UPDATE compute_services SET deleted = 0, updated_at = ? WHERE host = ? AND binary_name = ?",
						now, w.host, w.binary); err != nil {
						return err
					}
				}
				if _, err := tx.Exec(ctx, "UPDATE compute_services SET zone = ? WHERE host = ? AND binary_name = ?",
					w.zone, w.host, w.binary); err != nil {
					return err
				}
				continue
			}
			if !store.IsNoRows(err) {
				return err
			}
			id, err := nextIntID(ctx, tx, "compute_services", "id")
			if err != nil {
				return err
			}
			var nodeID int64
			nodeUUID := ""
			if w.binary == binCompute {
				if nodeID, err = nextIntID(ctx, tx, "compute_services", "node_id"); err != nil {
					return err
				}
				nodeUUID = uuid.NewString()
			}
			if _, err := tx.Exec(ctx, `INSERT INTO compute_services (id, uuid, host, binary_name, zone, node_id, node_uuid,
				created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
				id, uuid.NewString(), w.host, w.binary, w.zone, nodeID, nodeUUID, now, now); err != nil {
				return err
			}
		}
		return nil
	})
}

// serviceKeys answers whether every service row, by host + "\x00" +
// binary, is deleted.
func serviceKeys(ctx context.Context, q store.Querier) (map[string]bool, error) {
	rows, err := q.Query(ctx, "SELECT host, binary_name, deleted FROM compute_services")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]bool{}
	for rows.Next() {
		var host, bin string
		var deleted int
		if err := rows.Scan(&host, &bin, &deleted); err != nil {
			return nil, err
		}
		out[host+"\x00"+bin] = deleted != 0
	}
	return out, rows.Err()
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// fleet returns the driver's hosts by name.
func (s *Service) fleet(ctx context.Context) (map[string]driver.Host, error) {
	hosts, err := s.driver.Hosts(ctx)
	if err != nil {
		return nil, err
	}
	m := make(map[string]driver.Host, len(hosts))
	for _, h := range hosts {
		m[h.Name] = h
	}
	return m, nil
}

// serviceUp is Nova's servicegroup answer: a compute service is up when its
// host answers and nobody forced it down; the controller's own services are
// up while it runs.
func serviceUp(sv *serviceRow, hosts map[string]driver.Host) bool {
	if sv.ForcedDown {
		return false
	}
	if sv.Binary != binCompute {
		return true
	}
	h, ok := hosts[sv.Host]
	return ok && h.Up
}

// enabledHosts returns the hosts that may take new servers: up, and with
// their compute service enabled, not forced down and not deleted.
//
// Placement asks on every create, so the answer is cached briefly: a change
// made through this controller drops the cache at once, one made through
// another controller sharing the database is seen within hostCacheTTL (as
// nova's scheduler sees service changes through its host-state cache).
func (s *Service) enabledHosts(ctx context.Context) ([]driver.Host, error) {
	_, enabled, err := s.hostSets(ctx)
	return enabled, err
}

// hostSets returns, from one read of the fleet, every host and the enabled
// ones (see enabledHosts), cached alike.
func (s *Service) hostSets(ctx context.Context) (all, enabled []driver.Host, err error) {
	if all, enabled, ok := s.hosts.get(s.now()); ok {
		return all, enabled, nil
	}
	gen := s.hosts.gen.Load()
	all, enabled, err = s.loadHostSets(ctx)
	if err != nil {
		return nil, nil, err
	}
	s.hosts.put(all, enabled, gen, s.now())
	return all, enabled, nil
}

// hostCacheTTL bounds how stale the cached schedulable hosts may be.
const hostCacheTTL = 2 * time.Second

// hostCache holds the last answer of loadHostSets.
type hostCache struct {
	mu           sync.Mutex
	all, enabled []driver.Host
	until        time.Time
	valid        uint64
	gen          atomic.Uint64
}

func (c *hostCache) get(now time.Time) (all, enabled []driver.Host, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.valid == 0 || c.valid != c.gen.Load()+1 || now.After(c.until) {
		return nil, nil, false
	}
	return c.all, c.enabled, true
}

// put stores hosts read at generation gen; a change since then leaves the
// cache empty.
func (c *hostCache) put(all, enabled []driver.Host, gen uint64, now time.Time) {
	c.mu.Lock()
	c.all, c.enabled, c.until, c.valid = all, enabled, now.Add(hostCacheTTL), gen+1
	c.mu.Unlock()
}

// invalidate forgets the cached hosts after a service change.
func (c *hostCache) invalidate() { c.gen.Add(1) }

func (s *Service) loadHostSets(ctx context.Context) (all, enabled []driver.Host, err error) {
	hosts, err := s.driver.Hosts(ctx)
	if err != nil {
		return nil, nil, err
	}
	if err := s.ensureServicesFor(ctx, hosts, false); err != nil {
		return nil, nil, err
	}
	svcs, err := loadServices(ctx, s.db)
	if err != nil {
		return nil, nil, err
	}
	ok := map[string]bool{}
	for _, sv := range svcs {
		if sv.Binary == binCompute && !sv.Disabled && !sv.ForcedDown {
			ok[sv.Host] = true
		}
	}
	for _, h := range hosts {
		if h.Up && ok[h.Name] {
			enabled = append(enabled, h)
		}
	}
	return hosts, enabled, nil
}

// serviceView is services.py _get_service_detail; a compute host's zone is
// the one its aggregates give it (set_availability_zones).
func (s *Service) serviceView(r *http.Request, sv *serviceRow, hosts map[string]driver.Host) map[string]any {
	v := VersionFrom(r.Context())
	up := serviceUp(sv, hosts)
	updated := sv.UpdatedAt
	if up {
		updated = s.now()
	}
	m := map[string]any{
		"binary": sv.Binary, "host": sv.Host, "zone": s.zoneOf(r.Context(), sv),
		"status":     map[bool]string{true: "disabled", false: "enabled"}[sv.Disabled],
		"state":      map[bool]string{true: "up", false: "down"}[up],
		"updated_at": updated.UTC().Format(serviceTime), "disabled_reason": sv.Reason,
	}
	if v.AtLeast(53) {
		m["id"] = sv.UUID
	} else {
		m["id"] = sv.ID
	}
	if v.AtLeast(11) {
		m["forced_down"] = sv.ForcedDown
	}
	return m
}

func (s *Service) listServices(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	svcs, hosts, err := s.servicesAndHosts(ctx)
	if err != nil {
		return nil, err
	}
	q := r.URL.Query()
	if err := strictQuery(r, "host", "binary"); err != nil {
		return nil, err
	}
	out := []any{}
	for _, sv := range svcs {
		if h := q.Get("host"); h != "" && h != sv.Host {
			continue
		}
		if b := q.Get("binary"); b != "" && b != sv.Binary {
			continue
		}
		out = append(out, s.serviceView(r, sv, hosts))
	}
	return api.JSON(http.StatusOK, map[string]any{"services": out}), nil
}

// updateService is PUT /os-services/{id}: before 2.53 {id} names the action
// (enable, disable, disable-log-reason, force-down) and the body the host
// and binary; from 2.53 {id} is the service's UUID.
func (s *Service) updateService(r *http.Request) (*api.Response, error) {
	if VersionFrom(r.Context()).AtLeast(53) {
		return s.updateServiceByID(r)
	}
	return s.updateServiceLegacy(r)
}

func (s *Service) updateServiceLegacy(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	action := r.PathValue("id")
	allowed := map[string][]string{
		"enable": {"host", "binary"}, "disable": {"host", "binary"},
		"disable-log-reason": {"host", "binary", "disabled_reason"},
	}
	if VersionFrom(ctx).AtLeast(11) {
		allowed["force-down"] = []string{"host", "binary", "forced_down"}
	}
	fields, ok := allowed[action]
	if !ok {
		return nil, api.NotFound("Unknown action")
	}
	var body map[string]json.RawMessage
	if err := api.DecodeJSON(r, &body); err != nil {
		return nil, err
	}
	if body == nil {
		return nil, api.BadRequest("Invalid input for field/attribute body. Value: None. None is not of type 'object'")
	}
	if err := api.UnknownFields(body, fields...); err != nil {
		return nil, err
	}
	vals := map[string]string{}
	for _, f := range fields {
		raw, ok := body[f]
		if !ok {
			return nil, api.SchemaError("body", body, "'%s' is a required property", f)
		}
		if f == "forced_down" {
			continue
		}
		str, ok := rawString(raw)
		if !ok || str == "" || len(str) > 255 {
			return nil, api.SchemaError(f, raw, "%s is not a valid %s", api.PyRepr(raw), f)
		}
		vals[f] = str
	}
	var forced bool
	if action == "force-down" {
		var err error
		if forced, err = rawBool("forced_down", body["forced_down"]); err != nil {
			return nil, err
		}
	}
	host, binary := vals["host"], vals["binary"]
	if binary != binCompute {
		return nil, api.BadRequest("Updating a %s service is not supported. Only nova-compute services can be updated.", binary)
	}
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		sv, err := scanService(tx.QueryRow(ctx, "SELECT "+serviceColumns+" FROM compute_services WHERE host = ? AND binary_name = ? AND deleted = 0", host, binary))
		if err == store.ErrNotFound {
			return api.NotFound("Could not find binary %s on host %s.", binary, host)
		}
		if err != nil {
			return err
		}
		return s.setService(ctx, tx, sv, action, vals["disabled_reason"], forced)
	})
	if err != nil {
		return nil, err
	}
	out := map[string]any{"host": host, "binary": binary}
	switch action {
	case "enable":
		out["status"] = "enabled"
	case "disable":
		out["status"] = "disabled"
	case "disable-log-reason":
		out["status"] = "disabled"
		out["disabled_reason"] = vals["disabled_reason"]
	case "force-down":
		out["forced_down"] = forced
	}
	return api.JSON(http.StatusOK, map[string]any{"service": out}), nil
}

// setService applies one change to a service row.
func (s *Service) setService(ctx context.Context, tx *store.Tx, sv *serviceRow, action, reason string, forced bool) error {
	tx.AfterCommit(s.hosts.invalidate)
	now := store.FormatTime(s.now())
	var err error
	switch action {
	case "enable":
		_, err = tx.Exec(ctx, "UPDATE compute_services SET disabled = 0, disabled_reason = NULL, updated_at = ? WHERE id = ?", now, sv.ID)
	case "disable":
		_, err = tx.Exec(ctx, "UPDATE compute_services SET disabled = 1, disabled_reason = NULL, updated_at = ? WHERE id = ?", now, sv.ID)
	case "disable-log-reason":
		_, err = tx.Exec(ctx, "UPDATE compute_services SET disabled = 1, disabled_reason = ?, updated_at = ? WHERE id = ?", reason, now, sv.ID)
	case "force-down":
		_, err = tx.Exec(ctx, "UPDATE compute_services SET forced_down = ?, updated_at = ? WHERE id = ?", b2int(forced), now, sv.ID)
	}
	return err
}

func (s *Service) updateServiceByID(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	id := r.PathValue("id")
	if _, err := uuid.Parse(id); err != nil {
		return nil, api.BadRequest("Invalid uuid %s", id)
	}
	var body map[string]json.RawMessage
	if err := api.DecodeJSON(r, &body); err != nil {
		return nil, err
	}
	if body == nil {
		return nil, api.BadRequest("Invalid input for field/attribute body. Value: None. None is not of type 'object'")
	}
	if err := api.UnknownFields(body, "status", "disabled_reason", "forced_down"); err != nil {
		return nil, err
	}
	status := ""
	if raw, ok := body["status"]; ok {
		st, ok := rawString(raw)
		if !ok || (st != "enabled" && st != "disabled") {
			return nil, api.SchemaError("status", raw, "%s is not one of ['enabled', 'disabled']", api.PyRepr(raw))
		}
		status = st
	}
	reason, hasReason := "", false
	if raw, ok := body["disabled_reason"]; ok {
		str, ok := rawString(raw)
		if !ok || str == "" || len(str) > 255 {
			return nil, api.SchemaError("disabled_reason", raw, "%s is not of type 'string'", api.PyRepr(raw))
		}
		reason, hasReason = str, true
	}
	var forced *bool
	if raw, ok := body["forced_down"]; ok {
		b, err := rawBool("forced_down", raw)
		if err != nil {
			return nil, err
		}
		forced = &b
	}
	if status == "" && forced == nil {
		return nil, api.BadRequest("No updates were requested. Fields 'status' or 'forced_down' should be specified.")
	}
	if hasReason && status == "enabled" {
		return nil, api.BadRequest("Specifying 'disabled_reason' with status 'enabled' is invalid.")
	}
	var sv *serviceRow
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		var err error
		sv, err = scanService(tx.QueryRow(ctx, "SELECT "+serviceColumns+" FROM compute_services WHERE uuid = ? AND deleted = 0", id))
		if err == store.ErrNotFound {
			return api.NotFound("Service %s could not be found.", id)
		}
		if err != nil {
			return err
		}
		if sv.Binary != binCompute {
			return api.BadRequest("Updating a %s service is not supported. Only nova-compute services can be updated.", sv.Binary)
		}
		switch {
		case status == "enabled":
			err = s.setService(ctx, tx, sv, "enable", "", false)
		case status == "disabled" && hasReason:
			err = s.setService(ctx, tx, sv, "disable-log-reason", reason, false)
		case status == "disabled":
			err = s.setService(ctx, tx, sv, "disable", "", false)
		}
		if err == nil && forced != nil {
			err = s.setService(ctx, tx, sv, "force-down", "", *forced)
		}
		if err != nil {
			return err
		}
		sv, err = scanService(tx.QueryRow(ctx, "SELECT "+serviceColumns+" FROM compute_services WHERE id = ?", sv.ID))
		return err
	})
	if err != nil {
		return nil, err
	}
	hosts, err := s.fleet(ctx)
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, map[string]any{"service": s.serviceView(r, sv, hosts)}), nil
}

// deleteService marks a service deleted (204); a compute service that
// still hosts servers is a 409 (services.py delete).
func (s *Service) deleteService(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	id := r.PathValue("id")
	where, arg := "uuid = ?", any(id)
	if VersionFrom(ctx).AtLeast(53) {
		if _, err := uuid.Parse(id); err != nil {
			return nil, api.BadRequest("Invalid uuid %s", id)
		}
	} else {
		n, err := strconv.ParseInt(id, 10, 64)
		if err != nil {
			return nil, api.BadRequest("Invalid input received: id must be an integer")
		}
		where, arg = "id = ?", n
	}
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		sv, err := scanService(tx.QueryRow(ctx, "SELECT "+serviceColumns+" FROM compute_services WHERE deleted = 0 AND "+where, arg))
		if err == store.ErrNotFound {
			return api.NotFound("Service %s not found.", id)
		}
		if err != nil {
			return err
		}
		if sv.Binary == binCompute {
			return s.removeHost(ctx, tx, sv.Host)
		}
		tx.AfterCommit(s.hosts.invalidate)
		_, err = tx.Exec(ctx, "UPDATE compute_services SET deleted = 1, updated_at = ? WHERE id = ?", store.FormatTime(s.now()), sv.ID)
		return err
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(http.StatusNoContent), nil
}

// errHostServers is Nova's answer to deleting a compute service that still
// hosts servers.
func errHostServers() error {
	return api.Conflict("Unable to delete compute service that is hosting instances. Migrate or delete the instances first.")
}

// HostRemover is a driver that forgets a host when its compute service is
// deleted, in the same transaction (the fleet); driver.ErrHostInUse
// refuses it.
type HostRemover interface {
	RemoveHost(ctx context.Context, tx *store.Tx, host string) (bool, error)
}

// removeHost is deleteService for a nova-compute service: the service,
// the host's aggregate memberships and the driver's host go together.
func (s *Service) removeHost(ctx context.Context, tx *store.Tx, host string) error {
	left, err := RemoveComputeHost(ctx, tx, host)
	if err != nil {
		return err
	}
	if left {
		s.aggregateHostsChanged(tx)
	}
	tx.AfterCommit(s.hosts.invalidate)
	if r, ok := s.driver.(HostRemover); ok {
		if _, err := r.RemoveHost(ctx, tx, host); errors.Is(err, driver.ErrHostInUse) {
			return errHostServers()
		} else if err != nil {
			return err
		}
	}
	return nil
}

// RemoveComputeHost deletes, in tx, a host's nova-compute service and its
// aggregate memberships (nova services.py delete), refused with Nova's
// 409 while servers are placed there. It tells whether the host left an
// aggregate. "nimbus admin host remove" calls it beside the fleet's
// RemoveHost; a running controller sees the change within hostCacheTTL.
func RemoveComputeHost(ctx context.Context, tx *store.Tx, host string) (leftAggregates bool, err error) {
	var servers int
	err = tx.QueryRow(ctx, "SELECT servers FROM compute_host_usage WHERE host = ?", host).Scan(&servers)
	if err != nil && !store.IsNoRows(err) {
		return false, err
	}
	if servers > 0 {
		return false, errHostServers()
	}
	res, err := tx.Exec(ctx, "DELETE FROM compute_aggregate_hosts WHERE host = ?", host)
	if err != nil {
		return false, err
	}
	n, _ := res.RowsAffected()
	_, err = tx.Exec(ctx, "UPDATE compute_services SET deleted = 1, updated_at = ? WHERE host = ? AND binary_name = ? AND deleted = 0",
		store.FormatTime(time.Now()), host, binCompute)
	return n > 0, err
}

// HostStatus is a host's nova-compute service as "nimbus admin host"
// shows and changes it.
type HostStatus struct {
	Disabled bool
	Reason   string
}

// HostStatuses answers the status of every nova-compute service not
// deleted, by host.
func HostStatuses(ctx context.Context, q store.Querier) (map[string]HostStatus, error) {
	svcs, err := loadServices(ctx, q)
	if err != nil {
		return nil, err
	}
	out := map[string]HostStatus{}
	for _, sv := range svcs {
		if sv.Binary == binCompute {
			out[sv.Host] = HostStatus{Disabled: sv.Disabled, Reason: derefStr(sv.Reason)}
		}
	}
	return out, nil
}

// SetHostStatus disables (with an optional reason) or enables a host's
// nova-compute service, as PUT /os-services does; store.ErrNotFound when
// the host has none. A running controller sees it within hostCacheTTL.
func SetHostStatus(ctx context.Context, db *store.DB, host string, st HostStatus) error {
	var reason *string
	if st.Reason != "" {
		reason = &st.Reason
	}
	res, err := db.Exec(ctx, "UPDATE compute_services SET disabled = ?, disabled_reason = ?, updated_at = ? WHERE host = ? AND binary_name = ? AND deleted = 0",
		b2int(st.Disabled), reason, store.FormatTime(time.Now()), host, binCompute)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return store.ErrNotFound
	}
	return nil
}
