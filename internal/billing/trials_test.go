package billing

import (
	"context"
	"fmt"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"nimbus/internal/store"
	"nimbus/internal/store/storetest"
)

// insertCharge writes a charge row as the charging pass does: negative,
// for one resource and hour, created at created.
func insertCharge(t *testing.T, db *store.DB, project, resource string, amount int64, created time.Time) {
	t.Helper()
	if _, err := db.Exec(context.Background(), `INSERT INTO billing_ledger (id, project_id, kind, amount, resource_id, period_start, created_at, reference)
 VALUES (?, ?, 'charge', ?, ?, ?, ?, 'server:test')`, newID(), project, -amount, resource,
		store.FormatTime(created.Truncate(time.Hour)), store.FormatTime(created)); err != nil {
		t.Fatal(err)
	}
}

// accountOf is the caller's account as GET /v1/account answers it.
func accountOf(t *testing.T, srv *httptest.Server, token string) map[string]any {
	t.Helper()
	st, body := call(t, srv, "GET", "/v1/account", token, "")
	if st != 200 {
		t.Fatalf("account %d %v", st, body)
	}
	return body["account"].(map[string]any)
}

// submitTrial asks for a trial as token and answers its id.
func submitTrial(t *testing.T, srv *httptest.Server, token string) string {
	t.Helper()
	st, body := call(t, srv, "POST", "/v1/trials", token, `{"trial": {"description": "Load-test our API on 4 GPU servers for a week"}}`)
	if st != 201 || body["trial"].(map[string]any)["status"] != TrialPending {
		t.Fatalf("submit %d %v", st, body)
	}
	return body["trial"].(map[string]any)["id"].(string)
}

