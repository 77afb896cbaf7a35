package identity

import (
	"context"
	"errors"
	"net/http"
	"unicode/utf8"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// Keystone's credentials (keystone/api/credentials.py): secrets a user keeps
// in identity by type. Identity reads those of type "totp" to check
// passcodes. A credential is its owner's: a user makes, reads, changes and
// deletes their own (not with a restricted application credential's
// token); an admin may list, read and delete anyone's, but the blob of
// another user's TOTP credential (a second factor's secret) is shown to no
// one but its owner.

const (
	credTOTP = "totp"
	// maxCredentialsPerUser and maxBlob bound what one user can store.
	maxCredentialsPerUser = 20
	maxBlob               = 8192
)

// Credential is a Keystone credential.
type Credential struct {
	ID, UserID, ProjectID, Type, Blob string
}

const credentialCols = "id, user_id, project_id, type, blob"

func listCredentials(ctx context.Context, q store.Querier, where string, args ...any) ([]Credential, error) {
	rows, err := q.Query(ctx, selectWhere(credentialCols, "credentials", where)+" ORDER BY created_at, id", args...)
	return readAll(rows, err, func(s scanner) (*Credential, error) {
		var c Credential
		return &c, s.Scan(&c.ID, &c.UserID, &c.ProjectID, &c.Type, &c.Blob)
	})
}

func getCredential(ctx context.Context, q store.Querier, id string) (*Credential, error) {
	cs, err := listCredentials(ctx, q, "id = ?", id)
	if err != nil {
		return nil, err
	}
	if len(cs) == 0 {
		return nil, store.ErrNotFound
	}
	return &cs[0], nil
}

// insertCredential stores c, refusing a user's credential beyond the bound.
func (s *Service) insertCredential(ctx context.Context, tx *store.Tx, c *Credential) error {
	var n int
	if err := tx.QueryRow(ctx, "SELECT COUNT(*) FROM credentials WHERE user_id = ?", c.UserID).Scan(&n); err != nil {
		return err
	}
	if n >= maxCredentialsPerUser {
		return api.Forbidden("A user may have at most %d credentials.", maxCredentialsPerUser)
	}
	_, err := tx.Exec(ctx, "INSERT INTO credentials (id, user_id, project_id, type, blob, created_at) VALUES (?, ?, ?, ?, ?, ?)",
		c.ID, c.UserID, c.ProjectID, c.Type, c.Blob, store.FormatTime(s.now()))
	return err
}

func (s *Service) credentialRoutes() []api.Route {
	return []api.Route{
		{Pattern: "GET /v3/credentials", Handler: s.listCredentials},
		{Pattern: "POST /v3/credentials", Handler: s.createCredential},
		{Pattern: "GET /v3/credentials/{id}", Handler: s.getCredential},
		{Pattern: "PATCH /v3/credentials/{id}", Handler: s.updateCredential},
		{Pattern: "DELETE /v3/credentials/{id}", Handler: s.deleteCredential},
	}
}

// credentialBody renders c for caller as Keystone does, without the blob of
// a TOTP credential that is not the caller's.
func credentialBody(r *http.Request, c *Credential) map[string]any {
	b := map[string]any{
		"id": c.ID, "user_id": c.UserID, "type": c.Type, "project_id": nil,
		"links": selfLink(r, "/v3/credentials/"+c.ID),
	}
	if c.ProjectID != "" {
		b["project_id"] = c.ProjectID
	}
	if c.Type != credTOTP || api.CallerFrom(r.Context()).UserID == c.UserID {
		b["blob"] = c.Blob
	}
	return b
}

// credentialRequest is the body of a create or update.
type credentialRequest struct {
	Blob      *string `json:"blob"`
	Type      *string `json:"type"`
	UserID    *string `json:"user_id"`
	ProjectID *string `json:"project_id"`
}

// validCredential checks c as it would be stored.
func validCredential(c *Credential) error {
	switch {
	case c.Type == "" || utf8.RuneCountInString(c.Type) > 255:
		return api.BadRequest("Invalid input for field 'type': it must be a string of 1 to 255 characters.")
	case len(c.Blob) > maxBlob:
		return api.BadRequest("Invalid input for field 'blob': it is longer than %d bytes.", maxBlob)
	case c.Type == "ec2":
		// EC2 credentials sign EC2 API requests, which Nimbus does not serve.
		return api.BadRequest("Credentials of type ec2 are not supported by this cloud.")
	case c.Type == credTOTP:
		if _, err := decodeTOTPSecret(c.Blob); err != nil {
			return api.BadRequest("Invalid input for field 'blob': a totp credential's blob is a base32 secret of %d to %d bytes.",
				minTOTPKey, maxTOTPKey)
		}
	}
	return nil
}

// credentialProject checks that the owner may name project id (one they
// hold a role on; any existing one for an admin).
func credentialProject(r *http.Request, q store.Querier, ownerID, id string) error {
	if id == "" {
		return nil
	}
	p, err := GetProject(r.Context(), q, id)
	if errors.Is(err, store.ErrNotFound) {
		return api.BadRequest("Could not find project: %s.", id)
	}
	if err != nil || api.CallerFrom(r.Context()).IsAdmin() {
		return err
	}
	roles, err := rolesOn(r.Context(), q, ownerID, p.ID)
	if err == nil && len(roles) == 0 {
		return forbidden("identity:create_credential")
	}
	return err
}

// unrestricted refuses the token of a restricted application credential,
// as Keystone refuses it for managing application credentials: a leaked
// one must not be able to add a second factor of its holder's choosing.
func (s *Service) unrestricted(r *http.Request) error {
	t, err := s.callerToken(r)
	if err != nil {
		return err
	}
	if t.AppCred != nil && !t.AppCred.Unrestricted {
		return forbidden("Using method 'application_credential' is not allowed for managing credentials")
	}
	return nil
}

func (s *Service) createCredential(r *http.Request) (*api.Response, error) {
	if err := s.unrestricted(r); err != nil {
		return nil, err
	}
	var req credentialRequest
	if err := decodeEntity(r, "credential", &req); err != nil {
		return nil, err
	}
	for _, f := range []struct {
		name string
		v    *string
	}{{"blob", req.Blob}, {"type", req.Type}, {"user_id", req.UserID}} {
		if f.v == nil {
			return nil, api.BadRequest("'%s' is a required property", f.name)
		}
	}
	// keystone/common/policies/credential.py: ADMIN_OR_CRED_OWNER.
	if err := selfOrAdmin(r, *req.UserID, "identity:create_credential"); err != nil {
		return nil, err
	}
	c := &Credential{ID: NewID(), UserID: *req.UserID, Type: *req.Type, Blob: *req.Blob}
	setIf(&c.ProjectID, req.ProjectID)
	if err := validCredential(c); err != nil {
		return nil, err
	}
	if err := credentialProject(r, s.db, c.UserID, c.ProjectID); err != nil {
		return nil, err
	}
	ctx := r.Context()
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		if _, err := findUser(ctx, tx, c.UserID); err != nil {
			return api.BadRequest("Could not find user: %s.", c.UserID)
		}
		return s.insertCredential(ctx, tx, c)
	})
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusCreated, map[string]any{"credential": credentialBody(r, c)}), nil
}

