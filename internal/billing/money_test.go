package billing

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"nimbus/internal/store"
	"nimbus/internal/store/storetest"
)

func TestMoneyArithmetic(t *testing.T) {
	for _, tc := range []struct {
		a, b      int64
		add, mul  int64
		addOK, mo bool
	}{
		{1, 2, 3, 2, true, true},
		{math.MaxInt64, 1, 0, math.MaxInt64, false, true},
		{math.MinInt64, -1, 0, 0, false, false},
		{math.MaxInt64 / 2, 3, math.MaxInt64/2 + 3, 0, true, false},
		{-5, 7, 2, -35, true, true},
		{0, math.MinInt64, math.MinInt64, 0, true, true},
	} {
		if got, err := addMoney(tc.a, tc.b); (err == nil) != tc.addOK || (tc.addOK && got != tc.add) {
			t.Errorf("addMoney(%d, %d) = %d, %v", tc.a, tc.b, got, err)
		}
		if got, err := mulMoney(tc.a, tc.b); (err == nil) != tc.mo || (tc.mo && got != tc.mul) {
			t.Errorf("mulMoney(%d, %d) = %d, %v", tc.a, tc.b, got, err)
		}
	}
}

// bigServer is stdServer resized to 8 vCPUs and 32 GB.
func bigServer(id, project string, created time.Time) testServer {
	sv := stdServer(id, project, created)
	sv.flavorID, sv.vcpus, sv.memMB = "d8.32g.network.ipv4", 8, 32768
	return sv
}

// TestResizeHourAtLargerPrice: the hour in which a server is resized
// costs the larger of its two prices, whether a pass charged the hour
// before the resize or only after it; the hours after pay the new price.
func TestResizeHourAtLargerPrice(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, url string) {
		db := openDB(t, url)
		p := testPrices()
		small, _ := p.HourlyOf("server", stdServer("x", "p1", time.Time{}).spec(), "RUB", 720)
		big, _ := p.HourlyOf("server", bigServer("x", "p1", time.Time{}).spec(), "RUB", 720)
		if big <= small {
			t.Fatalf("prices %d, %d", small, big)
		}
		for i, tc := range []struct {
			name        string
			up          bool
			passMidHour bool
			hour, next  int64
		}{
			{"upsize seen before", true, true, big, big},
			{"upsize seen after", true, false, big, big},
			{"downsize", false, true, big, small},
		} {
			// Each case on a day of its own, on a fresh service.
			day := at("2026-03-01T00:00:00Z").AddDate(0, 0, i)
			when := func(hm string) time.Time {
				d, _ := time.ParseDuration(hm)
				return day.Add(d)
			}
			b := New(db, Config{Now: func() time.Time { return when("9h50m") }})
			mustCharge(t, b, when("9h50m"))
			id := fmt.Sprint("srv-", i)
			from, to := stdServer(id, "p1", when("9h55m")), bigServer(id, "p1", when("9h55m"))
			if !tc.up {
				from, to = to, from
			}
			insertServers(t, db, []testServer{from})
			if tc.passMidHour {
				mustCharge(t, b, when("10h5m"))
			}
			sp := to.spec()
			meter(t, db, id, &sp, when("10h20m"))
			mustCharge(t, b, when("11h5m"))
			mustCharge(t, b, when("11h30m")) // again: nothing more
			hour := day.Format("2006-01-02T")
			if got := hourTotal(t, db, id, hour+"10"); got != tc.hour {
				t.Errorf("%s: hour 10 cost %d, want %d (small %d, big %d)", tc.name, got, tc.hour, small, big)
			}
			if got := hourTotal(t, db, id, hour+"11"); got != tc.next {
				t.Errorf("%s: hour 11 cost %d, want %d", tc.name, got, tc.next)
			}
		}
	})
}

// hourTotal is what resource id was charged for the hour starting with
// prefix: its hour's charge and any difference keyed inside the hour.
func hourTotal(t *testing.T, db *store.DB, id, prefix string) int64 {
	t.Helper()
	var sum int64
	if err := db.QueryRow(context.Background(), `SELECT COALESCE(SUM(-amount), 0) FROM billing_ledger
 WHERE kind = 'charge' AND resource_id = ? AND period_start LIKE ?`, id, prefix+"%").Scan(&sum); err != nil {
		t.Fatal(err)
	}
	return sum
}

