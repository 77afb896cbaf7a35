package billing

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

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

// chargeRowsPerInsert keeps one multi-row INSERT under both engines'
// placeholder limits (SQLite 32766, PostgreSQL 65535) at 8 per row.
const chargeRowsPerInsert = 500

// ChargeUntil runs one charging pass at time now: every started hour since
// the last complete one, up to the hour now is in, is charged for every
// server that existed during it, at its flavor's quoted hourly price.
//
// Exactly once: each charge is one ledger row unique on (kind, resource_id,
// period_start), inserted with ON CONFLICT DO NOTHING, so re-running a
// pass, or two processes running it at once on one PostgreSQL, records
// nothing twice. The current hour is charged on every pass (a server
// created later in the hour is charged by the next pass); an hour is marked
// complete in billing_state only once it ended Config.Grace ago.
//
// Rules: a server pays from the hour of its created_at to the hour of its
// terminated_at when deleted (each started hour in full); stopped servers
// pay. Simplification: compute keeps no history of vm_state, so shelving
// is judged by the server's state when the pass runs: a server shelved or
// shelved_offloaded at pass time is not charged for any hour that pass
// processes. With the job running each hour this only misjudges the hours
// a late (catch-up) pass covers.
func (s *Service) ChargeUntil(ctx context.Context, now time.Time) (Result, error) {
	now = now.UTC()
	current := now.Truncate(time.Hour)
	through, err := s.chargedThrough(ctx, current)
	if err != nil {
		return Result{}, err
	}
	res := Result{From: through.Add(time.Hour), To: current, CaughtUp: true}
	if res.From.After(res.To) {
		return res, nil
	}
	if n := int(res.To.Sub(res.From)/time.Hour) + 1; n > s.cfg.MaxCatchUpHours {
		res.To = res.From.Add(time.Duration(s.cfg.MaxCatchUpHours-1) * time.Hour)
		res.CaughtUp = false
	}
	res.Hours = int(res.To.Sub(res.From)/time.Hour) + 1
	prices, err := loadPrices(ctx, s.db)
	if err != nil {
		return res, err
	}
	p := &pass{s: s, prices: prices, from: res.From, to: res.To, createdAt: store.FormatTime(now),
		quotes: map[string]int64{}, accounts: map[string]bool{}}
	for h := res.From; !h.After(res.To); h = h.Add(time.Hour) {
		p.hours = append(p.hours, store.FormatTime(h))
	}
	// A server row unchanged since Grace before the last complete pass was
	// seen by that pass as it is now, so its hours up to that pass's hour
	// are charged already: skip them instead of re-inserting.
	if v, err := s.state(ctx, stateLastPass); err != nil {
		return res, err
	} else if v != "" {
		last := store.ParseTime(v)
		p.seenBefore = store.FormatTime(last.Add(-s.cfg.Grace))
		p.seenThrough = last.Truncate(time.Hour)
	}
	after := ""
	for {
		n, last, err := p.batch(ctx, after)
		if err != nil {
			return res, err
		}
		if n == 0 {
			break
		}
		after = last
	}
	res.Charges, res.Amount = p.charges, p.amount
	// Hours that ended Grace ago are complete: no server can still appear
	// in them.
	complete := now.Add(-s.cfg.Grace).Truncate(time.Hour).Add(-time.Hour)
	if complete.After(res.To) {
		complete = res.To
	}
	if !complete.Before(res.From) {
		if err := s.setState(ctx, stateChargedThrough, store.FormatTime(complete)); err != nil {
			return res, err
		}
	}
	if res.CaughtUp {
		if err := s.setState(ctx, stateLastPass, store.FormatTime(now)); err != nil {
			return res, err
		}
	}
	return res, nil
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
	hours     []string // FormatTime of each hour from..to
	// seenBefore and seenThrough: rows updated before seenBefore are
	// charged through the hour seenThrough already ("" when unknown).
	seenBefore  string
	seenThrough time.Time
	// quotes caches the hourly price by what it depends on: servers of one
	// flavor share it, so 100,000 servers need a handful of quotes.
	quotes map[string]int64
	// accounts known to exist, so each is ensured once per pass, not per
	// batch.
	accounts map[string]bool
	charges  int
	amount   int64
}

