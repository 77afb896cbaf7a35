package volume

import (
	"encoding/json"
	"net/http"
	"strings"

	"nimbus/internal/api"
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
	if err := s.checkSpend(ctx, pre.ProjectID); err != nil {
		return nil, err
	}
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		v, err := ownedVol(ctx, tx, c, r.PathValue("id"))
		if err != nil {
			return err
		}
		if v.Status != StatusAvailable {
			// cinder/volume/api.py API._extend
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

// ---- Metadata (cinder/api/v2/volume_metadata.py) ----

func (s *Service) listMetadata(r *http.Request) (*api.Response, error) {
	v, err := ownedVol(r.Context(), s.db, caller(r), r.PathValue("id"))
	if err != nil {
		return nil, err
	}
	return api.JSON(200, map[string]any{"metadata": v.Metadata}), nil
}

// setMetadata is POST (merge) and PUT (replace) of {"metadata": {...}},
// answering the whole set.
func (s *Service) setMetadata(replace bool) api.HandlerFunc {
	return func(r *http.Request) (*api.Response, error) {
		var outer map[string]json.RawMessage
		if err := api.DecodeJSON(r, &outer); err != nil {
			return nil, err
		}
		raw, ok := outer["metadata"]
		if !ok {
			return nil, api.BadRequest("Malformed request body")
		}
		meta, err := parseMetadata("metadata", raw)
		if err != nil {
			return nil, err
		}
		return s.changeMetadata(r, func(m map[string]string) (map[string]string, error) {
			if replace {
				return meta, nil
			}
			for k, v := range meta {
				m[k] = v
			}
			return m, nil
		}, func(m map[string]string) any { return map[string]any{"metadata": m} })
	}
}

func (s *Service) changeMetadata(r *http.Request, change func(map[string]string) (map[string]string, error), answer func(map[string]string) any) (*api.Response, error) {
	ctx := r.Context()
	var out map[string]string
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		v, err := ownedVol(ctx, tx, caller(r), r.PathValue("id"))
		if err != nil {
			return err
		}
		if v.Status == StatusDeleting {
			return invalidVolume("Volume %s is being deleted.", v.ID)
		}
		before := len(v.Metadata)
		if out, err = change(v.Metadata); err != nil {
			return err
		}
		// A merge may pass the bound; a volume already past it (from
		// before there was one) may still shrink.
		if len(out) > maxMetadata && len(out) > before {
			return errTooMuchMetadata()
		}
		_, err = tx.Exec(ctx, "UPDATE volumes SET metadata = ?, updated_at = ? WHERE id = ?", store.JSON(out), store.FormatTime(s.now()), v.ID)
		return err
	})
	if err != nil {
		return nil, err
	}
	return api.JSON(200, answer(out)), nil
}

func (s *Service) showMetadataItem(r *http.Request) (*api.Response, error) {
	v, err := ownedVol(r.Context(), s.db, caller(r), r.PathValue("id"))
	if err != nil {
		return nil, err
	}
	key := r.PathValue("key")
	val, ok := v.Metadata[key]
	if !ok {
		return nil, api.NotFound("Metadata item was not found")
	}
	return api.JSON(200, map[string]any{"meta": map[string]string{key: val}}), nil
}

// putMetadataItem is PUT /metadata/{key} with {"meta": {key: value}}.
func (s *Service) putMetadataItem(r *http.Request) (*api.Response, error) {
	var outer map[string]json.RawMessage
	if err := api.DecodeJSON(r, &outer); err != nil {
		return nil, err
	}
	raw, ok := outer["meta"]
	if !ok {
		return nil, api.BadRequest("Malformed request body")
	}
	meta, err := parseMetadata("meta", raw)
	if err != nil {
		return nil, err
	}
	key := r.PathValue("key")
	if _, ok := meta[key]; !ok {
		return nil, api.BadRequest("Request body and URI mismatch")
	}
	if len(meta) > 1 {
		return nil, api.BadRequest("Request body contains too many items")
	}
	return s.changeMetadata(r, func(m map[string]string) (map[string]string, error) {
		m[key] = meta[key]
		return m, nil
	}, func(map[string]string) any { return map[string]any{"meta": meta} })
}

func (s *Service) deleteMetadataItem(r *http.Request) (*api.Response, error) {
	key := r.PathValue("key")
	if _, err := s.changeMetadata(r, func(m map[string]string) (map[string]string, error) {
		if _, ok := m[key]; !ok {
			return nil, api.NotFound("Metadata item was not found")
		}
		delete(m, key)
		return m, nil
	}, func(m map[string]string) any { return nil }); err != nil {
		return nil, err
	}
	return api.Empty(http.StatusOK), nil
}
