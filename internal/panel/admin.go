package panel

import "slices"

// adminRoutes are the operator's pages, by area: customers and trials
// (admin_customers.go, admin_trials.go), hosts, prices and support
// settings (admin_operator.go), support requests (admin_support.go).
func (p *Panel) adminRoutes() []route {
	return slices.Concat(p.customerRoutes(), p.trialAdminRoutes(), p.operatorRoutes(), p.supportAdminRoutes())
}
