package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"

	metricspb "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	"google.golang.org/protobuf/proto"
)

// A client chooses the Host header of its request, and otelhttp names the
// server in its HTTP metrics from it (server.address, server.port) unless
// told otherwise: every distinct Host a client sends would be a new series
// of http.server.request.duration and the body-size histograms, up to the
// SDK's cardinality limit, after which the service's own series overflow.
// The exported HTTP metrics must carry no value the client chose.
func TestHostHeaderMakesNoSeries_Attack(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]bool{} // server.address and server.port values exported
	points := 0               // HTTP histogram points exported
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.URL.Path == "/v1/metrics" {
			var req metricspb.ExportMetricsServiceRequest
			if err := proto.Unmarshal(b, &req); err == nil {
				mu.Lock()
				for _, rm := range req.GetResourceMetrics() {
					for _, sm := range rm.GetScopeMetrics() {
						for _, m := range sm.GetMetrics() {
							for _, p := range m.GetHistogram().GetDataPoints() {
								if m.GetName() == "http.server.request.duration" {
									points++
								}
								for k, v := range attrMap(p.GetAttributes()) {
									if k == "server.address" || k == "server.port" {
										seen[k+"="+v] = true
									}
								}
							}
						}
					}
				}
				mu.Unlock()
			}
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer srv.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	ctx := context.Background()
	tel, err := newTelemetry(ctx, os.Getenv, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	h := tel.wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	const hosts = 5
	for i := range hosts {
		r := httptest.NewRequest(http.MethodGet, "/api/chat", nil)
		r.Host = fmt.Sprintf("attacker-%d.example:%d", i, 1000+i)
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	if err := tel.shutdown(ctx); err != nil { // flushes the metrics
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if points == 0 {
		t.Fatal("no http.server.request.duration point exported")
	}
	for v := range seen {
		t.Errorf("an exported HTTP metric carries %s, from the client's Host header", v)
	}
}
