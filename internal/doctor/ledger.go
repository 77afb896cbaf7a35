package doctor

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"nimbus/internal/metering"
	"nimbus/internal/store"
)

// The ledger against usage (internal/billing charge.go): every hour a
// usage period (internal/metering) touches is charged once, as one ledger
// row of kind 'charge' keyed (period_start = the hour's start,
// resource_id), reference "hour:…"; a prepaid term pays its hours with one
// charge at its first hour ("term:…"), a resize within an hour adds a
// "resize:…" charge at the new period's start. billing_state's
// charged_through is the start of the last hour billing completed: it
// re-reads no hour up to it.

const (
	checkChargesMissing      = "charges-missing"
	checkChargesWithoutUsage = "charges-without-usage"
	checkChargesTwice        = "charges-twice"
)

// chargeLag is how far behind the current hour billing's last complete
// hour may be: the pass runs 5 s past each hour and completes the hours
// that ended Grace (10 minutes) before it, so just before a pass the last
// complete hour began three hours before the current one.
const chargeLag = 3 * time.Hour

// chargedThrough reads the start of the last hour billing completed.
func chargedThrough(ctx context.Context, q store.Querier) (time.Time, bool, error) {
	var v string
	err := q.QueryRow(ctx, "SELECT value FROM billing_state WHERE name = 'charged_through'").Scan(&v)
	if store.IsNoRows(err) {
		return time.Time{}, false, nil
	}
	return store.ParseTime(v), err == nil, err
}

// chargingBehind: hours after billing's last complete one are charged
// late, and not at all while no controller runs the pass.
func chargingBehind(ctx context.Context, r *run) error {
	through, ok, err := chargedThrough(ctx, r.q)
	if err != nil {
		return err
	}
	current := r.cfg.Now.Truncate(time.Hour)
	if ok && !through.Before(current.Add(-chargeLag)) {
		return nil
	}
	var id string
	if err := r.q.QueryRow(ctx, "SELECT id FROM metering_periods LIMIT 1").Scan(&id); store.IsNoRows(err) {
		return nil // nothing metered, nothing to charge
	} else if err != nil {
		return err
	}
	problem := "it has never completed an hour, while resources are metered: nothing is charged"
	if ok {
		problem = fmt.Sprintf("it has completed the hours up to the one starting %s only (%s behind the current hour): later hours are charged late, or not at all",
			through.UTC().Format(time.RFC3339), current.Sub(through))
	}
	r.emit("billing's charging pass", problem,
		"every controller runs the pass 5 s past each hour: check that one runs (its log says \"billing: charging pass\"), "+
			"and run it now: nimbus admin billing run (it goes on until caught up); if it fails, its error says why")
	return nil
}

// ledgerHours checks, hour by hour over the last Config.BillingHours hours
// billing completed, the usage against the charges: charges-missing,
// charges-without-usage and charges-twice. Hours before the first hourly
// charge are not checked: billing charges nothing from before it began.
func ledgerHours(ctx context.Context, r *run) error {
	through, ok, err := chargedThrough(ctx, r.q)
	if err != nil || !ok {
		return err
	}
	var first sql.NullString
	if err := r.q.QueryRow(ctx, "SELECT MIN(period_start) FROM billing_ledger WHERE kind = 'charge' AND reference LIKE 'hour:%'").
		Scan(&first); err != nil || !first.Valid {
		return err
	}
	from := through.Add(-time.Duration(r.cfg.BillingHours-1) * time.Hour)
	if f := store.ParseTime(first.String).Truncate(time.Hour); f.After(from) {
		from = f
	}
	specs := map[string]metering.Spec{}
	for h := from; !h.After(through); h = h.Add(time.Hour) {
		if err := r.ledgerHour(ctx, h, specs); err != nil {
			return err
		}
	}
	return nil
}

// row is one resource's entry in one of the streams an hour merges.
type row struct {
	resource, id, project, kind, ref string
	at                               string // a charge's period_start
	amount                           int64
}

// stream is a table read in pages in resource order.
type stream struct {
	fetch func(ctx context.Context, after row) ([]row, error)
	buf   []row
	last  row
	done  bool
}

