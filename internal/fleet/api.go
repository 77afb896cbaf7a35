package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"nimbus/internal/api"
	"nimbus/internal/driver"
	"nimbus/internal/fleet/wire"
	"nimbus/internal/store"
)

// Body limits of the agent API, by call.
const (
	maxEnrolBody     = 4 << 10
	maxHostsBody     = 64 << 20 // a fake agent may present thousands of hosts
	maxHeartbeatBody = 16 << 20
	maxPollBody      = 4 << 20
	maxResultsBody   = 16 << 20
	maxHosts         = 10000
	maxResults       = 1000
	maxOpsPerPoll    = 100
)

// apiError is an error with its status and code for the agent API.
type apiError struct {
	status int
	code   string
	msg    string
}

func (e *apiError) Error() string { return e.msg }

func badRequest(format string, args ...any) error {
	return &apiError{http.StatusBadRequest, wire.CodeBadRequest, fmt.Sprintf(format, args...)}
}

var errUnauthorized = &apiError{http.StatusUnauthorized, wire.CodeUnauthorized, "missing or bad agent credential"}

// Handler serves the agent API (see package wire).
func (s *Service) Handler() http.Handler {
	type route struct {
		method string
		auth   bool
		limit  int64
		h      func(ctx context.Context, agent string, body []byte) (int, any, error)
	}
	routes := map[string]route{
		wire.PathEnrol:     {http.MethodPost, false, maxEnrolBody, s.handleEnrol},
		wire.PathHosts:     {http.MethodPut, true, maxHostsBody, s.handleHosts},
		wire.PathHeartbeat: {http.MethodPost, true, maxHeartbeatBody, s.handleHeartbeat},
		wire.PathPoll:      {http.MethodPost, true, maxPollBody, s.handlePoll},
		wire.PathResults:   {http.MethodPost, true, maxResultsBody, s.handleResults},
		wire.PathStop:      {http.MethodPost, true, maxPollBody, s.handleStop},
		wire.PathNetState:  {http.MethodPost, true, maxPollBody, s.handleNetState},     // netstate.go
		wire.PathMetadata:  {http.MethodPost, true, maxMetadataBody, s.handleMetadata}, // netstate.go
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if p := recover(); p != nil {
				s.log.Error("fleet: agent API panic", "path", r.URL.Path, "panic", fmt.Sprint(p))
				writeError(w, &apiError{http.StatusInternalServerError, wire.CodeInternal, "internal error"})
			}
		}()
		w.Header().Set(wire.HeaderProtocol, strconv.Itoa(wire.Protocol))
		w.Header().Set(wire.HeaderMinProtocol, strconv.Itoa(wire.MinProtocol))
		if err := checkProtocol(r.Header.Get(wire.HeaderProtocol)); err != nil {
			writeError(w, err)
			return
		}
		if strings.HasPrefix(r.URL.Path, wire.PathImages) {
			agent, ok := s.authorize(w, r)
			if ok {
				s.handleImage(w, r, agent)
			}
			return
		}
		rt, ok := routes[r.URL.Path]
		if !ok {
			writeError(w, &apiError{http.StatusNotFound, wire.CodeNotFound, "no such agent API call: " + r.URL.Path})
			return
		}
		if r.Method != rt.method {
			w.Header().Set("Allow", rt.method)
			writeError(w, &apiError{http.StatusMethodNotAllowed, wire.CodeMethod, r.Method + " is not allowed here; use " + rt.method})
			return
		}
		agent := ""
		if rt.auth {
			if agent, ok = s.authorize(w, r); !ok {
				return
			}
		}
		body, err := readBody(w, r, rt.limit)
		if err != nil {
			writeError(w, err)
			return
		}
		status, out, err := rt.h(r.Context(), agent, body)
		if err != nil {
			s.fail(w, r, err)
			return
		}
		writeJSON(w, status, out)
	})
}

