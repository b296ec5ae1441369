package backendtest

import (
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// testSameKeyUnderTwoPeriods pins two rules sharing a key under different
// periods in one call: a peek under the short period writes nothing, so the
// request under the long period sees the key as stored. (The memory store
// used to let the peek's view of a fresh 1ms window stand for the key, and
// admitted 4 units in a window of 2, or reported a negative RetryAfter for
// a sliding log.)
func (s *suite) testSameKeyUnderTwoPeriods(t *testing.T) {
	// 2 per hour at +1.5ms; at +6.5ms, [peek per ms, 2 more per hour]: the
	// units at 1.5ms are out of the ms window and in the hour's.
	wants := map[backend.Algorithm]want{
		// T = 1.8e9, tau = 3.6e9: nt - now is tau + 3.6e9 - 5000 over;
		// one unit fits T earlier.
		backend.GCRA: {rem: 0, reset: 3_599_995_000, retry: 3_599_995_000, next: 1_799_995_000},
		// The hour's window ends at 3.6e9.
		backend.FixedWindow: {rem: 0, reset: 3_599_993_500, retry: 3_599_993_500, next: 3_599_993_500},
		// Both units at 1500 leave at 1500 + 3.6e9.
		backend.SlidingLog: {rem: 0, reset: 3_599_995_000, retry: 3_599_995_000, next: 3_599_995_000},
		// cur 2 + 2 > 2: next window, X = 0, Pm = 3.6e6, R = 3:
		// retry = rem + P - 3999 with rem = 3.6e9 - 6500. For one unit,
		// X = 500000, R = 1800003: next = rem + P - 1800003999.
		backend.SlidingWindow: {rem: 0, reset: 7_199_993_500, retry: 7_199_989_501, next: 5_399_989_501},
		// W = 2.25e8 (Epoch is on a bucket boundary): both units in the
		// newest of 17 buckets count until 17W.
		backend.RollingWindow: {rem: 0, reset: 3_824_993_500, retry: 3_824_993_500, next: 3_824_993_500},
	}
	s.forEach(t, func(t *testing.T, e *env, alg backend.Algorithm) {
		hour := req(e.key("e"), alg, 2, time.Hour, 2)
		ms := hour
		ms.Period, ms.Cost = time.Millisecond, 0
		e.at(us(1500))
		if got := e.one(hour); !got.Allowed {
			t.Fatalf("2 of 2 per hour: %+v", got)
		}
		e.at(us(6500))
		got := e.decide(ms, hour)
		check(t, "2 more per hour after a peek per ms", got[1], wants[alg].result(2))
		if got, want := e.remaining(hour), int64(0); got != want {
			t.Errorf("remaining per hour afterwards = %d, want %d", got, want)
		}
	})
}

// testHugeGCRACosts pins GCRA at Validate's extremes, where cost × emission
// interval leaves every integer type a backend computes in: 1 per 90 days
// (T = 7.776e12µs). A cost above the burst is rejected for ever and a
// refund of any size empties the key, without computing the product; a
// forced charge saturates DebtHorizon (2^52µs, about 142 years) past now,
// so that ResetAfter still fits a Duration. (Memory used to report a
// negative ResetAfter, Redis to refuse the requests as invalid.)
func (s *suite) testHugeGCRACosts(t *testing.T) {
	const horizon = 1 << 52
	e := s.env(t)
	r := req(e.key("k"), backend.GCRA, 1, backend.MaxPeriod, 580)
	e.at(time.Hour)
	check(t, "580 of 1 per 90 days", e.one(r), want{rem: 1, never: true}.result(1))
	r.Cost = -580
	check(t, "refund of 580 on a full key", e.one(r), want{ok: true, rem: 1}.result(1))
	r.Cost, r.Force = 1187, true
	// With a burst of 1, tau = T: the next unit fits when the debt is paid.
	check(t, "forced 1187", e.one(r), want{ok: true, rem: 0, reset: horizon, next: horizon}.result(1))
	r.Cost, r.Force = 1, false
	check(t, "1 more", e.one(r), want{rem: 0, reset: horizon, retry: horizon, next: horizon}.result(1))
	r.Cost, r.Force = backend.MaxLimit, true
	check(t, "forced MaxLimit on top", e.one(r), want{ok: true, rem: 0, reset: horizon, next: horizon}.result(1))
	e.at(time.Hour + time.Second)
	check(t, "a second later", e.peek(r), want{ok: true, rem: 0, reset: horizon - 1_000_000, next: horizon - 1_000_000}.result(1))
	r.Cost, r.Force = -579, false
	// 2^52 - 579T = 1.296e12µs: the refund leaves 15 days of debt.
	left := int64(horizon - 579*7_776_000_000_000 - 1_000_000)
	check(t, "refund 579", e.one(r), want{ok: true, rem: 0, reset: left, next: left}.result(1))
	r.Cost = -1
	check(t, "refund the rest", e.one(r), want{ok: true, rem: 1}.result(1))
}

// testCountSaturates pins where a window's count saturates: 2^40 units
// (1,100 forced charges of MaxLimit), so that refunds afterwards give back
// from 2^40, not from what was charged.
func (s *suite) testCountSaturates(t *testing.T) {
	for _, alg := range []backend.Algorithm{backend.FixedWindow, backend.SlidingWindow} {
		t.Run(alg.String(), func(t *testing.T) {
			e := s.env(t)
			r := req(e.key("k"), alg, 1, time.Hour, backend.MaxLimit)
			r.Force = true
			call := make([]backend.Request, 8)
			for i := range call {
				call[i] = r
			}
			for range 150 { // 1,200 × 1e9 > 2^40 ≈ 1,099.5 × 1e9
				e.decide(call...)
			}
			refund := r
			refund.Cost, refund.Force = -backend.MaxLimit, false
			for i := range call {
				call[i] = refund
			}
			for range 137 { // 1,096 × 1e9 back: 2^40 - 1.096e12 = 3.51e9 left
				e.decide(call...)
			}
			if got := e.remaining(r); got != 0 {
				t.Fatalf("remaining after refunding 1,096e9 of a saturated count = %d, want 0", got)
			}
			e.decide(call[:4]...) // 4e9 more: empty
			if got, want := e.remaining(r), int64(1); got != want {
				t.Errorf("remaining after refunding 1,100e9 = %d, want %d: the count did not saturate at 2^40", got, want)
			}
		})
	}
}
