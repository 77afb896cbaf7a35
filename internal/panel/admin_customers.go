package panel

import (
	"context"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// customerRoutes are the operator's customers: every project with its
// balance and credit limit, and the operator's corrections.
func (p *Panel) customerRoutes() []route {
	return []route{
		{"GET /admin/customers", admin, p.customerList},
		{"GET /admin/customers/{project}", admin, p.customerPage},
		{"POST /admin/customers/{project}/adjust", admin, p.adjustAccount},
		{"POST /admin/customers/{project}/credit", admin, p.creditAccount},
		{"POST /admin/customers/{project}/limit", admin, p.setCreditLimit},
	}
}

// customersPerPage bounds the account calls of one page of the list.
const customersPerPage = 25

// accountCalls is how many account calls of the list run at once.
const accountCalls = 8

type project struct {
	ID          string `json:"id"`
	Name        string `json:"name"`
	Description string `json:"description"`
	Enabled     bool   `json:"enabled"`
}

type customerRow struct {
	Project project
	Account account
	// Err is why the account could not be read.
	Err string
	// Suspended is an account below its credit limit.
	Suspended bool
}

type customersData struct {
	Rows       []customerRow
	Search     string
	Page       int
	Prev, Next string
	Total      int
}

// customerList lists projects (one identity call) and the accounts of the
// page's projects: the billing API has no list of accounts, so one call
// each, a page of them, a few at a time.
func (p *Panel) customerList(q *req) error {
	ctx := q.r.Context()
	qs := q.r.URL.Query()
	projects, err := p.projects(ctx, q)
	if err != nil {
		return err
	}
	search := strings.TrimSpace(qs.Get("q"))
	if search != "" {
		needle := strings.ToLower(search)
		projects = slicesFilter(projects, func(pr project) bool {
			return strings.Contains(strings.ToLower(pr.Name), needle) || strings.HasPrefix(pr.ID, needle)
		})
	}
	page, _ := strconv.Atoi(qs.Get("page"))
	last := max(0, (len(projects)-1)/customersPerPage)
	page = min(max(page, 0), last)
	d := customersData{Search: search, Page: page + 1, Total: len(projects)}
	from := page * customersPerPage
	shown := projects[from:min(from+customersPerPage, len(projects))]
	d.Rows = p.accounts(ctx, q, shown)
	pageLink := func(n int) string {
		v := url.Values{"page": {strconv.Itoa(n)}}
		if search != "" {
			v.Set("q", search)
		}
		return "?" + v.Encode()
	}
	if page > 0 {
		d.Prev = pageLink(page - 1)
	}
	if page < last {
		d.Next = pageLink(page + 1)
	}
	return q.render("admin_customers", q.T("Customers"), d)
}

// projects are every project, by name (identity's list, as the admin).
func (p *Panel) projects(ctx context.Context, q *req) ([]project, error) {
	var out struct {
		Projects []project `json:"projects"`
	}
	if err := q.api.Get(ctx, Identity, "/projects", &out); err != nil {
		return nil, err
	}
	sort.Slice(out.Projects, func(i, j int) bool { return out.Projects[i].Name < out.Projects[j].Name })
	return out.Projects, nil
}

// accounts reads each project's account, accountCalls at a time; an
// account that cannot be read says why in its row.
func (p *Panel) accounts(ctx context.Context, q *req, projects []project) []customerRow {
	rows := make([]customerRow, len(projects))
	sem := make(chan struct{}, accountCalls)
	var wg sync.WaitGroup
	for i, pr := range projects {
		rows[i].Project = pr
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			var out struct {
				Account account `json:"account"`
			}
			if err := q.api.Get(ctx, Billing, "/v1/accounts/"+url.PathEscape(pr.ID), &out); err != nil {
				rows[i].Err = err.Error()
				return
			}
			rows[i].Account = out.Account
			rows[i].Suspended = out.Account.Balance+out.Account.CreditLimit < 0
		}()
	}
	wg.Wait()
	return rows
}

