package compute

import (
	"net/http"
	"slices"

	"nimbus/internal/api"
)

// listAZs is GET /os-availability-zone: the zones of the compute services,
// available while one of their services is enabled (availability_zone.py
// _describe_availability_zones).
func (s *Service) listAZs(r *http.Request) (*api.Response, error) { return s.azList(r, false) }

// listAZsDetail adds each zone's hosts and services, and the controller's
// "internal" zone.
func (s *Service) listAZsDetail(r *http.Request) (*api.Response, error) { return s.azList(r, true) }

func (s *Service) azList(r *http.Request, detail bool) (*api.Response, error) {
	ctx := r.Context()
	if err := s.ensureServices(ctx, false); err != nil {
		return nil, err
	}
	svcs, err := loadServices(ctx, s.db)
	if err != nil {
		return nil, err
	}
	hosts, err := s.fleet(ctx)
	if err != nil {
		return nil, err
	}
	available := map[string]bool{}
	var zones []string
	seen := map[string]bool{}
	for _, sv := range svcs {
		if sv.Zone == internalZone {
			continue
		}
		if !seen[sv.Zone] {
			seen[sv.Zone] = true
			zones = append(zones, sv.Zone)
		}
		if !sv.Disabled {
			available[sv.Zone] = true
		}
	}
	slices.Sort(zones)
	if detail {
		zones = append([]string{internalZone}, zones...)
		available[internalZone] = true
	}
	out := []any{}
	for _, z := range zones {
		entry := map[string]any{"zoneName": z, "zoneState": map[string]bool{"available": available[z]}, "hosts": nil}
		if detail && available[z] {
			hs := map[string]map[string]any{}
			// Only enabled services are listed (availability_zone.py
			// _describe_availability_zones_verbose).
			for _, sv := range svcs {
				if sv.Zone != z || sv.Disabled {
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
	return api.JSON(http.StatusOK, map[string]any{"availabilityZoneInfo": out}), nil
}
