package compute

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/driver"
	"nimbus/internal/flavorspec"
	"nimbus/internal/scheduler"
	"nimbus/internal/store"
)

// Placement claims: the scheduler (internal/scheduler) decides on an
// in-memory snapshot of the fleet, and the transaction that places a server
// writes its claim here, where the store re-checks every pCPU, GPU, MiB and
// GiB it takes (migration 0012). A claim refused by the store means the
// snapshot was stale (another controller placed there): the snapshot is
// reloaded and placement looks again.

// errClaimConflict is a claim the store refused.
var errClaimConflict = errors.New("compute: placement claim conflicts with the store")

// resizeSourceKey is the key under which a resizing server's old claim is
// held until the resize is confirmed or reverted, as Nova keeps the source
// allocation on the migration record.
func resizeSourceKey(serverID string) string { return serverID + "/resize-source" }

// diskNode is compute_host_capacity's node for the local disk pool.
const diskNode = -1

// writeClaim records claim c under key in tx, re-checking each item: a pCPU
// or GPU already held, or a node's memory or the disk pool that would go
// over, is errClaimConflict.
func writeClaim(ctx context.Context, tx *store.Tx, key string, c scheduler.Claim, now time.Time) error {
	cells, gpus := store.JSON(c.Cells), store.JSON(append([]string{}, c.GPUs...))
	if _, err := tx.Exec(ctx, `INSERT INTO compute_claims (server_id, host, cells, gpus, disk_gb, created_at) VALUES (?,?,?,?,?,?)`,
		key, c.Host, cells, gpus, c.DiskGB, store.FormatTime(now)); err != nil {
		return conflictAs(err)
	}
	items := c.Items()
	// One statement per 300 items keeps under every engine's parameter cap.
	for len(items) > 0 {
		n := min(len(items), 300)
		var b strings.Builder
		args := make([]any, 0, 3*n)
		b.WriteString("INSERT INTO compute_claim_items (host, item, server_id) VALUES ")
		for i, it := range items[:n] {
			if i > 0 {
				b.WriteString(",")
			}
			b.WriteString("(?,?,?)")
			args = append(args, c.Host, it, key)
		}
		if _, err := tx.Exec(ctx, b.String(), args...); err != nil {
			return conflictAs(err)
		}
		items = items[n:]
	}
	take := func(node, amount int) error {
		if amount == 0 {
			return nil
		}
		res, err := tx.Exec(ctx, `UPDATE compute_host_capacity SET used = used + ? WHERE host = ? AND node = ? AND used + ? <= total`,
			amount, c.Host, node, amount)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil || n != 1 {
			return fmt.Errorf("%w: %s node %d has no room for %d more", errClaimConflict, c.Host, node, amount)
		}
		return nil
	}
	for _, cell := range c.Cells {
		if err := take(cell.Node, cell.MemoryMB); err != nil {
			return err
		}
	}
	return take(diskNode, c.DiskGB)
}

func conflictAs(err error) error {
	if errors.Is(err, store.ErrConflict) {
		return fmt.Errorf("%w: %v", errClaimConflict, err)
	}
	return err
}

// loadClaim reads the claim stored under key; ok is false when there is none.
func loadClaim(ctx context.Context, q store.Querier, key string) (c scheduler.Claim, ok bool, err error) {
	var cells, gpus string
	err = q.QueryRow(ctx, `SELECT host, cells, gpus, disk_gb FROM compute_claims WHERE server_id = ?`, key).
		Scan(&c.Host, &cells, &gpus, &c.DiskGB)
	if store.IsNoRows(err) {
		return c, false, nil
	}
	if err != nil {
		return c, false, err
	}
	if err := decodeClaim(&c, cells, gpus); err != nil {
		return c, false, err
	}
	return c, true, nil
}

