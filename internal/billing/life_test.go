package billing

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"

	"nimbus/internal/metering"
	"nimbus/internal/store"
	"nimbus/internal/store/storetest"
)

// TestServerLifeQuoted charges one server through create, stop, start,
// shelve, unshelve, resize and delete with an injected clock: exactly the
// started hours the rules give, each at the quote of what the server was
// at the start of that hour, to the minor unit.
func TestServerLifeQuoted(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, url string) {
		db := openDB(t, url)
		c := &clock{}
		b := New(db, Config{Now: c.now})
		prices, err := loadPrices(context.Background(), db)
		if err != nil {
			t.Fatal(err)
		}
		quote := func(sp metering.Spec) int64 {
			q, err := prices.Quote(ChoiceOf(metering.KindServer, sp), "RUB", 720)
			if err != nil {
				t.Fatal(err)
			}
			return q.Hourly
		}
		small := metering.ServerSpec("s2", 2, 4096, 40, map[string]string{"nimbus:disk_type": "network"}, "")
		big := metering.ServerSpec("s8", 8, 16384, 80, map[string]string{"nimbus:disk_type": "network", "nimbus:public_ipv4": "true"}, "windows")
		c.set("2026-04-01T07:55:00Z")
		mustCharge(t, b, c.t)
		steps := []struct {
			at   string
			spec *metering.Spec // nil: not billable
		}{
			{"2026-04-01T08:20:00Z", &small}, // create: hour 08
			{"2026-04-01T09:10:00Z", &small}, // stop: still charged (no change)
			{"2026-04-01T10:30:00Z", nil},    // shelve: hour 10 paid, 11 not
			{"2026-04-01T12:45:00Z", &small}, // unshelve: hour 12 paid
			{"2026-04-01T13:15:00Z", &big},   // resize: 13 at the old price, 14 on at the new
			{"2026-04-01T15:00:00Z", nil},    // delete on the hour: 14 is the last
		}
		// A pass runs every 20 minutes; the events fall between them.
		passes := 0
		for tm := at("2026-04-01T08:00:00Z"); tm.Before(at("2026-04-01T18:00:00Z")); tm = tm.Add(20 * time.Minute) {
			for _, st := range steps {
				if w := at(st.at); !w.Before(tm) && w.Before(tm.Add(20*time.Minute)) {
					if err := db.Tx(context.Background(), func(tx *store.Tx) error {
						return metering.Set(context.Background(), tx, metering.KindServer, "srv-life", "p1", st.spec, w)
					}); err != nil {
						t.Fatal(err)
					}
				}
			}
			c.t = tm.Add(20*time.Minute - time.Second)
			mustCharge(t, b, c.t)
			passes++
		}
		// Hour 13, the resize's, costs the larger price.
		want := map[string]int64{"08": quote(small), "09": quote(small), "10": quote(small), "12": quote(small),
			"13": quote(big), "14": quote(big)}
		rows, err := db.Query(context.Background(), `SELECT period_start, amount FROM billing_ledger
 WHERE kind = 'charge' AND resource_id = 'srv-life'`)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]int64{}
		for rows.Next() {
			var ps string
			var a int64
			if err := rows.Scan(&ps, &a); err != nil {
				t.Fatal(err)
			}
			got[ps[11:13]] += -a
		}
		rows.Close()
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("after %d passes charged %v, want %v", passes, got, want)
		}
		if quote(big) <= quote(small) {
			t.Fatalf("the resize should cost more: %d vs %d", quote(big), quote(small))
		}
		// The month's usage report is the ledger's.
		us, err := b.Usage(context.Background(), "p1", at("2026-04-01T00:00:00Z"))
		if err != nil {
			t.Fatal(err)
		}
		if len(us) != 1 || us[0].Hours != 6 || us[0].Amount != 4*quote(small)+2*quote(big) {
			t.Fatalf("usage %+v", us)
		}
	})
}

