package identity

import (
	"context"
	"database/sql"
	"strings"
	"time"

	"github.com/google/uuid"

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

// --- domains

func getDomain(ctx context.Context, q store.Querier, where string, arg any) (*Domain, error) {
	var d Domain
	var enabled int
	err := q.QueryRow(ctx, "SELECT id, name, description, enabled FROM domains WHERE "+where, arg).
		Scan(&d.ID, &d.Name, &d.Description, &enabled)
	if err == sql.ErrNoRows {
		return nil, store.ErrNotFound
	}
	d.Enabled = enabled == 1
	return &d, err
}

func listDomains(ctx context.Context, q store.Querier) ([]Domain, error) {
	rows, err := q.Query(ctx, "SELECT id, name, description, enabled FROM domains ORDER BY name")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Domain
	for rows.Next() {
		var d Domain
		var enabled int
		if err := rows.Scan(&d.ID, &d.Name, &d.Description, &enabled); err != nil {
			return nil, err
		}
		d.Enabled = enabled == 1
		out = append(out, d)
	}
	return out, rows.Err()
}

// --- projects

const projectCols = "id, name, domain_id, description, enabled, tags, created_at"

func scanProject(s interface{ Scan(...any) error }) (*Project, error) {
	var p Project
	var enabled int
	var tags, created string
	if err := s.Scan(&p.ID, &p.Name, &p.DomainID, &p.Description, &enabled, &tags, &created); err != nil {
		if err == sql.ErrNoRows {
			return nil, store.ErrNotFound
		}
		return nil, err
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
	query := "SELECT " + projectCols + " FROM projects"
	if where != "" {
		query += " WHERE " + where
	}
	rows, err := q.Query(ctx, query+" ORDER BY name", args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []Project{}
	for rows.Next() {
		p, err := scanProject(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, *p)
	}
	return out, rows.Err()
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

const userCols = "id, name, domain_id, password_hash, enabled, email, description, default_project_id, created_at, extra"

func scanUser(s interface{ Scan(...any) error }) (*User, error) {
	var u User
	var enabled int
	var created, extra string
	if err := s.Scan(&u.ID, &u.Name, &u.DomainID, &u.PasswordHash, &enabled, &u.Email, &u.Description,
		&u.DefaultProjectID, &created, &extra); err != nil {
		if err == sql.ErrNoRows {
			return nil, store.ErrNotFound
		}
		return nil, err
	}
	u.Enabled = enabled == 1
	u.CreatedAt = store.ParseTime(created)
	if err := store.FromJSON(extra, &u.Extra); err != nil {
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
	query := "SELECT " + userCols + " FROM users"
	if where != "" {
		query += " WHERE " + where
	}
	rows, err := q.Query(ctx, query+" ORDER BY name", args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []User{}
	for rows.Next() {
		u, err := scanUser(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, *u)
	}
	return out, rows.Err()
}

func insertUser(ctx context.Context, tx *store.Tx, u *User) error {
	_, err := tx.Exec(ctx, "INSERT INTO users ("+userCols+") VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
		u.ID, u.Name, u.DomainID, u.PasswordHash, b2i(u.Enabled), u.Email, u.Description, u.DefaultProjectID,
		store.FormatTime(u.CreatedAt), extraJSON(u.Extra))
	return err
}

func updateUser(ctx context.Context, tx *store.Tx, u *User) error {
	_, err := tx.Exec(ctx, `UPDATE users SET name = ?, password_hash = ?, enabled = ?, email = ?, description = ?,
		default_project_id = ?, extra = ? WHERE id = ?`,
		u.Name, u.PasswordHash, b2i(u.Enabled), u.Email, u.Description, u.DefaultProjectID, extraJSON(u.Extra), u.ID)
	return err
}

// --- roles

func getRole(ctx context.Context, q store.Querier, where string, arg any) (*Role, error) {
	var r Role
	err := q.QueryRow(ctx, "SELECT id, name, description FROM roles WHERE "+where, arg).Scan(&r.ID, &r.Name, &r.Description)
	if err == sql.ErrNoRows {
		return nil, store.ErrNotFound
	}
	return &r, err
}

func listRoles(ctx context.Context, q store.Querier) ([]Role, error) {
	rows, err := q.Query(ctx, "SELECT id, name, description FROM roles ORDER BY name")
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

// Assignment is one role held by a user on a project.
type Assignment struct {
	UserID, ProjectID, RoleID string
}

func listAssignments(ctx context.Context, q store.Querier, where string, args ...any) ([]Assignment, error) {
	query := "SELECT user_id, project_id, role_id FROM role_assignments"
	if where != "" {
		query += " WHERE " + where
	}
	rows, err := q.Query(ctx, query+" ORDER BY user_id, project_id, role_id", args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []Assignment{}
	for rows.Next() {
		var a Assignment
		if err := rows.Scan(&a.UserID, &a.ProjectID, &a.RoleID); err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, rows.Err()
}

// rolesOn returns the roles a user holds on a project.
func rolesOn(ctx context.Context, q store.Querier, userID, projectID string) ([]Role, error) {
	rows, err := q.Query(ctx, `SELECT r.id, r.name, r.description FROM role_assignments a
		JOIN roles r ON r.id = a.role_id WHERE a.user_id = ? AND a.project_id = ? ORDER BY r.name`, userID, projectID)
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
