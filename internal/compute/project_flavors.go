package compute

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// A project's own flavors. The configurator sells any size within the
// fleet's bounds, too many to make as public flavors beforehand; a size no
// public flavor has gets a flavor private to the ordering project (Nova's
// os-flavor-access:is_public false, the project on its access list), made
// for an order only once every other check passed, taken again by the
// project's next order of that size, at most MaxProjectFlavors per
// project, and deleted when no server of the project uses it any more.
// Other projects never see it.

// MaxProjectFlavors bounds the flavors of its own one project holds.
const MaxProjectFlavors = 20

// handOutGrace is how long a flavor an order took and no server uses yet
// is kept for that order, whose server is posted moments after.
const handOutGrace = 10 * time.Minute

// OrderFlavor is the flavor an order uses. Lease is 0 for a public
// flavor, else the hand-out ReleaseFlavor gives back.
type OrderFlavor struct {
	ID    string
	Lease int64
}

// ProjectFlavor is the flavor caller's project orders a server of the
// shape with: a public flavor of exactly the shape (the catalogue's
// d1.2g.local is found, not duplicated), else the project's own, made
// now when it has none. It acts for the caller and no further: it makes
// no flavor another project sees, none outside the fleet's bounds, and
// no more than MaxProjectFlavors for the project (403 past them). It
// never changes a flavor it did not make: a name taken by another is 409.
func (s *Service) ProjectFlavor(ctx context.Context, c *api.Caller, sh Shape) (OrderFlavor, error) {
	if c == nil || c.ProjectID == "" {
		return OrderFlavor{}, api.Forbidden("Ordering a server needs a token scoped to a project.")
	}
	o, err := s.Options(ctx)
	if err != nil {
		return OrderFlavor{}, err
	}
	if err := sh.Validate(o); err != nil {
		return OrderFlavor{}, err
	}
	if id, err := s.findFlavor(ctx, sh); err != nil || id != "" {
		return OrderFlavor{ID: id}, err
	}
	want := sh.ownFlavor(c.ProjectID)
	// Each conflict is another order's success, so this ends.
	for range MaxProjectFlavors + 2 {
		var out OrderFlavor
		err := s.db.Tx(ctx, func(tx *store.Tx) (err error) {
			out, err = s.handOut(ctx, tx, c.ProjectID, sh, want)
			return err
		})
		if !errors.Is(err, store.ErrConflict) {
			return out, err
		}
		// Another order of the project made this flavor or took the
		// slot meanwhile: read again.
	}
	return OrderFlavor{}, api.Conflict("Flavor %s already exists and is not this configuration's.", want.ID)
}

// handOut takes the project's own flavor of the shape for one more order,
// making it in a free slot when the project has none.
func (s *Service) handOut(ctx context.Context, tx *store.Tx, project string, sh Shape, want *Flavor) (OrderFlavor, error) {
	now := s.now()
	f, err := s.getFlavor(ctx, tx, want.ID)
	switch {
	case err == nil:
		res, err := tx.Exec(ctx, `UPDATE compute_project_flavors SET lease = lease + 1, handed_at = ?
 WHERE flavor_id = ? AND project_id = ?`, store.FormatTime(now), f.ID, project)
		if err != nil {
			return OrderFlavor{}, err
		}
		if n, _ := res.RowsAffected(); n == 0 || !sh.matchesOwn(f) {
			return OrderFlavor{}, api.Conflict("Flavor %s already exists and is not this configuration's.", f.ID)
		}
		var lease int64
		err = tx.QueryRow(ctx, "SELECT lease FROM compute_project_flavors WHERE flavor_id = ?", f.ID).Scan(&lease)
		return OrderFlavor{ID: f.ID, Lease: lease}, err
	case !errors.Is(err, store.ErrNotFound):
		return OrderFlavor{}, err
	}
	if err := s.dropUnused(ctx, tx, project, now.Add(-handOutGrace)); err != nil {
		return OrderFlavor{}, err
	}
	slot, err := freeSlot(ctx, tx, project)
	if err != nil {
		return OrderFlavor{}, err
	}
	want.CreatedAt = now
	if err := insertFlavor(ctx, tx, want); err != nil {
		if isConflict(err) {
			return OrderFlavor{}, store.ErrConflict
		}
		return OrderFlavor{}, err
	}
	if _, err := tx.Exec(ctx, "INSERT INTO compute_flavor_projects (flavor_id, project_id) VALUES (?, ?)", want.ID, project); err != nil {
		return OrderFlavor{}, err
	}
	_, err = tx.Exec(ctx, `INSERT INTO compute_project_flavors (flavor_id, project_id, slot, lease, handed_at)
 VALUES (?, ?, ?, 1, ?)`, want.ID, project, slot, store.FormatTime(now))
	return OrderFlavor{ID: want.ID, Lease: 1}, err
}

