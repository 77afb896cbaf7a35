package panel_test

import (
	"net/http"
	"strings"
	"testing"
)

// BenchmarkConfiguratorPage renders GET /configure over HTTPS, signed in
// (options, price list, quote, live capacity, quota, account and keys, all
// through the APIs): ns/op, and the p95 and p50 of 200 requests in ms.
func BenchmarkConfiguratorPage(b *testing.B) {
	c := startCloud(b, bigFleet)
	w := newWeb(b, c)
	w.login(demoLogin(c))
	benchPage(b, w, c.PanelURL+"/configure?vcpus=4&ram_gb=8&disk_gb=80&ipv4=yes", func(status int, body string) bool {
		return status == http.StatusOK && strings.Contains(body, `id="p-hourly" class="price">`)
	})
	b.ReportMetric(gzKB(b, w, c.PanelURL+"/configure"), "gz-KB")
}
