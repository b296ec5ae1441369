package redis_test

import (
	"context"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	ceilingredis "github.com/ceiling-go/ceiling/backend/redis"
	"github.com/ceiling-go/ceiling/internal/redistest"
)

// TestDecisionDuringSlotMigration_Attack: every rule of one key value is in
// one slot (the stored key's hash tag), so a decision is one multi-key
// script. While an operator reshards that slot (redis-cli --cluster
// reshard moves its keys one batch at a time), a node that holds some of
// the value's keys and not the others answers TRYAGAIN: the script was not
// run, and Redis asks the client to try again shortly. The Store sent its
// scripts NoRetry and gave up at once, so the value's callers got a
// backend failure (their fail mode, and a failure that moves the breaker)
// for as long as the slot was half moved. It now sends the script again
// within the budget: decided once the move completes, and only once.
func TestDecisionDuringSlotMigration_Attack(t *testing.T) {
	c := redistest.Cluster(t)
	client := c.Client(t)
	ctx := context.Background()
	s := ceilingredis.New(client, ceilingredis.WithPrefix("p"), ceilingredis.WithDenyCache(0))
	const tag = "{AAAAAAAAAAAAAAAAAAAAAA}"
	req := func(rule string) backend.Request {
		return backend.Request{Key: tag + ":" + rule, Algorithm: backend.FixedWindow, Limit: 10, Period: time.Hour, Cost: 1}
	}
	reqs := []backend.Request{req("a"), req("b")}
	if _, err := s.Decide(ctx, reqs); err != nil {
		t.Fatal(err)
	}
	src, dst, slot := redistest.MigratingSlot(t, client, "p:"+tag, []string{"p:" + tag + ":a"})
	done := make(chan struct{})
	go func() {
		defer close(done)
		time.Sleep(50 * time.Millisecond)
		redistest.FinishMigration(t, client, src, dst, slot, []string{"p:" + tag + ":b"})
	}()
	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	res, err := s.Decide(dctx, reqs)
	<-done
	if err != nil {
		t.Fatalf("decision while the slot was half moved: %v; want it decided once the move completes", err)
	}
	for i, r := range res {
		if !r.Allowed || r.Remaining != 8 {
			t.Errorf("rule %d: %+v, want admitted with 8 remaining", i, r)
		}
	}
}
