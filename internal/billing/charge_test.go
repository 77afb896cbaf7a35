package billing

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"nimbus/internal/store/storetest"
)

// TestServerLife charges one server through create, stop, start and delete
// with an injected clock: exactly the started hours, each at its quote.
func TestServerLife(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, url string) {
		db := openDB(t, url)
		c := &clock{}
		b := New(db, Config{Now: c.now})
		ctx := context.Background()

		c.set("2026-03-01T09:50:00Z")
		mustCharge(t, b, c.t) // first pass ever: nothing yet
		insertServers(t, db, []testServer{stdServer("srv-1", "p1", at("2026-03-01T10:20:00Z")),
			// Shelved since before billing saw it: no usage period, no charge.
			func() testServer {
				s := stdServer("srv-shelved", "p1", at("2026-03-01T10:00:00Z"))
				s.vmState = "shelved_offloaded"
				return s
			}()})
		if _, err := db.Exec(ctx, "SELECT 1"); err != nil {
			t.Fatal(err)
		}
		steps := []struct {
			now    string
			action func()
		}{
			{"2026-03-01T10:30:00Z", nil}, // hour 10, current
			{"2026-03-01T11:05:00Z", func() { setState(t, db, "srv-1", "stopped", at("2026-03-01T11:02:00Z")) }},
			{"2026-03-01T12:05:00Z", nil}, // stopped servers pay: hour 12
			{"2026-03-01T12:40:00Z", func() { setState(t, db, "srv-1", "active", at("2026-03-01T12:30:00Z")) }},
			{"2026-03-01T13:50:00Z", func() { deleteServer(t, db, "srv-1", at("2026-03-01T13:40:00Z")) }},
			{"2026-03-01T14:05:00Z", nil},
			{"2026-03-01T16:05:00Z", nil},
		}
		for _, st := range steps {
			if st.action != nil {
				st.action()
			}
			c.set(st.now)
			mustCharge(t, b, c.t)
		}
		hours := chargedHours(t, db, "srv-1")
		if want := []string{"10", "11", "12", "13"}; !slices.Equal(hours, want) {
			t.Fatalf("charged hours %v, want %v", hours, want)
		}
		q, err := testPrices().Quote(Choice{VCPUs: 2, RAMMB: 4096, DiskType: "network", DiskGB: 40, PublicIPv4: true}, "RUB", 720)
		if err != nil {
			t.Fatal(err)
		}
		n, sum := chargesOf(t, db, "srv-1")
		if n != 4 || sum != -4*q.Hourly || q.Hourly != 237 {
			t.Fatalf("charges %d sum %d, want 4 × -%d", n, sum, q.Hourly)
		}
		if n, _ := chargesOf(t, db, "srv-shelved"); n != 0 {
			t.Fatalf("shelved server charged %d hours", n)
		}
		a, err := b.Account(ctx, "p1")
		if err != nil {
			t.Fatal(err)
		}
		if a.Balance != -4*237 || a.Currency != "RUB" || a.CreditLimit != 0 {
			t.Fatalf("account %+v", a)
		}
		// Running again, at the same time or later, charges nothing more.
		for _, now := range []string{"2026-03-01T16:05:00Z", "2026-03-01T16:59:00Z", "2026-03-01T18:00:00Z"} {
			r := mustCharge(t, b, at(now))
			if r.Charges != 0 {
				t.Fatalf("pass at %s charged %d more", now, r.Charges)
			}
		}
		if n2, _ := chargesOf(t, db, "srv-1"); n2 != 4 {
			t.Fatalf("charges grew to %d", n2)
		}
	})
}

// TestCatchUp: a pass that runs hours late charges every missed hour, in
// bounded steps, and a server created just before the hour turned (after
// the pass for that hour) is still charged for it.
func TestCatchUp(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, url string) {
		db := openDB(t, url)
		b := New(db, Config{MaxCatchUpHours: 4})
		insertServers(t, db, []testServer{stdServer("srv-a", "p1", at("2026-03-01T08:10:00Z"))})
		mustCharge(t, b, at("2026-03-01T08:59:00Z"))
		// Created at 08:59:30 but the 09:00:10 pass does not see it yet.
		r := mustCharge(t, b, at("2026-03-01T09:00:10Z"))
		insertServers(t, db, []testServer{stdServer("srv-late", "p1", at("2026-03-01T08:59:30Z"))})
		// Down until 17:30: hours 09..17 are due; at most 4 per pass.
		r = mustCharge(t, b, at("2026-03-01T17:30:00Z"))
		if r.CaughtUp || r.Hours != 4 {
			t.Fatalf("first catch-up pass %+v", r)
		}
		for i := 0; i < 5 && !r.CaughtUp; i++ {
			r = mustCharge(t, b, at("2026-03-01T17:30:00Z"))
		}
		if !r.CaughtUp {
			t.Fatalf("never caught up: %+v", r)
		}
		want := []string{"08", "09", "10", "11", "12", "13", "14", "15", "16", "17"}
		if got := chargedHours(t, db, "srv-a"); !slices.Equal(got, want) {
			t.Fatalf("srv-a hours %v, want %v", got, want)
		}
		if got := chargedHours(t, db, "srv-late"); !slices.Equal(got, want) {
			t.Fatalf("srv-late hours %v, want %v", got, want)
		}
	})
}

