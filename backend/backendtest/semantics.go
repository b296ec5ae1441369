package backendtest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// forEach runs f as one subtest per algorithm, each with its own backend.
func (s *suite) forEach(t *testing.T, f func(t *testing.T, e *env, alg backend.Algorithm)) {
	t.Helper()
	for _, alg := range algorithms {
		t.Run(alg.String(), func(t *testing.T) { f(t, s.env(t), alg) })
	}
}

// admitN asks for cost 1 n times and fails unless exactly the first
// wantOK are admitted.
func admitN(t *testing.T, e *env, r backend.Request, n, wantOK int) {
	t.Helper()
	r.Cost, r.Force = 1, false
	got := 0
	for range n {
		if e.one(r).Allowed {
			got++
		} else if got < wantOK {
			break
		}
	}
	if got != wantOK {
		t.Errorf("%s: admitted %d of %d, want %d", r.Key, got, n, wantOK)
	}
}

func (s *suite) testPeek(t *testing.T) {
	s.forEach(t, func(t *testing.T, e *env, alg backend.Algorithm) {
		r := req(e.key("k"), alg, 3, time.Second, 0)
		for i := range 5 {
			check(t, fmt.Sprintf("peek %d on a new key", i), e.one(r), want{ok: true, rem: 3}.result(3))
		}
		r.Cost = 1
		if !e.one(r).Allowed {
			t.Fatal("first request rejected")
		}
		first := e.peek(r)
		for i := range 5 {
			if got := e.peek(r); got != first {
				t.Errorf("peek %d = %+v, want the unchanged %+v", i, got, first)
			}
		}
		if got, want := first.Remaining, int64(2); got != want {
			t.Errorf("remaining after one = %d, want %d", got, want)
		}
		admitN(t, e, r, 3, 2)
	})
}

func (s *suite) testReset(t *testing.T) {
	s.forEach(t, func(t *testing.T, e *env, alg backend.Algorithm) {
		a := req(e.key("a"), alg, 3, time.Minute, 1)
		b := req(e.key("b"), alg, 3, time.Minute, 1)
		admitN(t, e, a, 4, 3)
		admitN(t, e, b, 4, 3)
		if err := e.b.Reset(context.Background(), a.Key, b.Key, e.key("never-used")); err != nil {
			t.Fatalf("Reset: %v", err)
		}
		check(t, "peek a after Reset", e.peek(a), want{ok: true, rem: 3}.result(3))
		admitN(t, e, a, 4, 3)
		admitN(t, e, b, 4, 3)
		if err := e.b.Reset(context.Background()); err != nil {
			t.Errorf("Reset with no keys: %v", err)
		}
	})
}

func (s *suite) testRefund(t *testing.T) {
	s.forEach(t, func(t *testing.T, e *env, alg backend.Algorithm) {
		r := req(e.key("k"), alg, 3, time.Second, 1)
		admitN(t, e, r, 4, 3)
		r.Cost = -2
		got := e.one(r)
		if !got.Allowed || got.Remaining != 2 || got.RetryAfter != 0 {
			t.Errorf("refund of 2 = %+v, want allowed with 2 remaining", got)
		}
		admitN(t, e, r, 3, 2)
	})
}

func (s *suite) testRefundFloor(t *testing.T) {
	s.forEach(t, func(t *testing.T, e *env, alg backend.Algorithm) {
		fresh := req(e.key("fresh"), alg, 3, time.Second, -5)
		check(t, "refund on a new key", e.one(fresh), want{ok: true, rem: 3}.result(3))
		admitN(t, e, fresh, 4, 3)

		r := req(e.key("k"), alg, 3, time.Second, 1)
		admitN(t, e, r, 1, 1)
		r.Cost = -5
		check(t, "refund of 5 after 1", e.one(r), want{ok: true, rem: 3}.result(3))
		admitN(t, e, r, 4, 3) // no credit beyond full
	})
}

