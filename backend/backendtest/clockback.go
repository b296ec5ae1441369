package backendtest

import (
	"fmt"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// testRollingEmptiedInOneCall is issue 23's case: L = 3, P = 16ms (W =
// 1ms), 1 unit at 5ms, then at 3.5ms (the clock stepped back) one call of
// [refund 1, charge 1]. The refund empties the state, which is deleted,
// so the charge lands in a fresh state's bucket 3 and counts until 20ms:
// ResetAfter 16.5ms, as the same two requests sent as two calls answer
// (18.5ms, had the emptied state's bucket 5 stood).
func (s *suite) testRollingEmptiedInOneCall(t *testing.T) {
	refund := want{ok: true, rem: 3}
	charge := want{ok: true, rem: 2, reset: 16_500}
	for _, oneCall := range []bool{true, false} {
		t.Run(fmt.Sprint("one call=", oneCall), func(t *testing.T) {
			e := s.env(t)
			r := req(e.key("k"), backend.RollingWindow, 3, 16*time.Millisecond, 1)
			e.at(us(5000))
			check(t, "1 unit at 5ms", e.one(r), want{ok: true, rem: 2, reset: 17_000}.result(3))
			e.at(us(3500))
			back := r
			back.Cost = -1
			var got []backend.Result
			if oneCall {
				got = e.decide(back, r)
			} else {
				got = []backend.Result{e.one(back), e.one(r)}
			}
			check(t, "refund 1 at 3.5ms", got[0], refund.result(3))
			check(t, "then 1 unit", got[1], charge.result(3))
		})
	}
}

// testClockBehind steps the clock back by 4 hours (a failover to a
// replica whose clock is behind) on a key that is full: 3 per second, 3
// units at 5h, then requests at 1h. The key stays full (nothing is
// over-admitted), and its units stop counting within a period of 1h, not
// 4 hours later; the rejection at 1h writes the anchored state, so the
// later request finds the units gone instead of anchoring them again.
func (s *suite) testClockBehind(t *testing.T) {
	type step struct {
		at   time.Duration // after Epoch
		want want
	}
	h := time.Hour
	cases := map[backend.Algorithm][]step{
		// At 1h the 3 units are read as in 1h's bucket (W = 62_500), and
		// count until 17W later.
		backend.RollingWindow: {
			{h, want{rem: 0, reset: 1_062_500, retry: 1_062_500, next: 1_062_500}},
			{h + us(1_062_500), want{ok: true, rem: 2, reset: 1_062_500}},
		},
		// The debt left at 5h (tau = 1_000_002) counts from 1h; one unit
		// fits T = 333_334 later.
		backend.GCRA: {
			{h, want{rem: 0, reset: 1_000_002, retry: 333_334, next: 333_334}},
			{h + us(333_334), want{ok: true, rem: 0, reset: 1_000_002, next: 333_334}},
		},
		// 5h's window is read as 1h's, which ends 1s later.
		backend.FixedWindow: {
			{h, want{rem: 0, reset: 1_000_000, retry: 1_000_000, next: 1_000_000}},
			{h + time.Second, want{ok: true, rem: 2, reset: 1_000_000}},
		},
		// cur = 3 in 1h's window: one unit fits once prev' = 3 weighs
		// 2/3, at 1h + 1_333_001 (rem 666_999 of the next window).
		backend.SlidingWindow: {
			{h, want{rem: 0, reset: 2_000_000, retry: 1_333_001, next: 1_333_001}},
			{h + us(1_333_001), want{ok: true, rem: 0, reset: 1_666_999, next: 333_000}},
		},
		// The entries of 5h are read as of 1h.
		backend.SlidingLog: {
			{h, want{rem: 0, reset: 1_000_000, retry: 1_000_000, next: 1_000_000}},
			{h + time.Second, want{ok: true, rem: 2, reset: 1_000_000}},
		},
	}
	s.forEach(t, func(t *testing.T, e *env, alg backend.Algorithm) {
		r := req(e.key("k"), alg, 3, time.Second, 3)
		e.at(5 * h)
		if got := e.one(r); !got.Allowed {
			t.Fatalf("3 of 3 at 5h: %+v", got)
		}
		r.Cost = 1
		for i, st := range cases[alg] {
			e.at(st.at)
			check(t, fmt.Sprintf("step %d: 1 unit at %v", i, st.at), e.one(r), st.want.result(3))
		}
	})
	t.Run("concurrency", func(t *testing.T) {
		e := s.env(t)
		lease := func(id int64) backend.Request {
			return backend.Request{Key: e.key("k"), Algorithm: backend.Concurrency, Limit: 1, Period: time.Second, Cost: 1, Lease: id}
		}
		e.at(5 * h)
		check(t, "lease 1 at 5h", e.one(lease(1)), want{ok: true, rem: 0, reset: 1_000_000, next: 1_000_000}.result(1))
		// Lease 1 had 1s left at its write: it keeps 1s from 1h.
		e.at(h)
		check(t, "lease 2 at 1h", e.one(lease(2)), want{rem: 0, reset: 1_000_000, retry: 1_000_000, next: 1_000_000}.result(1))
		e.at(h + time.Second)
		check(t, "lease 2 at 1h+1s", e.one(lease(2)), want{ok: true, rem: 0, reset: 1_000_000, next: 1_000_000}.result(1))
	})
	// A lease that expired stays expired: the peek at 2s that finds it so
	// drops it for good, and the clock back at 0.5s does not bring it back.
	t.Run("concurrency_expired", func(t *testing.T) {
		e := s.env(t)
		lease := func(id, cost int64) backend.Request {
			return backend.Request{Key: e.key("k"), Algorithm: backend.Concurrency, Limit: 1, Period: time.Second, Cost: cost, Lease: id}
		}
		check(t, "lease 1 at 0", e.one(lease(1, 1)), want{ok: true, rem: 0, reset: 1_000_000, next: 1_000_000}.result(1))
		e.at(2 * time.Second)
		check(t, "a peek at 2s", e.one(lease(0, 0)), want{ok: true, rem: 1}.result(1))
		e.at(500 * time.Millisecond)
		check(t, "lease 2 at 0.5s", e.one(lease(2, 1)), want{ok: true, rem: 0, reset: 1_000_000, next: 1_000_000}.result(1))
	})
}

// testGCRAAtTheHorizon pins GCRA's durations at the last instant the
// year-2112 bound allows, now = 2^52 - 1 µs, with a forced cost of 1e9 on
// 1 per 90 days (T = tau = 7.776e12 µs): the TAT saturates at now + 2^52
// = 2^53 - 1, and ResetAfter, NextAfter and a later rejection's RetryAfter
// are 2^52 µs exactly, never more (nt + T would pass 2^53, where doubles
// are no longer exact).
func (s *suite) testGCRAAtTheHorizon(t *testing.T) {
	const horizon = 1 << 52
	e := s.env(t)
	e.clock.Set(time.UnixMicro(horizon - 1))
	r := req(e.key("k"), backend.GCRA, 1, backend.MaxPeriod, backend.MaxLimit)
	r.Force = true
	got := e.one(r)
	check(t, "forced 1e9", got, want{ok: true, rem: 0, reset: horizon, next: horizon}.result(1))
	stampIs(t, "forced 1e9", got, 2*horizon-1)
	r.Cost, r.Force = 1, false
	check(t, "1 more", e.one(r), want{rem: 0, reset: horizon, retry: horizon, next: horizon}.result(1))
}
