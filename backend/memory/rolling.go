package memory

import (
	"math"

	"github.com/ceiling-go/ceiling/backend"
)

// The rolling window of ALGORITHMS.md (the default algorithm).
//
// A key's state is a ring of k+1 bucket counts and their sum, read and
// written where it is stored: nothing is shifted or copied. Counts are as
// wide as a key needs: a key lives in the narrowest tier (8, 16 or 32-bit
// counts) that holds its limit and its units, which keeps bytes per key
// low; a sum at the count type's maximum means "add the counts up".

const (
	// rollBuckets is ALGORITHMS.md's k: a unit stops counting at most
	// Period/k later than a sliding log would let it go.
	rollBuckets = 16
	rollSlots   = rollBuckets + 1
)

// rollCount is the type of a tier's counts and sum.
type rollCount interface{ uint8 | uint16 | uint32 }

// rollWidth is the type of a tier's bucket width.
type rollWidth interface{ uint32 | int64 }

// ring is a rolling window's state: buckets w µs wide, the newest being
// last, bucket x's units at n[x mod 17], s their sum. A zero ring is an
// absent state.
type ring[C rollCount, Wd rollWidth] struct {
	last int64
	w    Wd
	s    C
	n    [rollSlots]C
}

type (
	ring8  = ring[uint8, uint32]
	ring16 = ring[uint16, uint32]
	// ring32 is the widest tier's state, in which multi-request calls work.
	ring32 = ring[uint32, int64]
)

// ringSlot is the slot of bucket x.
func ringSlot(x int64) int {
	m := x % rollSlots
	if m < 0 {
		m += rollSlots
	}
	return int(m)
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b < 0 {
		q--
	}
	return q
}

// rollView is a state as a decision sees it: the buckets b-16 .. b, of
// which the oldest live ones are stored, and the units they hold.
type rollView struct {
	W, b int64
	live int // buckets b-16 .. b-17+live are stored, 0..17
	S    int64
}

// view is st as a request under period P sees it at now: ALGORITHMS.md's
// shift, moving nothing. A state of another bucket width reads as absent.
func (st *ring[C, Wd]) view(P, now int64) rollView {
	W := (P + rollBuckets - 1) / rollBuckets
	if int64(st.w) != W {
		return rollView{W: W, b: max(floorDiv(now, W), 0)}
	}
	v := rollView{W: W, b: max(floorDiv(now, W), st.last)}
	d := v.b - st.last
	if d > rollBuckets {
		return v
	}
	v.live = rollSlots - int(d)
	v.S = st.total()
	// Less the buckets that have left: last-16 .. b-17.
	for x, s := 0, ringSlot(st.last+1); x < int(d); x++ {
		v.S -= int64(st.n[s])
		if s++; s == rollSlots {
			s = 0
		}
	}
	return v
}

// rebased is st anchored at now when the clock is behind it: the buckets
// from now's on are added into now's, so no unit is forgotten and none
// counts past now's window. It reports false when the clock is not behind.
func (st *ring[C, Wd]) rebased(P, now int64) (ring[C, Wd], bool) {
	W := (P + rollBuckets - 1) / rollBuckets
	cur := floorDiv(now, W)
	if int64(st.w) != W || st.last <= cur {
		return ring[C, Wd]{}, false
	}
	out := ring[C, Wd]{last: cur, w: st.w}
	var merged, S int64
	for x := st.last - rollBuckets; x <= st.last; x++ {
		n := int64(st.n[ringSlot(x)])
		switch {
		case x >= cur:
			merged += n
		case x >= cur-rollBuckets:
			out.n[ringSlot(x)] = C(n)
			S += n
		}
	}
	merged = min(merged, int64(^C(0)))
	out.n[ringSlot(cur)] = C(merged)
	out.s = C(min(S+merged, int64(^C(0))))
	return out, true
}

// total is the units st holds as written.
func (st *ring[C, Wd]) total() int64 {
	if st.s != ^C(0) {
		return int64(st.s)
	}
	var S int64
	for _, n := range st.n {
		S += int64(n)
	}
	return S
}

// stored is the view of st as it was written: at its last bucket.
func (st *ring[C, Wd]) stored() rollView {
	return rollView{W: int64(st.w), b: st.last, live: rollSlots, S: st.total()}
}

