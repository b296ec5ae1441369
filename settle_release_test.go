package ceiling

import (
	"context"
	"log/slog"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/backend/memory"
	ceilingredis "github.com/ceiling-go/ceiling/backend/redis"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// countedStore is the memory store behind a counter of backend calls.
type countedStore struct {
	*memory.Store
	calls atomic.Int64
}

func (c *countedStore) Decide(ctx context.Context, reqs []backend.Request) ([]backend.Result, error) {
	c.calls.Add(1)
	return c.Store.Decide(ctx, reqs)
}

func (c *countedStore) DecideInto(ctx context.Context, reqs []backend.Request, out []backend.Result) error {
	c.calls.Add(1)
	return c.Store.DecideInto(ctx, reqs, out)
}

// roundTrips counts what leaves a go-redis client: each command or
// pipeline is one round trip.
type roundTrips struct{ n atomic.Int64 }

func (c *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmd)
	}
}
func (c *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmds)
	}
}

// A request under a concurrency rule and a rule with an Estimate costs two
// backend calls in all, on memory and on Redis: the decision (which takes
// the slot and reserves the estimate) and one after the handler, which
// gives the slot back and settles the real cost together. The promise's
// fine print allows one call after the handler, not one per kind of work.
// Whatever the handler does (settles above the estimate, below it, at it,
// not at all, or panics), the slot comes back and the tokens rule ends at
// what was used.
func TestReleaseAndSettlementShareOneCallAfterTheHandler(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T) (backend.Backend, func() int64)
	}{
		{"memory", func(*testing.T) (backend.Backend, func() int64) {
			s := &countedStore{Store: memory.New()}
			t.Cleanup(func() { s.Close() })
			return s, s.calls.Load
		}},
		{"redis", func(t *testing.T) (backend.Backend, func() int64) {
			c := redis.NewClient(&redis.Options{Addr: redistest.Shared(t).Addr})
			t.Cleanup(func() { c.Close() })
			trips := &roundTrips{}
			c.AddHook(trips)
			return ceilingredis.New(c, ceilingredis.WithPrefix(redistest.KeyPrefix(t))), trips.n.Load
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			be, calls := tc.setup(t)
			l := MustNew([]Rule{
				{Name: "streams", Key: headerKey("X-Shop"), Limit: 1, Period: time.Minute, Algorithm: Concurrency},
				{Name: "tokens", Key: headerKey("X-Shop"), Limit: 1000, Period: time.Hour, Algorithm: SlidingLog,
					Estimate: func(*http.Request) (int64, error) { return 100, nil }},
			}, WithBackend(be), WithTimeout(5*time.Second), WithLogger(slog.New(slog.DiscardHandler)))
			defer l.Close()
			var used int64 // what the next request settles; -1: none, -2: panic after settling 50
			h := l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				switch {
				case used >= 0:
					if err := Settle(r, "tokens", used); err != nil {
						t.Error(err)
					}
				case used == -2:
					Settle(r, "tokens", 50)
					panic(http.ErrAbortHandler)
				}
			}))
			// Warm up (Redis loads its script on the first call).
			used = 100
			serve(t, h, inflightRequest("warm"))

			spent := int64(0)
			for _, step := range []struct {
				used, cost int64
			}{{300, 300}, {20, 20}, {100, 100}, {-1, 100}, {-2, 50}} {
				used = step.used
				before := calls()
				func() {
					defer func() {
						if p := recover(); p != nil && p != http.ErrAbortHandler {
							panic(p)
						}
					}()
					if w := serve(t, h, inflightRequest("acme")); w.Code != 200 {
						t.Fatalf("settling %d: status %d", step.used, w.Code)
					}
				}()
				if got := calls() - before; got != 2 {
					t.Errorf("settling %d: %d backend round trips, want 2 (the decision, then the release and the settlement together)", step.used, got)
				}
				spent += step.cost
				tokens, err := l.Peek(t.Context(), "tokens", "acme")
				if err != nil {
					t.Fatal(err)
				}
				if got, want := tokens.Remaining, 1000-spent; got != want {
					t.Errorf("settling %d: tokens remaining %d, want %d", step.used, got, want)
				}
				slots, err := l.Peek(t.Context(), "streams", "acme")
				if err != nil {
					t.Fatal(err)
				}
				if slots.Remaining != 1 {
					t.Errorf("settling %d: %d slots free after the handler, want the 1 back", step.used, slots.Remaining)
				}
			}
		})
	}
}
