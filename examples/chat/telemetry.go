package main

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"slices"

	"github.com/ceiling-go/ceiling"
	ceilingotel "github.com/ceiling-go/ceiling/metrics/otel"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// hostless drops from otelhttp's metrics the attributes it reads from the
// request's Host header, server.address and server.port: a client chooses
// that header, and each value it sent would be a new series, until the
// SDK's cardinality limit overflowed the service's own.
var hostless = sdkmetric.NewView(
	sdkmetric.Instrument{Scope: instrumentation.Scope{Name: otelhttp.ScopeName}},
	sdkmetric.Stream{AttributeFilter: attribute.NewDenyKeysFilter("server.address", "server.port")})

// telemetry is the service's OpenTelemetry export: each request's span,
// with the limiter's decision on it, and the limiter's metrics, sent over
// OTLP. The zero value exports nothing.
type telemetry struct {
	// observer is the limiter's OpenTelemetry observer, beside the
	// Prometheus one that serves /metrics; nil when nothing is exported.
	observer ceiling.Observer
	// wrap starts each public request's span (otelhttp).
	wrap func(http.Handler) http.Handler
	// shutdown flushes what is buffered and stops the exporters.
	shutdown func(context.Context) error
}

// otlpEndpoint is the standard variable that turns the export on. The
// exporters read it and the other OTEL_* variables themselves
// (OTEL_EXPORTER_OTLP_HEADERS, OTEL_SERVICE_NAME, OTEL_METRIC_EXPORT_INTERVAL,
// ...), as every OpenTelemetry SDK does.
const otlpEndpoint = "OTEL_EXPORTER_OTLP_ENDPOINT"

// newTelemetry exports OTLP over HTTP when OTEL_EXPORTER_OTLP_ENDPOINT is
// set, and otherwise exports nothing and says so once.
func newTelemetry(ctx context.Context, getenv func(string) string, logger *slog.Logger) (telemetry, error) {
	if getenv(otlpEndpoint) == "" {
		logger.Info("chat: " + otlpEndpoint + " is not set: no OpenTelemetry traces or metrics are exported (GET /metrics still serves Prometheus)")
		return telemetry{}, nil
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", "chat")),
		resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil {
		return telemetry{}, err
	}
	spans, err := otlptracehttp.New(ctx)
	if err != nil {
		return telemetry{}, err
	}
	metrics, err := otlpmetrichttp.New(ctx)
	if err != nil {
		return telemetry{}, errors.Join(err, spans.Shutdown(ctx))
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(withoutAddresses{spans}), sdktrace.WithResource(res))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewPeriodicReader(metrics)), sdkmetric.WithResource(res),
		sdkmetric.WithView(hostless))
	shutdown := func(ctx context.Context) error { return errors.Join(tp.Shutdown(ctx), mp.Shutdown(ctx)) }
	obs, err := ceilingotel.New(ceilingotel.Options{MeterProvider: mp})
	if err != nil {
		return telemetry{}, errors.Join(err, shutdown(ctx))
	}
	logger.Info("chat: exporting OpenTelemetry traces and metrics over OTLP")
	return telemetry{
		observer: obs,
		wrap: func(h http.Handler) http.Handler {
			return otelhttp.NewHandler(h, "chat", otelhttp.WithTracerProvider(tp), otelhttp.WithMeterProvider(mp))
		},
		shutdown: shutdown,
	}, nil
}

// addressKeys are the span attributes otelhttp sets from the client's
// address: the chat:ip rule's key value, and in client.address whatever
// X-Forwarded-For a client sent, trusted or not.
var addressKeys = []attribute.Key{"client.address", "network.peer.address", "network.peer.port"}

// withoutAddresses exports spans without the client's address: the
// collector, often a vendor's, gets no key value.
type withoutAddresses struct{ sdktrace.SpanExporter }

func (e withoutAddresses) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	out := make([]sdktrace.ReadOnlySpan, len(spans))
	for i, s := range spans {
		out[i] = scrubbed{s}
	}
	return e.SpanExporter.ExportSpans(ctx, out)
}

// scrubbed is a span without its address attributes.
type scrubbed struct{ sdktrace.ReadOnlySpan }

func (s scrubbed) Attributes() []attribute.KeyValue {
	attrs := s.ReadOnlySpan.Attributes()
	kept := make([]attribute.KeyValue, 0, len(attrs))
	for _, kv := range attrs {
		if !slices.Contains(addressKeys, kv.Key) {
			kept = append(kept, kv)
		}
	}
	return kept
}