// checkProtocol refuses an agent whose protocol this controller does not
// speak (see wire.Protocol); an agent that names none speaks version 1.
func checkProtocol(v string) error {
	p := 1
	if v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return &apiError{http.StatusBadRequest, wire.CodeBadRequest, wire.HeaderProtocol + " must be a whole number"}
		}
		p = n
	}
	switch {
	case p < wire.MinProtocol:
		return &apiError{http.StatusUpgradeRequired, wire.CodeUpgrade, fmt.Sprintf(
			"this agent speaks protocol %d and the controller %d to %d: upgrade the agent to the controllers' release", p,
			wire.MinProtocol, wire.Protocol)}
	case p > wire.Protocol:
		return &apiError{http.StatusBadRequest, wire.CodeUpgrade, fmt.Sprintf(
			"this agent speaks protocol %d and the controller at most %d: upgrade the controllers before the agents", p,
			wire.Protocol)}
	}
	return nil
}

// authorize checks the request's agent credential and names its agent;
// it answers the refusal itself.
func (s *Service) authorize(w http.ResponseWriter, r *http.Request) (string, bool) {
	cred, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		w.Header().Set("WWW-Authenticate", "Bearer")
		writeError(w, errUnauthorized)
		return "", false
	}
	id, err := s.Authenticate(r.Context(), strings.TrimSpace(cred))
	if errors.Is(err, ErrBadCredential) {
		w.Header().Set("WWW-Authenticate", "Bearer")
		writeError(w, errUnauthorized)
		return "", false
	}
	if err != nil {
		s.fail(w, r, err)
		return "", false
	}
	return id, true
}

func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return nil, &apiError{http.StatusRequestEntityTooLarge, wire.CodeTooLarge, fmt.Sprintf("body larger than %d bytes", limit)}
	}
	if err != nil {
		return nil, badRequest("reading the body: %v", err)
	}
	return b, nil
}

func decode(body []byte, v any) error {
	if len(body) == 0 {
		return badRequest("a JSON body is required")
	}
	if err := json.Unmarshal(body, v); err != nil {
		return badRequest("invalid JSON body: %v", err)
	}
	return nil
}

// fail writes err: the agent API's own errors as they are, the database
// away (store.IsUnavailable, the rule the APIs follow), its disk full
// (store.IsFull) or its locks too long awaited (store.IsBusy) as a 503
// with Retry-After, anything else as a 500 that says no more.
func (s *Service) fail(w http.ResponseWriter, r *http.Request, err error) {
	var ae *apiError
	if errors.As(err, &ae) {
		writeError(w, ae)
		return
	}
	if r.Context().Err() != nil {
		return // the agent went away
	}
	if store.IsUnavailable(err) {
		s.log.Warn("fleet: agent API: database unavailable", "path", r.URL.Path, "error", err)
		w.Header().Set("Retry-After", strconv.Itoa(api.RetryAfter))
		writeError(w, &apiError{http.StatusServiceUnavailable, wire.CodeUnavailable, "database unavailable"})
		return
	}
	if store.IsBusy(err) {
		s.log.Warn("fleet: agent API: busy", "path", r.URL.Path, "error", err)
		w.Header().Set("Retry-After", "1")
		writeError(w, &apiError{http.StatusServiceUnavailable, wire.CodeUnavailable, "busy"})
		return
	}
	if store.IsFull(err) {
		s.log.Warn("fleet: agent API: storage full", "path", r.URL.Path, "error", err)
		w.Header().Set("Retry-After", strconv.Itoa(api.RetryAfterFull))
		writeError(w, &apiError{http.StatusServiceUnavailable, wire.CodeUnavailable, "storage full"})
		return
	}
	s.log.Error("fleet: agent API failed", "path", r.URL.Path, "error", err)
	writeError(w, &apiError{http.StatusInternalServerError, wire.CodeInternal, "internal error"})
}

