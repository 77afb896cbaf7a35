package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"nimbus/internal/billing"
	"nimbus/internal/identity"
	"nimbus/internal/metering"
	"nimbus/internal/store"
	"nimbus/internal/store/storetest"
)

// adminFixture is a controller's database with project "p1" (and "p2"),
// and the flags that point nimbus admin at it: --data-dir for SQLite, so
// that the default file location is what is tested, --database-url for
// PostgreSQL.
type adminFixture struct {
	db     *store.DB
	flags  []string
	p1, p2 string // project ids
}

func newAdminFixture(t *testing.T, dbURL string) *adminFixture {
	t.Helper()
	t.Setenv("NIMBUS_DATABASE_URL", "")
	ctx := context.Background()
	db, err := store.Open(ctx, dbURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	id := identity.New(db)
	if err := id.Bootstrap(ctx, identity.Account{User: "u1", Password: "pw-1", Project: "p1", Role: "member"},
		identity.Account{User: "u2", Password: "pw-2", Project: "p2", Role: "member"}); err != nil {
		t.Fatal(err)
	}
	f := &adminFixture{db: db}
	for name, dst := range map[string]*string{"p1": &f.p1, "p2": &f.p2} {
		p, err := id.ProjectByName(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		*dst = p.ID
	}
	if strings.HasPrefix(dbURL, "postgres") {
		f.flags = []string{"--database-url", dbURL}
	} else {
		f.flags = []string{"--data-dir", filepath.Dir(dbURL)}
	}
	return f
}

// admin runs "nimbus admin" with args and the fixture's flags, and answers
// its standard output.
func (f *adminFixture) admin(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := runAdmin(context.Background(), append(args, f.flags...), &out, &errOut)
	return out.String(), err
}

// adminJSON runs a --json command that must succeed and decodes its output.
func (f *adminFixture) adminJSON(t *testing.T, v any, args ...string) {
	t.Helper()
	out, err := f.admin(t, append(args, "--json")...)
	if err != nil {
		t.Fatalf("nimbus admin %s: %v", strings.Join(args, " "), err)
	}
	if err := json.Unmarshal([]byte(out), v); err != nil {
		t.Fatalf("nimbus admin %s: %v in %s", strings.Join(args, " "), err, out)
	}
}

func (f *adminFixture) account(t *testing.T, project string) billing.Account {
	t.Helper()
	var body struct{ Accounts []billing.Account }
	f.adminJSON(t, &body, "billing", "accounts")
	for _, a := range body.Accounts {
		if a.ProjectID == project {
			return a
		}
	}
	t.Fatalf("no account of %s in %+v", project, body.Accounts)
	return billing.Account{}
}

// written counts what billing stored, to show bad input stored nothing.
func (f *adminFixture) written(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for _, q := range []string{"SELECT COUNT(*) FROM billing_ledger", "SELECT COUNT(*) FROM billing_accounts",
		"SELECT COUNT(*) FROM billing_topups", "SELECT COUNT(*) FROM billing_trials WHERE status = 'pending'",
		"SELECT COALESCE(SUM(credit_limit), 0) FROM billing_accounts", "SELECT COALESCE(SUM(rate), 0) FROM billing_prices"} {
		var n int64
		if err := f.db.QueryRow(context.Background(), q).Scan(&n); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "%s: %d\n", q, n)
	}
	return b.String()
}

// awayFromHourEnd waits past the turn of the hour when it is close, and out
// of an hour's first minute, so that two passes of a test, and the periods
// it opens a minute back, fall in one hour.
func awayFromHourEnd(t *testing.T) {
	now := time.Now()
	if left := now.Truncate(time.Hour).Add(time.Hour).Sub(now); left < 5*time.Second {
		t.Logf("waiting %v for the hour to turn", left)
		time.Sleep(left + 100*time.Millisecond)
		now = time.Now()
	}
	// The tests open usage periods a minute back: in an hour's first
	// minute that is the hour before, which an earlier pass has closed.
	if in := now.Sub(now.Truncate(time.Hour)); in < 65*time.Second {
		t.Logf("waiting %v for the periods a minute back to fall in this hour", 65*time.Second-in)
		time.Sleep(65*time.Second - in)
	}
}

// TestAdminBillingRunTwice is the issue's promise: "nimbus admin billing
// run" is the hourly pass, so a second run within the hour charges nothing.
func TestAdminBillingRunTwice(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, dbURL string) {
		f := newAdminFixture(t, dbURL)
		ctx := context.Background()
		awayFromHourEnd(t)
		err := f.db.Tx(ctx, func(tx *store.Tx) error {
			return metering.Set(ctx, tx, metering.KindServer, "srv-1", f.p1,
				&metering.Spec{VCPUs: 2, RAMMB: 2048, DiskGB: 20, DiskType: "local"}, time.Now().Add(-90*time.Minute))
		})
		if err != nil {
			t.Fatal(err)
		}
		type runResult struct {
			Passes, Hours, Charges int
			Amount                 int64
			Currency               string
		}
		var first, second runResult
		f.adminJSON(t, &first, "billing", "run")
		// 2 vCPU × 0.50 + 2 GB × 0.20 + 20 GB local × 0.005 = 1.50 an hour.
		if first.Charges != 1 || first.Amount != 150 || first.Hours < 1 || first.Currency != "RUB" {
			t.Fatalf("first run = %+v, want 1 charge of 150", first)
		}
		f.adminJSON(t, &second, "billing", "run")
		if second.Charges != 0 || second.Amount != 0 {
			t.Fatalf("second run within the hour = %+v, want nothing charged", second)
		}
		if a := f.account(t, f.p1); a.Balance != -150 {
			t.Fatalf("balance after two runs = %d, want -150", a.Balance)
		}
		out, err := f.admin(t, "billing", "run")
		if err != nil || !strings.Contains(out, "charges inserted  0") || !strings.Contains(out, "0.00 RUB") {
			t.Fatalf("table output of a third run: %v\n%s", err, out)
		}
	})
}

