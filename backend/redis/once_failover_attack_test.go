package redis_test

import (
	"context"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	ceilingredis "github.com/ceiling-go/ceiling/backend/redis"
	"github.com/ceiling-go/ceiling/internal/redistest"
)

// A settlement applied on a Cluster master, replicated, and resent after
// the master crashed and its replica took over finds its ticket consumed
// on the new master too (the ticket and the state replicate in one
// script's effects): the repeat is a peek, and another request's units
// stay counted. An attack that held.
func TestSettlementResentAfterFailoverAppliedOnce(t *testing.T) {
	c := redistest.ClusterWithReplicas(t)
	client := c.Client(t)
	ctx := context.Background()
	s := ceilingredis.New(client, ceilingredis.WithPrefix("p"), ceilingredis.WithDenyCache(0))
	const tag = "{CCCCCCCCCCCCCCCCCCCCCC}"
	req := func(cost int64) backend.Request {
		return backend.Request{Key: tag + ":a", Algorithm: backend.RollingWindow, Limit: 10, Period: time.Hour, Cost: cost}
	}
	reserve := req(5)
	reserve.Once = 77 // its ticket
	a, err := s.Decide(ctx, []backend.Request{reserve})
	if err != nil || !a[0].Allowed || a[0].Stamp == 0 {
		t.Fatalf("A reserves 5: %+v, %v", a, err)
	}
	if b, err := s.Decide(ctx, []backend.Request{req(5)}); err != nil || !b[0].Allowed {
		t.Fatalf("B takes 5: %+v, %v", b, err)
	}
	refund := req(-5)
	refund.Stamp, refund.Once = a[0].Stamp, 77
	if r, err := s.Decide(ctx, []backend.Request{refund}); err != nil || r[0].Remaining != 5 {
		t.Fatalf("A's refund: %+v, %v; want 5 left", r, err)
	}
	master, err := client.MasterForKey(ctx, "p:"+tag)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := master.Do(ctx, "wait", 1, 5000).Int(); err != nil || n < 1 {
		t.Fatalf("WAIT: %d, %v: the refund did not reach the replica", n, err)
	}
	c.Failover(t, master.Options().Addr)
	var r []backend.Result
	deadline := time.Now().Add(20 * time.Second)
	for {
		if r, err = s.Decide(ctx, []backend.Request{refund}); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil || r[0].Remaining != 5 {
		t.Errorf("A's refund resent after the failover: %+v, %v; want 5 left (applied once)", r, err)
	}
}
