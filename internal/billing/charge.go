package billing

import (
	"context"
	"math"
	"strings"
	"time"

	"nimbus/internal/metering"
	"nimbus/internal/store"
)

// Result is what one charging pass did.
type Result struct {
	From, To time.Time // first and last hour processed (hour starts)
	Hours    int
	Charges  int   // ledger rows inserted (not those already there)
	Amount   int64 // minor units charged by those rows
	CaughtUp bool  // false when MaxCatchUpHours cut the pass short
}

const (
	stateChargedThrough = "charged_through"
	// stateLastPass is the start time of the latest pass that completed
	// every hour up to the one it ran in.
	stateLastPass = "last_pass"
)

// chargeRowsPerInsert keeps one multi-row INSERT under SQLite's limit of
// 32766 placeholders at 9 per row (PostgreSQL takes arrays instead).
const chargeRowsPerInsert = 3600

// ChargeUntil runs one charging pass at time now: every started hour since
// the last complete one, up to the hour now is in, is charged for every
// metered resource (internal/metering) that existed during it, at its
// quoted hourly price, except hours a prepaid term covers.
//
// Exactly once: each charge is one ledger row unique on (kind, resource_id,
// period_start), inserted with ON CONFLICT DO NOTHING, so re-running a
// pass, or two processes running it at once on one PostgreSQL, records
// nothing twice. The current hour is charged on every pass (a resource
// created later in the hour is charged by the next pass); an hour is
// marked complete in billing_state only once it ended Config.Grace ago.
//
// Rules: a resource pays each hour any of its usage periods touches (a
// started hour in full), at the largest price of the periods in that hour:
// the earliest period's charge, plus a "resize:" charge of the difference
// for each later one that costs more. Compute keeps a server's period open
// while it is placed and not shelved, stopped or not, so shelving stops
// charging and deleting ends it. A prepaid term pays its spec's price of
// each hour it covers; a server resized larger pays the rest hourly.
//
// Before charging, terms that ended are renewed or ended; after it, trial
// credit that expired is taken back and every account that spends is
// checked for running dry. Each project's terms, trial, charges and check
// go on when another project's fail: those failures are logged.
func (s *Service) ChargeUntil(ctx context.Context, now time.Time) (Result, error) {
	now = now.UTC()
	current := now.Truncate(time.Hour)
	through, err := s.chargedThrough(ctx, current)
	if err != nil {
		return Result{}, err
	}
	if err := s.endTerms(ctx, now); err != nil {
		return Result{}, err
	}
	res := Result{From: through.Add(time.Hour), To: current, CaughtUp: true}
	spend := map[string]int64{}
	if !res.From.After(res.To) {
		if n := int(res.To.Sub(res.From)/time.Hour) + 1; n > s.cfg.MaxCatchUpHours {
			res.To = res.From.Add(time.Duration(s.cfg.MaxCatchUpHours-1) * time.Hour)
			res.CaughtUp = false
		}
		res.Hours = int(res.To.Sub(res.From)/time.Hour) + 1
		if spend, err = s.charge(ctx, now, &res); err != nil {
			return res, err
		}
	}
	if res.CaughtUp {
		if err := s.ExpireTrials(ctx, now); err != nil {
			return res, err
		}
		if err := s.checkAccounts(ctx, now, spend); err != nil {
			return res, err
		}
	}
	return res, nil
}

// charge runs the hours of res and answers each project's hourly spend in
// the last of them.
func (s *Service) charge(ctx context.Context, now time.Time, res *Result) (map[string]int64, error) {
	prices, err := loadPrices(ctx, s.db)
	if err != nil {
		return nil, err
	}
	terms, err := s.termSpans(ctx, res.From, res.To)
	if err != nil {
		return nil, err
	}
	p := &pass{s: s, prices: prices, from: res.From, to: res.To, createdAt: store.FormatTime(now),
		quotes: map[string]int64{}, specs: map[string]metering.Spec{}, accounts: map[string]bool{}, terms: terms, spend: map[string]int64{}}
	// A period unchanged since Grace before the last complete pass was seen
	// by that pass as it is now, so its hours up to that pass's hour are
	// charged already: skip them instead of re-inserting.
	if v, err := s.state(ctx, stateLastPass); err != nil {
		return nil, err
	} else if v != "" {
		last := store.ParseTime(v)
		p.seenBefore = last.Add(-s.cfg.Grace)
		p.seenThrough = last.Truncate(time.Hour)
	}
	// Reading and pricing the next batch overlaps writing this one: one
	// goroutine reads, this one writes.
	batches := make(chan *work, 1)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var readErr error
	go func() {
		defer close(batches)
		var after cursor
		for {
			w, err := p.read(rctx, after)
			if err != nil {
				readErr = err
				return
			}
			if w == nil {
				return
			}
			select {
			case batches <- w:
			case <-rctx.Done():
				return
			}
			after = w.last
		}
	}()
	for w := range batches {
		if err := p.write(ctx, w); err != nil {
			cancel()
			for range batches {
			}
			return nil, err
		}
	}
	if readErr != nil {
		return nil, readErr
	}
	res.Charges, res.Amount = p.charges, p.amount
	// Hours that ended Grace ago are complete: no period can still appear
	// in them.
	complete := now.Add(-s.cfg.Grace).Truncate(time.Hour).Add(-time.Hour)
	if complete.After(res.To) {
		complete = res.To
	}
	if !complete.Before(res.From) {
		if err := s.setState(ctx, stateChargedThrough, store.FormatTime(complete)); err != nil {
			return nil, err
		}
	}
	if res.CaughtUp {
		if err := s.setState(ctx, stateLastPass, store.FormatTime(now)); err != nil {
			return nil, err
		}
	}
	return p.spend, nil
}

