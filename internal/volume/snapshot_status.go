package volume

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// snapStatusMoves are the changes os-update_snapshot_status may make, by
// the snapshot's status now (cinder/api/contrib/snapshot_actions.py).
var snapStatusMoves = map[string][]string{
	SnapCreating: {SnapCreating, SnapAvailable, SnapError},
	SnapDeleting: {SnapDeleting, SnapErrorDeleting},
}

// updateSnapshotStatus is os-update_snapshot_status {"status", "progress"}:
// how a snapshot that another service takes reports its progress. The
// owner may call it, as Cinder's policy has it; only the moves above are
// allowed, so it never brings back a snapshot being deleted. 202.
func (s *Service) updateSnapshotStatus(r *http.Request, raw json.RawMessage) (*api.Response, error) {
	ctx := r.Context()
	b, err := actionBody("os-update_snapshot_status", raw)
	if err != nil {
		return nil, err
	}
	status, err := b.optString("status", 255)
	if err != nil {
		return nil, err
	}
	if status == nil {
		return nil, api.BadRequest("'status' must be specified.")
	}
	progress, err := b.optString("progress", 255)
	if err != nil {
		return nil, err
	}
	if progress != nil && *progress != "" {
		n, err := strconv.Atoi(strings.TrimSuffix(*progress, "%"))
		if err != nil || n < 0 || n > 100 || !strings.HasSuffix(*progress, "%") {
			return nil, api.BadRequest("progress must be an integer percentage")
		}
	}
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		sn, err := ownedSnap(ctx, tx, caller(r), r.PathValue("id"))
		if err != nil {
			return err
		}
		moves, ok := snapStatusMoves[sn.Status]
		if !ok {
			return api.BadRequest("Snapshot status %s not allowed for update_snapshot_status", sn.Status)
		}
		if !contains(moves, *status) {
			return api.BadRequest("Provided snapshot status %s not allowed for snapshot with status %s.", *status, sn.Status)
		}
		if ok, err := s.setSnapStatus(ctx, tx, sn, *status, sn.Error, sn.Status); err != nil || !ok {
			return err
		}
		if progress != nil && *progress != "" {
			_, err = tx.Exec(ctx, "UPDATE volume_snapshots SET progress = ? WHERE id = ?", *progress, sn.ID)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(http.StatusAccepted), nil
}