// head is the next row, nil at the end.
func (s *stream) head(ctx context.Context) (*row, error) {
	if len(s.buf) > 0 {
		return &s.buf[0], nil
	}
	if s.done {
		return nil, nil
	}
	page, err := s.fetch(ctx, s.last)
	if err != nil {
		return nil, err
	}
	if len(page) == 0 {
		s.done = true
		return nil, nil
	}
	s.buf, s.last = page, page[len(page)-1]
	return &s.buf[0], nil
}

func (s *stream) pop() { s.buf = s.buf[1:] }

func scanRows(rows *sql.Rows, scan func(*row) []any) ([]row, error) {
	defer rows.Close()
	var out []row
	for rows.Next() {
		var x row
		if err := rows.Scan(scan(&x)...); err != nil {
			return nil, err
		}
		out = append(out, x)
	}
	return out, rows.Err()
}

// ledgerHour merges, in resource order, the resources in use during hour
// h (their usage periods), its charges and the prepaid terms covering it.
func (r *run) ledgerHour(ctx context.Context, h time.Time, specs map[string]metering.Spec) error {
	hour := store.FormatTime(h)
	n := r.cfg.PageSize
	used := &stream{fetch: func(ctx context.Context, after row) ([]row, error) {
		ps, err := metering.Page(ctx, r.q, after.resource, after.id, h, h, n, specs)
		out := make([]row, len(ps))
		for i, p := range ps {
			out[i] = row{resource: p.ResourceID, id: p.ID, project: p.ProjectID, kind: p.Kind}
		}
		return out, err
	}}
	charged := &stream{fetch: func(ctx context.Context, after row) ([]row, error) {
		rows, err := r.q.Query(ctx, `SELECT resource_id, id, project_id, amount, reference FROM billing_ledger
 WHERE kind = 'charge' AND period_start = ? AND resource_id > ? ORDER BY resource_id LIMIT ?`, hour, after.resource, n)
		if err != nil {
			return nil, err
		}
		return scanRows(rows, func(x *row) []any { return []any{&x.resource, &x.id, &x.project, &x.amount, &x.ref} })
	}}
	covered := &stream{fetch: func(ctx context.Context, after row) ([]row, error) {
		rows, err := r.q.Query(ctx, `SELECT resource_id, id FROM billing_terms WHERE starts_at <= ? AND ends_at > ? AND (resource_id, id) > (?, ?)
 ORDER BY resource_id, id LIMIT ?`, hour, hour, after.resource, after.id, n)
		if err != nil {
			return nil, err
		}
		return scanRows(rows, func(x *row) []any { return []any{&x.resource, &x.id} })
	}}
	offHour, err := r.offHourCharges(ctx, h)
	if err != nil {
		return err
	}
	for {
		u, err := used.head(ctx)
		if err != nil {
			return err
		}
		c, err := charged.head(ctx)
		if err != nil {
			return err
		}
		t, err := covered.head(ctx)
		if err != nil {
			return err
		}
		res, found := "", false
		for _, x := range []*row{u, c, t} {
			if x != nil && (!found || x.resource < res) {
				res, found = x.resource, true
			}
		}
		if !found {
			return nil
		}
		var use, charge *row
		isCovered := false
		for u != nil && u.resource == res {
			if use == nil {
				v := *u
				use = &v
			}
			used.pop()
			if u, err = used.head(ctx); err != nil {
				return err
			}
		}
		if c != nil && c.resource == res {
			v := *c
			charge = &v
			charged.pop()
		}
		for t != nil && t.resource == res {
			isCovered = true
			covered.pop()
			if t, err = covered.head(ctx); err != nil {
				return err
			}
		}
		switch {
		case isCovered:
		case use != nil && charge == nil:
			if offHour {
				if paid, err := r.chargedInHour(ctx, res, h); err != nil {
					return err
				} else if paid {
					continue // paid off the hour's start: not missing
				}
			}
			r.emitAs(checkChargesMissing, fmt.Sprintf("%s %s of project %s, hour %s", use.kind, res, use.project, h.UTC().Format(time.RFC3339)),
				"it was in use in that hour, which billing completed, but the ledger has no charge for it: billing does not go back to a complete hour",
				fmt.Sprintf("have billing charge the hours it missed: UPDATE billing_state SET value = %s WHERE name = 'charged_through' AND value > %s; "+
					"DELETE FROM billing_state WHERE name = 'last_pass'; then nimbus admin billing run. The pass charges every hour from then "+
					"again and adds only the charges that are missing (one per resource and hour).",
					sqlString(store.FormatTime(h.Add(-time.Hour))), sqlString(store.FormatTime(h.Add(-time.Hour)))))
		case use == nil && charge != nil && strings.HasPrefix(charge.ref, "hour:"):
			r.emitAs(checkChargesWithoutUsage, fmt.Sprintf("charge %s (%s %s of project %s, hour %s)", charge.id, charge.ref, res, charge.project, h.UTC().Format(time.RFC3339)),
				fmt.Sprintf("it charged %d minor units for an hour in which no usage period of the resource lies (a build that failed before it ran is never billed)", -charge.amount),
				refund(charge, "no usage in hour "+h.UTC().Format(time.RFC3339)))
		}
	}
}

