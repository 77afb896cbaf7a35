package doctor

import (
	"context"
	"fmt"

	"nimbus/internal/store"
)

// Work owned through leases (internal/lease, migrations 0070 and 0071): a
// live server that owes a step has work_due = 1, and the controller doing
// it renews the lease "server/<id>" until the server rests. A controller
// that dies stops renewing; any other takes the work within seconds of
// the lease's expiry. Work whose lease lapsed long ago is no one's.

// workLeftByTheDead names the servers that owe a step no controller has
// held for longer than the settle time.
func workLeftByTheDead(ctx context.Context, r *run) error {
	cut := r.cfg.Now.Add(-r.cfg.Settle)
	for after := ""; ; {
		rows, err := r.q.Query(ctx, `SELECT s.id, s.vm_state, s.task_state, s.updated_at,
 COALESCE(l.holder, ''), COALESCE(l.expires_at, '')
 FROM compute_servers s LEFT JOIN leases l ON l.name = 'server/' || s.id
 WHERE s.work_due = 1 AND s.deleted = 0 AND s.id > ? ORDER BY s.id LIMIT ?`, after, r.cfg.PageSize)
		if err != nil {
			return err
		}
		type owed struct{ id, vm, task, updated, holder, expires string }
		var page []owed
		for rows.Next() {
			var o owed
			if err := rows.Scan(&o.id, &o.vm, &o.task, &o.updated, &o.holder, &o.expires); err != nil {
				rows.Close()
				return err
			}
			page = append(page, o)
		}
		rows.Close()
		if err := rows.Err(); err != nil || len(page) == 0 {
			return err
		}
		after = page[len(page)-1].id
		for _, o := range page {
			updated := store.ParseTime(o.updated)
			if updated.After(cut) {
				continue // recent: a controller may be about to take it
			}
			owner := "no controller has held its work"
			if o.holder != "" {
				expires := store.ParseTime(o.expires)
				if expires.After(cut) {
					continue // held, or lapsed too lately to say
				}
				owner = fmt.Sprintf("its lease lapsed %s (its holder, controller %s, stopped renewing it) and no controller took it since",
					ago(r.cfg.Now, expires), o.holder)
			}
			task := o.task
			if task == "" {
				task = "none"
			}
			r.emit("server "+o.id,
				fmt.Sprintf("it owes a step (vm_state %s, task %s, last changed %s), and %s", o.vm, task, ago(r.cfg.Now, updated), owner),
				"every running controller looks for such work every 5 s and takes it: start a controller if none runs; "+
					"if they run, their logs say why they leave it (lines starting 'reconcile:')")
		}
	}
}
