package billing

import (
	"errors"
	"net/http"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// termRoutes are the prepaid terms:
//
//	GET  /v1/terms          the project's terms, newest first
//	POST /v1/terms          {"term": {"server_id", "months", "auto_renew", "on_end"}}: rent a server for a term
//	PUT  /v1/terms/{id}     {"term": {"auto_renew", "on_end"}}: change what happens at the end
func (s *Service) termRoutes() []api.Route {
	return []api.Route{
		{Pattern: "GET /v1/terms", Handler: s.listTerms},
		{Pattern: "POST /v1/terms", Handler: s.createTerm},
		{Pattern: "PUT /v1/terms/{id}", Handler: s.updateTerm},
	}
}

func (s *Service) listTerms(r *http.Request) (*api.Response, error) {
	p, err := project(r)
	if err != nil {
		return nil, err
	}
	ts, err := s.Terms(r.Context(), p)
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, map[string]any{"terms": ts}), nil
}

func (s *Service) createTerm(r *http.Request) (*api.Response, error) {
	p, err := project(r)
	if err != nil {
		return nil, err
	}
	var body struct {
		ServerID  string `json:"server_id"`
		Months    *int   `json:"months"`
		AutoRenew bool   `json:"auto_renew"`
		OnEnd     string `json:"on_end"`
	}
	if err := wrapped(r, "term", &body); err != nil {
		return nil, err
	}
	if body.ServerID == "" || len(body.ServerID) > 64 || !api.ValidText(body.ServerID) {
		return nil, api.BadRequest("'server_id' is a required property")
	}
	if body.Months == nil {
		return nil, api.BadRequest("'months' is a required property")
	}
	t, err := s.BuyTerm(r.Context(), p, TermRequest{ServerID: body.ServerID, Months: *body.Months, AutoRenew: body.AutoRenew, OnEnd: body.OnEnd})
	if err != nil {
		return nil, termError(err)
	}
	return api.JSON(http.StatusCreated, map[string]any{"term": t}), nil
}

func (s *Service) updateTerm(r *http.Request) (*api.Response, error) {
	p, err := project(r)
	if err != nil {
		return nil, err
	}
	var body struct {
		AutoRenew *bool   `json:"auto_renew"`
		OnEnd     *string `json:"on_end"`
	}
	if err := wrapped(r, "term", &body); err != nil {
		return nil, err
	}
	t, err := s.UpdateTerm(r.Context(), p, r.PathValue("id"), body.AutoRenew, body.OnEnd)
	if errors.Is(err, store.ErrNotFound) {
		return nil, api.NotFound("Term %s could not be found.", r.PathValue("id"))
	}
	if err != nil {
		return nil, termError(err)
	}
	return api.JSON(http.StatusOK, map[string]any{"term": t}), nil
}

// termError turns a term order's refusal into its HTTP answer.
func termError(err error) error {
	var ae *api.Error
	switch {
	case errors.As(err, &ae):
		return err
	case errors.Is(err, ErrInvalid), errors.Is(err, ErrUnpriced):
		return api.BadRequest("%s", err.Error())
	case errors.Is(err, ErrNotRunning), errors.Is(err, ErrTermExists):
		return api.Conflict("%s", upperFirst(err.Error())+".")
	case errors.Is(err, ErrInsufficient):
		return api.Errorf(http.StatusPaymentRequired, "%s", upperFirst(err.Error())+": top up first.")
	}
	return err
}

func upperFirst(s string) string {
	if s == "" || s[0] < 'a' || s[0] > 'z' {
		return s
	}
	return string(s[0]-'a'+'A') + s[1:]
}
