package redis

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestCallersGivingUpNeverSendAnothersRequest_Attack: many goroutines
// decide distinct keys, each with its own cost, while most give up early
// (timeouts of microseconds, cancellations) so that their ops are dropped,
// cancelled in flight or answered late, and pooled waiters are reused. Each
// key's stored count must be what its caller was told, plus only costs of
// its own calls that failed after being written: never another caller's
// cost (costs are distinct primes' multiples), never a call told ErrNotSent.
func TestCallersGivingUpNeverSendAnothersRequest_Attack(t *testing.T) {
	for _, tg := range targets[1:] {
		t.Run(tg.name, func(t *testing.T) {
			var client redis.UniversalClient
			switch tg.name {
			case "redis":
				srv := redistest.Shared(t)
				c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
				t.Cleanup(func() { c.Close() })
				client = c
			default:
				cl := redistest.SharedCluster(t)
				c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), ContextTimeoutEnabled: true})
				t.Cleanup(func() { c.Close() })
				client = c
			}
			s := New(client, WithPrefix(redistest.KeyPrefix(t)), WithDenyCache(0))
			const keys, rounds = 48, 40
			type tally struct{ told, unknown, unknownN int64 }
			tallies := make([]tally, keys)
			var wg sync.WaitGroup
			for k := range keys {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(k), 7))
					cost := int64(1) << (k % 20) // distinct per key (mod 20): a sum of another key's costs shows
					// windows of MaxPeriod: a run that crosses a window's start (which
					// empties a fixed window) comes once in 90 days, not every hour
					req := backend.Request{Key: fmt.Sprintf("k%d", k), Algorithm: backend.FixedWindow, Limit: backend.MaxLimit, Period: backend.MaxPeriod, Cost: cost}
					if k%3 == 1 {
						req.Algorithm = backend.SlidingWindow
					}
					res := make([]backend.Result, 1)
					for range rounds {
						var ctx context.Context
						var cancel context.CancelFunc
						switch rng.IntN(4) {
						case 0:
							ctx, cancel = context.WithTimeout(context.Background(), time.Duration(rng.IntN(300))*time.Microsecond)
						case 1:
							ctx, cancel = context.WithCancel(context.Background())
							d := time.Duration(rng.IntN(200)) * time.Microsecond
							go func() { time.Sleep(d); cancel() }()
						default:
							ctx, cancel = context.WithTimeout(context.Background(), time.Second)
						}
						err := s.DecideInto(ctx, []backend.Request{req}, res)
						cancel()
						switch {
						case err == nil:
							if !res[0].Allowed {
								t.Errorf("key %d rejected under MaxLimit", k)
							}
							tallies[k].told += cost
						case errors.Is(err, backend.ErrNotSent):
						default:
							tallies[k].unknown += cost
							tallies[k].unknownN++
						}
					}
				}()
			}
			wg.Wait()
			var told, unknown int64
			for _, tl := range tallies {
				told += tl.told
				unknown += tl.unknownN
			}
			t.Logf("admitted cost %d, %d calls of unknown outcome, of %d", told, unknown, keys*rounds)
			time.Sleep(3 * time.Second) // let late round trips land
			for k := range keys {
				cost := int64(1) << (k % 20)
				alg := backend.FixedWindow
				if k%3 == 1 {
					alg = backend.SlidingWindow
				}
				got, err := s.Decide(context.Background(), []backend.Request{{Key: fmt.Sprintf("k%d", k), Algorithm: alg, Limit: backend.MaxLimit, Period: backend.MaxPeriod}})
				if err != nil {
					t.Fatal(err)
				}
				used := backend.MaxLimit - got[0].Remaining
				tl := tallies[k]
				if used < tl.told || used > tl.told+tl.unknown || used%cost != 0 {
					t.Errorf("key %d (cost %d): stored %d, told admitted %d, unknown %d (%d calls)", k, cost, used, tl.told, tl.unknown, tl.unknownN)
				}
			}
		})
	}
}
