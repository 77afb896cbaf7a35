package volume

import (
	"context"
	"encoding/json"
	"net/http"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// Private volume types' access lists (cinder/api/contrib/
// volume_type_access.py): an admin names the projects that may see and
// use a private type; getType and listTypes let those projects see it.

// hasTypeAccess reports whether project may use private type typeID.
func hasTypeAccess(ctx context.Context, q store.Querier, typeID, project string) (bool, error) {
	var n int
	err := q.QueryRow(ctx, "SELECT COUNT(*) FROM volume_type_projects WHERE type_id = ? AND project_id = ?", typeID, project).Scan(&n)
	return n > 0, err
}

// listTypeAccess is GET /types/{id}/os-volume-type-access (admin).
func (s *Service) listTypeAccess(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	t, err := getType(ctx, s.db, caller(r), r.PathValue("id"), false)
	if err != nil {
		return nil, err
	}
	if t.IsPublic {
		return nil, api.NotFound("Access list not available for public volume types.")
	}
	rows, err := s.db.Query(ctx, "SELECT project_id FROM volume_type_projects WHERE type_id = ? ORDER BY created_at, project_id", t.ID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []map[string]string{}
	for rows.Next() {
		var p string
		if err := rows.Scan(&p); err != nil {
			return nil, err
		}
		out = append(out, map[string]string{"volume_type_id": t.ID, "project_id": p})
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, map[string]any{"volume_type_access": out}), nil
}

// typeAction is POST /types/{id}/action: addProjectAccess and
// removeProjectAccess (admin), 202 as Cinder answers them.
func (s *Service) typeAction(r *http.Request) (*api.Response, error) {
	var outer map[string]json.RawMessage
	if err := api.DecodeJSON(r, &outer); err != nil {
		return nil, err
	}
	if len(outer) != 1 {
		return nil, api.BadRequest("Malformed request body")
	}
	name := firstKey(outer)
	if name != "addProjectAccess" && name != "removeProjectAccess" {
		return nil, api.BadRequest("There is no such action: %s", name)
	}
	var arg struct {
		Project any `json:"project"`
	}
	if err := json.Unmarshal(outer[name], &arg); err != nil {
		return nil, api.BadRequest("Malformed request body")
	}
	project, _ := arg.Project.(string)
	if project == "" {
		return nil, api.BadRequest("Missing required element 'project' in request body.")
	}
	ctx := r.Context()
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		t, err := getType(ctx, tx, caller(r), r.PathValue("id"), false)
		if err != nil {
			return err
		}
		if t.IsPublic {
			return invalidVolumeType("Type access modification is not applicable to public volume type.")
		}
		has, err := hasTypeAccess(ctx, tx, t.ID, project)
		if err != nil {
			return err
		}
		switch {
		case name == "addProjectAccess" && has:
			return api.Errorf(http.StatusConflict, "Volume type access for %s / %s combination already exists.", t.ID, project)
		case name == "addProjectAccess":
			_, err = tx.Exec(ctx, "INSERT INTO volume_type_projects (type_id, project_id, created_at) VALUES (?, ?, ?)",
				t.ID, project, store.FormatTime(s.now()))
		case !has:
			return api.NotFound("Volume type access not found for %s / %s combination.", t.ID, project)
		default:
			_, err = tx.Exec(ctx, "DELETE FROM volume_type_projects WHERE type_id = ? AND project_id = ?", t.ID, project)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(http.StatusAccepted), nil
}

// invalidVolumeType is Cinder's InvalidVolumeType (400).
func invalidVolumeType(format string, args ...any) *api.Error {
	return api.BadRequest("Invalid volume type: "+format, args...)
}
