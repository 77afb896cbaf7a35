package identity

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// Keystone's user handlers (keystone/api/users.py).

// userBody renders a user as Keystone does: email and description are
// "extra" attributes, present only when set, and default_project_id only
// when set (keystone/identity/core.py, filter_user).
func userBody(r *http.Request, u *User) map[string]any {
	b := map[string]any{
		"id": u.ID, "name": u.Name, "domain_id": u.DomainID, "enabled": u.Enabled,
		"password_expires_at": nil, "options": u.Options,
		"links": selfLink(r, "/v3/users/"+u.ID),
	}
	if u.Email != "" {
		b["email"] = u.Email
	}
	if u.Description != "" {
		b["description"] = u.Description
	}
	if u.DefaultProjectID != "" {
		b["default_project_id"] = u.DefaultProjectID
	}
	for k, v := range u.Extra {
		if _, taken := b[k]; !taken {
			b[k] = v
		}
	}
	return b
}

func (s *Service) listUsers(r *http.Request) (*api.Response, error) {
	where, args := filters(r.URL.Query(), "name", "domain_id", "enabled")
	us, err := listUsers(r.Context(), s.db, where, args...)
	if err != nil {
		return nil, err
	}
	out := make([]map[string]any, 0, len(us))
	for i := range us {
		out = append(out, userBody(r, &us[i]))
	}
	return api.JSON(http.StatusOK, map[string]any{"users": out, "links": collectionLinks(r)}), nil
}

func findUser(ctx context.Context, q store.Querier, id string) (*User, error) {
	u, err := GetUser(ctx, q, id)
	if errors.Is(err, store.ErrNotFound) {
		return nil, api.NotFound("Could not find user: %s.", id)
	}
	return u, err
}

// selfOrAdmin is Keystone's "admin_required or user_id:%(target.user.id)s".
func selfOrAdmin(r *http.Request, userID, action string) error {
	if c := api.CallerFrom(r.Context()); !c.IsAdmin() && c.UserID != userID {
		return forbidden(action)
	}
	return nil
}

func (s *Service) getUser(r *http.Request) (*api.Response, error) {
	id := r.PathValue("id")
	if err := selfOrAdmin(r, id, "identity:get_user"); err != nil {
		return nil, err
	}
	u, err := findUser(r.Context(), s.db, id)
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, map[string]any{"user": userBody(r, u)}), nil
}

type userRequest struct {
	Name             *string `json:"name"`
	DomainID         *string `json:"domain_id"`
	Password         *string `json:"password"`
	Enabled          *bool   `json:"enabled"`
	Email            *string `json:"email"`
	Description      *string `json:"description"`
	DefaultProjectID *string `json:"default_project_id"`
	// Options are Keystone's user options (mfa.go).
	Options json.RawMessage `json:"options"`
	// Extra is every other attribute, which Keystone keeps as given.
	Extra map[string]any `json:"-"`
}

// userAttrs are the user attributes with a meaning of their own; the rest
// are extra. "links" and "password_expires_at" are Keystone's and not
// stored.
var userAttrs = []string{"id", "name", "domain_id", "password", "enabled", "email", "description",
	"default_project_id", "options", "links", "password_expires_at"}

// UnmarshalJSON reads the known attributes and keeps the others in Extra.
func (u *userRequest) UnmarshalJSON(b []byte) error {
	type plain userRequest
	if err := json.Unmarshal(b, (*plain)(u)); err != nil {
		return err
	}
	var all map[string]any
	if err := json.Unmarshal(b, &all); err != nil {
		return err
	}
	for _, k := range userAttrs {
		delete(all, k)
	}
	if len(all) > 0 {
		u.Extra = all
	}
	return nil
}

// maxPassword bounds what is hashed; Keystone's default
// [identity] max_password_length is 4096.
const maxPassword = 4096

func checkPassword(pw *string) error {
	if pw != nil && len(*pw) > maxPassword {
		return api.Forbidden("The password length must be less than or equal to %d. The server could not comply with the request because the password is invalid.", maxPassword)
	}
	return nil
}

func (s *Service) createUser(r *http.Request) (*api.Response, error) {
	var req userRequest
	if err := decodeEntity(r, "user", &req); err != nil {
		return nil, err
	}
	if err := checkName(req.Name, 255); err != nil {
		return nil, err
	}
	if err := checkPassword(req.Password); err != nil {
		return nil, err
	}
	ctx := r.Context()
	u := &User{ID: NewID(), Name: *req.Name, DomainID: callerDomain(ctx), Enabled: true, CreatedAt: s.now()}
	setIf(&u.DomainID, req.DomainID)
	setIf(&u.Enabled, req.Enabled)
	setIf(&u.Email, req.Email)
	setIf(&u.Description, req.Description)
	setIf(&u.DefaultProjectID, req.DefaultProjectID)
	u.Extra = req.Extra
	if err := applyOptions(&u.Options, req.Options); err != nil {
		return nil, err
	}
	// Hash outside the transaction: argon2id takes tens of milliseconds.
	if req.Password != nil {
		var err error
		if u.PasswordHash, err = s.hashPassword(r.Context(), *req.Password); err != nil {
			return nil, err
		}
	}
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		if err := needDomain(ctx, tx, u.DomainID, api.NotFound); err != nil {
			return err
		}
		tx.AfterCommit(s.cache.invalidate)
		return insertUser(ctx, tx, u)
	})
	return saved(r, err, http.StatusCreated, "user", u, userBody)
}