func writeError(w http.ResponseWriter, err error) {
	ae, ok := err.(*apiError)
	if !ok {
		ae = &apiError{http.StatusInternalServerError, wire.CodeInternal, "internal error"}
	}
	writeJSON(w, ae.status, wire.ErrorBody{Error: wire.Error{Code: ae.code, Message: ae.msg}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":{"code":"internal","message":"internal error"}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	w.Write(b)
}

// validName is a host or agent name: printable, no spaces, at most 255
// bytes.
func validName(s string) bool {
	if s == "" || len(s) > 255 || !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !unicode.IsPrint(r) || unicode.IsSpace(r) {
			return false
		}
	}
	return true
}

func (s *Service) handleEnrol(ctx context.Context, _ string, body []byte) (int, any, error) {
	var req wire.EnrolRequest
	if err := decode(body, &req); err != nil {
		return 0, nil, err
	}
	if req.Name == "" {
		req.Name = "agent"
	}
	if !validName(req.Name) {
		return 0, nil, badRequest("name must be printable, without spaces, at most 255 bytes")
	}
	if !strings.HasPrefix(req.Token, tokenPrefix) || len(req.Token) > 256 {
		return 0, nil, &apiError{http.StatusUnauthorized, wire.CodeUnauthorized, ErrBadToken.Error()}
	}
	id, cred, err := s.Enrol(ctx, req.Token, req.Name)
	if errors.Is(err, ErrBadToken) {
		return 0, nil, &apiError{http.StatusUnauthorized, wire.CodeUnauthorized, err.Error()}
	}
	if err != nil {
		return 0, nil, err
	}
	return http.StatusCreated, wire.EnrolResponse{AgentID: id, Credential: cred}, nil
}

func (s *Service) handleHosts(ctx context.Context, agent string, body []byte) (int, any, error) {
	var req wire.HostsRequest
	if err := decode(body, &req); err != nil {
		return 0, nil, err
	}
	resp, err := s.Register(ctx, agent, req.Hosts)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, resp, nil
}

// Register records the hosts an agent presents with their inventory. A
// host that another agent presents and that is still alive is refused (two
// agents must not drive one hypervisor); one whose agent is gone is taken
// over. Hosts the agent presented before and no longer does are left
// without an agent, and so down.
func (s *Service) Register(ctx context.Context, agent string, hosts []driver.Host) (*wire.HostsResponse, error) {
	resp, err := s.register(ctx, agent, hosts)
	if err == nil && len(resp.Refused) > 0 {
		s.log.Warn("fleet: hosts refused to an agent", "agent", agent, "refused", resp.Refused)
	}
	return resp, err
}

func (s *Service) register(ctx context.Context, agent string, hosts []driver.Host) (*wire.HostsResponse, error) {
	if len(hosts) > maxHosts {
		return nil, badRequest("at most %d hosts per agent", maxHosts)
	}
	seen := map[string]bool{}
	for i, h := range hosts {
		if !validName(h.Name) {
			return nil, badRequest("hosts[%d]: name must be printable, without spaces, at most 255 bytes", i)
		}
		if seen[h.Name] {
			return nil, badRequest("host %q listed twice", h.Name)
		}
		seen[h.Name] = true
		if err := h.Validate(); err != nil {
			return nil, badRequest("host %q: %v", h.Name, err)
		}
		if len(h.Health) > 1024 || !utf8.ValidString(h.Health) || strings.ContainsRune(h.Health, 0) {
			return nil, badRequest("host %q: bad health text", h.Name)
		}
	}
	now := s.now()
	ts := store.FormatTime(now)
	resp := &wire.HostsResponse{Registered: []string{}}
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		resp.Registered, resp.Refused = resp.Registered[:0], nil
		for i, h := range hosts {
			inv, err := json.Marshal(h)
			if err != nil {
				return badRequest("host %q: %v", h.Name, err)
			}
			cur, err := scanHost(tx.QueryRow(ctx, "SELECT "+hostColumns+" FROM fleet_hosts WHERE name = ?", h.Name))
			switch {
			case errors.Is(err, store.ErrNotFound):
				_, err = tx.Exec(ctx, `INSERT INTO fleet_hosts (name, agent_id, inventory, up, health, observed, registered_at, position, seen_at)
 VALUES (?, ?, ?, ?, ?, 0, ?, ?, ?)`, h.Name, agent, string(inv), b2i(h.Up), h.Health, ts, i, ts)
			case err != nil:
			case cur.AgentID != agent && cur.AgentID != "" && s.alive(cur, now):
				resp.Refused = append(resp.Refused, wire.Refusal{Name: h.Name,
					Reason: "another agent (" + cur.AgentID + ") presents this host and is still up"})
				delete(seen, h.Name)
				continue
			default:
				if cur.AgentID != agent {
					s.log.Warn("fleet: host taken over by another agent", "host", h.Name, "from", cur.AgentID, "to", agent)
					err = forgetClock(ctx, tx, h.Name)
				}
				if err == nil {
					_, err = tx.Exec(ctx, `UPDATE fleet_hosts SET agent_id = ?, inventory = ?, up = ?, health = ?, seen_at = ?
 WHERE name = ?`, agent, string(inv), b2i(h.Up), h.Health, ts, h.Name)
				}
			}
			if err != nil {
				return err
			}
			resp.Registered = append(resp.Registered, h.Name)
		}
		old, err := agentHosts(ctx, tx, agent)
		if err != nil {
			return err
		}
		for _, name := range old {
			if !seen[name] {
				if _, err := tx.Exec(ctx, "UPDATE fleet_hosts SET agent_id = '' WHERE name = ?", name); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.agentHostsCache.Delete(agent)
	return resp, nil
}

// forgetClock drops the agent clock readings a host and its VMs were
// last reported at: a host's new agent orders its reports by its own
// clock, which the old one's must not outrank. A VM reported before stays
// reported (observed 1, before any real clock), so that compute still
// sees it.
func forgetClock(ctx context.Context, tx *store.Tx, host string) error {
	if _, err := tx.Exec(ctx, "UPDATE fleet_hosts SET observed = 0 WHERE name = ?", host); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, "UPDATE fleet_instances SET observed = 1 WHERE host = ? AND observed > 1", host)
	return err
}

// agentHostsTTL bounds how long Poll trusts its cached list of an agent's
// hosts: a registration through this controller replaces it at once, one
// through another controller sharing the database is seen within it.
const agentHostsTTL = 5 * time.Second

type cachedHosts struct {
	names []string
	until time.Time
}

// hostsOf answers the names of an agent's hosts, cached briefly: every
// long-poll asks.
func (s *Service) hostsOf(ctx context.Context, agent string) ([]string, error) {
	now := s.now()
	if v, ok := s.agentHostsCache.Load(agent); ok && now.Before(v.(cachedHosts).until) {
		return v.(cachedHosts).names, nil
	}
	names, err := agentHosts(ctx, s.db, agent)
	if err != nil {
		return nil, err
	}
	s.agentHostsCache.Store(agent, cachedHosts{names: names, until: now.Add(agentHostsTTL)})
	return names, nil
}

func agentHosts(ctx context.Context, q store.Querier, agent string) ([]string, error) {
	rows, err := q.Query(ctx, "SELECT name FROM fleet_hosts WHERE agent_id = ?", agent)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, rows.Err()
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

func (s *Service) handleHeartbeat(ctx context.Context, agent string, body []byte) (int, any, error) {
	var hb wire.Heartbeat
	if err := decode(body, &hb); err != nil {
		return 0, nil, err
	}
	if hb.Observed <= 0 {
		return 0, nil, badRequest("observed (the agent's clock, unix ns) is required")
	}
	for _, h := range hb.Hosts {
		if len(h.Health) > 1024 || !utf8.ValidString(h.Health) || strings.ContainsRune(h.Health, 0) {
			return 0, nil, badRequest("host %q: bad health text", h.Name)
		}
	}
	for _, in := range hb.Instances {
		if in.ID == "" || len(in.ID) > 64 {
			return 0, nil, badRequest("instances: bad id %q", in.ID)
		}
		if !validPower(in.Power) {
			return 0, nil, badRequest("instance %q: power_state %d is none of Nova's", in.ID, in.Power)
		}
	}
	hosts, err := s.Heartbeat(ctx, agent, hb)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, wire.HeartbeatResponse{DownAfterSeconds: s.cfg.DownAfter.Seconds(), Hosts: hosts}, nil
}

// powerChange is a power state a heartbeat found changed.
type powerChange struct {
	id string
	p  driver.PowerState
}

// Heartbeat records an agent's report: it is alive, its hosts' health, and
// its VMs' power states. Reports are ordered by the agent's clock: one
// older than what a host or VM already has changes nothing of it. A power
// state that changed by itself is told to the power listener; a VM the
// agent no longer has is NoState. What it says of hosts not its own, or of
// servers compute placed elsewhere, is refused and logged (see
// recordInstances). It answers the hosts held as the agent's.
func (s *Service) Heartbeat(ctx context.Context, agent string, hb wire.Heartbeat) ([]string, error) {
	now := s.now()
	ts := store.FormatTime(now)
	var rep instanceReport
	var held []string
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		rep, held = instanceReport{}, held[:0]
		if _, err := tx.Exec(ctx, "UPDATE fleet_agents SET seen_at = ? WHERE id = ?", ts, agent); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, "SELECT name, up, health, observed FROM fleet_hosts WHERE agent_id = ?", agent)
		if err != nil {
			return err
		}
		type hostState struct {
			up       bool
			health   string
			observed int64
		}
		mine := map[string]hostState{}
		for rows.Next() {
			var name string
			var st hostState
			var up int
			if err := rows.Scan(&name, &up, &st.health, &st.observed); err != nil {
				rows.Close()
				return err
			}
			st.up = up != 0
			mine[name] = st
			held = append(held, name)
		}
		rows.Close()
		// Every host of the agent is alive, and the report is newer for
		// the hosts whose last one is older (one statement for all: a
		// report changes the health of few).
		if _, err := tx.Exec(ctx, `UPDATE fleet_hosts SET seen_at = ?, observed = CASE WHEN observed < ? THEN ? ELSE observed END
 WHERE agent_id = ?`, ts, hb.Observed, hb.Observed, agent); err != nil {
			return err
		}
		fresh := map[string]bool{}
		for _, h := range hb.Hosts {
			st, ok := mine[h.Name]
			if !ok || hb.Observed <= st.observed {
				continue
			}
			fresh[h.Name] = true
			if h.Up == st.up && h.Health == st.health {
				continue
			}
			if _, err := tx.Exec(ctx, "UPDATE fleet_hosts SET up = ?, health = ? WHERE name = ?", b2i(h.Up), h.Health, h.Name); err != nil {
				return err
			}
		}
		for _, r := range hb.Instances {
			if _, ok := mine[r.Host]; !ok {
				rep.refuse(r, "the host is not this agent's")
			}
		}
		if len(fresh) == 0 {
			return nil
		}
		return s.recordInstances(ctx, tx, hb, fresh, ts, &rep)
	})
	if err != nil {
		return nil, err
	}
	s.logRefusals(agent, rep.refused, rep.nRefused)
	if l := s.powerListener(); l != nil {
		for _, c := range rep.changes {
			l(c.id, c.p)
		}
	}
	return held, nil
}

