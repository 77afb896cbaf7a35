package billing

import (
	"errors"
	"io"
	"net/http"
	"strings"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// paymentRoutes are the payment routes beside POST /v1/topups:
//
//	GET  /v1/topups/{id}                   a top-up of the caller's project (admin: any)
//	POST /v1/accounts/{project}/topups     admin: {"topup": {"amount": N, "reference": "bank transfer 123"}}
//	POST /v1/webhooks/{provider}           no token: the provider's signed webhook
func (s *Service) paymentRoutes() []api.Route {
	return []api.Route{
		{Pattern: "GET /v1/topups/{id}", Handler: s.getTopup},
		{Pattern: "POST /v1/accounts/{project}/topups", Handler: s.createManualTopup, AdminOnly: true, Policy: "billing:accounts:topup"},
		// Public: the provider has no token; the signature authenticates it.
		{Pattern: "POST /v1/webhooks/{provider}", Handler: s.postWebhook, Public: true},
	}
}

func (s *Service) getTopup(r *http.Request) (*api.Response, error) {
	c := api.CallerFrom(r.Context())
	id := r.PathValue("id")
	t, err := s.GetTopup(r.Context(), id)
	if errors.Is(err, store.ErrNotFound) || (err == nil && !c.IsAdmin() && (c.ProjectID == "" || t.ProjectID != c.ProjectID)) {
		// Another project's top-up is as unknown as a missing one.
		return nil, api.NotFound("Top-up %s could not be found.", id)
	}
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, map[string]any{"topup": t}), nil
}

// createManualTopup credits money the operator received outside Nimbus;
// the reference (the bank transfer's, say) is required.
func (s *Service) createManualTopup(r *http.Request) (*api.Response, error) {
	p, err := pathProject(r)
	if err != nil {
		return nil, err
	}
	var body struct {
		Amount    *int64 `json:"amount"`
		Reference string `json:"reference"`
	}
	if err := wrapped(r, "topup", &body); err != nil {
		return nil, err
	}
	if body.Amount == nil || *body.Amount <= 0 {
		return nil, api.BadRequest("'amount' must be a positive integer of minor units.")
	}
	body.Reference = strings.TrimSpace(body.Reference)
	if body.Reference == "" || len(body.Reference) > 255 {
		return nil, api.BadRequest("'reference' is required for a manual top-up (at most 255 characters), e.g. the bank transfer's.")
	}
	t, err := s.CreditManual(r.Context(), p, *body.Amount, body.Reference)
	if err != nil {
		return nil, topupError(err, "manual", t)
	}
	return api.JSON(http.StatusCreated, map[string]any{"topup": t}), nil
}

// postWebhook settles a top-up on the provider's signed word. A replay of
// a settled top-up answers 200 and changes nothing, so a provider retrying
// a delivery is never told to retry again.
func (s *Service) postWebhook(r *http.Request) (*api.Response, error) {
	name := r.PathValue("provider")
	body, err := io.ReadAll(r.Body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, api.OverLimit("Request is too large.")
		}
		return nil, api.BadRequest("Malformed request body")
	}
	t, _, err := s.webhook(r.Context(), name, r.Header, body)
	switch {
	case err == nil:
		return api.JSON(http.StatusOK, map[string]any{"topup": t}), nil
	case errors.Is(err, ErrUnknownProvider):
		return nil, api.NotFound("No webhook for payment provider %q.", name)
	case errors.Is(err, ErrBadSignature):
		return nil, api.Errorf(http.StatusUnauthorized, "Webhook signature rejected: %s", strings.TrimPrefix(err.Error(), ErrBadSignature.Error()+": "))
	case errors.Is(err, store.ErrNotFound):
		return nil, api.NotFound("The top-up this webhook names could not be found.")
	case errors.Is(err, ErrTopupSettled):
		return nil, api.Conflict("Top-up %s is already %s.", t.ID, t.Status)
	case errors.Is(err, ErrAmountMismatch):
		return nil, api.BadRequest("The webhook's amount does not match the top-up's.")
	case errors.Is(err, ErrBadWebhook):
		return nil, api.BadRequest("Invalid webhook: %s", strings.TrimPrefix(err.Error(), ErrBadWebhook.Error()+": "))
	}
	return nil, err
}
