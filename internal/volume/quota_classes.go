package volume

import (
	"net/http"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// Cinder's quota classes (cinder/api/contrib/quota_classes.py, admin):
// the "default" class's limits are every project's defaults, under what
// an admin set for the project itself. Nimbus has that one class.

// quotaClass checks the class of a quota-class path.
func quotaClass(r *http.Request) error {
	if c := r.PathValue("class"); c != "default" {
		return api.NotFound("Quota class %s could not be found.", c)
	}
	return nil
}

// showQuotaClass is GET /os-quota-class-sets/default.
func (s *Service) showQuotaClass(r *http.Request) (*api.Response, error) {
	if err := quotaClass(r); err != nil {
		return nil, err
	}
	lim, err := quotaOf(r.Context(), s.db, defaultClass)
	if err != nil {
		return nil, err
	}
	v, err := quotaSetView(r.Context(), s.db, defaultClass, lim, false)
	if err != nil {
		return nil, err
	}
	v["id"] = "default"
	return api.JSON(http.StatusOK, map[string]any{"quota_class_set": v}), nil
}

// updateQuotaClass is PUT /os-quota-class-sets/default: each value an
// integer of at least -1; usage is not checked (a project already over a
// lowered default keeps what it has and makes nothing more).
func (s *Service) updateQuotaClass(r *http.Request) (*api.Response, error) {
	if err := quotaClass(r); err != nil {
		return nil, err
	}
	b, err := decodeBody(r, "quota_class_set")
	if err != nil {
		return nil, err
	}
	ctx := r.Context()
	var out map[string]any
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		lim, err := quotaOf(ctx, tx, defaultClass)
		if err != nil {
			return err
		}
		set, err := quotaValues(b, lim)
		if err != nil {
			return err
		}
		out, err = saveQuotas(ctx, tx, defaultClass, lim, set)
		return err
	})
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, map[string]any{"quota_class_set": out}), nil
}
