package cloud

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"nimbus/internal/identity"
	"nimbus/internal/store"
)

// Secrets are the generated credentials of the first accounts, kept in
// DataDir/secrets.json (mode 0600) so that later starts can rewrite
// clouds.yaml when addresses change.
type Secrets struct {
	AdminPassword string `json:"admin_password"`
	DemoPassword  string `json:"demo_password"`
}

// The first accounts.
const (
	AdminUser    = "admin"
	AdminProject = "admin"
	DemoUser     = "demo"
	DemoProject  = "demo"
)

func (c *Cloud) bootstrap(ctx context.Context) error {
	path := filepath.Join(c.Config.DataDir, "secrets.json")
	var sec Secrets
	if b, err := os.ReadFile(path); err == nil {
		if err := json.Unmarshal(b, &sec); err != nil {
			return fmt.Errorf("cloud: %s: %w", path, err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if sec.AdminPassword == "" {
		sec.AdminPassword = firstNonEmpty(c.Config.AdminPassword, identity.GeneratePassword(20))
	}
	if sec.DemoPassword == "" {
		sec.DemoPassword = firstNonEmpty(c.Config.DemoPassword, identity.GeneratePassword(20))
	}
	accounts := []identity.Account{{User: AdminUser, Password: sec.AdminPassword, Project: AdminProject, Role: "admin"}}
	if !c.Config.NoDemo {
		// Made on the first start only: an operator who deletes it is not
		// given it back.
		accounts = append(accounts, identity.Account{User: DemoUser, Password: sec.DemoPassword, Project: DemoProject,
			Role: "member", Once: true})
	}
	if err := c.Identity.Bootstrap(ctx, accounts...); err != nil {
		return fmt.Errorf("cloud: bootstrap identity: %w", err)
	}
	// Accounts made before keep their passwords: a controller started on
	// another's database without its secrets.json (a region's second)
	// writes none rather than passwords of its own the accounts never took.
	for _, a := range []struct {
		user string
		pw   *string
	}{{AdminUser, &sec.AdminPassword}, {DemoUser, &sec.DemoPassword}} {
		if _, err := c.Identity.UserByName(ctx, a.user); errors.Is(err, store.ErrNotFound) {
			continue // no demo customer (--no-demo, or the operator deleted it)
		} else if err != nil {
			return fmt.Errorf("cloud: bootstrap identity: %w", err)
		}
		ok, err := c.Identity.PasswordMatches(ctx, a.user, *a.pw)
		if err != nil {
			return fmt.Errorf("cloud: bootstrap identity: %w", err)
		}
		if !ok {
			c.Config.Log.Warn("cloud: the account's password is not the one this data directory has: its client files get none; "+
				"copy secrets.json from the first controller, or give the password", "user", a.user, "file", path)
			*a.pw = ""
		}
	}
	b, _ := json.MarshalIndent(sec, "", "  ")
	if err := writePrivate(path, b); err != nil {
		return err
	}
	c.Secrets = sec
	if err := c.Images.Bootstrap(ctx); err != nil {
		return fmt.Errorf("cloud: bootstrap images: %w", err)
	}
	if err := c.Networks.Bootstrap(ctx); err != nil {
		return fmt.Errorf("cloud: bootstrap networks: %w", err)
	}
	// Projects made before the project hook existed get their defaults
	// now; EnsureDefaults is idempotent, so each start costs two lookups
	// per project.
	projects, err := c.Identity.Projects(ctx)
	if err != nil {
		return err
	}
	for _, p := range projects {
		if err := c.Networks.EnsureDefaults(ctx, p.ID); err != nil {
			return fmt.Errorf("cloud: bootstrap network for %s: %w", p.Name, err)
		}
	}
	for _, name := range []string{AdminProject, DemoProject} {
		p, err := c.Identity.ProjectByName(ctx, name)
		if errors.Is(err, store.ErrNotFound) && name == DemoProject {
			continue // none, or the operator deleted it
		}
		if err != nil {
			return err
		}
		c.HasDemo = c.HasDemo || name == DemoProject
		var err2 error
		switch name {
		case DemoProject:
			err2 = c.Billing.Welcome(ctx, p.ID, c.Config.DemoCredit)
		case AdminProject:
			err2 = c.Billing.OpenAccount(ctx, p.ID, AdminCreditLimit)
		}
		if err2 != nil {
			return fmt.Errorf("cloud: bootstrap billing: %w", err2)
		}
	}
	if err := c.Compute.Bootstrap(ctx); err != nil {
		return fmt.Errorf("cloud: bootstrap compute: %w", err)
	}
	return c.writeClientFiles()
}

// AdminCreditLimit is the admin project's credit limit on first start:
// 10^13 minor units, more than any cloud spends, so the operator's own
// servers are never shelved for running dry.
const AdminCreditLimit = 10_000_000_000_000

func firstNonEmpty(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// writeClientFiles writes clouds.yaml and one openrc per account, all 0600
// since they hold passwords. They name ca.pem only when the catalog's host
// meets the built-in CA's certificate: the operator's or ACME's is trusted
// through the clients' own roots.
func (c *Cloud) writeClientFiles() error {
	ca, _ := filepath.Abs(c.CACertFile)
	var y strings.Builder
	example := "nimbus-admin"
	if c.HasDemo {
		example = "nimbus-demo"
	}
	y.WriteString("# Written by nimbus serve. Use with:\n#   OS_CLIENT_CONFIG_FILE=" + c.clientFile("clouds.yaml") +
		" openstack --os-cloud " + example + " server list\nclouds:\n")
	accounts := []struct{ cloud, user, pw, project string }{{"nimbus-admin", AdminUser, c.Secrets.AdminPassword, AdminProject}}
	if c.HasDemo {
		accounts = append(accounts, struct{ cloud, user, pw, project string }{"nimbus-demo", DemoUser, c.Secrets.DemoPassword, DemoProject})
	} else if err := os.Remove(c.clientFile(DemoUser + "-openrc.sh")); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	for _, a := range accounts {
		fmt.Fprintf(&y, "  %s:\n    auth:\n      auth_url: %s\n      username: %s\n      password: %q\n      project_name: %s\n"+
			"      user_domain_name: Default\n      project_domain_name: Default\n    region_name: RegionOne\n"+
			"    interface: public\n    identity_api_version: 3\n", a.cloud, c.IdentityURL, a.user, a.pw, a.project)
		if !c.Config.PlainHTTP && c.builtinServesCatalog() {
			fmt.Fprintf(&y, "    cacert: %s\n", ca)
		}
		rc := fmt.Sprintf("export OS_AUTH_URL=%s\nexport OS_USERNAME=%s\nexport OS_PASSWORD='%s'\nexport OS_PROJECT_NAME=%s\n"+
			"export OS_USER_DOMAIN_NAME=Default\nexport OS_PROJECT_DOMAIN_NAME=Default\nexport OS_REGION_NAME=RegionOne\n"+
			"export OS_IDENTITY_API_VERSION=3\nexport OS_INTERFACE=public\n", c.IdentityURL, a.user, a.pw, a.project)
		if !c.Config.PlainHTTP && c.builtinServesCatalog() {
			rc += "export OS_CACERT=" + ca + "\n"
		}
		if err := writePrivate(c.clientFile(a.user+"-openrc.sh"), []byte(rc)); err != nil {
			return err
		}
	}
	c.CloudsFile = c.clientFile("clouds.yaml")
	return writePrivate(c.CloudsFile, []byte(y.String()))
}

func (c *Cloud) clientFile(name string) string {
	p, _ := filepath.Abs(filepath.Join(c.Config.DataDir, name))
	return p
}

func writePrivate(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
