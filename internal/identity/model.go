package identity

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"time"

	"github.com/google/uuid"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// DefaultDomainID is Keystone's default domain.
const (
	DefaultDomainID   = "default"
	DefaultDomainName = "Default"
)

// Domain is a Keystone domain.
type Domain struct {
	ID, Name, Description string
	Enabled               bool
}

// Project is a Keystone project: one customer account in Nimbus.
type Project struct {
	ID, Name, DomainID, Description string
	Enabled                         bool
	Tags                            []string
	CreatedAt                       time.Time
}

// User is a Keystone user.
type User struct {
	ID, Name, DomainID, Email, Description, DefaultProjectID string
	PasswordHash                                             string
	Enabled                                                  bool
	CreatedAt                                                time.Time
	// Extra holds the attributes Keystone has no column for, returned as
	// top-level fields.
	Extra map[string]any
	// Options are Keystone's user options Nimbus implements (mfa.go).
	Options UserOptions
}

// Role is a Keystone role.
type Role struct {
	ID, Name, Description string
}

// NewID returns a Keystone-style id: 32 lower-case hex digits.
func NewID() string { return strings.ReplaceAll(uuid.NewString(), "-", "") }

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// setIf sets *dst to *v when a request gave v.
func setIf[T any](dst *T, v *T) {
	if v != nil {
		*dst = *v
	}
}

// execEach runs each statement with arg, in order, in tx.
func execEach(ctx context.Context, tx *store.Tx, arg any, statements ...string) error {
	for _, q := range statements {
		if _, err := tx.Exec(ctx, q, arg); err != nil {
			return err
		}
	}
	return nil
}

// --- domains

// scanner is a row: *sql.Row or *sql.Rows.
type scanner interface{ Scan(...any) error }

// found turns a missing row into store.ErrNotFound.
func found(err error) error {
	if err == sql.ErrNoRows {
		return store.ErrNotFound
	}
	return err
}

// readAll reads every row of a query with scan; rows and err are the
// query's results.
func readAll[T any](rows *sql.Rows, err error, scan func(scanner) (*T, error)) ([]T, error) {
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []T{}
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, *v)
	}
	return out, rows.Err()
}

// selectWhere is the SELECT of cols from table, filtered by where unless
// it is empty.
func selectWhere(cols, table, where string) string {
	if where == "" {
		return "SELECT " + cols + " FROM " + table
	}
	return "SELECT " + cols + " FROM " + table + " WHERE " + where
}

// --- domains

const domainCols = "id, name, description, enabled"

func scanDomain(s scanner) (*Domain, error) {
	var d Domain
	var enabled int
	if err := s.Scan(&d.ID, &d.Name, &d.Description, &enabled); err != nil {
		return nil, found(err)
	}
	d.Enabled = enabled == 1
	return &d, nil
}

func getDomain(ctx context.Context, q store.Querier, where string, arg any) (*Domain, error) {
	return scanDomain(q.QueryRow(ctx, selectWhere(domainCols, "domains", where), arg))
}

// needDomain refuses with missing (Keystone answers 400 or 404 by API) a
// domain id that names no domain.
func needDomain(ctx context.Context, q store.Querier, id string, missing func(string, ...any) *api.Error) error {
	_, err := getDomain(ctx, q, "id = ?", id)
	if errors.Is(err, store.ErrNotFound) {
		return missing("Could not find domain: %s.", id)
	}
	return err
}

// callerDomain is the domain of the caller's token, where a project or
// user it makes goes unless it names one.
func callerDomain(ctx context.Context) string {
	if d := api.CallerFrom(ctx).DomainID; d != "" {
		return d
	}
	return DefaultDomainID
}

func listDomains(ctx context.Context, q store.Querier) ([]Domain, error) {
	rows, err := q.Query(ctx, "SELECT "+domainCols+" FROM domains ORDER BY name")
	return readAll(rows, err, scanDomain)
}

// --- projects

const projectCols = "id, name, domain_id, description, enabled, tags, created_at"

func scanProject(s scanner) (*Project, error) {
	var p Project
	var enabled int
	var tags, created string
	if err := s.Scan(&p.ID, &p.Name, &p.DomainID, &p.Description, &enabled, &tags, &created); err != nil {
		return nil, found(err)
	}
	p.Enabled = enabled == 1
	p.CreatedAt = store.ParseTime(created)
	store.FromJSON(tags, &p.Tags)
	if p.Tags == nil {
		p.Tags = []string{}
	}
	return &p, nil
}

// GetProject loads a project by id.
func GetProject(ctx context.Context, q store.Querier, id string) (*Project, error) {
	return scanProject(q.QueryRow(ctx, "SELECT "+projectCols+" FROM projects WHERE id = ?", id))
}

func getProjectByName(ctx context.Context, q store.Querier, domainID, name string) (*Project, error) {
	return scanProject(q.QueryRow(ctx, "SELECT "+projectCols+" FROM projects WHERE domain_id = ? AND name = ?", domainID, name))
}

func listProjects(ctx context.Context, q store.Querier, where string, args ...any) ([]Project, error) {
	rows, err := q.Query(ctx, selectWhere(projectCols, "projects", where)+" ORDER BY name", args...)
	return readAll(rows, err, scanProject)
}

func insertProject(ctx context.Context, tx *store.Tx, p *Project) error {
	if p.Tags == nil {
		p.Tags = []string{}
	}
	_, err := tx.Exec(ctx, "INSERT INTO projects ("+projectCols+") VALUES (?, ?, ?, ?, ?, ?, ?)",
		p.ID, p.Name, p.DomainID, p.Description, b2i(p.Enabled), store.JSON(p.Tags), store.FormatTime(p.CreatedAt))
	return err
}

