package identity

import (
	"context"
	"errors"
	"net/http"
	"strings"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// Keystone's role and grant handlers (keystone/api/roles.py,
// keystone/api/projects.py ProjectUserGrantResource,
// keystone/api/role_assignments.py).

func roleBody(r *http.Request, role *Role) map[string]any {
	return map[string]any{
		"id": role.ID, "name": role.Name, "domain_id": nil, "description": role.Description,
		"options": map[string]any{}, "links": selfLink(r, "/v3/roles/"+role.ID),
	}
}

func findRole(ctx context.Context, q store.Querier, id string) (*Role, error) {
	role, err := getRole(ctx, q, "id = ?", id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, api.NotFound("Could not find role: %s.", id)
	}
	return role, err
}

func (s *Service) listRoles(r *http.Request) (*api.Response, error) {
	roles, err := listRoles(r.Context(), s.db)
	if err != nil {
		return nil, err
	}
	q := r.URL.Query()
	out := []map[string]any{}
	for i := range roles {
		if v, ok := q["name"]; ok && roles[i].Name != v[0] {
			continue
		}
		// Nimbus roles are all global, so a domain_id filter matches none.
		if v, ok := q["domain_id"]; ok && v[0] != "" {
			continue
		}
		out = append(out, roleBody(r, &roles[i]))
	}
	return api.JSON(http.StatusOK, map[string]any{"roles": out, "links": collectionLinks(r)}), nil
}

func (s *Service) getRole(r *http.Request) (*api.Response, error) {
	role, err := findRole(r.Context(), s.db, r.PathValue("id"))
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, map[string]any{"role": roleBody(r, role)}), nil
}

type roleRequest struct {
	Name        *string `json:"name"`
	Description *string `json:"description"`
	DomainID    *string `json:"domain_id"`
}

func (s *Service) createRole(r *http.Request) (*api.Response, error) {
	var req roleRequest
	if err := decodeEntity(r, "role", &req); err != nil {
		return nil, err
	}
	if err := checkName(req.Name, 255); err != nil {
		return nil, err
	}
	if req.DomainID != nil && *req.DomainID != "" {
		return nil, api.BadRequest("Domain-specific roles are not supported.")
	}
	role := &Role{ID: NewID(), Name: *req.Name}
	setIf(&role.Description, req.Description)
	ctx := r.Context()
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		tx.AfterCommit(s.cache.invalidate)
		_, err := tx.Exec(ctx, "INSERT INTO roles (id, name, description) VALUES (?, ?, ?)", role.ID, role.Name, role.Description)
		return err
	})
	return saved(r, err, http.StatusCreated, "role", role, roleBody)
}

func (s *Service) updateRole(r *http.Request) (*api.Response, error) {
	var req roleRequest
	if err := decodeEntity(r, "role", &req); err != nil {
		return nil, err
	}
	if req.Name != nil {
		if err := checkName(req.Name, 255); err != nil {
			return nil, err
		}
	}
	ctx := r.Context()
	var role *Role
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		var err error
		if role, err = findRole(ctx, tx, r.PathValue("id")); err != nil {
			return err
		}
		setIf(&role.Name, req.Name)
		setIf(&role.Description, req.Description)
		if _, err := tx.Exec(ctx, "UPDATE roles SET name = ?, description = ? WHERE id = ?",
			role.Name, role.Description, role.ID); err != nil {
			return err
		}
		// Tokens carry role names; renaming must reach cached callers.
		tx.AfterCommit(s.cache.invalidate)
		return nil
	})
	return saved(r, err, http.StatusOK, "role", role, roleBody)
}

