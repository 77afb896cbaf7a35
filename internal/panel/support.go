package panel

import (
	"context"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"

	"nimbus/internal/store"
)

// supportRoutes are the support page and the custom-configuration request.
func (p *Panel) supportRoutes() []route {
	return []route{
		{"GET /support", public, p.supportPage},
		{"POST /support/requests", member, p.createConfigRequest},
	}
}

// Limits on what the support page stores.
const (
	maxContactLen  = 200
	minRequestLen  = 10
	maxRequestLen  = 4000
	requestsListed = 20
)

// ConfigRequest is a customer's request for a configuration the
// configurator does not offer.
type ConfigRequest struct {
	ID                     string
	ProjectID, ProjectName string
	UserID, UserName       string
	Body                   string
	CreatedAt              time.Time
}

type supportData struct {
	Support  Support
	Requests []ConfigRequest // the signed-in customer's project's
	Body     string
}

func (p *Panel) supportPage(q *req) error {
	s, err := p.SupportSettings(q.r.Context())
	if err != nil {
		return err
	}
	d := supportData{Support: s}
	if q.s != nil {
		if d.Requests, err = p.configRequests(q.r.Context(), q.s.ProjectID, requestsListed); err != nil {
			return err
		}
	}
	return q.render("support", q.T("Support"), d)
}

// createConfigRequest stores what the customer needs for the operator.
func (p *Panel) createConfigRequest(q *req) error {
	body := strings.TrimSpace(q.r.PostForm.Get("body"))
	if n := utf8.RuneCountInString(body); n < minRequestLen || n > maxRequestLen {
		return q.back("/support#request", BadRequest(q.T("Describe the configuration you need in %d to %d characters.", minRequestLen, maxRequestLen)))
	}
	r := ConfigRequest{ID: uuid.NewString(), ProjectID: q.s.ProjectID, ProjectName: q.s.ProjectName,
		UserID: q.s.UserID, UserName: q.s.UserName, Body: body, CreatedAt: p.cfg.Now()}
	_, err := p.cfg.DB.Exec(q.r.Context(), `INSERT INTO panel_config_requests
 (id, project_id, project_name, user_id, user_name, body, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)`,
		r.ID, r.ProjectID, r.ProjectName, r.UserID, r.UserName, r.Body, r.CreatedAt.Unix())
	if err != nil {
		return err
	}
	return q.redirect("/support#requests", q.T("Your request is sent. We will answer by e-mail."))
}

// SupportSettings are the operator's contacts: as last changed in the
// panel, else those the panel was started with.
func (p *Panel) SupportSettings(ctx context.Context) (Support, error) {
	var s Support
	err := p.cfg.DB.QueryRow(ctx, "SELECT messenger, email, phone, hours FROM panel_support WHERE id = 1").
		Scan(&s.Messenger, &s.Email, &s.Phone, &s.Hours)
	if store.IsNoRows(err) {
		return p.cfg.Support, nil
	}
	return s, err
}

// SetSupportSettings replaces the operator's contacts shown on the
// support page.
func (p *Panel) SetSupportSettings(ctx context.Context, s Support) error {
	s = Support{Messenger: strings.TrimSpace(s.Messenger), Email: strings.TrimSpace(s.Email),
		Phone: strings.TrimSpace(s.Phone), Hours: strings.TrimSpace(s.Hours)}
	for _, v := range []string{s.Messenger, s.Email, s.Phone, s.Hours} {
		if !plainLine(v, maxContactLen) {
			return BadRequest("Each contact must be one line of at most 200 characters.")
		}
	}
	_, err := p.cfg.DB.Exec(ctx, `INSERT INTO panel_support (id, messenger, email, phone, hours, updated_at)
 VALUES (1, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET messenger = excluded.messenger, email = excluded.email,
 phone = excluded.phone, hours = excluded.hours, updated_at = excluded.updated_at`,
		s.Messenger, s.Email, s.Phone, s.Hours, p.cfg.Now().Unix())
	return err
}

// ConfigRequests are customers' custom-configuration requests, newest
// first (at most limit), for the operator.
func (p *Panel) ConfigRequests(ctx context.Context, limit int) ([]ConfigRequest, error) {
	return p.configRequests(ctx, "", limit)
}

// configRequests lists project's requests, or every project's when it is "".
func (p *Panel) configRequests(ctx context.Context, project string, limit int) ([]ConfigRequest, error) {
	q := `SELECT id, project_id, project_name, user_id, user_name, body, created_at FROM panel_config_requests`
	args := []any{}
	if project != "" {
		q += " WHERE project_id = ?"
		args = append(args, project)
	}
	rows, err := p.cfg.DB.Query(ctx, q+" ORDER BY created_at DESC, id DESC LIMIT ?", append(args, limit)...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []ConfigRequest
	for rows.Next() {
		var r ConfigRequest
		var at int64
		if err := rows.Scan(&r.ID, &r.ProjectID, &r.ProjectName, &r.UserID, &r.UserName, &r.Body, &at); err != nil {
			return nil, err
		}
		r.CreatedAt = time.Unix(at, 0).UTC()
		out = append(out, r)
	}
	return out, rows.Err()
}

// plainLine is s of at most max characters with no line breaks or other
// control characters.
func plainLine(s string, max int) bool {
	if utf8.RuneCountInString(s) > max || !utf8.ValidString(s) {
		return false
	}
	return strings.IndexFunc(s, unicode.IsControl) < 0
}