// instanceReport is what a heartbeat's VMs changed, and what of it was
// refused.
type instanceReport struct {
	changes  []powerChange
	refused  []refusal // the first maxRefusalLogs
	nRefused int
}

func (rep *instanceReport) refuse(r wire.Instance, why string) {
	rep.nRefused++
	if len(rep.refused) < maxRefusalLogs {
		rep.refused = append(rep.refused, refusal{host: r.Host, server: r.ID, why: why})
	}
}

// storedInstance is a fleet_instances row as read.
type storedInstance struct {
	host     string
	power    int
	observed int64
	gone     bool
}

// instanceUpdate is a reported VM that changes its stored row (known
// false: there is none yet).
type instanceUpdate struct {
	r     wire.Instance
	cur   storedInstance
	known bool
}

// recordInstances records the VMs a heartbeat reports on the agent's
// fresh hosts. A VM compute has a server for counts only where compute
// placed that server; any other only on its own host, or where the fleet
// knows of no VM by its id (an orphan, which compute then destroys). A VM
// reported before and missing now is NoState.
func (s *Service) recordInstances(ctx context.Context, tx *store.Tx, hb wire.Heartbeat, fresh map[string]bool, ts string, rep *instanceReport) error {
	// The VMs of the fresh hosts, as stored.
	stored := map[string]storedInstance{}
	names := make([]any, 0, len(fresh))
	for n := range fresh {
		names = append(names, n)
	}
	rows, err := tx.Query(ctx, "SELECT server_id, host, power, observed, gone FROM fleet_instances WHERE host IN ("+placeholders(len(names))+")", names...)
	if err != nil {
		return err
	}
	for rows.Next() {
		var id string
		var in storedInstance
		var gone int
		if err := rows.Scan(&id, &in.host, &in.power, &in.observed, &gone); err != nil {
			rows.Close()
			return err
		}
		in.gone = gone != 0
		stored[id] = in
	}
	rows.Close()
	reported := map[string]bool{}
	var updates []instanceUpdate
	var ids []string
	for _, r := range hb.Instances {
		if !fresh[r.Host] || reported[r.ID] {
			continue
		}
		reported[r.ID] = true
		u := instanceUpdate{r: r}
		u.cur, u.known = stored[r.ID]
		if !u.known {
			var gone int
			err := tx.QueryRow(ctx, "SELECT host, power, observed, gone FROM fleet_instances WHERE server_id = ?", r.ID).
				Scan(&u.cur.host, &u.cur.power, &u.cur.observed, &gone)
			if err != nil && !store.IsNoRows(err) {
				return err
			}
			u.known, u.cur.gone = err == nil, gone != 0
		}
		if u.known && (hb.Observed <= u.cur.observed || (u.cur.host == r.Host && u.cur.power == int(r.Power) && !u.cur.gone)) {
			continue
		}
		updates = append(updates, u)
		ids = append(ids, r.ID)
	}
	placed, _, err := s.placedHosts(ctx, tx, ids)
	if err != nil {
		return err
	}
	for _, u := range updates {
		r := u.r
		if host, live := placed[r.ID]; live && host != r.Host {
			rep.refuse(r, "compute has the server on host "+strconv.Quote(host))
			continue
		} else if !live && u.known && u.cur.host != r.Host {
			rep.refuse(r, "the fleet has the VM on host "+strconv.Quote(u.cur.host))
			continue
		}
		if !u.known {
			if _, err := tx.Exec(ctx, `INSERT INTO fleet_instances (server_id, host, power, observed, gone, updated_at)
 VALUES (?, ?, ?, ?, 0, ?) ON CONFLICT (server_id) DO NOTHING`, r.ID, r.Host, int(r.Power), hb.Observed, ts); err != nil {
				return err
			}
			continue
		}
		// Only the row as read: a spawn elsewhere since moves the VM.
		res, err := tx.Exec(ctx, "UPDATE fleet_instances SET host = ?, power = ?, observed = ?, gone = 0, updated_at = ? WHERE server_id = ? AND host = ?",
			r.Host, int(r.Power), hb.Observed, ts, r.ID, u.cur.host)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 1 && u.cur.observed > 0 && !u.cur.gone && u.cur.power != int(r.Power) {
			rep.changes = append(rep.changes, powerChange{r.ID, r.Power})
		}
	}
	for id, cur := range stored {
		if reported[id] || cur.gone || cur.observed == 0 || cur.observed >= hb.Observed || cur.power == int(driver.NoState) {
			continue
		}
		// Reported before, missing now: the VM is gone from its host.
		if _, err := tx.Exec(ctx, "UPDATE fleet_instances SET power = ?, observed = ?, updated_at = ? WHERE server_id = ?",
			int(driver.NoState), hb.Observed, ts, id); err != nil {
			return err
		}
		rep.changes = append(rep.changes, powerChange{id, driver.NoState})
	}
	return nil
}

