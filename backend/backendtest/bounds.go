package backendtest

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
)

// testConcurrent: 1000 goroutines race for one key of limit 100 at one
// instant; exactly 100 are admitted, whatever the algorithm.
func (s *suite) testConcurrent(t *testing.T) {
	s.forEach(t, func(t *testing.T, e *env, alg backend.Algorithm) {
		const goroutines, limit = 1000, 100
		r := req(e.key("k"), alg, limit, time.Hour, 1)
		var admitted, failed atomic.Int64
		var wg sync.WaitGroup
		start := make(chan struct{})
		for range goroutines {
			wg.Go(func() {
				<-start
				res, err := e.b.Decide(context.Background(), []backend.Request{r})
				switch {
				case err != nil:
					failed.Add(1)
				case res[0].Allowed:
					admitted.Add(1)
				}
			})
		}
		close(start)
		wg.Wait()
		if n := failed.Load(); n > 0 {
			t.Fatalf("%d decisions failed", n)
		}
		if got, want := admitted.Load(), int64(limit); got != want {
			t.Errorf("admitted %d of %d, want exactly %d", got, goroutines, want)
		}
		if got := e.remaining(r); got != 0 {
			t.Errorf("remaining after the race = %d, want 0", got)
		}
	})
}

// testFixedWindowBoundaryBurst documents the fixed window's weakness: the
// full limit at the last microsecond of a window and the full limit again
// at the first of the next, 2L within 1µs.
func (s *suite) testFixedWindowBurst(t *testing.T) {
	e := s.env(t)
	r := req(e.key("k"), backend.FixedWindow, 3, time.Second, 1)
	e.at(us(999_999))
	admitN(t, e, r, 4, 3)
	e.at(us(1_000_000))
	admitN(t, e, r, 4, 3) // 6 = 2L admitted within 1µs
}

// testSlidingWindowBound documents how far the sliding window counter can
// over-admit: 10 per second, all 10 of one window at its last microsecond,
// then 1ms before the next boundary the previous window weighs 1000 ppm and
// 9 more fit: 19 within 999_001µs, nearly 2L in less than one period. With
// the previous window's traffic spread evenly it tracks a rolling count.
func (s *suite) testSlidingWindowBound(t *testing.T) {
	e := s.env(t)
	r := req(e.key("k"), backend.SlidingWindow, 10, time.Second, 1)
	e.at(us(999_999))
	admitN(t, e, r, 11, 10)
	e.at(us(1_999_000))
	admitN(t, e, r, 10, 9)

	// Halfway through, the previous window weighs 0.5: 5 fit.
	e = s.env(t)
	r.Key = e.key("half")
	e.at(us(999_999))
	admitN(t, e, r, 11, 10)
	e.at(us(1_500_000))
	admitN(t, e, r, 6, 5)
}

// testSlidingLogRandomized drives a sliding log with random instants and
// costs and checks it against the definition: a request is admitted if and
// only if the units admitted in the rolling period before it, plus its
// cost, fit the limit; and no rolling period ever holds more than the limit.
func (s *suite) testSlidingLogRandomized(t *testing.T) {
	const (
		limit  = 5
		period = 200 * time.Millisecond
		steps  = 1500
	)
	e := s.env(t)
	r := req(e.key("k"), backend.SlidingLog, limit, period, 1)
	rng := rand.New(rand.NewPCG(20261130, 7))
	type admission struct{ at, cost int64 }
	var log []admission
	inWindow := func(now int64) (n int64) {
		for _, a := range log {
			if now < a.at+period.Microseconds() {
				n += a.cost
			}
		}
		return n
	}
	now, admitted := int64(0), 0
	for i := range steps {
		if rng.IntN(3) > 0 { // a third of the requests come at the same instant
			now += rng.Int64N(60_000)
		}
		e.at(us(now))
		r.Cost = 1 + rng.Int64N(3)
		res := e.one(r)
		fits := inWindow(now)+r.Cost <= limit
		if res.Allowed != fits {
			t.Fatalf("step %d at %dµs, cost %d, %d in the window: allowed = %v, want %v",
				i, now, r.Cost, inWindow(now), res.Allowed, fits)
		}
		if res.Allowed {
			log = append(log, admission{now, r.Cost})
			admitted++
		}
		if len(log) > 64 {
			log = log[len(log)-32:] // older ones are long out of every window
		}
		if n := inWindow(now); n > limit {
			t.Fatalf("step %d: %d units in the rolling window ending at %dµs, limit %d", i, n, now, limit)
		}
	}
	if admitted < steps/10 {
		t.Errorf("only %d of %d admitted: the scenario tests too little", admitted, steps)
	}
}

// testRollingWindowCeiling drives the rolling window (the default
// algorithm) with random arrivals (bursts at one instant, gaps across
// bucket and period boundaries, costs of 1..3, peeks and refunds) and holds
// it to its promise: no rolling period ever holds more than the limit, and
// it is never stricter than a sliding log over the longest window it can
// count, (k+1) buckets: whatever fits there is admitted. Refunds take back
// the newest units, as ALGORITHMS.md says.
func (s *suite) testRollingWindowCeiling(t *testing.T) {
	const (
		limit   = 7
		period  = 160 * time.Millisecond // 16 buckets of 10ms
		buckets = 16
		steps   = 1500
	)
	P := period.Microseconds()
	reach := (buckets + 1) * P / buckets // the longest span of counted buckets
	e := s.env(t)
	r := req(e.key("k"), backend.RollingWindow, limit, period, 1)
	rng := rand.New(rand.NewPCG(20261201, 13))
	var units []int64                         // admitted, oldest first
	count := func(from, to int64) (n int64) { // units in (from, to]
		for _, u := range units {
			if u > from && u <= to {
				n++
			}
		}
		return n
	}
	now, admitted := int64(0), 0
	for i := range steps {
		switch rng.IntN(4) {
		case 0: // the same instant: a burst
		case 1:
			now += rng.Int64N(P / buckets) // within a bucket or across one
		default:
			now += rng.Int64N(P / 3)
		}
		e.at(us(now))
		r.Cost = 1 + rng.Int64N(3)
		switch rng.IntN(10) {
		case 0:
			r.Cost = 0
		case 1:
			r.Cost = -r.Cost
		}
		res := e.one(r)
		switch {
		case r.Cost < 0:
			units = units[:max(0, len(units)-int(-r.Cost))]
			continue
		case r.Cost == 0:
			continue
		}
		if lenient := count(now-reach, now)+r.Cost <= limit; lenient && !res.Allowed {
			t.Fatalf("step %d at %dµs: cost %d rejected (%+v) although the last %dµs hold only %d",
				i, now, r.Cost, res, reach, count(now-reach, now))
		}
		if !res.Allowed {
			continue
		}
		admitted++
		for range r.Cost {
			units = append(units, now)
		}
		if n := count(now-P, now); n > limit {
			t.Fatalf("step %d: %d units in the rolling period ending at %dµs, limit %d", i, n, now, limit)
		}
		if len(units) > 256 {
			units = units[len(units)-128:] // older ones are long out of every window
		}
	}
	if admitted < steps/5 {
		t.Errorf("only %d of %d admitted: the scenario tests too little", admitted, steps)
	}
}