// freeSlot is a slot the project's own flavors leave free, drawn at random
// so that orders at once seldom race for one; 403 when they hold all
// MaxProjectFlavors.
func freeSlot(ctx context.Context, tx *store.Tx, project string) (int, error) {
	rows, err := tx.Query(ctx, "SELECT slot FROM compute_project_flavors WHERE project_id = ?", project)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	taken := map[int]bool{}
	for rows.Next() {
		var n int
		if err := rows.Scan(&n); err != nil {
			return 0, err
		}
		taken[n] = true
	}
	if err := rows.Err(); err != nil {
		return 0, err
	}
	var free []int
	for n := range MaxProjectFlavors {
		if !taken[n] {
			free = append(free, n)
		}
	}
	if len(free) > 0 {
		return free[rand.IntN(len(free))], nil
	}
	return 0, api.Forbidden("Your servers already use %d sizes of your own, the most a project may: choose a size of the catalogue, or delete the servers of a size you no longer need.", MaxProjectFlavors)
}

// ReleaseFlavor gives back an order's hand-out when its server was not
// made: the project's own flavor is deleted unless a server uses it or
// another order took it since. A public flavor stays.
func (s *Service) ReleaseFlavor(ctx context.Context, c *api.Caller, of OrderFlavor) error {
	if of.Lease == 0 || c == nil || c.ProjectID == "" {
		return nil
	}
	return s.db.Tx(ctx, func(tx *store.Tx) error {
		unused, err := unusedOwn(ctx, tx, c.ProjectID, of.ID)
		if err != nil || len(unused) == 0 || unused[0].lease != of.Lease {
			return err
		}
		return removeFlavor(ctx, tx, of.ID)
	})
}

// ownUse is one of a project's own flavors that no server uses.
type ownUse struct {
	id     string
	lease  int64
	handed time.Time
}

// unusedOwn lists project's own flavors (only that of id when id is set)
// that no server of the project, other than deleted ones, uses.
func unusedOwn(ctx context.Context, q store.Querier, project, id string) ([]ownUse, error) {
	query := `SELECT pf.flavor_id, pf.lease, pf.handed_at FROM compute_project_flavors pf WHERE pf.project_id = ?
 AND NOT EXISTS (SELECT 1 FROM compute_servers sv WHERE sv.project_id = pf.project_id AND sv.deleted = 0 AND sv.flavor_id = pf.flavor_id)`
	args := []any{project}
	if id != "" {
		query += " AND pf.flavor_id = ?"
		args = append(args, id)
	}
	rows, err := q.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []ownUse
	for rows.Next() {
		var u ownUse
		var at string
		if err := rows.Scan(&u.id, &u.lease, &at); err != nil {
			return nil, err
		}
		u.handed = store.ParseTime(at)
		out = append(out, u)
	}
	return out, rows.Err()
}

// dropUnused deletes project's own flavors that no server uses and no
// order took after before.
func (s *Service) dropUnused(ctx context.Context, tx *store.Tx, project string, before time.Time) error {
	unused, err := unusedOwn(ctx, tx, project, "")
	if err != nil {
		return err
	}
	for _, u := range unused {
		if u.handed.Before(before) {
			if err := removeFlavor(ctx, tx, u.id); err != nil {
				return err
			}
		}
	}
	return nil
}

// dropFlavorOf deletes a deleted server's flavor when it is its project's
// own, no other server uses it and no order took it after the server was
// made (such an order may still be posting its server).
func (s *Service) dropFlavorOf(ctx context.Context, tx *store.Tx, sv *server) error {
	unused, err := unusedOwn(ctx, tx, sv.ProjectID, sv.FlavorID)
	if err != nil || len(unused) == 0 || unused[0].handed.After(sv.CreatedAt) {
		return err
	}
	return removeFlavor(ctx, tx, sv.FlavorID)
}

// removeFlavor deletes a flavor with its extra specs and access rows.
func removeFlavor(ctx context.Context, tx *store.Tx, id string) error {
	_, err := deleteFlavorRows(ctx, tx, id)
	return err
}