// refund is the operator's command that pays a charge back: the ledger is
// append-only, so a wrong charge is undone by a credit.
func refund(c *row, why string) string {
	return fmt.Sprintf("refund it (the ledger is never edited): nimbus admin billing adjust %s %d --reference %q",
		c.project, -c.amount, "refund of charge "+c.id+": "+why)
}

// offHourCharges names, as charges-twice, each hourly charge of hour h
// keyed off the hour's start whose resource the hour's own charge pays
// already, and reports whether there are any off-hour charges at all
// (normally none: billing keys every hourly charge by its hour's start).
func (r *run) offHourCharges(ctx context.Context, h time.Time) (bool, error) {
	lo, hi := store.FormatTime(h), store.FormatTime(h.Add(time.Hour))
	found := false
	for afterStart, afterRes := lo, ""; ; {
		rows, err := r.q.Query(ctx, `SELECT period_start, resource_id, id, project_id, amount, reference FROM billing_ledger
 WHERE kind = 'charge' AND period_start < ? AND (period_start > ? OR (period_start = ? AND resource_id > ?)) AND period_start > ?
 AND reference LIKE 'hour:%' ORDER BY period_start, resource_id LIMIT ?`, hi, afterStart, afterStart, afterRes, lo, r.cfg.PageSize)
		if err != nil {
			return false, err
		}
		page, err := scanRows(rows, func(x *row) []any { return []any{&x.at, &x.resource, &x.id, &x.project, &x.amount, &x.ref} })
		if err != nil || len(page) == 0 {
			return found, err
		}
		found = true
		afterStart, afterRes = page[len(page)-1].at, page[len(page)-1].resource
		for i := range page {
			c := &page[i]
			var other string
			err := r.q.QueryRow(ctx, "SELECT id FROM billing_ledger WHERE kind = 'charge' AND period_start = ? AND resource_id = ?", lo, c.resource).Scan(&other)
			if store.IsNoRows(err) {
				continue
			} else if err != nil {
				return false, err
			}
			r.emitAs(checkChargesTwice, fmt.Sprintf("charge %s (%s %s of project %s, at %s)", c.id, c.ref, c.resource, c.project, c.at),
				fmt.Sprintf("it charged %d minor units for the hour starting %s, which charge %s pays already", -c.amount, h.UTC().Format(time.RFC3339), other),
				refund(c, "a second charge for hour "+h.UTC().Format(time.RFC3339)))
		}
	}
}

// chargedInHour reports whether some hourly charge of hour h pays for
// resource, keyed on the hour's start or not.
func (r *run) chargedInHour(ctx context.Context, resource string, h time.Time) (bool, error) {
	var id string
	err := r.q.QueryRow(ctx, `SELECT id FROM billing_ledger WHERE kind = 'charge' AND period_start >= ? AND period_start < ?
 AND resource_id = ? AND reference LIKE 'hour:%' LIMIT 1`, store.FormatTime(h), store.FormatTime(h.Add(time.Hour)), resource).Scan(&id)
	if store.IsNoRows(err) {
		return false, nil
	}
	return err == nil, err
}