// chargedThrough is the start of the last complete hour; the first pass
// ever starts at the current hour (nothing before billing existed is
// charged) and records the hour before it.
func (s *Service) chargedThrough(ctx context.Context, current time.Time) (time.Time, error) {
	var v string
	err := s.db.QueryRow(ctx, "SELECT value FROM billing_state WHERE name = ?", stateChargedThrough).Scan(&v)
	if err == nil {
		return store.ParseTime(v), nil
	}
	if !store.IsNoRows(err) {
		return time.Time{}, err
	}
	t := current.Add(-time.Hour)
	_, err = s.db.Exec(ctx, "INSERT INTO billing_state (name, value) VALUES (?, ?) ON CONFLICT (name) DO NOTHING",
		stateChargedThrough, store.FormatTime(t))
	if err != nil {
		return time.Time{}, err
	}
	// Another process may have won the insert: read what is there.
	if err := s.db.QueryRow(ctx, "SELECT value FROM billing_state WHERE name = ?", stateChargedThrough).Scan(&v); err != nil {
		return time.Time{}, err
	}
	return store.ParseTime(v), nil
}

// state reads a marker; "" when unset.
func (s *Service) state(ctx context.Context, name string) (string, error) {
	var v string
	err := s.db.QueryRow(ctx, "SELECT value FROM billing_state WHERE name = ?", name).Scan(&v)
	if store.IsNoRows(err) {
		return "", nil
	}
	return v, err
}

// setState moves a time marker forward, never back (two passes may finish
// in either order); the fixed-width time format sorts as text.
func (s *Service) setState(ctx context.Context, name, value string) error {
	_, err := s.db.Exec(ctx, `INSERT INTO billing_state (name, value) VALUES (?, ?)
 ON CONFLICT (name) DO UPDATE SET value = excluded.value WHERE billing_state.value < excluded.value`,
		name, value)
	return err
}

// pass is one charging pass's working state.
type pass struct {
	s         *Service
	prices    *PriceList
	from, to  time.Time
	createdAt string
	// seenBefore and seenThrough: periods changed before seenBefore are
	// charged through the hour seenThrough already (zero when unknown).
	seenBefore  time.Time
	seenThrough time.Time
	// quotes caches the hourly price by spec: servers of one flavor share
	// it, so 100,000 servers need a handful of quotes.
	quotes map[string]int64
	specs  map[string]metering.Spec // decoded specs by their text
	// accounts known to exist, so each is ensured once per pass.
	accounts map[string]bool
	terms    map[string][]span // prepaid terms by resource
	spend    map[string]int64  // project → hourly price of what runs in hour `to`
	charges  int
	amount   int64
}

type charge struct {
	project, resource string
	hour              time.Time
	amount            int64
	ref, name         string // name: the resource's, for the ledger
}

// cursor is where a page of periods ends: (resource_id, id).
type cursor struct{ resource, id string }

// work is one batch of periods, priced: the charges to write.
type work struct {
	last     cursor // the last period read
	charges  []charge
	projects map[string]bool
}

// read prices the next BatchSize periods after `after` in (resource, id)
// order (nil when there are none left). Only the reading goroutine calls
// it.
func (p *pass) read(ctx context.Context, after cursor) (*work, error) {
	periods, err := metering.Page(ctx, p.s.db, after.resource, after.id, p.from, p.to, p.s.cfg.BatchSize, p.specs)
	if err != nil || len(periods) == 0 {
		return nil, err
	}
	lp := periods[len(periods)-1]
	w := &work{last: cursor{lp.ResourceID, lp.ID}, projects: map[string]bool{}}
	metering.SortPeriods(periods)
	for len(periods) > 0 {
		n := 1
		for n < len(periods) && periods[n].ResourceID == periods[0].ResourceID {
			n++
		}
		p.price(periods[:n], w)
		periods = periods[n:]
	}
	return w, nil
}

