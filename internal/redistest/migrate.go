package redistest

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// MigratingSlot begins to move slotKey's slot from its master to another
// master by hand, as redis-cli --cluster reshard does: SETSLOT IMPORTING
// on the target, MIGRATING on the source, then MIGRATE of the keys in move
// only. It returns the source, the target and the slot; [FinishMigration]
// ends the move.
func MigratingSlot(tb testing.TB, client *redis.ClusterClient, slotKey string, move []string) (src, dst *redis.Client, slot int64) {
	tb.Helper()
	ctx := context.Background()
	slot, err := client.ClusterKeySlot(ctx, slotKey).Result()
	if err != nil {
		tb.Fatal(err)
	}
	slots, err := client.ClusterSlots(ctx).Result()
	if err != nil {
		tb.Fatal(err)
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
	tb.Cleanup(func() { src.Close(); dst.Close() })
	srcID, _ := src.Do(ctx, "cluster", "myid").Text()
	dstID, _ := dst.Do(ctx, "cluster", "myid").Text()
	if err := dst.Do(ctx, "cluster", "setslot", slot, "importing", srcID).Err(); err != nil {
		tb.Fatal(err)
	}
	if err := src.Do(ctx, "cluster", "setslot", slot, "migrating", dstID).Err(); err != nil {
		tb.Fatal(err)
	}
	for _, k := range move {
		if err := migrate(src, dst, k); err != nil {
			tb.Fatal(err)
		}
	}
	return src, dst, slot
}

// FinishMigration completes a move [MigratingSlot] began: the slot's keys
// in rest, then the slot itself, assigned to dst on every master. It may
// run on a goroutine of its own (it reports with Error, not Fatal).
func FinishMigration(tb testing.TB, client *redis.ClusterClient, src, dst *redis.Client, slot int64, rest []string) {
	tb.Helper()
	ctx := context.Background()
	for _, k := range rest {
		if err := migrate(src, dst, k); err != nil {
			tb.Error(err)
		}
	}
	dstID, _ := dst.Do(ctx, "cluster", "myid").Text()
	if err := client.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
		return n.Do(ctx, "cluster", "setslot", slot, "node", dstID).Err()
	}); err != nil {
		tb.Error(err)
	}
}

// migrate moves key from src to dst.
func migrate(src, dst *redis.Client, key string) error {
	host, port, _ := strings.Cut(dst.Options().Addr, ":")
	if err := src.Do(context.Background(), "migrate", host, port, key, 0, 5000).Err(); err != nil {
		return fmt.Errorf("migrate %s: %w", key, err)
	}
	return nil
}
