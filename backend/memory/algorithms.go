package memory

import (
	"math"
	"math/bits"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// The arithmetic of backend/ALGORITHMS.md, in integer microseconds. Each
// step function is pure: it reads a key's state, returns the state to write
// and the result, and reports whether the request was admitted (false only
// for an unforced c > 0 that does not fit, which writes nothing).
//
// Within the limits Request.Validate enforces, and for costs up to
// backend.MaxLimit, no intermediate value saturates, so the answers are
// exactly those of the document (and of the Redis backend). Beyond that
// (a huge forced cost) counts and debts saturate instead of wrapping around
// into admitting.

const (
	million = 1_000_000
	// satMax bounds saturating sums and products: two of them still add up
	// without overflowing an int64.
	satMax = 1 << 61
	// countMax bounds a window's count so that count*1e6 + count*1e6 fits.
	countMax = 1 << 40
	// debtHorizon is how far past now forced charges can push a GCRA key's
	// arrival time (ALGORITHMS.md): its ResetAfter always fits a Duration.
	debtHorizon = 1 << 52
)

func mulSat(a, b int64) int64 { // a, b >= 0
	// A 128-bit product instead of the usual a > max/b test: a division
	// costs as much as the rest of a decision.
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi != 0 || lo > satMax {
		return satMax
	}
	return int64(lo)
}

func addSat(a, b int64) int64 { return min(a+b, satMax) } // 0 <= a, b <= satMax

// neg returns -c for a negative c, without overflowing on MinInt64.
func neg(c int64) int64 {
	if c == math.MinInt64 {
		return math.MaxInt64
	}
	return -c
}

// addCount adds c (any sign) to a count in [0, countMax], clamped to it.
func addCount(n, c int64) int64 {
	switch {
	case c > countMax-n:
		return countMax
	case c < -n:
		return 0
	}
	return n + c
}

// windowStart is the start of the aligned window of length P holding now
// (floored, so that times before 1970 from a test clock work too).
func windowStart(now, P int64) int64 {
	m := now % P
	if m < 0 {
		m += P
	}
	return now - m
}

func micros(d time.Duration) int64 { return int64(d / time.Microsecond) }

func dur(us int64) time.Duration { return time.Duration(us) * time.Microsecond }

// gcraStep decides r on a GCRA key whose theoretical arrival time is tat
// (a tat at or before now means a full bucket). It returns the tat to
// store; a returned tat at or before now means the key is full again.
func gcraStep(r *backend.Request, now, tat int64, res *backend.Result) (int64, bool) {
	P, L, c := micros(r.Period), r.Limit, r.Cost
	B := r.Burst
	if B == 0 {
		B = L
	}
	T := (P + L - 1) / L
	tau := mulSat(T, B)
	t0 := max(tat, now)
	*res = backend.Result{Allowed: true, Limit: L}
	var nt int64
	switch {
	case c > 0:
		nt = addSat(t0, mulSat(c, T))
		if !r.Force && (c > B || nt-now > tau) {
			res.Allowed = false
			res.RetryAfter = dur(nt - now - tau)
			if c > B {
				res.RetryAfter = backend.Never
			}
			gcraAfter(res, now, t0, T, tau)
			return tat, false
		}
		nt = min(nt, now+debtHorizon)
	case c == 0:
		nt = t0
	default:
		nt = max(t0-mulSat(neg(c), T), now)
	}
	gcraAfter(res, now, nt, T, tau)
	return nt, true
}

// gcraAfter reports a GCRA key whose tat is nt (at or after now).
func gcraAfter(res *backend.Result, now, nt, T, tau int64) {
	res.Remaining = max(0, (tau-(nt-now))/T)
	res.ResetAfter = dur(nt - now)
	if res.Remaining == 0 {
		res.NextAfter = dur(nt + T - now - tau)
	}
}

// window is the state of a fixed window (a = count) or of a sliding window
// counter (a = previous window's count, b = current one's): start is the
// window's start and exp the time the key is back to full, in µs.
type window struct {
	start, exp, a, b int64
}

func windowExpiry(w *window) int64 { return w.exp }

// fixedStep decides r on a fixed-window key. A returned count of zero means
// the key is full again.
func fixedStep(r *backend.Request, now int64, st window, res *backend.Result) (window, bool) {
	P, L, c := micros(r.Period), r.Limit, r.Cost
	ws := windowStart(now, P)
	end := ws + P
	var count int64
	if st.start == ws {
		count = st.a
	}
	*res = backend.Result{Allowed: true, Limit: L}
	if c > 0 && !r.Force && c > L-count {
		res.Allowed = false
		res.RetryAfter = dur(end - now)
		if c > L {
			res.RetryAfter = backend.Never
		}
		fixedAfter(res, L, count, end-now)
		return st, false
	}
	count = addCount(count, c)
	fixedAfter(res, L, count, end-now)
	return window{start: ws, exp: end, a: count}, true
}

// fixedAfter reports a fixed window holding count units, left units of
// time before its end.
func fixedAfter(res *backend.Result, L, count, left int64) {
	res.Remaining = max(0, L-count)
	if count > 0 {
		res.ResetAfter = dur(left)
	}
	if res.Remaining == 0 {
		res.NextAfter = dur(left)
	}
}

// slidingStep decides r on a sliding-window-counter key. A returned state
// with both counts zero means the key is full again.
func slidingStep(r *backend.Request, now int64, st window, res *backend.Result) (window, bool) {
	P, L, c := micros(r.Period), r.Limit, r.Cost
	ws := windowStart(now, P)
	var prev, cur int64
	switch st.start {
	case ws:
		prev, cur = st.a, st.b
	case ws - P:
		prev = st.b
	}
	rem := ws + P - now
	Pm := P / 1000
	w := rem / 1000 * million / Pm
	*res = backend.Result{Allowed: true, Limit: L}
	if c > 0 && !r.Force && (c > L || prev*w+(cur+c)*million > L*million) {
		res.Allowed = false
		if c > L {
			res.RetryAfter = backend.Never
		} else {
			res.RetryAfter = dur(slidingRetry(L, P, Pm, rem, prev, cur, c))
		}
		slidingAfter(res, L, P, rem, prev, cur, w)
		return st, false
	}
	cur = addCount(cur, c)
	slidingAfter(res, L, P, rem, prev, cur, w)
	next := window{start: ws, exp: ws + P, a: prev, b: cur}
	if cur > 0 {
		next.exp = ws + 2*P
	}
	return next, true
}

// slidingRetry is the wait, in µs, before c units (at most L) fit a
// sliding window counter whose weighted use does not admit them now.
func slidingRetry(L, P, Pm, rem, prev, cur, c int64) int64 {
	if cur+c <= L {
		X := min(million, (L-cur-c)*million/prev)
		R := ((X+1)*Pm+million-1)/million - 1
		return rem - ((R+1)*1000 - 1)
	}
	X := min(million, (L-c)*million/cur)
	R := ((X+1)*Pm+million-1)/million - 1
	if R >= Pm {
		return rem
	}
	return rem + P - ((R+1)*1000 - 1)
}

func slidingAfter(res *backend.Result, L, P, rem, prev, cur, w int64) {
	res.Remaining = max(0, (L*million-(prev*w+cur*million))/million)
	switch {
	case cur > 0:
		res.ResetAfter = dur(rem + P)
	case prev > 0:
		res.ResetAfter = dur(rem)
	}
	if res.Remaining == 0 {
		res.NextAfter = dur(slidingRetry(L, P, P/1000, rem, prev, cur, 1))
	}
}

// rollBuckets is the rolling window's k: the period is cut into this many
// aligned buckets, and a unit stops counting at most a bucket (Period/k)
// later than a sliding log would let it go.
const rollBuckets = 16

// rollMax is where a bucket's count saturates (ALGORITHMS.md's Nmax).
const rollMax = 1<<32 - 1

// rolling is a rolling window's state: buckets w µs wide, n[i] the units of
// bucket last-k+i, oldest first. 88 bytes whatever the limit.
type rolling struct {
	w, last int64
	n       [rollBuckets + 1]uint32
}

// rollingExpiry is when every counted unit of st has left its window (the
// key is back to full), or 0 when st holds none.
func rollingExpiry(st *rolling) int64 {
	for h := rollBuckets; h >= 0; h-- {
		if st.n[h] > 0 {
			return (st.last + int64(h) + 1) * st.w
		}
	}
	return 0
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b < 0 {
		q--
	}
	return q
}

// rollingStep decides r on a rolling-window key. It returns the state to
// write; st itself for a peek or a rejection, which write nothing.
func rollingStep(r *backend.Request, now int64, st rolling, res *backend.Result) (rolling, bool) {
	P, L, c := micros(r.Period), r.Limit, r.Cost
	W := (P + rollBuckets - 1) / rollBuckets
	v := st
	if v.w != W {
		v = rolling{w: W}
	}
	b := max(floorDiv(now, W), v.last)
	switch d := b - v.last; {
	case d > rollBuckets:
		v.n = [rollBuckets + 1]uint32{}
	case d > 0:
		copy(v.n[:], v.n[d:])
		clear(v.n[rollBuckets+1-d:])
	}
	v.last = b
	var S int64
	for _, n := range v.n {
		S += int64(n)
	}
	*res = backend.Result{Allowed: true, Limit: L}
	if c > 0 && !r.Force && c > L-S {
		res.Allowed = false
		if c > L {
			res.RetryAfter = backend.Never
		} else {
			res.RetryAfter = dur(v.wait(S, L-c) - now)
		}
		v.after(res, S, L, now)
		return st, false
	}
	switch {
	case c > 0:
		top := &v.n[rollBuckets]
		*top = uint32(min(rollMax, int64(*top)+c))
	case c < 0:
		g := neg(c)
		for i := rollBuckets; i >= 0 && g > 0; i-- {
			t := min(g, int64(v.n[i]))
			v.n[i] -= uint32(t)
			g -= t
		}
	default:
		v.after(res, S, L, now)
		return st, true
	}
	S = 0
	for _, n := range v.n {
		S += int64(n)
	}
	v.after(res, S, L, now)
	return v, true
}

// wait is the instant at which the buckets of v newer than the ones that
// have left hold at most x units (x >= 0); S is v's total.
func (v *rolling) wait(S, x int64) int64 {
	var acc int64
	for i, n := range v.n {
		acc += int64(n)
		if S-acc <= x {
			return (v.last + int64(i) + 1) * v.w
		}
	}
	return (v.last + rollBuckets + 1) * v.w // unreachable for x >= 0
}

func (v *rolling) after(res *backend.Result, S, L, now int64) {
	res.Remaining = max(0, L-S)
	if S > 0 {
		res.ResetAfter = dur(rollingExpiry(v) - now)
	}
	if S >= L {
		res.NextAfter = dur(v.wait(S, L-1) - now)
	}
}