// price adds to w the charges of one resource's periods (sorted by start).
// Each hour is charged at its earliest period's price; a later period that
// starts inside the hour (a resize, an unshelve) and costs more adds the
// difference, keyed by its start, so the hour costs the largest of the
// prices in it, once, however many passes see it.
func (p *pass) price(group []metering.Period, w *work) {
	add := func(pd *metering.Period, at time.Time, amount int64, ref string) {
		w.charges = append(w.charges, charge{project: pd.ProjectID, resource: pd.ResourceID, hour: at, amount: amount,
			ref: ref + refName(pd), name: pd.Spec.Name})
		w.projects[pd.ProjectID] = true
	}
	metering.Assign(group, p.from, p.to, func(h metering.Hour) bool {
		top, covered := p.due(h.Period, h.Start)
		if (!covered || top > 0) && !p.seen(h.Period, h.Start) {
			add(h.Period, h.Start, top, "hour:")
		}
		end := h.Start.Add(time.Hour)
		for i := range group {
			pd := &group[i]
			if !pd.Start.After(h.Start) || !pd.Start.Before(end) {
				continue
			}
			due, _ := p.due(pd, h.Start)
			if due <= top {
				continue
			}
			if !p.seen(pd, h.Start) {
				add(pd, pd.Start, due-top, "resize:")
			}
			top = due
		}
		return true
	})
	// What runs now: the open period's price, less what a term pays.
	if last := &group[len(group)-1]; last.Open() {
		due, _ := p.due(last, p.to)
		if sum, err := addMoney(p.spend[last.ProjectID], due); err == nil {
			p.spend[last.ProjectID] = sum
		} else {
			p.spend[last.ProjectID] = math.MaxInt64 // at least this much: the warnings and the dry check still hold
		}
	}
}

// seen reports whether an earlier complete pass charged pd's hour h
// already: a period unchanged since Grace before that pass was seen by it
// as it is now.
func (p *pass) seen(pd *metering.Period, h time.Time) bool {
	return !p.seenBefore.IsZero() && pd.Changed.Before(p.seenBefore) && !h.After(p.seenThrough)
}

// due is what pd owes for hour h: its hourly price, less the price of the
// spec a prepaid term covering h was bought for (a resized server pays the
// difference hourly; a smaller one pays nothing more and gets nothing
// back). A term from before terms kept their spec covers the hour whole.
// covered reports whether a term covers h at all.
func (p *pass) due(pd *metering.Period, h time.Time) (amount int64, covered bool) {
	price := p.hourly(pd.Kind, pd.SpecText, pd.Spec)
	t := coveringTerm(p.terms[pd.ResourceID], h)
	switch {
	case t == nil:
		return price, false
	case t.specText == "":
		return 0, true
	}
	return max(0, price-p.hourly(pd.Kind, t.specText, t.spec)), true
}

// write records a batch's charges in one transaction. When that fails and
// the batch spans several projects, each project's charges are written in
// a transaction of their own, so one project whose charges cannot be
// written does not keep the others from being charged: it is logged and
// the pass goes on. Only when no project can be written (the database
// itself is failing) does the pass stop, to be retried.
func (p *pass) write(ctx context.Context, w *work) error {
	if len(w.charges) == 0 {
		return nil
	}
	err := p.writeCharges(ctx, w.charges, w.projects)
	if err == nil || len(w.projects) < 2 || ctx.Err() != nil {
		return err
	}
	byProject := map[string][]charge{}
	for _, c := range w.charges {
		byProject[c.project] = append(byProject[c.project], c)
	}
	written := 0
	for project, cs := range byProject {
		if perr := p.writeCharges(ctx, cs, map[string]bool{project: true}); perr != nil {
			p.s.cfg.Log.Error("billing: charging a project failed", "project", project, "charges", len(cs), "error", perr)
			continue
		}
		written++
	}
	if written == 0 {
		return err
	}
	return nil
}

