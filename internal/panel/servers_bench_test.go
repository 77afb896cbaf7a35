package panel_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"nimbus/internal/cloud"
	"nimbus/internal/driver"
	"nimbus/internal/driver/fake"
	"nimbus/internal/testenv"
)

// benchServers is how many servers the benchmark's account holds.
const benchServers = 1000

// bigFleet holds benchServers servers of the benchmark's flavors.
func bigFleet(cfg *cloud.Config) {
	cfg.FakeDelay = 0
	for i := range 24 {
		h := driver.Host{Name: fmt.Sprintf("bench-host-%d", i), IP: fmt.Sprintf("192.0.2.%d", 100+i),
			MemoryMB: 512 * 1024, DiskGB: 16000, Zone: "nova", Hypervisor: "fake", Version: 1000, Up: true}
		fake.Topology(&h, 2, 40, 1)
		cfg.Fleet = append(cfg.Fleet, h)
	}
}

// BenchmarkServersPage renders GET /servers over HTTPS, signed in, for an
// account with benchServers servers of four flavors: ns/op, and the p95 of
// 200 requests in ms.
func BenchmarkServersPage(b *testing.B) {
	c := startCloud(b, bigFleet)
	fillAccount(b, c)
	w := newWeb(b, c)
	w.login(demoLogin(c))
	for _, page := range []struct {
		name, path string
		rows       int
	}{{"page=100", "/servers", 100}, {"page=1000", "/servers?limit=1000", benchServers}} {
		b.Run(page.name, func(b *testing.B) {
			benchPage(b, w, c.PanelURL+page.path, func(status int, body string) bool {
				return status == http.StatusOK && strings.Count(body, "<tr data-id=") == page.rows
			})
			b.ReportMetric(gzKB(b, w, c.PanelURL+page.path), "gz-KB")
			// The compute list call the page makes, alone.
			listMS, listCPU := apiList(b, c, page.rows)
			b.ReportMetric(listMS, "api-list-p50-ms")
			b.ReportMetric(listCPU, "api-list-cpu-ms")
		})
	}
}

// benchPage measures GET url as w's user: ns/op, the p95 and p50 of 200
// requests in ms, and the CPU a page costs the whole cloud (panel, the
// services it calls, and this client), which the machine's load does not
// change; ok checks each answer.
func benchPage(b *testing.B, w *web, url string, ok func(status int, body string) bool) {
	b.Helper()
	page := func() time.Duration {
		start := time.Now()
		resp, err := w.hc.Get(url)
		if err != nil {
			b.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !ok(resp.StatusCode, string(body)) {
			b.Fatalf("GET %s: %d", url, resp.StatusCode)
		}
		return time.Since(start)
	}
	page() // warm the connections and caches
	times := make([]time.Duration, 200)
	cpu0 := cpuTime()
	for i := range times {
		times[i] = page()
	}
	cpu := (cpuTime() - cpu0) / time.Duration(len(times))
	sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })
	b.ResetTimer()
	for b.Loop() {
		page()
	}
	b.ReportMetric(float64(times[len(times)*95/100])/1e6, "p95-ms")
	b.ReportMetric(float64(times[len(times)/2])/1e6, "p50-ms")
	b.ReportMetric(float64(cpu)/1e6, "cpu-ms/page")
}

// apiList is the p50 and the CPU of the compute list call the page makes
// (with a client decoding nothing): the part of the page that is compute's.
func apiList(b *testing.B, c *cloud.Cloud, limit int) (float64, float64) {
	hc, tok := testenv.HTTPClient(b, c), testenv.Token(b, c, cloud.DemoUser)
	times := make([]time.Duration, 50)
	cpu0 := cpuTime()
	for i := range times {
		start := time.Now()
		resp, body := testenv.Do(b, hc, "GET", c.ComputeURL+"/servers/detail?limit="+strconv.Itoa(limit), tok, "", "OpenStack-API-Version", "compute 2.96")
		testenv.MustStatus(b, resp, body, http.StatusOK)
		times[i] = time.Since(start)
	}
	cpu := (cpuTime() - cpu0) / time.Duration(len(times))
	sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })
	return float64(times[len(times)/2]) / 1e6, float64(cpu) / 1e6
}

// gzKB is the page's weight as sent compressed.
func gzKB(b *testing.B, w *web, url string) float64 {
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("Accept-Encoding", "gzip") // set by hand, the client leaves the body compressed
	resp, err := w.hc.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	n, _ := io.Copy(io.Discard, resp.Body)
	if resp.Header.Get("Content-Encoding") != "gzip" {
		b.Fatal("the page is not compressed")
	}
	return float64(n) / 1024
}

// cpuTime is the CPU this process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// fillAccount gives the demo project room for benchServers servers (its
// quotas, a /20 network) and creates them with multi-create, 125 at a
// time, then waits until none is building.
func fillAccount(b *testing.B, c *cloud.Cloud) {
	b.Helper()
	hc := testenv.HTTPClient(b, c)
	admin, demo := testenv.Token(b, c, cloud.AdminUser), testenv.Token(b, c, cloud.DemoUser)
	var project string
	if err := c.DB.QueryRow(context.Background(), "SELECT id FROM projects WHERE name = ?", cloud.DemoProject).Scan(&project); err != nil {
		b.Fatal(err)
	}
	call := func(method, url, tok, body string, want int, out any) {
		resp, got := testenv.Do(b, hc, method, url, tok, body, "OpenStack-API-Version", "compute 2.96")
		testenv.MustStatus(b, resp, got, want)
		if out != nil {
			if err := json.Unmarshal([]byte(got), out); err != nil {
				b.Fatal(err)
			}
		}
	}
	call("PUT", c.ComputeURL+"/os-quota-sets/"+project, admin, `{"quota_set":{"instances":-1,"cores":-1,"ram":-1}}`, 200, nil)
	call("PUT", c.NetworkURL+"/v2.0/quotas/"+project, admin, `{"quota":{"port":-1}}`, 200, nil)
	var net struct{ Network struct{ ID string } }
	call("POST", c.NetworkURL+"/v2.0/networks", demo, `{"network":{"name":"bench"}}`, 201, &net)
	call("POST", c.NetworkURL+"/v2.0/subnets", demo, `{"subnet":{"network_id":"`+net.Network.ID+`","cidr":"10.20.0.0/20","ip_version":4}}`, 201, nil)
	img := srvImage(b, c, "Debian 12")
	flavors := []string{"d1.2g.local", "d2.4g.local", "d1.2g.network", "d2.4g.network"}
	per := 125
	for i := 0; i < benchServers/per; i++ {
		call("POST", c.ComputeURL+"/servers", demo, fmt.Sprintf(`{"server":{"name":"bench-%d","imageRef":%q,"flavorRef":%q,"networks":[{"uuid":%q}],"min_count":%d,"max_count":%d}}`,
			i, img, flavors[i%len(flavors)], net.Network.ID, per, per), 202, nil)
	}
	deadline := time.Now().Add(5 * time.Minute)
	for {
		var list struct{ Servers []struct{ Status string } }
		call("GET", c.ComputeURL+"/servers/detail?limit=1000", demo, "", 200, &list)
		building := 0
		for _, s := range list.Servers {
			if s.Status == "BUILD" {
				building++
			}
			if s.Status == "ERROR" {
				b.Fatal("a benchmark server failed to build")
			}
		}
		if len(list.Servers) == benchServers && building == 0 {
			return
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d servers, %d building after 5 minutes", len(list.Servers), building)
		}
		time.Sleep(time.Second)
	}
}
