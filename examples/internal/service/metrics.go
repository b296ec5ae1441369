package service

import (
	"net/http"

	ceilingprom "github.com/ceiling-go/ceiling/metrics/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics returns the observer to pass to ceiling.WithObserver and the
// GET /metrics handler that exposes it, with the Go runtime and process
// metrics, on a registry of its own (so that tests can run several services
// in one process). Alert on ceiling_rate_limiting_degraded == 1 and on any increase of
// ceiling_rate_limiting_fail_mode_admissions_total.
func Metrics() (*ceilingprom.Observer, http.Handler) {
	reg := prometheus.NewRegistry()
	obs := ceilingprom.New(ceilingprom.Options{})
	reg.MustRegister(obs, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return obs, promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})
}