// TestTrialFlow: submit, the admin queue, approval with a credit written to
// the ledger once, and charges spending the trial credit before the
// balance.
func TestTrialFlow(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, url string) {
		db := openDB(t, url)
		clk := &clock{}
		clk.set("2025-03-01T10:00:00Z")
		b := New(db, Config{Now: clk.now})
		srv := startAPI(t, b)
		// A charge before the trial is not the trial's to pay.
		insertCharge(t, db, "p-demo", "srv-before", 700, at("2025-03-01T09:30:00Z"))
		id := submitTrial(t, srv, "demo")
		tests := []struct {
			method, path, token, body string
			status                    int
		}{
			{"POST", "/v1/trials", "demo", `{"trial": {"description": "again"}}`, 409},
			{"POST", "/v1/trials", "other", `{"trial": {"description": "  "}}`, 400},
			{"POST", "/v1/trials", "other", `{"trial": {}}`, 400},
			{"POST", "/v1/trials", "unscoped", `{"trial": {"description": "x"}}`, 403},
			{"GET", "/v1/trials?status=maybe", "demo", "", 400},
			{"GET", "/v1/trials/" + id, "other", "", 404},
			{"POST", "/v1/trials/" + id + "/approve", "demo", `{"approve": {"credit": 5000, "ends_at": "2025-03-08T10:00:00Z"}}`, 403},
			{"POST", "/v1/trials/" + id + "/approve", "admin", `{"approve": {"credit": 5000}}`, 400},
			{"POST", "/v1/trials/" + id + "/approve", "admin", `{"approve": {"credit": 5000, "ends_at": "next week"}}`, 400},
			{"POST", "/v1/trials/" + id + "/approve", "admin", `{"approve": {"credit": 5000, "ends_at": "2025-03-01T09:00:00Z"}}`, 400},
			{"POST", "/v1/trials/" + id + "/approve", "admin", `{"approve": {"credit": 0, "ends_at": "2025-03-08T10:00:00Z"}}`, 400},
			{"POST", "/v1/trials/nope/approve", "admin", `{"approve": {"credit": 5000, "ends_at": "2025-03-08T10:00:00Z"}}`, 404},
		}
		for _, tt := range tests {
			if st, body := call(t, srv, tt.method, tt.path, tt.token, tt.body); st != tt.status {
				t.Fatalf("%s %s as %s %s: %d, want %d (%v)", tt.method, tt.path, tt.token, tt.body, st, tt.status, body)
			}
		}
		// Each project sees its own; the operator's queue sees all pending.
		submitTrial(t, srv, "other")
		for _, tt := range []struct {
			path, token string
			n           int
		}{{"/v1/trials", "demo", 1}, {"/v1/trials", "other", 1}, {"/v1/trials?status=pending", "admin", 2},
			{"/v1/trials?status=pending&project_id=p-other", "admin", 1}, {"/v1/trials?status=approved", "admin", 0}} {
			st, body := call(t, srv, "GET", tt.path, tt.token, "")
			if st != 200 || len(body["trials"].([]any)) != tt.n {
				t.Fatalf("GET %s as %s: %d %v, want %d trials", tt.path, tt.token, st, body, tt.n)
			}
		}
		if a := accountOf(t, srv, "demo"); a["trial_credit"] != float64(0) || a["trial_ends_at"] != nil {
			t.Fatalf("pending trial shows credit: %v", a)
		}

		clk.set("2025-03-01T11:00:00Z")
		st, body := call(t, srv, "POST", "/v1/trials/"+id+"/approve", "admin", `{"approve": {"credit": 5000, "ends_at": "2025-03-08T10:00:00Z"}}`)
		tr := body["trial"].(map[string]any)
		if st != 200 || tr["status"] != TrialApproved || tr["credit"] != float64(5000) || tr["decided_at"] == nil {
			t.Fatalf("approve %d %v", st, body)
		}
		if st, _ := call(t, srv, "POST", "/v1/trials/"+id+"/approve", "admin", `{"approve": {"credit": 9000, "ends_at": "2025-03-08T10:00:00Z"}}`); st != 409 {
			t.Fatalf("second approval %d", st)
		}
		if st, _ := call(t, srv, "POST", "/v1/trials/"+id+"/decline", "admin", `{"decline": {"reason": "changed my mind"}}`); st != 409 {
			t.Fatalf("decline after approval %d", st)
		}
		if n := ledgerCount(t, db, "p-demo", KindTrial); n != 1 {
			t.Fatalf("%d trial rows, want 1", n)
		}

		// Charges after approval spend the trial first; past it, the
		// trial credit stays 0 and the balance goes below.
		steps := []struct {
			charge        int64
			trial, balace float64
		}{
			{0, 5000, 5000 - 700},
			{3000, 2000, 2000 - 700},
			{1500, 500, 500 - 700},
			{4000, 0, -3500 - 700},
			{100, 0, -3600 - 700},
		}
		for i, s := range steps {
			if s.charge > 0 {
				clk.t = clk.t.Add(time.Hour)
				insertCharge(t, db, "p-demo", fmt.Sprint("srv-", i), s.charge, clk.t)
			}
			a := accountOf(t, srv, "demo")
			// The paid balance is shown apart: the balance less the trial.
			if a["trial_credit"] != s.trial || a["balance"] != s.balace || a["paid_balance"] != s.balace-s.trial ||
				a["trial_ends_at"] != "2025-03-08T10:00:00Z" {
				t.Fatalf("after charge %d: %v, want trial %v balance %v", s.charge, a, s.trial, s.balace)
			}
			left, err := b.TrialRemaining(context.Background(), db, "p-demo", clk.t)
			if err != nil || float64(left) != s.trial {
				t.Fatalf("TrialRemaining %d %v", left, err)
			}
		}
		if st, body := call(t, srv, "GET", "/v1/accounts/p-demo", "admin", ""); st != 200 ||
			body["account"].(map[string]any)["trial_credit"] != float64(0) {
			t.Fatalf("admin account %d %v", st, body)
		}
	})
}

