package identity

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"unicode/utf8"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// adminRoutes is the identity API for managing domains, projects, users,
// roles and role assignments, and for reading the catalog as resources.
// Policy is checked in the handlers rather than with api.Route.AdminOnly so
// that a 403 carries Keystone's own message (keystone/exception.py
// ForbiddenAction).
func (s *Service) adminRoutes() []api.Route {
	return []api.Route{
		{Pattern: "GET /v3/domains", Handler: s.admin("identity:list_domains", s.listDomains)},
		{Pattern: "POST /v3/domains", Handler: s.admin("identity:create_domain", s.createDomain)},
		{Pattern: "GET /v3/domains/{id}", Handler: s.getDomain},
		{Pattern: "PATCH /v3/domains/{id}", Handler: s.admin("identity:update_domain", s.updateDomain)},
		{Pattern: "DELETE /v3/domains/{id}", Handler: s.admin("identity:delete_domain", s.deleteDomain)},

		{Pattern: "GET /v3/projects", Handler: s.admin("identity:list_projects", s.listProjects)},
		{Pattern: "POST /v3/projects", Handler: s.admin("identity:create_project", s.createProject)},
		{Pattern: "GET /v3/projects/{id}", Handler: s.getProject},
		{Pattern: "PATCH /v3/projects/{id}", Handler: s.admin("identity:update_project", s.updateProject)},
		{Pattern: "DELETE /v3/projects/{id}", Handler: s.admin("identity:delete_project", s.deleteProject)},

		{Pattern: "GET /v3/users", Handler: s.admin("identity:list_users", s.listUsers)},
		{Pattern: "POST /v3/users", Handler: s.admin("identity:create_user", s.createUser)},
		{Pattern: "GET /v3/users/{id}", Handler: s.getUser},
		{Pattern: "PATCH /v3/users/{id}", Handler: s.admin("identity:update_user", s.updateUser)},
		{Pattern: "DELETE /v3/users/{id}", Handler: s.admin("identity:delete_user", s.deleteUser)},
		// Keystone needs no token here: the original password is the
		// credential, so a user whose password expired can still change it
		// (keystone/api/users.py UserChangePasswordResource, unenforced).
		{Pattern: "POST /v3/users/{id}/password", Handler: s.changePassword, Public: true},
		{Pattern: "GET /v3/users/{id}/projects", Handler: s.userProjects},

		{Pattern: "GET /v3/roles", Handler: s.admin("identity:list_roles", s.listRoles)},
		{Pattern: "POST /v3/roles", Handler: s.admin("identity:create_role", s.createRole)},
		{Pattern: "GET /v3/roles/{id}", Handler: s.admin("identity:get_role", s.getRole)},
		{Pattern: "PATCH /v3/roles/{id}", Handler: s.admin("identity:update_role", s.updateRole)},
		{Pattern: "DELETE /v3/roles/{id}", Handler: s.admin("identity:delete_role", s.deleteRole)},

		// GET also answers HEAD (net/http's ServeMux), as Keystone's
		// check_grant does for both.
		{Pattern: "GET /v3/projects/{p}/users/{u}/roles", Handler: s.admin("identity:list_grants", s.listGrants)},
		{Pattern: "GET /v3/projects/{p}/users/{u}/roles/{r}", Handler: s.admin("identity:check_grant", s.checkGrant)},
		{Pattern: "PUT /v3/projects/{p}/users/{u}/roles/{r}", Handler: s.admin("identity:create_grant", s.createGrant)},
		{Pattern: "DELETE /v3/projects/{p}/users/{u}/roles/{r}", Handler: s.admin("identity:revoke_grant", s.revokeGrant)},
		{Pattern: "GET /v3/domains/{d}/users/{u}/roles", Handler: s.admin("identity:list_grants", s.listDomainGrants)},
		{Pattern: "GET /v3/domains/{d}/users/{u}/roles/{r}", Handler: s.admin("identity:check_grant", s.domainGrant)},
		{Pattern: "PUT /v3/domains/{d}/users/{u}/roles/{r}", Handler: s.admin("identity:create_grant", s.domainGrant)},
		{Pattern: "DELETE /v3/domains/{d}/users/{u}/roles/{r}", Handler: s.admin("identity:revoke_grant", s.domainGrant)},
		{Pattern: "GET /v3/role_assignments", Handler: s.admin("identity:list_role_assignments", s.listRoleAssignments)},

		{Pattern: "GET /v3/services", Handler: s.admin("identity:list_services", s.listServices)},
		{Pattern: "GET /v3/services/{id}", Handler: s.admin("identity:get_service", s.getService)},
		{Pattern: "GET /v3/endpoints", Handler: s.admin("identity:list_endpoints", s.listEndpoints)},
		{Pattern: "GET /v3/endpoints/{id}", Handler: s.admin("identity:get_endpoint", s.getEndpoint)},
		{Pattern: "GET /v3/regions", Handler: s.listRegions},
		{Pattern: "GET /v3/regions/{id}", Handler: s.getRegion},
	}
}

