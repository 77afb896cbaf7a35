package doctor

import (
	"context"
	"fmt"
	"time"

	"nimbus/internal/store"
)

// Hosts against their agents (internal/fleet, migration 0014): each host is
// presented by one agent (fleet_hosts.agent_id, '' when none does any
// more) whose reports set seen_at; fleet_instances is where each VM runs
// as the agents report it (gone: destroyed; observed 0: never reported).

// hostsSilent: a host whose agent has not reported for long runs its
// servers out of the controllers' sight and reach.
func hostsSilent(ctx context.Context, r *run) error {
	cut := r.cfg.Now.Add(-r.cfg.SilentAfter)
	for after := ""; ; {
		rows, err := r.q.Query(ctx, "SELECT name, agent_id, seen_at FROM fleet_hosts WHERE name > ? ORDER BY name LIMIT ?", after, r.cfg.PageSize)
		if err != nil {
			return err
		}
		type host struct{ name, agent, seen string }
		var page []host
		for rows.Next() {
			var h host
			if err := rows.Scan(&h.name, &h.agent, &h.seen); err != nil {
				rows.Close()
				return err
			}
			page = append(page, h)
		}
		rows.Close()
		if err := rows.Err(); err != nil || len(page) == 0 {
			return err
		}
		after = page[len(page)-1].name
		for _, h := range page {
			seen := store.ParseTime(h.seen)
			if h.agent != "" && seen.After(cut) {
				continue
			}
			var servers int
			if err := r.q.QueryRow(ctx, "SELECT COUNT(*) FROM compute_servers WHERE host = ? AND deleted = 0", h.name).Scan(&servers); err != nil {
				return err
			}
			problem := fmt.Sprintf("no agent presents it any more; %d live servers are placed there", servers)
			if h.agent != "" {
				problem = fmt.Sprintf("its agent %s last reported %s; %d live servers are placed there, out of the controllers' reach",
					h.agent, ago(r.cfg.Now, seen), servers)
			}
			r.emit("host "+h.name, problem,
				"check the agent on the host (its service and log) and its path to the controllers: it reports every 10 s. "+
					"A host taken out of service: move its servers away (migrate, or shelve), then forget it: nimbus admin host remove "+h.name)
		}
	}
}

// vmsWithoutServers: compute destroys a VM whose server is gone within
// 30 s when its host is up (its orphan sweep); one that stays holds the
// host's CPUs and memory, and its disk, for nobody.
func vmsWithoutServers(ctx context.Context, r *run) error {
	cut := r.cfg.Now.Add(-r.cfg.Settle)
	for after := ""; ; {
		rows, err := r.q.Query(ctx, "SELECT server_id, host, updated_at FROM fleet_instances WHERE server_id > ? AND gone = 0 AND observed > 0 ORDER BY server_id LIMIT ?",
			after, r.cfg.PageSize)
		if err != nil {
			return err
		}
		type vm struct {
			id, host string
			updated  time.Time
		}
		var page []vm
		var ids []string
		for rows.Next() {
			var v vm
			var at string
			if err := rows.Scan(&v.id, &v.host, &at); err != nil {
				rows.Close()
				return err
			}
			v.updated = store.ParseTime(at)
			page = append(page, v)
			ids = append(ids, v.id)
		}
		rows.Close()
		if err := rows.Err(); err != nil || len(page) == 0 {
			return err
		}
		after = page[len(page)-1].id
		servers, err := r.servers(ctx, ids)
		if err != nil {
			return err
		}
		for _, v := range page {
			s, ok := servers[v.id]
			why := gone(v.id, s, ok)
			if why == "" || v.updated.After(cut) || s.terminated.After(cut) {
				continue // a live server's, or a delete still in flight
			}
			r.emit("VM "+v.id+" on host "+v.host,
				"the host's agent reports it running, but "+why+": compute's orphan sweep destroys such a VM within 30 s while its host is up, so this one's destroy fails",
				"see the controllers' log for \"destroy orphan failed\" and the host's agent (nimbus admin host list shows whether it is up); "+
					"once the host is up the sweep destroys the VM; a host that is gone for good: nimbus admin host remove "+v.host)
		}
	}
}
