package compute

import (
	"context"

	"nimbus/internal/metering"
	"nimbus/internal/store"
)

// meterKey is what a server's usage period depends on; the zero value is
// "not billable". A server is billed while it exists on a host and is not
// shelved: from its first boot (as from an unshelve's), stopped or not, to
// shelve or delete. A server that never ran (no valid host, or a build that
// failed, as a placeholder image's does) is never billed.
type meterKey struct {
	flavorID         string
	vcpus, ram, disk int
	osType           string
}

func meterKeyOf(sv *server) meterKey {
	if sv.Deleted || sv.Host == "" || sv.VMState == vmBuilding || sv.VMState == vmShelved || sv.VMState == vmShelvedOffloaded {
		return meterKey{}
	}
	f := sv.Doc.Flavor
	return meterKey{f.ID, f.VCPUs, f.RAM, f.diskGB(), sv.Doc.OSType}
}

// moveMeter records sv's usage period when what it is billed as changed.
func (s *Service) moveMeter(ctx context.Context, q store.Querier, sv *server) error {
	k := meterKeyOf(sv)
	if k == sv.metered {
		return nil
	}
	var spec *metering.Spec
	if k != (meterKey{}) {
		f := sv.Doc.Flavor
		sp := metering.ServerSpec(f.Name, int64(f.VCPUs), int64(f.RAM), int64(f.diskGB()), f.ExtraSpecs, sv.Doc.OSType)
		spec = &sp
	}
	if err := metering.Set(ctx, q, metering.KindServer, sv.ID, sv.ProjectID, spec, s.now()); err != nil {
		return err
	}
	sv.metered = k
	return nil
}

// backfillMeter opens a usage period for every billable server that has
// none: servers created before metering existed. Their periods start at
// creation; hours billing already charged are not charged again (the
// ledger is unique per server and hour).
func (s *Service) backfillMeter(ctx context.Context) error {
	if err := s.stopBuildingMeters(ctx); err != nil {
		return err
	}
	rows, err := s.db.Query(ctx, `SELECT `+serverCols+` FROM compute_servers WHERE deleted = 0 AND host <> '' AND `+
		metering.Unmetered("compute_servers.id", false))
	if err != nil {
		return err
	}
	var missing []*server
	for rows.Next() {
		sv, err := scanServer(rows)
		if err != nil {
			rows.Close()
			return err
		}
		if meterKeyOf(sv) != (meterKey{}) {
			missing = append(missing, sv)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for _, sv := range missing {
		f := sv.Doc.Flavor
		spec := metering.ServerSpec(f.Name, int64(f.VCPUs), int64(f.RAM), int64(f.diskGB()), f.ExtraSpecs, sv.Doc.OSType)
		if err := s.db.Tx(ctx, func(tx *store.Tx) error {
			return metering.Set(ctx, tx, metering.KindServer, sv.ID, sv.ProjectID, &spec, sv.CreatedAt)
		}); err != nil {
			return err
		}
	}
	if len(missing) > 0 {
		s.log.Info("metering: opened usage periods for existing servers", "servers", len(missing))
	}
	return nil
}

// stopBuildingMeters closes the open usage periods of servers still
// building: a version that billed from placement opened them, and nothing
// else would close them if the build then failed or was deleted (a
// building server's meterKey is "not billable" on both sides). A build
// that goes on to run opens its period when it does.
func (s *Service) stopBuildingMeters(ctx context.Context) error {
	return s.db.Tx(ctx, func(tx *store.Tx) error {
		rows, err := tx.Query(ctx, `SELECT id, project_id FROM compute_servers WHERE deleted = 0 AND vm_state = ? AND NOT `+
			metering.Unmetered("compute_servers.id", true), vmBuilding)
		if err != nil {
			return err
		}
		var ids, projects []string
		for rows.Next() {
			var id, project string
			if err := rows.Scan(&id, &project); err != nil {
				rows.Close()
				return err
			}
			ids, projects = append(ids, id), append(projects, project)
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		for i, id := range ids {
			if err := metering.Set(ctx, tx, metering.KindServer, id, projects[i], nil, s.now()); err != nil {
				return err
			}
		}
		return nil
	})
}
