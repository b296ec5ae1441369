package ceilingprom_test

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/ceiling-go/ceiling"
	ceilingprom "github.com/ceiling-go/ceiling/metrics/prometheus"
	"github.com/prometheus/client_golang/prometheus"
)

func ExampleNew() {
	reg := prometheus.NewRegistry()
	obs := ceilingprom.New(ceilingprom.Options{ConstLabels: prometheus.Labels{"limiter": "api"}})
	reg.MustRegister(obs) // serve reg with promhttp.HandlerFor

	l := ceiling.MustNew([]ceiling.Rule{{Name: "ip", Key: ceiling.RemoteAddr, Limit: 1, Period: time.Minute}},
		ceiling.WithObserver(obs), ceiling.WithLogger(slog.New(slog.DiscardHandler)))
	defer l.Close()
	get(l.Handler(ok))
	get(l.Handler(ok))

	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != "ceiling_rate_limiting_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			fmt.Print(mf.GetName())
			for _, lp := range m.GetLabel() {
				fmt.Printf(" %s=%s", lp.GetName(), lp.GetValue())
			}
			fmt.Println(" ", m.GetCounter().GetValue())
		}
	}
	// Output:
	// ceiling_rate_limiting_requests_total ceiling_rate_limiting_result=allowed ceiling_rate_limiting_rule=ip limiter=api  1
	// ceiling_rate_limiting_requests_total ceiling_rate_limiting_result=rejected ceiling_rate_limiting_rule=ip limiter=api  1
}
