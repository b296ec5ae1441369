package redis

import (
	"context"
	"strconv"
	"strings"
	"sync"

	"github.com/ceiling-go/ceiling/backend"
)

var _ backend.Spread = (*Store)(nil)

// SpreadKeys returns variants of key, one on each Cluster master as the
// client routes now (key and a hash tag of a slot the master holds), so
// that a probe deciding them all needs every master ([backend.Spread]).
// Without Cluster, or when prefix or key has a hash tag, it returns key.
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

// slotTags holds, per hash slot, the least number whose digits hash to it.
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
