package redis

import (
	"context"
	"errors"
	"strings"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/redis/go-redis/v9"
)

// slotGroups returns the indices of reqs grouped by Redis Cluster hash slot,
// in order of first appearance and, within a group, in request order (so
// requests on one key still see each other). Without a cluster client, or
// when every key shares a slot, it returns one group or none.
func (s *Store) slotGroups(reqs []backend.Request) [][]int {
	if s.cluster == nil || len(reqs) < 2 {
		return nil
	}
	first := slot(s.prefix + reqs[0].Key)
	same := true
	slots := make([]uint16, len(reqs))
	for i, r := range reqs {
		slots[i] = slot(s.prefix + r.Key)
		same = same && slots[i] == first
	}
	if same {
		return nil
	}
	var groups [][]int
	index := map[uint16]int{}
	for i, sl := range slots {
		g, ok := index[sl]
		if !ok {
			g = len(groups)
			index[sl] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	return groups
}

// decideSlots decides a request whose keys span several slots: one script
// per slot, pipelined (go-redis sends each node its scripts in parallel).
// Each script is all or nothing for its own slot; if any rejects (or fails),
// the slots that consumed are refunded with the same script, so the call as
// a whole is all or nothing. Until the refund lands, the consumed units
// count: the limiter may briefly under-admit, never over-admit.
func (s *Store) decideSlots(ctx context.Context, reqs []backend.Request, groups [][]int) ([]backend.Result, bool, error) {
	keys := make([][]string, len(groups))
	sub := make([][]backend.Request, len(groups))
	for g, idx := range groups {
		for _, i := range idx {
			keys[g] = append(keys[g], s.prefix+reqs[i].Key)
			sub[g] = append(sub[g], reqs[i])
		}
	}
	replies, errs := s.runPipelined(ctx, keys, sub, nil, true)

	res := make([]backend.Result, len(reqs))
	rejected := false
	var firstErr error
	for g := range groups {
		if errs[g] != nil {
			if firstErr == nil {
				firstErr = errs[g]
			}
			continue
		}
		rejected = rejected || replies[g].rejected
	}
	for g, idx := range groups {
		if errs[g] != nil {
			continue
		}
		for j, i := range idx {
			res[i] = replies[g].results[j]
			if rejected {
				// Nothing of the call stays consumed: report as a peek would.
				res[i] = replies[g].peeks[j]
			}
		}
	}
	if rejected || firstErr != nil {
		s.refund(ctx, keys, sub, replies, errs)
	}
	if firstErr != nil {
		return nil, false, firstErr
	}
	return res, rejected, nil
}

// refund undoes the groups that consumed: a positive cost is given back
// with the consumption's instant as stamp (so only units that still count
// are returned), and a refund the group made is charged again, forced. It
// runs on its own deadline even when ctx is done.
//
// The windowed algorithms and the sliding log undo exactly the units of the
// stamped consumption. GCRA keeps one instant per key, not its history: the
// refund takes the units' emission time off it, so when other requests
// were admitted between the consumption and the refund, the key can be
// ready again up to that interval (the refund's round trip) early.
func (s *Store) refund(ctx context.Context, keys [][]string, sub [][]backend.Request, replies []reply, errs []error) {
	var rkeys [][]string
	var rreqs [][]backend.Request
	var rstamps [][]int64
	for g := range sub {
		if errs[g] != nil || replies[g].rejected {
			continue
		}
		var k []string
		var rs []backend.Request
		var st []int64
		for j, r := range sub[g] {
			if r.Cost == 0 {
				continue
			}
			stamp := replies[g].now
			if r.Cost < 0 {
				stamp = 0
			}
			r.Cost, r.Force = -r.Cost, true
			k, rs, st = append(k, keys[g][j]), append(rs, r), append(st, stamp)
		}
		if len(rs) > 0 {
			rkeys, rreqs, rstamps = append(rkeys, k), append(rreqs, rs), append(rstamps, st)
		}
	}
	if len(rreqs) == 0 {
		return
	}
	// A failed refund leaves units consumed until their keys expire: the
	// limiter under-admits for a while but never admits more than the limit.
	s.settle(ctx, rkeys, rreqs, rstamps)
}

func isNoScript(err error) bool {
	return err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT"))
}

// slot is the Redis Cluster hash slot of key: CRC16 (XMODEM) of the key, or
// of its hash tag (the part between the first '{' and the next '}' when that
// is not empty), modulo 16384.
func slot(key string) uint16 {
	if start := strings.IndexByte(key, '{'); start >= 0 {
		if end := strings.IndexByte(key[start+1:], '}'); end > 0 {
			key = key[start+1 : start+1+end]
		}
	}
	return crc16(key) & 16383
}

// crc16 is CRC-16/XMODEM (polynomial 0x1021, initial value 0), the checksum
// the Redis Cluster specification uses for key slots.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc = crc<<8 ^ crc16Table[byte(crc>>8)^s[i]]
	}
	return crc
}

var crc16Table = func() (t [256]uint16) {
	for i := range t {
		crc := uint16(i) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[i] = crc
	}
	return t
}()
