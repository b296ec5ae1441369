package redis

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
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

// TestClusterReloadsAreRateLimited decides, from four goroutines at once,
// on a Cluster whose every node is down: each decision fails to dial and
// asks for a slot map reload, and each reload fails at once (go-redis then
// waits for nothing before the next). The Store asks at most once per
// reloadEvery, so an outage does not turn every failed decision into a
// CLUSTER SLOTS sweep of the surviving nodes.
func TestClusterReloadsAreRateLimited(t *testing.T) {
	dead := closedAddr(t)
	var loads atomic.Int64
	client := redis.NewClusterClient(&redis.ClusterOptions{
		// The first load maps every slot to the dead node; every reload
		// fails as a sweep of dead nodes would.
		ClusterSlots: func(context.Context) ([]redis.ClusterSlot, error) {
			if loads.Add(1) == 1 {
				return []redis.ClusterSlot{{Start: 0, End: 16383, Nodes: []redis.ClusterNode{{Addr: dead}}}}, nil
			}
			return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
		},
		DialerRetries: 1,
		PoolSize:      1000, // every dial fails for itself: go-redis's pool does not start answering from its last error
	})
	t.Cleanup(func() { client.Close() })
	s := New(client, WithDenyCache(0))
	req := backend.Request{Key: "k", Algorithm: backend.GCRA, Limit: 10, Period: time.Minute, Cost: 1}
	const workers, each = 4, 100
	var failed atomic.Int64
	start := time.Now()
	// One decision first: go-redis loads the slot map for every caller
	// that finds none yet, at once.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_, err := s.Decide(ctx, []backend.Request{req})
	cancel()
	if err == nil {
		t.Fatal("decided on a dead Cluster")
	}
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range each {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				if _, err := s.Decide(ctx, []backend.Request{req}); err != nil {
					failed.Add(1)
				}
				cancel()
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	for deadline := time.Now().Add(5 * time.Second); loads.Load() < 2 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond) // go-redis reloads on a goroutine of its own
	}
	reloads := loads.Load() - 1
	// One at once, then one per reloadEvery; one more for a reload asked
	// for just before the end that lands after.
	limit := 2 + int64(elapsed/reloadEvery)
	t.Logf("%d failed decisions in %v: %d reloads (at most %d)", failed.Load(), elapsed.Round(time.Millisecond), reloads, limit)
	if failed.Load() != workers*each || !isUnreachable(err) {
		t.Fatalf("%d of %d decisions failed on a dead Cluster, the first with %v", failed.Load(), workers*each, err)
	}
	if reloads < 1 {
		t.Error("no reload asked for: decisions that cannot reach their master must heal the slot map")
	}
	if limit >= workers*each/2 {
		t.Skipf("the decisions took %v: too slow to tell a rate limit from none", elapsed)
	}
	if reloads > limit {
		t.Errorf("%d slot map reloads in %v, want at most %d (one per %v)", reloads, elapsed, limit, reloadEvery)
	}
}
