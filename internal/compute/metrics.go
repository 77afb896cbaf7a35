package compute

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// serversDesc is the gauge of live servers by Nova status.
var serversDesc = prometheus.NewDesc("nimbus_servers", "Servers that are not deleted, by Nova status.",
	[]string{"status"}, nil)

// Collector exports compute state to Prometheus. It reads the store on each
// scrape: one grouped query, so scrapes stay cheap with many servers.
type Collector struct{ s *Service }

// Collector returns the service's Prometheus collector; the caller
// registers it once.
func (s *Service) Collector() *Collector { return &Collector{s} }

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) { ch <- serversDesc }

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rows, err := c.s.db.Query(ctx, `SELECT vm_state, task_state, COUNT(*) FROM compute_servers
 WHERE deleted = 0 GROUP BY vm_state, task_state`)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(serversDesc, err)
		return
	}
	defer rows.Close()
	counts := map[string]float64{}
	for rows.Next() {
		var vm, task string
		var n int
		if err := rows.Scan(&vm, &task, &n); err != nil {
			ch <- prometheus.NewInvalidMetric(serversDesc, err)
			return
		}
		counts[statusOf(vm, task)] += float64(n)
	}
	for status, n := range counts {
		ch <- prometheus.MustNewConstMetric(serversDesc, prometheus.GaugeValue, n, status)
	}
}
