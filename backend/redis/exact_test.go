package redis

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestExactAcrossInstances is the reason for the package: four instances,
// each with its own client and Store, share a limit of 100 per minute on
// one key through one Redis, on the server's clock, and 1000 concurrent
// decisions admit exactly 100.
func TestExactAcrossInstances(t *testing.T) {
	const instances, decisions, limit = 4, 1000, 100
	servers := []struct {
		name   string
		client func(t *testing.T) redis.UniversalClient
	}{
		{"redis", func(t *testing.T) redis.UniversalClient { return redistest.Shared(t).Client(t) }},
		{"cluster", func(t *testing.T) redis.UniversalClient { return redistest.SharedCluster(t).Client(t) }},
	}
	for _, srv := range servers {
		t.Run(srv.name, func(t *testing.T) {
			prefix := redistest.KeyPrefix(t)
			stores := make([]*Store, instances)
			for i := range stores {
				// The deny cache only ever rejects; off, every decision
				// reaches Redis, the harder case.
				stores[i] = New(srv.client(t), WithPrefix(prefix), WithDenyCache(0))
			}
			for _, alg := range backend.Algorithms() {
				t.Run(alg.String(), func(t *testing.T) {
					// "Exactly the limit" holds while no unit comes back: GCRA
					// emits one every 600ms, and a fixed window starts over at
					// each minute. A run that the server's clock shows crossing
					// either is repeated on a fresh key, at most three times.
					for attempt := range 3 {
						req := backend.Request{Key: fmt.Sprintf("shop:%v:%d", alg, attempt), Algorithm: alg, Limit: limit, Period: time.Minute, Cost: 1}
						before := serverTime(t, stores[0].client)
						admitted := race(t, stores, req, decisions)
						after := serverTime(t, stores[0].client)
						crossed := (alg == backend.GCRA && after.Sub(before) >= 600*time.Millisecond) ||
							(alg == backend.FixedWindow && before.Truncate(time.Minute) != after.Truncate(time.Minute))
						if crossed {
							t.Logf("attempt %d took %v across a refill or window: repeating", attempt, after.Sub(before))
							continue
						}
						if admitted != limit {
							t.Errorf("admitted %d of %d decisions, want exactly %d", admitted, decisions, limit)
						}
						return
					}
					t.Fatal("three attempts crossed a refill or a window; the machine is too slow for this test")
				})
			}
		})
	}
}

// race fires n decisions of req at once, spread over stores, and returns
// how many were admitted.
func race(t *testing.T, stores []*Store, req backend.Request, n int) int64 {
	t.Helper()
	var admitted, errs atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for g := range n {
		s := stores[g%len(stores)]
		wg.Go(func() {
			<-start
			res, err := s.Decide(context.Background(), []backend.Request{req})
			switch {
			case err != nil:
				errs.Add(1)
			case res[0].Allowed:
				admitted.Add(1)
			}
		})
	}
	close(start)
	wg.Wait()
	if errs.Load() != 0 {
		t.Fatalf("%d decisions failed", errs.Load())
	}
	return admitted.Load()
}

func serverTime(t *testing.T, client redis.UniversalClient) time.Time {
	t.Helper()
	now, err := client.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now
}

// TestExactAcrossSlots runs requests whose two rules live on different
// cluster slots: the tighter rule admits exactly its limit, and the looser
// one ends up charged exactly for the admitted requests, every refund of a
// rejected request having landed.
func TestExactAcrossSlots(t *testing.T) {
	client := redistest.SharedCluster(t).Client(t)
	prefix := redistest.KeyPrefix(t)
	a := backend.Request{Key: "user:a", Algorithm: backend.SlidingLog, Limit: 30, Period: time.Hour, Cost: 1}
	// Loose enough that in-flight units awaiting a refund never fill it.
	b := backend.Request{Key: "ip:b", Algorithm: backend.FixedWindow, Limit: 100, Period: 24 * time.Hour, Cost: 1}
	if slot(prefix+":"+a.Key) == slot(prefix+":"+b.Key) {
		t.Fatal("test keys share a slot; pick others")
	}
	stores := []*Store{
		New(client, WithPrefix(prefix), WithDenyCache(0)),
		New(redistest.SharedCluster(t).Client(t), WithPrefix(prefix), WithDenyCache(0)),
	}
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				res, err := stores[g%2].Decide(context.Background(), []backend.Request{a, b})
				if err != nil {
					t.Error(err)
					return
				}
				if res[0].Allowed && res[1].Allowed {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	if got, want := admitted.Load(), a.Limit; got != want {
		t.Errorf("admitted %d, want exactly %d", got, want)
	}
	b.Cost = 0
	if got, want := decide(t, stores[0], b)[0].Remaining, b.Limit-a.Limit; got != want {
		t.Errorf("loose rule remaining = %d, want %d (charged only for admitted requests)", got, want)
	}
}
