package billing

import "nimbus/internal/api"

// paymentRoutes are the payment providers' routes (webhooks, top-up status).
func (s *Service) paymentRoutes() []api.Route { return nil }