// forceRetry is, per algorithm, the hand-computed wait after a forced
// charge of 5 on a 3-per-second rule at t0 before one more unit fits (also
// the forced result's NextAfter), and the forced result's reset (µs).
// Rolling window: t0's bucket (W = 62_500) counts until 17W. GCRA: the charge puts tat at 5T = 1_666_670;
// one more fits when 6T - now <= tau = 3T, at now = 1_000_002. Sliding
// window: cur = 5 becomes prev' = 5 at 1s, and 5w + 1e6 <= 3e6 needs
// w <= 400_000 ppm: rem <= 400_999, now = 1_599_001.
var forceRetry = map[backend.Algorithm]struct{ retry, reset int64 }{
	backend.RollingWindow: {1_062_500, 1_062_500},
	backend.GCRA:          {1_000_002, 1_666_670},
	backend.FixedWindow:   {1_000_000, 1_000_000},
	backend.SlidingLog:    {1_000_000, 1_000_000},
	backend.SlidingWindow: {1_599_001, 2_000_000},
}

func (s *suite) testForce(t *testing.T) {
	s.forEach(t, func(t *testing.T, e *env, alg backend.Algorithm) {
		fr := forceRetry[alg]
		r := req(e.key("k"), alg, 3, time.Second, 5)
		r.Force = true
		check(t, "forced charge of 5", e.one(r), want{ok: true, rem: 0, reset: fr.reset, next: fr.retry}.result(3))

		r.Cost, r.Force = 1, false
		got := e.one(r)
		if got.Allowed || got.RetryAfter != us(fr.retry) {
			t.Errorf("after the charge: %+v, want rejected with RetryAfter %v", got, us(fr.retry))
		}
		e.at(us(fr.retry - 1))
		if got := e.one(r); got.Allowed || got.RetryAfter != time.Microsecond {
			t.Errorf("1µs before the retry-after: %+v, want rejected with RetryAfter 1µs", got)
		}
		e.at(us(fr.retry))
		if got := e.one(r); !got.Allowed {
			t.Errorf("at the retry-after: %+v, want allowed", got)
		}
	})
}

func (s *suite) testEstimateRefused(t *testing.T) {
	s.forEach(t, func(t *testing.T, e *env, alg backend.Algorithm) {
		r := req(e.key("k"), alg, 5, time.Minute, 3)
		if got := e.one(r); !got.Allowed || got.Remaining != 2 {
			t.Fatalf("first 3 of 5: %+v", got)
		}
		r.Cost = 4
		if got := e.one(r); got.Allowed || got.Remaining != 2 {
			t.Errorf("estimate of 4 with 2 left: %+v, want rejected with 2 remaining", got)
		}
		if got, want := e.remaining(r), int64(2); got != want {
			t.Errorf("remaining after the refused estimate = %d, want %d (nothing consumed)", got, want)
		}
		r.Cost = 2
		if got := e.one(r); !got.Allowed || got.Remaining != 0 {
			t.Errorf("the 2 that fit: %+v, want allowed with 0 remaining", got)
		}
	})
}

func (s *suite) testSettle(t *testing.T) {
	s.forEach(t, func(t *testing.T, e *env, alg backend.Algorithm) {
		r := req(e.key("k"), alg, 5, time.Minute, 4)
		if got := e.one(r); !got.Allowed || got.Remaining != 1 {
			t.Fatalf("estimate of 4 of 5: %+v", got)
		}
		r.Cost = 1 - 4 // the work cost 1: give back the difference
		if got := e.one(r); !got.Allowed || got.Remaining != 4 {
			t.Errorf("settling at 1: %+v, want allowed with 4 remaining", got)
		}
		admitN(t, e, r, 5, 4)
	})
}

func (s *suite) testNever(t *testing.T) {
	s.forEach(t, func(t *testing.T, e *env, alg backend.Algorithm) {
		r := req(e.key("k"), alg, 3, time.Second, 4)
		check(t, "cost 4 of limit 3", e.one(r), want{ok: false, rem: 3, never: true}.result(3))
		if got, want := e.remaining(r), int64(3); got != want {
			t.Errorf("remaining after the refusal = %d, want %d", got, want)
		}
		r.Force = true
		if got := e.one(r); !got.Allowed || got.Remaining != 0 {
			t.Errorf("forced cost 4 of limit 3: %+v, want allowed with 0 remaining", got)
		}
	})
}

