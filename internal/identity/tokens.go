package identity

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"database/sql"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// Token is an issued token as stored, with what it is scoped to.
type Token struct {
	ID        string // the secret; only known right after issue
	Hash      string
	UserID    string
	ProjectID string
	Methods   []string
	AuditID   string
	IssuedAt  time.Time
	ExpiresAt time.Time
	AppCredID string // the application credential it was issued for, if any
}

// tokenInfo is a token with the records it names, enough to render its body.
type tokenInfo struct {
	Token
	User    *User
	Domain  *Domain
	Project *Project
	PDomain *Domain
	Roles   []Role
	AppCred *AppCred // nil unless issued for an application credential
}

// cacheTTL bounds how long a validated token is trusted without a database
// read. A local revocation or any change to users, projects or roles drops
// the cache at once; other controllers see it within this time, as
// keystonemiddleware's own token cache behaves.
const cacheTTL = 15 * time.Second

type cached struct {
	info   *tokenInfo
	caller *api.Caller
	until  time.Time
	gen    uint64
}

type tokenCache struct {
	mu  sync.RWMutex
	m   map[string]cached
	gen atomic.Uint64
}

func (c *tokenCache) get(hash string, now time.Time) (cached, bool) {
	c.mu.RLock()
	e, ok := c.m[hash]
	c.mu.RUnlock()
	if !ok || e.gen != c.gen.Load() || now.After(e.until) {
		return cached{}, false
	}
	return e, true
}

func (c *tokenCache) put(hash string, e cached) {
	c.mu.Lock()
	if len(c.m) > 100_000 {
		c.m = map[string]cached{}
	}
	c.m[hash] = e
	c.mu.Unlock()
}

func (c *tokenCache) drop(hash string) {
	c.mu.Lock()
	delete(c.m, hash)
	c.mu.Unlock()
}

// invalidate forgets every cached token, after a change to who holds what.
func (c *tokenCache) invalidate() { c.gen.Add(1) }

func hashToken(id string) string {
	sum := sha256.Sum256([]byte(id))
	return hex.EncodeToString(sum[:])
}

