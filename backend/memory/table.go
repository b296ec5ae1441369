package memory

import "math"

// keyHash is a key's 128-bit digest under the Store's secret seeds, stored
// instead of the key: fixed size, nothing for the collector to scan, and no
// collision to aim at. a has its low bit set (a zero a is an empty slot); b
// picks the shard (high bits) and the slot (low 32 bits).
type keyHash struct{ a, b uint64 }

// slot is one entry of a table: the key's digest and its state.
type slot[V any] struct {
	a, b uint64
	v    V
}

// table is an open-addressing hash table with linear probing, keyed by
// keyHash. Unlike a Go map it shrinks when it empties, so evicted keys give
// their memory back. It doubles past maxLoadNum/maxLoadDen full, but never
// past the slots its shard's key bound needs (most): a home slot is the
// digest scaled to the size, not masked, so the last growth can stop short
// of a power of two. The zero value is an empty, unbounded table; its
// shard's mutex guards it.
type table[V any] struct {
	slots []slot[V]
	n     int
	most  int // the most slots growth goes to (0: no bound); see slotsFor
}

const (
	minSlots   = 8
	maxLoadNum = 4 // grow beyond 4/5 full
	maxLoadDen = 5
)

// slotsFor is the table size that holds n keys at the most load.
func slotsFor(n int) int { return max(minSlots, (n*maxLoadDen+maxLoadNum-1)/maxLoadNum) }

// home is the slot where a key whose digest's b is b starts its probe in a
// table of size slots.
func home(b uint64, size int) int { return int(uint64(uint32(b)) * uint64(size) >> 32) }

// find returns the index of h's slot, or -1.
func (t *table[V]) find(h keyHash) int {
	if t.n == 0 {
		return -1
	}
	for i := home(h.b, len(t.slots)); ; {
		s := &t.slots[i]
		if s.a == h.a && s.b == h.b {
			return i
		}
		if s.a == 0 {
			return -1
		}
		if i++; i == len(t.slots) {
			i = 0
		}
	}
}

// insert adds h, which must be absent, with state v, growing the table when
// it would be too full, and returns the new slot's index.
func (t *table[V]) insert(h keyHash, v V) int {
	if (t.n+1)*maxLoadDen > len(t.slots)*maxLoadNum {
		size := max(minSlots, 2*len(t.slots))
		if t.most > len(t.slots) && size > t.most {
			size = t.most
		}
		t.resize(max(size, slotsFor(t.n+1)))
	}
	t.n++
	return t.place(h, v)
}

// place puts h in its first free slot; the caller accounts for t.n.
func (t *table[V]) place(h keyHash, v V) int {
	i := home(h.b, len(t.slots))
	for t.slots[i].a != 0 {
		if i++; i == len(t.slots) {
			i = 0
		}
	}
	t.slots[i] = slot[V]{a: h.a, b: h.b, v: v}
	return i
}

// resize rebuilds the table with size slots (enough to hold n). A size of
// zero releases the slots altogether.
func (t *table[V]) resize(size int) {
	old := t.slots
	if size == 0 {
		t.slots = nil
		return
	}
	t.slots = make([]slot[V], size)
	for i := range old {
		if old[i].a != 0 {
			t.place(keyHash{old[i].a, old[i].b}, old[i].v)
		}
	}
}

// deleteAt empties slot i by shifting the following entries of its probe
// run back (no tombstones, so lookups never slow down with churn).
func (t *table[V]) deleteAt(i int) {
	size := len(t.slots)
	// dist is how far slot j is past slot from on a probe path.
	dist := func(from, j int) int {
		if d := j - from; d >= 0 {
			return d
		}
		return j - from + size
	}
	gap := i
	for j := gap + 1; ; j++ {
		if j == size {
			j = 0
		}
		if t.slots[j].a == 0 {
			break
		}
		// The entry at j may fill the gap if its home slot is not after
		// the gap on its probe path.
		if dist(home(t.slots[j].b, size), j) >= dist(gap, j) {
			t.slots[gap] = t.slots[j]
			gap = j
		}
	}
	var zero slot[V]
	t.slots[gap] = zero
	t.n--
}

// sweep deletes every entry back to full at now and shrinks the table,
// returning how many it deleted and the earliest expiry left.
func (t *table[V]) sweep(now int64, expiry func(*V) int64) (removed int, next int64) {
	next = math.MaxInt64
	for i := 0; i < len(t.slots); {
		s := &t.slots[i]
		if s.a == 0 {
			i++
			continue
		}
		e := expiry(&s.v)
		if e <= now {
			// deleteAt may shift a later entry into i: look at i again.
			t.deleteAt(i)
			removed++
			continue
		}
		next = min(next, e)
		i++
	}
	t.shrink()
	return removed, next
}

// shrink rebuilds the table at about half load once it is under a fifth
// full (growth is at four fifths: no oscillation), and drops empty slots.
func (t *table[V]) shrink() {
	switch {
	case t.n == 0 && t.slots != nil:
		t.resize(0)
	case len(t.slots) > minSlots && t.n*5 < len(t.slots):
		size := minSlots
		for size < 2*t.n {
			size *= 2
		}
		t.resize(size)
	}
}

// sample looks at up to n occupied slots from start on and returns the one
// whose eviction gives back the fewest units (the soonest back to full
// among equals), with its units and expiry; best is -1 for an empty table.
// units (nil: rank by expiry, GCRA's arrival time) is asked only of a
// state that could beat the best so far.
func (t *table[V]) sample(start uint64, n int, now int64, expiry func(*V) int64, units func(*V) int64) (best int, bestUnits, bestExp int64) {
	best = -1
	if t.n == 0 {
		return best, 0, 0
	}
	seen := 0
	for k, i := 0, home(start, len(t.slots)); k < len(t.slots) && seen < n; k, i = k+1, i+1 {
		if i == len(t.slots) {
			i = 0
		}
		s := &t.slots[i]
		if s.a == 0 {
			continue
		}
		seen++
		e := expiry(&s.v)
		var u int64
		if e > now {
			if best >= 0 && (bestUnits == 0 || (bestUnits == 1 && e >= bestExp)) {
				continue // holds at least one unit: cannot beat the best
			}
			u = e
			if units != nil {
				u = units(&s.v)
			}
		}
		if best < 0 || u < bestUnits || (u == bestUnits && e < bestExp) {
			best, bestUnits, bestExp = int(i), u, e
		}
	}
	return best, bestUnits, bestExp
}