func (s *suite) testAllOrNothing(t *testing.T) {
	s.forEach(t, func(t *testing.T, e *env, alg backend.Algorithm) {
		other := backend.GCRA
		if alg == backend.GCRA {
			other = backend.SlidingLog
		}
		a := req(e.key("a"), alg, 5, time.Minute, 1)
		b := req(e.key("b"), alg, 1, time.Minute, 1)
		c := req(e.key("c"), other, 10, time.Hour, 1)

		got := e.decide(a, b, c)
		for i, wantRem := range []int64{4, 0, 9} {
			if !got[i].Allowed || got[i].Remaining != wantRem {
				t.Errorf("first call, result %d: %+v, want allowed with %d remaining", i, got[i], wantRem)
			}
		}

		got = e.decide(a, b, c)
		if got[1].Allowed {
			t.Fatalf("second call: b = %+v, want rejected", got[1])
		}
		// Nothing was consumed, and the admitting rules say so: their
		// results are the same as a peek.
		for i, r := range []backend.Request{a, c} {
			res := got[2*i]
			if peek := e.peek(r); res != peek {
				t.Errorf("second call, %s: %+v, want its unchanged state %+v", r.Key, res, peek)
			}
		}
		if got, want := e.remaining(a), int64(4); got != want {
			t.Errorf("a remaining after the rejected call = %d, want %d", got, want)
		}
		if got, want := e.remaining(c), int64(9); got != want {
			t.Errorf("c remaining after the rejected call = %d, want %d", got, want)
		}

		if err := e.b.Reset(context.Background(), b.Key); err != nil {
			t.Fatal(err)
		}
		got = e.decide(a, b, c)
		for i, wantRem := range []int64{3, 0, 8} {
			if !got[i].Allowed || got[i].Remaining != wantRem {
				t.Errorf("third call, result %d: %+v, want allowed with %d remaining", i, got[i], wantRem)
			}
		}
	})
}

// testAllOrNothingForced pins that a forced request consumes nothing when
// another request of its call is rejected.
func (s *suite) testAllOrNothingForced(t *testing.T) {
	s.forEach(t, func(t *testing.T, e *env, alg backend.Algorithm) {
		a := req(e.key("a"), alg, 5, time.Minute, 2)
		a.Force = true
		b := req(e.key("b"), alg, 1, time.Minute, 2)
		got := e.decide(a, b)
		if !got[0].Allowed || got[1].Allowed {
			t.Fatalf("forced a and oversized b: %+v, want a allowed and b rejected", got)
		}
		check(t, "forced a in a rejected call", got[0], want{ok: true, rem: 5}.result(5))
		if got, want := e.remaining(a), int64(5); got != want {
			t.Errorf("a remaining = %d, want %d", got, want)
		}
	})
}

func (s *suite) testSameKey(t *testing.T) {
	s.forEach(t, func(t *testing.T, e *env, alg backend.Algorithm) {
		r := req(e.key("k"), alg, 5, time.Minute, 3)
		got := e.decide(r, r)
		if !got[0].Allowed || got[1].Allowed {
			t.Fatalf("3+3 of 5 in one call: %+v, want the second rejected", got)
		}
		// The second saw the state the first would have written.
		if got, want := got[1].Remaining, int64(2); got != want {
			t.Errorf("second request's remaining = %d, want %d", got, want)
		}
		if got, want := e.remaining(r), int64(5); got != want {
			t.Errorf("remaining after the rejected call = %d, want %d", got, want)
		}

		r.Cost = 2
		got = e.decide(r, r)
		if !got[0].Allowed || got[0].Remaining != 3 || !got[1].Allowed || got[1].Remaining != 1 {
			t.Errorf("2+2 of 5 in one call: %+v, want both allowed, 3 then 1 remaining", got)
		}
		if got, want := e.remaining(r), int64(1); got != want {
			t.Errorf("remaining after 2+2 = %d, want %d", got, want)
		}
	})
}