// writeCharges records charges of projects in one transaction.
func (p *pass) writeCharges(ctx context.Context, charges []charge, projects map[string]bool) error {
	var inserted int
	var amount int64
	err := p.s.db.Tx(ctx, func(tx *store.Tx) error {
		inserted, amount = 0, 0
		if tx.Dialect() == store.Postgres {
			// A batch lost to a crash before its WAL reached disk is charged
			// again by the next pass, and the progress markers, committed
			// synchronously after it, flush it first: waiting for the flush
			// here buys nothing.
			if _, err := tx.Exec(ctx, "SET LOCAL synchronous_commit = off"); err != nil {
				return err
			}
		}
		for project := range projects {
			if p.accounts[project] {
				continue
			}
			if err := p.s.ensureAccount(ctx, tx, project); err != nil {
				return err
			}
		}
		per := chargeRowsPerInsert
		if tx.Dialect() == store.Postgres {
			per = len(charges) // arrays: no placeholder limit
		}
		for i := 0; i < len(charges); i += per {
			part := charges[i:min(i+per, len(charges))]
			k, a, err := p.insert(ctx, tx, part)
			if err != nil {
				return err
			}
			inserted += k
			if amount, err = addMoney(amount, a); err != nil {
				return err
			}
		}
		if p.s.cfg.BeforeCommit != nil {
			p.s.cfg.BeforeCommit()
		}
		return nil
	})
	if err != nil {
		return err
	}
	p.charges += inserted
	if p.amount, err = addMoney(p.amount, amount); err != nil {
		p.amount = math.MaxInt64 // a report only: the ledger is the record
	}
	for project := range projects {
		p.accounts[project] = true // committed: no need to ensure it again this pass
	}
	return nil
}

// refName names what was charged in the ledger's reference.
func refName(pd *metering.Period) string {
	if pd.Spec.Flavor != "" {
		return pd.Kind + ":" + pd.Spec.Flavor
	}
	return pd.Kind
}

// insert writes charges with one multi-row INSERT that skips those already
// recorded. It answers how many rows were new and the sum they charged,
// read back from the rows the INSERT returned, so a pass's report is what
// the ledger got.
func (p *pass) insert(ctx context.Context, tx *store.Tx, part []charge) (int, int64, error) {
	var q string
	var args []any
	if tx.Dialect() == store.Postgres {
		// One array per column: nine parameters however many rows, which
		// spares pgx encoding thousands of placeholders.
		cols := make([][]string, 8)
		amounts := make([]int64, len(part))
		for i := range cols {
			cols[i] = make([]string, len(part))
		}
		for i, c := range part {
			cols[0][i], cols[1][i], cols[2][i] = newID(), c.project, KindCharge
			cols[3][i], cols[4][i], cols[5][i], cols[6][i], cols[7][i] = c.resource, store.FormatTime(c.hour), p.createdAt, c.ref, c.name
			amounts[i] = -c.amount
		}
		q = `INSERT INTO billing_ledger (id, project_id, kind, amount, resource_id, period_start, created_at, reference, resource_name)
 SELECT * FROM unnest(?::text[], ?::text[], ?::text[], ?::bigint[], ?::text[], ?::text[], ?::text[], ?::text[], ?::text[])
 ON CONFLICT DO NOTHING RETURNING amount`
		args = []any{cols[0], cols[1], cols[2], amounts, cols[3], cols[4], cols[5], cols[6], cols[7]}
	} else {
		var b strings.Builder
		b.WriteString("INSERT INTO billing_ledger (id, project_id, kind, amount, resource_id, period_start, created_at, reference, resource_name) VALUES ")
		args = make([]any, 0, len(part)*9)
		for i, c := range part {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString("(?, ?, ?, ?, ?, ?, ?, ?, ?)")
			args = append(args, newID(), c.project, KindCharge, -c.amount, c.resource, store.FormatTime(c.hour), p.createdAt, c.ref, c.name)
		}
		b.WriteString(" ON CONFLICT DO NOTHING RETURNING amount")
		q = b.String()
	}
	rows, err := tx.Query(ctx, q, args...)
	if err != nil {
		return 0, 0, err
	}
	defer rows.Close()
	var n int
	var sum int64
	for rows.Next() {
		var a int64
		if err := rows.Scan(&a); err != nil {
			return 0, 0, err
		}
		n++
		if sum, err = addMoney(sum, -a); err != nil {
			return 0, 0, err
		}
	}
	return n, sum, rows.Err()
}

// hourly is the price for one hour of a resource of kind and spec (text:
// the spec as stored, the cache's key): the Quote of its spec. A spec the
// price list cannot price in full is warned about once per pass.
func (p *pass) hourly(kind, text string, sp metering.Spec) int64 {
	key := kind + text
	if v, ok := p.quotes[key]; ok {
		return v
	}
	v, err := p.prices.HourlyOf(kind, sp, p.s.cfg.Currency, p.s.cfg.HoursPerMonth)
	if err != nil {
		p.s.cfg.Log.Warn("billing: resource not fully priced", "kind", kind, "spec", text, "error", err)
	}
	p.quotes[key] = v
	return v
}
