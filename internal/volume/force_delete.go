package volume

import (
	"net/http"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// forceDelete is the admin's os-force_delete action on a volume
// (cinder/api/contrib/admin_actions.py _force_delete): the volume goes
// whatever its status, even one an admin reset by hand, but not while a
// host has it connected; a reservation that made no connection goes
// with it. 202.
func (s *Service) forceDelete(r *http.Request) (*api.Response, error) {
	c := caller(r)
	if !c.IsAdmin() {
		return nil, api.PolicyForbidden("volume_extension:volume_admin_actions:force_delete")
	}
	ctx := r.Context()
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		v, err := ownedVol(ctx, tx, c, r.PathValue("id"))
		if err != nil {
			return err
		}
		if v.Status == StatusDeleting {
			// A volume an admin reset to deleting has no work queued yet.
			tx.AfterCommit(func() { s.kick(v.ID) })
			return nil
		}
		atts, err := attachmentsOf(ctx, tx, v.ID)
		if err != nil {
			return err
		}
		for _, a := range atts {
			if a.Host != "" || a.Status == AttachAttached {
				return invalidVolume("Volume %s is attached to server %s: detach it first.", v.ID, a.ServerID)
			}
		}
		if _, err := tx.Exec(ctx, "DELETE FROM volume_attachments WHERE volume_id = ?", v.ID); err != nil {
			return err
		}
		return s.beginDelete(ctx, tx, v, false)
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(http.StatusAccepted), nil
}