func updateProject(ctx context.Context, tx *store.Tx, p *Project) error {
	_, err := tx.Exec(ctx, "UPDATE projects SET name = ?, description = ?, enabled = ?, tags = ? WHERE id = ?",
		p.Name, p.Description, b2i(p.Enabled), store.JSON(p.Tags), p.ID)
	return err
}

// --- users

const userCols = "id, name, domain_id, password_hash, enabled, email, description, default_project_id, created_at, extra, options"

func scanUser(s scanner) (*User, error) {
	var u User
	var enabled int
	var created, extra, options string
	if err := s.Scan(&u.ID, &u.Name, &u.DomainID, &u.PasswordHash, &enabled, &u.Email, &u.Description,
		&u.DefaultProjectID, &created, &extra, &options); err != nil {
		return nil, found(err)
	}
	u.Enabled = enabled == 1
	u.CreatedAt = store.ParseTime(created)
	if err := store.FromJSON(extra, &u.Extra); err != nil {
		return nil, err
	}
	if err := store.FromJSON(options, &u.Options); err != nil {
		return nil, err
	}
	return &u, nil
}

// GetUser loads a user by id.
func GetUser(ctx context.Context, q store.Querier, id string) (*User, error) {
	return scanUser(q.QueryRow(ctx, "SELECT "+userCols+" FROM users WHERE id = ?", id))
}

func getUserByName(ctx context.Context, q store.Querier, domainID, name string) (*User, error) {
	return scanUser(q.QueryRow(ctx, "SELECT "+userCols+" FROM users WHERE domain_id = ? AND name = ?", domainID, name))
}

func listUsers(ctx context.Context, q store.Querier, where string, args ...any) ([]User, error) {
	rows, err := q.Query(ctx, selectWhere(userCols, "users", where)+" ORDER BY name", args...)
	return readAll(rows, err, scanUser)
}

func insertUser(ctx context.Context, tx *store.Tx, u *User) error {
	_, err := tx.Exec(ctx, "INSERT INTO users ("+userCols+") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
		u.ID, u.Name, u.DomainID, u.PasswordHash, b2i(u.Enabled), u.Email, u.Description, u.DefaultProjectID,
		store.FormatTime(u.CreatedAt), extraJSON(u.Extra), store.JSON(u.Options))
	return err
}

func updateUser(ctx context.Context, tx *store.Tx, u *User) error {
	_, err := tx.Exec(ctx, `UPDATE users SET name = ?, password_hash = ?, enabled = ?, email = ?, description = ?,
		default_project_id = ?, extra = ?, options = ? WHERE id = ?`,
		u.Name, u.PasswordHash, b2i(u.Enabled), u.Email, u.Description, u.DefaultProjectID, extraJSON(u.Extra),
		store.JSON(u.Options), u.ID)
	return err
}

// --- roles

func scanRole(s scanner) (*Role, error) {
	var r Role
	if err := s.Scan(&r.ID, &r.Name, &r.Description); err != nil {
		return nil, found(err)
	}
	return &r, nil
}

func getRole(ctx context.Context, q store.Querier, where string, arg any) (*Role, error) {
	return scanRole(q.QueryRow(ctx, selectWhere("id, name, description", "roles", where), arg))
}

func listRoles(ctx context.Context, q store.Querier) ([]Role, error) {
	rows, err := q.Query(ctx, "SELECT id, name, description FROM roles ORDER BY name")
	return readAll(rows, err, scanRole)
}

// Assignment is one role held by a user on a project.
type Assignment struct {
	UserID, ProjectID, RoleID string
}

func listAssignments(ctx context.Context, q store.Querier, where string, args ...any) ([]Assignment, error) {
	rows, err := q.Query(ctx, selectWhere("user_id, project_id, role_id", "role_assignments", where)+
		" ORDER BY user_id, project_id, role_id", args...)
	return readAll(rows, err, func(s scanner) (*Assignment, error) {
		var a Assignment
		return &a, s.Scan(&a.UserID, &a.ProjectID, &a.RoleID)
	})
}

// rolesOn returns the roles a user holds on a project.
func rolesOn(ctx context.Context, q store.Querier, userID, projectID string) ([]Role, error) {
	rows, err := q.Query(ctx, `SELECT r.id, r.name, r.description FROM role_assignments a
		JOIN roles r ON r.id = a.role_id WHERE a.user_id = ? AND a.project_id = ? ORDER BY r.name`, userID, projectID)
	return readAll(rows, err, scanRole)
}

func assignRole(ctx context.Context, tx *store.Tx, userID, projectID, roleID string) error {
	_, err := tx.Exec(ctx, "DELETE FROM role_assignments WHERE user_id = ? AND project_id = ? AND role_id = ?",
		userID, projectID, roleID)
	if err != nil {
		return err
	}
	_, err = tx.Exec(ctx, "INSERT INTO role_assignments (user_id, project_id, role_id) VALUES (?, ?, ?)",
		userID, projectID, roleID)
	return err
}

// GetSetting reads a value from the settings table.
func GetSetting(ctx context.Context, q store.Querier, name string) (string, error) {
	var v string
	err := q.QueryRow(ctx, "SELECT value FROM settings WHERE name = ?", name).Scan(&v)
	if err == sql.ErrNoRows {
		return "", store.ErrNotFound
	}
	return v, err
}

// PutSetting writes a value into the settings table.
func PutSetting(ctx context.Context, tx *store.Tx, name, value string) error {
	if _, err := tx.Exec(ctx, "DELETE FROM settings WHERE name = ?", name); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, "INSERT INTO settings (name, value) VALUES (?, ?)", name, value)
	return err
}

func extraJSON(m map[string]any) string {
	if len(m) == 0 {
		return "{}"
	}
	return store.JSON(m)
}
