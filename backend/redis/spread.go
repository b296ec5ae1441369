package redis

import (
	"context"
	"strconv"
	"strings"
	"sync"

	"github.com/ceiling-go/ceiling/backend"
)

var _ backend.Spread = (*Store)(nil)

// SpreadKeys returns variants of key, one on each Redis Cluster master as
// the client routes keys now: key followed by a hash tag chosen for a slot
// the master holds. A call deciding all of them sends one script to every
// master, in parallel, so it succeeds only if every master can decide (see
// [backend.Spread]): the limiter's background probe does that, so a cluster
// with one master down does not look healthy because the master holding a
// lone canary key answers. Without Cluster, or when the prefix or key
// already has a hash tag (every key in one slot), it returns key alone.
// It makes no call to Redis unless the client has not loaded the cluster's
// slot map yet.
func (s *Store) SpreadKeys(ctx context.Context, key string) ([]string, error) {
	if s.cluster == nil || strings.ContainsAny(s.prefix+key, "{}") {
		return []string{key}, nil
	}
	seen := make(map[string]bool, 8)
	var keys []string
	var buf [10]byte
	for _, tag := range slotTags() {
		t := strconv.AppendUint(buf[:0], uint64(tag), 10)
		node, err := s.cluster.MasterForKey(ctx, string(t))
		if err != nil {
			return nil, s.classify(err)
		}
		if addr := node.Options().Addr; !seen[addr] {
			seen[addr] = true
			keys = append(keys, key+"{"+string(t)+"}")
		}
	}
	return keys, nil
}

// slotTags returns, for each hash slot, the least number whose decimal
// digits hash to it: a hash tag for the slot. It is computed once, in a
// few milliseconds, and holds 64 KiB.
var slotTags = sync.OnceValue(func() []uint32 {
	tags := make([]uint32, 16384)
	found := make([]bool, 16384)
	left := len(tags)
	var buf [10]byte
	for i := uint32(0); left > 0; i++ {
		sl := crc16(string(strconv.AppendUint(buf[:0], uint64(i), 10))) & 16383
		if !found[sl] {
			found[sl], tags[sl] = true, i
			left--
		}
	}
	return tags
})
