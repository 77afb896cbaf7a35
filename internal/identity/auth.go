package identity

import (
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// Routes is the identity API's route table.
func (s *Service) Routes() []api.Route {
	routes := []api.Route{
		{Pattern: "GET /{$}", Handler: s.versions, Public: true},
		{Pattern: "GET /v3", Handler: s.version, Public: true},
		{Pattern: "GET /v3/{$}", Handler: s.version, Public: true},
		{Pattern: "POST /v3/auth/tokens", Handler: s.createToken, Public: true},
		{Pattern: "GET /v3/auth/tokens", Handler: s.checkToken},
		{Pattern: "HEAD /v3/auth/tokens", Handler: s.checkToken},
		{Pattern: "DELETE /v3/auth/tokens", Handler: s.deleteToken},
		{Pattern: "GET /v3/auth/catalog", Handler: s.getCatalog},
		{Pattern: "GET /v3/auth/projects", Handler: s.authProjects},
		{Pattern: "GET /v3/auth/domains", Handler: s.authDomains},
	}
	routes = append(routes, s.appCredRoutes()...)
	routes = append(routes, s.credentialRoutes()...)
	return append(routes, s.adminRoutes()...)
}

func (s *Service) versionBody(r *http.Request) map[string]any {
	return map[string]any{
		"id": "v3.14", "status": "stable", "updated": "2020-04-07T00:00:00Z",
		"links": []map[string]string{{"rel": "self", "href": api.BaseURL(r) + "/v3/"}},
		"media-types": []map[string]string{{"base": "application/json",
			"type": "application/vnd.openstack.identity-v3+json"}},
	}
}

// versions answers GET / with 300 Multiple Choices, as Keystone does.
func (s *Service) versions(r *http.Request) (*api.Response, error) {
	return api.JSON(http.StatusMultipleChoices, map[string]any{
		"versions": map[string]any{"values": []any{s.versionBody(r)}},
	}).WithHeader("Location", api.BaseURL(r)+"/v3/"), nil
}

func (s *Service) version(r *http.Request) (*api.Response, error) {
	return api.JSON(http.StatusOK, map[string]any{"version": s.versionBody(r)}), nil
}

// authRequest is the body of POST /v3/auth/tokens.
type authRequest struct {
	Auth struct {
		Identity struct {
			Methods  []string `json:"methods"`
			Password *struct {
				User struct {
					ID       string     `json:"id"`
					Name     string     `json:"name"`
					Password string     `json:"password"`
					Domain   *domainRef `json:"domain"`
				} `json:"user"`
			} `json:"password"`
			Token *struct {
				ID string `json:"id"`
			} `json:"token"`
			ApplicationCredential *appCredAuth `json:"application_credential"`
			TOTP                  *struct {
				User struct {
					ID       string     `json:"id"`
					Name     string     `json:"name"`
					Passcode string     `json:"passcode"`
					Domain   *domainRef `json:"domain"`
				} `json:"user"`
			} `json:"totp"`
		} `json:"identity"`
		Scope json.RawMessage `json:"scope"`
	} `json:"auth"`
}

type domainRef struct {
	ID   string `json:"id"`
	Name string `json:"name"`
}

type scopeRequest struct {
	Project *struct {
		ID     string     `json:"id"`
		Name   string     `json:"name"`
		Domain *domainRef `json:"domain"`
	} `json:"project"`
	Domain *domainRef `json:"domain"`
	System any        `json:"system"`
}

// authn is what the methods of a token request proved.
type authn struct {
	user    *User
	methods []string // the methods that succeeded, with those they carry
	auditID string
	expires time.Time
	inherit string // project of the token being re-scoped
	appCred *AppCred
	receipt *receipt
}

func (s *Service) createToken(r *http.Request) (*api.Response, error) {
	var req authRequest
	if err := api.DecodeJSON(r, &req); err != nil {
		return nil, err
	}
	if len(req.Auth.Identity.Methods) == 0 {
		return nil, api.BadRequest("Expecting to find identity in auth. The server could not comply with the request since it is either malformed or otherwise incorrect. The client is assumed to be in error.")
	}
	hasScope := len(req.Auth.Scope) > 0 && string(req.Auth.Scope) != "null"
	a, err := s.authenticate(r, &req, hasScope)
	if rr, ok := asReceipt(err); ok {
		return receiptResponse(rr), nil
	}
	if err != nil {
		return nil, err
	}
	ctx := r.Context()
	user, appCred := a.user, a.appCred
	projectID := ""
	if hasScope {
		var scope scopeRequest
		if err := api.Unmarshal(req.Auth.Scope, &scope); err != nil {
			return nil, err
		}
		switch {
		case scope.Project != nil:
			p, err := s.resolveProject(r, scope.Project.ID, scope.Project.Name, scope.Project.Domain)
			if err != nil {
				return nil, err
			}
			projectID = p.ID
		default:
			// Domain and system scope are not offered: Nimbus authorises
			// by project roles only.
			return nil, api.Unauthorized()
		}
	} else if a.inherit != "" {
		projectID = a.inherit
	} else if user.DefaultProjectID != "" {
		// Keystone scopes a token without scope to the default project when
		// the user has a role on it.
		if roles, err := rolesOn(ctx, s.db, user.ID, user.DefaultProjectID); err == nil && len(roles) > 0 {
			projectID = user.DefaultProjectID
		}
	}
	if appCred != nil {
		// A credential's tokens stay on its project, re-scoped or not.
		if hasScope && projectID != appCred.ProjectID {
			return nil, api.Unauthorized()
		}
		projectID = appCred.ProjectID
	}
	if projectID != "" {
		p, err := GetProject(ctx, s.db, projectID)
		if err != nil || !p.Enabled {
			return nil, api.Unauthorized()
		}
		roles, err := rolesOn(ctx, s.db, user.ID, projectID)
		if err != nil {
			return nil, err
		}
		if len(roles) == 0 || (appCred != nil && len(appCred.effectiveRoles(roles)) < len(appCred.Roles)) {
			// Keystone refuses a credential whose user lost any of its roles.
			return nil, api.Unauthorized()
		}
	}
	if err := s.allowIssue(user.ID); err != nil {
		return nil, err
	}
	t := &Token{UserID: user.ID, ProjectID: projectID, Methods: a.methods, AuditID: a.auditID, ExpiresAt: a.expires}
	if appCred != nil {
		t.AppCredID = appCred.ID
	}
	t, err = s.issueToken(ctx, t)
	if err != nil {
		return nil, err
	}
	if err := s.spendReceipt(ctx, a.receipt); err != nil {
		return nil, err
	}
	info, err := s.load(ctx, t.ID)
	if errors.Is(err, errTokenNotFound) {
		// Its project, roles or credential went away since the checks.
		return nil, api.Unauthorized()
	}
	if err != nil {
		return nil, err
	}
	_, nocatalog := r.URL.Query()["nocatalog"]
	return api.JSON(http.StatusCreated, s.tokenBody(info, !nocatalog)).
		WithHeader("X-Subject-Token", t.ID).WithHeader("Vary", "X-Auth-Token"), nil
}

// authenticate runs the methods of a token request: one first factor
// (password, token or application credential), a passcode (totp), and the
// receipt in Openstack-Auth-Receipt, as Keystone's authenticate_for_token
// does; then the user's MFA rules, which may answer *ReceiptRequired.
func (s *Service) authenticate(r *http.Request, req *authRequest, hasScope bool) (*authn, error) {
	ctx, addr := r.Context(), api.ClientAddress(r)
	id := req.Auth.Identity
	var rc *receipt
	if h := r.Header.Get(ReceiptHeader); h != "" {
		var err error
		if rc, err = s.loadReceipt(ctx, h); err != nil {
			return nil, err
		}
	}
	a, err := s.firstFactor(r, req, hasScope)
	if err != nil {
		return nil, err
	}
	if slices.Contains(id.Methods, "totp") {
		if id.TOTP == nil {
			return nil, api.BadRequest("Expecting to find totp in identity.")
		}
		tu := id.TOTP.User
		u, err := s.totpUser(r, tu.ID, tu.Name, tu.Domain)
		if err != nil {
			return nil, err
		}
		switch {
		case a != nil && a.user.ID != u.ID:
			return nil, api.Unauthorized()
		case a == nil && (rc == nil || rc.userID != u.ID):
			// A passcode alone proves nothing: it is checked only after
			// a first factor, in this request or the receipt's.
			return nil, api.Unauthorized()
		}
		if err := s.totpFactor(ctx, addr, u, tu.Passcode, rc); err != nil {
			return nil, err
		}
		if a == nil {
			a = &authn{user: u}
		}
		a.methods = append(a.methods, "totp")
	}
	if a == nil {
		return nil, api.Unauthorized()
	}
	a.receipt = rc
	if a.methods, err = s.applyRules(ctx, addr, a.user, a.methods, rc); err != nil {
		return nil, err
	}
	return a, nil
}

// firstFactor runs the request's first factor; nil when it names none.
func (s *Service) firstFactor(r *http.Request, req *authRequest, hasScope bool) (*authn, error) {
	ctx := r.Context()
	id := req.Auth.Identity
	switch {
	case slices.Contains(id.Methods, "password"):
		if id.Password == nil {
			return nil, api.BadRequest("Expecting to find password in identity.")
		}
		pu := id.Password.User
		if pu.ID == "" && pu.Name == "" {
			return nil, api.BadRequest("Expecting to find id or name in user.")
		}
		find := func() (*User, error) { return s.findAuthUser(r, pu.ID, pu.Name, pu.Domain) }
		user, err := s.passwordLogin(ctx, api.ClientAddress(r), find, pu.Password)
		if err != nil {
			return nil, err
		}
		return &authn{user: user, methods: []string{"password"}}, nil
	case slices.Contains(id.Methods, "token"):
		if id.Token == nil || id.Token.ID == "" {
			return nil, api.BadRequest("Expecting to find token in identity.")
		}
		old, err := s.load(ctx, id.Token.ID)
		if err != nil {
			if errors.Is(err, errTokenNotFound) {
				return nil, api.Unauthorized()
			}
			return nil, err
		}
		// A re-scoped token keeps the original's audit chain, expiry and
		// methods (keystone/auth/core.py AuthInfo: method_names extend).
		return &authn{user: old.User, methods: union([]string{"token"}, old.Methods), auditID: old.AuditID,
			expires: old.ExpiresAt, inherit: old.ProjectID, appCred: old.AppCred}, nil
	case slices.Contains(id.Methods, "application_credential"):
		if hasScope {
			return nil, errAppCredScope()
		}
		appCred, user, err := s.appCredLogin(r, id.ApplicationCredential)
		if err != nil {
			return nil, err
		}
		return &authn{user: user, methods: []string{"application_credential"}, appCred: appCred, expires: appCred.ExpiresAt}, nil
	}
	return nil, nil
}

// findAuthUser is the user an auth method names: by id, or by name and
// domain.
func (s *Service) findAuthUser(r *http.Request, id, name string, domain *domainRef) (*User, error) {
	if id != "" {
		return GetUser(r.Context(), s.db, id)
	}
	d, err := s.resolveDomain(r, domain)
	if err != nil {
		return nil, err
	}
	return getUserByName(r.Context(), s.db, d.ID, name)
}

// totpUser is the enabled user the totp method names; anything else is
// 401.
func (s *Service) totpUser(r *http.Request, id, name string, domain *domainRef) (*User, error) {
	if id == "" && name == "" {
		return nil, api.BadRequest("Expecting to find id or name in user.")
	}
	u, err := s.findAuthUser(r, id, name, domain)
	if err != nil && !errors.Is(err, store.ErrNotFound) && !isAPIError(err) {
		return nil, err
	}
	if err != nil || !u.Enabled {
		return nil, api.Unauthorized()
	}
	return u, nil
}

func isAPIError(err error) bool {
	var e *api.Error
	return errors.As(err, &e)
}

func (s *Service) resolveDomain(r *http.Request, ref *domainRef) (*Domain, error) {
	if ref == nil {
		return nil, api.BadRequest("Expecting to find domain in user.")
	}
	var (
		d   *Domain
		err error
	)
	switch {
	case ref.ID != "":
		d, err = getDomain(r.Context(), s.db, "id = ?", ref.ID)
	case ref.Name != "":
		d, err = getDomain(r.Context(), s.db, "name = ?", ref.Name)
	default:
		return nil, api.BadRequest("Expecting to find id or name in domain.")
	}
	if errors.Is(err, store.ErrNotFound) || (err == nil && !d.Enabled) {
		return nil, api.Unauthorized()
	}
	return d, err
}

func (s *Service) resolveProject(r *http.Request, id, name string, domain *domainRef) (*Project, error) {
	var (
		p   *Project
		err error
	)
	if id != "" {
		p, err = GetProject(r.Context(), s.db, id)
	} else if name != "" {
		if domain == nil {
			return nil, api.BadRequest("Expecting to find domain in project.")
		}
		d, derr := s.resolveDomain(r, domain)
		if derr != nil {
			return nil, derr
		}
		p, err = getProjectByName(r.Context(), s.db, d.ID, name)
	} else {
		return nil, api.BadRequest("Expecting to find id or name in project.")
	}
	if errors.Is(err, store.ErrNotFound) {
		return nil, api.Unauthorized()
	}
	return p, err
}

// keystoneTime is Keystone's token time format: six zeroed fraction digits.
func keystoneTime(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05") + ".000000Z" }

func (s *Service) tokenBody(t *tokenInfo, withCatalog bool) map[string]any {
	tok := map[string]any{
		"methods": t.Methods,
		"user": map[string]any{
			"id": t.User.ID, "name": t.User.Name, "password_expires_at": nil,
			"domain": map[string]any{"id": t.Domain.ID, "name": t.Domain.Name},
		},
		"audit_ids":  []string{t.AuditID},
		"expires_at": keystoneTime(t.ExpiresAt),
		"issued_at":  keystoneTime(t.IssuedAt),
	}
	if t.Project != nil {
		tok["project"] = map[string]any{
			"id": t.Project.ID, "name": t.Project.Name,
			"domain": map[string]any{"id": t.PDomain.ID, "name": t.PDomain.Name},
		}
		tok["is_domain"] = false
		roles := make([]map[string]string, 0, len(t.Roles))
		for _, r := range t.Roles {
			roles = append(roles, map[string]string{"id": r.ID, "name": r.Name})
		}
		tok["roles"] = roles
		if t.AppCred != nil {
			tok["application_credential"] = appCredTokenBody(t.AppCred)
		}
		if withCatalog {
			tok["catalog"] = s.catalogBody()
		}
	}
	return map[string]any{"token": tok}
}

// subject loads the token named by X-Subject-Token; an unknown or expired
// one is Keystone's 404.
func (s *Service) subject(r *http.Request) (*tokenInfo, error) {
	id := r.Header.Get("X-Subject-Token")
	if id == "" {
		return nil, api.NotFound("Could not find token: .")
	}
	e, err := s.lookup(r.Context(), id)
	t := e.info
	if errors.Is(err, errTokenNotFound) {
		// Keystone's words for a token it cannot read (wire capture 07).
		return nil, api.NotFound("Could not recognize Fernet token")
	}
	if err != nil {
		return nil, err
	}
	// A user may check its own tokens; checking others' needs admin.
	if c := api.CallerFrom(r.Context()); c.UserID != t.UserID && !c.IsAdmin() {
		return nil, api.PolicyForbidden("identity:validate_token")
	}
	return t, nil
}

func (s *Service) checkToken(r *http.Request) (*api.Response, error) {
	t, err := s.subject(r)
	if err != nil {
		return nil, err
	}
	if r.Method == http.MethodHead {
		return api.Empty(http.StatusOK).WithHeader("X-Subject-Token", t.ID), nil
	}
	_, nocatalog := r.URL.Query()["nocatalog"]
	return api.JSON(http.StatusOK, s.tokenBody(t, !nocatalog)).
		WithHeader("X-Subject-Token", t.ID).WithHeader("Vary", "X-Auth-Token"), nil
}

func (s *Service) deleteToken(r *http.Request) (*api.Response, error) {
	t, err := s.subject(r)
	if err != nil {
		return nil, err
	}
	if err := s.revoke(r.Context(), t.ID); err != nil {
		return nil, err
	}
	return api.Empty(http.StatusNoContent), nil
}

func (s *Service) getCatalog(r *http.Request) (*api.Response, error) {
	return api.JSON(http.StatusOK, map[string]any{
		"catalog": s.catalogBody(),
		"links":   map[string]any{"self": api.BaseURL(r) + "/v3/auth/catalog", "previous": nil, "next": nil},
	}), nil
}

func (s *Service) authProjects(r *http.Request) (*api.Response, error) {
	c := api.CallerFrom(r.Context())
	ps, err := listProjects(r.Context(), s.db,
		"id IN (SELECT project_id FROM role_assignments WHERE user_id = ?) AND enabled = 1", c.UserID)
	if err != nil {
		return nil, err
	}
	out := make([]map[string]any, 0, len(ps))
	for i := range ps {
		out = append(out, projectBody(r, &ps[i]))
	}
	return api.JSON(http.StatusOK, map[string]any{"projects": out, "links": listLinks(r, "/v3/auth/projects")}), nil
}

func (s *Service) authDomains(r *http.Request) (*api.Response, error) {
	c := api.CallerFrom(r.Context())
	d, err := getDomain(r.Context(), s.db, "id = ?", c.DomainID)
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, map[string]any{"domains": []any{domainBody(r, d)}, "links": listLinks(r, "/v3/auth/domains")}), nil
}

func listLinks(r *http.Request, path string) map[string]any {
	return map[string]any{"self": api.BaseURL(r) + path, "previous": nil, "next": nil}
}

func projectBody(r *http.Request, p *Project) map[string]any {
	return map[string]any{
		"id": p.ID, "name": p.Name, "domain_id": p.DomainID, "description": p.Description,
		"enabled": p.Enabled, "is_domain": false, "parent_id": p.DomainID, "tags": p.Tags, "options": map[string]any{},
		"links": map[string]string{"self": api.BaseURL(r) + "/v3/projects/" + p.ID},
	}
}

func domainBody(r *http.Request, d *Domain) map[string]any {
	return map[string]any{
		"id": d.ID, "name": d.Name, "description": d.Description, "enabled": d.Enabled, "tags": []string{}, "options": map[string]any{},
		"links": map[string]string{"self": api.BaseURL(r) + "/v3/domains/" + d.ID},
	}
}
