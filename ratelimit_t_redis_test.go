package ceiling

import (
	"log/slog"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/backendtest"
	ceilingredis "github.com/ceiling-go/ceiling/backend/redis"
	"github.com/ceiling-go/ceiling/internal/redistest"
)

// TestRateLimitTIsDraft11OnRedis runs issue 19's table through a limiter
// on a real Redis (the Store under a fake clock, as the memory store is in
// TestRateLimitTIsDraft11), for every algorithm: t is the wait for one
// more unit and the 429's Retry-After equals it, whether Redis answers or
// the deny cache does. With the cache on, the refusals after Redis's first
// one (at 2 s, then at 3 s, when t and Retry-After have counted down by a
// second) are the cache's, which the observer confirms; without it, Redis
// answers them.
func TestRateLimitTIsDraft11OnRedis(t *testing.T) {
	inst := redistest.Shared(t)
	for _, alg := range backend.Algorithms() {
		for _, deny := range []bool{false, true} {
			name := alg.String() + " on redis"
			if deny {
				name = alg.String() + " from the deny cache"
			}
			t.Run(name, func(t *testing.T) {
				clock := backendtest.NewClock(backendtest.Epoch)
				size := 0
				if deny {
					size = ceilingredis.DefaultDenyCacheSize
				}
				store := ceilingredis.New(inst.Client(t), ceilingredis.WithPrefix(redistest.KeyPrefix(t)),
					ceilingredis.WithClock(clock.Now), ceilingredis.WithDenyCache(size))
				counts := &callCounter{}
				h := checkDraft11(t, alg, clock, WithBackend(store), WithObserver(cacheCounter{counts}),
					WithLogger(slog.New(slog.DiscardHandler)), // no key secret: the warning is not this test's business
					WithTimeout(loadedTimeout))                // the fields, not the timeout, are this test's business
				if counts.calls != 3 || counts.cached != 0 {
					t.Fatalf("%d backend calls and %d cached answers for the first three requests, want Redis's 3", counts.calls, counts.cached)
				}
				want := draft11T[alg]
				checkDraft11Refusal(t, "fourth, at 2 s", draft11Get(t, h, clock, 2*time.Second), want)
				checkDraft11Refusal(t, "fifth, at 3 s", draft11Get(t, h, clock, 3*time.Second), want-1)
				wantCalls, wantCached := 5, 0
				if deny {
					wantCalls, wantCached = 3, 2
				}
				if counts.calls != wantCalls || counts.cached != wantCached {
					t.Errorf("%d backend calls and %d cached answers, want %d and %d", counts.calls, counts.cached, wantCalls, wantCached)
				}
			})
		}
	}
}
