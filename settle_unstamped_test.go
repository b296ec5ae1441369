package ceiling

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/memory"
)

// unstamped is a backend over a memory store that returns no stamps, as a
// third-party backend without them does, and records the refunds it gets.
type unstamped struct {
	m       *memory.Store
	mu      sync.Mutex
	refunds int
}

func (u *unstamped) Decide(ctx context.Context, reqs []backend.Request) ([]backend.Result, error) {
	u.mu.Lock()
	for _, q := range reqs {
		if q.Cost < 0 {
			u.refunds++
		}
	}
	u.mu.Unlock()
	res, err := u.m.Decide(ctx, reqs)
	for i := range res {
		res[i].Stamp = 0
	}
	return res, err
}

func (u *unstamped) Reset(ctx context.Context, keys ...string) error { return u.m.Reset(ctx, keys...) }

// A settlement under a reservation whose admission came back without a
// stamp refunds nothing: it fell back to a refund of the newest units,
// which may be another request's. The reservation stands at its estimate.
func TestSettleWithoutStampRefundsNothing_Regression(t *testing.T) {
	be := &unstamped{m: memory.New()}
	defer be.m.Close()
	l := MustNew([]Rule{{Name: "tokens", Key: headerKey("X-Shop"), Limit: 10, Period: time.Minute,
		Estimate: func(*http.Request) (int64, error) { return 5, nil }}}, WithBackend(be))
	defer l.Close()
	h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := Settle(r, "tokens", 0); err != nil {
			t.Errorf("Settle: %v", err)
		}
	}))
	r := httptest.NewRequest("POST", "/", nil)
	r.Header.Set("X-Shop", "acme")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusOK {
		t.Fatalf("status %d", w.Code)
	}
	res, err := l.Peek(t.Context(), "tokens", "acme")
	if err != nil {
		t.Fatal(err)
	}
	if be.refunds != 0 || res.Remaining != 5 {
		t.Errorf("settled 0 of 5 without a stamp: %d refunds sent, %d remaining; want none sent and 5 (the estimate stands)", be.refunds, res.Remaining)
	}
}

// A rejection for a cost the limit can never hold advertises no state in
// the headers: no backend read the key, and it advertised "tokens";r=0;t=0
// for a budget of 10,000 that may be untouched. The body still names the
// rule.
func TestUnfitRejectionAdvertisesNoState_Regression(t *testing.T) {
	l := MustNew([]Rule{{Name: "tokens", Key: headerKey("X-K"), Limit: 10_000, Period: time.Minute,
		Estimate: func(r *http.Request) (int64, error) { return strconv.ParseInt(r.Header.Get("X-E"), 10, 64) }}})
	defer l.Close()
	h := l.Handler(okHandler)
	for _, e := range []string{"10001", "9223372036854775807"} {
		r := httptest.NewRequest("POST", "/", nil)
		r.Header.Set("X-K", "k")
		r.Header.Set("X-E", e)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusTooManyRequests {
			t.Fatalf("estimate %s: status %d, want 429", e, w.Code)
		}
		if got := w.Header().Get("RateLimit"); got != "" {
			t.Errorf("estimate %s: RateLimit %q, want none (the key was never read)", e, got)
		}
		if !strings.Contains(w.Body.String(), `"violated-policies":["tokens"]`) {
			t.Errorf("estimate %s: body %s does not name the rule", e, w.Body.String())
		}
	}
}