// TestTrialExpiry: what is left of a trial at its end is written off once,
// however often and however concurrently ExpireTrials runs.
func TestTrialExpiry(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, url string) {
		db := openDB(t, url)
		clk := &clock{}
		clk.set("2025-03-01T10:00:00Z")
		b := New(db, Config{Now: clk.now})
		srv := startAPI(t, b)
		ctx := context.Background()
		ends := at("2025-03-03T10:00:00Z")
		approve := func(token, project string) string {
			t.Helper()
			id := submitTrial(t, srv, token)
			if _, err := b.ApproveTrial(ctx, id, 5000, ends); err != nil {
				t.Fatal(err)
			}
			return id
		}
		demo, other := approve("demo", "p-demo"), approve("other", "p-other")
		insertCharge(t, db, "p-demo", "srv-1", 1000, at("2025-03-02T10:00:00Z"))
		insertCharge(t, db, "p-other", "srv-2", 2500, at("2025-03-02T10:00:00Z"))
		// Charged after the end: the trial was over, so not the trial's.
		insertCharge(t, db, "p-demo", "srv-1", 500, at("2025-03-03T10:00:00Z"))

		if err := b.ExpireTrials(ctx, ends.Add(-time.Minute)); err != nil {
			t.Fatal(err)
		}
		if n := ledgerCount(t, db, "p-demo", KindTrial); n != 1 {
			t.Fatalf("expired early: %d trial rows", n)
		}
		// Twice in a row on one service, then two "processes" at once.
		for range 2 {
			if err := b.ExpireTrials(ctx, ends.Add(time.Hour)); err != nil {
				t.Fatal(err)
			}
		}
		db2 := openDB(t, url)
		others := []*Service{b, New(db2, Config{Now: clk.now}), New(db, Config{Now: clk.now}), New(db2, Config{Now: clk.now})}
		var wg sync.WaitGroup
		errs := make([]error, len(others))
		for i, s := range others {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = s.ExpireTrials(ctx, ends.Add(2*time.Hour))
			}()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
		for _, tt := range []struct {
			project, trial string
			off            int64
			balance        float64
		}{{"p-demo", demo, -4000, 5000 - 1000 - 500 - 4000}, {"p-other", other, -2500, 0}} {
			var n int
			var sum int64
			var period string
			if err := db.QueryRow(ctx, `SELECT COUNT(*), COALESCE(SUM(amount), 0), COALESCE(MAX(period_start), '') FROM billing_ledger
 WHERE kind = 'trial' AND amount < 0 AND resource_id = ?`, tt.trial).Scan(&n, &sum, &period); err != nil {
				t.Fatal(err)
			}
			if n != 1 || sum != tt.off || period != store.FormatTime(ends) {
				t.Fatalf("%s: %d write-offs of %d at %s, want one of %d", tt.project, n, sum, period, tt.off)
			}
			tr, err := b.GetTrial(ctx, tt.trial)
			if err != nil || tr.Status != TrialExpired {
				t.Fatalf("%s: trial %+v %v", tt.project, tr, err)
			}
		}
		clk.set("2025-03-03T12:00:00Z")
		if a := accountOf(t, srv, "demo"); a["trial_credit"] != float64(0) || a["trial_ends_at"] != nil || a["balance"] != float64(-500) {
			t.Fatalf("account after expiry %v", a)
		}
		// The project may ask again once its trial is over.
		submitTrial(t, srv, "demo")
	})
}

// TestTrialDecline: a declined trial carries its reason to the customer
// and moves no money.
func TestTrialDecline(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, url string) {
		db := openDB(t, url)
		srv := startAPI(t, New(db, Config{}))
		id := submitTrial(t, srv, "demo")
		tests := []struct {
			token, path, body string
			status            int
		}{
			{"demo", id, `{"decline": {"reason": "x"}}`, 403},
			{"admin", id, `{"decline": {}}`, 400},
			{"admin", id, `{"decline": {"reason": ""}}`, 400},
			{"admin", id, `{"reason": "unwrapped"}`, 400},
			{"admin", "nope", `{"decline": {"reason": "x"}}`, 404},
			{"admin", id, `{"decline": {"reason": "Mining is not a test we support."}}`, 200},
			{"admin", id, `{"decline": {"reason": "twice"}}`, 409},
		}
		for _, tt := range tests {
			if st, body := call(t, srv, "POST", "/v1/trials/"+tt.path+"/decline", tt.token, tt.body); st != tt.status {
				t.Fatalf("decline %s as %s %s: %d, want %d (%v)", tt.path, tt.token, tt.body, st, tt.status, body)
			}
		}
		st, body := call(t, srv, "GET", "/v1/trials/"+id, "demo", "")
		tr := body["trial"].(map[string]any)
		if st != 200 || tr["status"] != TrialDeclined || tr["reason"] != "Mining is not a test we support." || tr["decided_at"] == nil {
			t.Fatalf("declined trial %d %v", st, body)
		}
		if st, _ := call(t, srv, "POST", "/v1/trials/"+id+"/approve", "admin", `{"approve": {"credit": 5000, "ends_at": "2999-01-01T00:00:00Z"}}`); st != 409 {
			t.Fatalf("approve after decline %d", st)
		}
		if a := accountOf(t, srv, "demo"); a["balance"] != float64(0) || a["trial_credit"] != float64(0) || ledgerCount(t, db, "p-demo", KindTrial) != 0 {
			t.Fatalf("decline moved money: %v", a)
		}
		submitTrial(t, srv, "demo") // declined is not open: a new request is allowed
	})
}