// TestAdminBillingRunAmountIsLedger: a run's summary is what the ledger
// got, also when a pass re-inserts an hour already charged beside a new
// row (a resize within the hour).
func TestAdminBillingRunAmountIsLedger(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, dbURL string) {
		f := newAdminFixture(t, dbURL)
		ctx := context.Background()
		awayFromHourEnd(t)
		spec := func(vcpus int64) error {
			return f.db.Tx(ctx, func(tx *store.Tx) error {
				return metering.Set(ctx, tx, metering.KindServer, "srv-1", f.p1,
					&metering.Spec{VCPUs: vcpus, RAMMB: 2048, DiskGB: 20, DiskType: "local"}, time.Now().Add(-time.Minute))
			})
		}
		ledger := func() int64 {
			var sum int64
			if err := f.db.QueryRow(ctx, "SELECT COALESCE(SUM(amount), 0) FROM billing_ledger WHERE kind = 'charge'").Scan(&sum); err != nil {
				t.Fatal(err)
			}
			return sum
		}
		for i, vcpus := range []int64{2, 4, 8} {
			if err := spec(vcpus); err != nil {
				t.Fatal(err)
			}
			before := ledger()
			if i == 1 {
				out, err := f.admin(t, "billing", "run")
				want := fmt.Sprintf("amount charged    %s RUB", money(before-ledger()))
				if err != nil || !strings.Contains(out, want) || ledger() == before {
					t.Fatalf("run %d printed (%v)\n%s\nwant %q", i, err, out, want)
				}
				continue
			}
			var res struct {
				Charges int
				Amount  int64
			}
			f.adminJSON(t, &res, "billing", "run")
			if got := before - ledger(); res.Charges != 1 || res.Amount != got || got <= 0 {
				t.Fatalf("run %d = %+v, the ledger got %d", i, res, -got)
			}
		}
	})
}

// TestAdminBillingAccountsEveryProject: a project nothing billed yet is
// listed with the account it has from its creation.
func TestAdminBillingAccountsEveryProject(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, dbURL string) {
		f := newAdminFixture(t, dbURL)
		for _, p := range []string{f.p1, f.p2} {
			if a := f.account(t, p); a.Balance != 0 || a.PaidBalance != 0 || a.CreditLimit != 0 || a.Currency != "RUB" {
				t.Fatalf("new project's account = %+v", a)
			}
		}
		out, err := f.admin(t, "billing", "accounts")
		if err != nil || !strings.Contains(out, f.p1+"  p1") || !strings.Contains(out, f.p2+"  p2") {
			t.Fatalf("accounts table lacks a project: %v\n%s", err, out)
		}
	})
}