// TestSimulatedMonth runs 30 days of hourly passes, some of them late,
// over servers that are created, shelved, unshelved, resized and deleted
// at random minutes, and checks the ledger against the hours worked out
// independently from the same events.
func TestSimulatedMonth(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, url string) {
		db := openDB(t, url)
		c := &clock{}
		b := New(db, Config{Now: c.now, BatchSize: 97})
		ctx := context.Background()
		rng := rand.New(rand.NewPCG(1, 2))
		start := at("2026-06-01T00:00:00Z")
		end := start.AddDate(0, 0, 30)
		specs := []metering.Spec{
			metering.ServerSpec("a", 1, 1024, 10, nil, ""),
			metering.ServerSpec("b", 4, 8192, 80, map[string]string{"nimbus:disk_type": "network"}, ""),
			metering.ServerSpec("c", 2, 2048, 20, map[string]string{"nimbus:public_ipv4": "true"}, "windows"),
		}
		type event struct {
			at     time.Time
			server string
			spec   *metering.Spec
		}
		var events []event
		const servers = 60
		for i := 0; i < servers; i++ {
			id := fmt.Sprintf("srv-%03d", i)
			tm := start.Add(time.Duration(rng.IntN(30*24*60)) * time.Minute)
			sp := specs[rng.IntN(len(specs))]
			events = append(events, event{tm, id, &sp})
			for {
				tm = tm.Add(time.Duration(1+rng.IntN(4*24*60)) * time.Minute)
				if !tm.Before(end) {
					break
				}
				switch rng.IntN(4) {
				case 0: // shelve
					events = append(events, event{tm, id, nil})
				case 1, 2: // unshelve or resize
					sp := specs[rng.IntN(len(specs))]
					events = append(events, event{tm, id, &sp})
				case 3: // delete
					events = append(events, event{tm, id, nil})
					tm = end
				}
			}
		}
		slices.SortStableFunc(events, func(a, b event) int { return a.at.Compare(b.at) })
		c.t = start.Add(-time.Minute)
		mustCharge(t, b, c.t)
		next := 0
		for h := start; h.Before(end); h = h.Add(time.Hour) {
			// The job runs a few seconds after the hour, but every 50th hour
			// it is down for three hours and catches up.
			if n := int(h.Sub(start) / time.Hour); n%50 >= 1 && n%50 <= 3 {
				continue
			}
			passAt := h.Add(5 * time.Second)
			for next < len(events) && events[next].at.Before(passAt) {
				e := events[next]
				if err := db.Tx(ctx, func(tx *store.Tx) error {
					return metering.Set(ctx, tx, metering.KindServer, e.server, fmt.Sprintf("p%d", e.server[len(e.server)-1]%3), e.spec, e.at)
				}); err != nil {
					t.Fatal(err)
				}
				next++
			}
			c.t = passAt
			mustCharge(t, b, c.t)
		}
		for ; next < len(events); next++ {
			e := events[next]
			if err := db.Tx(ctx, func(tx *store.Tx) error {
				return metering.Set(ctx, tx, metering.KindServer, e.server, fmt.Sprintf("p%d", e.server[len(e.server)-1]%3), e.spec, e.at)
			}); err != nil {
				t.Fatal(err)
			}
		}
		c.t = end.Add(time.Hour + 5*time.Second)
		mustCharge(t, b, c.t) // charges through the hour after the month

		// Independently: a server pays hour h at the price of the earliest
		// billable stretch that touches h.
		prices, err := loadPrices(ctx, db)
		if err != nil {
			t.Fatal(err)
		}
		type stretch struct {
			from, to time.Time
			spec     metering.Spec
		}
		by := map[string][]stretch{}
		open := map[string]*stretch{}
		for _, e := range events {
			if o := open[e.server]; o != nil {
				o.to = e.at
				by[e.server] = append(by[e.server], *o)
				delete(open, e.server)
			}
			if e.spec != nil {
				open[e.server] = &stretch{from: e.at, spec: *e.spec}
			}
		}
		want := map[string]int64{} // server/hour → amount
		for id, o := range open {
			o.to = end.Add(10 * time.Hour) // still running after the last pass
			by[id] = append(by[id], *o)
		}
		for id, ss := range by {
			for h := start; !h.After(end.Add(time.Hour)); h = h.Add(time.Hour) {
				// The hour costs the largest price of the stretches in it.
				for _, s := range ss {
					touches := s.from.Before(h.Add(time.Hour)) && (s.to.After(h) || (s.to.Equal(s.from) && !s.from.Before(h)))
					if touches {
						q, _ := prices.Quote(ChoiceOf(metering.KindServer, s.spec), "RUB", 720)
						k := id + "/" + store.FormatTime(h)
						want[k] = max(want[k], q.Hourly)
					}
				}
			}
		}
		got := map[string]int64{}
		rows, err := db.Query(ctx, "SELECT resource_id, period_start, amount FROM billing_ledger WHERE kind = 'charge'")
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var id, ps string
			var a int64
			if err := rows.Scan(&id, &ps, &a); err != nil {
				t.Fatal(err)
			}
			got[id+"/"+store.FormatTime(store.ParseTime(ps).Truncate(time.Hour))] += -a // a resize's difference joins its hour
		}
		rows.Close()
		if len(got) != len(want) {
			t.Fatalf("%d charges, want %d", len(got), len(want))
		}
		for k, v := range want {
			if got[k] != v {
				t.Fatalf("charge %s = %d, want %d", k, got[k], v)
			}
		}
		// The monthly usage report adds up to the ledger.
		var total, hours int64
		for p := 0; p < 3; p++ {
			for _, m := range []time.Time{start, start.AddDate(0, 1, 0)} {
				us, err := b.Usage(ctx, fmt.Sprintf("p%d", p), m)
				if err != nil {
					t.Fatal(err)
				}
				for _, u := range us {
					total += u.Amount
					hours += int64(u.Hours)
				}
			}
		}
		var sum int64
		for _, v := range want {
			sum += v
		}
		if total != sum || hours != int64(len(want)) {
			t.Fatalf("usage %d over %d hours, ledger %d over %d", total, hours, sum, len(want))
		}
	})
}

