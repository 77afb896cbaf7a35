package identity

import "nimbus/internal/api"

// adminRoutes is the identity API for managing domains, projects, users,
// roles and role assignments.
func (s *Service) adminRoutes() []api.Route {
	return nil
}