// forbidden is Keystone's 403 for a policy refusal (ForbiddenAction).
func forbidden(action string) error {
	return api.Forbidden("You are not authorized to perform the requested action: %s.", action)
}

// admin wraps h so that only callers with the admin role reach it.
func (s *Service) admin(action string, h api.HandlerFunc) api.HandlerFunc {
	return func(r *http.Request) (*api.Response, error) {
		if !api.CallerFrom(r.Context()).IsAdmin() {
			return nil, forbidden(action)
		}
		return h(r)
	}
}

// collectionLinks is Keystone's collection "links": self carries the query
// string (keystone/server/flask/common.py wrap_collection).
func collectionLinks(r *http.Request) map[string]any {
	self := api.BaseURL(r) + r.URL.Path
	if r.URL.RawQuery != "" {
		self += "?" + r.URL.RawQuery
	}
	return map[string]any{"self": self, "previous": nil, "next": nil}
}

func selfLink(r *http.Request, path string) map[string]string {
	return map[string]string{"self": api.BaseURL(r) + path}
}

// decodeEntity reads a body of the form {"<key>": {...}} into v. Keystone's
// JSON schemas answer 400 when the wrapper key is missing or not an object.
func decodeEntity(r *http.Request, key string, v any) error {
	var outer map[string]json.RawMessage
	if err := api.DecodeJSON(r, &outer); err != nil {
		return err
	}
	raw := bytes.TrimSpace(outer[key])
	if len(raw) == 0 || string(raw) == "null" {
		return api.BadRequest("'%s' is a required property", key)
	}
	if raw[0] != '{' {
		return api.BadRequest("Invalid input for field '%s': %s is not of type 'object'", key, raw)
	}
	return api.Unmarshal(raw, v)
}

// checkName enforces Keystone's name schema: a non-blank string of at most
// max characters (keystone/common/validation/parameter_types.py).
func checkName(name *string, max int) error {
	if name == nil {
		return api.BadRequest("'name' is a required property")
	}
	if strings.TrimSpace(*name) == "" {
		return api.BadRequest("Invalid input for field 'name': '%s' is too short", *name)
	}
	if utf8.RuneCountInString(*name) > max {
		return api.BadRequest("Invalid input for field 'name': '%s' is too long", *name)
	}
	return nil
}

// conflict is Keystone's 409 for a duplicate (keystone/common/sql/core.py
// handle_conflicts).
func conflict(kind, name, domainID string) error {
	if domainID != "" {
		return api.Conflict("Conflict occurred attempting to store %s - Duplicate entry found with name %s at domain ID %s.",
			kind, name, domainID)
	}
	return api.Conflict("Conflict occurred attempting to store %s - Duplicate entry found with name %s.", kind, name)
}

// named is an entity whose name is unique within its domain (overall for
// domains and roles, whose domain is "").
type named interface {
	nameKey() (name, domainID string)
}

func (d *Domain) nameKey() (string, string)  { return d.Name, "" }
func (p *Project) nameKey() (string, string) { return p.Name, p.DomainID }
func (u *User) nameKey() (string, string)    { return u.Name, u.DomainID }
func (r *Role) nameKey() (string, string)    { return r.Name, "" }

// saved answers the write of one entity of kind: a name already taken is
// Keystone's 409, another error stands, else status with the entity's body.
func saved[T named](r *http.Request, err error, status int, kind string, e T,
	body func(*http.Request, T) map[string]any) (*api.Response, error) {
	if errors.Is(err, store.ErrConflict) {
		name, domainID := e.nameKey()
		return nil, conflict(kind, name, domainID)
	}
	if err != nil {
		return nil, err
	}
	return api.JSON(status, map[string]any{kind: body(r, e)}), nil
}

// queryBool reads a boolean query filter the way Keystone does: 0, false,
// no, off and friends are false; anything else is true.
func queryBool(v string) bool {
	switch strings.ToLower(v) {
	case "0", "f", "false", "n", "no", "off":
		return false
	}
	return true
}

