package redis

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestAKilledMasterHoldsNoLoadForAnother_Attack: as the frozen master,
// with one killed (a crash, before its replica is promoted) and a client
// with go-redis's default dial retries: the decision on a healthy master
// that lost its library does not wait for dials to the dead one.
func TestAKilledMasterHoldsNoLoadForAnother_Attack(t *testing.T) {
	ctx := context.Background()
	c := redistest.Cluster(t)
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { client.Close() })
	logs := &records{}
	s := New(client, WithPrefix("p"), WithDenyCache(0), WithLogger(slog.New(logs)))
	a, b, ka, _, na := twoMasters(t, s, client)
	c.Node(b).Kill()
	var worst time.Duration
	for range 3 {
		if err := na.FunctionFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		dctx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
		start := time.Now()
		_, err := s.Decide(dctx, []backend.Request{day(ka, 1)})
		took := time.Since(start)
		cancel()
		if err != nil {
			t.Errorf("decision on healthy master: %v", err)
		}
		worst = max(worst, took)
	}
	if worst > 300*time.Millisecond {
		t.Errorf("a decision on the healthy master %s took %v: held by loading into the dead master %s", a, worst, b)
	}
	t.Logf("load failure lines: %d", len(storeLines(logs, "loading the function library")))
}
