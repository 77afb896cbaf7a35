package billing

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"nimbus/internal/store"
	"nimbus/internal/store/storetest"
)

// shelveLog records what billing asked compute to shelve.
type shelveLog struct {
	mu  sync.Mutex
	ids []string
}

func (l *shelveLog) ShelveServers(_ context.Context, _ string, servers []string) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ids = append(l.ids, servers...)
	return len(servers), nil
}

// chargeAll runs passes at now until the job has caught up.
func chargeAll(t *testing.T, b *Service, now time.Time) {
	t.Helper()
	for i := 0; i < 20; i++ {
		if r := mustCharge(t, b, now); r.CaughtUp {
			return
		}
	}
	t.Fatal("never caught up")
}

func hourCharged(t *testing.T, db *store.DB, id, hour string) (int64, bool) {
	t.Helper()
	var a int64
	err := db.QueryRow(context.Background(), `SELECT amount FROM billing_ledger WHERE kind = 'charge' AND resource_id = ?
 AND period_start = ?`, id, store.FormatTime(at(hour))).Scan(&a)
	if store.IsNoRows(err) {
		return 0, false
	}
	if err != nil {
		t.Fatal(err)
	}
	return -a, true
}

// TestPrepaidTerms: a term is paid up front and covers its hours; at its
// end it renews when the balance allows, falls back to hourly when not, or
// shelves the server, as the customer chose.
func TestPrepaidTerms(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, url string) {
		db := openDB(t, url)
		c := &clock{}
		b := New(db, Config{Now: c.now})
		shelved := &shelveLog{}
		b.SetSuspender(shelved)
		ctx := context.Background()
		c.set("2026-01-01T09:00:00Z")
		mustCharge(t, b, c.t)
		insertServers(t, db, []testServer{stdServer("srv-a", "p1", at("2026-01-01T09:10:00Z")),
			stdServer("srv-b", "p1", at("2026-01-01T09:10:00Z"))})
		if _, err := b.addEntry(ctx, "p1", KindTopup, 1_000_000, "test"); err != nil {
			t.Fatal(err)
		}
		prices, err := loadPrices(ctx, db)
		if err != nil {
			t.Fatal(err)
		}
		hourly, _ := prices.HourlyOf("server", stdServer("x", "p1", c.t).spec(), "RUB", 720)

		// Refusals first: unknown server, a term not on sale, no money.
		c.set("2026-01-01T09:30:00Z")
		for _, tc := range []struct {
			req  TermRequest
			want error
		}{
			{TermRequest{ServerID: "srv-none", Months: 1}, ErrNotRunning},
			{TermRequest{ServerID: "srv-a", Months: 2}, ErrUnpriced},
			{TermRequest{ServerID: "srv-a", Months: 12}, ErrInsufficient},
			{TermRequest{ServerID: "srv-a", Months: 1, OnEnd: "delete"}, ErrInvalid},
		} {
			if _, err := b.BuyTerm(ctx, "p1", tc.req); !errors.Is(err, tc.want) {
				t.Fatalf("BuyTerm(%+v) = %v, want %v", tc.req, err, tc.want)
			}
		}
		ta, err := b.BuyTerm(ctx, "p1", TermRequest{ServerID: "srv-a", Months: 1, AutoRenew: true})
		if err != nil {
			t.Fatal(err)
		}
		if want := hourly * 720; ta.Amount != want || !ta.StartsAt.Equal(at("2026-01-01T10:00:00Z")) || !ta.EndsAt.Equal(at("2026-02-01T10:00:00Z")) {
			t.Fatalf("term %+v, want amount %d from 10:00 for a month", ta, want)
		}
		// The quote for the same choice and term is what was charged.
		q, err := prices.Quote(ChoiceOf("server", stdServer("x", "p1", c.t).spec()), "RUB", 720)
		if err == nil {
			q, err = prices.WithTariff(q, TariffPrepaid, 1, 0)
		}
		if err != nil || q.Total != ta.Amount {
			t.Fatalf("quote for a 1-month term: %d, %v; charged %d", q.Total, err, ta.Amount)
		}
		if _, err := b.BuyTerm(ctx, "p1", TermRequest{ServerID: "srv-a", Months: 1}); !errors.Is(err, ErrTermExists) {
			t.Fatalf("second term: %v", err)
		}
		// Three months at 5% off, renewing, but the money will be gone.
		tb, err := b.BuyTerm(ctx, "p1", TermRequest{ServerID: "srv-b", Months: 3, AutoRenew: true})
		if err != nil {
			t.Fatal(err)
		}
		if want := ceilDiv(hourly*720*3*9500, 10000); tb.Amount != want {
			t.Fatalf("3-month term costs %d, want %d", tb.Amount, want)
		}

		// Hour 09 is hourly, the term's hours are not.
		chargeAll(t, b, at("2026-01-01T12:05:00Z"))
		if a, ok := hourCharged(t, db, "srv-a", "2026-01-01T09:00:00Z"); !ok || a != hourly {
			t.Fatalf("hour 09: %d %v", a, ok)
		}
		if a, ok := hourCharged(t, db, "srv-a", "2026-01-01T10:00:00Z"); !ok || a != ta.Amount {
			t.Fatalf("hour 10 holds the term's charge: %d %v", a, ok)
		}
		for _, h := range []string{"2026-01-01T11:00:00Z", "2026-01-01T12:00:00Z"} {
			if _, ok := hourCharged(t, db, "srv-a", h); ok {
				t.Fatalf("hour %s charged inside the term", h)
			}
		}

		// The first term ends: renewed, since the balance allows.
		c.set("2026-02-01T10:00:05Z")
		chargeAll(t, b, c.t)
		ts, err := b.Terms(ctx, "p1")
		if err != nil {
			t.Fatal(err)
		}
		var statuses []string
		for _, x := range ts {
			statuses = append(statuses, x.ResourceID+":"+x.Status)
		}
		slices.Sort(statuses)
		if want := []string{"srv-a:active", "srv-a:renewed", "srv-b:active"}; !slices.Equal(statuses, want) {
			t.Fatalf("terms %v, want %v", statuses, want)
		}
		if a, ok := hourCharged(t, db, "srv-a", "2026-02-01T10:00:00Z"); !ok || a != ta.Amount {
			t.Fatalf("the renewal's charge: %d %v", a, ok)
		}
		// The renewed term will shelve at its end instead.
		var renewed Term
		for _, x := range ts {
			if x.Status == TermActive && x.ResourceID == "srv-a" {
				renewed = x
			}
		}
		no, shelve := false, OnEndShelve
		if _, err := b.UpdateTerm(ctx, "p1", renewed.ID, &no, &shelve); err != nil {
			t.Fatal(err)
		}

		// Drain the account: srv-b's term cannot renew and falls back to
		// hourly on 1 April.
		if _, err := b.addEntry(ctx, "p1", KindAdjustment, -1_000_000, "drain"); err != nil {
			t.Fatal(err)
		}
		b2 := New(db, Config{Now: c.now, DefaultCreditLimit: 0})
		b2.SetSuspender(shelved)
		c.set("2026-04-01T10:30:00Z")
		chargeAll(t, b2, c.t)
		if a, ok := hourCharged(t, db, "srv-b", "2026-04-01T10:00:00Z"); !ok || a != hourly {
			t.Fatalf("srv-b after its term: %d %v, want hourly %d", a, ok, hourly)
		}
		if a, ok := hourCharged(t, db, "srv-a", "2026-03-01T10:00:00Z"); !ok || a != hourly {
			t.Fatalf("srv-a after its shelving term: %d %v, want hourly %d until compute shelves it", a, ok, hourly)
		}
		shelved.mu.Lock()
		defer shelved.mu.Unlock()
		if !slices.Contains(shelved.ids, "srv-a") || slices.Contains(shelved.ids, "srv-b") {
			t.Fatalf("shelved %v, want srv-a only (srv-b falls back to hourly)", shelved.ids)
		}
	})
}