// TestAdminBillingAccounts changes accounts step by step and checks each
// result through "accounts", the way an operator would.
func TestAdminBillingAccounts(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, dbURL string) {
		f := newAdminFixture(t, dbURL)
		for _, step := range []struct {
			args                 []string
			project              func() string
			balance, creditLimit int64
		}{
			{[]string{"billing", "credit", "p1", "150.00", "--reference", "bank transfer 42"}, func() string { return f.p1 }, 15000, 0},
			{[]string{"billing", "credit", f.p1, "500", "--reference=cash"}, func() string { return f.p1 }, 15500, 0},
			{[]string{"billing", "credit-limit", "p1", "50.5"}, func() string { return f.p1 }, 15500, 5050},
			{[]string{"billing", "adjust", "p1", "-500", "--reference", "goodwill reversed"}, func() string { return f.p1 }, 15000, 5050},
			{[]string{"billing", "adjust", "--reference", "goodwill", "p2", "+0.99"}, func() string { return f.p2 }, 99, 0},
			{[]string{"billing", "credit-limit", "p1", "0"}, func() string { return f.p1 }, 15000, 0},
		} {
			out, err := f.admin(t, step.args...)
			if err != nil {
				t.Fatalf("nimbus admin %v: %v", step.args, err)
			}
			if !strings.Contains(out, "balance ") {
				t.Errorf("nimbus admin %v printed %q, want the account", step.args, out)
			}
			a := f.account(t, step.project())
			if a.Balance != step.balance || a.CreditLimit != step.creditLimit || a.Currency != "RUB" {
				t.Fatalf("after %v: account = %+v, want balance %d, credit limit %d", step.args, a, step.balance, step.creditLimit)
			}
		}
		var body struct {
			Topup   billing.Topup
			Account billing.Account
		}
		f.adminJSON(t, &body, "billing", "credit", "p2", "1", "--reference", "r")
		if body.Topup.Provider != "manual" || body.Topup.Status != billing.TopupSucceeded || body.Account.Balance != 100 {
			t.Fatalf("credit --json = %+v", body)
		}
		out, err := f.admin(t, "billing", "accounts")
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"PROJECT ID", f.p1 + "  p1", "150.00", f.p2 + "  p2", "1.00"} {
			if !strings.Contains(out, want) {
				t.Errorf("accounts table lacks %q:\n%s", want, out)
			}
		}
		// Flags may also come before the command words.
		var first bytes.Buffer
		if err := runAdmin(context.Background(), append(append([]string{}, f.flags...), "billing", "accounts"), &first, io.Discard); err != nil {
			t.Fatal(err)
		}
		if first.String() != out {
			t.Fatalf("flags first printed\n%s\nwant\n%s", first.String(), out)
		}
	})
}

