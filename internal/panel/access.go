package panel

import (
	"net/http"
	"net/url"
	"strings"
	"time"
)

// accessRoutes are the API access page: clouds.yaml and openrc for the
// account, and Keystone application credentials so tools need no password.
func (p *Panel) accessRoutes() []route {
	return []route{
		{"GET /api-access", member, p.accessPage},
		{"GET /api-access/clouds.yaml", member, p.cloudsYAML},
		{"GET /api-access/openrc", member, p.openrc},
		{"POST /api-access/credentials", member, p.createCredential},
		{"POST /api-access/credentials/{id}/delete", member, p.deleteCredential},
	}
}

// appCred is an application credential as identity answers it.
type appCred struct {
	ID          string  `json:"id"`
	Name        string  `json:"name"`
	Description *string `json:"description"`
	ExpiresAt   *string `json:"expires_at"`
	ProjectID   string  `json:"project_id"`
	Secret      string  `json:"secret"`
	Roles       []struct {
		Name string `json:"name"`
	} `json:"roles"`
}

// RoleNames lists the credential's roles for the page.
func (a appCred) RoleNames() string {
	var n []string
	for _, r := range a.Roles {
		n = append(n, r.Name)
	}
	return strings.Join(n, ", ")
}

type accessData struct {
	AuthURL, Region, User, UserID, Project, ProjectID string
	Credentials                                       []appCred
	Created                                           *appCred
	CreatedYAML                                       string
}

func (p *Panel) credentialsPath(q *req) string {
	return "/users/" + url.PathEscape(q.s.UserID) + "/application_credentials"
}

func (p *Panel) accessData(q *req) (*accessData, error) {
	var out struct {
		Credentials []appCred `json:"application_credentials"`
	}
	if err := q.api.Get(q.r.Context(), Identity, p.credentialsPath(q), &out); err != nil {
		return nil, err
	}
	return &accessData{AuthURL: p.cfg.URLs[Identity], Region: p.cfg.Identity.Region, User: q.s.UserName, UserID: q.s.UserID,
		Project: q.s.ProjectName, ProjectID: q.s.ProjectID, Credentials: out.Credentials}, nil
}

func (p *Panel) accessPage(q *req) error {
	d, err := p.accessData(q)
	if err != nil {
		return err
	}
	return q.render("api_access", q.T("API access"), d)
}

// yamlString quotes s for YAML (a JSON string is a YAML string).
func yamlString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r < 0x20:
			b.WriteString(" ")
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// cloudsYAMLFor is clouds.yaml for the account: with a password prompt
// (no password in the file) or, given a credential, for
// auth_type v3applicationcredential.
func (d *accessData) cloudsYAML(cred *appCred) string {
	var b strings.Builder
	b.WriteString("# clouds.yaml for openstack --os-cloud nimbus (and Terraform, gophercloud, openstacksdk).\n")
	b.WriteString("# The cloud's certificates are signed by its own CA: set cacert to the ca.pem the operator gives you.\n")
	b.WriteString("clouds:\n  nimbus:\n")
	if cred != nil {
		b.WriteString("    auth_type: v3applicationcredential\n    auth:\n")
		b.WriteString("      auth_url: " + yamlString(d.AuthURL) + "\n")
		b.WriteString("      application_credential_id: " + yamlString(cred.ID) + "\n")
		b.WriteString("      application_credential_secret: " + yamlString(cred.Secret) + "\n")
	} else {
		b.WriteString("    auth:\n")
		b.WriteString("      auth_url: " + yamlString(d.AuthURL) + "\n")
		b.WriteString("      username: " + yamlString(d.User) + "\n")
		b.WriteString("      user_domain_name: \"Default\"\n")
		b.WriteString("      project_name: " + yamlString(d.Project) + "\n")
		b.WriteString("      project_domain_name: \"Default\"\n")
		b.WriteString("      # no password here: the openstack client asks for it\n")
	}
	b.WriteString("    region_name: " + yamlString(d.Region) + "\n")
	b.WriteString("    interface: \"public\"\n    identity_api_version: 3\n    # cacert: \"/path/to/ca.pem\"\n")
	return b.String()
}

// download answers a text file to save.
func download(q *req, name, body string) error {
	h := q.w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("Content-Disposition", `attachment; filename="`+name+`"`)
	q.w.WriteHeader(http.StatusOK)
	_, err := q.w.Write([]byte(body))
	return err
}

func (p *Panel) cloudsYAML(q *req) error {
	d := &accessData{AuthURL: p.cfg.URLs[Identity], Region: p.cfg.Identity.Region, User: q.s.UserName, Project: q.s.ProjectName}
	return download(q, "clouds.yaml", d.cloudsYAML(nil))
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

func (p *Panel) openrc(q *req) error {
	lines := []string{
		"# Source this file: . ./openrc — the openstack client then asks for nothing but the password.",
		"export OS_AUTH_URL=" + shellQuote(p.cfg.URLs[Identity]),
		"export OS_IDENTITY_API_VERSION=3",
		"export OS_USERNAME=" + shellQuote(q.s.UserName),
		"export OS_USER_DOMAIN_NAME=Default",
		"export OS_PROJECT_NAME=" + shellQuote(q.s.ProjectName),
		"export OS_PROJECT_DOMAIN_NAME=Default",
		"export OS_REGION_NAME=" + shellQuote(p.cfg.Identity.Region),
		"export OS_INTERFACE=public",
		"# export OS_CACERT=/path/to/ca.pem   # the cloud's CA, from the operator",
		`echo "Password for $OS_USERNAME: "; read -sr OS_PASSWORD; export OS_PASSWORD`,
		"",
	}
	return download(q, "openrc", strings.Join(lines, "\n"))
}

// createCredential makes an application credential through identity's API
// with the user's own token, and shows its secret this once.
func (p *Panel) createCredential(q *req) error {
	f := q.r.PostForm
	body := map[string]any{"name": strings.TrimSpace(f.Get("name"))}
	if v := strings.TrimSpace(f.Get("description")); v != "" {
		body["description"] = v
	}
	if v := strings.TrimSpace(f.Get("expires")); v != "" {
		t, err := time.Parse("2006-01-02", v)
		if err != nil {
			return q.back("/api-access", BadRequest(q.T("The expiry date must look like 2030-12-31.")))
		}
		body["expires_at"] = t.Format("2006-01-02T15:04:05")
	}
	var out struct {
		Credential appCred `json:"application_credential"`
	}
	if err := q.api.Post(q.r.Context(), Identity, p.credentialsPath(q), map[string]any{"application_credential": body}, &out); err != nil {
		return q.back("/api-access", err)
	}
	d, err := p.accessData(q)
	if err != nil {
		return err
	}
	d.Created = &out.Credential
	d.CreatedYAML = d.cloudsYAML(&out.Credential)
	return q.render("api_access", q.T("API access"), d)
}

func (p *Panel) deleteCredential(q *req) error {
	if q.r.PostForm.Get("confirm") != "yes" {
		return q.back("/api-access", BadRequest(q.T("Tick the box to confirm.")))
	}
	if err := q.api.Delete(q.r.Context(), Identity, p.credentialsPath(q)+"/"+url.PathEscape(q.r.PathValue("id"))); err != nil {
		return q.back("/api-access", err)
	}
	return q.redirect("/api-access", q.T("The application credential is deleted; its tokens no longer work."))
}
