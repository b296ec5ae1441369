package ceiling_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
)

// benchServe runs h over one reused request and a recorder whose header map
// is cleared each time, so that the numbers are the middleware's own work.
func benchServe(b *testing.B, h http.Handler, addrs []string) {
	b.Helper()
	req := httptest.NewRequest("GET", "/", nil)
	w := httptest.NewRecorder()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		clear(w.HeaderMap)
		w.Code = 200
		w.Body.Reset()
		req.RemoteAddr = addrs[i%len(addrs)]
		h.ServeHTTP(w, req)
		if w.Code != 200 {
			b.Fatalf("request %d: status %d: the limit must not be reached in this benchmark", i, w.Code)
		}
	}
}

var bare = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})

func addrs(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = "10." + strconv.Itoa(i>>16&255) + "." + strconv.Itoa(i>>8&255) + "." + strconv.Itoa(i&255) + ":1234"
	}
	return out
}

// BenchmarkMiddlewareBare is the baseline: the handler alone.
func BenchmarkMiddlewareBare(b *testing.B) {
	benchServe(b, bare, addrs(1))
}

// BenchmarkMiddleware is one rule (the default algorithm) on the memory backend with IETF
// headers, one client; subtract BenchmarkMiddlewareBare for the overhead.
func BenchmarkMiddleware(b *testing.B) {
	l := ceiling.MustNew([]ceiling.Rule{{Name: "ip", Key: ceiling.RemoteAddr, Limit: 1_000_000_000, Period: time.Second}})
	benchServe(b, l.Handler(bare), addrs(1))
}

// BenchmarkMiddlewareThreeRules decides three rules in one backend call.
func BenchmarkMiddlewareThreeRules(b *testing.B) {
	l := ceiling.MustNew([]ceiling.Rule{
		{Name: "ip", Key: ceiling.RemoteAddr, Limit: 1_000_000_000, Period: time.Second},
		{Name: "global", Key: ceiling.Static("all"), Limit: 1_000_000_000, Period: time.Second, Algorithm: ceiling.FixedWindow},
		{Name: "window", Key: ceiling.RemoteAddr, Limit: 1_000_000_000, Period: time.Minute, Algorithm: ceiling.SlidingWindow},
	})
	benchServe(b, l.Handler(bare), addrs(1))
}

// BenchmarkMiddlewareManyClients spreads requests over 100k client addresses.
func BenchmarkMiddlewareManyClients(b *testing.B) {
	l := ceiling.MustNew([]ceiling.Rule{{Name: "ip", Key: ceiling.RemoteAddr, Limit: 1_000_000_000, Period: time.Second}})
	benchServe(b, l.Handler(bare), addrs(100_000))
}

// BenchmarkMiddlewareParallel runs one rule from every core, one client per
// goroutine.
func BenchmarkMiddlewareParallel(b *testing.B) {
	l := ceiling.MustNew([]ceiling.Rule{{Name: "ip", Key: ceiling.RemoteAddr, Limit: 1_000_000_000, Period: time.Second}})
	h := l.Handler(bare)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		req := httptest.NewRequest("GET", "/", nil)
		w := httptest.NewRecorder()
		for pb.Next() {
			clear(w.HeaderMap)
			h.ServeHTTP(w, req)
		}
	})
}