func (s *suite) testEmptyCall(t *testing.T) {
	e := s.env(t)
	res, err := e.b.Decide(context.Background(), nil)
	if err != nil || len(res) != 0 {
		t.Errorf("Decide(nil) = %v, %v; want no results and no error", res, err)
	}
}

func (s *suite) testInvalid(t *testing.T) {
	e := s.env(t)
	valid := req(e.key("valid"), backend.GCRA, 3, time.Second, 1)
	bad := func(f func(r *backend.Request)) backend.Request {
		r := valid
		r.Key = e.key("bad")
		f(&r)
		return r
	}
	cases := map[string]backend.Request{
		"empty key":         bad(func(r *backend.Request) { r.Key = "" }),
		"zero limit":        bad(func(r *backend.Request) { r.Limit = 0 }),
		"negative limit":    bad(func(r *backend.Request) { r.Limit = -1 }),
		"limit too large":   bad(func(r *backend.Request) { r.Limit = backend.MaxLimit + 1 }),
		"zero period":       bad(func(r *backend.Request) { r.Period = 0 }),
		"period under 1ms":  bad(func(r *backend.Request) { r.Period = time.Millisecond - time.Microsecond }),
		"period too long":   bad(func(r *backend.Request) { r.Period = backend.MaxPeriod + time.Second }),
		"negative burst":    bad(func(r *backend.Request) { r.Burst = -1 }),
		"burst too large":   bad(func(r *backend.Request) { r.Burst = backend.MaxLimit + 1 }),
		"unknown algorithm": bad(func(r *backend.Request) { r.Algorithm = 99 }),
		"stamp past 2^53":   bad(func(r *backend.Request) { r.Cost, r.Stamp = -1, 1<<53 }),
		"stamp below -2^53": bad(func(r *backend.Request) { r.Cost, r.Stamp = -1, -(1 << 53) }),
		"once on a peek":    bad(func(r *backend.Request) { r.Cost, r.Once = 0, 1 }),
		"once on a lease": bad(func(r *backend.Request) {
			r.Algorithm, r.Cost, r.Force, r.Lease, r.Once = backend.Concurrency, -1, true, 1, 1
		}),
	}
	for name, r := range cases {
		t.Run(sanitize(name), func(t *testing.T) {
			_, err := e.b.Decide(context.Background(), []backend.Request{valid, r})
			if !errors.Is(err, backend.ErrInvalidRequest) {
				t.Fatalf("Decide with %s: error %v, want one wrapping backend.ErrInvalidRequest", name, err)
			}
			if got, want := e.remaining(valid), int64(3); got != want {
				t.Errorf("the valid request beside it consumed: remaining %d, want %d", got, want)
			}
		})
	}
}

// testDecideInto runs the table through backend.DecideInto, when the
// backend offers it, with one reused result buffer.
func (s *suite) testDecideInto(t *testing.T) {
	for _, alg := range algorithms {
		t.Run(alg.String(), func(t *testing.T) {
			e := s.env(t)
			di, ok := e.b.(backend.DecideInto)
			if !ok {
				t.Skip("backend does not implement backend.DecideInto")
			}
			buf := make([]backend.Result, 2)
			sentinel := backend.Result{Limit: -42}
			runTable(t, e, e.key("k"), alg, func(r backend.Request) backend.Result {
				buf[1] = sentinel
				if err := di.DecideInto(context.Background(), []backend.Request{r}, buf); err != nil {
					t.Fatalf("DecideInto: %v", err)
				}
				if buf[1] != sentinel {
					t.Fatalf("DecideInto wrote past len(reqs): %+v", buf[1])
				}
				return buf[0]
			})
			err := di.DecideInto(context.Background(), []backend.Request{req(e.key("k"), alg, 3, time.Second, 1)}, nil)
			if err == nil {
				t.Error("DecideInto with a results slice too short: no error")
			}
		})
	}
}
