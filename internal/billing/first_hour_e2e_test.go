package billing_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"nimbus/internal/cloud"
	"nimbus/internal/imagecatalog"
	"nimbus/internal/testenv"
)

// TestFirstHourEqualsQuote orders every flavor shape and extra through the
// API of a real cloud — a GPU by model and count, the Windows licence, a
// network disk, a public IPv4, a volume, a floating IP, a backup, a
// prepaid term — and checks that what the charging pass takes for each
// hour equals POST /v1/quotes for the same choice: the server, the address
// its flavor gives it and its root volume together, not each apart.
func TestFirstHourEqualsQuote(t *testing.T) {
	testenv.ForEachEngine(t, func(t *testing.T, dbURL string) {
		c := testenv.StartCloud(t, dbURL)
		hc := testenv.HTTPClient(t, c)
		demo := testenv.Token(t, c, cloud.DemoUser)
		f := &firstHour{t: t, c: c, hc: hc, token: demo, seen: map[string]bool{}}
		f.charge() // whatever the demo project had before
		netID := f.network()
		// As an operator would: room for the GPU flavors in the demo
		// project's quota, and a flavor that names its GPUs in two entries
		// (the scheduler once counted three of these, billing two).
		admin := testenv.Token(t, c, cloud.AdminUser)
		adminCall := func(method, url, body string, want int) {
			t.Helper()
			resp, raw := testenv.Do(t, hc, method, url, admin, body)
			testenv.MustStatus(t, resp, raw, want)
		}
		adminCall("PUT", c.ComputeURL+"/os-quota-sets/"+projectOf(t, c, hc, demo), `{"quota_set": {"cores": 200, "ram": 1048576}}`, 200)
		adminCall("POST", c.ComputeURL+"/flavors", `{"flavor": {"name": "g.mixed", "id": "g-mixed", "vcpus": 8, "ram": 16384, "disk": 20}}`, 200)
		adminCall("POST", c.ComputeURL+"/flavors/g-mixed/os-extra_specs", `{"extra_specs": {"hw:cpu_policy": "dedicated",
			"nimbus:disk_type": "local", "nimbus:gpu_model": "A100 80GB", "pci_passthrough:alias": "a100-80gb:2,a100-80gb"}}`, 200)
		var mixed quoteBody
		f.call("POST", c.BillingURL+"/v1/quotes", `{"quote": {"flavor": "g-mixed"}}`, 200, &mixed)
		if !strings.Contains(string(mustJSON(t, mixed.Quote.Items)), `"item":"gpu:A100 80GB","quantity":3`) {
			t.Errorf("g-mixed is quoted %s; want three A100 GPUs", mustJSON(t, mixed.Quote.Items))
		}

		panel := newConfigurator(t, c)
		for _, tc := range []struct {
			name, flavor, image string
			quote               string // the quote's other fields
			form                string // the same choice in the configurator
		}{
			{"local disk", "d2.4g.local", "Debian 12", ``, "vcpus=2&ram_gb=4&disk_gb=40&disk_type=local"},
			{"public IPv4", "d2.4g.local.ipv4", "Debian 12", ``, "vcpus=2&ram_gb=4&disk_gb=40&disk_type=local&ipv4=yes"},
			{"network disk", "d2.4g.network", "Debian 12", ``, "vcpus=2&ram_gb=4&disk_gb=40&disk_type=network"},
			{"network disk and IPv4", "d4.8g.network.ipv4", "Debian 12", ``, "vcpus=4&ram_gb=8&disk_gb=80&disk_type=network&ipv4=yes"},
			{"one GPU", "g.l4.x1", "Ubuntu 24.04", ``, "vcpus=8&ram_gb=48&disk_gb=100&disk_type=local&ipv4=yes&gpu_model=L4&gpu_count=1"},
			{"two GPUs", "g.a100-80gb.x2", "Ubuntu 24.04", ``,
				"vcpus=32&ram_gb=240&disk_gb=400&disk_type=local&ipv4=yes&gpu_model=A100+80GB&gpu_count=2"},
			{"GPUs in two entries", "g-mixed", "Ubuntu 24.04", ``, "vcpus=8&ram_gb=16&disk_gb=20&disk_type=local&gpu_model=A100+80GB&gpu_count=3"},
			{"Windows licence", "d2.4g.local.ipv4", "Windows Server 2022", `, "os_type": "windows"`,
				"vcpus=2&ram_gb=4&disk_gb=40&disk_type=local&ipv4=yes"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				f.t = t
				want := f.quote(`{"flavor": "` + tc.flavor + `"` + tc.quote + `}`)
				if got := panel.hourly(t, tc.form+"&image="+url.QueryEscape(tc.image)); got != want {
					t.Errorf("the configurator shows %d an hour for %s; the quote is %d", got, tc.form, want)
				}
				id := f.create("/servers", `{"server": {"name": "fh", "flavorRef": "`+tc.flavor+`", "imageRef": "`+
					imagecatalog.ID(tc.image)+`", "networks": [{"uuid": "`+netID+`"}]}}`, "server")
				f.waitFor(c.ComputeURL+"/servers/"+id, "server", "ACTIVE")
				f.checkHours(tc.flavor, want, "fh")
				f.remove(c.ComputeURL + "/servers/" + id)
			})
		}

		t.Run("volume", func(t *testing.T) {
			f.t = t
			want := f.quote(`{"volume_gb": 7}`)
			id := f.create("/volumes", `{"volume": {"size": 7, "name": "fh"}}`, "volume")
			f.waitFor(c.VolumeURL+"/volumes/"+id, "volume", "available")
			f.checkHours("a volume of 7 GB", want, "fh")

			t.Run("backup", func(t *testing.T) {
				f.t = t
				want := f.quote(`{"backup_gb": 7}`)
				bk := f.create("/backups", `{"backup": {"volume_id": "`+id+`", "name": "fh"}}`, "backup")
				f.waitFor(c.VolumeURL+"/backups/"+bk, "backup", "available")
				f.checkHours("a backup of 7 GB", want, "fh")
				f.remove(c.VolumeURL + "/backups/" + bk)
			})
			f.t = t
			f.remove(c.VolumeURL + "/volumes/" + id)
		})

		t.Run("floating IP", func(t *testing.T) {
			f.t = t
			want := f.quote(`{"public_ipv4": true}`)
			var fip struct {
				Floatingip struct {
					ID      string
					Address string `json:"floating_ip_address"`
				}
			}
			f.call("POST", c.NetworkURL+"/v2.0/floatingips", `{"floatingip": {"floating_network_id": "`+f.publicNetwork()+`"}}`, 201, &fip)
			id := fip.Floatingip.ID
			f.checkHours("a floating IP", want, fip.Floatingip.Address)
			f.remove(c.NetworkURL + "/v2.0/floatingips/" + id)
		})

		t.Run("prepaid term", func(t *testing.T) {
			f.t = t
			hourly := f.quote(`{"flavor": "d2.4g.local.ipv4"}`)
			var q quoteBody
			f.call("POST", c.BillingURL+"/v1/quotes", `{"quote": {"flavor": "d2.4g.local.ipv4", "tariff": "prepaid", "term_months": 1}}`, 200, &q)
			id := f.create("/servers", `{"server": {"name": "fh", "flavorRef": "d2.4g.local.ipv4", "imageRef": "`+
				imagecatalog.ID("Debian 12")+`", "networks": [{"uuid": "`+netID+`"}]}}`, "server")
			f.waitFor(c.ComputeURL+"/servers/"+id, "server", "ACTIVE")
			f.checkHours("the hour before the term", hourly, "fh")
			f.call("POST", c.BillingURL+"/v1/terms", `{"term": {"server_id": "`+id+`", "months": 1}}`, 201, nil)
			if got := f.newEntries("charge"); len(got) != 1 || !strings.HasPrefix(got[0].Reference, "term:") || -got[0].Amount != q.Quote.Total ||
				got[0].ResourceName != "fh" {
				t.Errorf("a term of one month took %+v; the quote's total is %d", got, q.Quote.Total)
			}
			f.remove(c.ComputeURL + "/servers/" + id)
		})
	})
}

