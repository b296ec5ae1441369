package ceilingprom_test

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
	ceilingprom "github.com/ceiling-go/ceiling/metrics/prometheus"
)

type discard struct{ h http.Header }

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) Write(p []byte) (int, error) { return len(p), nil }
func (d *discard) WriteHeader(int)             {}

// BenchmarkMiddlewareObserved is one rule on the memory store without and
// with the Prometheus observer: what the metrics cost per request.
func BenchmarkMiddlewareObserved(b *testing.B) {
	rules := []ceiling.Rule{{Name: "ip", Key: ceiling.RemoteAddr, Limit: 1_000_000_000, Period: time.Second}}
	for _, tc := range []struct {
		name string
		opts []ceiling.Option
	}{
		{"observer=none", nil},
		{"observer=prometheus", []ceiling.Option{ceiling.WithObserver(ceilingprom.New(ceilingprom.Options{}))}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			l := ceiling.MustNew(rules, append(tc.opts, ceiling.WithLogger(slog.New(slog.DiscardHandler)))...)
			defer l.Close()
			h := l.Handler(ok)
			r := httptest.NewRequest("GET", "/", nil)
			w := &discard{h: http.Header{}}
			b.ReportAllocs()
			for b.Loop() {
				clear(w.h)
				h.ServeHTTP(w, r)
			}
		})
	}
}
