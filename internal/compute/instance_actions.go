package compute

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// actionEvent is one event of an instance action (nova instance_actions_events).
type actionEvent struct {
	Event      string     `json:"event"`
	StartTime  time.Time  `json:"start_time"`
	FinishTime *time.Time `json:"finish_time"`
	Result     *string    `json:"result"`
	Traceback  *string    `json:"traceback"`
	Host       string     `json:"host"`
	Details    *string    `json:"details"`
}

// maxActions is how many instance actions a server keeps, newest first:
// a customer can repeat an action (lock, unlock …) without end.
const maxActions = 1000

// recordAction writes the start of an instance action in tx and drops the
// server's actions older than the newest maxActions.
func (s *Service) recordAction(ctx context.Context, tx store.Querier, serverID, action string) error {
	return s.recordActionID(ctx, tx, serverID, action, actionID(ctx))
}

// actionID is the request id an action started in ctx is recorded under.
func actionID(ctx context.Context) string {
	if rid := api.RequestID(ctx); rid != "" {
		return rid
	}
	return "req-" + newUUID()
}

// recordActionID is recordAction with the action's request id given.
func (s *Service) recordActionID(ctx context.Context, tx store.Querier, serverID, action, rid string) error {
	if err := s.insertAction(ctx, tx, serverID, action, rid); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `DELETE FROM compute_instance_actions WHERE server_id = ? AND request_id NOT IN
 (SELECT request_id FROM compute_instance_actions WHERE server_id = ? ORDER BY start_time DESC, request_id DESC LIMIT ?)`,
		serverID, serverID, maxActions)
	return err
}

// insertAction writes the start of an instance action in tx, dropping no
// older one: a server being created has none (recordActionID drops them).
func (s *Service) insertAction(ctx context.Context, tx store.Querier, serverID, action, rid string) error {
	c := api.CallerFrom(ctx)
	now := store.FormatTime(s.now())
	_, err := tx.Exec(ctx, `INSERT INTO compute_instance_actions (server_id, request_id, action, project_id, user_id,
 start_time, updated_at, events) VALUES (?,?,?,?,?,?,?,?)`, serverID, rid, action, c.ProjectID, c.UserID, now, now, "[]")
	return err
}

// finishAction closes the current action of a server with one event named
// event (Nova's compute_<verb>); failure sets message "Error".
func (s *Service) finishAction(ctx context.Context, q store.Querier, serverID, requestID, event, host string, started time.Time, failure error) error {
	if requestID == "" {
		return nil
	}
	var raw string
	err := q.QueryRow(ctx, `SELECT events FROM compute_instance_actions WHERE server_id=? AND request_id=?`, serverID, requestID).Scan(&raw)
	if store.IsNoRows(err) {
		return nil
	}
	if err != nil {
		return err
	}
	var evs []actionEvent
	_ = store.FromJSON(raw, &evs)
	now := s.now()
	res := "Success"
	msg := ""
	ev := actionEvent{Event: event, StartTime: started, FinishTime: &now, Host: host}
	if failure != nil {
		res, msg = "Error", "Error"
		d := failure.Error()
		ev.Details, ev.Traceback = &d, &d
	}
	ev.Result = &res
	evs = append(evs, ev)
	_, err = q.Exec(ctx, `UPDATE compute_instance_actions SET events=?, finish_time=?, updated_at=?, message=?
 WHERE server_id=? AND request_id=?`, store.JSON(evs), store.FormatTime(now), store.FormatTime(now), msg, serverID, requestID)
	return err
}

type actionRow struct {
	ServerID, RequestID, Action, ProjectID, UserID, Message string
	Start, Updated                                          time.Time
	Events                                                  []actionEvent
}

func (s *Service) actionServer(r *http.Request) (*server, error) {
	// Instance actions of deleted servers stay readable (2.21).
	c := api.CallerFrom(r.Context())
	id := r.PathValue("id")
	sv, err := s.loadServer(r.Context(), s.db, id, false)
	if err == store.ErrNotFound || (err == nil && !c.IsAdmin() && sv.ProjectID != c.ProjectID) ||
		(err == nil && sv.Deleted && !VersionFrom(r.Context()).AtLeast(21)) {
		return nil, api.NotFound("Instance %s could not be found.", id)
	}
	return sv, err
}

// actionPage selects a page of a server's actions, newest first: the one
// of requestID if set, after the action marker names, updated within
// [since, before] (zero for no bound), at most limit of them (-1 for all).
type actionPage struct {
	requestID, marker string
	since, before     time.Time
	limit             int
}

