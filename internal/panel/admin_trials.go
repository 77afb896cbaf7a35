package panel

import (
	"context"
	"net/url"
	"nimbus/internal/billing"
	"strconv"
	"strings"
	"time"
)

// trialAdminRoutes are the operator's queue of free test access requests
// (and of custom-configuration requests from the support page).
func (p *Panel) trialAdminRoutes() []route {
	return []route{
		{"GET /admin/trials", admin, p.trialQueue},
		{"POST /admin/trials/{id}/approve", admin, p.approveTrial},
		{"POST /admin/trials/{id}/decline", admin, p.declineTrial},
	}
}

// Trial decision bounds and defaults.
const (
	defaultTrialDays = 14
	maxTrialDays     = 365
	decidedShown     = 20
)

type trialRow struct {
	billing.Trial
	ProjectName string
}

type trialsData struct {
	Pending, Decided []trialRow
	// Requests are the first customers with open custom-configuration
	// requests, as on the view by customer.
	Requests    groupsData
	DefaultDays int
}

// trialQueue lists pending trials to decide, the latest decided ones, and
// the customers with open custom-configuration requests.
func (p *Panel) trialQueue(q *req) error {
	ctx := q.r.Context()
	var trials struct {
		Trials []billing.Trial `json:"trials"`
	}
	var names map[string]string
	var requests groupsData
	err := parallel(
		func() error { return q.api.Get(ctx, Billing, "/v1/trials", &trials) },
		func() (err error) { names, err = p.projectNames(ctx, q); return err },
		func() (err error) { requests, err = p.groups(q, requestOpen, "", groupsOnTrials); return err },
	)
	if err != nil {
		return err
	}
	d := trialsData{Requests: requests, DefaultDays: defaultTrialDays}
	for _, t := range trials.Trials {
		row := trialRow{Trial: t, ProjectName: names[t.ProjectID]}
		if t.Status == "pending" {
			d.Pending = append(d.Pending, row)
		} else if len(d.Decided) < decidedShown {
			d.Decided = append(d.Decided, row)
		}
	}
	return q.render("admin_trials", q.T("Trial requests"), d)
}

// projectNames are every project's name by id.
func (p *Panel) projectNames(ctx context.Context, q *req) (map[string]string, error) {
	ps, err := p.projects(ctx, q)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string, len(ps))
	for _, pr := range ps {
		out[pr.ID] = pr.Name
	}
	return out, nil
}

// approveTrial grants the trial a credit that lasts the days given.
func (p *Panel) approveTrial(q *req) error {
	f := q.r.PostForm
	credit, ok := parseMinor(f.Get("credit"))
	if !ok || credit <= 0 {
		return q.back("/admin/trials", BadRequest(q.T("Write the credit as a positive number, such as 1000.")))
	}
	days, err := strconv.Atoi(strings.TrimSpace(f.Get("days")))
	if err != nil || days < 1 || days > maxTrialDays {
		return q.back("/admin/trials", BadRequest(q.T("The trial lasts from 1 to %d days.", maxTrialDays)))
	}
	ends := p.cfg.Now().UTC().Add(time.Duration(days) * 24 * time.Hour).Truncate(time.Second)
	body := map[string]any{"approve": map[string]any{"credit": credit, "ends_at": ends.Format(time.RFC3339)}}
	if err := q.api.Post(q.r.Context(), Billing, "/v1/trials/"+url.PathEscape(q.r.PathValue("id"))+"/approve", body, nil); err != nil {
		return q.back("/admin/trials", err)
	}
	return q.redirect("/admin/trials", q.T("The trial is approved with %s until %s.", p.cfg.Money.Format(credit), timeText(ends)))
}

// declineTrial refuses the trial, telling the customer why.
func (p *Panel) declineTrial(q *req) error {
	reason := strings.TrimSpace(q.r.PostForm.Get("reason"))
	if reason == "" {
		return q.back("/admin/trials", BadRequest(q.T("Tell the customer why the trial is declined.")))
	}
	body := map[string]any{"decline": map[string]any{"reason": reason}}
	if err := q.api.Post(q.r.Context(), Billing, "/v1/trials/"+url.PathEscape(q.r.PathValue("id"))+"/decline", body, nil); err != nil {
		return q.back("/admin/trials", err)
	}
	return q.redirect("/admin/trials", q.T("The trial is declined."))
}
