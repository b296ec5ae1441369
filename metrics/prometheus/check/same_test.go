package check_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
	"github.com/ceiling-go/ceiling/backend"
	ceilingotel "github.com/ceiling-go/ceiling/metrics/otel"
	ceilingprom "github.com/ceiling-go/ceiling/metrics/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// observeEverything tells obs one of every event the observers count:
// every decision outcome, a request refused failing closed and one shed,
// answered and failed backend calls of every kind, a deny-cache answer,
// a degradation and its recovery, fail-mode admissions, and a limiter's
// health with evictions and slots in use.
func observeEverything(obs ceiling.Observer) {
	obs.ObserveConfig([]string{"chat", "day"}, 100*time.Millisecond, func() ceiling.Health {
		return ceiling.Health{EvictedKeys: 4, Rules: []ceiling.RuleHealth{{Name: "chat", SlotsInUse: 2}, {Name: "day"}}}
	})
	for _, o := range []ceiling.Outcome{ceiling.OutcomeAllowed, ceiling.OutcomeRejected, ceiling.OutcomeShadowRejected, ceiling.OutcomeNotCharged} {
		obs.ObserveDecision("chat", o)
	}
	obs.ObserveDecision("day", ceiling.OutcomeAllowed)
	ctx := context.Background()
	obs.ObserveRequest(ctx, &ceiling.Decision{}, &ceiling.UnavailableError{Rule: "day", Err: ceiling.ErrDegraded, RetryAfter: time.Second})
	obs.ObserveRequest(ctx, &ceiling.Decision{}, &ceiling.UnavailableError{Rule: "chat", Err: fmt.Errorf("busy: %w", backend.ErrNotSent), RetryAfter: time.Second, Shed: true})
	obs.ObserveRequest(ctx, &ceiling.Decision{}, nil)
	obs.ObserveBackend(300*time.Microsecond, nil)
	obs.ObserveBackend(90*time.Millisecond, ceiling.ErrTimeout)
	obs.ObserveBackend(time.Millisecond, fmt.Errorf("dial: %w", backend.ErrUnreachable))
	obs.ObserveBackend(time.Millisecond, errors.New("ERR unknown"))
	obs.ObserveCached()
	obs.ObserveDegraded(ceiling.DegradedEvent{Degraded: true})
	obs.ObserveFailMode("chat", ceiling.FailOpen)
	obs.ObserveFailMode("day", ceiling.FailLocal)
	obs.ObserveDegraded(ceiling.DegradedEvent{})
}

// series is every sample a gatherer exposes, "name{labels} value", with
// the labels the OpenTelemetry exporter adds to each series (its scope)
// left out, and the type and help of each family.
func series(t *testing.T, g prometheus.Gatherer) []string {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		if mf.GetName() == "target_info" {
			continue
		}
		out = append(out, fmt.Sprintf("# %s %s %s", mf.GetName(), mf.GetType(), mf.GetHelp()))
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				if !strings.HasPrefix(lp.GetName(), "otel_scope_") {
					labels[lp.GetName()] = lp.GetValue()
				}
			}
			id := func(suffix string, extra ...string) string {
				var kv []string
				for _, k := range slices.Sorted(maps.Keys(labels)) {
					kv = append(kv, k+"="+labels[k])
				}
				return mf.GetName() + suffix + "{" + strings.Join(append(kv, extra...), ",") + "}"
			}
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				out = append(out, fmt.Sprint(id(""), " ", m.GetCounter().GetValue()))
			case dto.MetricType_GAUGE:
				out = append(out, fmt.Sprint(id(""), " ", m.GetGauge().GetValue()))
			case dto.MetricType_HISTOGRAM:
				h := m.GetHistogram()
				out = append(out, fmt.Sprint(id("_count"), " ", h.GetSampleCount()), fmt.Sprint(id("_sum"), " ", h.GetSampleSum()))
				for _, b := range h.GetBucket() {
					out = append(out, fmt.Sprint(id("_bucket", fmt.Sprint("le=", b.GetUpperBound())), " ", b.GetCumulativeCount()))
				}
			default:
				t.Errorf("%s: unexpected type %s", mf.GetName(), mf.GetType())
			}
		}
	}
	slices.Sort(out)
	return out
}

// Told the same events, ceilingprom and ceilingotel through the
// OpenTelemetry Prometheus exporter (its defaults) expose the same
// families, with the same types and help, and the same series, labels and
// values but the exporter's scope labels: the names ceilingprom uses are
// exactly the exporter's translation of ceilingotel's instruments.
func TestBothExportersExposeTheSameSeries(t *testing.T) {
	labels := prometheus.Labels{"limiter": "api"}
	prom := ceilingprom.New(ceilingprom.Options{ConstLabels: labels})
	promReg := prometheus.NewPedanticRegistry()
	promReg.MustRegister(prom)
	observeEverything(prom)

	otelReg := prometheus.NewPedanticRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(otelReg))
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	t.Cleanup(func() { mp.Shutdown(context.Background()) })
	otel, err := ceilingotel.New(ceilingotel.Options{MeterProvider: mp, Attributes: []attribute.KeyValue{attribute.String("limiter", "api")}})
	if err != nil {
		t.Fatal(err)
	}
	observeEverything(otel)

	want, got := series(t, promReg), series(t, otelReg)
	for _, s := range want {
		if !slices.Contains(got, s) {
			t.Errorf("ceilingprom exposes %s, the OpenTelemetry export does not", s)
		}
	}
	for _, s := range got {
		if !slices.Contains(want, s) {
			t.Errorf("the OpenTelemetry export exposes %s, ceilingprom does not", s)
		}
	}
	for _, s := range []string{
		"ceiling_rate_limiting_requests_total{ceiling_rate_limiting_result=fail_closed,ceiling_rate_limiting_rule=day,limiter=api} 1",
		"ceiling_rate_limiting_requests_total{ceiling_rate_limiting_result=shed,ceiling_rate_limiting_rule=chat,limiter=api} 1",
	} {
		if !slices.Contains(want, s) {
			t.Errorf("no %s", s)
		}
	}
}
