package panel

import (
	"context"
	"errors"
	"net/http"
	"net/url"
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
		{"POST /support/requests/{id}/close", member, p.withdrawConfigRequest},
	}
}

// Limits on what the support page stores.
const (
	maxContactLen  = 200
	minRequestLen  = 10
	maxRequestLen  = 4000
	requestsListed = 20 // a page of the customer's own requests
)

// ConfigRequest is a customer's request for a configuration the
// configurator does not offer.
type ConfigRequest struct {
	ID                     string
	ProjectID, ProjectName string
	UserID, UserName       string
	Body                   string
	CreatedAt              time.Time
	State                  string // requestOpen or requestClosed
}

// Open is whether the request waits for an answer.
func (r ConfigRequest) Open() bool { return r.State == requestOpen }

type supportData struct {
	Support  Support
	Requests []ConfigRequest // the signed-in customer's project's, a page
	// Older is the link to the next page of them, "" on the last.
	Older string
	// Limits are the project's bounds, said beside the form.
	Limits SupportLimits
}

func (p *Panel) supportPage(q *req) error {
	s, err := p.SupportSettings(q.r.Context())
	if err != nil {
		return err
	}
	d := supportData{Support: s, Limits: p.cfg.SupportLimits.withDefaults()}
	if q.s != nil {
		marker := q.r.URL.Query().Get("marker")
		reqs, next, err := p.requests(q.r.Context(), requestFilter{Project: q.s.ProjectID}, marker, requestsListed)
		if err != nil {
			return err
		}
		d.Requests = reqs
		if next != "" {
			d.Older = "/support?" + url.Values{"marker": {next}}.Encode() + "#requests"
		}
	}
	return q.render("support", q.T("Support"), d)
}

// createConfigRequest stores what the customer needs for the operator.
func (p *Panel) createConfigRequest(q *req) error {
	body := strings.TrimSpace(q.r.PostForm.Get("body"))
	if n := utf8.RuneCountInString(body); n < minRequestLen || n > maxRequestLen || !plainText(body) {
		return q.back("/support#request", BadRequest(q.T("Describe the configuration you need in %d to %d characters.", minRequestLen, maxRequestLen)))
	}
	r := ConfigRequest{ID: uuid.NewString(), ProjectID: q.s.ProjectID, ProjectName: q.s.ProjectName,
		UserID: q.s.UserID, UserName: q.s.UserName, Body: body, CreatedAt: p.cfg.Now()}
	lim := p.cfg.SupportLimits.withDefaults()
	switch err := p.addRequest(q.r.Context(), r); {
	case errors.Is(err, errTooManyOpen):
		return q.back("/support#request", &APIError{Status: http.StatusTooManyRequests, Message: q.T(
			"Your project has %d open requests, as many as it may. Close one you no longer need, or wait for an answer.", lim.Open)})
	case errors.Is(err, errTooOften):
		return q.back("/support#request", &APIError{Status: http.StatusTooManyRequests, Message: q.T(
			"Your project has sent %d requests in the last hour, as many as it may. Try again later.", lim.PerHour)})
	case err != nil:
		return err
	}
	return q.redirect("/support#requests", q.T("Your request is sent. We will answer by e-mail."))
}

// withdrawConfigRequest closes one of the customer's own requests, which
// they no longer need.
func (p *Panel) withdrawConfigRequest(q *req) error {
	if err := p.setRequestState(q.r.Context(), q.r.PathValue("id"), q.s.ProjectID, requestClosed); err != nil {
		return err
	}
	return q.redirect("/support#requests", q.T("The request is closed."))
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

// plainText is s as valid UTF-8 with no control characters but line
// breaks and tabs (PostgreSQL refuses a NUL in text; the operator's page
// shows the rest).
func plainText(s string) bool {
	return utf8.ValidString(s) && strings.IndexFunc(s, func(r rune) bool {
		return unicode.IsControl(r) && r != '\n' && r != '\r' && r != '\t'
	}) < 0
}

// plainLine is s of at most max characters with no line breaks or other
// control characters.
func plainLine(s string, max int) bool {
	if utf8.RuneCountInString(s) > max || !utf8.ValidString(s) {
		return false
	}
	return strings.IndexFunc(s, unicode.IsControl) < 0
}
