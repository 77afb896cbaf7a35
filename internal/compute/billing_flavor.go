package compute

import (
	"context"
	"errors"

	"nimbus/internal/metering"
	"nimbus/internal/store"
)

// FlavorSpec is what a server of flavor ref (an id, else a name) amounts to
// for billing, as project may use it: billing's quotes price a flavor by it
// exactly as the charging pass prices the server. store.ErrNotFound when no
// flavor by that id or name is open to project.
func (s *Service) FlavorSpec(ctx context.Context, project, ref string) (metering.Spec, error) {
	f, err := s.getFlavor(ctx, s.db, ref)
	if errors.Is(err, store.ErrNotFound) {
		f, err = s.flavorByName(ctx, project, ref)
	}
	if err != nil {
		return metering.Spec{}, err
	}
	if ok, err := s.flavorAccessible(ctx, s.db, f, project); err != nil {
		return metering.Spec{}, err
	} else if !ok {
		return metering.Spec{}, store.ErrNotFound
	}
	snap := snapOf(f)
	return metering.ServerSpec(f.Name, int64(f.VCPUs), int64(f.RAM), int64(snap.diskGB()), f.ExtraSpecs, ""), nil
}

// flavorByName is the flavor named name that project may use.
func (s *Service) flavorByName(ctx context.Context, project, name string) (*Flavor, error) {
	all, err := s.allFlavors(ctx, s.db)
	if err != nil {
		return nil, err
	}
	for _, f := range all {
		if f.Name != name {
			continue
		}
		if ok, err := s.flavorAccessible(ctx, s.db, f, project); err != nil || ok {
			return f, err
		}
	}
	return nil, store.ErrNotFound
}