// listCredentials is Keystone's list: a user sees their own credentials, an
// admin everyone's; user_id and type filter.
func (s *Service) listCredentials(r *http.Request) (*api.Response, error) {
	c := api.CallerFrom(r.Context())
	where, args := filters(r.URL.Query(), "user_id", "type")
	if !c.IsAdmin() {
		if where != "" {
			where += " AND "
		}
		where, args = where+"user_id = ?", append(args, c.UserID)
	}
	cs, err := listCredentials(r.Context(), s.db, where, args...)
	if err != nil {
		return nil, err
	}
	out := make([]map[string]any, 0, len(cs))
	for i := range cs {
		out = append(out, credentialBody(r, &cs[i]))
	}
	return api.JSON(http.StatusOK, map[string]any{"credentials": out, "links": collectionLinks(r)}), nil
}

// findCredential loads the credential in the path for its owner or an
// admin; anyone else gets the same 404 as for none.
func (s *Service) findCredential(r *http.Request, q store.Querier) (*Credential, error) {
	id := r.PathValue("id")
	c, err := getCredential(r.Context(), q, id)
	if err == nil {
		if caller := api.CallerFrom(r.Context()); caller.UserID != c.UserID && !caller.IsAdmin() {
			err = store.ErrNotFound
		}
	}
	if errors.Is(err, store.ErrNotFound) {
		return nil, api.NotFound("Could not find credential: %s.", id)
	}
	return c, err
}

func (s *Service) getCredential(r *http.Request) (*api.Response, error) {
	c, err := s.findCredential(r, s.db)
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, map[string]any{"credential": credentialBody(r, c)}), nil
}

// updateCredential changes a credential's blob, type or project. Its owner
// never changes: moving a credential to another user is how Keystone's
// OSSA-2020-005 let one user's TOTP secret sign in as another.
func (s *Service) updateCredential(r *http.Request) (*api.Response, error) {
	if err := s.unrestricted(r); err != nil {
		return nil, err
	}
	var req credentialRequest
	if err := decodeEntity(r, "credential", &req); err != nil {
		return nil, err
	}
	ctx := r.Context()
	var c *Credential
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		var err error
		if c, err = s.findCredential(r, tx); err != nil {
			return err
		}
		if req.UserID != nil && *req.UserID != c.UserID {
			return forbidden("identity:update_credential")
		}
		setIf(&c.Blob, req.Blob)
		setIf(&c.Type, req.Type)
		setIf(&c.ProjectID, req.ProjectID)
		if err := validCredential(c); err != nil {
			return err
		}
		if err := credentialProject(r, tx, c.UserID, c.ProjectID); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, "UPDATE credentials SET type = ?, blob = ?, project_id = ? WHERE id = ?",
			c.Type, c.Blob, c.ProjectID, c.ID)
		return err
	})
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, map[string]any{"credential": credentialBody(r, c)}), nil
}

func (s *Service) deleteCredential(r *http.Request) (*api.Response, error) {
	if err := s.unrestricted(r); err != nil {
		return nil, err
	}
	ctx := r.Context()
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		c, err := s.findCredential(r, tx)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, "DELETE FROM credentials WHERE id = ?", c.ID)
		return err
	})
	if err != nil {
		return nil, err
	}
	return api.Empty(http.StatusNoContent), nil
}