func (s *Service) handlePoll(ctx context.Context, agent string, body []byte) (int, any, error) {
	var req wire.PollRequest
	if err := decode(body, &req); err != nil {
		return 0, nil, err
	}
	if len(req.Have) > 100000 {
		return 0, nil, badRequest("have lists too many ops")
	}
	wait := min(time.Duration(max(req.WaitMS, 0))*time.Millisecond, s.cfg.MaxWait)
	ops, err := s.Poll(ctx, agent, req.Have, wait)
	if err != nil {
		return 0, nil, err
	}
	if ops == nil {
		ops = []wire.Op{}
	}
	return http.StatusOK, wire.PollResponse{Ops: ops}, nil
}

// Poll answers the pending ops for the agent's hosts that it does not
// have, oldest first, waiting up to wait for one to come.
func (s *Service) Poll(ctx context.Context, agent string, have []string, wait time.Duration) ([]wire.Op, error) {
	hosts, err := s.hostsOf(ctx, agent)
	if err != nil {
		return nil, err
	}
	if len(hosts) == 0 {
		// Nothing can come before the agent registers hosts.
		return nil, nil
	}
	skip := make(map[string]bool, len(have))
	for _, id := range have {
		skip[id] = true
	}
	p := s.hub.addPoll(hosts)
	defer s.hub.removePoll(p)
	var deadline <-chan time.Time
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		deadline = t.C
	}
	// A safety net for an announcement the watcher might miss.
	safety := time.NewTicker(2 * time.Second)
	defer safety.Stop()
	for {
		ops, err := s.pending(ctx, agent, skip)
		if err != nil || len(ops) > 0 || wait <= 0 {
			return ops, err
		}
		select {
		case <-p.ch:
		case <-safety.C:
		case <-deadline:
			return nil, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.done:
			return nil, nil
		}
	}
}

