package backendtest

import (
	"context"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// settleAbove is, per algorithm, the hand-computed answer to: 3 per second,
// reserve 2 at t0, and at 200ms (the work is done) settle at 5 by forcing 3
// more; then ask for 1 at 200ms. In µs:
//
// GCRA: T = 333_334, tau = 1_000_002. The reservation puts tat at 2T =
// 666_668 (1 remaining); forcing 3 puts it at 5T = 1_666_670, reset
// 1_466_670 from 200ms. One more needs 6T - now <= tau: now >= 1_000_002,
// a wait of 800_002.
//
// Fixed window: the count is 5 in [0, 1s); one more waits for the window's
// end, 800_000 away.
//
// Sliding log: entries 0, 0, 200k, 200k, 200k; one more fits once three
// have expired, when the one at 200k does: at 1_200_000, a wait of
// 1_000_000.
//
// Rolling window: W = 62_500; the reservation sits in bucket 0, the forced
// 3 in bucket 3 (200ms), which counts until 20W = 1_250_000: reset and
// wait 1_050_000 (bucket 0's 2 leave earlier, but 3 alone fill the limit).
//
// Sliding window counter: cur = 5 (reset rem + P = 1_800_000); in the next
// window prev' = 5 must weigh at most (3-1)/5 = 400_000 ppm: remm <= 400,
// rem <= 400_999, at 1_599_001, a wait of 1_399_001.
var settleAbove = map[backend.Algorithm]struct {
	reserved want // the reservation of 2 at t0
	settled  want // the forced 3 at 200ms
	retry    int64
}{
	backend.RollingWindow: {
		reserved: want{ok: true, rem: 1, reset: 1_062_500},
		settled:  want{ok: true, rem: 0, reset: 1_050_000, next: 1_050_000},
		retry:    1_050_000,
	},
	backend.GCRA: {
		reserved: want{ok: true, rem: 1, reset: 666_668},
		settled:  want{ok: true, rem: 0, reset: 1_466_670, next: 800_002},
		retry:    800_002,
	},
	backend.FixedWindow: {
		reserved: want{ok: true, rem: 1, reset: 1_000_000},
		settled:  want{ok: true, rem: 0, reset: 800_000, next: 800_000},
		retry:    800_000,
	},
	backend.SlidingLog: {
		reserved: want{ok: true, rem: 1, reset: 1_000_000},
		settled:  want{ok: true, rem: 0, reset: 1_000_000, next: 1_000_000},
		retry:    1_000_000,
	},
	backend.SlidingWindow: {
		reserved: want{ok: true, rem: 1, reset: 2_000_000},
		settled:  want{ok: true, rem: 0, reset: 1_800_000, next: 1_399_001},
		retry:    1_399_001,
	},
}

// testSettleAbove drives the reserve-then-settle cycle as ceiling's
// middleware does: a request reserves an estimate in its decision, and once
// the work is done its real cost is settled by a forced charge of the excess.
// Settling above the estimate charges the excess even past the limit, and the following requests are refused for exactly the time
// the debt takes to clear; peeking at the debt changes nothing.
func (s *suite) testSettleAbove(t *testing.T) {
	s.forEach(t, func(t *testing.T, e *env, alg backend.Algorithm) {
		w := settleAbove[alg]
		r := req(e.key("k"), alg, 3, time.Second, 2)
		check(t, "reserve 2 of 3", e.one(r), w.reserved.result(3))

		const done = 200_000
		e.at(us(done))
		settle := r
		settle.Cost, settle.Force = 5-2, true
		check(t, "settle at 5: force 3 more", e.one(settle), w.settled.result(3))

		next := r
		next.Cost = 1
		for i := range 3 {
			got := e.one(next)
			if got.Allowed || got.RetryAfter != us(w.retry) || got.Remaining != 0 {
				t.Errorf("request %d after the settlement: %+v, want rejected, RetryAfter %v", i, got, us(w.retry))
			}
			e.peek(next)
		}
		e.at(us(done + w.retry - 1))
		if got := e.one(next); got.Allowed || got.RetryAfter != time.Microsecond {
			t.Errorf("1µs before the debt clears: %+v, want rejected with RetryAfter 1µs", got)
		}
		e.at(us(done + w.retry))
		if got := e.one(next); !got.Allowed {
			t.Errorf("when the debt clears: %+v, want allowed", got)
		}
	})
}

// testSettleBatch: one call settles several rules of one request at once,
// a refund on one key and a forced excess on another, and both apply.
func (s *suite) testSettleBatch(t *testing.T) {
	s.forEach(t, func(t *testing.T, e *env, alg backend.Algorithm) {
		minute := req(e.key("minute"), alg, 10, time.Minute, 4)
		day := req(e.key("day"), alg, 20, time.Hour, 6)
		for i, got := range e.decide(minute, day) {
			if !got.Allowed {
				t.Fatalf("reservation %d: %+v, want allowed", i, got)
			}
		}
		refund, excess := minute, day
		refund.Cost = 1 - 4
		excess.Cost, excess.Force = 30-6, true
		got := e.decide(refund, excess)
		if !got[0].Allowed || got[0].Remaining != 9 {
			t.Errorf("refund to 1 of 4: %+v, want allowed with 9 remaining", got[0])
		}
		if !got[1].Allowed || got[1].Remaining != 0 {
			t.Errorf("forced 24 beyond 6 of 20: %+v, want allowed with 0 remaining", got[1])
		}
		if got, want := e.remaining(minute), int64(9); got != want {
			t.Errorf("minute remaining after the settlement = %d, want %d", got, want)
		}
		day.Cost = 1
		if got := e.one(day); got.Allowed || got.RetryAfter <= 0 {
			t.Errorf("a request on the indebted key: %+v, want rejected with a wait", got)
		}
	})
}

// testResetForgivesDebt: Reset restores the full budget even of a key that
// a settlement put into debt and that has just refused a request.
func (s *suite) testResetForgivesDebt(t *testing.T) {
	s.forEach(t, func(t *testing.T, e *env, alg backend.Algorithm) {
		r := req(e.key("k"), alg, 3, time.Minute, 3)
		r.Force = true
		for i := range 4 {
			if !e.one(r).Allowed {
				t.Fatalf("forced charge %d refused", i)
			}
		}
		// A rejection first: a backend that remembers rejections (a deny
		// cache) must forget this one on Reset.
		one := r
		one.Cost, one.Force = 1, false
		if got := e.one(one); got.Allowed {
			t.Fatalf("a request on the indebted key: %+v, want rejected", got)
		}
		if err := e.b.Reset(context.Background(), r.Key); err != nil {
			t.Fatalf("Reset: %v", err)
		}
		check(t, "peek after Reset", e.peek(r), want{ok: true, rem: 3}.result(3))
		admitN(t, e, r, 4, 3)
	})
}

// testRefundAfterRejection: a refund is visible to the very next request,
// even one on a key that has just refused a request (a backend that
// remembers rejections must forget them when the key is refunded).
func (s *suite) testRefundAfterRejection(t *testing.T) {
	s.forEach(t, func(t *testing.T, e *env, alg backend.Algorithm) {
		r := req(e.key("k"), alg, 3, time.Minute, 3)
		if got := e.one(r); !got.Allowed {
			t.Fatalf("reserve 3 of 3: %+v", got)
		}
		one := r
		one.Cost = 1
		if got := e.one(one); got.Allowed {
			t.Fatalf("a fourth unit: %+v, want rejected", got)
		}
		refund := r
		refund.Cost = 1 - 3 // the work used 1 of the 3 reserved
		if got := e.one(refund); !got.Allowed || got.Remaining != 2 {
			t.Errorf("settling at 1: %+v, want allowed with 2 remaining", got)
		}
		admitN(t, e, one, 3, 2)
	})
}
