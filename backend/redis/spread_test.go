package redis

import (
	"context"
	"slices"
	"testing"

	"github.com/ceiling-go/ceiling/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestSpreadKeysReachEveryMaster: on a three-master cluster SpreadKeys
// gives one variant of the key per master, each on a different one; on a
// single server, or under a prefix whose hash tag puts every key in one
// slot, the key alone.
func TestSpreadKeysReachEveryMaster(t *testing.T) {
	cl := redistest.SharedCluster(t)
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	t.Cleanup(func() { client.Close() })
	ctx := context.Background()
	prefix := redistest.KeyPrefix(t)
	keys, err := New(client, WithPrefix(prefix)).SpreadKeys(ctx, "canary")
	if err != nil {
		t.Fatal(err)
	}
	var masters []string
	for _, k := range keys {
		m, err := client.MasterForKey(ctx, prefix+":"+k)
		if err != nil {
			t.Fatal(err)
		}
		masters = append(masters, m.Options().Addr)
	}
	slices.Sort(masters)
	if len(masters) != 3 || len(slices.Compact(masters)) != 3 {
		t.Errorf("keys %q on masters %v, want one on each of 3", keys, masters)
	}
	for _, s := range []*Store{New(client, WithPrefix("{one}")), New(defaultClient(t, redistest.Shared(t).Addr))} {
		if keys, err := s.SpreadKeys(ctx, "canary"); err != nil || !slices.Equal(keys, []string{"canary"}) {
			t.Errorf("one slot or one server: %q, %v; want the key alone", keys, err)
		}
	}
}
