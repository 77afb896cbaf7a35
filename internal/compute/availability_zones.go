package compute

import (
	"context"
	"net/http"
	"slices"

	"nimbus/internal/api"
)

// listAZs is GET /os-availability-zone: the zones of the compute services,
// available while one of their services is enabled, the available ones
// first (availability_zone.py _describe_availability_zones,
// availability_zones.py get_availability_zones).
func (s *Service) listAZs(r *http.Request) (*api.Response, error) { return s.azList(r, false) }

// listAZsDetail adds each available zone's hosts and enabled services, and
// the controller's "internal" zone.
func (s *Service) listAZsDetail(r *http.Request) (*api.Response, error) { return s.azList(r, true) }

// serviceZone is a service's availability zone as Nova's
// set_availability_zones gives it: a compute host's is the zone of the
// aggregates holding it (zones, from hostZones), else its own (the fleet's,
// else "nova"); the controller's services are in "internal".
func serviceZone(sv *serviceRow, zones map[string]string) string {
	if sv.Binary == binCompute {
		if z, ok := zones[sv.Host]; ok {
			return z
		}
	}
	return sv.Zone
}

// zoneOf is serviceZone with the zones read (or, when they cannot be,
// the service's own).
func (s *Service) zoneOf(ctx context.Context, sv *serviceRow) string {
	zones, err := s.hostZones(ctx)
	if err != nil {
		s.log.Warn("aggregate zones unavailable", "error", err)
	}
	return serviceZone(sv, zones)
}

func (s *Service) azList(r *http.Request, detail bool) (*api.Response, error) {
	ctx := r.Context()
	svcs, hosts, err := s.servicesAndHosts(ctx)
	if err != nil {
		return nil, err
	}
	zones, err := s.hostZones(ctx)
	if err != nil {
		return nil, err
	}
	enabled, disabled := map[string]bool{}, map[string]bool{}
	for _, sv := range svcs {
		if sv.Disabled {
			disabled[serviceZone(sv, zones)] = true
		} else {
			enabled[serviceZone(sv, zones)] = true
		}
	}
	var available, unavailable []string
	for z := range enabled {
		available = append(available, z)
	}
	for z := range disabled {
		if !enabled[z] {
			unavailable = append(unavailable, z)
		}
	}
	slices.Sort(available)
	slices.Sort(unavailable)
	out := []any{}
	for _, z := range available {
		if z == internalZone && !detail {
			continue
		}
		entry := map[string]any{"zoneName": z, "zoneState": map[string]bool{"available": true}, "hosts": nil}
		if detail {
			hs := map[string]map[string]any{}
			// Only enabled services are listed (availability_zone.py
			// _describe_availability_zones_verbose).
			for _, sv := range svcs {
				if sv.Disabled || serviceZone(sv, zones) != z {
					continue
				}
				if hs[sv.Host] == nil {
					hs[sv.Host] = map[string]any{}
				}
				view := s.serviceView(r, sv, hosts)
				hs[sv.Host][sv.Binary] = map[string]any{
					"available": serviceUp(sv, hosts), "active": !sv.Disabled, "updated_at": view["updated_at"],
				}
			}
			entry["hosts"] = hs
		}
		out = append(out, entry)
	}
	for _, z := range unavailable {
		if z == internalZone && !detail {
			continue
		}
		out = append(out, map[string]any{"zoneName": z, "zoneState": map[string]bool{"available": false}, "hosts": nil})
	}
	return api.JSON(http.StatusOK, map[string]any{"availabilityZoneInfo": out}), nil
}