// serverDoc is the part of compute's server document billing reads
// (internal/compute/server_store.go serverDoc).
type serverDoc struct {
	Flavor struct {
		ExtraSpecs map[string]string `json:"extra_specs"`
	} `json:"flavor"`
	OSType string `json:"os_type"`
}

type charge struct {
	project, resource string
	hour              string
	amount            int64
	ref               string
}

// batch charges up to BatchSize servers with ids after `after`, in one
// transaction. It answers how many servers it read and the last id.
func (p *pass) batch(ctx context.Context, after string) (int, string, error) {
	end := p.to.Add(time.Hour)
	rows, err := p.s.db.Query(ctx, `SELECT id, project_id, vm_state, flavor_id, vcpus, memory_mb, disk_gb, created_at, updated_at,
 terminated_at, deleted, doc FROM compute_servers
 WHERE id > ? AND created_at < ? AND (deleted = 0 OR terminated_at >= ? OR terminated_at = '')
 ORDER BY id LIMIT ?`, after, store.FormatTime(end), store.FormatTime(p.from), p.s.cfg.BatchSize)
	if err != nil {
		return 0, "", err
	}
	var (
		n       int
		last    string
		charges []charge
		ids     = map[string]bool{}
	)
	for rows.Next() {
		var id, project, vmState, flavorID, created, updated, terminated, doc string
		var vcpus, memMB, diskGB int64
		var deleted int
		if err := rows.Scan(&id, &project, &vmState, &flavorID, &vcpus, &memMB, &diskGB, &created, &updated,
			&terminated, &deleted, &doc); err != nil {
			rows.Close()
			return 0, "", err
		}
		n++
		last = id
		if deleted == 0 && (vmState == "shelved" || vmState == "shelved_offloaded") {
			continue
		}
		first := store.ParseTime(created).Truncate(time.Hour)
		if p.seenBefore != "" && updated < p.seenBefore && !first.After(p.seenThrough) {
			first = p.seenThrough.Add(time.Hour)
		}
		lastHour := p.to
		if deleted != 0 {
			t := terminated
			if t == "" {
				t = updated // deleted before it ever launched
			}
			lastHour = store.ParseTime(t).Truncate(time.Hour)
		}
		if first.Before(p.from) {
			first = p.from
		}
		if lastHour.After(p.to) {
			lastHour = p.to
		}
		if first.After(lastHour) {
			continue
		}
		price, err := p.hourly(vcpus, memMB, diskGB, doc)
		if err != nil {
			p.s.cfg.Log.Warn("billing: server not fully priced", "server", id, "error", err)
		}
		ref := "server:" + flavorID
		for h := first; !h.After(lastHour); h = h.Add(time.Hour) {
			charges = append(charges, charge{project: project, resource: id, hour: p.hours[h.Sub(p.from)/time.Hour], amount: price, ref: ref})
		}
		ids[project] = true
	}
	if err := rows.Close(); err != nil {
		return 0, "", err
	}
	if err := rows.Err(); err != nil {
		return 0, "", err
	}
	if len(charges) == 0 {
		return n, last, nil
	}
	var inserted int
	var amount int64
	err = p.s.db.Tx(ctx, func(tx *store.Tx) error {
		inserted, amount = 0, 0
		for project := range ids {
			if p.accounts[project] {
				continue
			}
			if err := p.s.ensureAccount(ctx, tx, project); err != nil {
				return err
			}
		}
		for i := 0; i < len(charges); i += chargeRowsPerInsert {
			part := charges[i:min(i+chargeRowsPerInsert, len(charges))]
			k, a, err := p.insert(ctx, tx, part)
			if err != nil {
				return err
			}
			inserted += k
			amount += a
		}
		return nil
	})
	if err != nil {
		return 0, "", err
	}
	p.charges += inserted
	p.amount += amount
	for project := range ids {
		p.accounts[project] = true // committed: no need to ensure it again this pass
	}
	return n, last, nil
}