// TestAdminBadInput checks that each mistake is an error that names it,
// and that nothing was written.
func TestAdminBadInput(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, dbURL string) {
		f := newAdminFixture(t, dbURL)
		before := f.written(t)
		for _, c := range []struct {
			args []string
			want string
		}{
			{[]string{"billing", "credit", "p1", "abc", "--reference", "x"}, `invalid amount "abc"`},
			{[]string{"billing", "credit", "p1", "1.234", "--reference", "x"}, "invalid amount"},
			{[]string{"billing", "credit", "p1", "1e3", "--reference", "x"}, "invalid amount"},
			{[]string{"billing", "credit", "p1", "99999999999999999999", "--reference", "x"}, "too large"},
			{[]string{"billing", "credit", "p1", "0", "--reference", "x"}, "must be positive"},
			{[]string{"billing", "credit", "p1", "-5", "--reference", "x"}, "must be positive"},
			{[]string{"billing", "credit", "p1", "100"}, "--reference is required"},
			{[]string{"billing", "credit", "nosuch", "100", "--reference", "x"}, `no project "nosuch"`},
			{[]string{"billing", "credit", "p1"}, "want <project> <amount>"},
			{[]string{"billing", "credit", "p1", "1", "2", "--reference", "x"}, "got 3 argument"},
			{[]string{"billing", "credit", "p1", "100", "--bogus"}, "flag provided but not defined"},
			{[]string{"billing", "credit-limit", "p1", "-1"}, "must not be negative"},
			{[]string{"billing", "credit-limit", "p1", "ten"}, "invalid amount"},
			{[]string{"billing", "adjust", "p1", "0", "--reference", "x"}, "must not be 0"},
			{[]string{"billing", "adjust", "p1", "12"}, "--reference is required"},
			{[]string{"billing", "prices", "set", "vcpu=abc"}, "invalid rate"},
			{[]string{"billing", "prices", "set", "cpu=5"}, `unknown price key "cpu"`},
			{[]string{"billing", "prices", "set", "vcpu=-5"}, "must be between"},
			{[]string{"billing", "trials", "approve", "nosuch", "--credit", "10", "--until", "2999-01-01"}, `no trial "nosuch"`},
			{[]string{"billing", "trials", "approve", "x", "--credit", "10", "--until", "tomorrow"}, "invalid --until"},
			{[]string{"billing", "trials", "decline", "x"}, "--reason is required"},
			{[]string{"billing", "trials", "--status", "open"}, "invalid --status"},
			{[]string{"billing", "frobnicate"}, `unknown command "frobnicate"`},
			{[]string{"frobnicate"}, `unknown command "frobnicate"`},
			{[]string{"billing"}, "missing command"},
			{[]string{"billing", "run", "now"}, "want no arguments"},
		} {
			out, err := f.admin(t, c.args...)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("nimbus admin %v: error %v, want one containing %q", c.args, err, c.want)
			}
			if out != "" {
				t.Errorf("nimbus admin %v printed %q on error", c.args, out)
			}
			if after := f.written(t); after != before {
				t.Fatalf("nimbus admin %v wrote: %s, was %s", c.args, after, before)
			}
		}
	})
}

// TestAdminMissingDatabase refuses to make a new empty cloud where the
// operator pointed at the wrong directory.
func TestAdminMissingDatabase(t *testing.T) {
	t.Setenv("NIMBUS_DATABASE_URL", "")
	dir := filepath.Join(t.TempDir(), "nowhere")
	var out, errOut bytes.Buffer
	err := runAdmin(context.Background(), []string{"billing", "accounts", "--data-dir", dir}, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "no Nimbus database at") {
		t.Fatalf("error %v, want no database", err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("the data directory was made: %v", err)
	}
}

func TestAdminHelp(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"billing", "-h"}, {"billing", "credit", "-h"}, {"billing", "trials", "approve", "--help"}} {
		var out, errOut bytes.Buffer
		if err := runAdmin(context.Background(), args, &out, &errOut); !errors.Is(err, flag.ErrHelp) {
			t.Errorf("nimbus admin %v: %v, want flag.ErrHelp", args, err)
		}
		if !strings.Contains(errOut.String(), "Usage: nimbus admin billing") {
			t.Errorf("nimbus admin %v usage:\n%s", args, errOut.String())
		}
	}
}

func TestAdminPrices(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, dbURL string) {
		f := newAdminFixture(t, dbURL)
		var body struct {
			Prices struct {
				Currency  string
				RateScale int `json:"rate_scale"`
				Hourly    billing.PriceList
			}
		}
		f.adminJSON(t, &body, "billing", "prices")
		if body.Prices.Hourly.VCPU != 500000 || body.Prices.Hourly.DiskGB["local"] != 5000 || body.Prices.RateScale != billing.RateScale {
			t.Fatalf("prices = %+v", body)
		}
		f.adminJSON(t, &body, "billing", "prices", "set", "vcpu=600000", "gpu:H100=20000000", "term:12=500")
		h := body.Prices.Hourly
		if h.VCPU != 600000 || h.GPU["H100"] != 20000000 || h.GPU["L4"] != 4000000 || h.TermDiscounts["12"] != 500 {
			t.Fatalf("prices after set = %+v", h)
		}
		out, err := f.admin(t, "billing", "prices")
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"vcpu", "0.60 RUB per hour", "disk_gb:local", "0.005 RUB per hour", "term:12", "5.00% discount"} {
			if !strings.Contains(out, want) {
				t.Errorf("prices table lacks %q:\n%s", want, out)
			}
		}
	})
}