func slicesFilter[T any](s []T, keep func(T) bool) []T {
	out := s[:0:0]
	for _, v := range s {
		if keep(v) {
			out = append(out, v)
		}
	}
	return out
}

type customerData struct {
	Project project
	Account account
	// LimitMajor fills the credit limit's field.
	LimitMajor string
}

// customerPage is one project's account with the operator's forms.
func (p *Panel) customerPage(q *req) error {
	ctx := q.r.Context()
	id := q.r.PathValue("project")
	var d customerData
	var pr struct {
		Project project `json:"project"`
	}
	var acc struct {
		Account account `json:"account"`
	}
	err := parallel(
		func() error { return q.api.Get(ctx, Identity, "/projects/"+url.PathEscape(id), &pr) },
		func() error { return q.api.Get(ctx, Billing, "/v1/accounts/"+url.PathEscape(id), &acc) },
	)
	if err != nil {
		return err
	}
	d.Project, d.Account = pr.Project, acc.Account
	d.LimitMajor = p.cfg.Money.major(d.Account.CreditLimit)
	return q.render("admin_customer", d.Project.Name, d)
}

// customerPath is the operator's page of the project in the request.
func customerPath(q *req) string {
	return "/admin/customers/" + url.PathEscape(q.r.PathValue("project"))
}

// adjustAccount corrects the balance by a signed amount.
func (p *Panel) adjustAccount(q *req) error {
	f := q.r.PostForm
	amount, ok := parseMinor(f.Get("amount"))
	if !ok || amount == 0 {
		return q.back(customerPath(q), BadRequest(q.T("Write the amount as a number other than 0, such as -50 or 100.50.")))
	}
	body := map[string]any{"adjustment": map[string]any{"amount": amount, "reference": strings.TrimSpace(f.Get("reference"))}}
	if err := q.api.Post(q.r.Context(), Billing, "/v1/accounts/"+url.PathEscape(q.r.PathValue("project"))+"/adjustments", body, nil); err != nil {
		return q.back(customerPath(q), err)
	}
	return q.redirect(customerPath(q), q.T("The balance is adjusted by %s.", p.cfg.Money.Format(amount)))
}

// creditAccount records money the operator received (a bank transfer).
func (p *Panel) creditAccount(q *req) error {
	f := q.r.PostForm
	amount, ok := parseMinor(f.Get("amount"))
	if !ok || amount <= 0 {
		return q.back(customerPath(q), BadRequest(q.T("Write the amount as a positive number, such as 1000 or 1000.50.")))
	}
	body := map[string]any{"topup": map[string]any{"amount": amount, "reference": strings.TrimSpace(f.Get("reference"))}}
	if err := q.api.Post(q.r.Context(), Billing, "/v1/accounts/"+url.PathEscape(q.r.PathValue("project"))+"/topups", body, nil); err != nil {
		return q.back(customerPath(q), err)
	}
	return q.redirect(customerPath(q), q.T("%s is credited.", p.cfg.Money.Format(amount)))
}

// setCreditLimit sets how far below zero the balance may go.
func (p *Panel) setCreditLimit(q *req) error {
	limit, ok := parseMinor(q.r.PostForm.Get("credit_limit"))
	if !ok || limit < 0 {
		return q.back(customerPath(q), BadRequest(q.T("Write the credit limit as a number of 0 or more.")))
	}
	path := "/v1/accounts/" + url.PathEscape(q.r.PathValue("project")) + "/credit_limit"
	if err := q.api.Do(q.r.Context(), http.MethodPut, Billing, path, map[string]any{"credit_limit": limit}, nil); err != nil {
		return q.back(customerPath(q), err)
	}
	return q.redirect(customerPath(q), q.T("The credit limit is now %s.", p.cfg.Money.Format(limit)))
}
