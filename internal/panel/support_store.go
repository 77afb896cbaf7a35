package panel

import (
	"cmp"
	"context"
	"errors"
	"strconv"
	"strings"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/quota"
	"nimbus/internal/store"
)

// LoadSupport reads the operator's contacts as last saved in db (by the
// panel or "nimbus admin support set"); all empty when none were saved,
// in which case the panel shows those it was started with.
func LoadSupport(ctx context.Context, db *store.DB) (Support, error) {
	return storeOnly(db).SupportSettings(ctx)
}

// SaveSupport replaces the operator's contacts in db, as the panel's
// support settings page does, with the same checks.
func SaveSupport(ctx context.Context, db *store.DB, s Support) error {
	return storeOnly(db).SetSupportSettings(ctx, s)
}

// storeOnly is a panel with nothing but its store, for the settings the
// panel keeps there, so that the command line reads and writes them with
// the panel's own code.
func storeOnly(db *store.DB) *Panel {
	return &Panel{cfg: Config{DB: db, Now: func() time.Time { return time.Now().UTC() }}}
}

// Support request states. A request is open until the operator (or the
// customer who no longer needs it) closes it; only open ones count against
// the project's bound. Tickets with replies may add states between the
// two, such as answered.
const (
	requestOpen   = "open"
	requestClosed = "closed"
)

// SupportLimits bound what one project may post to support, so that one
// customer cannot bury everyone else's requests.
type SupportLimits struct {
	// Open is how many of a project's requests may be open at once;
	// PerHour how many it may send in any hour. 0 is the default.
	Open, PerHour int
}

// DefaultSupportLimits are the bounds a limit of 0 takes.
var DefaultSupportLimits = SupportLimits{Open: 5, PerHour: 10}

func (l SupportLimits) withDefaults() SupportLimits {
	if l.Open <= 0 {
		l.Open = DefaultSupportLimits.Open
	}
	if l.PerHour <= 0 {
		l.PerHour = DefaultSupportLimits.PerHour
	}
	return l
}

// errTooManyOpen and errTooOften are a project at its support bounds; the
// page words them with the numbers.
var (
	errTooManyOpen = errors.New("panel: too many open support requests")
	errTooOften    = errors.New("panel: too many support requests this hour")
)

// addRequest stores r unless its project has as many open requests as it
// may, or has sent as many as it may in the last hour. The project's lock
// row is bumped first, so concurrent requests of one project are counted
// one after another.
func (p *Panel) addRequest(ctx context.Context, r ConfigRequest) error {
	lim := p.cfg.SupportLimits.withDefaults()
	return p.cfg.DB.Tx(ctx, func(tx *store.Tx) error {
		if err := quota.Lock(ctx, tx, "panel_support_locks", r.ProjectID); err != nil {
			return err
		}
		var open, recent int
		if err := tx.QueryRow(ctx, "SELECT COUNT(*) FROM panel_config_requests WHERE project_id = ? AND state = ?",
			r.ProjectID, requestOpen).Scan(&open); err != nil {
			return err
		}
		if open >= lim.Open {
			return errTooManyOpen
		}
		if err := tx.QueryRow(ctx, "SELECT COUNT(*) FROM panel_config_requests WHERE project_id = ? AND created_at > ?",
			r.ProjectID, r.CreatedAt.Add(-time.Hour).Unix()).Scan(&recent); err != nil {
			return err
		}
		if recent >= lim.PerHour {
			return errTooOften
		}
		_, err := tx.Exec(ctx, `INSERT INTO panel_config_requests
 (id, project_id, project_name, user_id, user_name, body, created_at, state, closed_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0)`,
			r.ID, r.ProjectID, r.ProjectName, r.UserID, r.UserName, r.Body, r.CreatedAt.Unix(), requestOpen)
		return err
	})
}

// setRequestState opens or closes request id; of project's requests only
// when project is not "" (a customer's own). No such request is
// errNotFound.
func (p *Panel) setRequestState(ctx context.Context, id, project, state string) error {
	closed := int64(0)
	if state == requestClosed {
		closed = p.cfg.Now().Unix()
	}
	q := "UPDATE panel_config_requests SET state = ?, closed_at = ? WHERE id = ?"
	args := []any{state, closed, id}
	if project != "" {
		q += " AND project_id = ?"
		args = append(args, project)
	}
	res, err := p.cfg.DB.Exec(ctx, q, args...)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return cmp.Or(err, error(errNotFound))
	}
	return nil
}

// requestFilter picks support requests: one project's ("" every
// project's), in one state ("" any).
type requestFilter struct {
	Project, State string
}

// requestKeys order requests newest first; the id breaks ties within a
// second, so a marker is exact.
var requestKeys = api.Keyset{{Col: "created_at", Desc: true}, {Col: "id", Desc: true}}

