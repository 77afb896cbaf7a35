package identity

import (
	"context"
	"database/sql"
	"slices"
	"time"

	"nimbus/internal/store"
)

// AppCred is a Keystone application credential: a secret that
// authenticates as its user on one project with some of the user's roles
// there.
type AppCred struct {
	ID, Name, Description, UserID, ProjectID string
	SecretHash                               string
	ExpiresAt                                time.Time // zero: never
	Unrestricted                             bool
	CreatedAt                                time.Time
	Roles                                    []Role
}

// expired reports whether the credential no longer authenticates at now.
func (a *AppCred) expired(now time.Time) bool {
	return !a.ExpiresAt.IsZero() && !now.Before(a.ExpiresAt)
}

// effectiveRoles is what a token of the credential carries: its roles the
// user still holds on the project.
func (a *AppCred) effectiveRoles(held []Role) []Role {
	out := []Role{}
	for _, r := range held {
		if slices.ContainsFunc(a.Roles, func(x Role) bool { return x.ID == r.ID }) {
			out = append(out, r)
		}
	}
	return out
}

const appCredCols = "id, name, description, secret_hash, user_id, project_id, expires_at, unrestricted, created_at"

func scanAppCred(s interface{ Scan(...any) error }) (*AppCred, error) {
	var a AppCred
	var expires, created string
	var unrestricted int
	err := s.Scan(&a.ID, &a.Name, &a.Description, &a.SecretHash, &a.UserID, &a.ProjectID, &expires, &unrestricted, &created)
	if err == sql.ErrNoRows {
		return nil, store.ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	if expires != "" {
		a.ExpiresAt = store.ParseTime(expires)
	}
	a.Unrestricted = unrestricted == 1
	a.CreatedAt = store.ParseTime(created)
	return &a, nil
}

// getAppCred loads one credential with its roles; where names it.
func getAppCred(ctx context.Context, q store.Querier, where string, args ...any) (*AppCred, error) {
	a, err := scanAppCred(q.QueryRow(ctx, "SELECT "+appCredCols+" FROM application_credentials WHERE "+where, args...))
	if err != nil {
		return nil, err
	}
	if a.Roles, err = appCredRoles(ctx, q, a.ID); err != nil {
		return nil, err
	}
	return a, nil
}

func appCredRoles(ctx context.Context, q store.Querier, id string) ([]Role, error) {
	rows, err := q.Query(ctx, `SELECT r.id, r.name, r.description FROM application_credential_roles a
		JOIN roles r ON r.id = a.role_id WHERE a.application_credential_id = ? ORDER BY r.name`, id)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []Role{}
	for rows.Next() {
		var r Role
		if err := rows.Scan(&r.ID, &r.Name, &r.Description); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// listAppCreds lists a user's credentials, by name when name is not nil.
func listAppCreds(ctx context.Context, q store.Querier, userID string, name *string) ([]*AppCred, error) {
	query, args := "SELECT "+appCredCols+" FROM application_credentials WHERE user_id = ?", []any{userID}
	if name != nil {
		query, args = query+" AND name = ?", append(args, *name)
	}
	rows, err := q.Query(ctx, query+" ORDER BY name, id", args...)
	if err != nil {
		return nil, err
	}
	var out []*AppCred
	for rows.Next() {
		a, err := scanAppCred(rows)
		if err != nil {
			rows.Close()
			return nil, err
		}
		out = append(out, a)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for _, a := range out {
		if a.Roles, err = appCredRoles(ctx, q, a.ID); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func insertAppCred(ctx context.Context, tx *store.Tx, a *AppCred) error {
	expires := ""
	if !a.ExpiresAt.IsZero() {
		expires = store.FormatTime(a.ExpiresAt)
	}
	_, err := tx.Exec(ctx, "INSERT INTO application_credentials ("+appCredCols+") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
		a.ID, a.Name, a.Description, a.SecretHash, a.UserID, a.ProjectID, expires, b2i(a.Unrestricted),
		store.FormatTime(a.CreatedAt))
	if err != nil {
		return err
	}
	for _, r := range a.Roles {
		if _, err := tx.Exec(ctx, "INSERT INTO application_credential_roles (application_credential_id, role_id) VALUES (?, ?)",
			a.ID, r.ID); err != nil {
			return err
		}
	}
	return nil
}

// deleteAppCred removes a credential and revokes the tokens issued for it.
func deleteAppCred(ctx context.Context, tx *store.Tx, id string) (bool, error) {
	if _, err := tx.Exec(ctx, "DELETE FROM tokens WHERE app_cred_id = ?", id); err != nil {
		return false, err
	}
	if _, err := tx.Exec(ctx, "DELETE FROM application_credential_roles WHERE application_credential_id = ?", id); err != nil {
		return false, err
	}
	res, err := tx.Exec(ctx, "DELETE FROM application_credentials WHERE id = ?", id)
	if err != nil {
		return false, err
	}
	n, _ := res.RowsAffected()
	return n > 0, nil
}
