// Package doctor checks a region's invariants across the services' tables
// and says, for each one broken, what is wrong and how to mend it: claims
// against servers, the ledger against usage, hosts against their agents,
// what deleted servers left bound (ports, addresses, volumes), and work
// whose controller died.
//
// It is the one reader of every service's tables (each service writes only
// its own): it reads them as the migrations define them, through a
// read-only handle (store.OpenReadOnly) in one snapshot (store.ReadTx), so
// that what it compares across tables was true at one instant and it can
// change nothing. It pages through every table, so its memory does not
// grow with the database. Checks are a table: an invariant is one entry
// and one function.
package doctor

import (
	"context"
	"fmt"
	"strings"
	"time"

	"nimbus/internal/store"
)

// Finding is one broken invariant: the object, what is wrong with it, and
// how to mend it.
type Finding struct {
	Check   string `json:"check"`
	Subject string `json:"subject"`
	Problem string `json:"problem"`
	Repair  string `json:"repair"`
}

// Config bounds a run. Zero fields take the defaults given.
type Config struct {
	// Now is the time the run judges ages by (default time.Now()).
	Now time.Time
	// SilentAfter: a host whose agent has not reported for longer is
	// named (default 10 minutes; a host is down after 60 s).
	SilentAfter time.Duration
	// Settle: a VM reported without a server is named only once its row
	// has rested this long (default 5 minutes; compute's orphan sweep
	// destroys such VMs every 30 s while their host is up).
	Settle time.Duration
	// BillingHours is how many complete hours of the ledger are checked,
	// back from the last hour billing completed (default 48).
	BillingHours int
	// PageSize is how many rows one query reads (default 500).
	PageSize int
}

func (c Config) withDefaults() Config {
	if c.Now.IsZero() {
		c.Now = time.Now()
	}
	c.Now = c.Now.UTC()
	if c.SilentAfter <= 0 {
		c.SilentAfter = 10 * time.Minute
	}
	if c.Settle <= 0 {
		c.Settle = 5 * time.Minute
	}
	if c.BillingHours <= 0 {
		c.BillingHours = 48
	}
	if c.PageSize <= 0 {
		c.PageSize = 500
	}
	return c
}

// MaxBillingHours bounds Config.BillingHours: a year of hours.
const MaxBillingHours = 24 * 366

// Check is one invariant.
type Check struct {
	Name      string `json:"name"`
	Invariant string `json:"invariant"` // what must hold, in the operator's words
	// run checks it; nil for one another check's run checks too.
	run func(ctx context.Context, r *run) error
}

// Checks are the invariants, in the order a run checks them.
var Checks = []Check{
	{Name: "claims-of-dead-servers", Invariant: "every placement claim belongs to a live server placed on the claim's host", run: claimsOfDeadServers},
	{Name: "servers-without-claims", Invariant: "every live server placed on a host holds a claim there", run: serversWithoutClaims},
	{Name: "pcpus-claimed-twice", Invariant: "no pCPU or GPU is claimed by two servers", run: claimedTwice},
	{Name: "claim-items", Invariant: "each claim's pCPUs and GPUs are reserved under it, and nothing else is", run: claimItems},
	{Name: "host-capacity", Invariant: "each host's memory and disk counters equal what its claims hold", run: hostCapacity},
	{Name: "charging-behind", Invariant: "billing has completed every hour up to three hours ago", run: chargingBehind},
	// One pass over the ledger's hours checks these three.
	{Name: checkChargesMissing, Invariant: "every complete hour a metered resource was used is charged, or covered by a prepaid term", run: ledgerHours},
	{Name: checkChargesWithoutUsage, Invariant: "no hourly charge is for an hour its resource was not used"},
	{Name: checkChargesTwice, Invariant: "no resource is charged twice for one hour"},
	{Name: "open-period-counts", Invariant: "each project's counts of open usage periods, which the spending gate reads, equal its open periods", run: openCounts},
	{Name: "hosts-silent", Invariant: "every host is presented by an agent that has reported lately", run: hostsSilent},
	{Name: "vms-without-servers", Invariant: "every VM an agent reports belongs to a live server", run: vmsWithoutServers},
	{Name: "ports-of-deleted-servers", Invariant: "no port stays bound to a deleted server", run: portsOfDeletedServers},
	{Name: "addresses-of-deleted-servers", Invariant: "no floating IP stays with a deleted server", run: addressesOfDeletedServers},
	{Name: "volumes-of-deleted-servers", Invariant: "no volume stays attached to a deleted server", run: volumesOfDeletedServers},
	{Name: "work-left-by-the-dead", Invariant: "every server that owes a step is some live controller's work", run: workLeftByTheDead},
}