// insert writes charges with one multi-row INSERT that skips those already
// recorded. It answers how many rows were new and, when all were, their sum;
// when some existed already the sum is not known here and 0 is answered
// (Result.Amount is a report, the ledger is the record).
func (p *pass) insert(ctx context.Context, tx *store.Tx, part []charge) (int, int64, error) {
	var b strings.Builder
	b.WriteString("INSERT INTO billing_ledger (id, project_id, kind, amount, resource_id, period_start, created_at, reference) VALUES ")
	args := make([]any, 0, len(part)*8)
	var sum int64
	for i, c := range part {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("(?, ?, ?, ?, ?, ?, ?, ?)")
		args = append(args, newID(), c.project, KindCharge, -c.amount, c.resource, c.hour, p.createdAt, c.ref)
		sum += c.amount
	}
	b.WriteString(" ON CONFLICT DO NOTHING")
	res, err := tx.Exec(ctx, b.String(), args...)
	if err != nil {
		return 0, 0, err
	}
	k, err := res.RowsAffected()
	if err != nil {
		return 0, 0, err
	}
	if int(k) != len(part) {
		sum = 0 // some were charged before; the amount of the new ones is unknown here
	}
	return int(k), sum, nil
}

// hourly is a server's price for one hour: Quote of its flavor snapshot.
func (p *pass) hourly(vcpus, memMB, diskGB int64, doc string) (int64, error) {
	var d serverDoc
	if err := json.Unmarshal([]byte(doc), &d); err != nil {
		return 0, fmt.Errorf("server document: %w", err)
	}
	c := choiceOf(vcpus, memMB, diskGB, d.Flavor.ExtraSpecs, d.OSType)
	key := fmt.Sprintf("%d/%d/%d/%s/%d/%s/%t/%s", c.VCPUs, c.RAMMB, c.DiskGB, c.DiskType, c.GPUCount, c.GPUModel, c.PublicIPv4, c.OSType)
	if v, ok := p.quotes[key]; ok {
		return v, nil
	}
	q, err := p.prices.Quote(c, p.s.cfg.Currency, p.s.cfg.HoursPerMonth)
	if err != nil {
		// Charge what is priced rather than nothing: drop the unpriced GPU
		// or disk type and quote again.
		c.GPUCount, c.GPUModel = 0, ""
		if _, ok := p.prices.DiskGB[c.DiskType]; !ok {
			c.DiskType = "local"
		}
		q2, err2 := p.prices.Quote(c, p.s.cfg.Currency, p.s.cfg.HoursPerMonth)
		if err2 != nil {
			return 0, err2
		}
		p.quotes[key] = q2.Hourly
		return q2.Hourly, err
	}
	p.quotes[key] = q.Hourly
	return q.Hourly, nil
}

// choiceOf is the configurator choice a server's flavor amounts to:
// its vCPUs, RAM and disk, and from the flavor's extra specs the disk type
// (nimbus:disk_type), public IPv4 (nimbus:public_ipv4), GPU model
// (nimbus:gpu_model) and count (pci_passthrough:alias "alias:count").
func choiceOf(vcpus, memMB, diskGB int64, specs map[string]string, osType string) Choice {
	c := Choice{VCPUs: vcpus, RAMMB: memMB, DiskGB: diskGB, DiskType: specs["nimbus:disk_type"], Quantity: 1}
	if c.DiskType == "" {
		c.DiskType = "local"
	}
	c.PublicIPv4 = specs["nimbus:public_ipv4"] == "true"
	if m := specs["nimbus:gpu_model"]; m != "" {
		c.GPUModel = m
		c.GPUCount = 1
		// "alias:count[,alias:count…]": sum the counts.
		if alias := specs["pci_passthrough:alias"]; alias != "" {
			var total int64
			for _, part := range strings.Split(alias, ",") {
				if _, cnt, ok := strings.Cut(part, ":"); ok {
					if n, err := strconv.ParseInt(strings.TrimSpace(cnt), 10, 64); err == nil && n > 0 {
						total += n
					}
				}
			}
			if total > 0 {
				c.GPUCount = total
			}
		}
	}
	if strings.EqualFold(osType, "windows") {
		c.OSType = "windows"
	}
	return c
}
