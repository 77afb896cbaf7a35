package api

import (
	"context"
	"slices"
	"time"
)

// Caller is who a validated token speaks for.
type Caller struct {
	UserID      string
	UserName    string
	DomainID    string
	ProjectID   string // empty for an unscoped or domain-scoped token
	ProjectName string
	Roles       []string
	ExpiresAt   time.Time
	Token       string
}

// RoleAdmin is the role that makes a caller an operator.
const RoleAdmin = "admin"

// IsAdmin reports whether the caller holds the admin role.
func (c *Caller) IsAdmin() bool { return c != nil && slices.Contains(c.Roles, RoleAdmin) }

// HasRole reports whether the caller holds role.
func (c *Caller) HasRole(role string) bool { return c != nil && slices.Contains(c.Roles, role) }

type callerKey struct{}

// WithCaller stores the caller in ctx.
func WithCaller(ctx context.Context, c *Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// CallerFrom returns the caller of an authenticated request, or nil.
func CallerFrom(ctx context.Context) *Caller {
	c, _ := ctx.Value(callerKey{}).(*Caller)
	return c
}
