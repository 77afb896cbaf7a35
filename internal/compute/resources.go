package compute

import (
	"context"

	"nimbus/internal/api"
)

// resourceRoutes are flavors, key pairs, limits, quotas, availability zones,
// usage, hypervisors and services.
func (s *Service) resourceRoutes() []api.Route { return nil }

// Bootstrap registers the default flavors once.
func (s *Service) Bootstrap(ctx context.Context) error { return nil }
