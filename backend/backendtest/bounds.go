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
