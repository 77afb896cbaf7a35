package billing

import "nimbus/internal/api"

// termRoutes are the prepaid terms' routes.
func (s *Service) termRoutes() []api.Route { return nil }
