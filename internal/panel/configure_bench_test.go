package panel_test

import (
	"io"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"
)

// BenchmarkConfiguratorPage renders GET /configure over HTTPS, signed in
// (options, price list, quote, live capacity, quota, account and keys, all
// through the APIs): ns/op, and the p95 and p50 of 200 requests in ms.
func BenchmarkConfiguratorPage(b *testing.B) {
	c := startCloud(b, bigFleet)
	w := newWeb(b, c)
	w.login(demoLogin(c))
	page := func() time.Duration {
		start := time.Now()
		resp, err := w.hc.Get(c.PanelURL + "/configure?vcpus=4&ram_gb=8&disk_gb=80&ipv4=yes")
		if err != nil {
			b.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `id="p-hourly" class="price">`) {
			b.Fatalf("GET /configure: %d", resp.StatusCode)
		}
		return time.Since(start)
	}
	page() // warm the connections and the scheduler's snapshot
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
	b.ReportMetric(gzKB(b, w, c.PanelURL+"/configure"), "gz-KB")
}