// pending reads the pending ops of the agent's hosts, without those it has.
func (s *Service) pending(ctx context.Context, agent string, skip map[string]bool) ([]wire.Op, error) {
	rows, err := s.db.Query(ctx, `SELECT o.id, o.op_key, o.host, o.server_id, o.kind, o.args FROM fleet_ops o
 JOIN fleet_hosts h ON h.name = o.host WHERE o.state = ? AND o.created_at >= ? AND h.agent_id = ?
 ORDER BY o.created_at, o.id LIMIT ?`, statePending, store.FormatTime(s.now().Add(-s.cfg.OpTimeout)), agent, len(skip)+maxOpsPerPoll)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []wire.Op
	for rows.Next() {
		var op wire.Op
		var args string
		if err := rows.Scan(&op.ID, &op.Key, &op.Host, &op.ServerID, &op.Kind, &args); err != nil {
			return nil, err
		}
		if skip[op.ID] || len(out) >= maxOpsPerPoll {
			continue
		}
		op.Args = json.RawMessage(args)
		out = append(out, op)
	}
	return out, rows.Err()
}

// ownedOp scans an op row followed by its host's agent.
type ownedOp struct {
	row   interface{ Scan(...any) error }
	owner *string
}

func (o ownedOp) Scan(dest ...any) error { return o.row.Scan(append(dest, o.owner)...) }

