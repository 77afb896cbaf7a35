package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"nimbus/internal/cloud"
	"nimbus/internal/doctor"
	"nimbus/internal/metering"
	"nimbus/internal/store"
	"nimbus/internal/testenv"
	regiontest "nimbus/internal/testenv/region"
)

// simClock is the in-process controllers' billing clock.
type simClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *simClock) now() time.Time                       { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *simClock) set(t time.Time)                      { c.mu.Lock(); defer c.mu.Unlock(); c.t = t }
func hourOf(t time.Time) time.Time                       { return t.UTC().Truncate(time.Hour) }
func fmtHour(t time.Time) string                         { return t.UTC().Format("2006-01-02T15") }
func minutes(n int) time.Duration                        { return time.Duration(n) * time.Minute }
func randMinutes(r *rand.Rand, lo, hi int) time.Duration { return minutes(lo + r.IntN(hi-lo+1)) }

// usageEvent is one change of a metered resource, as its owning service
// records it (metering.Set in the resource's own transaction): spec nil
// ends its billable life (a delete, a shelve).
type usageEvent struct {
	at                      time.Time
	kind, resource, project string
	spec                    *metering.Spec
}

// simulatedUsage is 200 servers of four flavors (one with a public IPv4
// and network disk, one Windows) in six projects, 40 volumes and 30
// floating IPs, made, resized, shelved, unshelved and deleted at random
// times over the 30 days from start (some on the hour, some within a
// minute of it, some deleted the instant they were made); about a third
// are still there at the end.
func simulatedUsage(r *rand.Rand, start, end time.Time) []usageEvent {
	flavors := []metering.Spec{
		metering.ServerSpec("s1.1000m", 1, 1000, 10, nil, ""),
		metering.ServerSpec("d2.4g.network.ipv4", 2, 4096, 40, map[string]string{"nimbus:disk_type": "network", "nimbus:public_ipv4": "true"}, ""),
		metering.ServerSpec("c8.16g", 8, 16384, 160, nil, ""),
		metering.ServerSpec("w4.7g", 4, 7000, 80, nil, "windows"),
	}
	var evs []usageEvent
	life := func(kind, id, project string, specs func() metering.Spec, i int) {
		at := start.Add(randMinutes(r, 0, 29*24*60))
		switch i % 7 {
		case 0:
			at = hourOf(at) // on the hour
		case 1:
			at = hourOf(at).Add(time.Hour - time.Second) // the hour's last second
		}
		sp := specs()
		add := func(at time.Time, sp *metering.Spec) bool {
			if at.After(end) {
				return false
			}
			if sp != nil {
				c := *sp
				sp = &c // its own: the caller's changes later
			}
			evs = append(evs, usageEvent{at: at, kind: kind, resource: id, project: project, spec: sp})
			return true
		}
		add(at, &sp)
		if i%50 == 0 {
			add(at, nil) // deleted the instant it was made: still pays its hour
			return
		}
		for step := 0; step < 4; step++ {
			switch r.IntN(6) {
			case 0: // resized (servers) or grown (volumes)
				at = at.Add(randMinutes(r, 1, 3*24*60))
				sp = specs()
				if !add(at, &sp) {
					return
				}
			case 1: // shelved, then unshelved
				at = at.Add(randMinutes(r, 1, 2*24*60))
				if !add(at, nil) {
					return
				}
				at = at.Add(randMinutes(r, 0, 36*60))
				if !add(at, &sp) {
					return
				}
			case 2, 3: // deleted, some within the hour
				at = at.Add(randMinutes(r, 0, []int{50, 10 * 24 * 60}[r.IntN(2)]))
				add(at, nil)
				return
			}
		}
	}
	for i := range 200 {
		life(metering.KindServer, fmt.Sprintf("fault-server-%03d", i), fmt.Sprintf("fault-project-%d", i%6),
			func() metering.Spec { return flavors[r.IntN(len(flavors))] }, i)
	}
	for i := range 40 {
		life(metering.KindVolume, fmt.Sprintf("fault-volume-%03d", i), fmt.Sprintf("fault-project-%d", i%6),
			func() metering.Spec { return metering.Spec{SizeGB: int64(1 + r.IntN(500))} }, i)
	}
	for i := range 30 {
		life(metering.KindPublicIP, fmt.Sprintf("fault-fip-%03d", i), fmt.Sprintf("fault-project-%d", i%6),
			func() metering.Spec { return metering.Spec{Name: fmt.Sprintf("203.0.113.%d", i)} }, i)
	}
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].at.Before(evs[j].at) })
	return evs
}