// listActions reads a page of a server's actions, filtered and limited in
// SQL; a marker that names no action of the server is a 400.
func (s *Service) listActions(ctx context.Context, serverID string, pg actionPage) ([]actionRow, error) {
	q := `SELECT server_id, request_id, action, project_id, user_id, message, start_time, updated_at, events
 FROM compute_instance_actions WHERE server_id = ?`
	args := []any{serverID}
	if pg.requestID != "" {
		q += " AND request_id = ?"
		args = append(args, pg.requestID)
	}
	if pg.marker != "" {
		var start string
		err := s.db.QueryRow(ctx, "SELECT start_time FROM compute_instance_actions WHERE server_id = ? AND request_id = ?",
			serverID, pg.marker).Scan(&start)
		if store.IsNoRows(err) {
			return nil, api.BadRequest("Marker %s could not be found.", pg.marker)
		}
		if err != nil {
			return nil, err
		}
		q += " AND (start_time < ? OR (start_time = ? AND request_id < ?))"
		args = append(args, start, start, pg.marker)
	}
	// Stored times are fixed-width UTC text, so they compare as strings.
	if !pg.since.IsZero() {
		q += " AND updated_at >= ?"
		args = append(args, store.FormatTime(pg.since))
	}
	if !pg.before.IsZero() {
		q += " AND updated_at <= ?"
		args = append(args, store.FormatTime(pg.before))
	}
	q += " ORDER BY start_time DESC, request_id DESC"
	if pg.limit >= 0 {
		q += " LIMIT ?"
		args = append(args, pg.limit)
	}
	rows, err := s.db.Query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []actionRow
	for rows.Next() {
		var a actionRow
		var st, up, ev string
		if err := rows.Scan(&a.ServerID, &a.RequestID, &a.Action, &a.ProjectID, &a.UserID, &a.Message, &st, &up, &ev); err != nil {
			return nil, err
		}
		a.Start, a.Updated = store.ParseTime(st), store.ParseTime(up)
		_ = store.FromJSON(ev, &a.Events)
		out = append(out, a)
	}
	return out, rows.Err()
}

// actionView is nova/api/openstack/compute/instance_actions.py _format_action.
func actionView(a actionRow, v Version) map[string]any {
	m := map[string]any{
		"action": a.Action, "instance_uuid": a.ServerID, "request_id": a.RequestID, "user_id": a.UserID,
		"project_id": a.ProjectID, "start_time": usgTime(a.Start), "message": nil,
	}
	if a.Message != "" {
		m["message"] = a.Message
	}
	if v.AtLeast(58) {
		m["updated_at"] = usgTime(a.Updated)
	}
	return m
}

func (s *Service) handleListActions(r *http.Request) (*api.Response, error) {
	sv, err := s.actionServer(r)
	if err != nil {
		return nil, err
	}
	v := VersionFrom(r.Context())
	q := r.URL.Query()
	if v.AtLeast(58) {
		if err := onlyParams(q, "limit", "marker", "changes-since", "changes-before"); err != nil {
			return nil, err
		}
	}
	out := []any{}
	if !v.AtLeast(58) {
		acts, err := s.listActions(r.Context(), sv.ID, actionPage{limit: -1})
		if err != nil {
			return nil, err
		}
		for _, a := range acts {
			out = append(out, actionView(a, v))
		}
		return api.JSON(200, map[string]any{"instanceActions": out}), nil
	}
	pg := actionPage{marker: q.Get("marker")}
	if cs := q.Get("changes-since"); cs != "" {
		if pg.since, err = parseISOTime(cs); err != nil {
			return nil, api.BadRequest("Invalid input for query parameters changes-since. Value: %s. '%s' is not a 'date-time'", cs, cs)
		}
	}
	if cb := q.Get("changes-before"); cb != "" && v.AtLeast(66) {
		if pg.before, err = parseISOTime(cb); err != nil {
			return nil, api.BadRequest("Invalid input for query parameters changes-before. Value: %s. '%s' is not a 'date-time'", cb, cb)
		}
	}
	limit, err := parseLimit(q.Get("limit"))
	if err != nil {
		return nil, err
	}
	pg.limit = limit
	acts, err := s.listActions(r.Context(), sv.ID, pg)
	if err != nil {
		return nil, err
	}
	for _, a := range acts {
		out = append(out, actionView(a, v))
	}
	body := map[string]any{"instanceActions": out}
	if len(out) == limit && limit > 0 {
		last := out[len(out)-1].(map[string]any)["request_id"].(string)
		body["links"] = []map[string]string{{"rel": "next", "href": api.BaseURL(r) + "/v2.1/servers/" + sv.ID +
			"/os-instance-actions?limit=" + strconv.Itoa(limit) + "&marker=" + last}}
	}
	return api.JSON(200, body), nil
}

func (s *Service) handleShowAction(r *http.Request) (*api.Response, error) {
	sv, err := s.actionServer(r)
	if err != nil {
		return nil, err
	}
	v := VersionFrom(r.Context())
	c := api.CallerFrom(r.Context())
	rid := r.PathValue("rid")
	acts, err := s.listActions(r.Context(), sv.ID, actionPage{requestID: rid, limit: -1})
	if err != nil {
		return nil, err
	}
	if len(acts) == 0 {
		return nil, api.NotFound("Action for request_id %s on instance %s not found", rid, sv.ID)
	}
	a := acts[0]
	m := actionView(a, v)
	// Events are admin-only before 2.51; tracebacks stay admin-only.
	if c.IsAdmin() || v.AtLeast(51) {
		evs := []any{}
		for _, e := range a.Events {
			em := map[string]any{"event": e.Event, "start_time": usgTime(e.StartTime), "finish_time": nil, "result": e.Result}
			if e.FinishTime != nil {
				em["finish_time"] = usgTime(*e.FinishTime)
			}
			if c.IsAdmin() {
				em["traceback"] = e.Traceback
			}
			if v.AtLeast(62) {
				em["hostId"] = hostID(a.ProjectID, e.Host)
				if c.IsAdmin() {
					em["host"] = e.Host
				}
			}
			if v.AtLeast(84) {
				em["details"] = e.Details
			}
			evs = append(evs, em)
		}
		m["events"] = evs
	}
	return api.JSON(200, map[string]any{"instanceAction": m}), nil
}