// firstHour is the test's view of one cloud and the demo project's ledger.
type firstHour struct {
	t     *testing.T
	c     *cloud.Cloud
	hc    *http.Client
	token string
	seen  map[string]bool // ledger entries already looked at
}

type ledgerEntry struct {
	ID, Kind, Reference string
	Amount              int64
	ResourceName        string  `json:"resource_name"`
	ResourceID          *string `json:"resource_id"`
	PeriodStart         *string `json:"period_start"`
}

func (f *firstHour) call(method, url, body string, want int, v any) {
	f.t.Helper()
	resp, raw := testenv.Do(f.t, f.hc, method, url, f.token, body, "OpenStack-API-Version", "volume 3.60")
	testenv.MustStatus(f.t, resp, raw, want)
	if v != nil {
		if err := json.Unmarshal([]byte(raw), v); err != nil {
			f.t.Fatal(err)
		}
	}
}

// quote is the hourly price POST /v1/quotes gives the fields.
func (f *firstHour) quote(fields string) int64 {
	f.t.Helper()
	var q quoteBody
	f.call("POST", f.c.BillingURL+"/v1/quotes", `{"quote": `+fields+`}`, 200, &q)
	if q.Quote.Hourly <= 0 {
		f.t.Fatalf("quote %s: %+v", fields, q)
	}
	return q.Quote.Hourly
}