// wait is the instant at which the buckets of v newer than the ones that
// have left hold at most x units (x >= 0); S is v's total.
func (st *ring[C, Wd]) wait(v *rollView, S, x int64) int64 {
	var acc int64
	s := ringSlot(v.b - rollBuckets)
	for j := range rollSlots {
		if j < v.live {
			acc += int64(st.n[s])
		}
		if S-acc <= x {
			return (v.b + int64(j) + 1) * v.W
		}
		if s++; s == rollSlots {
			s = 0
		}
	}
	return (v.b + rollSlots) * v.W // unreachable for x >= 0
}

// expiry is when every unit v sees has left its window (the key is back
// to full), or 0 when it sees none.
func (st *ring[C, Wd]) expiry(v *rollView) int64 {
	if v.live == 0 {
		return 0
	}
	s := ringSlot(v.b - rollBuckets + int64(v.live) - 1)
	for j := v.live - 1; j >= 0; j-- {
		if st.n[s] > 0 {
			return (v.b + int64(j) + 1) * v.W
		}
		if s == 0 {
			s = rollSlots
		}
		s--
	}
	return 0
}

// decide evaluates r on st at now without changing it, filling res unless
// r is admitted with a cost to write (see write and report).
func (st *ring[C, Wd]) decide(r *backend.Request, now int64, res *backend.Result) (rollView, bool) {
	L, c := r.Limit, r.Cost
	v := st.view(micros(r.Period), now)
	*res = backend.Result{Allowed: true, Limit: L}
	if c > 0 && !r.Force && c > L-v.S {
		res.Allowed = false
		if c > L {
			res.RetryAfter = backend.Never
		} else {
			res.RetryAfter = dur(st.wait(&v, v.S, L-c) - now)
		}
		st.report(&v, res, L, now)
		return v, false
	}
	if c == 0 {
		st.report(&v, res, L, now)
	}
	return v, true
}

// unitsAfter is the units v holds once an admitted cost c (with its
// stamp) is written, saturation aside.
func (st *ring[C, Wd]) unitsAfter(v *rollView, c, stamp int64) int64 {
	switch {
	case c > 0:
		return v.S + c
	case stamp == 0:
		return v.S - min(v.S, neg(c))
	}
	return v.S - min(neg(c), st.bucket(v, floorDiv(stamp, v.W)))
}

// bucket is the count v sees in bucket x: stored for the buckets b-16 ..
// b-17+live, zero for the others.
func (st *ring[C, Wd]) bucket(v *rollView, x int64) int64 {
	if x < v.b-rollBuckets || x > v.b-rollSlots+int64(v.live) {
		return 0
	}
	return int64(st.n[ringSlot(x)])
}

// write applies an admitted cost c != 0 (and a refund's stamp) to st as v
// sees it, in place; v then describes st as written. The caller has checked
// that st's tier holds the units after.
func (st *ring[C, Wd]) write(v *rollView, c, stamp int64) {
	switch {
	case v.live == 0:
		*st = ring[C, Wd]{last: v.b, w: Wd(v.W)}
	case v.b != st.last:
		for x := st.last + 1; x <= v.b; x++ {
			st.n[ringSlot(x)] = 0
		}
		st.last = v.b
	}
	v.live = rollSlots
	s := ringSlot(v.b)
	switch {
	case c > 0:
		top := &st.n[s]
		n := min(int64(*top)+c, int64(^C(0)))
		v.S += n - int64(*top)
		*top = C(n)
	case stamp != 0:
		// Only the stamp's bucket, while it still counts.
		if x := floorDiv(stamp, v.W); x >= v.b-rollBuckets && x <= v.b {
			n := &st.n[ringSlot(x)]
			t := min(neg(c), int64(*n))
			*n -= C(t)
			v.S -= t
		}
	default:
		for g := neg(c); g > 0 && v.S > 0; {
			t := min(g, int64(st.n[s]))
			st.n[s] -= C(t)
			g -= t
			v.S -= t
			if s == 0 {
				s = rollSlots
			}
			s--
		}
	}
	st.s = C(min(v.S, int64(^C(0))))
}