func (s *Service) deleteRole(r *http.Request) (*api.Response, error) {
	id := r.PathValue("id")
	ctx := r.Context()
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		if _, err := findRole(ctx, tx, id); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "DELETE FROM role_assignments WHERE role_id = ?", id); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "DELETE FROM roles WHERE id = ?", id); err != nil {
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

// --- grants on projects

// grantTarget checks that the project, user and (when roleID is not "")
// role of a grant URL exist, answering Keystone's 404 for the first that
// does not.
func (s *Service) grantTarget(ctx context.Context, q store.Querier, projectID, userID, roleID string) error {
	if _, err := GetProject(ctx, q, projectID); errors.Is(err, store.ErrNotFound) {
		return api.NotFound("Could not find project: %s.", projectID)
	} else if err != nil {
		return err
	}
	if _, err := findUser(ctx, q, userID); err != nil {
		return err
	}
	if roleID != "" {
		if _, err := findRole(ctx, q, roleID); err != nil {
			return err
		}
	}
	return nil
}

func (s *Service) listGrants(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	p, u := r.PathValue("p"), r.PathValue("u")
	if err := s.grantTarget(ctx, s.db, p, u, ""); err != nil {
		return nil, err
	}
	roles, err := rolesOn(ctx, s.db, u, p)
	if err != nil {
		return nil, err
	}
	out := make([]map[string]any, 0, len(roles))
	for i := range roles {
		out = append(out, roleBody(r, &roles[i]))
	}
	return api.JSON(http.StatusOK, map[string]any{"roles": out, "links": collectionLinks(r)}), nil
}

func grantNotFound(roleID, userID, targetID string) error {
	return api.NotFound("Could not find role assignment with role: %s, user or group: %s, project, domain, or system: %s.",
		roleID, userID, targetID)
}

func (s *Service) checkGrant(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	p, u, role := r.PathValue("p"), r.PathValue("u"), r.PathValue("r")
	if err := s.grantTarget(ctx, s.db, p, u, role); err != nil {
		return nil, err
	}
	as, err := listAssignments(ctx, s.db, "user_id = ? AND project_id = ? AND role_id = ?", u, p, role)
	if err != nil {
		return nil, err
	}
	if len(as) == 0 {
		return nil, grantNotFound(role, u, p)
	}
	return api.Empty(http.StatusNoContent), nil
}

func (s *Service) createGrant(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	p, u, role := r.PathValue("p"), r.PathValue("u"), r.PathValue("r")
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		if err := s.grantTarget(ctx, tx, p, u, role); err != nil {
			return err
		}
		if err := assignRole(ctx, tx, u, p, role); err != nil {
			return err
		}
		tx.AfterCommit(s.cache.invalidate)
		return nil
	})
	// A concurrent PUT of the same grant won the insert: the grant exists,
	// which is all an idempotent PUT promises.
	if err != nil && !errors.Is(err, store.ErrConflict) {
		return nil, err
	}
	return api.Empty(http.StatusNoContent), nil
}

func (s *Service) revokeGrant(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	p, u, role := r.PathValue("p"), r.PathValue("u"), r.PathValue("r")
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		if err := s.grantTarget(ctx, tx, p, u, role); err != nil {
			return err
		}
		res, err := tx.Exec(ctx, "DELETE FROM role_assignments WHERE user_id = ? AND project_id = ? AND role_id = ?", u, p, role)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return grantNotFound(role, u, p)
		}
		tx.AfterCommit(s.cache.invalidate)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(http.StatusNoContent), nil
}

// --- grants on domains. Nimbus authorises by project roles only, so domain
// grants are accepted and not stored: PUT answers 204 (Tempest and
// operators' scripts make them), a check or revoke finds none.

func (s *Service) domainGrantTarget(r *http.Request) error {
	ctx := r.Context()
	if _, err := getDomain(ctx, s.db, "id = ?", r.PathValue("d")); errors.Is(err, store.ErrNotFound) {
		return api.NotFound("Could not find domain: %s.", r.PathValue("d"))
	} else if err != nil {
		return err
	}
	if _, err := findUser(ctx, s.db, r.PathValue("u")); err != nil {
		return err
	}
	if id := r.PathValue("r"); id != "" {
		if _, err := findRole(ctx, s.db, id); err != nil {
			return err
		}
	}
	return nil
}

func (s *Service) listDomainGrants(r *http.Request) (*api.Response, error) {
	if err := s.domainGrantTarget(r); err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, map[string]any{"roles": []any{}, "links": collectionLinks(r)}), nil
}

