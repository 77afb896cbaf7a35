package compute

import (
	"context"

	"nimbus/internal/metering"
	"nimbus/internal/store"
)

// meterKey is what a server's usage period depends on; the zero value is
// "not billable". A server is billed while it exists on a host and is not
// shelved: from placement, stopped or not, to shelve or delete, so that a
// prepaid term can be bought as soon as the server is ordered. A server
// that never ran (no valid host, or a build that failed before it ever
// booted, as a placeholder image's does) is never billed: fail drops the
// periods of such a build.
type meterKey struct {
	flavorID         string
	vcpus, ram, disk int
	osType           string
	name             string // for the ledger: a rename changes the name only
}

func meterKeyOf(sv *server) meterKey {
	if sv.Deleted || sv.Host == "" || sv.VMState == vmShelved || sv.VMState == vmShelvedOffloaded {
		return meterKey{}
	}
	f := sv.Doc.Flavor
	return meterKey{f.ID, f.VCPUs, f.RAM, meteredDiskGB(sv), sv.Doc.OSType, sv.Name}
}

// moveMeter records sv's usage period when what it is billed as changed;
// fresh is for a server being inserted, which has no period yet.
func (s *Service) moveMeter(ctx context.Context, q store.Querier, sv *server, fresh bool) error {
	k := meterKeyOf(sv)
	if k == sv.metered {
		return nil
	}
	var spec *metering.Spec
	if k != (meterKey{}) {
		f := sv.Doc.Flavor
		sp := metering.ServerSpec(f.Name, int64(f.VCPUs), int64(f.RAM), int64(meteredDiskGB(sv)), f.ExtraSpecs, sv.Doc.OSType)
		sp.Name = sv.Name
		spec = &sp
	}
	set := metering.Set
	if fresh {
		set = metering.Open // a server being inserted has no period to end
	}
	if err := set(ctx, q, metering.KindServer, sv.ID, sv.ProjectID, spec, s.now()); err != nil {
		return err
	}
	// What the flavor gave the server is paid with the server while the
	// server is billed, and on its own while it is not (shelved): the
	// public address as a public IPv4, a network-disk flavor's root
	// volume as a volume (internal/metering states the rule).
	if sv.Doc.Flavor.ExtraSpecs["nimbus:public_ipv4"] == "true" && s.networks != nil {
		if err := s.networks.MeterServerAddresses(ctx, q, sv.ID, k != (meterKey{})); err != nil {
			return err
		}
	}
	if bd := sv.bootDevice(); bd != nil && bd.FlavorDisk && s.volumes != nil {
		paid := 0
		if k != (meterKey{}) {
			paid = sv.Doc.Flavor.Disk
		}
		if err := s.volumes.SetFlavorDisk(ctx, q, bd.VolumeID, int64(paid)); err != nil {
			return err
		}
	}
	sv.metered = k
	return nil
}

// backfillMeter opens a usage period for every billable server that has
// none: servers created before metering existed. Their periods start at
// creation; hours billing already charged are not charged again (the
// ledger is unique per server and hour).
func (s *Service) backfillMeter(ctx context.Context) error {
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
		spec := metering.ServerSpec(f.Name, int64(f.VCPUs), int64(f.RAM), int64(meteredDiskGB(sv)), f.ExtraSpecs, sv.Doc.OSType)
		spec.Name = sv.Name
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
