package redis

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestAWrongTypeKeyFailsOnlyItsOwnCallerInABatch_Attack: lone decisions
// share batchScript runs (one lane, so they queue behind each other); one
// key holds a list. Only its callers get WRONGTYPE; every other caller is
// answered, and what each key stored is what its callers were told.
func TestAWrongTypeKeyFailsOnlyItsOwnCallerInABatch_Attack(t *testing.T) {
	srv := redistest.Shared(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { client.Close() })
	prefix := redistest.KeyPrefix(t)
	s := New(client, WithPrefix(prefix), WithDenyCache(0))
	s.pipe.max = 1
	ctx := context.Background()
	if err := client.LPush(ctx, prefix+":bad", "x").Err(); err != nil {
		t.Fatal(err)
	}
	const keys, rounds = 16, 20
	var mu sync.Mutex
	told := map[string]int64{}
	var wg sync.WaitGroup
	for k := range keys {
		key := fmt.Sprintf("k%d", k)
		if k == 0 {
			key = "bad"
		}
		for _, alg := range []backend.Algorithm{backend.FixedWindow, backend.SlidingLog} {
			wg.Go(func() {
				req := backend.Request{Key: key + fmt.Sprint(alg), Algorithm: alg, Limit: 1000, Period: time.Hour, Cost: int64(k + 1)}
				if k == 0 {
					req.Key = "bad"
				}
				for range rounds {
					c, cancel := context.WithTimeout(ctx, 2*time.Second)
					res, err := s.Decide(c, []backend.Request{req})
					cancel()
					switch {
					case k == 0 && err == nil:
						t.Errorf("decided on a list: %+v", res[0])
					case k == 0 && !strings.Contains(err.Error(), "WRONGTYPE"):
						t.Errorf("the list's caller got %v, want WRONGTYPE", err)
					case k != 0 && err != nil:
						t.Errorf("key %s: %v", req.Key, err)
					case k != 0:
						mu.Lock()
						told[req.Key] += req.Cost
						mu.Unlock()
					}
				}
			})
		}
	}
	wg.Wait()
	for key, n := range told {
		alg := backend.FixedWindow
		if strings.HasSuffix(key, fmt.Sprint(backend.SlidingLog)) {
			alg = backend.SlidingLog
		}
		res := decide(t, s, backend.Request{Key: key, Algorithm: alg, Limit: 1000, Period: time.Hour})
		if used := 1000 - res[0].Remaining; used != min(n, 1000) {
			t.Errorf("key %s: stored %d, told %d", key, used, n)
		}
	}
}
