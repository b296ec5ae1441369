package memory

import (
	"context"
	"log/slog"
	"math"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// The units a live key holds in its open window: what evicting it gives
// back to its caller (a key back to full, at rest, holds none).

func windowUnits(w *window) int64 { return w.a + w.b }

// logUnits is the units a sliding log's runs hold, kept in its slot: reading
// the runs would cost a cache miss per sampled key.
func logUnits(l *logState) int64 { return l.k }

// leaseUnits is the units a Concurrency key's leases hold.
func leaseUnits(st **leaseSet) int64 { return (*st).count }

// evictionSample is how many keys of each table a full shard compares
// before evicting one.
const evictionSample = 8

// pressureSweepEvery is the least time (µs) between two sweeps of one full
// shard by makeRoom: a flood of fresh keys cannot make every insertion pay
// for a scan of the shard.
const pressureSweepEvery = 1000

// evictionQuiet is how long (µs) without an eviction of spent units ends a
// burst of them: each burst is logged once, when it starts.
const evictionQuiet = int64(time.Minute / time.Microsecond)

// makeRoom frees a slot in a shard at its bound before h is inserted,
// evicting the key whose removal gives back the least quota: one at rest
// (sampled, or found by sweeping the shard), else the sampled key holding
// the fewest units, so a flood of fresh keys evicts its own kind. An
// eviction that gives units back is counted and logged once per burst.
func (s *Store) makeRoom(sh *shard, h keyHash, r *backend.Request, now int64) {
	if sh.keys() < sh.maxKeys {
		return
	}
	start := h.a >> 1
	// Live GCRA keys rank by arrival time (the least debt); the debt
	// becomes units, at r's emission interval, only to compare it with
	// another table's candidate.
	gi, gu, ge := sh.gcra.sample(start, evictionSample, now, gcraExpiry, nil)
	wi, wu, we := sh.windows.sample(start, evictionSample, now, windowExpiry, windowUnits)
	li, lu, le := sh.logs.sample(start, evictionSample, now, logExpiry, logUnits)
	r8i, r8u, r8e := sh.rolls.t8.sample(start, evictionSample, now, ringExpiry[uint8, uint32], ringUnits[uint8, uint32])
	r16i, r16u, r16e := sh.rolls.t16.sample(start, evictionSample, now, ringExpiry[uint16, uint32], ringUnits[uint16, uint32])
	r32i, r32u, r32e := sh.rolls.t32.sample(start, evictionSample, now, ringExpiry[uint32, int64], ringUnits[uint32, int64])
	ci, cu, ce := sh.leases.sample(start, evictionSample, now, leaseExpiry, leaseUnits)
	if gu > 0 {
		gu -= now // the debt: tat - now
	}
	if gi >= 0 && gu > 0 && (wi >= 0 || li >= 0 || r8i >= 0 || r16i >= 0 || r32i >= 0 || ci >= 0) {
		T := (micros(r.Period) + r.Limit - 1) / r.Limit
		gu = (gu + T - 1) / T
	}
	// The candidates in table order (the rolling tiers, narrowest first),
	// ties going to the earlier table.
	cands := [...]struct {
		i    int
		u, e int64
	}{{gi, gu, ge}, {wi, wu, we}, {li, lu, le}, {r8i, r8u, r8e}, {r16i, r16u, r16e}, {r32i, r32u, r32e}, {ci, cu, ce}}
	best, units, exp := -1, int64(math.MaxInt64), int64(math.MaxInt64)
	for k, c := range cands {
		if c.i >= 0 && (best < 0 || c.u < units || (c.u == units && c.e < exp)) {
			best, units, exp = k, c.u, c.e
		}
	}
	if units > 0 && now >= sh.minExp && now-sh.pressureSweep >= pressureSweepEvery {
		sh.pressureSweep = now
		if sh.sweep(now) > 0 {
			return
		}
	}
	switch best {
	case 0:
		sh.gcra.deleteAt(gi)
	case 1:
		sh.windows.deleteAt(wi)
	case 2:
		sh.logs.deleteAt(li)
	case 3, 4, 5:
		sh.rolls.deleteAt(tier8+rollTier(best-3), cands[best].i)
	case 6:
		sh.leases.deleteAt(ci)
	default:
		return
	}
	if units > 0 {
		s.evicted(now)
	}
}

// evicted counts an eviction that gave units back and logs the first of a
// burst. The last eviction's instant is kept to the second, so most
// evictions only read it.
func (s *Store) evicted(now int64) {
	n := s.evictions.Add(1)
	last := s.lastEviction.Load()
	if n > 1 && now-last < int64(time.Second/time.Microsecond) {
		return
	}
	if !s.lastEviction.CompareAndSwap(last, now) || (n > 1 && now-last < evictionQuiet) {
		return
	}
	logger := s.logger
	if logger == nil {
		logger = slog.Default()
	}
	logger.LogAttrs(context.Background(), slog.LevelWarn,
		"ceiling/memory: the key bound is full of keys holding spent units; evicting them gives their callers quota back (raise memory.WithMaxKeys, or key the rule on something a client cannot mint)",
		slog.Int("max_keys", s.maxKeys), slog.Uint64("evictions_total", n))
}
