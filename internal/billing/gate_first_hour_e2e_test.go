package billing_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"nimbus/internal/cloud"
	"nimbus/internal/testenv"
)

// TestGateFirstHour drives a real cloud whose projects have no credit
// limit, as every project an operator makes and every sign-up: at a
// balance of exactly zero nothing that charges may start (a GPU server
// above all), the quote says so in the words the API refuses with, and
// once the balance covers one server's first hour exactly, one server
// starts and the next is refused, since the hour now running already owes
// what the balance holds. A multiple create starts as many as are paid
// for, at least min_count; an unshelve and a resize up ask the same.
func TestGateFirstHour(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, url string) {
		c, _, hc, demo := startClocked(t, url, noCredit)
		admin := testenv.Token(t, c, cloud.AdminUser)
		project := projectOf(t, c, hc, demo)
		call := func(method, url, body string, want int) string {
			t.Helper()
			resp, raw := testenv.Do(t, hc, method, url, demo, body, "OpenStack-API-Version", "compute 2.79")
			testenv.MustStatus(t, resp, raw, want)
			return raw
		}
		balance := func() int64 {
			var a struct{ Account struct{ Balance int64 } }
			json.Unmarshal([]byte(call("GET", c.BillingURL+"/v1/account", "", 200)), &a)
			return a.Account.Balance
		}
		adjust := func(amount int64) {
			t.Helper()
			resp, raw := testenv.Do(t, hc, "POST", c.BillingURL+"/v1/accounts/"+project+"/adjustments", admin,
				testenv.Sprintf(`{"adjustment": {"amount": %d, "reference": "test"}}`, amount))
			testenv.MustStatus(t, resp, raw, 201)
		}
		type coverage struct {
			Quote struct {
				Hourly   int64
				Coverage struct {
					Available, Needed int64
					Covered           bool
					Message           string
				}
			}
		}
		quote := func(body string) coverage {
			t.Helper()
			var q coverage
			json.Unmarshal([]byte(call("POST", c.BillingURL+"/v1/quotes", body, 200)), &q)
			return q
		}
		sc := testenv.Compute(t, testenv.Provider(t, c, cloud.DemoUser), "2.79")
		image, minRAM, minDisk := baseImage(t, c, hc, demo)
		small := smallest(t, sc, minRAM, minDisk)
		server := func(flavor, extra string) string {
			return `{"server": {"name": "gate", "imageRef": "` + image + `", "flavorRef": "` + flavor + `", "networks": "none"` + extra + `}}`
		}
		refused := func(what, method, url, body string) string {
			t.Helper()
			resp, raw := testenv.Do(t, hc, method, url, demo, body, "OpenStack-API-Version", "compute 2.79")
			if resp.StatusCode != http.StatusForbidden || !strings.Contains(raw, "do not cover this request") {
				t.Errorf("%s: %d %s; want 403 saying the funds do not cover it", what, resp.StatusCode, raw)
				return ""
			}
			return messageOf(t, raw)
		}

		// A balance of exactly zero.
		if b := balance(); b != 0 {
			adjust(-b)
		}
		gpu := quote(`{"quote": {"flavor": "g.l4.x1"}}`)
		if gpu.Quote.Coverage.Covered || gpu.Quote.Coverage.Available != 0 || gpu.Quote.Coverage.Needed != gpu.Quote.Hourly {
			t.Errorf("at zero a GPU server is quoted %+v; want not covered", gpu.Quote.Coverage)
		}
		msg := refused("a GPU server at zero", "POST", c.ComputeURL+"/servers", server("g.l4.x1", ""))
		if msg != gpu.Quote.Coverage.Message {
			t.Errorf("the API refuses with %q, the quote says %q", msg, gpu.Quote.Coverage.Message)
		}
		refused("a small server at zero", "POST", c.ComputeURL+"/servers", server(small, ""))
		refused("a volume at zero", "POST", c.VolumeURL+"/volumes", `{"volume": {"size": 1}}`)
		refused("a floating IP at zero", "POST", c.NetworkURL+"/v2.0/floatingips",
			`{"floatingip": {"floating_network_id": "`+networkID(t, c, hc, demo, "public")+`"}}`)

		// Exactly one small server's first hour: one starts, the next not.
		hourly := quote(`{"quote": {"flavor": "` + small + `"}}`).Quote.Hourly
		adjust(hourly)
		if q := quote(`{"quote": {"flavor": "` + small + `"}}`); !q.Quote.Coverage.Covered {
			t.Errorf("the first hour paid for is quoted %+v", q.Quote.Coverage)
		}
		// ... but not with a volume made beside it, which it does not pay.
		refused("a server and a volume of its own", "POST", c.ComputeURL+"/servers", server(small, `, "block_device_mapping_v2": [
			{"boot_index": 0, "source_type": "image", "destination_type": "local", "uuid": "`+image+`"},
			{"boot_index": -1, "source_type": "blank", "destination_type": "volume", "volume_size": 50, "delete_on_termination": true}]`))
		first := idOf(t, call("POST", c.ComputeURL+"/servers", server(small, ""), 202), "server")
		waitStatus(t, sc, first, "ACTIVE")
		refused("a second server in the same hour", "POST", c.ComputeURL+"/servers", server(small, ""))

		// Two more paid for: max_count 5 starts two; min_count 3 none.
		adjust(2 * hourly)
		refused("min_count 3 paid for 2", "POST", c.ComputeURL+"/servers", server(small, `, "min_count": 3, "max_count": 5`))
		var res struct {
			ReservationID string `json:"reservation_id"`
		}
		json.Unmarshal([]byte(call("POST", c.ComputeURL+"/servers",
			server(small, `, "min_count": 1, "max_count": 5, "return_reservation_id": true`), 202)), &res)
		var list struct{ Servers []struct{ ID string } }
		json.Unmarshal([]byte(call("GET", c.ComputeURL+"/servers?reservation_id="+res.ReservationID, "", 200)), &list)
		if len(list.Servers) != 2 {
			t.Errorf("max_count 5 with two paid for started %d servers", len(list.Servers))
		}

		// A resize to a dearer flavor asks for the raise; a shelved
		// server's unshelve for its first hour.
		refused("a resize up", "POST", c.ComputeURL+"/servers/"+first+"/action", `{"resize": {"flavorRef": "`+dearer(t, sc, small)+`"}}`)
		call("POST", c.ComputeURL+"/servers/"+first+"/action", `{"shelve": null}`, 202)
		waitStatus(t, sc, first, "SHELVED_OFFLOADED")
		refused("an unshelve", "POST", c.ComputeURL+"/servers/"+first+"/action", `{"unshelve": null}`)
		// The admin's unshelve is refused for the owner's money too.
		resp, raw := testenv.Do(t, hc, "POST", c.ComputeURL+"/servers/"+first+"/action", admin, `{"unshelve": null}`)
		if resp.StatusCode != http.StatusForbidden || !strings.Contains(raw, project) {
			t.Errorf("an admin's unshelve of an unpaid server: %d %s", resp.StatusCode, raw)
		}
		// (The shelve image is charged too: a little more than an hour.)
		adjust(hourly + 100)
		call("POST", c.ComputeURL+"/servers/"+first+"/action", `{"unshelve": null}`, 202)
		waitStatus(t, sc, first, "ACTIVE")
	})
}