func (s *Service) domainGrant(r *http.Request) (*api.Response, error) {
	if err := s.domainGrantTarget(r); err != nil {
		return nil, err
	}
	if r.Method == http.MethodPut {
		return api.Empty(http.StatusNoContent), nil
	}
	return nil, grantNotFound(r.PathValue("r"), r.PathValue("u"), r.PathValue("d"))
}

// --- GET /v3/role_assignments

func (s *Service) listRoleAssignments(r *http.Request) (*api.Response, error) {
	ctx := r.Context()
	q := r.URL.Query()
	out := []map[string]any{}
	// Only user-on-project assignments exist: filters on groups, domains or
	// the system match nothing.
	if q.Has("group.id") || q.Has("scope.domain.id") || q.Has("scope.system") {
		return api.JSON(http.StatusOK, map[string]any{"role_assignments": out, "links": collectionLinks(r)}), nil
	}
	if q.Has("include_subtree") && !q.Has("scope.project.id") {
		return nil, api.BadRequest("scope.project.id must be specified if include_subtree is also specified")
	}
	var where []string
	var args []any
	for _, f := range []struct{ param, col string }{
		{"user.id", "user_id"}, {"scope.project.id", "project_id"}, {"role.id", "role_id"},
	} {
		if q.Has(f.param) {
			where = append(where, f.col+" = ?")
			args = append(args, q.Get(f.param))
		}
	}
	as, err := listAssignments(ctx, s.db, strings.Join(where, " AND "), args...)
	if err != nil {
		return nil, err
	}
	names := q.Has("include_names") && queryBool(q.Get("include_names"))
	var nm *nameCache
	if names {
		nm = &nameCache{s: s, ctx: ctx}
	}
	base := api.BaseURL(r)
	for _, a := range as {
		role := map[string]any{"id": a.RoleID}
		user := map[string]any{"id": a.UserID}
		project := map[string]any{"id": a.ProjectID}
		if names {
			if err := nm.fill(role, user, project, a); err != nil {
				return nil, err
			}
		}
		out = append(out, map[string]any{
			"role": role, "user": user, "scope": map[string]any{"project": project},
			"links": map[string]string{"assignment": base + "/v3/projects/" + a.ProjectID + "/users/" + a.UserID + "/roles/" + a.RoleID},
		})
	}
	return api.JSON(http.StatusOK, map[string]any{"role_assignments": out, "links": collectionLinks(r)}), nil
}

// nameCache resolves the names include_names asks for, once per id.
type nameCache struct {
	s       *Service
	ctx     context.Context
	roles   map[string]*Role
	users   map[string]*User
	project map[string]*Project
	domains map[string]*Domain
}

func (n *nameCache) domain(id string) (map[string]any, error) {
	if n.domains == nil {
		n.domains = map[string]*Domain{}
	}
	d, ok := n.domains[id]
	if !ok {
		var err error
		if d, err = getDomain(n.ctx, n.s.db, "id = ?", id); err != nil {
			return nil, err
		}
		n.domains[id] = d
	}
	return map[string]any{"id": d.ID, "name": d.Name}, nil
}

func (n *nameCache) fill(role, user, project map[string]any, a Assignment) error {
	if n.roles == nil {
		n.roles, n.users, n.project = map[string]*Role{}, map[string]*User{}, map[string]*Project{}
	}
	ro, ok := n.roles[a.RoleID]
	if !ok {
		var err error
		if ro, err = getRole(n.ctx, n.s.db, "id = ?", a.RoleID); err != nil {
			return err
		}
		n.roles[a.RoleID] = ro
	}
	role["name"] = ro.Name
	u, ok := n.users[a.UserID]
	if !ok {
		var err error
		if u, err = GetUser(n.ctx, n.s.db, a.UserID); err != nil {
			return err
		}
		n.users[a.UserID] = u
	}
	user["name"] = u.Name
	d, err := n.domain(u.DomainID)
	if err != nil {
		return err
	}
	user["domain"] = d
	p, ok := n.project[a.ProjectID]
	if !ok {
		if p, err = GetProject(n.ctx, n.s.db, a.ProjectID); err != nil {
			return err
		}
		n.project[a.ProjectID] = p
	}
	project["name"] = p.Name
	if project["domain"], err = n.domain(p.DomainID); err != nil {
		return err
	}
	return nil
}
