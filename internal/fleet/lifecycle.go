package fleet

import (
	"context"
	"fmt"
	"net/http"

	"nimbus/internal/driver"
	"nimbus/internal/fleet/wire"
	"nimbus/internal/store"
)

// StoppedHealth is the health of the hosts of an agent that stopped
// cleanly, until it reports again.
const StoppedHealth = "agent stopped"

func (s *Service) handleStop(ctx context.Context, agent string, body []byte) (int, any, error) {
	var req wire.StopRequest
	if err := decode(body, &req); err != nil {
		return 0, nil, err
	}
	if req.Observed <= 0 {
		return 0, nil, badRequest("observed (the agent's clock, unix ns) is required")
	}
	hosts, err := s.Stop(ctx, agent, req.Observed)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, wire.StopResponse{Hosts: hosts}, nil
}

// Stop records that an agent is stopping cleanly: its hosts are down at
// once rather than after DownAfter without heartbeats. observed (the
// agent's clock) orders it among the agent's reports, so that a heartbeat
// sent before the stop and delivered late cannot bring a host back up; the
// agent's next start registers its hosts again, up. It answers the hosts
// marked down.
func (s *Service) Stop(ctx context.Context, agent string, observed int64) ([]string, error) {
	var hosts []string
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		var err error
		if hosts, err = agentHosts(ctx, tx, agent); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `UPDATE fleet_hosts SET up = 0, health = ?, observed = CASE WHEN observed < ? THEN ? ELSE observed END
 WHERE agent_id = ?`, StoppedHealth, observed, observed, agent)
		return err
	})
	if err != nil {
		return nil, err
	}
	if hosts == nil {
		hosts = []string{}
	}
	s.log.Info("fleet: agent stopped, its hosts are down", "agent", agent, "hosts", len(hosts))
	return hosts, nil
}

// RemoveHost forgets a host in tx, for "nimbus admin host remove" and
// compute's service delete; it tells whether the host was known. It is
// refused with driver.ErrHostInUse while a VM is recorded there (placed,
// or reported by its agent). An agent that still presents the host
// registers it again, as a running nova-compute re-creates its service.
func (s *Service) RemoveHost(ctx context.Context, tx *store.Tx, name string) (bool, error) {
	var vms int
	if err := tx.QueryRow(ctx, "SELECT COUNT(*) FROM fleet_instances WHERE host = ? AND gone = 0", name).Scan(&vms); err != nil {
		return false, err
	}
	if vms > 0 {
		return false, fmt.Errorf("%w: %d VMs on %s", driver.ErrHostInUse, vms, name)
	}
	var agent string
	err := tx.QueryRow(ctx, "SELECT agent_id FROM fleet_hosts WHERE name = ?", name).Scan(&agent)
	if store.IsNoRows(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if _, err := tx.Exec(ctx, "DELETE FROM fleet_hosts WHERE name = ?", name); err != nil {
		return false, err
	}
	tx.AfterCommit(func() {
		s.inventories.Delete(name)
		s.agentHostsCache.Delete(agent)
	})
	s.log.Info("fleet: host removed", "host", name, "agent", agent)
	return true, nil
}
