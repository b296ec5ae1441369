package ceilingecho_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
	ceilingecho "github.com/ceiling-go/ceiling/adapters/echo"
	"github.com/labstack/echo/v4"
)

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

// BenchmarkEcho compares an Echo route without a limiter, with the adapter,
// and the core on net/http (one default-algorithm rule on the memory backend each):
// "adapter" minus "bare" is what a limited Echo route pays, and that minus
// "nethttp-core" minus ServeMux's own cost is the translation's share.
func BenchmarkEcho(b *testing.B) {
	rules := []ceiling.Rule{{Name: "ip", Key: ceiling.RemoteAddr, Limit: 1_000_000_000, Period: time.Second}}
	noContent := func(c echo.Context) error { return c.NoContent(http.StatusNoContent) }
	b.Run("bare", func(b *testing.B) {
		e := echo.New()
		e.GET("/items/:id", noContent)
		serveLoop(b, e)
	})
	b.Run("adapter", func(b *testing.B) {
		e := echo.New()
		e.Use(ceilingecho.Middleware(ceiling.MustNew(rules)))
		e.GET("/items/:id", noContent)
		serveLoop(b, e)
	})
	b.Run("nethttp-core", func(b *testing.B) {
		mux := http.NewServeMux()
		mux.Handle("/items/{id}", ceiling.MustNew(rules).Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusNoContent)
		})))
		serveLoop(b, mux)
	})
}
