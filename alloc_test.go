//go:build !race

package ceiling_test

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
)

// The allocation budget of the hot path is part of the product (issue 16):
// on the memory backend a decision allocates only what its answer needs.
// (Skipped under -race, which allocates.)

// allocs is how many times f allocates per call, on average.
func allocs(f func()) float64 { return testing.AllocsPerRun(1000, f) }

// A request allocates nothing of its own, however many rules apply: the
// stored keys are built in the pooled state, RateLimit-Policy is computed
// once, the key function reads RemoteAddr in place, and the RateLimit value
// is carved with its one-line slice from blocks shared by many responses
// (one allocation per dozens of requests, which AllocsPerRun's whole
// count rounds away).
func TestMiddlewareAllocationBudget(t *testing.T) {
	oneRule := []ceiling.Rule{{Name: "ip", Key: ceiling.RemoteAddr, Limit: 1_000_000_000, Period: time.Second}}
	threeRules := []ceiling.Rule{
		{Name: "ip", Key: ceiling.RemoteAddr, Limit: 1_000_000_000, Period: time.Second},
		{Name: "global", Key: ceiling.Static("all"), Limit: 1_000_000_000, Period: time.Second, Algorithm: ceiling.FixedWindow},
		{Name: "token", Key: ceiling.Header("X-Api-Key"), Limit: 1_000_000_000, Period: time.Minute, Algorithm: ceiling.GCRA},
	}
	for _, tc := range []struct {
		name  string
		rules []ceiling.Rule
		opts  []ceiling.Option
		want  float64
	}{
		{"one rule, IETF headers", oneRule, nil, 0},
		{"three rules, IETF headers", threeRules, nil, 0},
		{"three rules, RateLimit-*", threeRules, []ceiling.Option{ceiling.WithHeaders(ceiling.HeadersRateLimit)}, 0},
		{"three rules, X-RateLimit-*", threeRules, []ceiling.Option{ceiling.WithHeaders(ceiling.HeadersXRateLimit)}, 0},
		{"one rule, no headers", oneRule, []ceiling.Option{ceiling.WithHeaders(ceiling.HeadersNone)}, 0},
		{"three rules, no headers", threeRules, []ceiling.Option{ceiling.WithHeaders(ceiling.HeadersNone)}, 0},
	} {
		l := ceiling.MustNew(tc.rules, tc.opts...)
		defer l.Close()
		h := l.Handler(bare)
		req := httptest.NewRequest("GET", "/", nil)
		req.RemoteAddr = "203.0.113.9:4711"
		req.Header.Set("X-Api-Key", "k-123")
		w := httptest.NewRecorder()
		got := allocs(func() {
			clear(w.HeaderMap)
			h.ServeHTTP(w, req)
		})
		if w.Code != 200 {
			t.Fatalf("%s: status %d", tc.name, w.Code)
		}
		if got > tc.want {
			t.Errorf("%s: the middleware allocates %.1f times per request, want at most %v", tc.name, got, tc.want)
		}
	}
}

func TestRemoteAddrIPv4DoesNotAllocate(t *testing.T) {
	req := httptest.NewRequest("GET", "/", nil)
	req.RemoteAddr = "203.0.113.9:4711"
	var key string
	got := allocs(func() { key, _ = ceiling.RemoteAddr(req) })
	if key != "203.0.113.9" || got != 0 {
		t.Errorf("RemoteAddr = %q with %.1f allocations, want 203.0.113.9 with none", key, got)
	}
}

// Header reads the value in place; its error text is built once, not per
// request.
func TestHeaderKeyDoesNotAllocate(t *testing.T) {
	fn := ceiling.Header("x-api-key")
	req := httptest.NewRequest("GET", "/", nil)
	req.Header.Set("X-Api-Key", "k-123")
	var key string
	got := allocs(func() { key, _ = fn(req) })
	if key != "k-123" || got != 0 {
		t.Errorf("Header = %q with %.1f allocations, want k-123 with none", key, got)
	}
}
