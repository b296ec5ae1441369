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
			res.Remaining = max(0, (tau-(t0-now))/T)
			res.ResetAfter = dur(t0 - now)
			return tat, false
		}
	case c == 0:
		nt = t0
	default:
		nt = max(t0-mulSat(neg(c), T), now)
	}
	res.Remaining = max(0, (tau-(nt-now))/T)
	res.ResetAfter = dur(nt - now)
	return nt, true
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
		res.Remaining = max(0, L-count)
		if count > 0 {
			res.ResetAfter = dur(end - now)
		}
		return st, false
	}
	count = addCount(count, c)
	res.Remaining = max(0, L-count)
	if count > 0 {
		res.ResetAfter = dur(end - now)
	}
	return window{start: ws, exp: end, a: count}, true
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
		switch {
		case c > L:
			res.RetryAfter = backend.Never
		case cur+c <= L:
			X := min(million, (L-cur-c)*million/prev)
			R := ((X+1)*Pm+million-1)/million - 1
			res.RetryAfter = dur(rem - ((R+1)*1000 - 1))
		default:
			X := min(million, (L-c)*million/cur)
			R := ((X+1)*Pm+million-1)/million - 1
			if R >= Pm {
				res.RetryAfter = dur(rem)
			} else {
				res.RetryAfter = dur(rem + P - ((R+1)*1000 - 1))
			}
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

func slidingAfter(res *backend.Result, L, P, rem, prev, cur, w int64) {
	res.Remaining = max(0, (L*million-(prev*w+cur*million))/million)
	switch {
	case cur > 0:
		res.ResetAfter = dur(rem + P)
	case prev > 0:
		res.ResetAfter = dur(rem)
	}
}

// run is c units of a sliding log admitted at the same instant t: the log
// stores runs, so a cost of c takes one entry, not c.
type run struct{ t, n int64 }

// logState is a sliding log: its runs, oldest first, and the time its
// newest unit leaves the window (the key is then full again).
type logState struct {
	exp  int64
	runs []run
}

func logExpiry(l *logState) int64 { return l.exp }

// logView is a sliding log as a decision sees it, without copying: the
// stored runs minus the expired ones, minus units refunded from the newest
// end, plus units added at now. Several requests on one key in one call
// each update the view; only the last one's is written back.
type logView struct {
	base   []run // the stored runs, expired ones included
	drop   int   // leading runs of base that have expired
	k      int64 // units in base[drop:]
	remove int64 // newest units of base[drop:] taken back
	add    int64 // units added at now
}

func newLogView(st *logState, now, P int64) logView {
	v := logView{base: st.runs}
	for v.drop < len(st.runs) && st.runs[v.drop].t+P <= now {
		v.drop++
	}
	for _, r := range st.runs[v.drop:] {
		v.k += r.n
	}
	return v
}

func (v *logView) count() int64 { return v.k - v.remove + v.add }

// unit returns the time of the i-th oldest unit (0-based).
func (v *logView) unit(i, now int64) int64 {
	if i < v.k-v.remove {
		for _, r := range v.base[v.drop:] {
			if i < r.n {
				return r.t
			}
			i -= r.n
		}
	}
	return now
}

func (v *logView) newest(now int64) int64 {
	if v.add > 0 {
		return now
	}
	return v.unit(v.k-v.remove-1, now)
}

// logStep decides r on a sliding log, updating the view.
func logStep(r *backend.Request, now int64, v *logView, res *backend.Result) bool {
	P, L, c := micros(r.Period), r.Limit, r.Cost
	k := v.count()
	*res = backend.Result{Allowed: true, Limit: L}
	if c > 0 && !r.Force && c > L-k {
		res.Allowed = false
		if c > L {
			res.RetryAfter = backend.Never
		} else {
			res.RetryAfter = dur(v.unit(k+c-L-1, now) + P - now)
		}
		logAfter(res, L, P, now, k, v)
		return false
	}
	switch {
	case c > 0:
		v.add = addCount(v.add, c)
	case c < 0:
		g := min(neg(c), k)
		if g <= v.add {
			v.add -= g
		} else {
			v.remove += g - v.add
			v.add = 0
		}
	}
	logAfter(res, L, P, now, v.count(), v)
	return true
}

func logAfter(res *backend.Result, L, P, now, k int64, v *logView) {
	res.Remaining = max(0, L-k)
	if k > 0 {
		res.ResetAfter = dur(v.newest(now) + P - now)
	}
}

// commit writes the view into st, reusing the stored runs' memory. It
// reports false when the log is empty (the key is full again).
func (v *logView) commit(st *logState, now, P int64) bool {
	runs := v.base
	if v.drop > 0 {
		runs = runs[:copy(runs, runs[v.drop:])]
	}
	for rm := v.remove; rm > 0 && len(runs) > 0; {
		last := &runs[len(runs)-1]
		if last.n > rm {
			last.n -= rm
			break
		}
		rm -= last.n
		runs = runs[:len(runs)-1]
	}
	if v.add > 0 {
		if n := len(runs); n > 0 && runs[n-1].t == now {
			runs[n-1].n = addCount(runs[n-1].n, v.add)
		} else {
			runs = append(runs, run{t: now, n: v.add})
		}
	}
	if cap(runs) > 16 && cap(runs) > 4*len(runs) {
		// A burst grew the log; most of it has expired: give the memory back.
		runs = append(make([]run, 0, 2*len(runs)), runs...)
	}
	st.runs = runs
	if len(runs) == 0 {
		st.runs, st.exp = nil, 0
		return false
	}
	st.exp = runs[len(runs)-1].t + P
	return true
}