// create posts body to the service that owns path and answers the id.
func (f *firstHour) create(path, body, key string) string {
	f.t.Helper()
	base := map[string]string{"/servers": f.c.ComputeURL, "/volumes": f.c.VolumeURL, "/backups": f.c.VolumeURL,
		"/v2.0/floatingips": f.c.NetworkURL}[path]
	var out map[string]struct{ ID string }
	want := map[string]int{"server": 202, "volume": 202, "backup": 202, "floatingip": 201}[key]
	f.call("POST", base+path, body, want, &out)
	if out[key].ID == "" {
		f.t.Fatalf("POST %s answered no id", path)
	}
	return out[key].ID
}

func (f *firstHour) waitFor(url, key, status string) {
	f.t.Helper()
	var last string
	testenv.Eventually(f.t, 60*time.Second, url+" "+status, func() bool {
		var out map[string]struct{ Status string }
		f.call("GET", url, "", 200, &out)
		last = out[key].Status
		if last == "ERROR" || last == "error" {
			f.t.Fatalf("%s went to %s", url, last)
		}
		return last == status
	})
}

// remove deletes what url names and waits until it is gone, so that the
// next case's hours are its own.
func (f *firstHour) remove(url string) {
	f.t.Helper()
	resp, raw := testenv.Do(f.t, f.hc, "DELETE", url, f.token, "", "OpenStack-API-Version", "volume 3.60")
	if resp.StatusCode >= 300 {
		f.t.Fatalf("DELETE %s: %d %s", url, resp.StatusCode, raw)
	}
	testenv.Eventually(f.t, 60*time.Second, url+" gone", func() bool {
		resp, _ := testenv.Do(f.t, f.hc, "GET", url, f.token, "", "OpenStack-API-Version", "volume 3.60")
		return resp.StatusCode == 404
	})
	f.charge() // the last hour of what was removed
}

// charge runs the charging pass now and answers the charges it recorded
// that this test has not seen yet.
func (f *firstHour) charge() []ledgerEntry {
	f.t.Helper()
	if _, err := f.c.Billing.ChargeUntil(context.Background(), time.Now()); err != nil {
		f.t.Fatal(err)
	}
	return f.newEntries("charge")
}