// report fills res's remaining, reset and next for a view holding v.S
// units under limit L.
func (st *ring[C, Wd]) report(v *rollView, res *backend.Result, L, now int64) {
	res.Remaining = max(0, L-v.S)
	if v.S > 0 {
		res.ResetAfter = dur(st.expiry(v) - now)
	}
	if v.S >= L {
		res.NextAfter = dur(st.wait(v, v.S, L-1) - now)
	}
}

// rollingStep decides r on an anchored copy of a key's state for
// decideMany, returning the state to write (a zero ring once it holds no
// unit); st itself for a peek or a rejection.
func rollingStep(r *backend.Request, now int64, st ring32, res *backend.Result) (ring32, bool) {
	v, ok := st.decide(r, now, res)
	if !ok || r.Cost == 0 {
		return st, ok
	}
	st.write(&v, r.Cost, r.Stamp)
	st.report(&v, res, r.Limit, now)
	if r.Cost > 0 {
		res.Stamp = v.b * v.W
	}
	if v.S == 0 {
		return ring32{}, true
	}
	return st, true
}

func ringExpiry[C rollCount, Wd rollWidth](st *ring[C, Wd]) int64 {
	v := st.stored()
	return st.expiry(&v)
}

func ringUnits[C rollCount, Wd rollWidth](st *ring[C, Wd]) int64 { return st.total() }

// wide is st in the 32-bit tier's layout.
func (st *ring[C, Wd]) wide() ring32 {
	w := ring32{last: st.last, w: int64(st.w), s: uint32(st.s)}
	for i, n := range st.n {
		w.n[i] = uint32(n)
	}
	return w
}

// narrow is w in a narrow tier that holds w's units and width.
func narrow[C uint8 | uint16](w *ring32) ring[C, uint32] {
	st := ring[C, uint32]{last: w.last, w: uint32(w.w), s: C(w.s)}
	for i, n := range w.n {
		st.n[i] = C(n)
	}
	return st
}

// rollTier names the tables of a shard's rolling windows.
type rollTier uint8

const (
	tier8 rollTier = iota
	tier16
	tier32
)

// tierFor is the narrowest tier that holds units and a bucket width W.
func tierFor(units, W int64) rollTier {
	switch {
	case W > math.MaxUint32:
		return tier32
	case units < math.MaxUint8:
		return tier8
	case units < math.MaxUint16:
		return tier16
	}
	return tier32
}

// tierOf is the tier a request's key is kept in unless forced charges
// moved it.
func tierOf(r *backend.Request) rollTier {
	return tierFor(r.Limit, (micros(r.Period)+rollBuckets-1)/rollBuckets)
}

// rollTables are a shard's rolling windows, one table per tier; a key is
// in one of them at most.
type rollTables struct {
	t8  table[ring8]
	t16 table[ring16]
	t32 table[ring32]
}

func (rt *rollTables) len() int { return rt.t8.n + rt.t16.n + rt.t32.n }

func (rt *rollTables) findIn(t rollTier, h keyHash) int {
	switch t {
	case tier8:
		return rt.t8.find(h)
	case tier16:
		return rt.t16.find(h)
	}
	return rt.t32.find(h)
}

// find returns the tier holding h and its slot, looking first in pref;
// pref and -1 when no tier holds it.
func (rt *rollTables) find(h keyHash, pref rollTier) (rollTier, int) {
	if i := rt.findIn(pref, h); i >= 0 {
		return pref, i
	}
	for t := tier8; t <= tier32; t++ {
		if t == pref {
			continue
		}
		if i := rt.findIn(t, h); i >= 0 {
			return t, i
		}
	}
	return pref, -1
}

// load returns the state at slot i of tier t, widened.
func (rt *rollTables) load(t rollTier, i int) ring32 {
	switch t {
	case tier8:
		return rt.t8.slots[i].v.wide()
	case tier16:
		return rt.t16.slots[i].v.wide()
	}
	return rt.t32.slots[i].v
}

// set stores w at slot i of tier t, whose counts hold w's units.
func (rt *rollTables) set(t rollTier, i int, w *ring32) {
	switch t {
	case tier8:
		rt.t8.slots[i].v = narrow[uint8](w)
	case tier16:
		rt.t16.slots[i].v = narrow[uint16](w)
	default:
		rt.t32.slots[i].v = *w
	}
}

