// Package model is a reference implementation of backend/ALGORITHMS.md,
// written from the document alone and for nothing but clarity: a map of
// key states, each algorithm's definition transcribed line by line in
// checked integer arithmetic (an overflow panics instead of wrapping, and
// products that can exceed int64 are computed with math/big).
//
// It is the oracle of the randomized differential test in package
// backendtest, which drives a backend and a [Model] with the same
// operations and requires the same answers, field by field. It is not a
// backend: it is slow, unbounded and not safe for concurrent use.
package model

import (
	"fmt"
	"math/big"
	"slices"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// DebtHorizon is how far past now, in µs, a GCRA key's theoretical
// arrival time can be pushed by forced charges: 2^52 µs, about 142 years.
// Beyond it a forced charge saturates, as ALGORITHMS.md says.
const DebtHorizon int64 = 1 << 52

// CountMax is where a window's count saturates (ALGORITHMS.md).
const CountMax int64 = 1 << 40

// Run is n units of a sliding log admitted at instant T (µs).
type Run struct{ T, N int64 }

// State is what a key holds after the last write to it: the value of
// ALGORITHMS.md's "state" for the key's algorithm.
type State struct {
	Algorithm backend.Algorithm
	// TAT is GCRA's theoretical arrival time, µs, and T the emission
	// interval it was written under (µs per unit).
	TAT, T int64
	// Start is a window's start, µs (fixed window and sliding window).
	Start int64
	// Count is a fixed window's count; Prev and Cur a sliding window's.
	Count, Prev, Cur int64
	// Log is a sliding log's units, oldest first, as runs of units at one
	// instant (adjacent runs have distinct instants).
	Log []Run
	// W, Last and Buckets are a rolling window's bucket width (µs), newest
	// bucket, and the units of buckets Last-16 .. Last, oldest first.
	W, Last int64
	Buckets []int64
	// Leases are a Concurrency key's leases, in insertion order.
	Leases []Lease
	// Written is when the key was last written, µs, and Expires when its
	// state is back to full (ALGORITHMS.md: the TTL is set to it).
	Written, Expires int64
}

// TTL is the time to live a backend with expiring keys (Redis) gives the
// key at its last write: Expires - Written rounded up to whole ms, at least
// 1 ms.
func (s State) TTL() time.Duration {
	ms := (s.Expires - s.Written + 999) / 1000
	return time.Duration(max(1, ms)) * time.Millisecond
}

func (s State) clone() *State {
	s.Log = slices.Clone(s.Log)
	s.Buckets = slices.Clone(s.Buckets)
	s.Leases = slices.Clone(s.Leases)
	return &s
}

// Model is the reference store. The zero value is not usable: call [New].
type Model struct {
	keys    map[string]*State
	settled map[settled]onceMark         // reservations' tickets and forced charges' records
	deny    *denyCache                   // nil: no deny cache
	split   func([]backend.Request) bool // nil: no call is split
}

// Option configures a Model.
type Option func(*Model)

// WithDenyCache makes the model answer as a backend with the Redis deny
// cache does (see backend/redis.WithDenyCache): a key rejected until T is
// rejected locally until T for the same cost.
func WithDenyCache() Option {
	return func(m *Model) { m.deny = &denyCache{entries: map[string]denial{}} }
}

// WithSplit says which calls the backend splits across Redis Cluster hash
// slots: the deny cache learns no rejection of such a call (a slot may
// reject against units another slot's undo gives back at once).
func WithSplit(split func([]backend.Request) bool) Option {
	return func(m *Model) { m.split = split }
}

// New returns an empty model.
func New(opts ...Option) *Model {
	m := &Model{keys: map[string]*State{}, settled: map[settled]onceMark{}}
	for _, o := range opts {
		o(m)
	}
	return m
}

// Stored returns the state key holds and whether it holds any (a key whose
// state went back to full at its last write holds none).
func (m *Model) Stored(key string) (State, bool) {
	s, ok := m.keys[key]
	if !ok {
		return State{}, false
	}
	return *s.clone(), true
}

// Reset forgets keys.
func (m *Model) Reset(keys ...string) {
	for _, k := range keys {
		delete(m.keys, k)
	}
	if m.deny != nil {
		m.deny.forget(keys)
	}
}

// Decide decides reqs at now (µs since the Unix epoch) as a backend's
// Decide call does, and applies its writes. An invalid request makes the
// whole call fail with an error wrapping [backend.ErrInvalidRequest], and
// nothing changes.
func (m *Model) Decide(now int64, reqs []backend.Request) ([]backend.Result, error) {
	for i, r := range reqs {
		if err := r.Validate(); err != nil {
			return nil, fmt.Errorf("model: request %d: %w", i, err)
		}
	}
	if m.deny != nil {
		if res, ok := m.deny.answer(now, reqs); ok {
			return res, nil
		}
	}
	sent := reqs // what the deny cache learns from: it cannot tell a repeat
	reqs, marks := m.repeats(now, reqs)
	for _, r := range reqs {
		if s, ok := m.keys[r.Key]; ok && s.Algorithm == r.Algorithm {
			switch a := anchor(s, r, now); {
			case a == s:
			case a.Expires <= now:
				delete(m.keys, r.Key) // back to full
			default:
				m.keys[r.Key] = a
			}
		}
	}
	res, rejected, writes := m.evaluate(now, reqs)
	if !rejected {
		for key, s := range writes {
			if s == nil {
				delete(m.keys, key)
			} else if s.Expires <= now {
				delete(m.keys, key)
			} else {
				m.keys[key] = s
			}
		}
	}
	if !rejected {
		for i, r := range reqs {
			if r.Once != 0 && r.Cost > 0 && !r.Force && res[i].Allowed {
				marks[settled{r.Key, r.Once}] = onceMark{now + backend.TicketKept(r.Period).Microseconds(), true}
			}
		}
		for k, e := range marks {
			if e.until == 0 {
				delete(m.settled, k)
			} else {
				m.settled[k] = e
			}
		}
	}
	if m.deny != nil {
		m.deny.learn(now, sent, res, rejected && (m.split == nil || !m.split(reqs)))
	}
	return res, nil
}

// settled names a reservation's ticket or a forced charge's record: its
// key and Once.
type settled struct {
	key  string
	once int64
}

// onceMark is a ticket (a reservation's, until a refund consumes it) or a
// record (an applied forced charge's), live while now < until.
type onceMark struct {
	until  int64
	ticket bool
}

// repeats returns reqs with every settlement that must not be applied
// turned into a peek (ALGORITHMS.md, Once): a refund whose ticket does
// not stand, a forced charge whose record does, each seeing the marks the
// call's earlier settlements left. It returns too the marks the call's
// settlements leave (until 0: consumed), which a call that is admitted
// writes. reqs itself when nothing is turned.
func (m *Model) repeats(now int64, reqs []backend.Request) ([]backend.Request, map[settled]onceMark) {
	out := reqs
	marks := map[settled]onceMark{}
	for i, r := range reqs {
		if r.Once == 0 || r.Cost > 0 && !r.Force {
			continue
		}
		k := settled{r.Key, r.Once}
		e, ok := marks[k]
		if !ok {
			e = m.settled[k]
		}
		live := e.until > now
		if r.Cost < 0 && (!live || !e.ticket) || r.Force && live && !e.ticket {
			if &out[0] == &reqs[0] {
				out = slices.Clone(reqs)
			}
			out[i].Cost, out[i].Force, out[i].Stamp, out[i].Once = 0, false, 0, 0
			continue
		}
		if r.Cost < 0 {
			marks[k] = onceMark{}
		} else {
			marks[k] = onceMark{now + backend.OnceKept(r.Period).Microseconds(), false}
		}
	}
	return out, marks
}

// anchor returns s as r reads it at now when the clock is behind s (s
// stores a time later than now), written at now; s itself otherwise.
// ALGORITHMS.md: every request that reads such a state writes it so,
// whatever its call's outcome, so that its units stop counting within a
// period of now instead of when the clock catches up. A Concurrency
// state is also rid of its expired leases so, for good.
func anchor(s *State, r backend.Request, now int64) *State {
	P := micros(r.Period)
	a := s.clone()
	a.Written = now
	switch s.Algorithm {
	case backend.GCRA:
		if s.Written <= now {
			return s
		}
		a.TAT -= s.Written - now
		a.Expires = a.TAT
	case backend.FixedWindow, backend.SlidingWindow:
		// A window that starts after now: written later (under any
		// period, a window starts at or before the instant it was written).
		ws := now - floorMod(now, P)
		if s.Start <= now {
			return s
		}
		a.Start, a.Expires = ws, ws+P
		if s.Algorithm == backend.SlidingWindow && s.Cur > 0 {
			a.Expires = ws + 2*P
		}
	case backend.SlidingLog:
		if n := len(s.Log); n == 0 || s.Log[n-1].T <= now {
			return s
		}
		a.Log = a.Log[:0]
		for _, u := range s.Log {
			switch {
			case u.T < now:
				a.Log = append(a.Log, u)
			case len(a.Log) > 0 && a.Log[len(a.Log)-1].T == now:
				a.Log[len(a.Log)-1].N = add(a.Log[len(a.Log)-1].N, u.N)
			default:
				a.Log = append(a.Log, Run{T: now, N: u.N})
			}
		}
		a.Expires = now + P
	case backend.RollingWindow:
		W := ceilDiv(P, rollK)
		cur := floorDiv(now, W)
		if s.W != W || s.Last <= cur {
			return s
		}
		e := s.Last - cur
		merged := make([]int64, rollK+1)
		for i, v := range s.Buckets {
			merged[min(int64(i)+e, rollK)] = add(merged[min(int64(i)+e, rollK)], v)
		}
		merged[rollK] = min(rollNMax, merged[rollK])
		a.Buckets, a.Last = merged, cur
		a.Expires = now
		for h := rollK; h >= 0; h-- {
			if merged[h] > 0 {
				a.Expires = mul(cur+int64(h)+1, W)
				break
			}
		}
	case backend.Concurrency:
		d := max(0, s.Written-now)
		a.Leases, a.Expires = a.Leases[:0], now
		for _, l := range s.Leases {
			if l.Exp -= d; l.Exp > now {
				a.Leases = append(a.Leases, l)
				a.Expires = max(a.Expires, l.Exp)
			}
		}
		if d == 0 && len(a.Leases) == len(s.Leases) {
			return s
		}
	}
	return a
}

// Evaluate is what a backend without a cache answers to reqs at now, without
// applying anything. Requests must be valid.
func (m *Model) Evaluate(now int64, reqs []backend.Request) []backend.Result {
	res, _, _ := m.evaluate(now, reqs)
	return res
}

// evaluate decides every request in order on a working copy of the states
// ("each seeing the state the previous one would write", a state back to
// full being absent), then, if an unforced, non-shadow request was
// rejected, reports every admitted request as a peek of its unchanged key.
// It returns the states the call writes (nil: deleted).
func (m *Model) evaluate(now int64, reqs []backend.Request) ([]backend.Result, bool, map[string]*State) {
	work := map[string]*State{} // key → state as the call has left it so far (nil: none)
	state := func(key string) *State {
		if s, ok := work[key]; ok {
			return s
		}
		return m.keys[key]
	}
	res := make([]backend.Result, len(reqs))
	rejected := false
	for i, r := range reqs {
		next, out, ok := step(state(r.Key), r, now)
		res[i] = out
		if ok && r.Cost != 0 {
			if next.Expires <= now {
				next = nil // back to full: deleted, and absent for the next request
			}
			work[r.Key] = next
		}
		if !ok && !r.Shadow {
			rejected = true
		}
	}
	if rejected {
		for i, r := range reqs {
			if res[i].Allowed {
				peek := r
				peek.Cost, peek.Force = 0, false
				_, res[i], _ = step(m.keys[r.Key], peek, now)
			}
			res[i].Stamp = 0
		}
	}
	return res, rejected, work
}

// step decides r on state s (nil: absent) at now, s anchored (see anchor:
// it stores no time later than now). It returns the state r writes
// (meaningful only when admitted with a non-zero cost), the result, and
// whether r was admitted.
func step(s *State, r backend.Request, now int64) (*State, backend.Result, bool) {
	if s != nil && s.Algorithm != r.Algorithm {
		s = nil // another algorithm's state counts as absent
	}
	switch r.Algorithm {
	case backend.GCRA:
		return gcra(s, r, now)
	case backend.FixedWindow:
		return fixed(s, r, now)
	case backend.SlidingWindow:
		return sliding(s, r, now)
	case backend.SlidingLog:
		return slidingLog(s, r, now)
	case backend.RollingWindow:
		return rolling(s, r, now)
	case backend.Concurrency:
		return concurrency(s, r, now)
	}
	panic(fmt.Sprintf("model: algorithm %v", r.Algorithm))
}

func micros(d time.Duration) int64 { return int64(d / time.Microsecond) }

// dur converts µs to a Duration, refusing to wrap around.
func dur(us int64) time.Duration {
	if us > int64(1<<63-1)/1000 || us < -int64(1<<63-1)/1000 {
		panic(fmt.Sprintf("model: %dµs does not fit a time.Duration", us))
	}
	return time.Duration(us) * time.Microsecond
}

// result is an admitted result, or a rejected one with its retry (µs, or -1
// for never); next is NextAfter (µs), which a positive remaining makes 0.
func result(r backend.Request, ok bool, remaining, reset, retry, next int64) backend.Result {
	out := backend.Result{Allowed: ok, Limit: r.Limit, Remaining: max(0, remaining), ResetAfter: dur(max(0, reset))}
	if out.Remaining == 0 {
		if next < 0 {
			panic(fmt.Sprintf("model: NextAfter %dµs is negative", next))
		}
		out.NextAfter = dur(next)
	}
	switch {
	case ok:
	case retry < 0:
		out.RetryAfter = backend.Never
	default:
		out.RetryAfter = dur(retry)
	}
	return out
}

// GCRA, as ALGORITHMS.md defines it, with big integers for the products.
func gcra(s *State, r backend.Request, now int64) (*State, backend.Result, bool) {
	P, L, c := micros(r.Period), r.Limit, r.Cost
	B := r.Burst
	if B == 0 {
		B = L
	}
	T := ceilDiv(P, L)
	tau := mul(T, B)
	tat := now
	if s != nil {
		tat = s.TAT
		if s.T != T && tat > now {
			return gcraOtherRate(s, r, now, B, T, tau)
		}
	}
	t0 := max(tat, now)
	var nt int64
	switch {
	case c > 0:
		ntBig := bigAdd(big.NewInt(t0), bigMul(c, T)) // t0 + c*T
		over := bigSub(ntBig, big.NewInt(now+tau))    // nt - now - tau
		if !r.Force && (c > B || over.Sign() > 0) {
			retry := int64(-1)
			if c <= B {
				retry = over.Int64() // at most DebtHorizon: c*T <= tau
			}
			return nil, result(r, false, floorDiv(tau-(t0-now), T), t0-now, retry, t0+T-now-tau), false
		}
		// A forced charge saturates at DebtHorizon past now.
		nt = now + DebtHorizon
		if ntBig.Cmp(big.NewInt(nt)) < 0 {
			nt = ntBig.Int64()
		}
	case c == 0:
		nt = t0
	case r.Stamp == 0:
		v := bigAdd(big.NewInt(t0), bigMul(c, T)) // c*T is negative
		nt = now
		if v.Cmp(big.NewInt(now)) > 0 {
			nt = v.Int64()
		}
	default:
		// Only the part of the stamped admission still outstanding.
		d := bigMul(-c, T)
		if left := big.NewInt(max(0, r.Stamp-now)); left.Cmp(d) < 0 {
			d = left
		}
		nt = now
		if v := bigSub(big.NewInt(t0), d); v.Cmp(big.NewInt(now)) > 0 {
			nt = v.Int64()
		}
	}
	next := &State{Algorithm: backend.GCRA, TAT: nt, T: T, Written: now, Expires: nt}
	out := result(r, true, floorDiv(tau-(nt-now), T), nt-now, 0, nt+T-now-tau)
	if c > 0 {
		out.Stamp = nt
	}
	return next, out, true
}

// gcraOtherRate is GCRA on a state written under another emission
// interval Ts (ALGORITHMS.md, "another rate"): u units held, each leaving
// at the rate it was written at, decided under r's burst.
func gcraOtherRate(s *State, r backend.Request, now, B, T, tau int64) (*State, backend.Result, bool) {
	c, d, Ts := r.Cost, s.TAT-now, s.T
	u := ceilDiv(d, Ts)
	remaining, next := max(0, B-u), int64(0)
	if remaining == 0 {
		next = d - mul(B-1, Ts)
	}
	switch {
	case c > 0 && !r.Force && (c > B || add(u, c) > B):
		retry := int64(-1)
		if c <= B {
			retry = d - mul(B-c, Ts)
		}
		return nil, result(r, false, remaining, d, retry, next), false
	case c == 0:
		return s, result(r, true, remaining, d, 0, next), true
	}
	n := u // a stamped refund: its stamp is of another rate's scale
	switch {
	case c > 0:
		n = add(u, c)
	case r.Stamp == 0:
		n = u - min(-c, u)
	}
	nt := now + DebtHorizon
	if p := bigMul(n, T); p.Cmp(big.NewInt(DebtHorizon)) < 0 {
		nt = now + p.Int64()
	}
	next2 := &State{Algorithm: backend.GCRA, TAT: nt, T: T, Written: now, Expires: nt}
	out := result(r, true, floorDiv(tau-(nt-now), T), nt-now, 0, nt+T-now-tau)
	if c > 0 {
		out.Stamp = nt
	}
	return next2, out, true
}

// Fixed window.
func fixed(s *State, r backend.Request, now int64) (*State, backend.Result, bool) {
	P, L, c := micros(r.Period), r.Limit, r.Cost
	ws := now - floorMod(now, P)
	end := ws + P
	count := int64(0)
	if s != nil && s.Start == ws {
		count = s.Count
	}
	reset := func(count int64) int64 {
		if count > 0 {
			return end - now
		}
		return 0
	}
	if c > 0 && !r.Force && count+c > L {
		retry := end - now
		if c > L {
			retry = -1
		}
		return nil, result(r, false, L-count, reset(count), retry, end-now), false
	}
	if c < 0 && r.Stamp != 0 && r.Stamp-floorMod(r.Stamp, P) != ws {
		c = 0 // the stamp's window is over: its units no longer count
	}
	count = min(CountMax, max(0, add(count, c)))
	next := &State{Algorithm: backend.FixedWindow, Start: ws, Count: count, Written: now, Expires: end}
	if count == 0 {
		next.Expires = now
	}
	out := result(r, true, L-count, reset(count), 0, end-now)
	if c > 0 {
		out.Stamp = now
	}
	return next, out, true
}

// Sliding window counter.
func sliding(s *State, r backend.Request, now int64) (*State, backend.Result, bool) {
	const million = 1_000_000
	P, L, c := micros(r.Period), r.Limit, r.Cost
	ws := now - floorMod(now, P)
	var prev, cur int64
	if s != nil {
		switch s.Start {
		case ws:
			prev, cur = s.Prev, s.Cur
		case ws - P:
			prev, cur = s.Cur, 0
		}
	}
	rem := ws + P - now
	Pm := P / 1000
	remm := rem / 1000
	w := mul(remm, million) / Pm
	used := func(prev, cur int64) int64 { return add(mul(prev, w), mul(cur, million)) }
	after := func(prev, cur int64) (remaining, reset int64) {
		remaining = floorDiv(mul(L, million)-used(prev, cur), million)
		switch {
		case cur > 0:
			reset = rem + P
		case prev > 0:
			reset = rem
		}
		return remaining, reset
	}
	// retry is the wait of a rejected request of cost c <= L.
	retry := func(prev, cur, c int64) int64 {
		if cur+c <= L {
			X := min(million, mul(L-cur-c, million)/prev)
			R := ceilDiv(mul(X+1, Pm), million) - 1
			return rem - ((R+1)*1000 - 1)
		}
		X := min(million, mul(L-c, million)/cur)
		R := ceilDiv(mul(X+1, Pm), million) - 1
		if R >= Pm {
			return rem
		}
		return rem + P - ((R+1)*1000 - 1)
	}
	next := func(prev, cur, remaining int64) int64 {
		if remaining > 0 {
			return 0
		}
		return retry(prev, cur, 1)
	}
	if c > 0 && !r.Force && used(prev, add(cur, c)) > mul(L, million) {
		wait := int64(-1)
		if c <= L {
			wait = retry(prev, cur, c)
		}
		remaining, reset := after(prev, cur)
		return nil, result(r, false, remaining, reset, wait, next(prev, cur, remaining)), false
	}
	if c < 0 && r.Stamp != 0 {
		switch sw := r.Stamp - floorMod(r.Stamp, P); sw {
		case ws:
			cur -= min(-c, cur)
		case ws - P:
			prev -= min(-c, prev)
		}
		c = 0
	}
	cur = min(CountMax, max(0, add(cur, c)))
	remaining, reset := after(prev, cur)
	st := &State{Algorithm: backend.SlidingWindow, Start: ws, Prev: prev, Cur: cur, Written: now}
	switch {
	case cur > 0:
		st.Expires = ws + 2*P
	case prev > 0:
		st.Expires = ws + P
	default:
		st.Expires = now
	}
	out := result(r, true, remaining, reset, 0, next(prev, cur, remaining))
	if c > 0 {
		out.Stamp = now
	}
	return st, out, true
}

// Sliding log: the units as runs, but every rule stated per unit.
func slidingLog(s *State, r backend.Request, now int64) (*State, backend.Result, bool) {
	P, L, c := micros(r.Period), r.Limit, r.Cost
	var log []Run
	if s != nil {
		for _, u := range s.Log {
			if u.T+P > now { // an entry counts while now < e + P
				log = append(log, u)
			}
		}
	}
	k := units(log)
	// unit returns the instant of the i-th oldest unit (0-based).
	unit := func(i int64) int64 {
		for _, u := range log {
			if i < u.N {
				return u.T
			}
			i -= u.N
		}
		panic("model: sliding log index out of range")
	}
	// after reports on log: remaining, reset, and next (e[k - L] + P -
	// now when full).
	after := func(log []Run) (remaining, reset, next int64) {
		k := units(log)
		if k > 0 {
			reset = log[len(log)-1].T + P - now
		}
		if k >= L {
			i := k - L
			for _, u := range log {
				if i < u.N {
					next = u.T + P - now
					break
				}
				i -= u.N
			}
		}
		return L - k, reset, next
	}
	if c > 0 && !r.Force && add(k, c) > L {
		retry := int64(-1)
		if c <= L {
			retry = unit(k+c-L-1) + P - now
		}
		remaining, reset, next := after(log)
		return nil, result(r, false, remaining, reset, retry, next), false
	}
	switch {
	case c > 0:
		if n := len(log); n > 0 && log[n-1].T == now {
			log[n-1].N = add(log[n-1].N, c)
		} else {
			log = append(log, Run{T: now, N: c})
		}
	case c < 0 && r.Stamp != 0:
		for i := range log {
			if log[i].T == r.Stamp {
				log[i].N -= min(-c, log[i].N)
				if log[i].N == 0 {
					log = slices.Delete(log, i, i+1)
				}
				break
			}
		}
	case c < 0:
		for take := min(-c, k); take > 0; {
			last := &log[len(log)-1]
			n := min(take, last.N)
			last.N -= n
			take -= n
			if last.N == 0 {
				log = log[:len(log)-1]
			}
		}
	}
	remaining, reset, next := after(log)
	st := &State{Algorithm: backend.SlidingLog, Log: log, Written: now, Expires: now}
	if len(log) > 0 {
		st.Expires = log[len(log)-1].T + P
	}
	out := result(r, true, remaining, reset, 0, next)
	if c > 0 {
		out.Stamp = now
	}
	return st, out, true
}

func units(log []Run) int64 {
	k := int64(0)
	for _, u := range log {
		k = add(k, u.N)
	}
	return k
}

// Rolling window constants (ALGORITHMS.md): 16 buckets before the current
// one, each count saturating at 2^32 - 1.
const (
	rollK    = 16
	rollNMax = 1<<32 - 1
)

// Rolling window.
func rolling(s *State, r backend.Request, now int64) (*State, backend.Result, bool) {
	P, L, c := micros(r.Period), r.Limit, r.Cost
	W := ceilDiv(P, rollK)
	n := make([]int64, rollK+1) // n[i] is bucket last-k+i
	last := int64(0)
	if s != nil && s.W == W {
		copy(n, s.Buckets)
		last = s.Last
	}
	b := max(floorDiv(now, W), last)
	if d := b - last; d > 0 {
		shifted := make([]int64, rollK+1) // n[i] = old n[i + d], 0 past the end
		for i := range shifted {
			if int64(i)+d <= rollK {
				shifted[i] = n[int64(i)+d]
			}
		}
		n = shifted
	}
	sum := func() int64 {
		S := int64(0)
		for _, v := range n {
			S = add(S, v)
		}
		return S
	}
	// wait(x) is when the newer buckets hold at most x units.
	wait := func(x int64) int64 {
		for j := 0; j <= rollK; j++ {
			newer := int64(0)
			for _, v := range n[j+1:] {
				newer = add(newer, v)
			}
			if newer <= x {
				return mul(b+int64(j)+1, W) - now
			}
		}
		panic("model: wait with x < 0")
	}
	report := func(ok bool, retry int64) backend.Result {
		S := sum()
		reset, next := int64(0), int64(0)
		if S > 0 {
			h := rollK
			for n[h] == 0 {
				h--
			}
			reset = mul(b+int64(h)+1, W) - now
		}
		if S >= L {
			next = wait(L - 1)
		}
		return result(r, ok, L-S, reset, retry, next)
	}
	S := sum()
	if c > 0 && !r.Force && add(S, c) > L {
		retry := int64(-1)
		if c <= L {
			retry = wait(L - c)
		}
		return nil, report(false, retry), false
	}
	switch {
	case c > 0:
		n[rollK] = min(rollNMax, add(n[rollK], c))
	case c < 0 && r.Stamp != 0:
		if i := floorDiv(r.Stamp, W) - b + rollK; 0 <= i && i <= rollK {
			n[i] -= min(-c, n[i])
		}
	case c < 0:
		g := -c
		for i := rollK; i >= 0; i-- {
			t := min(g, n[i])
			n[i] -= t
			g -= t
		}
	}
	res := report(true, 0)
	if c > 0 {
		res.Stamp = mul(b, W)
	}
	st := &State{Algorithm: backend.RollingWindow, W: W, Last: b, Buckets: n, Written: now, Expires: now}
	for h := rollK; h >= 0; h-- {
		if n[h] > 0 {
			st.Expires = mul(b+int64(h)+1, W)
			break
		}
	}
	return st, res, true
}
