//go:build !race

package ceiling_test

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling"
)

// The allocation budget of the hot path is part of the product: a decision
// on the memory backend with IETF headers builds the stored key and the
// RateLimit value, nothing else. (Skipped under -race, which allocates.)
func TestMiddlewareAllocationBudget(t *testing.T) {
	l := ceiling.MustNew([]ceiling.Rule{{Name: "ip", Key: ceiling.RemoteAddr, Limit: 1_000_000_000, Period: time.Second}})
	h := l.Handler(bare)
	req := httptest.NewRequest("GET", "/", nil)
	w := httptest.NewRecorder()
	allocs := testing.AllocsPerRun(1000, func() {
		clear(w.HeaderMap)
		h.ServeHTTP(w, req)
	})
	if allocs > 3 {
		t.Errorf("middleware allocates %.1f times per request, want at most 3", allocs)
	}
}

func TestRemoteAddrIPv4DoesNotAllocate(t *testing.T) {
	req := httptest.NewRequest("GET", "/", nil)
	req.RemoteAddr = "203.0.113.9:4711"
	var key string
	allocs := testing.AllocsPerRun(1000, func() { key, _ = ceiling.RemoteAddr(req) })
	if key != "203.0.113.9" || allocs != 0 {
		t.Errorf("RemoteAddr = %q with %.1f allocations, want 203.0.113.9 with none", key, allocs)
	}
}
