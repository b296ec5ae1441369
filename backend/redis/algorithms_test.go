package redis

import (
	"testing"
	"time"

	"github.com/ceiling-go/ceiling/backend"
	"github.com/redis/go-redis/v9"
)

// step is one decision at t0+at on the fake clock and its expected result.
type step struct {
	at   time.Duration
	cost int64
	want backend.Result
}

const us = time.Microsecond

func allowed(limit, remaining int64, reset time.Duration) backend.Result {
	return backend.Result{Allowed: true, Limit: limit, Remaining: remaining, ResetAfter: reset}
}

func rejected(limit, remaining int64, reset, retry time.Duration) backend.Result {
	return backend.Result{Limit: limit, Remaining: remaining, ResetAfter: reset, RetryAfter: retry}
}

// next sets r's NextAfter: the wait for one more unit when none remains.
func next(r backend.Result, d time.Duration) backend.Result {
	r.NextAfter = d
	return r
}

// runSteps decides steps in order on one key with the fake clock, against
// every target; the expected values are worked out by hand from
// backend/ALGORITHMS.md.
func runSteps(t *testing.T, base backend.Request, steps []step) {
	t.Helper()
	forEachTarget(t, func(t *testing.T, client redis.UniversalClient, prefix string) {
		clock := newFakeClock()
		t0 := clock.Now()
		s := New(client, WithPrefix(prefix), WithClock(clock.Now), WithDenyCache(0))
		for i, st := range steps {
			clock.mu.Lock()
			clock.now = t0.Add(st.at)
			clock.mu.Unlock()
			req := base
			req.Cost = st.cost
			if st.cost > 1000 {
				req.Cost, req.Force = st.cost-1000, true // forced steps are written cost+1000
			}
			got := decide(t, s, req)[0]
			got.Stamp = 0 // pinned by the stamp tests
			if got != st.want {
				t.Errorf("step %d (t0+%v, cost %d): got %+v, want %+v", i, st.at, st.cost, got, st.want)
			}
		}
	})
}

func TestGCRASteps(t *testing.T) {
	const T = 333334 * us // ceil(1s / 3)
	runSteps(t, backend.Request{Key: "r:gcra", Algorithm: backend.GCRA, Limit: 3, Period: time.Second}, []step{
		{0, 1, allowed(3, 2, T)},
		{0, 1, allowed(3, 1, 2*T)},
		{0, 1, next(allowed(3, 0, 3*T), T)},
		{0, 1, next(rejected(3, 0, 3*T, T), T)},
		{0, 4, next(rejected(3, 0, 3*T, backend.Never), T)},
		{T, 1, next(allowed(3, 0, 3*T), T)},
		{T, 0, next(allowed(3, 0, 3*T), T)},
		{T, -2, allowed(3, 2, T)},
		{T, 1005, next(allowed(3, 0, 6*T), 4*T)}, // forced: debt of 3 emission intervals
		{T, 1, next(rejected(3, 0, 6*T, 4*T), 4*T)},
		{T + 4*T, 1, next(allowed(3, 0, 3*T), T)},
	})
}

func TestFixedWindowSteps(t *testing.T) {
	ms := time.Millisecond
	runSteps(t, backend.Request{Key: "r:fixed", Algorithm: backend.FixedWindow, Limit: 2, Period: time.Second}, []step{
		{100 * ms, 1, allowed(2, 1, 900*ms)},
		{100 * ms, 1, next(allowed(2, 0, 900*ms), 900*ms)},
		{200 * ms, 1, next(rejected(2, 0, 800*ms, 800*ms), 800*ms)},
		{200 * ms, 3, next(rejected(2, 0, 800*ms, backend.Never), 800*ms)},
		{200 * ms, -1, allowed(2, 1, 800*ms)},
		{time.Second - us, 1, next(allowed(2, 0, us), us)},
		// The boundary burst: the next window starts empty.
		{time.Second, 1, allowed(2, 1, time.Second)},
		{time.Second, 1, next(allowed(2, 0, time.Second), time.Second)},
		{time.Second, 1002, next(allowed(2, 0, time.Second), time.Second)},
		{time.Second, 0, next(allowed(2, 0, time.Second), time.Second)},
	})
}

func TestSlidingLogSteps(t *testing.T) {
	ms := time.Millisecond
	runSteps(t, backend.Request{Key: "r:log", Algorithm: backend.SlidingLog, Limit: 2, Period: time.Second}, []step{
		{0, 1, allowed(2, 1, time.Second)},
		{100 * ms, 1, next(allowed(2, 0, time.Second), 900*ms)},
		{200 * ms, 1, next(rejected(2, 0, 900*ms, 800*ms), 800*ms)},
		{200 * ms, 2, next(rejected(2, 0, 900*ms, 900*ms), 800*ms)}, // one unit waits less than two
		{200 * ms, 3, next(rejected(2, 0, 900*ms, backend.Never), 800*ms)},
		{time.Second - us, 1, next(rejected(2, 0, 100*ms+us, us), us)},
		{time.Second, 1, next(allowed(2, 0, time.Second), 100*ms)},
		{time.Second, -1, allowed(2, 1, 100*ms)},
		{time.Second, 0, allowed(2, 1, 100*ms)},
		{1100 * ms, 0, allowed(2, 2, 0)},
	})
}

func TestSlidingWindowSteps(t *testing.T) {
	ms := time.Millisecond
	runSteps(t, backend.Request{Key: "r:window", Algorithm: backend.SlidingWindow, Limit: 10, Period: time.Second}, []step{
		// One more fits once the window is over and its 10 weigh 0.9.
		{500 * ms, 10, next(allowed(10, 0, 1500*ms), 599001*us)},
		// Half the previous window still weighs: 10 × 0.5 = 5 used.
		{1500 * ms, 0, allowed(10, 5, 500*ms)},
		{1500 * ms, 5, next(allowed(10, 0, 1500*ms), 99001*us)},
		// Admitted once the weight falls to 0.4 (remm 400 ms): 99001 µs later.
		{1500 * ms, 1, next(rejected(10, 0, 1500*ms, 99001*us), 99001*us)},
		{1500*ms + 99000*us, 1, next(rejected(10, 0, 1500*ms-99000*us, 1*us), us)},
		// 6 of the current window: the next needs the weight at 0.3.
		{1500*ms + 99001*us, 1, next(allowed(10, 0, 1500*ms-99001*us), 100*ms)},
		{1500 * ms, 11, next(rejected(10, 0, 1500*ms, backend.Never), 199001*us)},
	})
}
