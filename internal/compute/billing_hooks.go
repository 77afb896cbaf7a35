package compute

import (
	"context"
	"slices"

	"nimbus/internal/api"
	"nimbus/internal/metering"
	"nimbus/internal/store"
)

// SpendGate is billing's rule of what a project's money allows (billing's
// gate.go): each method answers an *api.Error 403 with the reason when it
// refuses. Cover answers how many servers of a spec, up to want, the funds
// pay the first hour of (at least least); CanChange lets a resize that
// does not raise the price through and asks for the raise otherwise;
// CanSpend refuses only a project whose funds are spent.
type SpendGate interface {
	CanSpend(ctx context.Context, project string) error
	Cover(ctx context.Context, project, kind string, spec metering.Spec, least, want int64) (int64, error)
	CanChange(ctx context.Context, project, kind string, from, to metering.Spec) error
}

// checkSpend asks the gate, when there is one, whether project may start
// what costs nothing yet (a snapshot of a server, priced once taken).
func (s *Service) checkSpend(ctx context.Context, project string) error {
	if s.gate == nil {
		return nil
	}
	return s.gate.CanSpend(ctx, project)
}

// serverSpec is what a server of flavor f and osType, booted or not from a
// volume of its own, is charged as (moveMeter's spec).
func serverSpec(f flavorSnap, osType string, ownBootVolume bool) metering.Spec {
	return metering.ServerSpec(f.Name, int64(f.VCPUs), int64(f.RAM), int64(meteredDisk(f, ownBootVolume)), f.ExtraSpecs, osType)
}

// fundsRoom is how many servers of spec, from least up to want, project's
// funds pay the first hour of.
func (s *Service) fundsRoom(ctx context.Context, project string, spec metering.Spec, least, want int) (int, error) {
	if s.gate == nil {
		return want, nil
	}
	n, err := s.gate.Cover(ctx, project, metering.KindServer, spec, int64(least), int64(want))
	return int(n), err
}

// checkUnshelve asks the gate whether sv's project pays the first hour of
// sv running again.
func (s *Service) checkUnshelve(ctx context.Context, sv *server) error {
	bd := sv.bootDevice()
	_, err := s.fundsRoom(ctx, sv.ProjectID, serverSpec(sv.Doc.Flavor, sv.Doc.OSType, bd != nil && !bd.FlavorDisk), 1, 1)
	return err
}

// checkResize asks the gate, when there is one, whether sv may be resized
// to flavor nf: only a resize that raises its price needs funds, for the
// raise.
func (s *Service) checkResize(ctx context.Context, sv *server, nf *Flavor) error {
	if s.gate == nil {
		return nil
	}
	bd := sv.bootDevice()
	own := bd != nil && !bd.FlavorDisk
	return s.gate.CanChange(ctx, sv.ProjectID, metering.KindServer, serverSpec(sv.Doc.Flavor, sv.Doc.OSType, own),
		serverSpec(snapOf(nf), sv.Doc.OSType, own))
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
			if err := s.enqueueAfter(ctx, tx, sv.ID); err != nil {
				return err
			}
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
