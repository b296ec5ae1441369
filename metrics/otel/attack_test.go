package ceilingotel_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
	"github.com/ceiling-go/ceiling/backend/memory"
	ceilingotel "github.com/ceiling-go/ceiling/metrics/otel"
	"go.opentelemetry.io/otel"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// A decision made with Limiter.Decide, without the middleware, is recorded
// on the caller's span like the middleware's, a cost that can never fit
// included (a rejection with no Retry-After), and counted once.
func TestDecideWithoutMiddlewareIsRecorded_Attack(t *testing.T) {
	obs, collect := sdkObserver(t)
	l := ceiling.MustNew([]ceiling.Rule{{Name: "tokens", Limit: 10, Period: time.Minute}},
		ceiling.WithBackend(memory.New()), ceiling.WithObserver(obs), quiet)
	t.Cleanup(func() { l.Close() })
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	var retry string // the rejection's RetryAfter, in whole seconds rounded up
	for _, cost := range []int64{10, 1, 1 << 40} {
		ctx, span := tp.Tracer("test").Start(context.Background(), "job")
		d, err := l.Decide(ctx, ceiling.Input{Rule: "tokens", Key: "acct-1", Cost: cost})
		if err != nil {
			t.Fatal(err)
		}
		if cost == 1 {
			retry = strconv.FormatInt(int64((d.RetryAfter+time.Second-1)/time.Second), 10)
		}
		span.End()
	}
	spans := rec.Ended()
	if len(spans) != 3 {
		t.Fatalf("%d spans, want 3", len(spans))
	}
	want := [][]string{
		{"ceiling.rate_limiting.result=allowed", "ceiling.rate_limiting.rule=tokens"},
		{"ceiling.rate_limiting.result=rejected", "ceiling.rate_limiting.retry_after=" + retry, "ceiling.rate_limiting.rule=tokens"},
		{"ceiling.rate_limiting.result=rejected", "ceiling.rate_limiting.rule=tokens"},
	}
	for i, s := range spans {
		if got := attrs(s); !slices.Equal(got, want[i]) {
			t.Errorf("decision %d: span %v, want %v", i, got, want[i])
		}
	}
	expect(t, collect(), map[string]float64{
		result("tokens", "allowed"):  1,
		result("tokens", "rejected"): 2,
	})
}

// A handler that panics still has its decision on the span, and the
// Concurrency slot it held is given back: the slots gauge returns to 0.
// A request whose client went away before the decision is decided and
// counted like any other (the backend call does not inherit the
// cancellation, so it is no backend failure).
func TestPanicAndCancelKeepSpansAndGauges_Attack(t *testing.T) {
	obs, collect := sdkObserver(t)
	l := ceiling.MustNew([]ceiling.Rule{{Name: "conc", Key: ceiling.RemoteAddr, Algorithm: ceiling.Concurrency, Limit: 2, Period: time.Minute}},
		ceiling.WithBackend(memory.New()), ceiling.WithObserver(obs), quiet)
	t.Cleanup(func() { l.Close() })
	h, rec := traced(t, l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Has("panic") {
			panic("handler bug")
		}
	})))
	for range 3 {
		func() {
			defer func() { _ = recover() }()
			h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/?panic", nil))
		}()
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequestWithContext(ctx, "GET", "/", nil))
	if w.Code != 200 {
		t.Errorf("cancelled request: status %d, want 200", w.Code)
	}
	for i, s := range rec.Ended() {
		if got := attrs(s); !slices.Contains(got, "ceiling.rate_limiting.result=allowed") {
			t.Errorf("span %d: %v, want result=allowed", i, got)
		}
	}
	got := collect()
	expect(t, got, map[string]float64{
		result("conc", "allowed"): 4,
		"ceiling.rate_limiting.concurrency.slots_in_use{ceiling.rate_limiting.rule=conc}": 0,
	})
}

// One observer shared by two limiters: while one of them is still
// degraded, the other's recovery must not clear the degraded gauge, or
// CeilingDegraded stops firing while fail modes still decide.
func TestSharedDegradedGaugeHoldsWhileOneLimiterIsDegraded_Attack(t *testing.T) {
	obs, collect := sdkObserver(t)
	gauge := "ceiling.rate_limiting.degraded{}"
	obs.ObserveDegraded(ceiling.DegradedEvent{Degraded: true}) // limiter A
	obs.ObserveDegraded(ceiling.DegradedEvent{Degraded: true}) // limiter B
	obs.ObserveDegraded(ceiling.DegradedEvent{})               // B recovers; A is still degraded
	expect(t, collect(), map[string]float64{gauge: 1, "ceiling.rate_limiting.degraded.transitions{}": 2})
	obs.ObserveDegraded(ceiling.DegradedEvent{}) // A recovers
	expect(t, collect(), map[string]float64{gauge: 0})
}

// An observer built on the global meter provider before the program
// installs its SDK (an init, a package variable): it costs nothing and
// panics at nothing while no SDK is installed, and once one is, what
// follows is exported, the series that start at zero and the gauges
// included.
func TestObserverBeforeTheSDKIsInstalled_Attack(t *testing.T) {
	obs, err := ceilingotel.New(ceilingotel.Options{})
	if err != nil {
		t.Fatal(err)
	}
	l := ceiling.MustNew([]ceiling.Rule{{Name: "r", Key: ceiling.RemoteAddr, Limit: 1, Period: time.Minute}},
		ceiling.WithBackend(memory.New()), ceiling.WithObserver(obs), quiet)
	t.Cleanup(func() { l.Close() })
	h := l.Handler(ok)
	if got := code(h); got != 200 {
		t.Fatalf("status %d, want 200", got)
	}
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { mp.Shutdown(context.Background()) })
	prev := otel.GetMeterProvider()
	otel.SetMeterProvider(mp)
	t.Cleanup(func() { otel.SetMeterProvider(prev) })
	if got := code(h); got != 429 {
		t.Fatalf("status %d, want 429", got)
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			names[m.Name] = true
		}
	}
	for _, n := range []string{"ceiling.rate_limiting.requests", "ceiling.rate_limiting.degraded", "ceiling.rate_limiting.backend.errors", "ceiling.rate_limiting.fail_mode.admissions"} {
		if !names[n] {
			t.Errorf("%s not exported after the SDK was installed (exported: %v)", n, names)
		}
	}
}
