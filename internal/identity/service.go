// Package identity is Nimbus's Keystone v3: domains, projects, users, roles
// and role assignments; password and token authentication; opaque tokens
// stored hashed; the service catalog; and the first-start bootstrap of the
// admin and demo accounts.
package identity

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// CatalogService is one service in the catalog.
type CatalogService struct {
	Type string // "compute", "identity", …
	Name string // "nova", "keystone", …
	URL  string // public base URL, e.g. https://host:8774/v2.1
}

// Service is the identity service.
type Service struct {
	db       *store.DB
	TokenTTL time.Duration
	Region   string
	catalog  []CatalogService
	cache    tokenCache
	now      func() time.Time

	limits    Limits
	hashSlots chan struct{} // one per password hash allowed at once
	hashing   atomic.Int64  // hashes running now
	hashPeak  atomic.Int64  // the most that ran at once
	limitMu   sync.Mutex    // guards failures and buckets
	failures  *lru[*failureLog]
	buckets   *lru[*bucket]
	turnMu    sync.Mutex       // guards turns
	turns     map[string]*turn // by user id: whose password check runs

	projectHook ProjectHook // nil: nothing else to make with a project; see AddProjectHook
}

// ProjectHook makes what every project has besides itself (its private
// network and default security group, its billing account); identity does
// not know those services, so the controller wires them in with
// AddProjectHook.
type ProjectHook interface {
	// ProjectCreated runs in the transaction that inserts the project, so
	// the project and its defaults are made together or not at all.
	ProjectCreated(ctx context.Context, tx *store.Tx, projectID string) error
}

// SetProjectHook makes h the only hook each project create calls.
func (s *Service) SetProjectHook(h ProjectHook) { s.projectHook = projectHooks{h} }

// New makes the identity service on db, limiting only password hashes (see
// SetLimits).
func New(db *store.DB) *Service {
	s := &Service{
		db: db, TokenTTL: time.Hour, Region: "RegionOne",
		cache: tokenCache{m: map[string]cached{}},
		now:   func() time.Time { return time.Now().UTC() },
	}
	s.SetLimits(Limits{})
	return s
}

// SetCatalog sets the services the catalog lists.
func (s *Service) SetCatalog(c []CatalogService) { s.catalog = c }

// Catalog returns the services the catalog lists.
func (s *Service) Catalog() []CatalogService { return s.catalog }

// stableID derives a Keystone-style id from parts, so catalog ids stay the
// same across restarts and controllers.
func stableID(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))[:32]
}

func (s *Service) catalogBody() []map[string]any {
	out := make([]map[string]any, 0, len(s.catalog))
	for _, c := range s.catalog {
		var eps []map[string]any
		for _, iface := range []string{"public", "internal", "admin"} {
			eps = append(eps, map[string]any{
				"id": stableID("endpoint", c.Type, iface), "interface": iface,
				"region": s.Region, "region_id": s.Region, "url": c.URL,
			})
		}
		out = append(out, map[string]any{"id": stableID("service", c.Type), "type": c.Type, "name": c.Name, "endpoints": eps})
	}
	return out
}

// Account is what Bootstrap makes: one user with a role on one project.
// Once marks an account made at most once in the cloud's life (the demo
// customer): an operator who deleted its project or user has it gone for
// good. The others (the operator's own) are made again when missing.
type Account struct {
	User, Password, Project, Role string
	Once                          bool
}

