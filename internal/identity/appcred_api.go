package identity

import (
	"encoding/json"
	"errors"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// Keystone's application credential handlers (keystone/api/users.py
// UserAppCredListCreateResource, UserAppCredGetDeleteResource).

// maxAppCredsPerUser bounds one user's credentials, as Keystone's
// [application_credential] user_limit can, so no customer fills the table.
const maxAppCredsPerUser = 100

func (s *Service) appCredRoutes() []api.Route {
	return []api.Route{
		{Pattern: "GET /v3/users/{id}/application_credentials", Handler: s.listAppCreds},
		{Pattern: "POST /v3/users/{id}/application_credentials", Handler: s.createAppCred},
		{Pattern: "GET /v3/users/{id}/application_credentials/{cred}", Handler: s.getAppCred},
		{Pattern: "DELETE /v3/users/{id}/application_credentials/{cred}", Handler: s.deleteAppCred},
	}
}

// appCredTime is how Keystone writes a credential's expires_at: no zone.
func appCredTime(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000000") }

func appCredBody(r *http.Request, a *AppCred) map[string]any {
	roles := make([]map[string]any, 0, len(a.Roles))
	for _, ro := range a.Roles {
		roles = append(roles, map[string]any{"id": ro.ID, "name": ro.Name, "domain_id": nil})
	}
	b := map[string]any{
		"id": a.ID, "name": a.Name, "description": nil, "expires_at": nil, "project_id": a.ProjectID,
		"roles": roles, "unrestricted": a.Unrestricted, "access_rules": []any{},
		"links": selfLink(r, "/v3/users/"+a.UserID+"/application_credentials/"+a.ID),
	}
	if a.Description != "" {
		b["description"] = a.Description
	}
	if !a.ExpiresAt.IsZero() {
		b["expires_at"] = appCredTime(a.ExpiresAt)
	}
	return b
}

// callerToken is the caller's own token as loaded, to see whether it came
// from an application credential.
func (s *Service) callerToken(r *http.Request) (*tokenInfo, error) {
	e, err := s.lookup(r.Context(), api.CallerFrom(r.Context()).Token)
	if errors.Is(err, errTokenNotFound) {
		return nil, api.Unauthorized()
	}
	return e.info, err
}

// restrictedRefused is Keystone's _check_unrestricted_application_credential:
// a restricted credential's token may not create or delete credentials, so
// a leaked one cannot make itself a successor.
func restrictedRefused(t *tokenInfo) error {
	if t.AppCred != nil && !t.AppCred.Unrestricted {
		return forbidden("Using method 'application_credential' is not allowed for managing additional application credentials")
	}
	return nil
}

func (s *Service) listAppCreds(r *http.Request) (*api.Response, error) {
	id := r.PathValue("id")
	if err := selfOrAdmin(r, id, "identity:list_application_credentials"); err != nil {
		return nil, err
	}
	ctx := r.Context()
	if _, err := findUser(ctx, s.db, id); err != nil {
		return nil, err
	}
	var name *string
	if q := r.URL.Query(); q.Has("name") {
		n := q.Get("name")
		name = &n
	}
	acs, err := listAppCreds(ctx, s.db, id, name)
	if err != nil {
		return nil, err
	}
	out := make([]map[string]any, 0, len(acs))
	for _, a := range acs {
		out = append(out, appCredBody(r, a))
	}
	return api.JSON(http.StatusOK, map[string]any{"application_credentials": out, "links": collectionLinks(r)}), nil
}

// findAppCredOf loads the user's credential named in the path, Keystone's
// 404 if the user has none by that id.
func (s *Service) findAppCredOf(r *http.Request, q store.Querier) (*AppCred, error) {
	id := r.PathValue("cred")
	a, err := getAppCred(r.Context(), q, "id = ? AND user_id = ?", id, r.PathValue("id"))
	if errors.Is(err, store.ErrNotFound) {
		return nil, api.NotFound("Could not find Application Credential: %s.", id)
	}
	return a, err
}

func (s *Service) getAppCred(r *http.Request) (*api.Response, error) {
	if err := selfOrAdmin(r, r.PathValue("id"), "identity:get_application_credential"); err != nil {
		return nil, err
	}
	a, err := s.findAppCredOf(r, s.db)
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, map[string]any{"application_credential": appCredBody(r, a)}), nil
}

// deleteAppCred removes a credential and revokes the tokens issued for it.
func (s *Service) deleteAppCred(r *http.Request) (*api.Response, error) {
	if err := selfOrAdmin(r, r.PathValue("id"), "identity:delete_application_credential"); err != nil {
		return nil, err
	}
	t, err := s.callerToken(r)
	if err != nil {
		return nil, err
	}
	if err := restrictedRefused(t); err != nil {
		return nil, err
	}
	ctx := r.Context()
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		a, err := s.findAppCredOf(r, tx)
		if err != nil {
			return err
		}
		if _, err := deleteAppCred(ctx, tx, a.ID); err != nil {
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

// appCredRequest is the body of a create. Keystone's schema allows no
// other properties.
type appCredRequest struct {
	Name         *string        `json:"name"`
	Description  *string        `json:"description"`
	Secret       *string        `json:"secret"`
	ExpiresAt    *string        `json:"expires_at"`
	Roles        []roleRef      `json:"roles"`
	Unrestricted *bool          `json:"unrestricted"`
	AccessRules  []any          `json:"access_rules"`
	Extra        map[string]any `json:"-"`
}

type roleRef struct {
	ID   string `json:"id"`
	Name string `json:"name"`
}

var appCredAttrs = []string{"name", "description", "secret", "expires_at", "roles", "unrestricted", "access_rules"}

// UnmarshalJSON keeps unknown attributes in Extra, to refuse them.
func (a *appCredRequest) UnmarshalJSON(b []byte) error {
	type plain appCredRequest
	if err := json.Unmarshal(b, (*plain)(a)); err != nil {
		return err
	}
	if err := json.Unmarshal(b, &a.Extra); err != nil {
		return err
	}
	for _, k := range appCredAttrs {
		delete(a.Extra, k)
	}
	return nil
}

func (s *Service) createAppCred(r *http.Request) (*api.Response, error) {
	userID := r.PathValue("id")
	c := api.CallerFrom(r.Context())
	// Keystone's policy is user_id:%(user_id)s: not even an admin makes
	// credentials for someone else.
	if c.UserID != userID {
		return nil, forbidden("identity:create_application_credential")
	}
	t, err := s.callerToken(r)
	if err != nil {
		return nil, err
	}
	if err := restrictedRefused(t); err != nil {
		return nil, err
	}
	a, secret, err := s.newAppCred(r, t)
	if err != nil {
		return nil, err
	}
	if err := s.storeAppCred(r, a); err != nil {
		return nil, err
	}
	body := appCredBody(r, a)
	body["secret"] = secret // shown this once; only its hash is kept
	return api.JSON(http.StatusCreated, map[string]any{"application_credential": body}), nil
}

// storeAppCred inserts a, within the user's limit.
func (s *Service) storeAppCred(r *http.Request, a *AppCred) error {
	ctx := r.Context()
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		var n int
		if err := tx.QueryRow(ctx, "SELECT COUNT(*) FROM application_credentials WHERE user_id = ?", a.UserID).Scan(&n); err != nil {
			return err
		}
		if n >= maxAppCredsPerUser {
			return api.Forbidden("Unable to create additional application credentials, maximum of %d already exceeded for user.",
				maxAppCredsPerUser)
		}
		return insertAppCred(ctx, tx, a)
	})
	if errors.Is(err, store.ErrConflict) {
		return conflict("application_credential", a.Name, "")
	}
	return err
}

// newAppCred builds the credential a create asks for, with its secret in
// the clear (generated if not given) and hashed.
func (s *Service) newAppCred(r *http.Request, t *tokenInfo) (*AppCred, string, error) {
	var req appCredRequest
	if err := decodeEntity(r, "application_credential", &req); err != nil {
		return nil, "", err
	}
	if err := checkAppCredRequest(&req); err != nil {
		return nil, "", err
	}
	if t.Project == nil {
		return nil, "", api.BadRequest("Invalid application credential: a project-scoped token is required to create one.")
	}
	now := s.now()
	a := &AppCred{ID: NewID(), Name: *req.Name, UserID: t.UserID, ProjectID: t.ProjectID, CreatedAt: now}
	if req.Description != nil {
		a.Description = *req.Description
	}
	if req.Unrestricted != nil {
		a.Unrestricted = *req.Unrestricted
	}
	var err error
	if a.ExpiresAt, err = parseExpiry(req.ExpiresAt, now); err != nil {
		return nil, "", err
	}
	if a.Roles, err = s.appCredRolesFor(r, req.Roles, t.Roles); err != nil {
		return nil, "", err
	}
	secret := newSecret() + newSecret() // 64 random bytes, as Keystone's
	if req.Secret != nil && *req.Secret != "" {
		secret = *req.Secret
	}
	if a.SecretHash, err = s.hashPassword(r.Context(), secret); err != nil {
		return nil, "", err
	}
	return a, secret, nil
}

// checkAppCredRequest follows Keystone's application_credential_create
// schema, with bounds on what is stored.
func checkAppCredRequest(req *appCredRequest) error {
	if len(req.Extra) > 0 {
		k := slices.Sorted(maps.Keys(req.Extra))[0]
		return api.BadRequest("Invalid input for field 'application_credential': Additional properties are not allowed ('%s' was unexpected)", k)
	}
	if err := checkName(req.Name, 255); err != nil {
		return err
	}
	if req.Description != nil && len(*req.Description) > 1024 {
		return api.BadRequest("Invalid input for field 'description': it is longer than 1024 characters.")
	}
	if req.Secret != nil && len(*req.Secret) > maxPassword {
		return api.BadRequest("Invalid input for field 'secret': it is longer than %d characters.", maxPassword)
	}
	if len(req.Roles) > 100 {
		return api.BadRequest("Invalid input for field 'roles': too many roles (maximum 100).")
	}
	if len(req.AccessRules) > 0 {
		return api.BadRequest("Invalid input for field 'access_rules': access rules are not supported.")
	}
	return nil
}

// parseExpiry reads expires_at as Keystone's utils.parse_expiration_date:
// ISO 8601, UTC when no zone is given, never in the past.
func parseExpiry(v *string, now time.Time) (time.Time, error) {
	if v == nil || *v == "" {
		return time.Time{}, nil
	}
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05.999999999", "2006-01-02T15:04:05Z0700"} {
		if t, err := time.Parse(layout, *v); err == nil {
			if !t.After(now) {
				return time.Time{}, api.BadRequest("The 'expires_at' must not be before now. The server could not comply with the request since it is either malformed or otherwise incorrect. The client is assumed to be in error.")
			}
			return t.UTC(), nil
		}
	}
	return time.Time{}, api.BadRequest("Invalid input for field 'expires_at': %q is not an ISO 8601 time.", *v)
}

