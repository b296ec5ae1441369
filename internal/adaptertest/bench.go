package adaptertest

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
)

// Bench times one route in a framework without a limiter (bare), with the
// adapter (adapter), and the core on net/http (nethttp-core), each with one
// default-algorithm rule on the memory backend: "adapter" minus "bare" is
// what a limited route pays, and that minus "nethttp-core" minus ServeMux's
// own cost is the translation's share. app builds the framework's
// application answering GET /items/{id} with 204, behind l's middleware
// when l is not nil.
func Bench(b *testing.B, app func(l *ceiling.Limiter) http.Handler) {
	rules := []ceiling.Rule{{Name: "ip", Key: ceiling.RemoteAddr, Limit: 1_000_000_000, Period: time.Second}}
	b.Run("bare", func(b *testing.B) { serveLoop(b, app(nil)) })
	b.Run("adapter", func(b *testing.B) {
		l := ceiling.MustNew(rules)
		defer l.Close()
		serveLoop(b, app(l))
	})
	b.Run("nethttp-core", func(b *testing.B) {
		l := ceiling.MustNew(rules)
		defer l.Close()
		mux := http.NewServeMux()
		mux.Handle("/items/{id}", l.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusNoContent)
		})))
		serveLoop(b, mux)
	})
}

// sink is a ResponseWriter that keeps only the status, reused across
// iterations so that the numbers are the routing and middleware work only.
type sink struct {
	h    http.Header
	code int
}

func (s *sink) Header() http.Header         { return s.h }
func (s *sink) WriteHeader(code int)        { s.code = code }
func (s *sink) Write(p []byte) (int, error) { return len(p), nil }

func serveLoop(b *testing.B, h http.Handler) {
	b.Helper()
	req := httptest.NewRequest("GET", "/items/42", nil)
	w := &sink{h: make(http.Header)}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		clear(w.h)
		w.code = 0
		h.ServeHTTP(w, req)
		if w.code != http.StatusNoContent {
			b.Fatalf("request %d: status %d: the limit must not be reached in this benchmark", i, w.code)
		}
	}
}