func TestAdminTrials(t *testing.T) {
	storetest.ForEachEngine(t, func(t *testing.T, dbURL string) {
		f := newAdminFixture(t, dbURL)
		ctx := context.Background()
		b := billing.New(f.db, billing.Config{})
		t1, err := b.RequestTrial(ctx, f.p1, "load-test our shop\nbefore launch")
		if err != nil {
			t.Fatal(err)
		}
		t2, err := b.RequestTrial(ctx, f.p2, "mining")
		if err != nil {
			t.Fatal(err)
		}
		out, err := f.admin(t, "billing", "trials")
		if err != nil || !strings.Contains(out, t1.ID) || !strings.Contains(out, "load-test our shop…") || !strings.Contains(out, t2.ID) {
			t.Fatalf("trials: %v\n%s", err, out)
		}
		until := time.Now().UTC().AddDate(0, 1, 0).Format(time.DateOnly)
		var approved struct{ Trial billing.Trial }
		f.adminJSON(t, &approved, "billing", "trials", "approve", t1.ID, "--credit", "500.00", "--until", until)
		// A date is through its last second, and shown back on that date.
		if approved.Trial.Status != billing.TrialApproved || approved.Trial.Credit != 50000 ||
			approved.Trial.EndsAt.UTC().Format(time.RFC3339) != until+"T23:59:59Z" {
			t.Fatalf("approved = %+v, want it to end %sT23:59:59Z", approved.Trial, until)
		}
		if _, err := f.admin(t, "billing", "trials", "decline", t2.ID, "--reason", "not for mining"); err != nil {
			t.Fatal(err)
		}
		if _, err := f.admin(t, "billing", "trials", "decline", t2.ID, "--reason", "again"); err == nil || !strings.Contains(err.Error(), "declined already") {
			t.Fatalf("second decision: %v", err)
		}
		var pending struct{ Trials []billing.Trial }
		f.adminJSON(t, &pending, "billing", "trials")
		if len(pending.Trials) != 0 {
			t.Fatalf("pending after deciding both = %+v", pending.Trials)
		}
		if _, err := f.admin(t, "billing", "credit", "p1", "20.00", "--reference", "paid"); err != nil {
			t.Fatal(err)
		}
		if a := f.account(t, f.p1); a.Balance != 52000 || a.PaidBalance != 2000 || a.TrialCredit != 50000 || a.TrialEndsAt == nil {
			t.Fatalf("account with a trial = %+v, want paid 2000 and trial credit 50000 apart", a)
		}
		out, err = f.admin(t, "billing", "accounts")
		row := regexp.MustCompile(regexp.QuoteMeta(f.p1) + `\s+p1\s+20\.00\s+500\.00\s+` + until + `T23:59:59Z\s+520\.00\s`)
		if err != nil || !strings.Contains(out, "PAID BALANCE") || !row.MatchString(out) {
			t.Fatalf("accounts table, want p1 paid 20.00, trial 500.00 until %s, balance 520.00: %v\n%s", until, err, out)
		}
	})
}

func TestParseAmount(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"15000", 15000, true}, {"150.00", 15000, true}, {"150.5", 15050, true}, {"0.01", 1, true},
		{"-20.00", -2000, true}, {"+7", 7, true}, {"0", 0, true},
		{"92233720368547758.07", 9223372036854775807, true},
		{"92233720368547758.08", 0, false}, {"", 0, false}, {".5", 0, false}, {"5.", 0, false},
		{"1.234", 0, false}, {"1,5", 0, false}, {"1e3", 0, false}, {"abc", 0, false}, {"--1", 0, false}, {" 1", 0, false},
	} {
		got, err := parseAmount(c.in)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("parseAmount(%q) = %d, %v; want %d, ok %v", c.in, got, err, c.want, c.ok)
		}
	}
	for n, want := range map[int64]string{0: "0.00", 5: "0.05", -150: "-1.50", 15000: "150.00", -9223372036854775808: "-92233720368547758.08"} {
		if got := money(n); got != want {
			t.Errorf("money(%d) = %q, want %q", n, got, want)
		}
	}
}