// TestConcurrentPasses runs two charging passes at once from two database
// handles on one database: each server-hour is charged exactly once.
func TestConcurrentPasses(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, url string) {
		db1, db2 := openDB(t, url), openDB(t, url)
		const servers = 1500
		svs := make([]testServer, servers)
		for i := range svs {
			svs[i] = stdServer(fmt.Sprintf("srv-%05d", i), fmt.Sprintf("p%d", i%7), at("2026-03-01T10:00:00Z"))
		}
		insertServers(t, db1, svs)
		b1 := New(db1, Config{BatchSize: 200})
		b2 := New(db2, Config{BatchSize: 300})
		mustCharge(t, b1, at("2026-03-01T10:30:00Z"))
		for _, now := range []string{"2026-03-01T12:20:00Z", "2026-03-01T13:20:00Z"} {
			var wg sync.WaitGroup
			errs := make([]error, 2)
			for i, b := range []*Service{b1, b2} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_, errs[i] = b.ChargeUntil(context.Background(), at(now))
				}()
			}
			wg.Wait()
			for _, err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
		}
		var n, distinct int
		var sum int64
		if err := db1.QueryRow(context.Background(), `SELECT COUNT(*), COALESCE(SUM(amount), 0) FROM billing_ledger
 WHERE kind = 'charge'`).Scan(&n, &sum); err != nil {
			t.Fatal(err)
		}
		if err := db1.QueryRow(context.Background(), `SELECT COUNT(*) FROM (SELECT DISTINCT resource_id, period_start
 FROM billing_ledger WHERE kind = 'charge') d`).Scan(&distinct); err != nil {
			t.Fatal(err)
		}
		// Hours 10, 11, 12, 13.
		if n != servers*4 || distinct != n || sum != -int64(servers*4*237) {
			t.Fatalf("charges %d (distinct %d) sum %d, want %d", n, distinct, sum, servers*4)
		}
	})
}

// TestUnshelveMidHour: a server shelved when the pass ran and unshelved
// later in the hour pays that hour from the next pass, while servers
// unchanged since the last pass are not re-read into duplicate work.
func TestUnshelveMidHour(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, url string) {
		db := openDB(t, url)
		c := &clock{}
		b := New(db, Config{Now: c.now})
		sh := stdServer("srv-sh", "p1", at("2026-03-01T08:00:00Z"))
		insertServers(t, db, []testServer{sh, stdServer("srv-on", "p1", at("2026-03-01T08:00:00Z"))})
		setState(t, db, "srv-sh", "shelved_offloaded", at("2026-03-01T08:30:00Z"))
		mustCharge(t, b, at("2026-03-01T10:05:00Z"))
		setState(t, db, "srv-sh", "active", at("2026-03-01T10:40:00Z"))
		r := mustCharge(t, b, at("2026-03-01T11:05:00Z"))
		if got := chargedHours(t, db, "srv-sh"); !slices.Equal(got, []string{"10", "11"}) {
			t.Fatalf("unshelved server hours %v", got)
		}
		if got := chargedHours(t, db, "srv-on"); !slices.Equal(got, []string{"10", "11"}) {
			t.Fatalf("active server hours %v", got)
		}
		if r.Charges != 3 {
			t.Fatalf("second pass charged %d, want 3", r.Charges)
		}
	})
}

// TestRun: the job charges at start and stops with its context.
func TestRun(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, url string) {
		db := openDB(t, url)
		insertServers(t, db, []testServer{stdServer("srv-run", "p1", at("2026-03-01T10:00:00Z"))})
		b := New(db, Config{Now: func() time.Time { return at("2026-03-01T10:30:00Z") }})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { b.Run(ctx); close(done) }()
		deadline := time.Now().Add(10 * time.Second)
		for {
			if n, _ := chargesOf(t, db, "srv-run"); n == 1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("Run charged nothing")
			}
			time.Sleep(20 * time.Millisecond)
		}
		cancel()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("Run did not stop")
		}
	})
}
