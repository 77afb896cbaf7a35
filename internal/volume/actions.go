package volume

import (
	"encoding/json"
	"net/http"
	"strings"

	"nimbus/internal/api"
	"nimbus/internal/metering"
	"nimbus/internal/store"
)

// action is POST /volumes/{id}/action with a one-key body
// (cinder/api/contrib/volume_actions.py, admin_actions.py).
func (s *Service) action(r *http.Request) (*api.Response, error) {
	var outer map[string]json.RawMessage
	if err := api.DecodeJSON(r, &outer); err != nil {
		return nil, err
	}
	if len(outer) != 1 {
		return nil, api.BadRequest("Malformed request body")
	}
	for name, raw := range outer {
		switch name {
		case "os-extend":
			return s.extend(r, raw)
		case "os-reset_status":
			return s.resetStatus(r, raw)
		case "os-set_bootable":
			return s.setBootable(r, raw)
		case "os-update_readonly_flag":
			return s.updateReadonly(r, raw) // retype.go
		case "os-retype":
			return s.retype(r, raw)
		case "os-volume_upload_image":
			return s.uploadImage(r, raw) // upload.go
		// Attach and detach (attachments.go).
		case "os-reserve":
			return s.reserveVolume(r)
		case "os-unreserve":
			return s.unreserveVolume(r)
		case "os-begin_detaching":
			return s.beginDetaching(r)
		case "os-roll_detaching":
			return s.rollDetaching(r)
		case "os-attach":
			return s.attachVolume(r, raw)
		case "os-detach":
			return s.detachVolume(r, raw)
		case "os-initialize_connection":
			return s.initializeConnection(r, raw)
		case "os-terminate_connection":
			return s.terminateConnection(r, raw)
		case "os-force_detach":
			return s.forceDetach(r, raw)
		case "os-force_delete":
			return s.forceDelete(r) // force_delete.go
		// Image metadata (image_metadata.go).
		case "os-set_image_metadata":
			return s.setImageMetadata(r, raw)
		case "os-unset_image_metadata":
			return s.unsetImageMetadata(r, raw)
		case "os-show_image_metadata":
			return s.showImageMetadata(r)
		}
		return nil, api.BadRequest("There is no such action: %s", name)
	}
	return nil, api.BadRequest("Malformed request body")
}

func actionBody(name string, raw json.RawMessage) (body, error) {
	var b body
	if err := json.Unmarshal(raw, &b); err != nil || b == nil {
		return nil, api.BadRequest("Invalid input for field/attribute %s. Value: %s. %s is not of type 'object'", name, raw, raw)
	}
	return b, nil
}

// extend is os-extend {"new_size": N}: the volume must be available and N
// larger than its size; the gigabytes quota is taken at once, and the new
// size is charged once the file has grown (worker.go). 202.
func (s *Service) extend(r *http.Request, raw json.RawMessage) (*api.Response, error) {
	ctx := r.Context()
	c := caller(r)
	b, err := actionBody("os-extend", raw)
	if err != nil {
		return nil, err
	}
	if err := api.UnknownFields(b, "new_size"); err != nil {
		return nil, err
	}
	newSize, ok, err := b.size("new_size")
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, api.BadRequest("Invalid input for field/attribute os-extend. 'new_size' is a required property")
	}
	// A larger volume costs more: its account must be in funds.
	pre, err := ownedVol(ctx, s.db, c, r.PathValue("id"))
	if err != nil {
		return nil, err
	}
	if s.gate != nil && newSize > pre.Size {
		// What is charged is the size past a flavor's disk (meter).
		from, to := metering.Spec{SizeGB: max(pre.Size-flavorDiskGB(pre), 0)}, metering.Spec{SizeGB: max(newSize-flavorDiskGB(pre), 0)}
		if err := s.gate.CanChange(ctx, pre.ProjectID, metering.KindVolume, from, to); err != nil {
			return nil, err
		}
	}
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		v, err := ownedVol(ctx, tx, c, r.PathValue("id"))
		if err != nil {
			return err
		}
		// cinder/volume/api.py API._extend; an in-use volume from 3.42,
		// when there is compute to tell its server.
		inUse := v.Status == StatusInUse && minor(r) >= extendInUseMinor
		if inUse && s.extender == nil {
			return invalidVolume("Volume %s is in-use and this cloud cannot extend attached volumes.", v.ID)
		}
		if v.Status != StatusAvailable && !inUse {
			if minor(r) >= extendInUseMinor {
				return invalidVolume("Volume %s status must be 'available' or 'in-use' to extend, but current status is: %s.", v.ID, v.Status)
			}
			return invalidVolume("Volume %s status must be 'available' to extend, but current status is: %s.", v.ID, v.Status)
		}
		if newSize <= v.Size {
			return invalidInput("New size for extend must be greater than current size. (current: %d, extended: %d).", v.Size, newSize)
		}
		if err := s.reserve(ctx, tx, v.ProjectID, 0, newSize-v.Size, newSize); err != nil {
			return err
		}
		v.NewSize = newSize
		if _, err := s.setStatus(ctx, tx, v, StatusExtending, ""); err != nil {
			return err
		}
		tx.AfterCommit(func() { s.kick(v.ID) })
		return nil
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(http.StatusAccepted), nil
}

// resetStatus is the admin's os-reset_status {"status": ...}: only the
// record changes (and with it whether the volume is charged). 202.
func (s *Service) resetStatus(r *http.Request, raw json.RawMessage) (*api.Response, error) {
	ctx := r.Context()
	c := caller(r)
	if !c.IsAdmin() {
		return nil, api.PolicyForbidden("volume_extension:volume_admin_actions:reset_status")
	}
	b, err := actionBody("os-reset_status", raw)
	if err != nil {
		return nil, err
	}
	if err := api.UnknownFields(b, "status", "attach_status", "migration_status"); err != nil {
		return nil, err
	}
	status, err := b.optString("status", 255)
	if err != nil {
		return nil, err
	}
	if attach, err := b.optString("attach_status", 255); err != nil {
		return nil, err
	} else if attach != nil && *attach != "detached" && *attach != "attached" {
		return nil, api.BadRequest("Must specify a valid attach status")
	}
	if status == nil {
		if _, ok := b["attach_status"]; ok {
			return api.Empty(http.StatusAccepted), nil
		}
		return nil, api.BadRequest("Must specify 'status', 'attach_status' or 'migration_status' for update.")
	}
	st := strings.ToLower(*status)
	if !resettable[st] {
		return nil, api.BadRequest("Must specify a valid status")
	}
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		v, err := ownedVol(ctx, tx, c, r.PathValue("id"))
		if err != nil {
			return err
		}
		if v.Status == StatusExtending && st != StatusExtending {
			v.NewSize = 0 // the extend is abandoned
		}
		_, err = s.setStatus(ctx, tx, v, st, "")
		return err
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(http.StatusAccepted), nil
}

// setBootable is os-set_bootable {"bootable": bool}: 200, no body.
func (s *Service) setBootable(r *http.Request, raw json.RawMessage) (*api.Response, error) {
	ctx := r.Context()
	b, err := actionBody("os-set_bootable", raw)
	if err != nil {
		return nil, err
	}
	boot, ok, err := b.boolean("bootable")
	if err != nil || !ok {
		return nil, api.BadRequest("Must specify bootable in request.")
	}
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		v, err := ownedVol(ctx, tx, caller(r), r.PathValue("id"))
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, "UPDATE volumes SET bootable = ?, updated_at = ? WHERE id = ?", b2i(boot), store.FormatTime(s.now()), v.ID)
		return err
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(http.StatusOK), nil
}
