package volume_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"nimbus/internal/api"
	"nimbus/internal/billing"
	"nimbus/internal/store"
	"nimbus/internal/testenv"
	"nimbus/internal/volume"
)

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) set(s string) {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

type oneUser struct{}

func (oneUser) Validate(_ context.Context, tok string) (*api.Caller, error) {
	if tok != "tok" {
		return nil, api.Unauthorized()
	}
	return &api.Caller{UserID: "u1", ProjectID: "p1", Roles: []string{"member"}}, nil
}

// TestVolumeCharges runs billing's charging pass over a volume's life with
// an injected clock: each started hour is charged once at volume_gb × its
// size, an extend pays its new size from the next hour, and nothing is
// charged after delete.
func TestVolumeCharges(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		ctx := context.Background()
		db, err := store.Open(ctx, dbURL)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		clk := &clock{}
		clk.set("2026-03-01T09:50:00Z")
		quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
		b := billing.New(db, billing.Config{Now: clk.now, Log: quiet, DefaultCreditLimit: 1 << 40})
		if _, err := b.SetPrices(ctx, map[string]int64{"volume_gb": billing.RateScale}); err != nil {
			t.Fatal(err)
		}
		svc := volume.New(volume.Config{DB: db, DataDir: t.TempDir(), Now: clk.now, Log: quiet})
		t.Cleanup(svc.Close)
		if err := svc.Bootstrap(ctx); err != nil {
			t.Fatal(err)
		}
		a := svc.API(oneUser{}, "")
		a.Log = quiet
		srv := httptest.NewServer(a)
		t.Cleanup(srv.Close)
		call := func(method, path, body string, want int) map[string]any {
			t.Helper()
			resp, raw := testenv.Do(t, srv.Client(), method, srv.URL+path, "tok", body)
			testenv.MustStatus(t, resp, raw, want)
			var m map[string]any
			if raw != "" {
				json.Unmarshal([]byte(raw), &m)
			}
			return m
		}
		waitFor := func(id, status string) {
			t.Helper()
			for i := 0; i < 500; i++ {
				resp, raw := testenv.Do(t, srv.Client(), "GET", srv.URL+"/v3/volumes/"+id, "tok", "")
				if status == "" && resp.StatusCode == 404 {
					return
				}
				if resp.StatusCode == 200 && strings.Contains(raw, `"status":"`+status+`"`) {
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
			t.Fatalf("volume %s never reached %q", id, status)
		}
		charge := func(now string) billing.Result {
			t.Helper()
			clk.set(now)
			r, err := b.ChargeUntil(ctx, clk.now())
			if err != nil {
				t.Fatal(err)
			}
			return r
		}

		charge("2026-03-01T09:55:00Z") // first pass ever: nothing yet
		clk.set("2026-03-01T10:20:00Z")
		id := call("POST", "/v3/volumes", `{"volume":{"size":2,"name":"billed"}}`, 202)["volume"].(map[string]any)["id"].(string)
		waitFor(id, "available")
		charge("2026-03-01T10:30:00Z")
		charge("2026-03-01T10:45:00Z") // again within the hour: nothing new
		charge("2026-03-01T11:05:00Z")
		clk.set("2026-03-01T11:10:00Z")
		call("POST", "/v3/volumes/"+id+"/action", `{"os-extend":{"new_size":3}}`, 202)
		waitFor(id, "available")
		charge("2026-03-01T12:05:00Z")
		clk.set("2026-03-01T12:40:00Z")
		call("DELETE", "/v3/volumes/"+id, "", 202)
		waitFor(id, "")
		charge("2026-03-01T14:05:00Z")
		charge("2026-03-01T16:05:00Z")

		rows, err := db.Query(ctx, `SELECT period_start, amount FROM billing_ledger WHERE kind = 'charge' AND resource_id = ?
			ORDER BY period_start`, id)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var got []string
		for rows.Next() {
			var start string
			var amount int64
			if err := rows.Scan(&start, &amount); err != nil {
				t.Fatal(err)
			}
			got = append(got, store.ParseTime(start).UTC().Format("15")+":"+strconv.FormatInt(amount, 10))
		}
		// One charge per started hour, at 1 minor unit per GB-hour: 2 GB
		// for hours 10 and 11, plus the difference to 3 GB for hour 11
		// (an hour with an extend costs the larger size), 3 GB for hour
		// 12 (deleted at 12:40), nothing after.
		if want := []string{"10:-2", "11:-2", "11:-1", "12:-3"}; !slices.Equal(got, want) {
			t.Fatalf("charges %v, want %v", got, want)
		}
	})
}
