package billing

import "nimbus/internal/api"

// trialRoutes are the free test access routes.
func (s *Service) trialRoutes() []api.Route { return nil }