// crashEnv names the database a child process charges and then dies in.
const crashEnv = "NIMBUS_BILLING_CRASH_DB"

// TestMain lets the crash test re-run this binary as a charging process
// that is killed inside its third charging transaction, after the inserts
// and before the commit.
func TestMain(m *testing.M) {
	if url := os.Getenv(passEnv); url != "" {
		db, err := store.Open(context.Background(), url)
		if err == nil {
			_, err = New(db, Config{BatchSize: 150}).ChargeUntil(context.Background(), at(os.Getenv(passEnv+"_AT")))
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if url := os.Getenv(crashEnv); url != "" {
		db, err := store.Open(context.Background(), url)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		n := 0
		b := New(db, Config{BatchSize: 100, BeforeCommit: func() {
			if n++; n == 3 {
				os.Exit(3) // no deferred work, no commit: as a kill would
			}
		}})
		_, err = b.ChargeUntil(context.Background(), at(os.Getenv(crashEnv+"_AT")))
		fmt.Fprintln(os.Stderr, "charging pass did not crash:", err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// passEnv names the database a child process runs one charging pass on.
const passEnv = "NIMBUS_BILLING_PASS_DB"

// TestTwoProcesses runs charging passes in two processes at once on one
// database, three hours running: every server-hour is charged once.
func TestTwoProcesses(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, url string) {
		db := openDB(t, url)
		const servers = 1200
		svs := make([]testServer, servers)
		for i := range svs {
			svs[i] = stdServer(fmt.Sprintf("srv-%05d", i), fmt.Sprintf("p%d", i%9), at("2026-07-01T08:30:00Z"))
		}
		insertServers(t, db, svs)
		mustCharge(t, New(db, Config{}), at("2026-07-01T08:40:00Z"))
		for _, now := range []string{"2026-07-01T09:00:04Z", "2026-07-01T10:00:04Z", "2026-07-01T11:00:04Z"} {
			var cmds []*exec.Cmd
			for range 2 {
				cmd := exec.Command(os.Args[0], "-test.run=^$")
				cmd.Env = append(os.Environ(), passEnv+"="+url, passEnv+"_AT="+now)
				if err := cmd.Start(); err != nil {
					t.Fatal(err)
				}
				cmds = append(cmds, cmd)
			}
			for _, cmd := range cmds {
				if err := cmd.Wait(); err != nil {
					t.Fatalf("charging process: %v", err)
				}
			}
		}
		var n, distinct int
		if err := db.QueryRow(context.Background(), `SELECT COUNT(*), COUNT(DISTINCT resource_id || period_start)
 FROM billing_ledger WHERE kind = 'charge'`).Scan(&n, &distinct); err != nil {
			t.Fatal(err)
		}
		// Hours 08 to 11.
		if n != servers*4 || distinct != n {
			t.Fatalf("%d charges (%d distinct), want %d", n, distinct, servers*4)
		}
	})
}

// TestCrashBeforeCommit kills a charging process between charging and
// committing: the next pass charges what it lost, and nothing twice.
func TestCrashBeforeCommit(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, url string) {
		db := openDB(t, url)
		const servers = 500
		svs := make([]testServer, servers)
		for i := range svs {
			svs[i] = stdServer(fmt.Sprintf("srv-%04d", i), "p1", at("2026-05-01T09:10:00Z"))
		}
		insertServers(t, db, svs)
		b := New(db, Config{BatchSize: 100})
		mustCharge(t, b, at("2026-05-01T09:30:00Z"))
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), crashEnv+"="+url, crashEnv+"_AT=2026-05-01T10:05:00Z")
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 3 {
			t.Fatalf("child: %v %s", err, out)
		}
		count := func() (int, int) {
			var n, distinct int
			if err := db.QueryRow(context.Background(), "SELECT COUNT(*), COUNT(DISTINCT resource_id) FROM billing_ledger WHERE kind = 'charge' AND period_start = ?",
				store.FormatTime(at("2026-05-01T10:00:00Z"))).Scan(&n, &distinct); err != nil {
				t.Fatal(err)
			}
			return n, distinct
		}
		if n, _ := count(); n != 200 {
			t.Fatalf("after the crash %d charges for hour 10 are committed, want the first two batches (200)", n)
		}
		mustCharge(t, b, at("2026-05-01T10:06:00Z"))
		mustCharge(t, b, at("2026-05-01T10:07:00Z"))
		if n, d := count(); n != servers || d != servers {
			t.Fatalf("hour 10: %d charges for %d servers, want %d", n, d, servers)
		}
	})
}
