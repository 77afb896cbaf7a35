package compute

// TEMPORARY: replaced by the server-groups/aggregates branch at merge.

import (
	"context"

	"nimbus/internal/store"
)

func (s *Service) hostZones(ctx context.Context) (map[string]string, error) { return nil, nil }

func (s *Service) groupPlacement(ctx context.Context, q store.Querier, id string) (string, int, map[string]int, error) {
	return "", 0, nil, nil
}

type schedulerHints struct {
	Group         string
	SameHost      []string
	DifferentHost []string
}

func parseSchedulerHints(raw []byte) (schedulerHints, error) { return schedulerHints{}, nil }

func (s *Service) checkGroupForCreate(ctx context.Context, projectID, id string, count int) error {
	return nil
}
func (s *Service) addGroupMember(ctx context.Context, tx *store.Tx, id, serverID string) error {
	return nil
}
func (s *Service) removeGroupMember(ctx context.Context, tx *store.Tx, serverID string) error {
	return nil
}