func (s *Service) handleResults(ctx context.Context, agent string, body []byte) (int, any, error) {
	var req wire.ResultsRequest
	if err := decode(body, &req); err != nil {
		return 0, nil, err
	}
	if len(req.Results) > maxResults {
		return 0, nil, badRequest("at most %d results per call", maxResults)
	}
	for i, r := range req.Results {
		if r.OpID == "" || len(r.OpID) > 64 {
			return 0, nil, badRequest("results[%d]: bad op_id", i)
		}
		if !r.OK && r.Error == nil {
			return 0, nil, badRequest("results[%d]: a failed op needs an error", i)
		}
		if r.Power != nil && !validPower(*r.Power) {
			return 0, nil, badRequest("results[%d]: power_state %d is none of Nova's", i, *r.Power)
		}
	}
	done, err := s.Record(ctx, agent, req.Results)
	if err != nil {
		return 0, nil, err
	}
	if done == nil {
		done = []string{}
	}
	return http.StatusOK, wire.ResultsResponse{Done: done}, nil
}

// Record stores ops' results, each at most once (a result posted again, or
// for an op that timed out meanwhile, changes nothing), updates the
// servers' power states and hosts, and hands the results to the callers
// waiting here. It answers the op ids the agent may forget.
func (s *Service) Record(ctx context.Context, agent string, results []wire.Result) ([]string, error) {
	now := s.now()
	ts := store.FormatTime(now)
	var done []string
	var finished []*opRow
	err := s.writes.do(ctx, func(ctx context.Context, tx *store.Tx) error {
		done, finished = done[:0], finished[:0]
		for _, r := range results {
			var owner string
			op, err := scanOp(ownedOp{tx.QueryRow(ctx, "SELECT "+opColumns+`, COALESCE(h.agent_id, '')
 FROM fleet_ops o LEFT JOIN fleet_hosts h ON h.name = o.host WHERE o.id = ?`, r.OpID), &owner})
			if errors.Is(err, store.ErrNotFound) {
				done = append(done, r.OpID)
				continue
			}
			if err != nil {
				return err
			}
			if owner != agent {
				s.log.Warn("fleet: result for an op of another agent's host dropped", "op", r.OpID, "agent", agent, "host", op.Host)
				done = append(done, r.OpID)
				continue
			}
			done = append(done, r.OpID)
			if op.State != statePending {
				continue
			}
			op.State, op.Result, op.Error, op.ErrorCode = stateDone, r.Result, "", ""
			if !r.OK {
				op.State, op.Result, op.Error, op.ErrorCode = stateFailed, nil, r.Error.Message, r.Error.Code
			}
			res, err := tx.Exec(ctx, `UPDATE fleet_ops SET state = ?, result = ?, error = ?, error_code = ?, done_at = ?, args = '{}'
 WHERE id = ? AND state = ?`, op.State, string(op.Result), op.Error, op.ErrorCode, ts, op.ID, statePending)
			if err != nil {
				return err
			}
			if n, _ := res.RowsAffected(); n != 1 {
				continue
			}
			finished = append(finished, op)
			switch {
			case op.Kind == wire.KindDestroy && r.OK:
				_, err = tx.Exec(ctx, `UPDATE fleet_instances SET gone = 1, power = 0, updated_at = ?,
 observed = CASE WHEN observed > ? THEN observed ELSE ? END WHERE server_id = ?`, ts, r.Observed, r.Observed, op.ServerID)
			case r.Power != nil && r.Observed > 0:
				_, err = tx.Exec(ctx, `UPDATE fleet_instances SET power = ?, observed = ?, updated_at = ?
 WHERE server_id = ? AND observed < ? AND gone = 0`, int(*r.Power), r.Observed, ts, op.ServerID, r.Observed)
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, op := range finished {
		s.hub.finished(op)
	}
	return done, nil
}