// TestChargingUnderFaults charges 30 simulated days of usage (200 servers,
// 40 volumes, 30 floating IPs in six projects, made, resized, shelved and
// deleted at random times) while the charging pass runs on two
// controllers at once, then has a real controller (nimbus serve) killed
// (-9) inside its charging transaction, between its inserts and its
// commit, and another take over. The ledger then equals the usage to the
// minor unit: for every resource and hour its periods touch, charges that
// sum to the largest hourly price it had in that hour, computed here from
// the metering periods and the price list as stored (not by billing's
// code), one "hour:" charge each; no hour charged twice, none missing,
// none extra; and nimbus admin doctor's checks find nothing.
//
// The first 28 days run on two in-process controllers on one PostgreSQL
// database whose billing clock the test moves (nimbus serve has no
// simulated clock), both calling the real charging pass at once at each
// step, steps of 1 to 150 minutes with an occasional outage of hours. The
// last 40 hours are then charged by real processes at the real time: a
// controller that pauses inside each charging transaction (the fault
// hook NIMBUS_FAULT_CHARGE_PAUSE) and is killed there while two nimbus
// admin billing run beside it wait on its uncommitted charges; a second
// controller that takes the job over once the dead one's lease lapses;
// and two admin passes at once again, last.
func TestChargingUnderFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("runs nimbus serve processes and charges 30 simulated days")
	}
	ctx := context.Background()
	began := time.Now()
	dbURL := regionDB(t)
	bin := buildNimbus(t)

	realNow := time.Now().UTC()
	start := hourOf(realNow).Add(-30*24*time.Hour + 17*time.Minute)
	end := hourOf(realNow).Add(-time.Hour) // the last simulated event
	handover := end.Add(-40 * time.Hour)   // the in-process controllers stop charging here
	r := rand.New(rand.NewPCG(28, 4))
	events := simulatedUsage(r, start, end)

	clk := &simClock{t: start}
	dir1 := t.TempDir()
	var ctls []*cloud.Cloud
	for i, dir := range []string{dir1, t.TempDir()} {
		ctls = append(ctls, testenv.StartCloud(t, dbURL, func(cfg *cloud.Config) {
			cfg.DataDir, cfg.Billing.Now = dir, clk.now
		}))
		if i == 0 {
			// The first pass ever marks where charging starts: at the
			// clock's hour, before the other controller's job could.
			if _, err := ctls[0].Billing.ChargeUntil(ctx, start); err != nil {
				t.Fatal(err)
			}
		}
	}
	db, err := store.Open(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()

	apply := func(upTo time.Time) {
		for len(events) > 0 && !events[0].at.After(upTo) {
			e := events[0]
			events = events[1:]
			if err := db.Tx(ctx, func(tx *store.Tx) error {
				return metering.Set(ctx, tx, e.kind, e.resource, e.project, e.spec, e.at)
			}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// charge runs the pass until caught up, as the controller's job does.
	charge := func(c *cloud.Cloud, now time.Time) error {
		for {
			res, err := c.Billing.ChargeUntil(ctx, now)
			if err != nil || res.CaughtUp {
				return err
			}
		}
	}
	steps, failed := 0, 0
	simBegan := time.Now()
	for now := start; now.Before(handover); {
		step := randMinutes(r, 1, 150)
		if r.IntN(40) == 0 {
			step += time.Duration(1+r.IntN(12)) * time.Hour // no controller charged for hours
		}
		now = now.Add(step)
		if now.After(handover) {
			now = handover
		}
		apply(now)
		clk.set(now)
		errs := make([]error, len(ctls))
		var wg sync.WaitGroup
		for i, c := range ctls {
			wg.Add(1)
			go func() { defer wg.Done(); errs[i] = charge(c, now) }()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				failed++
				t.Errorf("charging pass at %s: %v", now.Format(time.RFC3339), err)
			}
		}
		steps++
	}
	t.Logf("%d simulated days: %d steps of two concurrent passes in %.1f s, %d failed",
		int(handover.Sub(start).Hours()/24), steps, time.Since(simBegan).Seconds(), failed)
	apply(end)
	for _, c := range ctls {
		c.Close()
	}

	// The region's controllers were down since the handover: their
	// charging job last ran then.
	if _, err := db.Exec(ctx, "UPDATE lease_jobs SET last_run = ? WHERE name = 'billing-charge'", store.FormatTime(handover)); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(ctx, "DELETE FROM leases WHERE name = 'job/billing-charge'"); err != nil {
		t.Fatal(err)
	}
	chargeRows := func() int {
		var n int
		if err := db.QueryRow(ctx, "SELECT COUNT(*) FROM billing_ledger WHERE kind = 'charge'").Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := chargeRows()

	// Two operators' passes at once, as real processes (nimbus admin
	// billing run takes no lease).
	adminPasses := func() error {
		var wg sync.WaitGroup
		outs := make([]string, 2)
		errs := make([]error, 2)
		for i := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				out, err := exec.Command(bin, "admin", "billing", "run", "--database-url", dbURL,
					"--data-dir", filepath.Join(t.TempDir(), "admin")).CombinedOutput()
				outs[i], errs[i] = string(out), err
			}()
		}
		wg.Wait()
		for i := range 2 {
			if errs[i] != nil {
				return fmt.Errorf("admin billing run: %v\n%s", errs[i], outs[i])
			}
		}
		return nil
	}

	// A controller that pauses inside each charging transaction, killed
	// there while the two operators' passes run beside it: they insert
	// the same charges, so they wait on its open transaction, and go on
	// once the kill has rolled it back.
	const pauseLine = "billing: fault test pause before commit"
	creditLimit := []string{"--billing-credit-limit", "1000000000000"}
	a := regiontest.StartController(t, "controller-a", regiontest.ControllerConfig{Bin: bin, DatabaseURL: dbURL, CA: dir1,
		Args: creditLimit, Env: []string{"NIMBUS_FAULT_CHARGE_PAUSE=20s"}})
	regiontest.WaitFor(t, 60*time.Second, "controller A inside its charging transaction", func() bool {
		return a.Lines(pauseLine, 1) != ""
	}, a.Proc)
	if n := chargeRows(); n != before {
		t.Fatalf("%d charges before controller A's pass, %d while its transaction is open", before, n)
	}
	adminDone := make(chan error, 1)
	var adminEnd time.Time
	go func() { err := adminPasses(); adminEnd = time.Now(); adminDone <- err }()
	select {
	case err := <-adminDone:
		t.Errorf("the operators' passes ended (%v) while controller A's transaction held their charges: they did not wait on it", err)
		adminDone <- err
	case <-time.After(2 * time.Second):
	}
	if n := chargeRows(); n != before {
		t.Fatalf("%d charges before controller A's pass, %d while its transaction is open beside the operators'", before, n)
	}
	a.Kill()
	killed := time.Now()

	// Another controller starts meanwhile, and takes the job over once
	// A's lease lapses.
	b := regiontest.StartController(t, "controller-b", regiontest.ControllerConfig{Bin: bin, DatabaseURL: dbURL, CA: dir1, Args: creditLimit})
	if err := <-adminDone; err != nil {
		t.Fatal(err)
	}
	t.Logf("the operators' two passes, waiting on A's transaction, caught the backlog up %.2f s after the kill: %d charges were %d",
		adminEnd.Sub(killed).Seconds(), chargeRows(), before)
	jobRan := func() bool {
		var v string
		if err := db.QueryRow(ctx, "SELECT last_run FROM lease_jobs WHERE name = 'billing-charge'").Scan(&v); err != nil {
			t.Fatal(err)
		}
		return store.ParseTime(v).After(killed)
	}
	regiontest.WaitFor(t, 90*time.Second, "controller B's charging job after A's death", jobRan, b.Proc)
	t.Logf("the charging job ran again %.1f s after the kill, on controller B once A's lease lapsed", time.Since(killed).Seconds())
	b.Stop(t, syscall.SIGTERM)

	// The operators' passes once more: the hour they run in is the last
	// charged.
	var final time.Time
	for try := 0; ; try++ {
		t0 := time.Now().UTC()
		if err := adminPasses(); err != nil {
			t.Fatal(err)
		}
		if t1 := time.Now().UTC(); hourOf(t0).Equal(hourOf(t1)) || try > 0 {
			final = hourOf(t1)
			break
		}
	}

	checkLedger(t, db, start, final)
	var ro *store.DB
	ro, err = store.OpenReadOnly(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	var findings []string
	rep, err := doctor.Run(ctx, ro, doctor.Config{BillingHours: 31 * 24}, func(f doctor.Finding) {
		if len(findings) < 10 {
			findings = append(findings, fmt.Sprintf("%s: %s: %s", f.Check, f.Subject, f.Problem))
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Total != 0 {
		t.Errorf("doctor: %d findings %v, such as\n%s", rep.Total, rep.Problems, strings.Join(findings, "\n"))
	}
	t.Logf("test took %.1f s", time.Since(began).Seconds())
}

// checkLedger holds the ledger to the usage: for every resource and
// hour from the first charged one (start's) to final that its periods
// touch, the charges dated in that hour sum to the largest hourly price
// of its periods in it, with exactly one "hour:" charge on the hour; no
// other charges. Prices are computed here from billing_prices, as the
// price list defines them: each line item rounded up to a whole minor
// unit (rates are 1/10000 of one), RAM by the MB.
func checkLedger(t *testing.T, db *store.DB, start, final time.Time) {
	t.Helper()
	ctx := context.Background()
	rates := map[string]int64{}
	rows, err := db.Query(ctx, "SELECT rate_key, rate FROM billing_prices")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var k string
		var v int64
		if err := rows.Scan(&k, &v); err != nil {
			t.Fatal(err)
		}
		rates[k] = v
	}
	rows.Close()
	item := func(n int64, key string, div int64) int64 {
		// A rate the list lacks is 0, but for a disk type or GPU model:
		// those are not sold (the test uses none such).
		rate, ok := rates[key]
		if !ok && n > 0 && strings.Contains(key, ":") {
			t.Fatalf("no rate %s", key)
		}
		return (n*rate + 10000*div - 1) / (10000 * div)
	}
	price := func(kind string, sp metering.Spec) int64 {
		switch kind {
		case metering.KindServer:
			p := item(sp.VCPUs, "vcpu", 1) + item(sp.RAMMB, "ram_gb", 1024) + item(sp.DiskGB, "disk_gb:"+sp.DiskType, 1)
			if sp.PublicIPv4 {
				p += item(1, "public_ipv4", 1)
			}
			if sp.OSType == "windows" {
				p += item(sp.VCPUs, "windows_vcpu", 1) + item(1, "windows_server", 1)
			}
			if sp.GPUCount > 0 {
				p += item(sp.GPUCount, "gpu:"+sp.GPUModel, 1)
			}
			return p
		case metering.KindPublicIP:
			return item(1, "public_ipv4", 1)
		case metering.KindVolume:
			return item(sp.SizeGB, "volume_gb", 1)
		case metering.KindSnapshot:
			return item(sp.SizeGB, "snapshot_gb", 1)
		case metering.KindBackup:
			return item(sp.SizeGB, "backup_gb", 1)
		case metering.KindImage:
			return item(sp.SizeGB, "image_gb", 1)
		}
		t.Fatalf("a period of kind %s", kind)
		return 0
	}

	type key struct{ resource, hour string }
	want := map[key]int64{}
	rows, err = db.Query(ctx, "SELECT resource_id, kind, spec, started_at, ended_at FROM metering_periods")
	if err != nil {
		t.Fatal(err)
	}
	periods := 0
	for rows.Next() {
		var id, kind, spec, started, ended string
		if err := rows.Scan(&id, &kind, &spec, &started, &ended); err != nil {
			t.Fatal(err)
		}
		periods++
		var sp metering.Spec
		if err := store.FromJSON(spec, &sp); err != nil {
			t.Fatal(err)
		}
		p := price(kind, sp)
		s, e := store.ParseTime(started), store.ParseTime(ended)
		first, last := hourOf(s), final
		switch {
		case ended == "":
		case e.After(s):
			last = hourOf(e.Add(-time.Nanosecond)) // ending on the hour does not reach the next
		default:
			last = first // made and ended at once: its hour
		}
		if first.Before(hourOf(start)) {
			first = hourOf(start)
		}
		if last.After(final) {
			last = final
		}
		for h := first; !h.After(last); h = h.Add(time.Hour) {
			k := key{id, fmtHour(h)}
			want[k] = max(want[k], p)
		}
	}
	rows.Close()

	got := map[key]int64{}
	onHour := map[key]int{}
	rows, err = db.Query(ctx, "SELECT resource_id, period_start, amount, reference FROM billing_ledger WHERE kind = 'charge'")
	if err != nil {
		t.Fatal(err)
	}
	charges, resizes := 0, 0
	for rows.Next() {
		var id, at, ref string
		var amount int64
		if err := rows.Scan(&id, &at, &amount, &ref); err != nil {
			t.Fatal(err)
		}
		charges++
		ts := store.ParseTime(at)
		k := key{id, fmtHour(ts)}
		got[k] -= amount // charges are negative
		if strings.HasPrefix(ref, "resize:") {
			resizes++
		}
		if strings.HasPrefix(ref, "hour:") {
			onHour[k]++
			if !ts.Equal(hourOf(ts)) {
				t.Errorf("%s's hourly charge dated %s, not on the hour", id, at)
			}
		}
	}
	rows.Close()

	var wantSum, gotSum int64
	bad := 0
	report := func(format string, args ...any) {
		if bad++; bad <= 20 {
			t.Errorf(format, args...)
		}
	}
	for k, w := range want {
		wantSum += w
		switch g, ok := got[k]; {
		case !ok:
			report("%s hour %s: not charged, want %d", k.resource, k.hour, w)
		case g != w:
			report("%s hour %s: charged %d, want %d", k.resource, k.hour, g, w)
		}
		if n := onHour[k]; has(got, k) && n != 1 {
			report("%s hour %s: %d hourly charges", k.resource, k.hour, n)
		}
	}
	for k, g := range got {
		gotSum += g
		if _, ok := want[k]; !ok {
			report("%s hour %s: charged %d for an hour it was not used", k.resource, k.hour, g)
		}
	}
	t.Logf("ledger: %d charges (%d of them a resize's difference) over %d resource-hours from %d periods, %d minor units; usage at the price list: %d",
		charges, resizes, len(got), periods, gotSum, wantSum)
	if gotSum != wantSum {
		t.Errorf("the ledger charged %d minor units, the usage costs %d", gotSum, wantSum)
	}
	if bad > 0 {
		t.Errorf("%d resource-hours wrong", bad)
	}
}

func has[K comparable, V any](m map[K]V, k K) bool { _, found := m[k]; return found }
