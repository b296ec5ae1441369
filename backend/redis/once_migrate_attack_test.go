package redis_test

import (
	"context"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	ceilingredis "github.com/ceiling-go/ceiling/backend/redis"
	"github.com/ceiling-go/ceiling/internal/redistest"
)

// A settlement's record is a key of its own beside the rule's key, in its
// slot, and a reshard moves a slot's keys one by one (redis-cli --cluster
// reshard: MIGRATE in batches). Between the moves of the state and of the
// record, a settlement resent after a lost reply found the state on the
// target (ASK) and its record still on the source: the script on the
// target read no record and applied the refund again, giving back another
// request's units, and wrote a second record there, so that the reshard's
// MIGRATE of the first then failed with BUSYKEY. The script declares the
// entry in KEYS, so the half-moved slot answers TRYAGAIN (the store tries
// again for a while, then fails the call, which the limiter resends), and
// a refund now applies only beside its reservation's ticket, which it
// consumes, so it leaves nothing to move: A reserves 5 with a ticket and B
// takes 5 of 10; A's refund of 5 is applied (its reply, say, lost); the
// slot starts moving, the state first; A's refund resent then is not
// applied, nor after the reshard.
func TestSettlementResentDuringSlotMigration_Regression(t *testing.T) {
	c := redistest.Cluster(t)
	client := c.Client(t)
	ctx := context.Background()
	s := ceilingredis.New(client, ceilingredis.WithPrefix("p"), ceilingredis.WithDenyCache(0))
	const tag = "{BBBBBBBBBBBBBBBBBBBBBB}"
	req := func(cost int64) backend.Request {
		return backend.Request{Key: tag + ":a", Algorithm: backend.FixedWindow, Limit: 10, Period: time.Hour, Cost: cost}
	}
	reserve := req(5)
	reserve.Once = 42 // its ticket
	a, err := s.Decide(ctx, []backend.Request{reserve})
	if err != nil || !a[0].Allowed || a[0].Stamp == 0 {
		t.Fatalf("A reserves 5: %+v, %v", a, err)
	}
	if b, err := s.Decide(ctx, []backend.Request{req(5)}); err != nil || !b[0].Allowed {
		t.Fatalf("B takes 5: %+v, %v", b, err)
	}
	refund := req(-5)
	refund.Stamp, refund.Once = a[0].Stamp, 42
	if r, err := s.Decide(ctx, []backend.Request{refund}); err != nil || r[0].Remaining != 5 {
		t.Fatalf("A's refund: %+v, %v; want 5 left", r, err)
	}
	if n, err := client.Exists(ctx, "p:"+tag+":a#o42").Result(); err != nil || n != 0 {
		t.Errorf("after A's refund: %d entries of its Once, %v; want none (the refund consumed its ticket)", n, err)
	}
	src, dst, slot := redistest.MigratingSlot(t, client, "p:"+tag, []string{"p:" + tag + ":a"}) // the state moved
	r, err := s.Decide(ctx, []backend.Request{refund})
	redistest.FinishMigration(t, client, src, dst, slot, nil)
	if err == nil && r[0].Remaining != 5 {
		t.Errorf("A's refund resent mid-reshard: %+v; want 5 left (applied once: B's 5 still count)", r[0])
	}
	t.Logf("A's refund resent mid-reshard: %+v, %v", r, err)
	if r, err := s.Decide(ctx, []backend.Request{refund}); err != nil || r[0].Remaining != 5 {
		t.Errorf("A's refund resent after the reshard: %+v, %v; want 5 left (applied once)", r, err)
	}
	p, err := s.Decide(ctx, []backend.Request{req(0)})
	if err != nil || p[0].Remaining != 5 {
		t.Errorf("after the reshard: %+v, %v; want 5 left", p, err)
	}
}
