package panel

import (
	"net/url"
)

// supportAdminRoutes are the operator's queue of support requests, the
// same by customer, and closing or reopening one.
func (p *Panel) supportAdminRoutes() []route {
	return []route{
		{"GET /admin/support/requests", admin, p.requestQueue},
		{"GET /admin/support/customers", admin, p.requestsByCustomer},
		{"POST /admin/support/requests/{id}/close", admin, p.setRequestStateForm(requestClosed)},
		{"POST /admin/support/requests/{id}/reopen", admin, p.setRequestStateForm(requestOpen)},
	}
}

// Page sizes of the operator's support lists.
const (
	queuePage  = 50
	groupsPage = 50
	// groupsOnTrials is how many customers with open requests the trials
	// page shows before linking to the rest.
	groupsOnTrials = 20
)

// stateFilter reads ?state=: open when absent, "" for all, or closed.
func stateFilter(q *req) (string, error) {
	switch s := q.r.URL.Query().Get("state"); s {
	case "", requestOpen:
		return requestOpen, nil
	case "all":
		return "", nil
	case requestClosed:
		return s, nil
	}
	return "", BadRequest(q.T("Show open, closed or all requests."))
}

// stateParam is the ?state= value of a filter.
func stateParam(state string) string {
	if state == "" {
		return "all"
	}
	return state
}

type queueData struct {
	State, Project string // the filters; Project "" for every customer
	ProjectName    string
	Requests       []ConfigRequest
	// Next is the next page's link, "" on the last; First is the first
	// page's when this is not it.
	Next, First string
	// Here is this page, where closing a request comes back to.
	Here string
}

// requestQueue is the operator's queue: every customer's requests (or
// one's), newest first, in pages past a marker, by state.
func (p *Panel) requestQueue(q *req) error {
	state, err := stateFilter(q)
	if err != nil {
		return err
	}
	qv := q.r.URL.Query()
	d := queueData{State: stateParam(state), Project: qv.Get("project"), Here: q.r.URL.RequestURI()}
	d.Requests, d.Next, err = p.requests(q.r.Context(), requestFilter{Project: d.Project, State: state}, qv.Get("marker"), queuePage)
	if err != nil {
		return err
	}
	link := func(marker string) string {
		v := url.Values{"state": {d.State}}
		if d.Project != "" {
			v.Set("project", d.Project)
		}
		if marker != "" {
			v.Set("marker", marker)
		}
		return "/admin/support/requests?" + v.Encode()
	}
	if d.Next != "" {
		d.Next = link(d.Next)
	}
	if qv.Get("marker") != "" {
		d.First = link("")
	}
	if len(d.Requests) > 0 && d.Project != "" {
		d.ProjectName = d.Requests[0].ProjectName
	}
	return q.render("admin_support_requests", q.T("Support requests"), d)
}

// groupTable is what the "requestGroups" template needs.
type groupTable struct {
	View *view
	groupsData
}

// stateForm is what the "stateFilter" template needs.
type stateForm struct {
	View                   *view
	Action, State, Project string
}

type groupsData struct {
	State  string
	Groups []RequestGroup
	// Open and Customers count every open request and who sent them.
	Open, Customers int
	Next, First     string
}

// requestsByCustomer is the queue by customer: one line each with their
// counts, so a customer who sent many is one line among the others.
func (p *Panel) requestsByCustomer(q *req) error {
	state, err := stateFilter(q)
	if err != nil {
		return err
	}
	marker := q.r.URL.Query().Get("marker")
	d, err := p.groups(q, state, marker, groupsPage)
	if err != nil {
		return err
	}
	return q.render("admin_support_customers", q.T("Support requests by customer"), d)
}

// groups is a page of the view by customer with its links and the open
// counts.
func (p *Panel) groups(q *req, state, marker string, limit int) (groupsData, error) {
	ctx := q.r.Context()
	d := groupsData{State: stateParam(state)}
	var next string
	err := parallel(
		func() (err error) { d.Groups, next, err = p.requestGroups(ctx, state, marker, limit); return err },
		func() (err error) { d.Open, d.Customers, err = p.openRequests(ctx); return err },
	)
	if err != nil {
		return d, err
	}
	link := func(marker string) string {
		v := url.Values{"state": {d.State}}
		if marker != "" {
			v.Set("marker", marker)
		}
		return "/admin/support/customers?" + v.Encode()
	}
	if next != "" {
		d.Next = link(next)
	}
	if marker != "" {
		d.First = link("")
	}
	return d, nil
}

// setRequestStateForm closes or reopens a request, then goes back to the
// page the form was on.
func (p *Panel) setRequestStateForm(state string) func(q *req) error {
	return func(q *req) error {
		if err := p.setRequestState(q.r.Context(), q.r.PathValue("id"), "", state); err != nil {
			return err
		}
		msg := q.T("The request is closed.")
		if state == requestOpen {
			msg = q.T("The request is open again.")
		}
		back := q.r.PostForm.Get("next")
		if back == "" {
			back = "/admin/support/requests"
		}
		return q.redirect(safeNext(back), msg)
	}
}