// updateUser changes a user. Disabling it or setting its password revokes
// its tokens, as Keystone's identity manager does.
func (s *Service) updateUser(r *http.Request) (*api.Response, error) {
	id := r.PathValue("id")
	var req userRequest
	if err := decodeEntity(r, "user", &req); err != nil {
		return nil, err
	}
	if req.Name != nil {
		if err := checkName(req.Name, 255); err != nil {
			return nil, err
		}
	}
	if err := checkPassword(req.Password); err != nil {
		return nil, err
	}
	ctx := r.Context()
	hash := ""
	if req.Password != nil {
		var err error
		if hash, err = s.hashPassword(ctx, *req.Password); err != nil {
			return nil, err
		}
	}
	var u *User
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		var err error
		if u, err = findUser(ctx, tx, id); err != nil {
			return err
		}
		if req.DomainID != nil && *req.DomainID != u.DomainID {
			return api.BadRequest("Cannot change Domain ID")
		}
		setIf(&u.Name, req.Name)
		setIf(&u.Enabled, req.Enabled)
		setIf(&u.Email, req.Email)
		setIf(&u.Description, req.Description)
		setIf(&u.DefaultProjectID, req.DefaultProjectID)
		if err := applyOptions(&u.Options, req.Options); err != nil {
			return err
		}
		for k, v := range req.Extra {
			if u.Extra == nil {
				u.Extra = map[string]any{}
			}
			u.Extra[k] = v
		}
		if req.Password != nil {
			u.PasswordHash = hash
		}
		if err := updateUser(ctx, tx, u); err != nil {
			return err
		}
		if req.Enabled != nil && *req.Enabled {
			if err := resetFailuresTx(ctx, tx, u.ID); err != nil {
				return err
			}
		}
		if !u.Enabled || req.Password != nil {
			if _, err := tx.Exec(ctx, "DELETE FROM tokens WHERE user_id = ?", u.ID); err != nil {
				return err
			}
		}
		tx.AfterCommit(s.cache.invalidate)
		return nil
	})
	return saved(r, err, http.StatusOK, "user", u, userBody)
}

func (s *Service) deleteUser(r *http.Request) (*api.Response, error) {
	id := r.PathValue("id")
	ctx := r.Context()
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		if _, err := findUser(ctx, tx, id); err != nil {
			return err
		}
		if err := execEach(ctx, tx, id,
			"DELETE FROM tokens WHERE user_id = ?",
			"DELETE FROM role_assignments WHERE user_id = ?",
			"DELETE FROM users WHERE id = ?",
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

// changePassword is POST /v3/users/{id}/password: a user changes its own
// password given the current one. A wrong original password, an unknown or
// a disabled user are all the same 401, and the user's tokens are revoked.
func (s *Service) changePassword(r *http.Request) (*api.Response, error) {
	id := r.PathValue("id")
	var req struct {
		OriginalPassword *string `json:"original_password"`
		Password         *string `json:"password"`
	}
	if err := decodeEntity(r, "user", &req); err != nil {
		return nil, err
	}
	if req.OriginalPassword == nil {
		return nil, api.BadRequest("'original_password' is a required property")
	}
	if req.Password == nil {
		return nil, api.BadRequest("'password' is a required property")
	}
	if err := checkPassword(req.Password); err != nil {
		return nil, err
	}
	ctx := r.Context()
	u, err := s.passwordLogin(ctx, api.ClientAddress(r), func() (*User, error) {
		return GetUser(ctx, s.db, id)
	}, *req.OriginalPassword)
	if err != nil {
		return nil, err
	}
	hash, err := s.hashPassword(ctx, *req.Password)
	if err != nil {
		return nil, err
	}
	err = s.db.Tx(ctx, func(tx *store.Tx) error {
		res, err := tx.Exec(ctx, "UPDATE users SET password_hash = ? WHERE id = ? AND password_hash = ?",
			hash, id, u.PasswordHash)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			// Changed or deleted since we checked the original password.
			return api.Unauthorized()
		}
		if _, err := tx.Exec(ctx, "DELETE FROM tokens WHERE user_id = ?", id); err != nil {
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

// userProjects lists the projects a user holds a role on.
func (s *Service) userProjects(r *http.Request) (*api.Response, error) {
	id := r.PathValue("id")
	if err := selfOrAdmin(r, id, "identity:list_user_projects"); err != nil {
		return nil, err
	}
	if _, err := findUser(r.Context(), s.db, id); err != nil {
		return nil, err
	}
	where := "id IN (SELECT project_id FROM role_assignments WHERE user_id = ?)"
	args := []any{id}
	if w, a := filters(r.URL.Query(), "name", "domain_id", "enabled"); w != "" {
		where += " AND " + w
		args = append(args, a...)
	}
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