func decodeClaim(c *scheduler.Claim, cells, gpus string) error {
	if err := store.FromJSON(cells, &c.Cells); err != nil {
		return err
	}
	return store.FromJSON(gpus, &c.GPUs)
}

// dropClaim removes the claim under key in tx, giving its pCPUs, GPUs,
// memory and disk back; the scheduler's snapshot frees it once tx commits.
func (s *Service) dropClaim(ctx context.Context, tx *store.Tx, key string) error {
	c, ok, err := loadClaim(ctx, tx, key)
	if err != nil || !ok {
		return err
	}
	if _, err := tx.Exec(ctx, `DELETE FROM compute_claim_items WHERE server_id = ?`, key); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `DELETE FROM compute_claims WHERE server_id = ?`, key); err != nil {
		return err
	}
	give := func(node, amount int) error {
		if amount == 0 {
			return nil
		}
		_, err := tx.Exec(ctx, `UPDATE compute_host_capacity SET used = used - ? WHERE host = ? AND node = ?`, amount, c.Host, node)
		return err
	}
	for _, cell := range c.Cells {
		if err := give(cell.Node, cell.MemoryMB); err != nil {
			return err
		}
	}
	if err := give(diskNode, c.DiskGB); err != nil {
		return err
	}
	tx.AfterCommit(func() {
		if st := s.sched.state.Load(); st != nil {
			st.Release(c)
		}
	})
	return nil
}

// moveClaim re-keys a stored claim (a resize's source and back).
func moveClaim(ctx context.Context, tx *store.Tx, from, to string) error {
	if _, err := tx.Exec(ctx, `UPDATE compute_claims SET server_id = ? WHERE server_id = ?`, to, from); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `UPDATE compute_claim_items SET server_id = ? WHERE server_id = ?`, to, from)
	return err
}

// releaseServer drops every claim a server holds (its own and a resize's
// source), for delete, shelve-offload and a build that failed.
func (s *Service) releaseServer(ctx context.Context, tx *store.Tx, serverID string) error {
	if err := s.dropClaim(ctx, tx, serverID); err != nil {
		return err
	}
	return s.dropClaim(ctx, tx, resizeSourceKey(serverID))
}

// schedView is the compute service's scheduler snapshot and what it was
// built from.
type schedView struct {
	policy scheduler.Policy
	state  atomic.Pointer[scheduler.State]

	mu       sync.Mutex        // serialises loads and host refreshes
	hostKeys map[string]uint64 // what SetHost was last given, per host (under mu)
	// Read without mu on every placement, so atomic: when the snapshot was
	// loaded, and the enabledHosts cache generation and time its hosts
	// were last refreshed from (unix nanoseconds).
	loadedAt atomic.Int64
	hostGen  atomic.Uint64
	hostAt   atomic.Int64
}

// schedResync bounds how long the snapshot goes without a full reload from
// the store; other controllers' releases are seen within it (their claims
// are seen at once, through conflicts).
const schedResync = 60 * time.Second

// schedState returns the scheduler's snapshot, loading it on first use and
// refreshing its hosts when the fleet or the services changed.
func (s *Service) schedState(ctx context.Context) (*scheduler.State, error) {
	v := &s.sched
	st := v.state.Load()
	now := s.now().UnixNano()
	if st != nil && now-v.loadedAt.Load() < int64(schedResync) {
		if v.hostGen.Load() == s.hosts.gen.Load() && now-v.hostAt.Load() < int64(hostCacheTTL) {
			return st, nil
		}
		v.mu.Lock()
		defer v.mu.Unlock()
		st = v.state.Load() // a reload may have replaced it meanwhile
		if err := s.refreshSchedHosts(ctx, st, false); err != nil {
			return nil, err
		}
		return st, nil
	}
	return s.reloadSched(ctx)
}

