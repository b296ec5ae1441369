package redis

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestClusterFailoverHealsInSeconds kills the master that holds a key on a
// three-master, three-replica cluster while decisions keep coming (one
// every 20ms, each with a 100ms budget, through a client with go-redis's
// default options). Once the replica is promoted, the key is decided by
// Redis again within 5 seconds: the store has the client reload its slot
// map when a node cannot be reached, instead of waiting for go-redis's own
// reload every minute.
func TestClusterFailoverHealsInSeconds(t *testing.T) {
	cl := redistest.ClusterWithReplicas(t)
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	t.Cleanup(func() { client.Close() })
	prefix := redistest.KeyPrefix(t)
	s := New(client, WithPrefix(prefix), WithDenyCache(0))
	ctx := context.Background()
	req := backend.Request{Key: "otp:k", Algorithm: backend.GCRA, Limit: backend.MaxLimit, Period: time.Hour, Cost: 1}
	decide(t, s, req)
	master, err := client.MasterForKey(ctx, prefix+":"+req.Key)
	if err != nil {
		t.Fatal(err)
	}

	var lastOK atomic.Int64 // UnixNano of the latest successful decision
	var failed atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		every(20*time.Millisecond, stop, func() bool {
			ctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			defer cancel()
			if _, err := s.Decide(ctx, []backend.Request{req}); err != nil {
				failed.Add(1)
			} else {
				lastOK.Store(time.Now().UnixNano())
			}
			return true
		})
	})
	defer func() {
		close(stop)
		wg.Wait()
	}()

	promoted := cl.Failover(t, master.Options().Addr)
	at := time.Now()
	deadline := at.Add(20 * time.Second)
	for lastOK.Load() < at.UnixNano() {
		if time.Now().After(deadline) {
			t.Fatalf("no decision on the failed master's slots within 20s of %s's promotion (%d failed)", promoted.Addr, failed.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
	healed := time.Unix(0, lastOK.Load()).Sub(at)
	t.Logf("decided again %v after the promotion (%d decisions failed during the failover)", healed.Round(time.Millisecond), failed.Load())
	if healed > 5*time.Second {
		t.Errorf("decided again %v after the promotion, want within 5s", healed)
	}
	if failed.Load() == 0 {
		t.Error("no decision failed: the failover did not hit the key's master")
	}
}
