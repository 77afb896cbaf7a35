package identity

import (
	"context"
	"errors"
	"math"
	"net/http"
	"strconv"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// appCredAuth is the "application_credential" method of POST
// /v3/auth/tokens: the credential by id, or by name and its user (by id, or
// by name and domain), with its secret.
type appCredAuth struct {
	ID     string `json:"id"`
	Name   string `json:"name"`
	Secret string `json:"secret"`
	User   *struct {
		ID     string     `json:"id"`
		Name   string     `json:"name"`
		Domain *domainRef `json:"domain"`
	} `json:"user"`
}

// errAppCredScope is Keystone's ApplicationCredentialAuthError for a scope
// in the request: the credential's project is the only scope it has.
func errAppCredScope() error {
	return api.Errorf(http.StatusUnauthorized,
		"Error authenticating with application credential: Application credentials cannot request a scope.")
}

// appCredLogin authenticates an application credential for a client at
// addr. Like a password, the secret is an argon2id hash: checked under a
// hash slot, one check per credential at a time, and failures count
// against the address. They do not lock the user: the credential is not
// the user's password.
func (s *Service) appCredLogin(r *http.Request, a *appCredAuth) (*AppCred, *User, error) {
	ctx, addr := r.Context(), api.ClientAddress(r)
	if err := s.appCredRequestValid(a); err != nil {
		return nil, nil, err
	}
	if wait := s.addressWait(addr); wait > 0 {
		secs := strconv.Itoa(int(math.Ceil(wait.Seconds())))
		return nil, nil, retryLater(http.StatusTooManyRequests, wait,
			"Too many failed authentication attempts from this address; retry after "+secs+" seconds.")
	}
	ac, u, err := s.findAppCred(r, a)
	if err == nil && (!u.Enabled || ac.expired(s.now())) {
		err = api.Unauthorized()
	}
	if err != nil {
		if e, ok := err.(*api.Error); ok && e.Status == http.StatusUnauthorized {
			s.addressFailed(addr)
		}
		return nil, nil, err
	}
	done, err := s.userTurn(ctx, "application_credential:"+ac.ID)
	if err != nil {
		return nil, nil, err
	}
	defer done()
	ok := false
	if err := s.withHashSlot(ctx, func() error { ok = CheckPassword(ac.SecretHash, a.Secret); return nil }); err != nil {
		return nil, nil, err
	}
	if !ok {
		s.addressFailed(addr)
		return nil, nil, api.Unauthorized()
	}
	return ac, u, nil
}

// appCredRequestValid checks the method's body as Keystone's AppCredInfo
// does, before anything is looked up.
func (s *Service) appCredRequestValid(a *appCredAuth) error {
	switch {
	case a == nil:
		return api.BadRequest("Expecting to find application_credential in identity.")
	case a.ID == "" && a.Name == "":
		return api.BadRequest("Expecting to find id or name in application_credential.")
	case a.ID == "" && a.User == nil:
		return api.BadRequest("Expecting to find user in application_credential.")
	case a.Secret == "":
		return api.BadRequest("Expecting to find secret in application_credential.")
	case len(a.Secret) > maxPassword:
		return api.Unauthorized()
	}
	return nil
}

// findAppCred loads the credential a names and its user; anything unknown
// is a 401.
func (s *Service) findAppCred(r *http.Request, a *appCredAuth) (*AppCred, *User, error) {
	ctx := r.Context()
	var (
		ac  *AppCred
		u   *User
		err error
	)
	if a.ID != "" {
		if ac, err = getAppCred(ctx, s.db, "id = ?", a.ID); err == nil {
			u, err = GetUser(ctx, s.db, ac.UserID)
		}
	} else {
		if u, err = s.appCredUser(r, a); err == nil {
			ac, err = getAppCred(ctx, s.db, "user_id = ? AND name = ?", u.ID, a.Name)
		}
	}
	if errors.Is(err, store.ErrNotFound) || (err == nil && a.User != nil && a.User.ID != "" && a.User.ID != u.ID) {
		return nil, nil, api.Unauthorized()
	}
	return ac, u, err
}

// appCredUser is the user an application credential named by name belongs
// to, by id or by name and domain.
func (s *Service) appCredUser(r *http.Request, a *appCredAuth) (*User, error) {
	if a.User.ID != "" {
		return GetUser(r.Context(), s.db, a.User.ID)
	}
	if a.User.Name == "" {
		return nil, api.BadRequest("Expecting to find id or name in user.")
	}
	d, err := s.resolveDomain(r, a.User.Domain)
	if err != nil {
		return nil, err
	}
	return getUserByName(r.Context(), s.db, d.ID, a.User.Name)
}

// loadAppCred completes a token issued for an application credential: the
// credential must still exist and be unexpired, and the token carries only
// the credential's roles the user still holds. Otherwise the token is
// not found.
func (s *Service) loadAppCred(ctx context.Context, t *tokenInfo) error {
	if t.AppCredID == "" {
		return nil
	}
	ac, err := getAppCred(ctx, s.db, "id = ?", t.AppCredID)
	if errors.Is(err, store.ErrNotFound) {
		return errTokenNotFound
	}
	if err != nil {
		return err
	}
	if ac.expired(s.now()) || ac.ProjectID != t.ProjectID {
		return errTokenNotFound
	}
	t.AppCred = ac
	if t.Roles = ac.effectiveRoles(t.Roles); len(t.Roles) == 0 {
		return errTokenNotFound
	}
	return nil
}

// appCredTokenBody is the token body's "application_credential", as
// keystone/common/render_token.py writes it.
func appCredTokenBody(ac *AppCred) map[string]any {
	return map[string]any{"id": ac.ID, "name": ac.Name, "restricted": !ac.Unrestricted}
}