// errBadMarker is a page marker that names no request (or, for a customer,
// none of theirs).
var errBadMarker = BadRequest("The page marker is not valid; start from the first page.")

// requests is one page of f's requests, newest first, after the request
// marker ("" from the start), and the marker of the next page ("" when
// this is the last).
func (p *Panel) requests(ctx context.Context, f requestFilter, marker string, limit int) ([]ConfigRequest, string, error) {
	pg := api.Page{Keys: requestKeys, Limit: limit + 1}
	if f.Project != "" {
		pg.Add("project_id = ?", f.Project)
	}
	if f.State != "" {
		pg.Add("state = ?", f.State)
	}
	if marker != "" {
		where, args := "id = ?", []any{marker}
		if f.Project != "" {
			where, args = where+" AND project_id = ?", append(args, f.Project)
		}
		vals, err := requestKeys.MarkerValues(ctx, p.cfg.DB, "panel_config_requests", where, args...)
		if errors.Is(err, store.ErrNotFound) {
			return nil, "", errBadMarker
		} else if err != nil {
			return nil, "", err
		}
		pg.AfterMarker(vals)
	}
	rows, err := p.cfg.DB.Query(ctx, `SELECT id, project_id, project_name, user_id, user_name, body, created_at, state
 FROM panel_config_requests `+pg.SQL(), pg.Args...)
	if err != nil {
		return nil, "", err
	}
	defer rows.Close()
	var out []ConfigRequest
	for rows.Next() {
		var r ConfigRequest
		var at int64
		if err := rows.Scan(&r.ID, &r.ProjectID, &r.ProjectName, &r.UserID, &r.UserName, &r.Body, &at, &r.State); err != nil {
			return nil, "", err
		}
		r.CreatedAt = time.Unix(at, 0).UTC()
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, "", err
	}
	next := ""
	if len(out) > limit {
		out = out[:limit]
		next = out[limit-1].ID
	}
	return out, next, nil
}

// RequestGroup is one customer's support requests in the operator's view
// by customer: how many (in the state looked at), how many of them are
// open, and when the newest came.
type RequestGroup struct {
	ProjectID, ProjectName string
	Count, Open            int
	Newest                 time.Time
}

// groupKeys order customers by their newest request, newest first.
var groupKeys = api.Keyset{{Col: "MAX(created_at)", Desc: true}, {Col: "project_id", Desc: true}}

// requestGroups is one page of customers with requests in state ("" any),
// by newest request, after the group marker ("" from the start), and the
// next page's marker. A group marker is its place, "<newest>.<project>",
// not a project alone, so that it stays valid when the project's requests
// change state.
func (p *Panel) requestGroups(ctx context.Context, state, marker string, limit int) ([]RequestGroup, string, error) {
	where, args := "", []any{}
	if state != "" {
		where, args = "WHERE state = ? ", append(args, state)
	}
	having := ""
	if marker != "" {
		at, project, ok := strings.Cut(marker, ".")
		n, err := strconv.ParseInt(at, 10, 64)
		if !ok || err != nil || project == "" || len(marker) > 200 {
			return nil, "", errBadMarker
		}
		cond, more := groupKeys.After([]any{n, project})
		having, args = "HAVING "+cond+" ", append(args, more...)
	}
	rows, err := p.cfg.DB.Query(ctx, `SELECT project_id, MAX(project_name), COUNT(*),
 SUM(CASE WHEN state = 'open' THEN 1 ELSE 0 END), MAX(created_at) FROM panel_config_requests `+where+
		"GROUP BY project_id "+having+"ORDER BY "+groupKeys.OrderBy()+" LIMIT "+strconv.Itoa(limit+1), args...)
	if err != nil {
		return nil, "", err
	}
	defer rows.Close()
	var out []RequestGroup
	for rows.Next() {
		var g RequestGroup
		var at int64
		if err := rows.Scan(&g.ProjectID, &g.ProjectName, &g.Count, &g.Open, &at); err != nil {
			return nil, "", err
		}
		g.Newest = time.Unix(at, 0).UTC()
		out = append(out, g)
	}
	if err := rows.Err(); err != nil {
		return nil, "", err
	}
	next := ""
	if len(out) > limit {
		out = out[:limit]
		last := out[limit-1]
		next = strconv.FormatInt(last.Newest.Unix(), 10) + "." + last.ProjectID
	}
	return out, next, nil
}

// openRequests counts the open requests and the customers who sent them.
func (p *Panel) openRequests(ctx context.Context) (requests, customers int, err error) {
	err = p.cfg.DB.QueryRow(ctx, "SELECT COUNT(*), COUNT(DISTINCT project_id) FROM panel_config_requests WHERE state = ?", requestOpen).
		Scan(&requests, &customers)
	return requests, customers, err
}