// Bootstrap makes the default domain, the admin, member and reader roles and
// the given accounts, keeping whatever already exists. A password is set only
// when the user is created.
func (s *Service) Bootstrap(ctx context.Context, accounts ...Account) error {
	defer s.cache.invalidate()
	return s.db.Tx(ctx, func(tx *store.Tx) error {
		if _, err := getDomain(ctx, tx, "id = ?", DefaultDomainID); errors.Is(err, store.ErrNotFound) {
			if _, err := tx.Exec(ctx, "INSERT INTO domains (id, name, description, enabled) VALUES (?, ?, ?, 1)",
				DefaultDomainID, DefaultDomainName, "The default domain"); err != nil {
				return err
			}
		} else if err != nil {
			return err
		}
		roles := map[string]string{}
		for _, name := range []string{"admin", "member", "reader", "service"} {
			r, err := getRole(ctx, tx, "name = ?", name)
			if errors.Is(err, store.ErrNotFound) {
				r = &Role{ID: NewID(), Name: name}
				if _, err := tx.Exec(ctx, "INSERT INTO roles (id, name, description) VALUES (?, ?, '')", r.ID, r.Name); err != nil {
					return err
				}
			} else if err != nil {
				return err
			}
			roles[name] = r.ID
		}
		for _, a := range accounts {
			if a.Once {
				if made, err := s.seeded(ctx, tx, "account:"+a.User); err != nil || made {
					if err != nil {
						return err
					}
					continue
				}
			}
			p, err := getProjectByName(ctx, tx, DefaultDomainID, a.Project)
			if errors.Is(err, store.ErrNotFound) {
				p = &Project{ID: NewID(), Name: a.Project, DomainID: DefaultDomainID, Enabled: true, CreatedAt: s.now(),
					Description: "Bootstrap project " + a.Project}
				if err := insertProject(ctx, tx, p); err != nil {
					return err
				}
			} else if err != nil {
				return err
			}
			u, err := getUserByName(ctx, tx, DefaultDomainID, a.User)
			if errors.Is(err, store.ErrNotFound) {
				u = &User{ID: NewID(), Name: a.User, DomainID: DefaultDomainID, Enabled: true,
					PasswordHash: hashArgon2id(a.Password), DefaultProjectID: p.ID, CreatedAt: s.now()}
				if err := insertUser(ctx, tx, u); err != nil {
					return err
				}
			} else if err != nil {
				return err
			}
			roleID, ok := roles[a.Role]
			if !ok {
				return fmt.Errorf("identity: bootstrap: unknown role %q", a.Role)
			}
			if err := assignRole(ctx, tx, u.ID, p.ID, roleID); err != nil {
				return err
			}
			// An operator also holds member and reader, as keystone-manage
			// bootstrap's implied roles give them.
			if a.Role == "admin" {
				for _, r := range []string{"member", "reader"} {
					if err := assignRole(ctx, tx, u.ID, p.ID, roles[r]); err != nil {
						return err
					}
				}
			}
		}
		return nil
	})
}

// seeded reports whether bootstrap made name once already (or another
// controller starting at once is making it), recording that it makes it
// now when not.
func (s *Service) seeded(ctx context.Context, tx *store.Tx, name string) (bool, error) {
	res, err := tx.Exec(ctx, "INSERT INTO identity_seeded (name) VALUES (?) ON CONFLICT (name) DO NOTHING", name)
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 0, err
}

// ProjectByName finds a project in the default domain; used by other
// services' bootstrap (default networks, demo resources).
func (s *Service) ProjectByName(ctx context.Context, name string) (*Project, error) {
	return getProjectByName(ctx, s.db, DefaultDomainID, name)
}

// ProjectID is the id of a project of the default domain, "" when there is
// none: what other services ask of identity instead of reading its tables.
func (s *Service) ProjectID(ctx context.Context, name string) (string, error) {
	p, err := s.ProjectByName(ctx, name)
	if errors.Is(err, store.ErrNotFound) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return p.ID, nil
}

// Projects lists every project.
func (s *Service) Projects(ctx context.Context) ([]Project, error) {
	return listProjects(ctx, s.db, "")
}

// ProjectExists reports whether a project id names a project.
func (s *Service) ProjectExists(ctx context.Context, id string) (bool, error) {
	_, err := GetProject(ctx, s.db, id)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

// Issue authenticates a user by name and password in the default domain and
// returns a project-scoped token; used by the panel and benchmarks.
func (s *Service) Issue(ctx context.Context, user, password, project string) (string, error) {
	u, err := s.passwordLogin(ctx, "", func() (*User, error) {
		return getUserByName(ctx, s.db, DefaultDomainID, user)
	}, password)
	if err != nil {
		return "", err
	}
	// The user's MFA rules hold here too: one with a second factor gets
	// its *ReceiptRequired.
	methods, err := s.applyRules(ctx, "", u, []string{"password"}, nil)
	if err != nil {
		return "", err
	}
	p, err := getProjectByName(ctx, s.db, DefaultDomainID, project)
	if err != nil {
		return "", api.Unauthorized()
	}
	if err := s.allowIssue(u.ID); err != nil {
		return "", err
	}
	t, err := s.issue(ctx, u.ID, p.ID, methods, "", time.Time{})
	if err != nil {
		return "", err
	}
	return t.ID, nil
}
