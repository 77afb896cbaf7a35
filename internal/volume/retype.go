package volume

import (
	"context"
	"encoding/json"
	"maps"
	"net/http"

	"nimbus/internal/api"
	"nimbus/internal/quota"
	"nimbus/internal/store"
)

// retype is os-retype {"new_type": name or id, "migration_policy":
// "never"|"on-demand"} (cinder/volume/api.py API.retype): every type is on
// the one file back end today, so no data moves and the type changes in
// the transaction, taking the QoS of the new type with it and moving the
// volume from one type's quota to the other's. 202.
func (s *Service) retype(r *http.Request, raw json.RawMessage) (*api.Response, error) {
	ctx := r.Context()
	c := caller(r)
	b, err := actionBody("os-retype", raw)
	if err != nil {
		return nil, err
	}
	if err := api.UnknownFields(b, "new_type", "migration_policy"); err != nil {
		return nil, err
	}
	newType, err := b.optString("new_type", 0)
	if err != nil {
		return nil, err
	}
	if newType == nil {
		return nil, api.BadRequest("Invalid input for field/attribute os-retype. 'new_type' is a required property")
	}
	if p, err := b.optString("migration_policy", 0); err != nil {
		return nil, err
	} else if p != nil && *p != "never" && *p != "on-demand" {
		return nil, api.BadRequest("Invalid input for field/attribute migration_policy. Value: %s. '%s' is not one of ['on-demand', 'never']", *p, *p)
	}
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		v, err := ownedVol(ctx, tx, c, r.PathValue("id"))
		if err != nil {
			return err
		}
		if v.Status != StatusAvailable && v.Status != "in-use" {
			return invalidVolume("Unable to update type due to incorrect status: %s on volume: %s. Volume status must be available or in-use.",
				v.Status, v.ID)
		}
		t, err := getType(ctx, tx, c, *newType, true)
		if err != nil {
			return err
		}
		if t.ID == v.TypeID {
			return invalidInput("New volume_type same as original: %s.", *newType)
		}
		if v.Status == "in-use" {
			// An attached volume's throttle is set when it is attached.
			var old *string
			if err := tx.QueryRow(ctx, "SELECT qos_specs_id FROM volume_types WHERE id = ?", v.TypeID).Scan(&old); err != nil {
				return err
			}
			if !sameRef(old, t.QoSSpecsID) {
				return invalidInput("Retype cannot change front-end qos specs for in-use volume: %s.", v.ID)
			}
		}
		if err := s.reserveType(ctx, tx, v.ProjectID, t, 1, max(v.Size, v.NewSize)); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, "UPDATE volumes SET volume_type_id = ?, updated_at = ? WHERE id = ?", t.ID, store.FormatTime(s.now()), v.ID)
		return err
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(http.StatusAccepted), nil
}

func sameRef(a, b *string) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }

// reserveType checks, in tx, that project may add volumes volumes and gb
// gigabytes of type t: the per-type quotas volumes_<type> and
// gigabytes_<type> (cinder/quota_utils.py get_volume_type_reservation),
// under the project's quota lock.
func (s *Service) reserveType(ctx context.Context, tx *store.Tx, project string, t *typeRow, volumes, gb int64) error {
	if err := quota.Lock(ctx, tx, "volume_quota_locks", project); err != nil {
		return err
	}
	lim, err := quotaOf(ctx, tx, project)
	if err != nil {
		return err
	}
	var usedVols, usedGB int64
	if err := tx.QueryRow(ctx, `SELECT COUNT(*), COALESCE(SUM(CASE WHEN new_size > size THEN new_size ELSE size END), 0)
		FROM volumes WHERE project_id = ? AND volume_type_id = ?`, project, t.ID).Scan(&usedVols, &usedGB); err != nil {
		return err
	}
	if l := lim["volumes_"+t.Name]; l >= 0 && usedVols+volumes > l {
		// cinder/exception.py VolumeLimitExceeded
		return api.OverLimit("Maximum number of volumes allowed (%d) exceeded for quota 'volumes_%s'.", l, t.Name)
	}
	if l := lim["gigabytes_"+t.Name]; l >= 0 && usedGB+gb > l {
		// cinder/exception.py VolumeSizeExceedsAvailableQuota
		return api.OverLimit("Requested volume or snapshot exceeds allowed gigabytes_%s quota. Requested %dG, quota is %dG and %dG has been consumed.",
			t.Name, gb, l, usedGB)
	}
	return nil
}

// ---- Read-only flag ----

// visibleAdminMetadata are the admin metadata keys shown to everyone in a
// volume's metadata (cinder/api/api_utils.py _visible_admin_metadata_keys).
var visibleAdminMetadata = []string{"readonly", "attached_mode"}

// visibleMetadata is a volume's metadata as Cinder shows it: the owner's,
// with the visible admin metadata over it (add_visible_admin_metadata).
func visibleMetadata(v *volRow) map[string]string {
	out, copied := v.Metadata, false
	for _, k := range visibleAdminMetadata {
		val, ok := v.AdminMetadata[k]
		if !ok {
			continue
		}
		if !copied {
			out, copied = maps.Clone(v.Metadata), true
			if out == nil {
				out = map[string]string{}
			}
		}
		out[k] = val
	}
	return out
}

// updateReadonly is os-update_readonly_flag {"readonly": bool}: kept in
// the volume's admin metadata as "True" or "False"
// (cinder/volume/api.py update_readonly_flag), for attach to honour. 202.
func (s *Service) updateReadonly(r *http.Request, raw json.RawMessage) (*api.Response, error) {
	ctx := r.Context()
	b, err := actionBody("os-update_readonly_flag", raw)
	if err != nil {
		return nil, err
	}
	if err := api.UnknownFields(b, "readonly"); err != nil {
		return nil, err
	}
	ro, ok, err := b.boolean("readonly")
	if err != nil || !ok {
		return nil, api.BadRequest("Must specify readonly in request.")
	}
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		v, err := ownedVol(ctx, tx, caller(r), r.PathValue("id"))
		if err != nil {
			return err
		}
		if v.Status != StatusAvailable {
			return invalidVolume("Volume %s status must be available to update readonly flag, but current status is: %s.", v.ID, v.Status)
		}
		v.AdminMetadata["readonly"] = map[bool]string{true: "True", false: "False"}[ro]
		_, err = tx.Exec(ctx, "UPDATE volumes SET admin_metadata = ?, updated_at = ? WHERE id = ?",
			store.JSON(v.AdminMetadata), store.FormatTime(s.now()), v.ID)
		return err
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(http.StatusAccepted), nil
}

// ReadOnly reports whether volume id is to be attached read-only; an
// unknown volume is store.ErrNotFound.
func (s *Service) ReadOnly(ctx context.Context, id string) (bool, error) {
	v, err := getVol(ctx, s.db, id)
	if err != nil {
		return false, err
	}
	return v.AdminMetadata["readonly"] == "True", nil
}
