package identity

import (
	"errors"
	"net/http"
	"strings"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// Keystone's project handlers (keystone/api/projects.py).

func (s *Service) listProjects(r *http.Request) (*api.Response, error) {
	where, args := filters(r.URL.Query(), "name", "domain_id", "enabled")
	ps, err := listProjects(r.Context(), s.db, where, args...)
	if err != nil {
		return nil, err
	}
	out := make([]map[string]any, 0, len(ps))
	for i := range ps {
		out = append(out, projectBody(r, &ps[i]))
	}
	return api.JSON(http.StatusOK, map[string]any{"projects": out, "links": collectionLinks(r)}), nil
}

func (s *Service) findProject(r *http.Request, q store.Querier, id string) (*Project, error) {
	p, err := GetProject(r.Context(), q, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, api.NotFound("Could not find project: %s.", id)
	}
	return p, err
}

// getProject lets an admin read any project and others the projects they
// hold a role on.
func (s *Service) getProject(r *http.Request) (*api.Response, error) {
	id := r.PathValue("id")
	if c := api.CallerFrom(r.Context()); !c.IsAdmin() && c.ProjectID != id {
		roles, err := rolesOn(r.Context(), s.db, c.UserID, id)
		if err != nil {
			return nil, err
		}
		if len(roles) == 0 {
			return nil, forbidden("identity:get_project")
		}
	}
	p, err := s.findProject(r, s.db, id)
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, map[string]any{"project": projectBody(r, p)}), nil
}

type projectRequest struct {
	Name        *string   `json:"name"`
	DomainID    *string   `json:"domain_id"`
	ParentID    *string   `json:"parent_id"`
	Description *string   `json:"description"`
	Enabled     *bool     `json:"enabled"`
	IsDomain    *bool     `json:"is_domain"`
	Tags        *[]string `json:"tags"`
}

// checkTags follows Keystone's project tag schema: at most 80 tags of 1-255
// characters without '/' or ','.
func checkTags(tags *[]string) error {
	if tags == nil {
		return nil
	}
	if len(*tags) > 80 {
		return api.BadRequest("Invalid input for field 'tags': too many tags (maximum 80)")
	}
	for _, t := range *tags {
		if t == "" || len(t) > 255 || strings.ContainsAny(t, "/,") {
			return api.BadRequest("Invalid input for field 'tags': '%s' is not a valid tag", t)
		}
	}
	return nil
}

func (s *Service) createProject(r *http.Request) (*api.Response, error) {
	var req projectRequest
	if err := decodeEntity(r, "project", &req); err != nil {
		return nil, err
	}
	if err := checkName(req.Name, 64); err != nil {
		return nil, err
	}
	if err := checkTags(req.Tags); err != nil {
		return nil, err
	}
	if req.IsDomain != nil && *req.IsDomain {
		return nil, api.BadRequest("Projects acting as domains are not supported.")
	}
	ctx := r.Context()
	p := &Project{ID: NewID(), Name: *req.Name, DomainID: callerDomain(ctx), Enabled: true, CreatedAt: s.now()}
	setIf(&p.DomainID, req.DomainID)
	if req.ParentID != nil && *req.ParentID != "" && *req.ParentID != p.DomainID {
		// Nimbus projects are flat: the only parent is the domain itself.
		if req.DomainID == nil {
			if _, err := getDomain(ctx, s.db, "id = ?", *req.ParentID); err == nil {
				p.DomainID = *req.ParentID
			} else {
				return nil, api.BadRequest("Nested projects are not supported; parent_id must be the domain.")
			}
		} else {
			return nil, api.BadRequest("Nested projects are not supported; parent_id must be the domain.")
		}
	}
	setIf(&p.Description, req.Description)
	setIf(&p.Enabled, req.Enabled)
	setIf(&p.Tags, req.Tags)
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		// keystone/api/projects.py turns DomainNotFound into a 400.
		if err := needDomain(ctx, tx, p.DomainID, api.BadRequest); err != nil {
			return err
		}
		tx.AfterCommit(s.cache.invalidate)
		if err := insertProject(ctx, tx, p); err != nil || s.projectHook == nil {
			return err
		}
		return s.projectHook.ProjectCreated(ctx, tx, p.ID)
	})
	return saved(r, err, http.StatusCreated, "project", p, projectBody)
}

func (s *Service) updateProject(r *http.Request) (*api.Response, error) {
	id := r.PathValue("id")
	var req projectRequest
	if err := decodeEntity(r, "project", &req); err != nil {
		return nil, err
	}
	if req.Name != nil {
		if err := checkName(req.Name, 64); err != nil {
			return nil, err
		}
	}
	if err := checkTags(req.Tags); err != nil {
		return nil, err
	}
	ctx := r.Context()
	var p *Project
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		var err error
		if p, err = s.findProject(r, tx, id); err != nil {
			return err
		}
		// keystone/resource/core.py update_project: domain_id is immutable.
		if req.DomainID != nil && *req.DomainID != p.DomainID {
			return api.BadRequest("Cannot change Domain ID")
		}
		setIf(&p.Name, req.Name)
		setIf(&p.Description, req.Description)
		setIf(&p.Enabled, req.Enabled)
		setIf(&p.Tags, req.Tags)
		if err := updateProject(ctx, tx, p); err != nil {
			return err
		}
		if !p.Enabled {
			if _, err := tx.Exec(ctx, "DELETE FROM tokens WHERE project_id = ?", p.ID); err != nil {
				return err
			}
		}
		tx.AfterCommit(s.cache.invalidate)
		return nil
	})
	return saved(r, err, http.StatusOK, "project", p, projectBody)
}

// deleteProject removes a project with its role assignments and the tokens
// scoped to it.
func (s *Service) deleteProject(r *http.Request) (*api.Response, error) {
	id := r.PathValue("id")
	ctx := r.Context()
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		if _, err := s.findProject(r, tx, id); err != nil {
			return err
		}
		if err := execEach(ctx, tx, id,
			"DELETE FROM tokens WHERE project_id = ?",
			"DELETE FROM role_assignments WHERE project_id = ?",
			"DELETE FROM projects WHERE id = ?",
		); err != nil {
			return err
		}
		tx.AfterCommit(s.cache.invalidate)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(http.StatusNoContent), nil
}
