package doctor

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"nimbus/internal/scheduler"
	"nimbus/internal/store"
)

// Placement claims (internal/compute/claims.go, migration 0012): a placed
// server holds one claim under its id, and a resizing one its old
// flavor's under "<id>/resize-source"; the claim's pCPUs and GPUs are
// compute_claim_items rows, its memory and disk compute_host_capacity
// counters.

const resizeSource = "/resize-source"

// claimRow is a stored claim.
type claimRow struct {
	key string
	scheduler.Claim
}

// serverOf is the server a claim key belongs to.
func serverOf(key string) string { return strings.TrimSuffix(key, resizeSource) }

// claimPage reads up to PageSize claims after key `after`, in key order.
func (r *run) claimPage(ctx context.Context, after string) ([]claimRow, error) {
	rows, err := r.q.Query(ctx, "SELECT server_id, host, cells, gpus, disk_gb FROM compute_claims WHERE server_id > ? ORDER BY server_id LIMIT ?",
		after, r.cfg.PageSize)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []claimRow
	for rows.Next() {
		var c claimRow
		var cells, gpus string
		if err := rows.Scan(&c.key, &c.Host, &cells, &gpus, &c.DiskGB); err != nil {
			return nil, err
		}
		if err := store.FromJSON(cells, &c.Cells); err != nil {
			return nil, fmt.Errorf("claim %s: cells: %w", c.key, err)
		}
		if err := store.FromJSON(gpus, &c.GPUs); err != nil {
			return nil, fmt.Errorf("claim %s: gpus: %w", c.key, err)
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// eachClaimPage calls f with every page of claims.
func (r *run) eachClaimPage(ctx context.Context, f func([]claimRow) error) error {
	for after := ""; ; {
		page, err := r.claimPage(ctx, after)
		if err != nil || len(page) == 0 {
			return err
		}
		if err := f(page); err != nil {
			return err
		}
		after = page[len(page)-1].key
	}
}

// releaseSQL is what compute's dropClaim does to give claim c back, as
// statements for the operator to run in one transaction.
func releaseSQL(c claimRow) string {
	var b strings.Builder
	b.WriteString("BEGIN; ")
	fmt.Fprintf(&b, "DELETE FROM compute_claim_items WHERE server_id = %s; ", sqlString(c.key))
	fmt.Fprintf(&b, "DELETE FROM compute_claims WHERE server_id = %s; ", sqlString(c.key))
	for _, cell := range c.Cells {
		if cell.MemoryMB != 0 {
			fmt.Fprintf(&b, "UPDATE compute_host_capacity SET used = used - %d WHERE host = %s AND node = %d; ", cell.MemoryMB, sqlString(c.Host), cell.Node)
		}
	}
	if c.DiskGB != 0 {
		fmt.Fprintf(&b, "UPDATE compute_host_capacity SET used = used - %d WHERE host = %s AND node = -1; ", c.DiskGB, sqlString(c.Host))
	}
	b.WriteString("COMMIT;")
	return b.String()
}

// describe names what a claim holds.
func describe(c claimRow) string {
	var parts []string
	if cpus := c.CPUs(); len(cpus) > 0 {
		parts = append(parts, fmt.Sprintf("pCPUs %v", cpus))
	}
	if len(c.GPUs) > 0 {
		parts = append(parts, fmt.Sprintf("GPUs %v", c.GPUs))
	}
	parts = append(parts, fmt.Sprintf("%d MiB", c.MemoryMB()), fmt.Sprintf("%d GiB disk", c.DiskGB))
	return strings.Join(parts, ", ")
}

// claimsOfDeadServers: a claim whose server is gone, unplaced, elsewhere,
// or (a resize's source) no longer resizing holds what no server uses, so
// placement cannot give it out.
func claimsOfDeadServers(ctx context.Context, r *run) error {
	return r.eachClaimPage(ctx, func(page []claimRow) error {
		ids := make([]string, len(page))
		for i, c := range page {
			ids[i] = serverOf(c.key)
		}
		servers, err := r.servers(ctx, ids)
		if err != nil {
			return err
		}
		for _, c := range page {
			id := serverOf(c.key)
			s, ok := servers[id]
			why := gone(id, s, ok)
			switch {
			case why != "":
			case s.host == "":
				why = fmt.Sprintf("server %s is on no host (vm_state %s)", id, s.vmState)
			case s.host != c.Host:
				why = fmt.Sprintf("server %s is on host %s", id, s.host)
			case c.key != id && s.vmState != "resized" && !strings.HasPrefix(s.taskState, "resize"):
				why = fmt.Sprintf("server %s is not resizing (vm_state %s), so its old flavor's claim should be gone", id, s.vmState)
			default:
				continue
			}
			r.emit("claim "+c.key+" on host "+c.Host,
				fmt.Sprintf("it holds %s, but %s: placement cannot give them to another server", describe(c), why),
				"release it as compute does, in one transaction: "+releaseSQL(c)+
					" Controllers see the release at their next scheduler reload (within a minute).")
		}
		return nil
	})
}

// serversWithoutClaims: a placed server without a claim holds nothing in
// the store's eyes, so placement may give its pCPUs to another server.
func serversWithoutClaims(ctx context.Context, r *run) error {
	for after := ""; ; {
		rows, err := r.q.Query(ctx, "SELECT id, host, vm_state FROM compute_servers WHERE id > ? AND deleted = 0 AND host <> '' ORDER BY id LIMIT ?",
			after, r.cfg.PageSize)
		if err != nil {
			return err
		}
		var page []serverRow
		for rows.Next() {
			var s serverRow
			if err := rows.Scan(&s.id, &s.host, &s.vmState); err != nil {
				rows.Close()
				return err
			}
			page = append(page, s)
		}
		rows.Close()
		if err := rows.Err(); err != nil || len(page) == 0 {
			return err
		}
		after = page[len(page)-1].id
		ids := make([]string, len(page))
		for i, s := range page {
			ids[i] = s.id
		}
		claimed := map[string]bool{}
		rows, err = r.q.Query(ctx, "SELECT server_id FROM compute_claims WHERE server_id IN ("+placeholders(len(ids))+")", anys(ids)...)
		if err != nil {
			return err
		}
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return err
			}
			claimed[id] = true
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		for _, s := range page {
			if claimed[s.id] {
				continue
			}
			r.emit("server "+s.id+" on host "+s.host,
				fmt.Sprintf("it is placed (vm_state %s) but holds no claim: placement may give its pCPUs, GPUs and memory to another server", s.vmState),
				"restart one controller: at start compute claims, for every placed server without a claim, what its flavor takes on its host. "+
					"If the log then says the server does not fit its host, resize it to a smaller flavor, or shelve and unshelve it so that placement finds it room.")
		}
	}
}

// claimedTwice: a pCPU or GPU a claim lists is reserved under that claim;
// when another claim holds it, two servers share it.
func claimedTwice(ctx context.Context, r *run) error {
	return r.unreserved(ctx, func(c claimRow, it, other string) {
		if other == "" {
			return // claim-items names it
		}
		r.emit(fmt.Sprintf("%s of host %s", it, c.Host),
			fmt.Sprintf("claimed by both %s (which holds it) and %s: the two servers run on it together", other, c.key),
			fmt.Sprintf("move one away: shelve server %s and unshelve it (openstack server shelve; openstack server unshelve), "+
				"which gives it new pCPUs and GPUs, or resize it", serverOf(c.key)))
	})
}

// unreserved calls f for each pCPU or GPU a claim lists that is not
// reserved under it, with the claim that holds it instead ("" for none).
func (r *run) unreserved(ctx context.Context, f func(c claimRow, item, other string)) error {
	return r.eachClaimPage(ctx, func(page []claimRow) error {
		held, err := r.itemsOf(ctx, page)
		if err != nil {
			return err
		}
		for _, c := range page {
			for _, it := range c.Items() {
				if held[c.key][it] {
					continue
				}
				var other string
				err := r.q.QueryRow(ctx, "SELECT server_id FROM compute_claim_items WHERE host = ? AND item = ?", c.Host, it).Scan(&other)
				if err != nil && !store.IsNoRows(err) {
					return err
				}
				f(c, it, other)
			}
		}
		return nil
	})
}

// itemsOf reads the items reserved under each claim of page.
func (r *run) itemsOf(ctx context.Context, page []claimRow) (map[string]map[string]bool, error) {
	keys := make([]string, len(page))
	for i, c := range page {
		keys[i] = c.key
	}
	rows, err := r.q.Query(ctx, "SELECT server_id, item FROM compute_claim_items WHERE server_id IN ("+placeholders(len(keys))+")", anys(keys)...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]map[string]bool{}
	for rows.Next() {
		var key, it string
		if err := rows.Scan(&key, &it); err != nil {
			return nil, err
		}
		if out[key] == nil {
			out[key] = map[string]bool{}
		}
		out[key][it] = true
	}
	return out, rows.Err()
}

// claimItems: each claim's pCPUs and GPUs are reserved under it (else
// placement may give them to another server), and a reserved one that no
// claim lists is held by nobody and never given out again.
func claimItems(ctx context.Context, r *run) error {
	err := r.unreserved(ctx, func(c claimRow, it, other string) {
		if other != "" {
			return // pcpus-claimed-twice names it
		}
		r.emit("claim "+c.key+" on host "+c.Host,
			fmt.Sprintf("it lists %s, which is not reserved under it (compute_claim_items): placement may give it to another server", it),
			fmt.Sprintf("reserve it: INSERT INTO compute_claim_items (host, item, server_id) VALUES (%s, %s, %s);",
				sqlString(c.Host), sqlString(it), sqlString(c.key)))
	})
	if err != nil {
		return err
	}
	return strayItems(ctx, r)
}

// strayItems names the reserved pCPUs and GPUs that no claim lists.
func strayItems(ctx context.Context, r *run) error {
	type item struct{ host, item, key string }
	for afterHost, afterItem := "", ""; ; {
		rows, err := r.q.Query(ctx, `SELECT i.host, i.item, i.server_id, c.server_id IS NULL, COALESCE(c.host, ''), COALESCE(c.cells, ''), COALESCE(c.gpus, '')
 FROM compute_claim_items i LEFT JOIN compute_claims c ON c.server_id = i.server_id
 WHERE (i.host > ? OR (i.host = ? AND i.item > ?)) ORDER BY i.host, i.item LIMIT ?`, afterHost, afterHost, afterItem, r.cfg.PageSize)
		if err != nil {
			return err
		}
		n := 0
		var stray []item
		var why []string
		for rows.Next() {
			var it item
			var orphan bool
			var c claimRow
			var cells, gpus string
			if err := rows.Scan(&it.host, &it.item, &it.key, &orphan, &c.Host, &cells, &gpus); err != nil {
				rows.Close()
				return err
			}
			n++
			afterHost, afterItem = it.host, it.item
			if orphan {
				stray, why = append(stray, it), append(why, "no claim "+it.key+" exists")
				continue
			}
			if err := store.FromJSON(cells, &c.Cells); err != nil {
				rows.Close()
				return err
			}
			if err := store.FromJSON(gpus, &c.GPUs); err != nil {
				rows.Close()
				return err
			}
			switch {
			case c.Host != it.host:
				stray, why = append(stray, it), append(why, "claim "+it.key+" is on host "+c.Host)
			case !slices.Contains(c.Items(), it.item):
				stray, why = append(stray, it), append(why, "claim "+it.key+" does not list it")
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil || n == 0 {
			return err
		}
		for i, it := range stray {
			r.emit(fmt.Sprintf("%s of host %s", it.item, it.host),
				fmt.Sprintf("reserved under %s, but %s: nobody uses it and placement never gives it out", it.key, why[i]),
				fmt.Sprintf("free it: DELETE FROM compute_claim_items WHERE host = %s AND item = %s;", sqlString(it.host), sqlString(it.item)))
		}
	}
}

// hostCapacity: a host's counters (memory per NUMA node, the local disk
// pool) are what its claims hold; counters that drifted refuse servers
// that fit, or let in servers that do not.
func hostCapacity(ctx context.Context, r *run) error {
	for after := ""; ; {
		var hosts []string
		rows, err := r.q.Query(ctx, "SELECT DISTINCT host FROM compute_host_capacity WHERE host > ? ORDER BY host LIMIT ?", after, r.cfg.PageSize)
		if err != nil {
			return err
		}
		for rows.Next() {
			var h string
			if err := rows.Scan(&h); err != nil {
				rows.Close()
				return err
			}
			hosts = append(hosts, h)
		}
		rows.Close()
		if err := rows.Err(); err != nil || len(hosts) == 0 {
			return err
		}
		after = hosts[len(hosts)-1]
		for _, h := range hosts {
			if err := r.hostCounters(ctx, h); err != nil {
				return err
			}
		}
	}
}

// hostCounters compares one host's counters with the sums of its claims,
// read a page at a time.
func (r *run) hostCounters(ctx context.Context, host string) error {
	held := map[int]int64{} // node → MiB (-1: GiB of disk)
	for after := ""; ; {
		rows, err := r.q.Query(ctx, "SELECT server_id, cells, disk_gb FROM compute_claims WHERE host = ? AND server_id > ? ORDER BY server_id LIMIT ?",
			host, after, r.cfg.PageSize)
		if err != nil {
			return err
		}
		n := 0
		for rows.Next() {
			var cells string
			var disk int64
			var c claimRow
			if err := rows.Scan(&after, &cells, &disk); err != nil {
				rows.Close()
				return err
			}
			n++
			if err := store.FromJSON(cells, &c.Cells); err != nil {
				rows.Close()
				return err
			}
			for _, cell := range c.Cells {
				held[cell.Node] += int64(cell.MemoryMB)
			}
			held[-1] += disk
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		if n == 0 {
			break
		}
	}
	rows, err := r.q.Query(ctx, "SELECT node, total, used FROM compute_host_capacity WHERE host = ? ORDER BY node", host)
	if err != nil {
		return err
	}
	type counter struct {
		node        int
		total, used int64
	}
	var counters []counter
	for rows.Next() {
		var c counter
		if err := rows.Scan(&c.node, &c.total, &c.used); err != nil {
			rows.Close()
			return err
		}
		counters = append(counters, c)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for _, c := range counters {
		want := held[c.node]
		if c.used == want && c.used <= c.total {
			continue
		}
		what, unit := fmt.Sprintf("NUMA node %d memory", c.node), "MiB"
		if c.node == -1 {
			what, unit = "local disk pool", "GiB"
		}
		problem := fmt.Sprintf("%s: %d %s used of %d by the counter, while its claims hold %d %s", what, c.used, unit, c.total, want, unit)
		if want > c.total {
			problem += "; the claims hold more than the host has"
		}
		r.emit("host "+host+" "+what, problem,
			fmt.Sprintf("set the counter to what the claims hold: UPDATE compute_host_capacity SET used = used + (%d) WHERE host = %s AND node = %d; "+
				"(a relative change, right even if a server is placed meanwhile)", want-c.used, sqlString(host), c.node))
	}
	return nil
}