// filters turns the query parameters named in cols into a WHERE clause.
// "enabled" is read as a boolean.
func filters(q url.Values, cols ...string) (string, []any) {
	var where []string
	var args []any
	for _, c := range cols {
		v, ok := q[c]
		if !ok || len(v) == 0 {
			continue
		}
		if c == "enabled" {
			where = append(where, "enabled = ?")
			args = append(args, b2i(queryBool(v[0])))
			continue
		}
		where = append(where, c+" = ?")
		args = append(args, v[0])
	}
	return strings.Join(where, " AND "), args
}

// --- domains

func (s *Service) listDomains(r *http.Request) (*api.Response, error) {
	ds, err := listDomains(r.Context(), s.db)
	if err != nil {
		return nil, err
	}
	q := r.URL.Query()
	out := []map[string]any{}
	for i := range ds {
		d := &ds[i]
		if v, ok := q["name"]; ok && d.Name != v[0] {
			continue
		}
		if v, ok := q["enabled"]; ok && d.Enabled != queryBool(v[0]) {
			continue
		}
		out = append(out, domainBody(r, d))
	}
	return api.JSON(http.StatusOK, map[string]any{"domains": out, "links": collectionLinks(r)}), nil
}

func (s *Service) findDomain(r *http.Request, id string) (*Domain, error) {
	d, err := getDomain(r.Context(), s.db, "id = ?", id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, api.NotFound("Could not find domain: %s.", id)
	}
	return d, err
}

// getDomain lets an admin read any domain and anyone read their own.
func (s *Service) getDomain(r *http.Request) (*api.Response, error) {
	id := r.PathValue("id")
	if c := api.CallerFrom(r.Context()); !c.IsAdmin() && c.DomainID != id {
		return nil, forbidden("identity:get_domain")
	}
	d, err := s.findDomain(r, id)
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, map[string]any{"domain": domainBody(r, d)}), nil
}

type domainRequest struct {
	Name        *string `json:"name"`
	Description *string `json:"description"`
	Enabled     *bool   `json:"enabled"`
}

func (s *Service) createDomain(r *http.Request) (*api.Response, error) {
	var req domainRequest
	if err := decodeEntity(r, "domain", &req); err != nil {
		return nil, err
	}
	if err := checkName(req.Name, 64); err != nil {
		return nil, err
	}
	d := &Domain{ID: NewID(), Name: *req.Name, Enabled: true}
	setIf(&d.Description, req.Description)
	setIf(&d.Enabled, req.Enabled)
	err := s.db.Tx(r.Context(), func(tx *store.Tx) error {
		tx.AfterCommit(s.cache.invalidate)
		_, err := tx.Exec(r.Context(), "INSERT INTO domains (id, name, description, enabled) VALUES (?, ?, ?, ?)",
			d.ID, d.Name, d.Description, b2i(d.Enabled))
		return err
	})
	return saved(r, err, http.StatusCreated, "domain", d, domainBody)
}

func (s *Service) updateDomain(r *http.Request) (*api.Response, error) {
	id := r.PathValue("id")
	var req domainRequest
	if err := decodeEntity(r, "domain", &req); err != nil {
		return nil, err
	}
	if req.Name != nil {
		if err := checkName(req.Name, 64); err != nil {
			return nil, err
		}
	}
	if id == DefaultDomainID && req.Enabled != nil && !*req.Enabled {
		// Every bootstrap account lives in the default domain; disabling
		// it would lock the operator out.
		return nil, api.Forbidden("The default domain cannot be disabled.")
	}
	var d *Domain
	err := s.db.Tx(r.Context(), func(tx *store.Tx) error {
		var err error
		if d, err = getDomain(r.Context(), tx, "id = ?", id); errors.Is(err, store.ErrNotFound) {
			return api.NotFound("Could not find domain: %s.", id)
		} else if err != nil {
			return err
		}
		setIf(&d.Name, req.Name)
		setIf(&d.Description, req.Description)
		setIf(&d.Enabled, req.Enabled)
		if _, err := tx.Exec(r.Context(), "UPDATE domains SET name = ?, description = ?, enabled = ? WHERE id = ?",
			d.Name, d.Description, b2i(d.Enabled), d.ID); err != nil {
			return err
		}
		tx.AfterCommit(s.cache.invalidate)
		return nil
	})
	return saved(r, err, http.StatusOK, "domain", d, domainBody)
}

