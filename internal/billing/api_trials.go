package billing

import (
	"errors"
	"net/http"
	"strings"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// trialRoutes are the free test access routes:
//
//	POST /v1/trials                  {"trial": {"description": "…"}} → 201 {"trial": {…}}
//	GET  /v1/trials?status=          the caller's project's trials; an admin's lists every
//	                                 project's (narrowed by ?project_id=)
//	GET  /v1/trials/{id}             one trial (the caller's project's; admin: any)
//	POST /v1/trials/{id}/approve     admin: {"approve": {"credit": N, "ends_at": "RFC 3339"}}
//	POST /v1/trials/{id}/decline     admin: {"decline": {"reason": "…"}}
func (s *Service) trialRoutes() []api.Route {
	return []api.Route{
		{Pattern: "POST /v1/trials", Handler: s.createTrial},
		{Pattern: "GET /v1/trials", Handler: s.listTrials},
		{Pattern: "GET /v1/trials/{id}", Handler: s.getTrial},
		{Pattern: "POST /v1/trials/{id}/approve", Handler: s.approveTrial, AdminOnly: true, Policy: "billing:trials:approve"},
		{Pattern: "POST /v1/trials/{id}/decline", Handler: s.declineTrial, AdminOnly: true, Policy: "billing:trials:decline"},
	}
}

func (s *Service) createTrial(r *http.Request) (*api.Response, error) {
	p, err := project(r)
	if err != nil {
		return nil, err
	}
	var body struct {
		Description *string `json:"description"`
	}
	if err := wrapped(r, "trial", &body); err != nil {
		return nil, err
	}
	if body.Description == nil {
		return nil, api.BadRequest("'description' is a required property: describe the task the trial is for.")
	}
	t, err := s.RequestTrial(r.Context(), p, *body.Description)
	if err != nil {
		return nil, trialError(err, "", nil)
	}
	return api.JSON(http.StatusCreated, map[string]any{"trial": t}), nil
}

var trialStatuses = map[string]bool{TrialPending: true, TrialApproved: true, TrialDeclined: true, TrialExpired: true}

func (s *Service) listTrials(r *http.Request) (*api.Response, error) {
	q := r.URL.Query()
	status := q.Get("status")
	if status != "" && !trialStatuses[status] {
		return nil, api.BadRequest("Invalid status %q: must be pending, approved, declined or expired.", status)
	}
	var p string
	if api.CallerFrom(r.Context()).IsAdmin() {
		// The operator's queue spans projects.
		p = q.Get("project_id")
	} else {
		var err error
		if p, err = project(r); err != nil {
			return nil, err
		}
	}
	ts, err := s.ListTrials(r.Context(), p, status)
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, map[string]any{"trials": ts}), nil
}

func (s *Service) getTrial(r *http.Request) (*api.Response, error) {
	id := r.PathValue("id")
	t, err := s.GetTrial(r.Context(), id)
	c := api.CallerFrom(r.Context())
	if errors.Is(err, store.ErrNotFound) || (err == nil && !c.IsAdmin() && (c.ProjectID == "" || t.ProjectID != c.ProjectID)) {
		return nil, api.NotFound("Trial %s could not be found.", id)
	}
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, map[string]any{"trial": t}), nil
}

func (s *Service) approveTrial(r *http.Request) (*api.Response, error) {
	id := r.PathValue("id")
	var body struct {
		Credit *int64  `json:"credit"`
		EndsAt *string `json:"ends_at"`
	}
	if err := wrapped(r, "approve", &body); err != nil {
		return nil, err
	}
	if body.Credit == nil {
		return nil, api.BadRequest("'credit' is a required property (minor units).")
	}
	if body.EndsAt == nil {
		return nil, api.BadRequest("'ends_at' is a required property (RFC 3339 time).")
	}
	ends, err := time.Parse(time.RFC3339, *body.EndsAt)
	if err != nil {
		return nil, api.BadRequest("Invalid 'ends_at' %q: must be an RFC 3339 time such as 2025-07-01T00:00:00Z.", *body.EndsAt)
	}
	t, err := s.ApproveTrial(r.Context(), id, *body.Credit, ends)
	if err != nil {
		return nil, trialError(err, id, t)
	}
	return api.JSON(http.StatusOK, map[string]any{"trial": t}), nil
}

func (s *Service) declineTrial(r *http.Request) (*api.Response, error) {
	id := r.PathValue("id")
	var body struct {
		Reason *string `json:"reason"`
	}
	if err := wrapped(r, "decline", &body); err != nil {
		return nil, err
	}
	if body.Reason == nil {
		return nil, api.BadRequest("'reason' is a required property: tell the customer why.")
	}
	t, err := s.DeclineTrial(r.Context(), id, *body.Reason)
	if err != nil {
		return nil, trialError(err, id, t)
	}
	return api.JSON(http.StatusOK, map[string]any{"trial": t}), nil
}

// trialError maps the trial errors to client answers.
func trialError(err error, id string, t *Trial) error {
	switch {
	case errors.Is(err, ErrTrialInvalid):
		return api.BadRequest("Invalid trial: %s.", strings.TrimPrefix(err.Error(), ErrTrialInvalid.Error()+": "))
	case errors.Is(err, ErrTrialOpen):
		return api.Conflict("The project already has a pending or approved trial.")
	case errors.Is(err, store.ErrNotFound):
		return api.NotFound("Trial %s could not be found.", id)
	case errors.Is(err, ErrTrialNotPending) && t != nil:
		return api.Conflict("Trial %s is %s, not pending: it was decided already.", id, t.Status)
	}
	return err
}
