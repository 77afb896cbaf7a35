package billing

import (
	"context"

	"nimbus/internal/store"
)

// ProjectCreated opens a new project's account with the default credit
// limit in the transaction that makes the project (identity.ProjectHook),
// so an account exists from the project's first request and a registration
// that fails leaves none behind. An account that exists already is kept.
func (s *Service) ProjectCreated(ctx context.Context, tx *store.Tx, projectID string) error {
	return s.ensureAccount(ctx, tx, projectID)
}