// deleteDomain removes a disabled domain with its projects and users, as
// Keystone's resource manager does (keystone/resource/core.py delete_domain).
func (s *Service) deleteDomain(r *http.Request) (*api.Response, error) {
	id := r.PathValue("id")
	ctx := r.Context()
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		d, err := getDomain(ctx, tx, "id = ?", id)
		if errors.Is(err, store.ErrNotFound) {
			return api.NotFound("Could not find domain: %s.", id)
		} else if err != nil {
			return err
		}
		if d.Enabled {
			return api.Forbidden("Cannot delete a domain that is enabled, please disable it first.")
		}
		if err := execEach(ctx, tx, id,
			"DELETE FROM tokens WHERE user_id IN (SELECT id FROM users WHERE domain_id = ?)",
			"DELETE FROM tokens WHERE project_id IN (SELECT id FROM projects WHERE domain_id = ?)",
			"DELETE FROM role_assignments WHERE user_id IN (SELECT id FROM users WHERE domain_id = ?)",
			"DELETE FROM role_assignments WHERE project_id IN (SELECT id FROM projects WHERE domain_id = ?)",
			"DELETE FROM users WHERE domain_id = ?",
			"DELETE FROM projects WHERE domain_id = ?",
			"DELETE FROM domains WHERE id = ?",
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

// --- catalog as resources (keystone/api/services.py, endpoints.py,
// regions.py); the ids are the ones token catalogs carry.

func (s *Service) serviceBody(r *http.Request, c CatalogService) map[string]any {
	id := stableID("service", c.Type)
	return map[string]any{
		"id": id, "type": c.Type, "name": c.Name, "enabled": true, "description": "",
		"links": selfLink(r, "/v3/services/"+id),
	}
}

func (s *Service) endpointBodies(r *http.Request, c CatalogService) []map[string]any {
	var out []map[string]any
	for _, iface := range []string{"public", "internal", "admin"} {
		id := stableID("endpoint", c.Type, iface)
		out = append(out, map[string]any{
			"id": id, "interface": iface, "region": s.Region, "region_id": s.Region,
			"service_id": stableID("service", c.Type), "url": c.URL, "enabled": true,
			"links": selfLink(r, "/v3/endpoints/"+id),
		})
	}
	return out
}

func (s *Service) listServices(r *http.Request) (*api.Response, error) {
	q := r.URL.Query()
	out := []map[string]any{}
	for _, c := range s.catalog {
		if v, ok := q["type"]; ok && v[0] != c.Type {
			continue
		}
		if v, ok := q["name"]; ok && v[0] != c.Name {
			continue
		}
		out = append(out, s.serviceBody(r, c))
	}
	return api.JSON(http.StatusOK, map[string]any{"services": out, "links": collectionLinks(r)}), nil
}

func (s *Service) getService(r *http.Request) (*api.Response, error) {
	id := r.PathValue("id")
	for _, c := range s.catalog {
		if stableID("service", c.Type) == id {
			return api.JSON(http.StatusOK, map[string]any{"service": s.serviceBody(r, c)}), nil
		}
	}
	return nil, api.NotFound("Could not find service: %s.", id)
}

func (s *Service) listEndpoints(r *http.Request) (*api.Response, error) {
	q := r.URL.Query()
	out := []map[string]any{}
	for _, c := range s.catalog {
		for _, e := range s.endpointBodies(r, c) {
			if v, ok := q["service_id"]; ok && v[0] != e["service_id"] {
				continue
			}
			if v, ok := q["interface"]; ok && v[0] != e["interface"] {
				continue
			}
			if v, ok := q["region_id"]; ok && v[0] != e["region_id"] {
				continue
			}
			out = append(out, e)
		}
	}
	return api.JSON(http.StatusOK, map[string]any{"endpoints": out, "links": collectionLinks(r)}), nil
}

func (s *Service) getEndpoint(r *http.Request) (*api.Response, error) {
	id := r.PathValue("id")
	for _, c := range s.catalog {
		for _, e := range s.endpointBodies(r, c) {
			if e["id"] == id {
				return api.JSON(http.StatusOK, map[string]any{"endpoint": e}), nil
			}
		}
	}
	return nil, api.NotFound("Could not find endpoint: %s.", id)
}

func (s *Service) regionBody(r *http.Request) map[string]any {
	return map[string]any{"id": s.Region, "description": "", "parent_region_id": nil,
		"links": selfLink(r, "/v3/regions/"+s.Region)}
}

// listRegions is open to any authenticated caller, as Keystone's
// identity:list_regions default ("") is.
func (s *Service) listRegions(r *http.Request) (*api.Response, error) {
	return api.JSON(http.StatusOK, map[string]any{"regions": []any{s.regionBody(r)}, "links": collectionLinks(r)}), nil
}

func (s *Service) getRegion(r *http.Request) (*api.Response, error) {
	if id := r.PathValue("id"); id != s.Region {
		return nil, api.NotFound("Could not find region: %s.", id)
	}
	return api.JSON(http.StatusOK, map[string]any{"region": s.regionBody(r)}), nil
}
