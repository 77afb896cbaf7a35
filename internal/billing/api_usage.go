package billing

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/store"
)

// usageRoutes:
//
//	GET /v1/usage?month=YYYY-MM   what each resource cost in a month (default: this month)
//	GET /v1/notices               what billing told the project (running-dry warnings, suspensions)
func (s *Service) usageRoutes() []api.Route {
	return []api.Route{
		{Pattern: "GET /v1/usage", Handler: s.getUsage},
		{Pattern: "GET /v1/notices", Handler: s.listNotices},
	}
}

// ResourceUsage is what one resource was charged in a month.
type ResourceUsage struct {
	ResourceID string `json:"resource_id"`
	Kind       string `json:"kind"` // server, public_ipv4, volume, backup
	Name       string `json:"name"` // the flavor, for servers
	// ResourceName is the resource's own name (an address for an
	// address) as its latest charge of the month recorded it.
	ResourceName string `json:"resource_name"`
	Hours        int    `json:"hours"`
	Hourly       int64  `json:"hourly_amount"` // pay-as-you-go charges, minor units
	Terms        int64  `json:"term_amount"`   // prepaid terms that started in the month
	Amount       int64  `json:"amount"`        // both
}

// Usage sums project's charges whose period starts in the month of
// monthStart, per resource: the ledger is the source, so it always equals
// what was charged.
func (s *Service) Usage(ctx context.Context, project string, monthStart time.Time) ([]ResourceUsage, error) {
	end := monthStart.AddDate(0, 1, 0)
	rows, err := s.db.Query(ctx, `SELECT resource_id, reference, amount, resource_name FROM billing_ledger
 WHERE project_id = ? AND kind = ? AND period_start >= ? AND period_start < ? ORDER BY period_start`,
		project, KindCharge, store.FormatTime(monthStart), store.FormatTime(end))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	by := map[string]*ResourceUsage{}
	for rows.Next() {
		var id, ref, name string
		var amount int64
		if err := rows.Scan(&id, &ref, &amount, &name); err != nil {
			return nil, err
		}
		u := by[id]
		if u == nil {
			u = &ResourceUsage{ResourceID: id}
			by[id] = u
		}
		if name != "" {
			u.ResourceName = name
		}
		hour, isHour := strings.CutPrefix(ref, "hour:")
		resize, isResize := strings.CutPrefix(ref, "resize:")
		var err error
		switch {
		case isHour:
			u.Hours++
			u.Kind, u.Name, _ = strings.Cut(hour, ":")
			u.Hourly, err = addMoney(u.Hourly, -amount)
		case isResize:
			// The difference of an hour that a larger period joined: not
			// an hour of its own.
			u.Kind, u.Name, _ = strings.Cut(resize, ":")
			u.Hourly, err = addMoney(u.Hourly, -amount)
		default:
			if u.Kind == "" {
				u.Kind = "server"
			}
			u.Terms, err = addMoney(u.Terms, -amount)
		}
		if err == nil {
			u.Amount, err = addMoney(u.Amount, -amount)
		}
		if err != nil {
			return nil, fmt.Errorf("billing: usage of %s: %w", id, err)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	out := make([]ResourceUsage, 0, len(by))
	for _, u := range by {
		out = append(out, *u)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ResourceID < out[j].ResourceID })
	return out, nil
}

func (s *Service) getUsage(r *http.Request) (*api.Response, error) {
	p, err := project(r)
	if err != nil {
		return nil, err
	}
	month := s.cfg.Now().UTC()
	if v := r.URL.Query().Get("month"); v != "" {
		if month, err = time.Parse("2006-01", v); err != nil {
			return nil, api.BadRequest("Invalid month %q: use YYYY-MM.", v)
		}
	}
	start := time.Date(month.Year(), month.Month(), 1, 0, 0, 0, 0, time.UTC)
	us, err := s.Usage(r.Context(), p, start)
	if err != nil {
		return nil, err
	}
	var total int64
	for _, u := range us {
		if total, err = addMoney(total, u.Amount); err != nil {
			return nil, err
		}
	}
	body := map[string]any{"month": start.Format("2006-01"), "currency": s.cfg.Currency, "total": total, "resources": us}
	// The hour now running is the current month's, not yet in its total.
	if acc, err := s.Accruing(r.Context(), p); err != nil {
		return nil, err
	} else if !acc.Hour.Before(start) && acc.Hour.Before(start.AddDate(0, 1, 0)) {
		body["accruing"], body["accruing_since"] = acc.Amount, acc.Hour
	}
	return api.JSON(http.StatusOK, map[string]any{"usage": body}), nil
}

func (s *Service) listNotices(r *http.Request) (*api.Response, error) {
	p, err := project(r)
	if err != nil {
		return nil, err
	}
	limit := 100
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return nil, api.BadRequest("Invalid limit %q: must be a positive integer.", v)
		}
		limit = min(n, 1000)
	}
	ns, err := s.Notices(r.Context(), p, limit)
	if err != nil {
		return nil, err
	}
	return api.JSON(http.StatusOK, map[string]any{"notices": ns}), nil
}
