package ceiling

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend/memory"
)

// BenchmarkExtras measures what prefetches and reservations add to an
// admitted request on the memory store: "none" is the plain middleware,
// the baseline the others pay their request-context copy on top of.
func BenchmarkExtras(b *testing.B) {
	rule := Rule{Name: "ip", Key: RemoteAddr, Limit: 1_000_000_000, Period: time.Second}
	tokens := Rule{Name: "tokens", Key: RemoteAddr, Limit: 1_000_000_000, Period: time.Hour,
		Estimate: func(*http.Request) (int64, error) { return 100, nil }}
	order := Prefetch("order", func(context.Context, *http.Request) (int, error) { return 42, nil })
	for _, bc := range []struct {
		name  string
		rules []Rule
		opts  []Option
		h     http.HandlerFunc
	}{
		{"none", []Rule{rule}, nil, func(http.ResponseWriter, *http.Request) {}},
		{"prefetch=1", []Rule{rule}, []Option{WithPrefetch(order)}, func(w http.ResponseWriter, r *http.Request) { order.Get(r) }},
		{"estimate/unsettled", []Rule{rule, tokens}, nil, func(http.ResponseWriter, *http.Request) {}},
		{"estimate/settled", []Rule{rule, tokens}, nil, func(w http.ResponseWriter, r *http.Request) { Settle(r, "tokens", 150) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			store := memory.New(memory.WithSweepInterval(0))
			h := MustNew(bc.rules, append(bc.opts, WithBackend(store))...).Handler(bc.h)
			req := httptest.NewRequest("GET", "/", nil)
			w := httptest.NewRecorder()
			b.ReportAllocs()
			for b.Loop() {
				clear(w.HeaderMap)
				h.ServeHTTP(w, req)
			}
		})
	}
}
