package redis_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	ceilingredis "github.com/ceiling-go/ceiling/backend/redis"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// migrating moves key's slot from its master towards another master by
// hand, as redis-cli --cluster reshard does: SETSLOT IMPORTING on the
// target, MIGRATING on the source, then MIGRATE of the given keys only.
// It returns the source, the target and the slot.
func migrating(t *testing.T, c *redistest.ClusterInstance, client *redis.ClusterClient, slotKey string, move []string) (src, dst *redis.Client, slot int64) {
	t.Helper()
	ctx := context.Background()
	slot, err := client.ClusterKeySlot(ctx, slotKey).Result()
	if err != nil {
		t.Fatal(err)
	}
	slots, err := client.ClusterSlots(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	var srcAddr, dstAddr string
	for _, r := range slots {
		if int64(r.Start) <= slot && slot <= int64(r.End) {
			srcAddr = r.Nodes[0].Addr
		}
	}
	for _, r := range slots {
		if r.Nodes[0].Addr != srcAddr {
			dstAddr = r.Nodes[0].Addr
		}
	}
	src = redis.NewClient(&redis.Options{Addr: srcAddr})
	dst = redis.NewClient(&redis.Options{Addr: dstAddr})
	t.Cleanup(func() { src.Close(); dst.Close() })
	srcID, _ := src.Do(ctx, "cluster", "myid").Text()
	dstID, _ := dst.Do(ctx, "cluster", "myid").Text()
	if err := dst.Do(ctx, "cluster", "setslot", slot, "importing", srcID).Err(); err != nil {
		t.Fatal(err)
	}
	if err := src.Do(ctx, "cluster", "setslot", slot, "migrating", dstID).Err(); err != nil {
		t.Fatal(err)
	}
	host, port, _ := strings.Cut(dstAddr, ":")
	for _, k := range move {
		if err := src.Do(ctx, "migrate", host, port, k, 0, 5000).Err(); err != nil {
			t.Fatalf("migrate %s: %v", k, err)
		}
	}
	return src, dst, slot
}

// finish completes a migration that migrating began: the rest of the
// slot's keys, then the slot itself, assigned to dst on every master.
func finish(t *testing.T, client *redis.ClusterClient, src, dst *redis.Client, slot int64, rest []string) {
	t.Helper()
	ctx := context.Background()
	host, port, _ := strings.Cut(dst.Options().Addr, ":")
	for _, k := range rest {
		if err := src.Do(ctx, "migrate", host, port, k, 0, 5000).Err(); err != nil {
			t.Errorf("migrate %s: %v", k, err)
		}
	}
	dstID, _ := dst.Do(ctx, "cluster", "myid").Text()
	if err := client.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
		return n.Do(ctx, "cluster", "setslot", slot, "node", dstID).Err()
	}); err != nil {
		t.Error(err)
	}
}

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
	src, dst, slot := migrating(t, c, client, "p:"+tag, []string{"p:" + tag + ":a"})
	done := make(chan struct{})
	go func() {
		defer close(done)
		time.Sleep(50 * time.Millisecond)
		finish(t, client, src, dst, slot, []string{"p:" + tag + ":b"})
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
