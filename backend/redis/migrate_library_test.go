package redis

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestASlotMovingToANodeWithoutTheLibraryLoadsIt: a slot moves to a
// master that has no library. While it migrates, a moved key's FCALL is
// redirected (ASK) to the target, which answers that it has none: the call
// is answered by EVAL, and the library is loaded into every master, the
// target included, which the slot map does not name for that slot yet.
// The decisions after the first are one FCALL each.
func TestASlotMovingToANodeWithoutTheLibraryLoadsIt(t *testing.T) {
	c := redistest.Cluster(t)
	client := c.Client(t)
	ctx := context.Background()
	s := New(client, WithPrefix("p"), WithDenyCache(0))
	const tag = "{BBBBBBBBBBBBBBBBBBBBBB}"
	req := backend.Request{Key: tag + ":a", Algorithm: backend.FixedWindow, Limit: 1000, Period: time.Hour, Cost: 1}
	decide(t, s, req)
	// every master has seen one decision at most; give all of them the
	// library, then take it away from the others: the target lacks it
	client.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return n.FunctionLoadReplace(ctx, library).Err() })
	src, dst, slot := migratingSlot(t, client, "p:"+tag, []string{"p:" + tag + ":a"})
	if err := dst.FunctionFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	defer finishMigration(t, client, src, dst, slot)
	count := countCommands(client)
	for i := range 5 {
		count.reset()
		decide(t, s, req)
		sent := strings.Join(count.sent(), ",")
		if i == 0 {
			waitForLibrary(t, dst) // loaded once the call is answered
		} else if strings.Contains(sent, "eval") {
			t.Errorf("decision %d on a key moved to a node without the library sent %s, want FCALL alone", i+1, sent)
		}
	}
	if got := decide(t, s, backend.Request{Key: req.Key, Algorithm: req.Algorithm, Limit: req.Limit, Period: req.Period})[0].Remaining; got != 1000-6 {
		t.Errorf("remaining %d, want %d (each decision once)", got, 1000-6)
	}
}

func migratingSlot(t *testing.T, client *redis.ClusterClient, slotKey string, move []string) (src, dst *redis.Client, slot int64) {
	t.Helper()
	ctx := context.Background()
	slot, _ = client.ClusterKeySlot(ctx, slotKey).Result()
	slots, _ := client.ClusterSlots(ctx).Result()
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

func finishMigration(t *testing.T, client *redis.ClusterClient, src, dst *redis.Client, slot int64) {
	ctx := context.Background()
	dstID, _ := dst.Do(ctx, "cluster", "myid").Text()
	client.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
		return n.Do(ctx, "cluster", "setslot", slot, "node", dstID).Err()
	})
}
