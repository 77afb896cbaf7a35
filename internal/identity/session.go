package identity

import (
	"context"
	"errors"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// Session is a panel login: a Keystone token the panel sends to the APIs on
// the user's behalf, and what it is scoped to.
type Session struct {
	Token                                    string
	Expires                                  time.Time
	UserID, UserName, ProjectID, ProjectName string
	Roles                                    []string
	Admin                                    bool
}

// Login checks a password for the panel exactly as POST /v3/auth/tokens
// does (the per-address failure limit for addr, the browser's address; the
// per-user lockout, password-check queue and token rate; the user's MFA
// rules), and issues a password token scoped to the user's default
// project, or else to the first enabled project the user holds a role on
// (unscoped if none). When the rules want a second factor it answers a
// *ReceiptRequired, to be completed with LoginPasscode.
func (s *Service) Login(ctx context.Context, addr, userName, password string) (*Session, error) {
	if len(password) > maxPassword {
		return nil, api.Unauthorized()
	}
	u, err := s.passwordLogin(ctx, addr, func() (*User, error) { return s.UserByName(ctx, userName) }, password)
	if err != nil {
		return nil, err
	}
	return s.login(ctx, addr, u, []string{"password"}, nil)
}

// LoginPasscode completes a sign-in that Login answered with a receipt,
// with a passcode, as POST /v3/auth/tokens does with the receipt in
// Openstack-Auth-Receipt and the totp method. A receipt unknown, expired or
// ended by wrong passcodes is ErrReceiptNotFound.
func (s *Service) LoginPasscode(ctx context.Context, addr, receiptID, passcode string) (*Session, error) {
	rc, err := s.loadReceipt(ctx, receiptID)
	if err != nil {
		return nil, err
	}
	u, err := GetUser(ctx, s.db, rc.userID)
	if errors.Is(err, store.ErrNotFound) || (err == nil && !u.Enabled) {
		return nil, ErrReceiptNotFound
	}
	if err != nil {
		return nil, err
	}
	if err := s.totpFactor(ctx, addr, u, passcode, rc); err != nil {
		return nil, err
	}
	return s.login(ctx, addr, u, []string{"totp"}, rc)
}

// login applies u's rules to methods (with rc's) and issues the panel's
// token.
func (s *Service) login(ctx context.Context, addr string, u *User, methods []string, rc *receipt) (*Session, error) {
	methods, err := s.applyRules(ctx, addr, u, methods, rc)
	if err != nil {
		return nil, err
	}
	projectID, err := s.loginProject(ctx, u)
	if err != nil {
		return nil, err
	}
	if err := s.allowIssue(u.ID); err != nil {
		return nil, err
	}
	t, err := s.issue(ctx, u.ID, projectID, methods, "", time.Time{})
	if err != nil {
		return nil, err
	}
	if err := s.spendReceipt(ctx, rc); err != nil {
		return nil, err
	}
	info, err := s.load(ctx, t.ID)
	if errors.Is(err, errTokenNotFound) {
		// Its project or roles went away between the check and the load.
		return nil, api.Unauthorized()
	}
	if err != nil {
		return nil, err
	}
	c := info.caller()
	return &Session{
		Token: t.ID, Expires: t.ExpiresAt, UserID: u.ID, UserName: u.Name,
		ProjectID: c.ProjectID, ProjectName: c.ProjectName, Roles: c.Roles, Admin: c.IsAdmin(),
	}, nil
}

// loginProject is the project a panel login is scoped to, "" for none.
func (s *Service) loginProject(ctx context.Context, u *User) (string, error) {
	if u.DefaultProjectID != "" {
		p, err := GetProject(ctx, s.db, u.DefaultProjectID)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return "", err
		}
		if err == nil && p.Enabled {
			roles, err := rolesOn(ctx, s.db, u.ID, p.ID)
			if err != nil || len(roles) > 0 {
				return p.ID, err
			}
		}
	}
	ps, err := listProjects(ctx, s.db,
		"id IN (SELECT project_id FROM role_assignments WHERE user_id = ?) AND enabled = 1", u.ID)
	if err != nil || len(ps) == 0 {
		return "", err
	}
	return ps[0].ID, nil // listProjects orders by name
}