// Report counts what a run found, by check.
type Report struct {
	Problems map[string]int `json:"problems"`
	Total    int            `json:"total"`
}

// Run checks every invariant on db (best opened with store.OpenReadOnly)
// in one snapshot and calls found for each broken one, as it is found.
func Run(ctx context.Context, db *store.DB, cfg Config, found func(Finding)) (Report, error) {
	cfg = cfg.withDefaults()
	rep := Report{Problems: map[string]int{}}
	err := db.ReadTx(ctx, func(tx *store.Tx) error {
		r := &run{q: tx, cfg: cfg}
		r.emitAs = func(check, subject, problem, repair string) {
			rep.Problems[check]++
			rep.Total++
			found(Finding{Check: check, Subject: subject, Problem: problem, Repair: repair})
		}
		for _, c := range Checks {
			if c.run == nil {
				continue // checked with another
			}
			r.emit = func(subject, problem, repair string) { r.emitAs(c.Name, subject, problem, repair) }
			if err := c.run(ctx, r); err != nil {
				return fmt.Errorf("doctor: %s: %w", c.Name, err)
			}
		}
		return nil
	})
	return rep, err
}

// run is one run's state: the snapshot it reads and where findings go.
type run struct {
	q    store.Querier
	cfg  Config
	emit func(subject, problem, repair string)
	// emitAs reports a finding of another check: one pass over the ledger
	// checks several invariants.
	emitAs func(check, subject, problem, repair string)
}

// placeholders is "?, ?, …" for n arguments.
func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
}

// anys turns ids into query arguments.
func anys(ids []string) []any {
	out := make([]any, len(ids))
	for i, id := range ids {
		out[i] = id
	}
	return out
}

// sqlString quotes s for a statement the operator pastes.
func sqlString(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// ago renders how long before now t was.
func ago(now, t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return t.UTC().Format(time.RFC3339) + " (" + now.Sub(t).Truncate(time.Second).String() + " ago)"
}

// liveServers reads, of ids, the servers that exist: their host, state
// and whether deleted.
func (r *run) servers(ctx context.Context, ids []string) (map[string]serverRow, error) {
	out := map[string]serverRow{}
	if len(ids) == 0 {
		return out, nil
	}
	rows, err := r.q.Query(ctx, "SELECT id, host, vm_state, task_state, deleted, terminated_at FROM compute_servers WHERE id IN ("+
		placeholders(len(ids))+")", anys(ids)...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var s serverRow
		var deleted int
		var term string
		if err := rows.Scan(&s.id, &s.host, &s.vmState, &s.taskState, &deleted, &term); err != nil {
			return nil, err
		}
		s.deleted, s.terminated = deleted != 0, store.ParseTime(term)
		out[s.id] = s
	}
	return out, rows.Err()
}

// serverRow is what the checks need of a server.
type serverRow struct {
	id, host, vmState, taskState string
	deleted                      bool
	terminated                   time.Time
}

// gone says why a server id names no live server ("" when it is live).
func gone(id string, s serverRow, ok bool) string {
	switch {
	case !ok:
		return "no server " + id + " exists"
	case s.deleted && !s.terminated.IsZero():
		return "server " + id + " was deleted at " + s.terminated.UTC().Format(time.RFC3339)
	case s.deleted:
		return "server " + id + " is deleted"
	}
	return ""
}
