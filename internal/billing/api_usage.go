package billing

import "nimbus/internal/api"

// usageRoutes are usage per resource and month, and notices.
func (s *Service) usageRoutes() []api.Route { return nil }
