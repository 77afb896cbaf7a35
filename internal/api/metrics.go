package api

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

var (
	requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "nimbus", Name: "http_requests_total",
		Help: "HTTP requests served, by service, method and status code.",
	}, []string{"service", "method", "code"})
	latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: "nimbus", Name: "http_request_duration_seconds",
		Help:    "Time to serve an HTTP request, by service and method.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
	}, []string{"service", "method"})
)

func init() { prometheus.MustRegister(requests, latency) }

func observe(service string, r *http.Request, status int, d time.Duration) {
	if status == 0 {
		status = http.StatusOK
	}
	requests.WithLabelValues(service, r.Method, strconv.Itoa(status)).Inc()
	latency.WithLabelValues(service, r.Method).Observe(d.Seconds())
}
