package compute

import (
	"context"
	"errors"

	"nimbus/internal/store"
)

// ServerProject returns the project of a live server, and false when there
// is no such server; the network service asks it before a customer may
// name the server as a port's device.
func (s *Service) ServerProject(ctx context.Context, id string) (string, bool, error) {
	sv, err := s.loadServer(ctx, s.db, id, false)
	if errors.Is(err, store.ErrNotFound) {
		return "", false, nil
	}
	if err != nil || sv.Deleted {
		return "", false, err
	}
	return sv.ProjectID, true, nil
}
