package ceilingotel_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
	ceilingotel "github.com/ceiling-go/ceiling/metrics/otel"
	"go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

type discard struct{ h http.Header }

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) Write(p []byte) (int, error) { return len(p), nil }
func (d *discard) WriteHeader(int)             {}

// BenchmarkMiddlewareObserved is one rule on the memory store through the
// middleware, without and with the OpenTelemetry observer: on the SDK's
// metrics with no span in the request's context (what the metrics cost),
// on no-op metrics (what the span path costs when nothing records: the
// issue bounds it at 2% of a memory decision), and on a sampled span.
func BenchmarkMiddlewareObserved(b *testing.B) {
	rules := []ceiling.Rule{{Name: "ip", Key: ceiling.RemoteAddr, Limit: 1_000_000_000, Period: time.Second}}
	observer := func(b *testing.B, o ceilingotel.Options) ceiling.Option {
		obs, err := ceilingotel.New(o)
		if err != nil {
			b.Fatal(err)
		}
		return ceiling.WithObserver(obs)
	}
	sdk := func() *sdkmetric.MeterProvider {
		return sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	}
	for _, tc := range []struct {
		name    string
		opts    func(b *testing.B) []ceiling.Option
		sampled bool
	}{
		{"observer=none", func(*testing.B) []ceiling.Option { return nil }, false},
		{"observer=otel/metrics=noop/span=none", func(b *testing.B) []ceiling.Option {
			return []ceiling.Option{observer(b, ceilingotel.Options{MeterProvider: noop.NewMeterProvider()})}
		}, false},
		{"observer=otel/metrics=sdk/span=none", func(b *testing.B) []ceiling.Option {
			return []ceiling.Option{observer(b, ceilingotel.Options{MeterProvider: sdk()})}
		}, false},
		{"observer=otel/metrics=sdk/span=sampled", func(b *testing.B) []ceiling.Option {
			return []ceiling.Option{observer(b, ceilingotel.Options{MeterProvider: sdk()})}
		}, true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			l := ceiling.MustNew(rules, append(tc.opts(b), quiet)...)
			defer l.Close()
			h := l.Handler(ok)
			r := httptest.NewRequest("GET", "/", nil)
			w := &discard{h: http.Header{}}
			var tp *sdktrace.TracerProvider
			if tc.sampled {
				tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(tracetest.NewSpanRecorder()))
				defer tp.Shutdown(context.Background())
			}
			b.ReportAllocs()
			for b.Loop() {
				clear(w.h)
				if tp == nil {
					h.ServeHTTP(w, r)
					continue
				}
				// The span is the request's, started and ended around it
				// as otelhttp would; only its attributes are ceiling's.
				ctx, span := tp.Tracer("bench").Start(context.Background(), "request")
				h.ServeHTTP(w, r.WithContext(ctx))
				span.End()
			}
		})
	}
}

// BenchmarkObserveRequest is the span path alone, for a decision whose
// context has no recording span: a lookup in the context, nothing more.
func BenchmarkObserveRequest(b *testing.B) {
	obs, err := ceilingotel.New(ceilingotel.Options{MeterProvider: noop.NewMeterProvider()})
	if err != nil {
		b.Fatal(err)
	}
	l := ceiling.MustNew([]ceiling.Rule{{Name: "r", Key: ceiling.Static("s"), Limit: 1, Period: time.Minute}}, quiet)
	defer l.Close()
	d, err := l.Decide(context.Background(), ceiling.Input{Rule: "r", Key: "k"})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		obs.ObserveRequest(ctx, &d, nil)
	}
}
