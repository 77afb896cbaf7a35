package billing_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"nimbus/internal/cloud"
	"nimbus/internal/testenv"
)

type quoteBody struct {
	Quote struct {
		HourlyEach    int64 `json:"hourly_each"`
		Hourly        int64 `json:"hourly"`
		Monthly       int64 `json:"monthly"`
		Total         int64 `json:"total"`
		DurationHours int64 `json:"duration_hours"`
		Tariff        string
		Items         []json.RawMessage
	}
}

// TestQuotes drives POST /v1/quotes on a real cloud: a flavor by name or
// id prices what its parts price, an hourly total without duration_hours
// is one month, and a quote that prices nothing, or names an unknown
// field or flavor, is a 400 saying what is allowed.
func TestQuotes(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, url string) {
		c := testenv.StartCloud(t, url)
		hc := testenv.HTTPClient(t, c)
		demo := testenv.Token(t, c, cloud.DemoUser)
		quote := func(body string, want int) (quoteBody, string) {
			t.Helper()
			resp, raw := testenv.Do(t, hc, "POST", c.BillingURL+"/v1/quotes", demo, body)
			testenv.MustStatus(t, resp, raw, want)
			var q quoteBody
			if want == 200 {
				if err := json.Unmarshal([]byte(raw), &q); err != nil {
					t.Fatal(err)
				}
			}
			return q, raw
		}
		resp, raw := testenv.Do(t, hc, "GET", c.ComputeURL+"/flavors/detail", demo, "")
		testenv.MustStatus(t, resp, raw, 200)
		var fl struct {
			Flavors []struct {
				ID, Name             string
				VCPUs                int64 `json:"vcpus"`
				RAM, Disk, Ephemeral int64
			}
		}
		if err := json.Unmarshal([]byte(raw), &fl); err != nil {
			t.Fatal(err)
		}
		var id, parts string
		for _, f := range fl.Flavors {
			if f.Name == "d2.4g.local" {
				id = f.ID
				parts = fmt.Sprintf(`"vcpus": %d, "ram_gb": %d, "disk_gb": %d, "disk_type": "local"`, f.VCPUs, f.RAM/1024, f.Disk+f.Ephemeral)
			}
		}
		if id == "" {
			t.Fatalf("no flavor d2.4g.local in %s", raw)
		}
		byParts, _ := quote(`{"quote": {`+parts+`}}`, 200)
		if byParts.Quote.Hourly <= 0 {
			t.Fatalf("parts quote %+v", byParts)
		}
		for _, tc := range []struct {
			body         string
			hours, total int64
		}{
			{`{"quote": {"flavor": "d2.4g.local"}}`, 720, byParts.Quote.Hourly * 720},
			{`{"quote": {"flavor": "` + id + `"}}`, 720, byParts.Quote.Hourly * 720},
			{`{"quote": {"flavor": "d2.4g.local", "quantity": 3, "duration_hours": 10}}`, 10, byParts.Quote.Hourly * 30},
			{`{"quote": {` + parts + `, "tariff": "hourly"}}`, 720, byParts.Quote.Monthly},
		} {
			q, raw := quote(tc.body, 200)
			if q.Quote.HourlyEach != byParts.Quote.Hourly || q.Quote.DurationHours != tc.hours || q.Quote.Total != tc.total ||
				q.Quote.Tariff != "hourly" || len(q.Quote.Items) != len(byParts.Quote.Items) {
				t.Errorf("%s = %s; want hourly each %d, %d hours, total %d", tc.body, raw, byParts.Quote.Hourly, tc.hours, tc.total)
			}
		}
		for _, tc := range []struct{ body, want string }{
			{`{"quote": {}}`, "prices nothing"},
			{`{"quote": {"quantity": 2, "tariff": "hourly", "duration_hours": 5}}`, "prices nothing"},
			{`{"quote": {"os_type": "linux"}}`, "prices nothing"},
			{`{"quote": {"vcpus": 1, "colour": "red"}}`, `Unknown field 'colour'`},
			{`{"quote": {"vcpus": 1, "colour": "red"}}`, "flavor, vcpus, ram_gb"},
			{`{"quote": {"flavor": "d2.4g.local", "vcpus": 4}}`, "not both"},
			{`{"quote": {"flavor": "no-such-flavor"}}`, `No flavor 'no-such-flavor'`},
			{`{"quote": {"flavor": ""}}`, "id or name"},
			{`{"quote": {"flavor": 7}}`, ""},
			{`{"quote": {"flavor": "d2.4g.local", "duration_hours": -1}}`, "duration_hours"},
			{`{"quote": {"flavor": "` + strings.Repeat("x", 300) + `"}}`, "id or name"},
		} {
			if _, raw := quote(tc.body, 400); !strings.Contains(raw, tc.want) {
				t.Errorf("%.80s: %s, want it to say %q", tc.body, raw, tc.want)
			}
		}
	})
}
