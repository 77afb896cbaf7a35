package identity

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/http"
	"net/mail"
	"strings"
	"unicode"
	"unicode/utf8"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// Registration is a customer signing up through the panel: an e-mail that
// becomes the user's name, a password already hashed with HashPassword,
// and the project's name ("" to derive one from the e-mail).
type Registration struct {
	Email, PasswordHash, ProjectName string
}

// Registered is what Register made.
type Registered struct {
	UserID, ProjectID, ProjectName string
}

// maxEmail bounds an e-mail address (RFC 5321's path limit is 256).
const maxEmail = 254

// Register makes a customer in one transaction: a project in the default
// domain, a user named by the lower-cased e-mail with default_project_id on
// it, the member role there, and whatever the project hooks make (network,
// billing account). Any failure leaves nothing; a taken name is a 409.
func (s *Service) Register(ctx context.Context, r Registration) (*Registered, error) {
	email := strings.ToLower(strings.TrimSpace(r.Email))
	if err := checkRegistration(email, r); err != nil {
		return nil, err
	}
	var out *Registered
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		var err error
		out, err = s.register(ctx, tx, email, r)
		return err
	})
	if errors.Is(err, store.ErrConflict) {
		// A concurrent registration of the same e-mail won the insert.
		return nil, conflict("user", email, DefaultDomainID)
	}
	if err != nil {
		return nil, err
	}
	return out, nil
}

// ValidEmail is whether s is one bare e-mail address: parsed by net/mail
// to the same address (no display name, comment, quoting or second
// address, which a filter of characters let through), at most 254 bytes,
// whose domain is a host name of two labels or more (no address literal).
// Identity's registration and the panel's forms ask it.
func ValidEmail(s string) bool {
	if s == "" || len(s) > maxEmail || !utf8.ValidString(s) {
		return false
	}
	a, err := mail.ParseAddress(s)
	if err != nil || a.Name != "" || a.Address != s {
		return false
	}
	domain := s[strings.LastIndexByte(s, '@')+1:]
	labels := strings.Split(domain, ".")
	if len(labels) < 2 {
		return false
	}
	for _, l := range labels {
		if l == "" || len(l) > 63 || strings.HasPrefix(l, "-") || strings.HasSuffix(l, "-") ||
			strings.IndexFunc(l, func(r rune) bool { return r != '-' && !unicode.IsLetter(r) && !unicode.IsDigit(r) }) >= 0 {
			return false
		}
	}
	return true
}

func checkRegistration(email string, r Registration) error {
	if !ValidEmail(email) {
		return api.BadRequest("Invalid input for field 'email': %q is not a valid e-mail address.", r.Email)
	}
	// Only a hash made by HashPassword is stored, never a password by
	// mistake.
	if !strings.HasPrefix(r.PasswordHash, "$argon2id$") {
		return api.BadRequest("Invalid input for field 'password': not an argon2id hash.")
	}
	if r.ProjectName != "" {
		return checkName(&r.ProjectName, 64)
	}
	return nil
}

// register is Register's transaction.
func (s *Service) register(ctx context.Context, tx *store.Tx, email string, r Registration) (*Registered, error) {
	if _, err := getUserByName(ctx, tx, DefaultDomainID, email); err == nil {
		return nil, conflict("user", email, DefaultDomainID)
	} else if !errors.Is(err, store.ErrNotFound) {
		return nil, err
	}
	member, err := getRole(ctx, tx, "name = ?", "member")
	if err != nil {
		return nil, err // Bootstrap makes it; missing is our fault
	}
	name, err := s.projectNameFor(ctx, tx, email, r.ProjectName)
	if err != nil {
		return nil, err
	}
	now := s.now()
	p := &Project{ID: NewID(), Name: name, DomainID: DefaultDomainID, Enabled: true, CreatedAt: now}
	u := &User{ID: NewID(), Name: email, DomainID: DefaultDomainID, Email: email, Enabled: true,
		PasswordHash: r.PasswordHash, DefaultProjectID: p.ID, CreatedAt: now}
	if err := insertProject(ctx, tx, p); err != nil {
		return nil, err
	}
	if err := insertUser(ctx, tx, u); err != nil {
		return nil, err
	}
	if err := assignRole(ctx, tx, u.ID, p.ID, member.ID); err != nil {
		return nil, err
	}
	if err := s.projectCreated(ctx, tx, p.ID); err != nil {
		return nil, err
	}
	tx.AfterCommit(s.cache.invalidate)
	return &Registered{UserID: u.ID, ProjectID: p.ID, ProjectName: p.Name}, nil
}

// projectNameFor is the given name if free (else a 409), or one derived
// from the e-mail's local part with a random suffix.
func (s *Service) projectNameFor(ctx context.Context, q store.Querier, email, given string) (string, error) {
	if given != "" {
		if _, err := getProjectByName(ctx, q, DefaultDomainID, given); err == nil {
			return "", conflict("project", given, DefaultDomainID)
		} else if !errors.Is(err, store.ErrNotFound) {
			return "", err
		}
		return given, nil
	}
	base := projectBase(email)
	for range 5 {
		name := base + "-" + randomHex(3)
		_, err := getProjectByName(ctx, q, DefaultDomainID, name)
		if errors.Is(err, store.ErrNotFound) {
			return name, nil
		}
		if err != nil {
			return "", err
		}
	}
	return "", api.Errorf(http.StatusServiceUnavailable, "Could not find a free project name; retry later.")
}

// projectBase is the e-mail's local part kept to letters, digits, '.',
// '_' and '-', at most 40 of them, so the name stays readable in the CLI.
func projectBase(email string) string {
	local, _, _ := strings.Cut(email, "@")
	var b strings.Builder
	for _, c := range local {
		if b.Len() >= 40 {
			break
		}
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '.', c == '_', c == '-':
			b.WriteRune(c)
		}
	}
	if b.Len() == 0 {
		return "project"
	}
	return b.String()
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// UserByName finds a user in the default domain by name, or by the
// lower-cased name (Register's users are named by the lower-cased e-mail);
// an unknown name is store.ErrNotFound.
func (s *Service) UserByName(ctx context.Context, name string) (*User, error) {
	u, err := getUserByName(ctx, s.db, DefaultDomainID, name)
	if lower := strings.ToLower(name); errors.Is(err, store.ErrNotFound) && lower != name {
		u, err = getUserByName(ctx, s.db, DefaultDomainID, lower)
	}
	return u, err
}

// SetPassword sets a user's password without the old one (the panel's
// password reset, after the user proved the e-mail is theirs): the new hash
// is stored, the user's tokens are revoked and its lockout cleared, in one
// transaction.
func (s *Service) SetPassword(ctx context.Context, userID, password string) error {
	if err := checkPassword(&password); err != nil {
		return err
	}
	hash, err := s.hashPassword(ctx, password)
	if err != nil {
		return err
	}
	return s.db.Tx(ctx, func(tx *store.Tx) error {
		res, err := tx.Exec(ctx, "UPDATE users SET password_hash = ?, failed_auth_count = 0, failed_auth_at = '' WHERE id = ?",
			hash, userID)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return api.NotFound("Could not find user: %s.", userID)
		}
		if _, err := tx.Exec(ctx, "DELETE FROM tokens WHERE user_id = ?", userID); err != nil {
			return err
		}
		tx.AfterCommit(s.cache.invalidate)
		return nil
	})
}
