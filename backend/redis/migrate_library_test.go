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
	src, dst, slot := redistest.MigratingSlot(t, client, "p:"+tag, []string{"p:" + tag + ":a"})
	if err := dst.FunctionFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	defer redistest.FinishMigration(t, client, src, dst, slot, nil)
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
