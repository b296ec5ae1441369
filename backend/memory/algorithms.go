package memory

import (
	"math"
	"math/bits"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// The arithmetic of backend/ALGORITHMS.md, in integer microseconds. Each
// step function is pure: it reads a key's state and returns the state to
// write, the result, and whether the request was admitted. Within the
// bounds Request.Validate enforces nothing saturates, so the answers are
// the document's; beyond them (a huge forced cost) counts and debts
// saturate rather than wrap into admitting.

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

// gcraState is a GCRA key's state: its theoretical arrival time, the now
// of its write, and the emission interval it was written under, so that a
// request under another limit reads the debt as units (zero: absent).
type gcraState struct{ tat, at, t int64 }

// gcraStep decides r on a GCRA key whose state is st (a tat at or before
// now means a full bucket). It returns the state to store; a returned tat
// at or before now means the key is full again.
func gcraStep(r *backend.Request, now int64, st gcraState, res *backend.Result) (gcraState, bool) {
	P, L, c := micros(r.Period), r.Limit, r.Cost
	tat := st.tat // anchored (anchorGCRA): st.at <= now
	B := r.Burst
	if B == 0 {
		B = L
	}
	T := (P + L - 1) / L
	tau := mulSat(T, B)
	if st.t != 0 && st.t != T && tat > now {
		return gcraOtherRate(r, now, st, B, T, tau, res)
	}
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
			return st, false
		}
		nt = min(nt, now+debtHorizon)
		res.Stamp = nt
	case c == 0:
		nt = t0
	case r.Stamp == 0:
		nt = max(t0-mulSat(neg(c), T), now)
	default:
		// Only the part of the stamped admission still outstanding.
		nt = max(t0-min(mulSat(neg(c), T), max(0, r.Stamp-now)), now)
	}
	gcraAfter(res, now, nt, T, tau)
	return gcraState{tat: nt, at: now, t: T}, true
}

// gcraOtherRate decides r on a GCRA state written under another emission
// interval (ALGORITHMS.md, "another rate"): its u units leave at their own
// rate, r is decided on them under its burst, and a write stores them at
// r's rate.
func gcraOtherRate(r *backend.Request, now int64, st gcraState, B, T, tau int64, res *backend.Result) (gcraState, bool) {
	d, Ts, c := st.tat-now, st.t, r.Cost
	u := (d + Ts - 1) / Ts
	*res = backend.Result{Allowed: true, Limit: r.Limit}
	held := func() {
		res.Remaining = max(0, B-u)
		res.ResetAfter = dur(d)
		if res.Remaining == 0 {
			res.NextAfter = dur(d - (B-1)*Ts) // u >= B: no overflow
		}
	}
	switch {
	case c > 0 && !r.Force && (c > B || u+c > B):
		res.Allowed = false
		res.RetryAfter = backend.Never
		if c <= B {
			res.RetryAfter = dur(d - (B-c)*Ts) // B - c < u: no overflow
		}
		held()
		return st, false
	case c == 0:
		held()
		return st, true
	}
	n := u // a stamped refund: the stamp is of another rate's scale, nothing comes back
	switch {
	case c > 0:
		n = addSat(u, c)
	case r.Stamp == 0:
		n = u - min(neg(c), u)
	}
	nt := now + min(mulSat(n, T), debtHorizon)
	if c > 0 {
		res.Stamp = nt
	}
	gcraAfter(res, now, nt, T, tau)
	return gcraState{tat: nt, at: now, t: T}, true
}

// gcraAfter reports a GCRA key whose tat is nt (at or after now).
func gcraAfter(res *backend.Result, now, nt, T, tau int64) {
	res.Remaining = max(0, (tau-(nt-now))/T)
	res.ResetAfter = dur(nt - now)
	if res.Remaining == 0 {
		res.NextAfter = dur((nt - now) - (tau - T))
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
	switch {
	case c > 0:
		res.Stamp = now
	case c < 0 && r.Stamp != 0 && windowStart(r.Stamp, P) != ws:
		c = 0 // the stamp's window is over: its units no longer count
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
	switch {
	case c > 0:
		res.Stamp = now
	case c < 0 && r.Stamp != 0:
		switch windowStart(r.Stamp, P) {
		case ws:
			cur -= min(neg(c), cur)
		case ws - P:
			prev -= min(neg(c), prev)
		}
		c = 0
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