func newSecret() string {
	b := make([]byte, 32)
	rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// issue stores a new token for user scoped to projectID ("" for unscoped).
func (s *Service) issue(ctx context.Context, userID, projectID string, methods []string, auditID string, expires time.Time) (*Token, error) {
	return s.issueToken(ctx, &Token{UserID: userID, ProjectID: projectID, Methods: methods, AuditID: auditID, ExpiresAt: expires})
}

// issueToken stores t with a new secret, issued now and expiring within
// TokenTTL (sooner if t.ExpiresAt says so); t.AuditID "" starts a chain.
func (s *Service) issueToken(ctx context.Context, t *Token) (*Token, error) {
	now := s.now()
	if t.ExpiresAt.IsZero() || t.ExpiresAt.After(now.Add(s.TokenTTL)) {
		t.ExpiresAt = now.Add(s.TokenTTL)
	}
	if t.AuditID == "" {
		t.AuditID = newSecret()[:22]
	}
	t.ID, t.IssuedAt = newSecret(), now
	t.Hash = hashToken(t.ID)
	userID := t.UserID
	err := s.db.Tx(ctx, func(tx *store.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO tokens (id_hash, user_id, project_id, methods, audit_id, issued_at, expires_at, app_cred_id)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?)`, t.Hash, t.UserID, t.ProjectID, strings.Join(t.Methods, ","), t.AuditID,
			store.FormatTime(t.IssuedAt), store.FormatTime(t.ExpiresAt), t.AppCredID)
		if err != nil {
			return err
		}
		return s.capTokens(ctx, tx, userID, now)
	})
	return t, err
}

// capTokens revokes the user's oldest live tokens beyond MaxTokensPerUser,
// as a Keystone deployment bounds them, so one customer cannot fill the
// database with tokens.
func (s *Service) capTokens(ctx context.Context, tx *store.Tx, userID string, now time.Time) error {
	limit := s.limits.MaxTokensPerUser
	if limit <= 0 {
		return nil
	}
	// Normally one is over; a lowered limit trims at most 100 per issue.
	rows, err := tx.Query(ctx, `SELECT id_hash FROM tokens WHERE user_id = ? AND expires_at > ?
		ORDER BY issued_at DESC, id_hash DESC LIMIT 100 OFFSET ?`, userID, store.FormatTime(now), limit)
	if err != nil {
		return err
	}
	var old []any
	for rows.Next() {
		var h string
		if err := rows.Scan(&h); err != nil {
			rows.Close()
			return err
		}
		old = append(old, h)
	}
	rows.Close()
	if err := rows.Err(); err != nil || len(old) == 0 {
		return err
	}
	q := "DELETE FROM tokens WHERE id_hash IN (?" + strings.Repeat(", ?", len(old)-1) + ")"
	if _, err := tx.Exec(ctx, q, old...); err != nil {
		return err
	}
	// As revoke: a lookup that read a row before the delete must not keep it.
	tx.AfterCommit(s.cache.invalidate)
	return nil
}

// errTokenNotFound is how an unknown, expired or revoked token is reported.
var errTokenNotFound = errors.New("token not found")

// load reads a token and the records it names. A token whose user, project
// or domain is gone or disabled, or that has expired, is not found.
func (s *Service) load(ctx context.Context, id string) (*tokenInfo, error) {
	var t tokenInfo
	var methods, issued, expires string
	t.Hash = hashToken(id)
	err := s.db.QueryRow(ctx, `SELECT user_id, project_id, methods, audit_id, issued_at, expires_at, app_cred_id
		FROM tokens WHERE id_hash = ?`, t.Hash).Scan(&t.UserID, &t.ProjectID, &methods, &t.AuditID, &issued, &expires, &t.AppCredID)
	if err == sql.ErrNoRows {
		return nil, errTokenNotFound
	}
	if err != nil {
		return nil, err
	}
	t.ID = id
	t.Methods = strings.Split(methods, ",")
	t.IssuedAt = store.ParseTime(issued)
	t.ExpiresAt = store.ParseTime(expires)
	if !s.now().Before(t.ExpiresAt) {
		return nil, errTokenNotFound
	}
	if t.User, err = GetUser(ctx, s.db, t.UserID); err != nil || !t.User.Enabled {
		return nil, errTokenNotFound
	}
	if t.Domain, err = getDomain(ctx, s.db, "id = ?", t.User.DomainID); err != nil || !t.Domain.Enabled {
		return nil, errTokenNotFound
	}
	if t.ProjectID != "" {
		if t.Project, err = GetProject(ctx, s.db, t.ProjectID); err != nil || !t.Project.Enabled {
			return nil, errTokenNotFound
		}
		if t.PDomain, err = getDomain(ctx, s.db, "id = ?", t.Project.DomainID); err != nil {
			return nil, errTokenNotFound
		}
		if t.Roles, err = rolesOn(ctx, s.db, t.UserID, t.ProjectID); err != nil {
			return nil, err
		}
		if err := s.loadAppCred(ctx, &t); err != nil {
			return nil, err
		}
		// A project-scoped token whose roles are all gone is no longer valid.
		if len(t.Roles) == 0 {
			return nil, errTokenNotFound
		}
	}
	return &t, nil
}

func (t *tokenInfo) caller() *api.Caller {
	c := &api.Caller{
		UserID: t.UserID, UserName: t.User.Name, DomainID: t.User.DomainID,
		ProjectID: t.ProjectID, ExpiresAt: t.ExpiresAt, Token: t.ID,
	}
	if t.Project != nil {
		c.ProjectName = t.Project.Name
	}
	for _, r := range t.Roles {
		c.Roles = append(c.Roles, r.Name)
	}
	return c
}

// Validate checks a token from X-Auth-Token and says whom it speaks for.
// It implements api.Authenticator for every service.
func (s *Service) Validate(ctx context.Context, token string) (*api.Caller, error) {
	if len(token) > 512 {
		return nil, api.Unauthorized()
	}
	e, err := s.lookup(ctx, token)
	if errors.Is(err, errTokenNotFound) {
		return nil, api.Unauthorized()
	}
	if err != nil {
		return nil, err
	}
	return e.caller, nil
}

// lookup loads a token through the cache: Keystone's own validate call and
// every service's authentication share it.
func (s *Service) lookup(ctx context.Context, token string) (cached, error) {
	now := s.now()
	hash := hashToken(token)
	if e, ok := s.cache.get(hash, now); ok {
		return e, nil
	}
	// Read the generation before loading, so a change that lands while we
	// read makes this entry stale rather than cached as current.
	gen := s.cache.gen.Load()
	t, err := s.load(ctx, token)
	if err != nil {
		return cached{}, err
	}
	until := now.Add(cacheTTL)
	if t.ExpiresAt.Before(until) {
		until = t.ExpiresAt
	}
	e := cached{info: t, caller: t.caller(), until: until, gen: gen}
	s.cache.put(hash, e)
	return e, nil
}

// revoke deletes a token.
func (s *Service) revoke(ctx context.Context, id string) error {
	hash := hashToken(id)
	s.cache.drop(hash)
	return s.db.Tx(ctx, func(tx *store.Tx) error {
		// Drop every cached entry after commit too: a lookup that read the
		// row before the delete must not keep it cached.
		tx.AfterCommit(s.cache.invalidate)
		_, err := tx.Exec(ctx, "DELETE FROM tokens WHERE id_hash = ?", hash)
		return err
	})
}

// PurgeExpired deletes tokens that expired before now, so the table stays
// small; run from a periodic job.
func (s *Service) PurgeExpired(ctx context.Context) error {
	return s.db.Tx(ctx, func(tx *store.Tx) error {
		_, err := tx.Exec(ctx, "DELETE FROM tokens WHERE expires_at < ?", store.FormatTime(s.now()))
		return err
	})
}
