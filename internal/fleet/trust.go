package fleet

import (
	"context"
	"encoding/json"
	"net/http"
	"slices"

	"nimbus/internal/driver"
	"nimbus/internal/fleet/wire"
	"nimbus/internal/store"
)

// An agent speaks only for its own hosts and the servers compute placed
// there: what it says about anything else is refused. This file holds the
// checks of what agents say against the controller's own records.

// Placements is compute's record of where it placed servers.
type Placements interface {
	// ServerHosts answers, for those of ids that are servers compute has
	// (not deleted), the host each is placed on ("" for none); q is the
	// caller's transaction.
	ServerHosts(ctx context.Context, q store.Querier, ids []string) (map[string]string, error)
}

// SetPlacements gives the fleet compute's record. Without it (the fleet
// alone) no server counts as placed by compute.
func (s *Service) SetPlacements(p Placements) { s.placements.Store(&p) }

// placedHosts reads compute's record of ids' hosts; ok is false when the
// fleet has no compute.
func (s *Service) placedHosts(ctx context.Context, q store.Querier, ids []string) (hosts map[string]string, ok bool, err error) {
	p := s.placements.Load()
	if p == nil {
		return map[string]string{}, false, nil
	}
	if len(ids) == 0 {
		return map[string]string{}, true, nil
	}
	hosts, err = (*p).ServerHosts(ctx, q, ids)
	return hosts, true, err
}

// maxRefusalLogs bounds the warnings one request logs, so that an agent
// cannot flood the log.
const maxRefusalLogs = 10

// refusal is a report about a server an agent does not have.
type refusal struct{ host, server, why string }

// logRefusals logs the first refusals of one request, and how many more.
func (s *Service) logRefusals(agent string, rs []refusal, total int) {
	for _, r := range rs {
		s.log.Warn("fleet: agent report refused", "agent", agent, "host", r.host, "server", r.server, "reason", r.why)
	}
	if total > len(rs) {
		s.log.Warn("fleet: more agent reports refused", "agent", agent, "count", total-len(rs))
	}
}

// specImages are the images a spec names: those its host may read.
func specImages(sp driver.Spec) []string {
	return []string{sp.ImageID, sp.Image.ID, sp.Image.KernelID, sp.Image.RamdiskID}
}

// opNamesImage tells whether one of agent's hosts has a pending op (one
// still delivered) whose spec names image id: a host is handed only the
// images its work needs.
func (s *Service) opNamesImage(ctx context.Context, agent, id string) (bool, error) {
	return s.anyOpArgs(ctx, func(args []byte) bool {
		var sp driver.Spec
		return json.Unmarshal(args, &sp) == nil && slices.Contains(specImages(sp), id)
	}, `SELECT o.args FROM fleet_ops o JOIN fleet_hosts h ON h.name = o.host
 WHERE o.state = ? AND o.created_at >= ? AND o.kind IN (?, ?) AND h.agent_id = ?`,
		statePending, store.FormatTime(s.now().Add(-s.cfg.OpTimeout)), wire.KindSpawn, wire.KindResize, agent)
}

// anyOpArgs tells whether the args of one op that query selects satisfy
// match.
func (s *Service) anyOpArgs(ctx context.Context, match func(args []byte) bool, query string, qargs ...any) (bool, error) {
	rows, err := s.db.Query(ctx, query, qargs...)
	if err != nil {
		return false, err
	}
	defer rows.Close()
	for rows.Next() {
		var args string
		if err := rows.Scan(&args); err != nil {
			return false, err
		}
		if match([]byte(args)) {
			return true, nil
		}
	}
	return false, rows.Err()
}

// authorizeUpload refuses a snapshot upload unless compute asked one of
// agent's hosts, by a pending snapshot op, to store server's disk into
// image, and compute still has server on one of agent's hosts. The
// image's instance_uuid, which names server, is the customer's to change,
// so it counts only together with the op.
func (s *Service) authorizeUpload(ctx context.Context, agent, image, server string) error {
	if server == "" {
		return &apiError{http.StatusForbidden, wire.CodeForbidden, "the image is not a server snapshot"}
	}
	pending, err := s.snapshotPending(ctx, agent, image, server)
	if err != nil {
		return err
	}
	if !pending {
		s.log.Warn("fleet: snapshot upload refused: no such snapshot asked of this agent", "agent", agent,
			"server", server, "image", image)
		return &apiError{http.StatusForbidden, wire.CodeForbidden, "no snapshot of the image's server into it is pending on this agent's hosts"}
	}
	placed, ok, err := s.placedHosts(ctx, s.db, []string{server})
	if err != nil || !ok {
		return err
	}
	mine, err := s.hostsOf(ctx, agent)
	if err != nil {
		return err
	}
	if host, live := placed[server]; !live || !slices.Contains(mine, host) {
		s.log.Warn("fleet: snapshot upload refused: compute has the server elsewhere", "agent", agent,
			"host", host, "server", server, "image", image)
		return &apiError{http.StatusForbidden, wire.CodeForbidden, "the image's server is on none of this agent's hosts"}
	}
	return nil
}

// snapshotPending tells whether a pending snapshot op of server into image
// is for one of agent's hosts.
func (s *Service) snapshotPending(ctx context.Context, agent, image, server string) (bool, error) {
	return s.anyOpArgs(ctx, func(args []byte) bool {
		var a wire.SnapshotArgs
		return json.Unmarshal(args, &a) == nil && a.ImageID == image
	}, `SELECT o.args FROM fleet_ops o JOIN fleet_hosts h ON h.name = o.host
 WHERE o.state = ? AND o.kind = ? AND o.server_id = ? AND h.agent_id = ?`, statePending, wire.KindSnapshot, server, agent)
}

// validPower tells whether p is one of Nova's power states: an agent's
// report is stored as the server's, so nothing else may pass.
func validPower(p driver.PowerState) bool {
	switch p {
	case driver.NoState, driver.Running, driver.Paused, driver.Shutdown, driver.Crashed, driver.Suspended:
		return true
	}
	return false
}