// TestTermAfterResize: a term covers the spec it was bought for; resized
// to a dearer flavor the server pays the difference each hour, from the
// hour of the resize on, and the usage report counts it as hourly.
func TestTermAfterResize(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, url string) {
		db := openDB(t, url)
		c := &clock{}
		b := New(db, Config{Now: c.now})
		srv := startAPI(t, b)
		ctx := context.Background()
		p := testPrices()
		small, _ := p.HourlyOf("server", stdServer("x", "p-demo", c.t).spec(), "RUB", 720)
		big, _ := p.HourlyOf("server", bigServer("x", "p-demo", c.t).spec(), "RUB", 720)
		c.set("2026-01-01T08:50:00Z")
		mustCharge(t, b, c.t)
		insertServers(t, db, []testServer{stdServer("srv-t", "p-demo", at("2026-01-01T08:55:00Z"))})
		if _, err := b.addEntry(ctx, "p-demo", KindTopup, 10_000_000, "test"); err != nil {
			t.Fatal(err)
		}
		c.set("2026-01-01T09:10:00Z")
		if st, body := call(t, srv, "POST", "/v1/terms", "demo", `{"term": {"server_id": "srv-t", "months": 1}}`); st != 201 {
			t.Fatalf("buy term: %d %v", st, body)
		}
		// Unchanged through hour 11, then resized at 11:40.
		chargeAll(t, b, at("2026-01-01T11:05:00Z"))
		big2 := bigServer("srv-t", "p-demo", c.t).spec()
		meter(t, db, "srv-t", &big2, at("2026-01-01T11:40:00Z"))
		chargeAll(t, b, at("2026-01-01T13:05:00Z"))
		for _, tc := range []struct {
			hour string
			want int64
		}{
			{"2026-01-01T10", -1}, // the term's own charge sits here
			{"2026-01-01T11", big - small},
			{"2026-01-01T12", big - small},
			{"2026-01-01T13", big - small},
		} {
			got := hourTotal(t, db, "srv-t", tc.hour)
			if tc.want < 0 {
				continue
			}
			if got != tc.want {
				t.Errorf("hour %s: charged %d, want the difference %d (small %d, big %d)", tc.hour, got, tc.want, small, big)
			}
		}
		st, body := call(t, srv, "GET", "/v1/usage?month=2026-01", "demo", "")
		us := body["usage"].(map[string]any)["resources"].([]any)
		if st != 200 || len(us) != 1 {
			t.Fatalf("usage %d %v", st, body)
		}
		u := us[0].(map[string]any)
		if u["hours"] != float64(4) || u["hourly_amount"] != float64(2*small+3*(big-small)) {
			t.Fatalf("usage %v: want hours 08 and 09 (%d each), 12 and 13, and the difference %d three times", u, small, big-small)
		}
	})
}

// TestTrialCannotBuyTerm: trial credit pays only for hours used in the
// trial, so a project with nothing but trial credit cannot buy a term,
// and a term bought with paid money spends none of the trial credit.
func TestTrialCannotBuyTerm(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, url string) {
		db := openDB(t, url)
		c := &clock{}
		c.set("2026-01-01T09:00:00Z")
		b := New(db, Config{Now: c.now})
		srv := startAPI(t, b)
		ctx := context.Background()
		mustCharge(t, b, c.t)
		insertServers(t, db, []testServer{stdServer("srv-1", "p-demo", at("2026-01-01T09:05:00Z"))})
		id := submitTrial(t, srv, "demo")
		if _, err := b.ApproveTrial(ctx, id, 800_000, at("2026-01-01T09:06:00Z")); err != nil {
			t.Fatal(err)
		}
		c.set("2026-01-01T09:05:00Z")
		st, body := call(t, srv, "POST", "/v1/terms", "demo", `{"term": {"server_id": "srv-1", "months": 1}}`)
		if st != 402 || !strings.Contains(errMessage(body), "trial credit") {
			t.Fatalf("a term paid by trial credit: %d %v", st, body)
		}
		if _, err := b.addEntry(ctx, "p-demo", KindTopup, 1_000_000, "paid"); err != nil {
			t.Fatal(err)
		}
		if st, body := call(t, srv, "POST", "/v1/terms", "demo", `{"term": {"server_id": "srv-1", "months": 1}}`); st != 201 {
			t.Fatalf("a term paid from the balance: %d %v", st, body)
		}
		if a := accountOf(t, srv, "demo"); a["trial_credit"] != float64(800_000) {
			t.Fatalf("the term spent trial credit: %v", a)
		}
	})
}