// insert adds h, absent from every tier, to tier t with state w.
func (rt *rollTables) insert(h keyHash, t rollTier, w *ring32) {
	switch t {
	case tier8:
		rt.t8.insert(h, narrow[uint8](w))
	case tier16:
		rt.t16.insert(h, narrow[uint16](w))
	default:
		rt.t32.insert(h, *w)
	}
}

func (rt *rollTables) deleteAt(t rollTier, i int) {
	switch t {
	case tier8:
		rt.t8.deleteAt(i)
	case tier16:
		rt.t16.deleteAt(i)
	default:
		rt.t32.deleteAt(i)
	}
}

// sweep sweeps every tier (see table.sweep).
func (rt *rollTables) sweep(now int64) (removed int, next int64) {
	a, an := rt.t8.sweep(now, ringExpiry[uint8, uint32])
	b, bn := rt.t16.sweep(now, ringExpiry[uint16, uint32])
	c, cn := rt.t32.sweep(now, ringExpiry[uint32, int64])
	return a + b + c, min(an, bn, cn)
}

// decideRolling is decideOne's rolling window: the state is read and
// written where it is stored.
func (s *Store) decideRolling(sh *shard, h keyHash, r *backend.Request, now int64, out *backend.Result) {
	rt := &sh.rolls
	t, i := rt.find(h, tierOf(r))
	switch t {
	case tier8:
		rollOne(s, sh, &rt.t8, t, h, i, r, now, out)
	case tier16:
		rollOne(s, sh, &rt.t16, t, h, i, r, now, out)
	default:
		rollOne(s, sh, &rt.t32, t, h, i, r, now, out)
	}
}

// rollOne decides r on the key h, at slot i (-1: absent) of tier table tb.
func rollOne[C rollCount, Wd rollWidth](s *Store, sh *shard, tb *table[ring[C, Wd]], t rollTier, h keyHash, i int, r *backend.Request, now int64, out *backend.Result) {
	var absent ring[C, Wd]
	st := &absent
	if i >= 0 {
		st = &tb.slots[i].v
		if m, ok := st.rebased(micros(r.Period), now); ok {
			*st = m // the clock is behind: anchored, and written so
		}
	}
	v, ok := st.decide(r, now, out)
	c := r.Cost
	if !ok || c == 0 {
		return
	}
	if c > 0 {
		out.Stamp = v.b * v.W
	}
	switch S := st.unitsAfter(&v, c, r.Stamp); {
	case S == 0:
		// Refunded to empty: the key is back to full.
		out.Remaining = r.Limit
		if i >= 0 {
			tb.deleteAt(i)
		}
		return
	case tierFor(max(r.Limit, S), v.W) != t:
		w := st.wide()
		w.write(&v, c, r.Stamp)
		w.report(&v, out, r.Limit, now)
		s.putRolling(sh, h, t, i, r, &w, now)
		return
	}
	st.write(&v, c, r.Stamp)
	st.report(&v, out, r.Limit, now)
	exp := (v.b + rollSlots) * v.W // an admission: bucket b holds units
	if c < 0 {
		exp = st.expiry(&v)
	}
	if i < 0 {
		s.makeRoom(sh, h, r, now)
		tb.insert(h, *st)
	}
	sh.minExp = min(sh.minExp, exp)
}

// putRolling stores w for key h, found at slot i (-1: absent) of tier t,
// in the tier it needs, or deletes the key when w holds no unit. It reports
// whether it inserted or deleted.
func (s *Store) putRolling(sh *shard, h keyHash, t rollTier, i int, r *backend.Request, w *ring32, now int64) bool {
	v := w.stored()
	rt := &sh.rolls
	to := tierFor(max(r.Limit, v.S), v.W)
	switch {
	case v.S == 0 && i < 0:
		return false
	case v.S == 0:
		rt.deleteAt(t, i)
		return true
	case i >= 0 && to == t:
		rt.set(t, i, w)
		sh.minExp = min(sh.minExp, w.expiry(&v))
		return false
	case i >= 0:
		rt.deleteAt(t, i) // the key moves: the shard's count is unchanged
	default:
		s.makeRoom(sh, h, r, now)
	}
	rt.insert(h, to, w)
	sh.minExp = min(sh.minExp, w.expiry(&v))
	return true
}
