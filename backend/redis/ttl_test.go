package redis

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/redis/go-redis/v9"
)

// storedKeys lists the keys under prefix, on every master of a cluster.
func storedKeys(t *testing.T, client redis.UniversalClient, prefix string) map[string]*redis.Client {
	t.Helper()
	ctx := context.Background()
	keys := map[string]*redis.Client{}
	scan := func(n *redis.Client) error {
		found, err := n.Keys(ctx, prefix+"*").Result()
		for _, k := range found {
			keys[k] = n
		}
		return err
	}
	var err error
	if cc, ok := client.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		var nodes []*redis.Client
		err = cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
			mu.Lock() // ForEachMaster calls this concurrently
			defer mu.Unlock()
			nodes = append(nodes, n)
			return nil
		})
		for _, n := range nodes {
			if err == nil {
				err = scan(n)
			}
		}
	} else {
		err = scan(client.(*redis.Client))
	}
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// TestEveryKeyExpires bursts on keys of every algorithm and checks that each
// key the script wrote has a TTL, and that it is no longer than the time
// its state takes to be full again.
func TestEveryKeyExpires(t *testing.T) {
	forEachTarget(t, func(t *testing.T, client redis.UniversalClient, prefix string) {
		s := New(client, WithPrefix(prefix), WithDenyCache(0))
		const period = 2 * time.Second
		bound := map[backend.Algorithm]time.Duration{
			backend.RollingWindow: period + period/16, // a unit counts until its bucket and 16 more have passed
			backend.GCRA:          period,             // burst × emission interval
			backend.SlidingLog:    period,
			backend.SlidingWindow: 2 * period, // the current window weighs into the next
			backend.FixedWindow:   period,
		}
		start := time.Now()
		for alg := range bound {
			for _, user := range []string{"a", "b", "c"} {
				r := backend.Request{Key: alg.String() + ":" + user, Algorithm: alg, Limit: 5, Period: period, Cost: 1}
				for range 7 {
					decide(t, s, r)
				}
			}
		}
		keys := storedKeys(t, client, prefix)
		// A fixed window ends at a multiple of the period, and its key with
		// it: when the burst ran across that instant, a fixed-window key
		// written just before it has rightly expired by the scan.
		crossed := start.UnixNano()/int64(period) != time.Now().UnixNano()/int64(period)
		byAlg := map[backend.Algorithm]int{}
		for k := range keys {
			byAlg[algorithmOf(t, k, prefix)]++
		}
		for alg := range bound {
			if got := byAlg[alg]; got != 3 && !(alg == backend.FixedWindow && crossed) {
				t.Fatalf("%d %s keys stored, want 3 (%d keys in all)", got, alg, len(keys))
			}
		}
		ctx := context.Background()
		for k, node := range keys {
			ttl, err := node.PTTL(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			alg := algorithmOf(t, k, prefix)
			if ttl == -2 && alg == backend.FixedWindow && start.UnixNano()/int64(period) != time.Now().UnixNano()/int64(period) {
				continue // its window ended between the scan and PTTL, and the key with it
			}
			if ttl <= 0 || ttl > bound[alg] {
				t.Errorf("%s: TTL %v, want in (0, %v]", k, ttl, bound[alg])
			}
		}
	})
}

// TestRefundToEmptyDeletesKey pins that state back to full is not kept.
func TestRefundToEmptyDeletesKey(t *testing.T) {
	forEachTarget(t, func(t *testing.T, client redis.UniversalClient, prefix string) {
		s := New(client, WithPrefix(prefix))
		for _, alg := range backend.Algorithms() {
			r := backend.Request{Key: "k:" + alg.String(), Algorithm: alg, Limit: 5, Period: time.Hour, Cost: 2}
			decide(t, s, r)
			r.Cost = -2
			decide(t, s, r)
		}
		for k := range storedKeys(t, client, prefix) {
			t.Errorf("%s kept after refunding everything", k)
		}
	})
}

func algorithmOf(t *testing.T, key, prefix string) backend.Algorithm {
	t.Helper()
	for _, alg := range backend.Algorithms() {
		name := alg.String()
		if len(key) > len(prefix)+1+len(name) && key[len(prefix)+1:len(prefix)+1+len(name)] == name {
			return alg
		}
	}
	t.Fatalf("key %s names no algorithm", key)
	return 0
}
