package ceiling

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	ceilingredis "github.com/ceiling-go/ceiling/backend/redis"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// A Redis Cluster with one master down (no replica to take over, and the
// cluster serving its other slots: cluster-require-full-coverage no) is not
// healthy: the background probe puts a canary on every master, so the
// breaker stays open until the dead master is back, then closes. Before,
// the probe's lone canary lived on one master: when that master was a live
// one, the first probe closed the breaker while every key on the dead
// master still failed, and the limiter went back and forth.
func TestClusterProbeWaitsForEveryMaster(t *testing.T) {
	cl := redistest.Cluster(t)
	ctx := context.Background()
	for _, n := range cl.Nodes {
		if err := n.Client(t).ConfigSet(ctx, "cluster-require-full-coverage", "no").Err(); err != nil {
			t.Fatal(err)
		}
	}
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	t.Cleanup(func() { client.Close() })
	prefix := redistest.KeyPrefix(t)
	var events atomic.Int64
	l := MustNew([]Rule{{Name: "shop", Limit: 1_000_000, Period: time.Minute}},
		WithBackend(ceilingredis.New(client, ceilingredis.WithPrefix(prefix))), WithFailMode(FailOpen), WithTimeout(loadedTimeout),
		WithBreaker(BreakerConfig{Failures: 3, CoolDown: 100 * time.Millisecond, MaxCoolDown: 200 * time.Millisecond}),
		WithLogger(slog.New(slog.DiscardHandler)), onDegraded(func(DegradedEvent) { events.Add(1) }))
	defer l.Close()
	masterOf := func(key string) string {
		t.Helper()
		m, err := client.MasterForKey(ctx, prefix+":"+key)
		if err != nil {
			t.Fatal(err)
		}
		return m.Options().Addr
	}
	// The victim is a master the single canary of before would not reach.
	canary := masterOf(l.canaryKey())
	victim := ""
	for _, n := range cl.Nodes {
		if n.Addr != canary {
			victim = n.Addr
			break
		}
	}
	var onVictim []string // shops whose keys the victim holds
	st := newState(1)
	for i := 0; len(onVictim) < 3; i++ {
		if v := "shop-" + itoa(i); masterOf(l.storedKey(st, "shop", v)) == victim {
			onVictim = append(onVictim, v)
		}
	}
	decide := func(shop string) RuleResult {
		t.Helper()
		d, err := l.Decide(ctx, Input{Rule: "shop", Key: shop})
		if err != nil {
			t.Fatal(err)
		}
		return d.Results[0]
	}
	if rr := decide(onVictim[0]); rr.Fallback != inherit {
		t.Fatalf("with every master up: %+v", rr)
	}

	cl.Node(victim).Kill()
	for i := 0; l.Health().Status == "healthy"; i++ {
		if i == 100 {
			t.Fatal("still healthy after 100 decisions on a dead master")
		}
		decide(onVictim[i%len(onVictim)])
	}
	time.Sleep(2 * time.Second) // ten probes or so
	if h := l.Health(); h.Status != "degraded" || events.Load() != 1 {
		t.Fatalf("a master down for 2s: %s after %d transitions, want degraded after 1 (the probe must reach every master)", h.Status, events.Load())
	}

	cl.Node(victim).Restart(t)
	cl.WaitOK(t)
	if !eventually(func() bool { return l.Health().Status == "healthy" }) {
		t.Fatal("still degraded 10s after the master came back")
	}
	// Redis decides again: a first decision may still fail (a pooled
	// connection to the old process), not one after Redis decided once.
	first := -1
	for i := range 5 {
		if rr := decide(onVictim[1]); rr.Fallback == inherit {
			first = i
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if first < 0 {
		t.Fatal("none of 5 decisions on the restarted master's keys was decided by Redis")
	}
	for i := range 10 {
		if rr := decide(onVictim[i%len(onVictim)]); rr.Fallback != inherit {
			t.Errorf("a key on the restarted master, after Redis decided again: %+v, want decided by Redis", rr)
		}
	}
	if got := events.Load(); got != 2 {
		t.Errorf("%d transitions, want 2 (degraded, then healthy)", got)
	}
}
