package identity

import (
	"context"

	"nimbus/internal/store"
)

// projectHooks runs several hooks in order, in the one transaction that
// makes the project; the first error undoes them all.
type projectHooks []ProjectHook

func (hs projectHooks) ProjectCreated(ctx context.Context, tx *store.Tx, projectID string) error {
	for _, h := range hs {
		if err := h.ProjectCreated(ctx, tx, projectID); err != nil {
			return err
		}
	}
	return nil
}

// AddProjectHook adds h to the hooks each project create (the API's and
// Register's) calls, after those added before it. Call it before serving.
func (s *Service) AddProjectHook(h ProjectHook) {
	hs, _ := s.projectHook.(projectHooks)
	s.projectHook = append(hs[:len(hs):len(hs)], h)
}

// projectCreated runs the project hooks, if any, in tx.
func (s *Service) projectCreated(ctx context.Context, tx *store.Tx, projectID string) error {
	if s.projectHook == nil {
		return nil
	}
	return s.projectHook.ProjectCreated(ctx, tx, projectID)
}