// reloadSched builds a fresh snapshot from the store: every host, then
// every claim.
func (s *Service) reloadSched(ctx context.Context) (*scheduler.State, error) {
	v := &s.sched
	asked := s.now().UnixNano()
	v.mu.Lock()
	defer v.mu.Unlock()
	if st := v.state.Load(); st != nil && v.loadedAt.Load() >= asked {
		return st, nil // loaded by another caller while this one waited
	}
	// A reload answers from the store: hosts and zones another controller
	// changed within hostCacheTTL (an agent registered through it) count.
	s.hosts.invalidate()
	s.zones.invalidate()
	st := scheduler.New(v.policy)
	v.hostKeys = map[string]uint64{}
	if err := s.refreshSchedHosts(ctx, st, true); err != nil {
		return nil, err
	}
	rows, err := s.db.Query(ctx, `SELECT server_id, host, cells, gpus, disk_gb FROM compute_claims`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var key, cells, gpus string
		var c scheduler.Claim
		if err := rows.Scan(&key, &c.Host, &cells, &gpus, &c.DiskGB); err != nil {
			return nil, err
		}
		if err := decodeClaim(&c, cells, gpus); err != nil {
			return nil, err
		}
		if err := st.Apply(c); err != nil && st.HasHost(c.Host) {
			s.log.Warn("scheduler: stored claim does not fit its host", "claim", key, "host", c.Host, "error", err)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	v.loadedAt.Store(s.now().UnixNano())
	v.state.Store(st)
	return st, nil
}

// refreshSchedHosts gives st every host of the fleet with its zone and
// whether it takes new servers, and makes sure the store has each host's
// capacity rows. Called with s.sched.mu held.
func (s *Service) refreshSchedHosts(ctx context.Context, st *scheduler.State, all bool) error {
	v := &s.sched
	gen := s.hosts.gen.Load()
	hosts, enabled, err := s.hostSets(ctx)
	if err != nil {
		return err
	}
	zones, err := s.hostZones(ctx)
	if err != nil {
		return err
	}
	ok := make(map[string]bool, len(enabled))
	for _, h := range enabled {
		ok[h.Name] = true
	}
	seen := make(map[string]bool, len(hosts))
	var changed []driver.Host
	for _, h := range hosts {
		h.Normalize()
		seen[h.Name] = true
		zone := zoneIn(h, zones)
		key := hostKey(h, zone, ok[h.Name])
		if !all && v.hostKeys[h.Name] == key {
			continue
		}
		if v.hostKeys[h.Name]>>1 != key>>1 || all {
			changed = append(changed, h) // inventory or zone changed, not just the flag
		}
		v.hostKeys[h.Name] = key
		st.SetHost(h, zone, ok[h.Name])
	}
	for name := range v.hostKeys {
		if !seen[name] {
			delete(v.hostKeys, name)
			st.SetSchedulable(name, false)
		}
	}
	if len(changed) > 0 {
		if err := s.syncCapacity(ctx, changed); err != nil {
			return err
		}
	}
	v.hostGen.Store(gen)
	v.hostAt.Store(s.now().UnixNano())
	return nil
}

// hostKey fingerprints what the scheduler is told of a host; its lowest bit
// is the schedulable flag.
func hostKey(h driver.Host, zone string, schedulable bool) uint64 {
	b := make([]byte, 0, 64+len(h.CPUs)*16)
	num := func(n int) { b = strconv.AppendInt(append(b, ','), int64(n), 10) }
	str := func(s string) { b = append(append(b, '|'), s...) }
	str(h.Name)
	str(zone)
	num(h.DiskGB)
	for _, r := range h.ReservedCPUs {
		num(r)
	}
	for _, n := range h.NUMANodes {
		num(n.ID)
		num(n.MemoryMB)
	}
	for _, c := range h.CPUs {
		num(c.ID)
		num(c.NUMA)
		num(c.Core)
		num(c.Socket)
	}
	for _, g := range h.GPUs {
		str(g.Address)
		str(g.Model)
		num(g.NUMA)
	}
	f := fnv.New64a()
	f.Write(b)
	k := f.Sum64() &^ 1
	if schedulable {
		k |= 1
	}
	return k
}

// syncCapacity sets the store's capacity totals of hosts (memory per NUMA
// node, the disk pool), keeping what is used. It writes only the totals
// that differ from the stored ones: every reload of the scheduler's
// snapshot syncs every host, and an upsert of an unchanged row would still
// lock it against the placements that count their claims on it
// (measured: reloads after lost races waiting seconds behind creates).
func (s *Service) syncCapacity(ctx context.Context, hosts []driver.Host) error {
	type slot struct {
		host string
		node int
	}
	want := map[slot]int{}
	names := make([]any, 0, len(hosts))
	for _, h := range hosts {
		names = append(names, h.Name)
		for _, n := range h.NUMANodes {
			want[slot{h.Name, n.ID}] = n.MemoryMB
		}
		want[slot{h.Name, diskNode}] = h.DiskGB
	}
	for len(names) > 0 {
		chunk := names[:min(len(names), 500)]
		names = names[len(chunk):]
		rows, err := s.db.Query(ctx, "SELECT host, node, total FROM compute_host_capacity WHERE host IN ("+
			strings.TrimSuffix(strings.Repeat("?,", len(chunk)), ",")+")", chunk...)
		if err != nil {
			return err
		}
		for rows.Next() {
			var k slot
			var total int
			if err := rows.Scan(&k.host, &k.node, &total); err != nil {
				rows.Close()
				return err
			}
			if t, ok := want[k]; ok && t == total {
				delete(want, k)
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
	}
	if len(want) == 0 {
		return nil
	}
	put := make([]slot, 0, len(want))
	for k := range want {
		put = append(put, k)
	}
	// One order for every writer, so that two never wait on each other.
	sort.Slice(put, func(i, j int) bool {
		if put[i].host != put[j].host {
			return put[i].host < put[j].host
		}
		return put[i].node < put[j].node
	})
	return s.db.Tx(ctx, func(tx *store.Tx) error {
		for _, k := range put {
			if _, err := tx.Exec(ctx, `INSERT INTO compute_host_capacity (host, node, total, used) VALUES (?,?,?,0)
 ON CONFLICT (host, node) DO UPDATE SET total = excluded.total`, k.host, k.node, want[k]); err != nil {
				return err
			}
		}
		return nil
	})
}

// placeRequest is what placement needs to know of a server beyond its
// flavor: where it must or must not go.
type placeRequest struct {
	zone          string
	host          string   // an admin's requested host
	group         string   // server group id
	sameHost      []string // server ids
	differentHost []string // server ids
	// volumeBacked: the root disk is a volume, not the host's.
	volumeBacked bool
}

func placeRequestOf(sv *server) placeRequest {
	p := placeRequest{host: sv.Doc.RequestedHost, group: sv.Doc.Group,
		sameHost: sv.Doc.SameHost, differentHost: sv.Doc.DifferentHost, volumeBacked: sv.volumeBacked()}
	if sv.Doc.PinnedAZ != nil {
		p.zone = *sv.Doc.PinnedAZ
	}
	return p
}

// flavorRequest turns a flavor into what the scheduler places: dedicated
// vCPUs, RAM, the local disk (a network disk comes from the block storage
// pool, not the host), GPUs by model, and NUMA wishes.
func flavorRequest(f flavorSnap) scheduler.Request {
	req := scheduler.Request{VCPUs: f.VCPUs, MemoryMB: f.RAM}
	if f.ExtraSpecs["nimbus:disk_type"] != "network" {
		req.DiskGB = f.diskGB()
	}
	// A flavor whose GPUs cannot be read is refused before placement
	// (checkFlavorGPUs); here it asks for none.
	if g, err := flavorspec.GPUsOf(f.ExtraSpecs); err == nil && g.Count > 0 {
		req.GPUModel, req.GPUs = g.Model, g.Count
	}
	if n, err := strconv.Atoi(f.ExtraSpecs["hw:numa_nodes"]); err == nil && n > 0 {
		req.NUMANodes = n
	}
	return req
}

// serverRequest is flavorRequest for a server that may boot from a
// volume: then its root disk is not the host's (Nova claims no root_gb
// for a volume-backed instance), only its ephemeral and swap disks are.
func serverRequest(f flavorSnap, volumeBacked bool) scheduler.Request {
	req := flavorRequest(f)
	if volumeBacked && req.DiskGB > 0 {
		req.DiskGB = f.Ephemeral + (f.Swap+1023)/1024
	}
	return req
}

// groupRule is a server group's policy as placement applies it to a
// batch: the hosts of its members so far.
type groupRule struct {
	policy     string
	maxPerHost int
	hosts      map[string]int
}

// constraints resolves a placeRequest against the store: the hosts of the
// servers named in hints and of the group's members.
func (s *Service) constraints(ctx context.Context, p placeRequest) (base scheduler.Request, rule *groupRule, err error) {
	base.Zone = p.zone
	if p.host != "" {
		base.OnlyHosts = []string{p.host}
	}
	hostsOf := func(ids []string) ([]string, error) {
		var out []string
		for _, id := range ids {
			var h string
			err := s.db.QueryRow(ctx, `SELECT host FROM compute_servers WHERE id = ? AND deleted = 0`, id).Scan(&h)
			if err != nil && !store.IsNoRows(err) {
				return nil, err
			}
			if h != "" {
				out = append(out, h)
			}
		}
		return out, nil
	}
	if len(p.sameHost) > 0 {
		hs, err := hostsOf(p.sameHost)
		if err != nil {
			return base, nil, err
		}
		if base.OnlyHosts != nil {
			hs = intersect(hs, base.OnlyHosts)
		}
		base.OnlyHosts = append([]string{}, hs...)
	}
	if len(p.differentHost) > 0 {
		hs, err := hostsOf(p.differentHost)
		if err != nil {
			return base, nil, err
		}
		base.AvoidHosts = append(base.AvoidHosts, hs...)
	}
	if p.group != "" {
		policy, maxPer, hosts, err := s.groupPlacement(ctx, s.db, p.group)
		if err != nil {
			return base, nil, err
		}
		rule = &groupRule{policy: policy, maxPerHost: maxPer, hosts: hosts}
	}
	return base, rule, nil
}

func intersect(a, b []string) []string {
	var out []string
	for _, x := range a {
		for _, y := range b {
			if x == y {
				out = append(out, x)
				break
			}
		}
	}
	if out == nil {
		out = []string{}
	}
	return out
}

// withGroup narrows req by a group's policy given where its members are
// (nova's ServerGroupAffinityFilter, ServerGroupAntiAffinityFilter and the
// soft weighers).
func withGroup(req scheduler.Request, g *groupRule) scheduler.Request {
	if g == nil {
		return req
	}
	switch g.policy {
	case "affinity":
		if len(g.hosts) > 0 {
			var hs []string
			for h := range g.hosts {
				hs = append(hs, h)
			}
			sort.Strings(hs)
			if req.OnlyHosts != nil {
				hs = intersect(hs, req.OnlyHosts)
			}
			req.OnlyHosts = hs
		}
	case "anti-affinity":
		limit := max(g.maxPerHost, 1)
		avoid := append([]string{}, req.AvoidHosts...)
		for h, n := range g.hosts {
			if n >= limit {
				avoid = append(avoid, h)
			}
		}
		req.AvoidHosts = avoid
	case "soft-affinity":
		req.Prefer = g.hosts
	case "soft-anti-affinity":
		req.Shun = g.hosts
	}
	return req
}

// reserveBatch reserves up to n claims of req in st, one after another so
// that a group's policy sees the batch's own members. It stops at the first
// server that does not fit.
func reserveBatch(st *scheduler.State, req scheduler.Request, rule *groupRule, n int) []scheduler.Claim {
	var local *groupRule
	if rule != nil {
		local = &groupRule{policy: rule.policy, maxPerHost: rule.maxPerHost, hosts: map[string]int{}}
		for h, c := range rule.hosts {
			local.hosts[h] = c
		}
	}
	var out []scheduler.Claim
	for len(out) < n {
		c, err := st.Reserve(withGroup(req, local))
		if err != nil {
			break
		}
		out = append(out, c)
		if local != nil {
			local.hosts[c.Host]++
		}
	}
	return out
}

// keepAll makes sure claims committed on the snapshot st are in the current
// one: a reload between the reservation and the commit read the store
// without them.
func (s *Service) keepAll(st *scheduler.State, claims []scheduler.Claim) {
	cur := s.sched.state.Load()
	if cur == nil || cur == st {
		return
	}
	for _, c := range claims {
		_ = cur.Apply(c) // a conflict means the reload already saw it
	}
}

func releaseAll(st *scheduler.State, claims []scheduler.Claim) {
	for _, c := range claims {
		st.Release(c)
	}
}

// placeAttempts bounds how often a placement looks again after the store
// refused its claims: about 5 s of pauses. A burst that outlasts them (the
// creates clients send again together after a database failover) answers
// errPlacementBusy.
const placeAttempts = 24

// placeBudget bounds a placement's time: once it has run this long it
// looks no more, and its transaction's lock waits (a project's quota lock,
// which a project's creates queue for; hosts' capacity rows) end with it.
// A client waits for the answer; a region too busy to place its servers in
// this time tells it so (errPlacementBusy, Retry-After 1) rather than
// keep it waiting without end (measured: after a failover, creates of one
// project placed through three controllers took 28-46 s, losing the race
// for the same pCPUs twenty times over, each time queueing again for the
// project's lock).
var placeBudget = 6 * time.Second // a variable for tests

// minLockWait is the least lock wait a placing transaction is allowed.
const minLockWait = 250 * time.Millisecond

// errPlacementBusy is a placement that lost the race for the same pCPUs
// to other controllers placeAttempts times, or ran out of placeBudget: the
// region is busy, not broken, and the client may send the request again.
var errPlacementBusy = &api.Error{Status: http.StatusServiceUnavailable,
	Message: "The service is busy placing other servers on the same hosts. Please retry.",
	Header:  http.Header{"Retry-After": {"1"}}}

// conflictPause is how long a placement whose claims the store refused
// waits before it looks again: a random part of a span that doubles with
// each attempt (5 ms, 10 ms, … up to 320 ms). Controllers sharing a store
// load the same claims and prefer the same pCPUs; without the pause the
// ones that lost a race reload together and lose the next one together
// (measured: three controllers taking 1,000 servers in batches of twenty
// answered 500 after six immediate attempts).
func conflictPause(attempt int) time.Duration {
	span := 5 * time.Millisecond << min(attempt, 6)
	return rand.N(span) + time.Millisecond
}

// placeJob is one placement: between least and most servers of one
// request. It is the only path that places servers (a create's batch, a
// build left in scheduling, an unshelve); resize claims on the server's own
// host in its action.
type placeJob struct {
	req         scheduler.Request
	rule        *groupRule
	least, most int
	// recordShort runs write even when fewer than least fit, for a caller
	// that records the failure itself (a create's servers in ERROR with
	// Nova's fault); otherwise place answers errNoValidHost, writing nothing.
	recordShort bool
	// write runs in the placing transaction, which may run more than once,
	// with the claims reserved and their hosts' zones. It returns the keys
	// to store the first claims under; the claims after them are released.
	write func(tx *store.Tx, claims []scheduler.Claim, zones map[string]string) (keys []string, err error)
}

// newPlaceJob resolves where a request may go (zone, host, hints, group)
// for servers of flavor f.
func (s *Service) newPlaceJob(ctx context.Context, p placeRequest, f flavorSnap, least, most int) (*placeJob, error) {
	base, rule, err := s.constraints(ctx, p)
	if err != nil {
		return nil, err
	}
	req := serverRequest(f, p.volumeBacked)
	req.Zone, req.OnlyHosts, req.AvoidHosts = base.Zone, base.OnlyHosts, base.AvoidHosts
	return &placeJob{req: req, rule: rule, least: least, most: most}, nil
}

// place runs a placement: the scheduler reserves claims on its snapshot,
// one transaction runs the job's write and stores the claims it keeps
// (which the store re-checks), the snapshot keeps those and releases the
// rest, and a claim the store refused (a stale snapshot) reloads the
// snapshot and looks again.
func (s *Service) place(ctx context.Context, j *placeJob) error {
	end := time.Now().Add(placeBudget)
	busy := func(cause error) error {
		e := *errPlacementBusy
		e.Cause = cause
		return &e
	}
	for attempt := 0; ; attempt++ {
		st, claims, err := s.reserve(ctx, j, attempt == 0)
		if err != nil {
			return err
		}
		if len(claims) < j.least && !j.recordShort {
			releaseAll(st, claims)
			return errNoValidHost
		}
		kept, err := s.placeTx(ctx, j, claims, claimZones(st, claims), max(time.Until(end), minLockWait))
		if err == nil {
			releaseAll(st, claims[kept:])
			s.keepAll(st, claims[:kept])
			return nil
		}
		releaseAll(st, claims)
		if store.IsBusy(err) {
			return busy(err)
		}
		if !errors.Is(err, errClaimConflict) {
			return err
		}
		if attempt >= placeAttempts || time.Now().After(end) {
			return busy(err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(conflictPause(attempt)):
		}
		if _, err := s.reloadSched(ctx); err != nil {
			return err
		}
	}
}

// reserve reserves up to the job's most claims on the snapshot. A first
// attempt that falls short of least reloads the snapshot, which may hold
// what another controller freed, and reserves again.
func (s *Service) reserve(ctx context.Context, j *placeJob, first bool) (*scheduler.State, []scheduler.Claim, error) {
	st, err := s.schedState(ctx)
	if err != nil {
		return nil, nil, err
	}
	claims := reserveBatch(st, j.req, j.rule, j.most)
	if len(claims) >= j.least || !first {
		return st, claims, nil
	}
	releaseAll(st, claims)
	if st, err = s.reloadSched(ctx); err != nil {
		return nil, nil, err
	}
	return st, reserveBatch(st, j.req, j.rule, j.most), nil
}

// placeTx is a placement's transaction: the job's write, then the claims
// it keeps, each lock wait at most lockWait. It returns how many claims
// were kept.
func (s *Service) placeTx(ctx context.Context, j *placeJob, claims []scheduler.Claim, zones map[string]string, lockWait time.Duration) (int, error) {
	kept := 0
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		if err := tx.LockTimeout(ctx, lockWait); err != nil {
			return err
		}
		keys, err := j.write(tx, claims, zones)
		if err != nil {
			return err
		}
		if len(keys) > len(claims) {
			return fmt.Errorf("compute: %d claim keys for %d claims", len(keys), len(claims))
		}
		now := s.now()
		for i, key := range keys {
			if err := writeClaim(ctx, tx, key, claims[i], now); err != nil {
				return err
			}
		}
		kept = len(keys)
		return nil
	})
	return kept, err
}

// errStaleTask ends a placement whose server moved on meanwhile (a delete
// during a build): nothing is written.
var errStaleTask = errors.New("compute: the server's task changed")

// placeOne places one existing server (a build left in scheduling by an
// older version, an unshelve) while it still has task: in the placing
// transaction apply records the placement on the server. errNoValidHost
// when nothing fits.
func (s *Service) placeOne(ctx context.Context, sv *server, task string, apply func(tx *store.Tx, cur *server, c scheduler.Claim) error) error {
	j, err := s.newPlaceJob(ctx, placeRequestOf(sv), sv.Doc.Flavor, 1, 1)
	if err != nil {
		return err
	}
	var written *server
	j.write = func(tx *store.Tx, claims []scheduler.Claim, _ map[string]string) ([]string, error) {
		written = nil
		cur, err := s.loadServer(ctx, tx, sv.ID, true)
		if err != nil {
			return nil, err
		}
		if err := s.leases.Hold(ctx, tx, serverLease(sv.ID)); err != nil {
			return nil, err
		}
		if cur.TaskState != task || cur.Deleted {
			return nil, errStaleTask
		}
		if err := apply(tx, cur, claims[0]); err != nil {
			return nil, err
		}
		written = cur
		return []string{sv.ID}, nil
	}
	switch err := s.place(ctx, j); {
	case errors.Is(err, errStaleTask):
		return nil
	case err != nil:
		return err
	}
	s.fresh.Store(sv.ID, written)
	return nil
}

// backfillClaims gives a claim to every placed server that has none (a
// database from before claims existed): each is pinned on the host it is
// on. A server that no longer fits its host keeps running unclaimed, and
// is logged.
func (s *Service) backfillClaims(ctx context.Context) error {
	rows, err := s.db.Query(ctx, `SELECT id FROM compute_servers WHERE deleted = 0 AND host <> ''
 AND id NOT IN (SELECT server_id FROM compute_claims)`)
	if err != nil {
		return err
	}
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			rows.Close()
			return err
		}
		ids = append(ids, id)
	}
	rows.Close()
	// Loading the snapshot now also spares the first creates the wait.
	st, err := s.schedState(ctx)
	if err != nil || len(ids) == 0 {
		return err
	}
	for _, id := range ids {
		sv, err := s.loadServer(ctx, s.db, id, false)
		if err != nil {
			return err
		}
		req := serverRequest(sv.Doc.Flavor, sv.volumeBacked())
		req.OnlyHosts = []string{sv.Host}
		c, err := st.Reserve(req)
		if err != nil {
			s.log.Warn("scheduler: a placed server does not fit its host; left unclaimed", "server", id, "host", sv.Host)
			continue
		}
		err = s.db.Tx(ctx, func(tx *store.Tx) error { return writeClaim(ctx, tx, id, c, s.now()) })
		if err != nil {
			st.Release(c)
			s.log.Warn("scheduler: claim backfill failed", "server", id, "error", err)
		}
	}
	return nil
}

// claimZones gives the availability zone of each claim's host from the
// snapshot that placed it: the snapshot was given each host's zone from
// the same hosts and aggregates zonesOf reads, so a create reads neither.
func claimZones(st *scheduler.State, claims []scheduler.Claim) map[string]string {
	out := make(map[string]string, len(claims))
	for _, c := range claims {
		if _, ok := out[c.Host]; !ok {
			out[c.Host], _ = st.Zone(c.Host)
		}
	}
	return out
}

// zonesOf gives the availability zone of each claim's host, as Nova records
// the zone of the host a server lands on.
func (s *Service) zonesOf(ctx context.Context, claims []scheduler.Claim) (map[string]string, error) {
	out := map[string]string{}
	if len(claims) == 0 {
		return out, nil
	}
	hosts, _, err := s.hostSets(ctx)
	if err != nil {
		return nil, err
	}
	zones, err := s.hostZones(ctx)
	if err != nil {
		return nil, err
	}
	for _, c := range claims {
		out[c.Host] = "nova"
	}
	for _, h := range hosts {
		if _, ok := out[h.Name]; ok {
			out[h.Name] = zoneIn(h, zones)
		}
	}
	return out, nil
}