// appCredRolesFor resolves the requested roles, each of which the caller's
// token must carry (so a credential never holds more than its creator
// could use); none requested means all of the token's.
func (s *Service) appCredRolesFor(r *http.Request, refs []roleRef, held []Role) ([]Role, error) {
	if len(refs) == 0 {
		return held, nil
	}
	var out []Role
	for _, ref := range refs {
		role, err := s.resolveRole(r, ref)
		if err != nil {
			return nil, err
		}
		i := indexRole(held, role.ID)
		if i < 0 {
			return nil, api.BadRequest("Invalid application credential: Cannot create an application credential with unassigned role")
		}
		if indexRole(out, role.ID) < 0 {
			out = append(out, held[i])
		}
	}
	return out, nil
}

func indexRole(roles []Role, id string) int {
	for i := range roles {
		if roles[i].ID == id {
			return i
		}
	}
	return -1
}

func (s *Service) resolveRole(r *http.Request, ref roleRef) (*Role, error) {
	switch {
	case ref.ID != "":
		return findRole(r.Context(), s.db, ref.ID)
	case strings.TrimSpace(ref.Name) != "":
		role, err := getRole(r.Context(), s.db, "name = ?", ref.Name)
		if errors.Is(err, store.ErrNotFound) {
			return nil, api.NotFound("Could not find role: %s.", ref.Name)
		}
		return role, err
	}
	return nil, api.BadRequest("Invalid input for field 'roles': a role needs an id or a name.")
}
