package compute

import (
	"context"
	"slices"

	"nimbus/internal/api"
	"nimbus/internal/metering"
	"nimbus/internal/store"
)

// SpendGate is what compute asks before it lets a project start or raise
// a charge: billing answers an error (an *api.Error 403 with the reason)
// while the project's account is below its credit limit. CanChange asks
// for a resource that changes spec, and lets a change that does not raise
// its hourly price through.
type SpendGate interface {
	CanSpend(ctx context.Context, project string) error
	CanChange(ctx context.Context, project, kind string, from, to metering.Spec) error
}

// checkSpend asks the gate, when there is one, whether project may create
// or unshelve servers, or snapshot them.
func (s *Service) checkSpend(ctx context.Context, project string) error {
	if s.gate == nil {
		return nil
	}
	return s.gate.CanSpend(ctx, project)
}

// checkResize asks the gate, when there is one, whether sv may be resized
// to flavor nf: only a resize that raises its price needs funds.
func (s *Service) checkResize(ctx context.Context, sv *server, nf *Flavor) error {
	if s.gate == nil {
		return nil
	}
	spec := func(f flavorSnap) metering.Spec {
		return metering.ServerSpec(f.Name, int64(f.VCPUs), int64(f.RAM), int64(f.diskGB()), f.ExtraSpecs, sv.Doc.OSType)
	}
	return s.gate.CanChange(ctx, sv.ProjectID, metering.KindServer, spec(sv.Doc.Flavor), spec(snapOf(nf)))
}

// ShelveServers shelves, as billing's suspension does, the servers of
// project that can be shelved (servers nil) or those of servers that can:
// their data stays (the disk goes to a snapshot image, as a customer's
// shelve), their host and billing stop. Servers busy with a task are left;
// the next charging pass tries them again. It answers how many it shelved.
func (s *Service) ShelveServers(ctx context.Context, project string, servers []string) (int, error) {
	ids := servers
	if ids == nil {
		rows, err := s.db.Query(ctx, "SELECT id FROM compute_servers WHERE project_id = ? AND deleted = 0", project)
		if err != nil {
			return 0, err
		}
		for rows.Next() {
			var id string
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return 0, err
			}
			ids = append(ids, id)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return 0, err
		}
	}
	// The instance action names billing as the user, in the project.
	ctx = api.WithCaller(ctx, &api.Caller{UserID: "nimbus-billing", ProjectID: project})
	n := 0
	for _, id := range ids {
		err := s.db.Tx(ctx, func(tx *store.Tx) error {
			sv, err := s.loadServer(ctx, tx, id, true)
			if err == store.ErrNotFound {
				return nil
			}
			if err != nil {
				return err
			}
			// The states a customer's shelve accepts; the customer's lock
			// does not hold billing back.
			if sv.Deleted || sv.ProjectID != project || sv.TaskState != "" || !slices.Contains(actionRules["shelve"].vmStates, sv.VMState) {
				return nil
			}
			sv.TaskState = taskShelving
			sv.Doc.RequestID = ""
			sv.Doc.TaskID = newUUID()
			sv.Doc.Retries = 0
			if err := s.recordAction(ctx, tx, sv.ID, "shelve"); err != nil {
				return err
			}
			if err := s.saveServer(ctx, tx, sv); err != nil {
				return err
			}
			s.enqueueAfter(tx, sv.ID)
			n++
			return nil
		})
		if err != nil {
			return n, err
		}
	}
	if n > 0 {
		s.log.Info("billing: servers shelved", "project", project, "servers", n)
	}
	return n, nil
}