// newEntries are the demo project's ledger entries of kind not seen yet.
func (f *firstHour) newEntries(kind string) []ledgerEntry {
	f.t.Helper()
	var out struct{ Ledger []ledgerEntry }
	f.call("GET", f.c.BillingURL+"/v1/ledger?limit=1000", "", 200, &out)
	var fresh []ledgerEntry
	for _, e := range out.Ledger {
		if !f.seen[e.ID] && e.Kind == kind {
			fresh = append(fresh, e)
		}
		f.seen[e.ID] = true
	}
	return fresh
}

// checkHours runs the charging pass and checks that each hour it charged
// costs want in all (the hour a case began in, and the next if the clock
// turned meanwhile), and that each charge names what it was for (name).
func (f *firstHour) checkHours(what string, want int64, name string) {
	f.t.Helper()
	fresh := f.charge()
	byHour := map[string]int64{}
	for _, e := range fresh {
		if e.PeriodStart == nil {
			f.t.Fatalf("charge without an hour: %+v", e)
		}
		if e.ResourceName != name {
			f.t.Errorf("%s: charge %s names %q, want %q", what, e.Reference, e.ResourceName, name)
		}
		byHour[(*e.PeriodStart)[:13]] -= e.Amount
	}
	if len(byHour) == 0 {
		f.t.Fatalf("%s: nothing charged; quoted %d an hour", what, want)
	}
	for h, got := range byHour {
		if got != want {
			f.t.Errorf("%s: hour %s charged %d (%s); quoted %d", what, h, got, describe(fresh), want)
		}
	}
}

func describe(es []ledgerEntry) string {
	s := ""
	for _, e := range es {
		s += fmt.Sprintf("[%s %d] ", e.Reference, -e.Amount)
	}
	return s
}

// network is the demo project's private network.
func (f *firstHour) network() string {
	var out struct{ Networks []struct{ ID string } }
	f.call("GET", f.c.NetworkURL+"/v2.0/networks?name=private", "", 200, &out)
	if len(out.Networks) == 0 {
		f.t.Fatal("the demo project has no private network")
	}
	return out.Networks[0].ID
}

// publicNetwork is the external network floating IPs come from.
func (f *firstHour) publicNetwork() string {
	var out struct{ Networks []struct{ ID string } }
	f.call("GET", f.c.NetworkURL+"/v2.0/networks?router:external=true", "", 200, &out)
	if len(out.Networks) == 0 {
		f.t.Fatal("no external network")
	}
	return out.Networks[0].ID
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// configurator is a visitor of the panel's configurator.
type configurator struct {
	hc   *http.Client
	base string
	csrf string
}

var csrfField = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

func newConfigurator(t *testing.T, c *cloud.Cloud) *configurator {
	hc := testenv.HTTPClient(t, c)
	hc.Jar, _ = cookiejar.New(nil)
	p := &configurator{hc: hc, base: c.PanelURL}
	resp, err := hc.Get(p.base + "/configure")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	m := csrfField.FindSubmatch(body)
	if resp.StatusCode != 200 || m == nil {
		t.Fatalf("GET /configure: %d", resp.StatusCode)
	}
	p.csrf = string(m[1])
	return p
}

// hourly is the price per hour the configurator shows for the choice in
// form (a query string), for one server.
func (p *configurator) hourly(t *testing.T, form string) int64 {
	t.Helper()
	v, err := url.ParseQuery(form + "&quantity=1&tariff=hourly&name=fh&key_mode=generate")
	if err != nil {
		t.Fatal(err)
	}
	v.Set("csrf", p.csrf)
	resp, err := p.hc.PostForm(p.base+"/configure/quote", v)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var a struct {
		HourlyMinor int64    `json:"hourly_minor"`
		Problems    []string `json:"problems"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil || resp.StatusCode != 200 {
		t.Fatalf("configurator quote %s: %d %v", form, resp.StatusCode, err)
	}
	return a.HourlyMinor
}
